"""HTTP header values both floors read: the client from the API, the webhook dispatcher from receivers.

Standard library only, so that :mod:`app.client` (httpx and tenacity, nothing of the service) and
:mod:`app.api` share one reading without either importing the other.
"""

from __future__ import annotations

import email.utils
import time

__all__ = ["retry_after_s"]


def retry_after_s(value: str | None) -> float | None:
    """``Retry-After`` in seconds: a number of seconds or an HTTP date (RFC 9110 section 10.2.3).

    None for a missing or unreadable value; a date in the past is 0.
    """
    if not value:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():  # not "²", which isdigit() accepts and float() refuses
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
