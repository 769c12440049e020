"""Job labels: the caller's own metadata (commit, branch, model name), string to string, bounded.

The bounds keep a label usable as a filter and cheap to store: at most :data:`MAX_LABELS` per job; a
key is 1-63 characters of letters, digits and ``. _ / -``, starting and ending with a letter or digit
(Kubernetes' label keys, with ``/`` allowed anywhere so ``git/branch`` works); a value is at most
255 characters with no control characters (branch names, commit hashes and model ids fit).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from app.core.errors import InvalidRequestError

MAX_LABELS = 20
MAX_KEY = 63
MAX_VALUE = 255
_KEY = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_label(key: str, value: str) -> None:
    """Raise InvalidRequestError unless ``key: value`` is a valid label."""
    if not _KEY.fullmatch(key):
        raise InvalidRequestError(
            f"label key {key[:80]!r} must be 1 to {MAX_KEY} letters, digits, `.`, `_`, `/` or `-`, starting and "
            "ending with a letter or digit"
        )
    if len(value) > MAX_VALUE or _CONTROL.search(value):
        raise InvalidRequestError(
            f"the value of label {key!r} must be at most {MAX_VALUE} characters without control characters"
        )


def check_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels, checked; InvalidRequestError names the first one that breaks a rule."""
    if len(labels) > MAX_LABELS:
        raise InvalidRequestError(f"a job may carry at most {MAX_LABELS} labels, got {len(labels)}")
    for key, value in labels.items():
        check_label(key, value)
    return dict(labels)


def parse_selector(text: str) -> tuple[str, str]:
    """``key:value`` (from ``?label=``) -> ``(key, value)``; the value may itself hold ``:``."""
    key, sep, value = text.partition(":")
    if not sep:
        raise InvalidRequestError(f"`label` filters take key:value, got {text[:80]!r}")
    check_label(key, value)
    return key, value
