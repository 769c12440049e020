"""The security headers of what the app serves to browsers: the console (``/ui``), the API docs
(``/docs``) and the OpenAPI document.

One policy, built here, so the pages cannot drift apart: everything from this origin only, no
framing by another site (``frame-ancestors 'none'``, ``X-Frame-Options: DENY``), no MIME sniffing,
no referrer. A page that needs more names exactly what, and nothing else (Swagger UI: its start-up
script by hash, the ``data:`` images of its stylesheet).
"""

from __future__ import annotations

import base64
import hashlib


def content_security_policy(
    *, script_src: tuple[str, ...] = (), style_src: tuple[str, ...] = (), img_src: tuple[str, ...] = ()
) -> str:
    """The console's policy, with the extra sources given for scripts, styles and images.

    ``form-action 'none'``: no form is ever submitted by the browser itself, so a key typed into a
    form cannot land in a URL.
    """

    def sources(extra: tuple[str, ...]) -> str:
        return " ".join(("'self'", *extra))

    return (f"default-src 'none'; script-src {sources(script_src)}; style-src {sources(style_src)}; "
            f"img-src {sources(img_src)}; connect-src 'self'; font-src 'self'; base-uri 'self'; "
            "form-action 'none'; frame-ancestors 'none'")


def script_hash(script: str) -> str:
    """The CSP source that allows exactly this inline script: ``'sha256-<base64 digest>'``."""
    return f"'sha256-{base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()}'"


def security_headers(policy: str) -> dict[str, str]:
    """Every header of a page or asset served under ``policy``; ``Cache-Control: no-cache`` by default."""
    return {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        "Cache-Control": "no-cache",
    }


#: The console's policy: this origin only, no inline script, no third-party anything.
CONTENT_SECURITY_POLICY = content_security_policy()
SECURITY_HEADERS = security_headers(CONTENT_SECURITY_POLICY)
