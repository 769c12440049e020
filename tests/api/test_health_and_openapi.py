"""Probes and the published OpenAPI document."""

from __future__ import annotations

import dataclasses

from fastapi.testclient import TestClient

from cahp_engine.config import STRATEGIES, PruningConfig


def test_health_and_readiness_need_no_key(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    # No workers of its own (they run elsewhere): `workers` is null.
    assert client.get("/readyz").json() == {"status": "ok", "database": "ok", "broker": "ok", "workers": None}


def test_openapi_documents_the_v1_api(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/jobs/{job_id}/logs",
            "/v1/jobs/{job_id}/artifacts", "/v1/jobs/{job_id}/artifacts/{name}", "/v1/uploads",
            "/healthz", "/readyz"} <= set(paths)
    upload = paths["/v1/uploads"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert upload["required"] == ["file"]
    assert "application/problem+json" in paths["/v1/jobs"]["post"]["responses"]["422"]["content"]
    assert any("HTTPBearer" in scheme for scheme in spec["components"]["securitySchemes"])
    params = spec["components"]["schemas"]["JobParams"]
    expected = {f.name for f in dataclasses.fields(PruningConfig)} - {"device"}
    assert set(params["properties"]) == expected and params["additionalProperties"] is False
    # Each setting's bounds, choices and default are in the schema (tests/test_settings_surfaces.py checks them all).
    degree = params["properties"]["poly_degree"]
    assert {"type": "integer", "minimum": 1, "maximum": 10} in degree["anyOf"]
    assert degree["description"] == "Kneedle polynomial degree (default 2)"
    assert {"type": "string", "enum": list(STRATEGIES)} in params["properties"]["strategy"]["anyOf"]
    assert client.get("/docs").status_code == 200


def test_the_docs_page_loads_swagger_ui_from_the_app_itself(client: TestClient) -> None:
    import re

    page = client.get("/docs")
    assert page.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources and all(s.startswith("/") for s in sources), sources  # nothing from another host
    for url, kind in (("/docs/static/swagger-ui-bundle.js", "text/javascript"),
                      ("/docs/static/swagger-ui.css", "text/css")):
        asset = client.get(url)
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
        assert len(asset.content) > 100_000
    assert client.get("/docs/static/LICENSE").status_code == 404
    assert client.get("/redoc").status_code == 404
