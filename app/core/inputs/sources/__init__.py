"""Model and dataset references, one module per URI scheme, registered like the engine's adapters.

========================  ===========================================================================
``hf://org/name``         a hub model (for a dataset reference: a hub dataset)       :mod:`.hf`
``hf://datasets/org/name`` a hub dataset                                             :mod:`.hf`
``file:///path``          a directory, archive or (datasets only) split file under   :mod:`.file`
                          an allowed root
``upload://id``           an upload of the same API key: an archive, or (datasets    :mod:`.upload`
                          only) a split file
``s3://bucket/key``       an object or a key prefix under one of                     :mod:`.s3`
                          ``CAHP_ALLOWED_S3_PREFIXES``
========================  ===========================================================================

:func:`check_reference` is what the API can answer at submit time (syntax, allowed roots,
ownership of uploads, allowed buckets); :func:`fetch_reference` is what the worker does with it
(a local path, or a hub id passed through), checking again since things change between the two.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from app.core.errors import InvalidReferenceError
from app.core.inputs.sources import _file as file
from app.core.inputs.sources import _hf as hf
from app.core.inputs.sources import _s3 as s3
from app.core.inputs.sources import _upload as upload
from app.core.inputs.sources._base import (
    Fetched,
    Reference,
    Role,
    Shape,
    SourceContext,
    UploadInfo,
    has_control,
    shape_of_name,
)
from app.core.inputs.sources._file import resolve_local
from app.core.inputs.sources._hf import check_revision
from app.core.inputs.sources._s3 import check_s3_reference
from app.core.inputs.sources._upload import find_upload

__all__ = ["Fetched", "Reference", "Role", "Shape", "SourceContext", "UploadInfo", "SOURCES", "check_reference",
           "check_revision", "check_s3_reference", "fetch_reference", "find_upload", "parse_reference", "resolve_local",
           "shape_of_name"]

#: Scheme -> its module (``parse``, ``check``, ``fetch``). A new scheme is one module and one entry.
SOURCES: dict[str, ModuleType] = {module.SCHEME: module for module in (hf, file, upload, s3)}


def parse_reference(uri: str, *, role: Role) -> Reference:
    """Check the syntax of a model or dataset URI.

    Raises
    ------
    InvalidReferenceError
        With the accepted forms when ``uri`` matches none of them, or when it holds a NUL or
        another control character anywhere (also once ``%``-decoded).
    """
    if has_control(uri):
        raise InvalidReferenceError(f"the {role} reference holds a NUL or another control character; remove it")
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise InvalidReferenceError(_forms(role, f"{role} reference {uri!r} has no scheme"))
    source = SOURCES.get(scheme)
    if source is None:
        raise InvalidReferenceError(_forms(role, f"unknown scheme {scheme!r} in {uri!r}"))
    reference: Reference = source.parse(uri, rest, role=role)
    return reference


def _forms(role: Role, problem: str) -> str:
    hub = "hf://org/name" if role == "model" else "hf://datasets/org/name"
    return f"{problem}; use {hub}, file:///path, upload://<id> or s3://bucket/key"


def check_reference(ref: Reference, *, role: Role, context: SourceContext) -> Shape:
    """Submit-time checks of a parsed reference; returns what it holds.

    Raises
    ------
    InvalidReferenceError
        For a ``file://`` path outside the allowed roots (or holding a link out of them), an upload
        this key does not own, an ``s3://`` URI outside ``CAHP_ALLOWED_S3_PREFIXES`` or inside the
        artifact store, or a single file given as a model.
    """
    shape: Shape = SOURCES[ref.scheme].check(ref, role=role, context=context)
    if role == "model" and shape == "file":
        raise InvalidReferenceError(
            f"{ref.uri} is a single file; a model is a directory: pack it as .tar.gz or .zip and upload that"
        )
    return shape


def fetch_reference(ref: Reference, *, dest: Path, context: SourceContext) -> Fetched:
    """Fetch ``ref`` for the worker: into ``dest`` (or beside it, with the object's suffix), or in place.

    ``file://`` references are used where they are; hub ids pass through (shape ``hub``).
    """
    fetched: Fetched = SOURCES[ref.scheme].fetch(ref, dest=dest, context=context)
    return fetched
