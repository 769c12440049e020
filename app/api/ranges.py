"""HTTP byte ranges (RFC 9110 section 14) for artifact downloads, so an interrupted download resumes.

One range per request (``bytes=a-b``, ``bytes=a-`` or ``bytes=-n``): what resuming needs. A header
that is malformed, or asks for several ranges, is ignored and the whole object is sent, as the RFC
allows. ``If-Range`` with the artifact's ``ETag`` makes the range conditional: if the artifact
changed (a different ETag, or a date, which this API never gives out), the whole object is sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.core.errors import RangeNotSatisfiableError

#: ASCII digits only: ``\d`` would also match ``²`` and other digits that ``int`` refuses.
_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)")
#: Larger than any artifact: a position written with more digits than this is read as this.
_BEYOND = 10**18


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    def content_range(self, size: int) -> str:
        return f"bytes {self.start}-{self.end}/{size}"


def requested_range(header: str | None, *, size: int, etag: str, if_range: str | None = None) -> ByteRange | None:
    """The range to send, or None for the whole object.

    Raises
    ------
    RangeNotSatisfiableError
        When the range starts at or past the end of the object (answered 416 with its size).
    """
    if not header:
        return None
    if if_range is not None and if_range.strip() != etag:
        return None
    match = _RANGE.fullmatch(header.strip().replace(" ", ""))
    if match is None or not (match.group(1) or match.group(2)):
        return None
    first, last = match.group(1), match.group(2)
    if not first:  # the last n bytes
        suffix = _position(last)
        if suffix == 0:
            raise RangeNotSatisfiableError("a range of the last 0 bytes selects nothing", size=size)
        return ByteRange(max(0, size - suffix), size - 1) if size else _unsatisfiable(header, size)
    start = _position(first)
    end = size - 1 if not last else min(_position(last), size - 1)
    if last and _position(last) < start:
        return None  # invalid: ignored, as the RFC says
    if start >= size:
        _unsatisfiable(header, size)
    return ByteRange(start, end)


def _position(digits: str) -> int:
    # int() refuses more than 4300 digits (a ValueError, a 500); a position that long is past any end.
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else _BEYOND


def _unsatisfiable(header: str, size: int) -> ByteRange:
    raise RangeNotSatisfiableError(
        f"the artifact is {size} bytes long; `Range: {header[:60]}` starts past its end", size=size
    )
