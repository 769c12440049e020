"""The pipe protocol between the API and an inspection child: frames of an 8-byte little-endian length and the bytes."""

from __future__ import annotations

import struct
from typing import IO

HEADER = struct.Struct("<Q")


def read_frame(stream: IO[bytes]) -> bytes | None:
    """One length-prefixed frame from ``stream``, or None at its end."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (length,) = HEADER.unpack(head)
    data = stream.read(length)
    return data if len(data) == length else None


def frame(data: bytes) -> bytes:
    """``data`` as one frame."""
    return HEADER.pack(len(data)) + data
