"""``/docs``: the interactive OpenAPI page, with Swagger UI served by the app itself; and ``/openapi.json``.

FastAPI's default page loads Swagger UI from a CDN. That fails offline, and it runs a third-party
script in the API's origin, where the console keeps its key in ``sessionStorage``. So the pinned
files under ``docs_static/`` (Swagger UI 5.35.0, Apache-2.0, with its licence) are served instead,
and ReDoc (CDN-only) is not offered.

The page, its assets and the OpenAPI document carry the console's security headers
(:mod:`app.api.page_headers`): no framing by another site, no MIME sniffing, no referrer. The page's
policy adds only what Swagger UI needs: its one inline start-up script, allowed by its hash (so no
other inline script runs), and ``data:``/``blob:`` images (its stylesheet's icons, an image answer
shown in "Try it out"). Styles stay this origin's only: Swagger UI sets its inline styles through
the DOM, which a policy does not restrict (``tests/ui/test_docs_browser.py`` checks the page in
Chromium for violations).
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException

from app.api.page_headers import SECURITY_HEADERS, content_security_policy, script_hash, security_headers

STATIC_DIR = Path(__file__).resolve().parent / "docs_static"
_SERVED = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8", "swagger-ui.css": "text/css; charset=utf-8"}
#: Where the app serves its OpenAPI document (FastAPI's own route is turned off: see create_app).
OPENAPI_URL = "/openapi.json"
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)

router = APIRouter(include_in_schema=False)


@router.get("/docs")
def swagger_page(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "").rstrip("/")
    page = get_swagger_ui_html(
        openapi_url=f"{root}{OPENAPI_URL}",
        title=f"{request.app.title} - API",
        swagger_js_url=f"{root}/docs/static/swagger-ui-bundle.js",
        swagger_css_url=f"{root}/docs/static/swagger-ui.css",
        swagger_favicon_url=f"{root}/ui/static/favicon.svg",
        # No badge that sends the API description to validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )
    # The start-up script holds the document's URL (behind a proxy, with its prefix): hashed per page.
    scripts = tuple(script_hash(script) for script in _INLINE_SCRIPT.findall(bytes(page.body).decode()))
    policy = content_security_policy(script_src=scripts, img_src=("data:", "blob:"))
    page.headers.update(security_headers(policy))
    return page


@router.get("/docs/static/{name}")
def swagger_asset(name: str) -> Response:
    media_type = _SERVED.get(name)
    if media_type is None:
        raise HTTPException(status_code=404, detail=f"no documentation asset {name!r}")
    return Response((STATIC_DIR / name).read_bytes(), media_type=media_type,
                    headers={**SECURITY_HEADERS, "Cache-Control": "public, max-age=86400"})


@router.get(OPENAPI_URL)
def openapi_document(request: Request) -> JSONResponse:
    """FastAPI's own route, with the security headers: the root path (behind a proxy) as first server."""
    schema = request.app.openapi()
    root = request.scope.get("root_path", "").rstrip("/")
    if root and request.app.root_path_in_servers and root not in {s.get("url") for s in schema.get("servers", [])}:
        schema = {**schema, "servers": [{"url": root}, *schema.get("servers", [])]}
    return JSONResponse(schema, headers=SECURITY_HEADERS)
