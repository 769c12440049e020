"""What every source module provides, and what it is given.

A *source* is one URI scheme. It parses its URIs, checks a reference at submit time (what the API
can answer at once), and fetches it in the worker (a local path, or a hub id passed through). The
table in :mod:`app.core.inputs.sources` (``SOURCES``) maps each scheme to its module, the way the engine's
adapter table maps model families to adapters: adding a scheme is one module and one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from app.core.inputs._archives import archive_suffix
from app.core.settings import Settings
from app.core.storage import ArtifactStore
from cahp_engine.data import FILE_SUFFIXES as DATA_SUFFIXES

Role = Literal["model", "dataset"]
#: What a reference holds: a hub id, a directory, an archive to unpack, or one dataset split file.
Shape = Literal["hub", "directory", "archive", "file"]


@dataclass(frozen=True)
class Reference:
    """A parsed URI: ``target`` is the hub id, local path, upload id or ``bucket/key``."""

    uri: str
    scheme: str
    target: str


@dataclass(frozen=True)
class UploadInfo:
    """What a source needs to know of an upload row (plain values: no ORM object crosses layers)."""

    storage_key: str
    kind: str
    suffix: str
    size: int | None = None
    #: What it holds, read at upload (:mod:`app.core.inputs._upload_contents`); None when not indexed.
    contents: dict[str, Any] | None = None


@dataclass
class SourceContext:
    """Who asks, and how to reach what a reference may name.

    ``find_upload`` answers an upload id *of this owner* (None for anyone else's); ``store`` is the
    artifact store (for uploads); ``cache`` keeps per-job clients (an S3 client) between fetches.
    """

    settings: Settings
    owner_id: str
    find_upload: Callable[[str], UploadInfo | None]
    store: ArtifactStore | None = None
    cache: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Fetched:
    """A fetched reference: a local path (or a hub id in ``path`` for ``hub``) and what it holds."""

    path: str
    shape: Shape

    @property
    def local(self) -> Path:
        return Path(self.path)


class SourceModule(Protocol):
    """One scheme's module: ``SCHEME`` plus these three functions."""

    SCHEME: str

    def parse(self, uri: str, rest: str, *, role: Role) -> Reference: ...

    def check(self, ref: Reference, *, role: Role, context: SourceContext) -> Shape: ...

    def fetch(self, ref: Reference, *, dest: Path, context: SourceContext) -> Fetched: ...


def shape_of_name(name: str) -> Shape:
    """Shape from a file or key name: archive and split-file suffixes; anything else a directory."""
    if archive_suffix(name) is not None:
        return "archive"
    if name.lower().endswith(DATA_SUFFIXES):
        return "file"
    return "directory"


def has_control(text: str) -> bool:
    """True when ``text`` holds a NUL or another ASCII control character."""
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)
