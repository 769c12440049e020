"""``hf://org/name`` (a hub model) and ``hf://datasets/org/name`` (a hub dataset).

Nothing is fetched here: the engine loads hub ids itself, through the hub client and its cache.
The worker checks first that the hub endpoint is not a loopback, link-local or metadata address
(:func:`app.core.security._outbound.check_hub_endpoint`).
"""

from __future__ import annotations

import re
from pathlib import Path

from app.core.errors import InvalidReferenceError
from app.core.inputs.sources._base import Fetched, Reference, Role, Shape, SourceContext
from app.core.security import check_hub_endpoint

SCHEME = "hf"
_PART = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}"
_HUB_ID = re.compile(rf"{_PART}(/{_PART})?")
#: The characters of a revision (see :func:`check_revision` for the rest of the rules).
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,254}")


def parse(uri: str, rest: str, *, role: Role) -> Reference:
    if rest.startswith("datasets/"):
        if role == "model":
            raise InvalidReferenceError(f"{uri!r} names a hub dataset; a model reference is hf://org/name")
        rest = rest[len("datasets/"):]
    if not _HUB_ID.fullmatch(rest) or ".." in rest:
        raise InvalidReferenceError(f"{uri!r} is not a hub id; use hf://org/name")
    return Reference(uri, SCHEME, rest)


def check_revision(revision: str, *, field: str) -> None:
    """Refuse a hub revision that is not a branch, tag or commit name.

    The hub client keeps ``refs/<revision>`` files in its cache directory, so a revision is, among
    other things, a relative path there: git's own rules for ref names apply (``git check-ref-format``),
    which leave no ``..``, no empty or dot-led component, no leading or trailing ``/``, no backslash
    and no control character.

    Raises
    ------
    InvalidReferenceError
        Naming ``field`` (``model.revision``).
    """
    if not _REVISION.fullmatch(revision) or ".." in revision or revision.endswith((".", ".lock")) or any(
            not part or part.startswith(".") for part in revision.split("/")):
        raise InvalidReferenceError(
            f"`{field}` must be a branch, tag or commit: letters, digits, `_`, `-`, `.` and `/`, with no empty "
            "component, no component starting with `.` and no `..`"
        )


def check(ref: Reference, *, role: Role, context: SourceContext) -> Shape:
    return "hub"


def fetch(ref: Reference, *, dest: Path, context: SourceContext) -> Fetched:
    check_hub_endpoint(allowed_hosts=context.settings.allowed_outbound_hosts)
    return Fetched(ref.target, "hub")
