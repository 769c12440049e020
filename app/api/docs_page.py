"""``/docs``: the interactive OpenAPI page, with Swagger UI served by the app itself.

FastAPI's default page loads Swagger UI from a CDN. That fails offline, and it runs a third-party
script in the API's origin, where the console keeps its key in ``sessionStorage``. So the pinned
files under ``docs_static/`` (Swagger UI 5.35.0, Apache-2.0, with its licence) are served instead,
and ReDoc (CDN-only) is not offered.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException

STATIC_DIR = Path(__file__).resolve().parent / "docs_static"
_SERVED = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8", "swagger-ui.css": "text/css; charset=utf-8"}

router = APIRouter(include_in_schema=False)


@router.get("/docs")
def swagger_page(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "").rstrip("/")
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} - API",
        swagger_js_url=f"{root}/docs/static/swagger-ui-bundle.js",
        swagger_css_url=f"{root}/docs/static/swagger-ui.css",
        swagger_favicon_url=f"{root}/ui/static/favicon.svg",
        # No badge that sends the API description to validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get("/docs/static/{name}")
def swagger_asset(name: str) -> Response:
    media_type = _SERVED.get(name)
    if media_type is None:
        raise HTTPException(status_code=404, detail=f"no documentation asset {name!r}")
    return Response((STATIC_DIR / name).read_bytes(), media_type=media_type,
                    headers={"Cache-Control": "public, max-age=86400"})
