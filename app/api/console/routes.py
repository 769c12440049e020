"""Routes of the job console: the page at ``/ui/`` (and its client-side paths) and its static assets.

Every asset is read once from ``static/`` and served from memory with an explicit media type (ES
modules need a JavaScript one, whatever the host's ``mimetypes`` table says), an ``ETag`` and
``Cache-Control: no-cache``, so a new release is picked up on the next load. The page is served with a
Content-Security-Policy that allows only this origin: no inline script, no third-party anything
(:mod:`app.api.page_headers`, shared with ``/docs``).
"""

from __future__ import annotations

import hashlib
import html
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse
from starlette.exceptions import HTTPException

from app.api.page_headers import SECURITY_HEADERS

STATIC_DIR = Path(__file__).resolve().parent / "static"
#: The media type of each kind of file the console ships; other files in ``static/`` are not served.
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
#: Placeholder in index.html replaced by the page's base path, so the console also works behind a
#: proxy that mounts the app under a prefix (``root_path``).
BASE_PLACEHOLDER = "__CAHP_UI_BASE__"

router = APIRouter(include_in_schema=False)


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


@lru_cache(maxsize=1)
def assets() -> dict[str, Asset]:
    """Every file of ``static/`` with a known suffix, by file name."""
    found: dict[str, Asset] = {}
    for path in sorted(STATIC_DIR.iterdir()):
        media_type = MEDIA_TYPES.get(path.suffix)
        if path.is_file() and media_type is not None:
            body = path.read_bytes()
            found[path.name] = Asset(body, media_type, f'"{hashlib.sha256(body).hexdigest()[:32]}"')
    return found


@router.get("/ui")
def console_redirect() -> RedirectResponse:
    """``/ui`` -> ``/ui/``, relative so that a proxy prefix is kept."""
    return RedirectResponse("ui/", status_code=308)


@router.get("/ui/")
@router.get("/ui/submit")
@router.get("/ui/jobs/{job_id}")
def console_page(request: Request) -> Response:
    """The console's one page; it draws the list, a job or the submit form from its own URL."""
    base = f"{request.scope.get('root_path', '').rstrip('/')}/ui/"
    page = assets()["index.html"].body.decode().replace(BASE_PLACEHOLDER, html.escape(base, quote=True))
    return Response(page, media_type=MEDIA_TYPES[".html"], headers=SECURITY_HEADERS)


@router.get("/ui/static/{name}")
def console_asset(name: str, request: Request) -> Response:
    """One asset of the page, revalidated with its ``ETag``."""
    asset = assets().get(name)
    if asset is None or name == "index.html":
        raise HTTPException(status_code=404, detail=f"the console has no asset {name!r}")
    headers = {**SECURITY_HEADERS, "ETag": asset.etag}
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)
