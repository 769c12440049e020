"""The console over plain HTTP: its page and every asset, their media types and headers, with auth on
and with ``no_auth``, and nothing of it in the OpenAPI document."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.api.console.routes import MEDIA_TYPES, STATIC_DIR
from app.api.main import create_app
from app.core.settings import Settings
from tests.support.helpers import migrated_engine, service_settings

ASSETS = sorted(p.name for p in STATIC_DIR.iterdir() if p.suffix in MEDIA_TYPES and p.name != "index.html")


@pytest.fixture
def open_client(tmp_path: Path) -> Iterator[TestClient]:
    settings = service_settings(tmp_path, no_auth=True)
    engine = migrated_engine(settings)
    with TestClient(create_app(settings)) as test_client:
        yield test_client
    engine.dispose()


def _referenced(text: str) -> set[str]:
    """Asset names a page or module refers to: static/NAME in HTML, ./NAME in ES module imports."""
    return set(re.findall(r'"static/([\w.-]+)"', text)) | set(re.findall(r'from "\./([\w.-]+)"', text))


def test_every_asset_loads_with_its_media_type_and_the_security_headers(client: TestClient) -> None:
    assert {"app.js", "app.css", "api.js", "live.js", "mss.js", "heads.js", "plot.js"} <= set(ASSETS)
    for name in ASSETS:
        response = client.get(f"/ui/static/{name}")
        assert response.status_code == 200, name
        assert response.headers["content-type"] == MEDIA_TYPES[Path(name).suffix], name
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["cache-control"] == "no-cache"
        assert response.content == (STATIC_DIR / name).read_bytes()
    assert client.get("/ui/static/app.js").headers["content-type"] == "text/javascript; charset=utf-8"
    assert client.get("/ui/static/app.css").headers["content-type"] == "text/css; charset=utf-8"


def test_everything_the_page_and_its_modules_refer_to_is_served(client: TestClient) -> None:
    page = client.get("/ui/").text
    wanted = _referenced(page)
    assert {"app.js", "app.css", "favicon.svg"} <= wanted
    for name in ASSETS:
        if name.endswith(".js"):
            wanted |= _referenced(client.get(f"/ui/static/{name}").text)
    missing = [name for name in sorted(wanted) if client.get(f"/ui/static/{name}").status_code != 200]
    assert missing == []
    # Offline: no script, style or font from another origin, in the page or any module.
    for name in ["index.html", *ASSETS]:
        text = (STATIC_DIR / name).read_text()
        assert not re.search(r"(src|href)=\"(https?:)?//", text), name
        assert not re.search(r"import[^;]*\"https?://", text), name


def test_an_asset_is_revalidated_by_its_etag(client: TestClient) -> None:
    first = client.get("/ui/static/app.js")
    again = client.get("/ui/static/app.js", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


def test_ui_redirects_to_the_page_which_is_served_for_each_client_side_path(client: TestClient) -> None:
    redirect = client.get("/ui", follow_redirects=False)
    assert redirect.status_code == 308 and redirect.headers["location"] == "ui/"
    assert client.get("/ui").url.path == "/ui/"
    for path in ("/ui/", "/ui/submit", "/ui/jobs/0123abcd"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-type"] == "text/html; charset=utf-8"
        assert '<base href="/ui/">' in response.text
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "form-action 'none'" in policy and "unsafe" not in policy
        assert response.headers["referrer-policy"] == "no-referrer"


def test_unknown_console_paths_and_assets_are_404_problems(client: TestClient) -> None:
    for path in ("/ui/nothing", "/ui/static/nothing.js", "/ui/static/index.html", "/ui/static/..%2Froutes.py",
                 "/ui/jobs/a/b"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.headers["content-type"] == "application/problem+json"


def test_the_page_is_public_but_the_data_needs_a_key(client: TestClient) -> None:
    assert client.get("/ui/").status_code == 200
    assert client.get("/v1/jobs").status_code == 401  # what the page probes to decide to ask for a key


def test_ui_works_with_no_auth(open_client: TestClient) -> None:
    assert open_client.get("/ui").url.path == "/ui/"
    assert open_client.get("/ui/").status_code == 200
    assert open_client.get("/ui/static/app.js").status_code == 200
    assert open_client.get("/v1/jobs?limit=1").status_code == 200  # so the page shows no sign-in


def test_behind_a_proxy_prefix_the_page_points_its_base_at_the_prefix(settings: Settings, engine: Engine) -> None:
    with TestClient(create_app(settings), root_path="/cahp") as client:
        assert '<base href="/cahp/ui/">' in client.get("/ui/").text


def test_the_console_is_not_part_of_the_api_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [path for path in paths if path.startswith("/ui")]
