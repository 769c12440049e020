"""The API key cache: polls skip the key lookup, and a revoked key is still refused within a second."""

from __future__ import annotations

import time

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from app.core.db import make_session_factory
from app.core.security import KeyCache, Principal, key_id_of, revoke_key
from app.core.settings import Settings
from tests.support.jobs import submit


def test_entries_live_for_the_ttl_and_only_for_the_key_that_was_checked() -> None:
    now = [100.0]
    cache = KeyCache(1.0, clock=lambda: now[0])
    principal = Principal(id="abc", name="ci")
    cache.put("cahp_key", principal)
    assert cache.get("cahp_key") == principal and cache.get("cahp_other") is None
    now[0] += 0.999
    assert cache.get("cahp_key") == principal
    now[0] += 0.001
    assert cache.get("cahp_key") is None
    off = KeyCache(0.0)
    off.put("cahp_key", principal)
    assert off.get("cahp_key") is None


def test_a_cached_key_costs_no_query_and_a_revoked_one_is_refused_within_a_second(
    app: FastAPI, client: TestClient, auth: dict[str, str], key: str, engine: Engine, settings: Settings
) -> None:
    assert settings.key_cache_s == 1.0
    job_id = submit(client, auth, settings)
    now = [0.0]
    app.state.key_cache = KeyCache(settings.key_cache_s, clock=lambda: now[0])
    assert client.get(f"/v1/jobs/{job_id}", headers=auth).status_code == 200  # checked, and cached
    statements: list[str] = []
    event.listen(app.state.sessions.kw["bind"], "before_cursor_execute", lambda *a: statements.append(a[2]))
    assert client.get(f"/v1/jobs/{job_id}", headers=auth).status_code == 200
    assert not any("api_keys" in s for s in statements)

    with make_session_factory(engine)() as session:
        revoke_key(session=session, name_or_id=str(key_id_of(key)))
    assert client.get(f"/v1/jobs/{job_id}", headers=auth).status_code == 200  # the cached check, for now
    now[0] += settings.key_cache_s
    refused = client.get(f"/v1/jobs/{job_id}", headers=auth)
    assert refused.status_code == 401 and refused.json()["code"] == "unauthenticated"


def test_with_the_real_clock_a_revoked_key_is_refused_a_second_later(
    client: TestClient, auth: dict[str, str], key: str, engine: Engine, settings: Settings
) -> None:
    job_id = submit(client, auth, settings)
    assert client.get(f"/v1/jobs/{job_id}", headers=auth).status_code == 200
    with make_session_factory(engine)() as session:
        revoke_key(session=session, name_or_id=str(key_id_of(key)))
    time.sleep(settings.key_cache_s)  # the longest a cache entry lives
    assert client.get(f"/v1/jobs/{job_id}", headers=auth).status_code == 401
