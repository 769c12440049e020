"""A key holder (or anyone who reaches the port) probing the API's smaller holes; each test replays one.

Invented HTTP methods growing ``/metrics`` and its multi-process files without bound, digits that
``str.isdigit`` accepts and ``int`` refuses (``Last-Event-ID: ²``, ``Range``, ``Content-Length``), event
streams that outlive their key's revocation, a key lookup whose work tells whether a key id exists,
hub revisions that climb out of the hub cache, the worker's paths in stored JSON artifacts, and the
docs page served without the console's security headers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, event, text

import app.core.security._keys as keys_module
from app.api.main import create_app
from app.core.db import ApiKey, make_session_factory, transaction
from app.core.security import _keys as keys
from app.core.settings import Settings
from app.core.storage import open_store
from app.http_headers import retry_after_s
from cahp_engine.run import RunHooks, RunReport, RunRequest, run_pruning
from tests.support.helpers import (
    job_body,
    migrated_engine,
    new_key,
    service_settings,
    write_tiny_dataset,
    write_tiny_model,
)
from tests.support.jobs import finish, progress, start, store, submit
from tests.support.processes import stop
from tests.support.stack import start_server
from worker.redaction import Redactor, job_redactor
from worker.runner import Outcome, WorkerContext, execute_job

#: Short enough that a revoked key's stream ends quickly; the production bound is the same rule.
KEY_CACHE_S = 0.2
POLL_S = 0.05


@pytest.fixture
def api_key(alice: str) -> str:
    """The client is alice's."""
    return alice


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return service_settings(tmp_path, key_cache_s=KEY_CACHE_S, events_poll_s=POLL_S)


def _problem(response: Any, status: int, code: str, *fragments: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    for fragment in fragments:
        assert fragment in body["detail"], (fragment, body["detail"])
    return body


# --- a real ``cahp serve`` -------------------------------------------------------------------------------


@dataclass
class Served:
    """``cahp serve`` on a loopback port, with its settings, database and one key."""

    url: str
    settings: Settings
    engine: Engine
    key: str

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=60)

    def finished_job(self, tmp: Path, *, messages: list[str], files: dict[str, bytes] | None = None) -> str:
        """A succeeded job of the key, with these log lines and artifacts, written as a worker would."""
        data = write_tiny_dataset(self.settings.allowed_local_roots[0] / "data")
        with self.http() as http:
            answer = http.post("/v1/jobs", json=job_body("hf://org/model", f"file://{data}"))
        assert answer.status_code == 202, answer.text
        job_id = str(answer.json()["id"])
        start(self.engine, job_id)
        finish(self.engine, job_id, messages=messages,
               artifacts=store(self.settings, job_id, files, tmp) if files else None)
        return job_id


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("served")
    settings = service_settings(root, key_cache_s=KEY_CACHE_S, events_poll_s=POLL_S)
    engine = migrated_engine(settings)
    key = new_key(engine, "alice")
    server = start_server(settings, root / "serve.log")
    try:
        yield Served(url=server.url, settings=settings, engine=engine, key=key)
    finally:
        stop(server.process)
        engine.dispose()


# --- /metrics ---------------------------------------------------------------------------------------------


def _tree_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_invented_http_methods_do_not_grow_the_scrape_or_the_multiprocess_files(served: Served) -> None:
    files = next((served.settings.data_dir / "metrics").glob("serve-*"))
    with httpx.Client(base_url=served.url, timeout=60) as http:  # no key needed
        for method in ("GET", "POST", "HEAD", "OPTIONS"):
            http.request(method, "/healthz")
        http.request("BREW", "/healthz")  # the one "other" series exists before the attack
        before = http.get("/metrics").content
        files_before = _tree_bytes(files)
        for n in range(3000):
            assert http.request(f"X{n:04d}", "/healthz").status_code == 405
        after = http.get("/metrics")
    assert after.status_code == 200
    # One series per (method, route, status) and 3,000 methods: unbounded, it grew by megabytes.
    assert len(after.content) - len(before) < 4096, (len(before), len(after.content))
    assert _tree_bytes(files) - files_before <= 1 << 20, (files_before, _tree_bytes(files))
    methods: dict[str, float] = {}
    for family in text_string_to_metric_families(after.text):
        for sample in family.samples:
            if sample.name == "cahp_http_request_duration_seconds_count":
                methods[sample.labels["method"]] = methods.get(sample.labels["method"], 0) + sample.value
    assert set(methods) <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}, sorted(methods)
    assert methods["other"] >= 3001


def test_every_http_label_comes_from_a_bounded_set(client: TestClient) -> None:
    from app.core.metrics import http_labels

    assert http_labels("get", "/v1/jobs/{job_id}", 200) == ("other", "/v1/jobs/{job_id}", "200")
    assert http_labels("PATCH", None, 404) == ("PATCH", "unmatched", "404")
    assert http_labels("GET", "/x", 1000) == ("GET", "/x", "other")
    # Raw paths never become labels: an unknown path is "unmatched", a job id stays in the template.
    client.get("/v1/jobs/" + "a" * 40)
    client.get("/no/such/path/" + "b" * 40)
    scraped = client.get("/metrics").text
    assert "a" * 40 not in scraped and "b" * 40 not in scraped
    routes = {sample.labels["route"] for family in text_string_to_metric_families(scraped)
              for sample in family.samples if sample.name == "cahp_http_request_duration_seconds_count"}
    assert {"/v1/jobs/{job_id}", "unmatched"} <= routes


# --- digits that isdigit() accepts and int() refuses -----------------------------------------------------
# Sent as raw bytes to a real server, which decodes header values as Latin-1: the byte 0xB2 is "²",
# a digit to str.isdigit() and not to int(). (TestClient re-encodes header values as UTF-8.)


def _stream(http: httpx.Client | TestClient, job_id: str, headers: dict[str, Any]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    with http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response:
        assert response.status_code == 200, response.read()
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if not line:
                if "data" in fields:
                    found.append((fields["id"], fields["event"]))
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
    return found


def test_a_last_event_id_that_is_not_ascii_digits_starts_the_stream_over(served: Served, tmp_path: Path) -> None:
    job_id = served.finished_job(tmp_path, messages=["one", "two", "three"])
    with served.http() as http:
        for value in ("²", "1²", "³", "¹0", "²" * 64, "12345678901", "-1", "+2", "0x1"):
            events = _stream(http, job_id, {"Last-Event-ID": value.encode("latin-1")})
            assert [kind for _, kind in events] == ["log", "log", "log", "status"], value
        assert [kind for _, kind in _stream(http, job_id, {"Last-Event-ID": "2"})] == ["log", "status"]


def test_range_headers_are_read_in_ascii_digits_only(served: Served, tmp_path: Path) -> None:
    from app.api.ranges import requested_range
    from app.core.errors import RangeNotSatisfiableError

    # ``\\d`` matches every script's digits (U+0663 is an Arabic-Indic 3); only ASCII ones are a position.
    assert requested_range("bytes=\u0663-\u0665", size=10, etag="x") is None
    # Longer than int() reads (the route caps the header at 200 characters; the parser does not rely on it).
    with pytest.raises(RangeNotSatisfiableError):
        requested_range("bytes=" + "9" * 5000 + "-", size=10, etag="x")
    job_id = served.finished_job(tmp_path, messages=[], files={"head_map.json": b"0123456789"})
    url = f"/v1/jobs/{job_id}/artifacts/head_map.json"
    with served.http() as http:
        for header in ("bytes=²-", "bytes=-²", "bytes=1-²", "bytes=³-5"):
            answer = http.get(url, headers={"Range": header.encode("latin-1")})
            assert answer.status_code == 200 and answer.content == b"0123456789", header
        assert http.get(url, headers={"Range": "bytes=" + "9" * 150 + "-"}).status_code == 416
        whole = http.get(url, headers={"Range": "bytes=-" + "9" * 150})
        assert whole.status_code == 206 and whole.content == b"0123456789"
        assert http.get(url, headers={"Range": "bytes=2-" + "9" * 150}).content == b"23456789"
        assert http.get(url, headers={"Range": "bytes=" + "0" * 30 + "2-3"}).content == b"23"


def test_the_client_reads_a_retry_after_of_non_ascii_digits_as_absent() -> None:
    # A proxy (or a hostile server) answering ``Retry-After: ²`` must not crash ``cahp wait``.
    assert retry_after_s("²") is None and retry_after_s("7") == 7.0


def test_a_content_length_that_isdigit_but_is_not_an_int_is_not_a_500(client: TestClient) -> None:
    # The HTTP server in front may refuse these itself; whatever reaches the route must not be a 500.
    body = b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.csv\"\r\n\r\ntext,label\r\n--b--\r\n"
    for declared in ("9" * 4400, "²".encode("latin-1")):
        scope_headers: dict[str, Any] = {"Content-Type": "multipart/form-data; boundary=b", "Content-Length": declared}
        answer = client.post("/v1/uploads", content=body, headers=scope_headers)
        assert answer.status_code in (201, 413, 422), answer.text


# --- a revoked key's open streams -------------------------------------------------------------------------


def test_a_revoked_keys_open_event_stream_ends_within_the_key_cache_lifetime(
    client: TestClient, settings: Settings, engine: Engine, alice: str
) -> None:
    job_id = submit(client, {}, settings)
    start(engine, job_id)
    revoked_at: list[float] = []
    ended = threading.Event()

    def worker_and_operator() -> None:
        # The job keeps logging; the operator revokes the key after a few lines; if the stream is
        # still open 60 s later, the job is finished so that the test ends either way.
        deadline = time.monotonic() + 60
        n = 0
        while not ended.is_set() and time.monotonic() < deadline:
            n += 1
            progress(engine, job_id, "signatures", min(0.9, n / 1000), messages=(f"line {n}",))
            if n == 10:
                with make_session_factory(engine)() as session:  # revoking commits
                    keys.revoke_key(session=session, name_or_id=alice.split("_")[1])
                revoked_at.append(time.monotonic())
            time.sleep(POLL_S)
        if not ended.is_set():
            finish(engine, job_id, messages=["finished by the test"])

    writer = threading.Thread(target=worker_and_operator)
    writer.start()
    try:
        events = _stream(client, job_id, {})
        stream_ended = time.monotonic()
    finally:
        ended.set()
        writer.join()
    assert revoked_at, "the key was never revoked"
    # The bound: the key cache's lifetime and a poll, with room for a busy machine (well before the job ends).
    assert stream_ended - revoked_at[0] < KEY_CACHE_S + POLL_S + 30.0, stream_ended - revoked_at[0]
    kinds = [kind for _, kind in events]
    # One status event (the job's state when the stream began), never the terminal one.
    assert kinds.count("status") == 1 and "log" in kinds, kinds
    _problem(client.get(f"/v1/jobs/{job_id}/events"), 401, "unauthenticated")


# --- what a key lookup costs ------------------------------------------------------------------------------


def test_a_wrong_key_costs_the_same_work_whether_or_not_its_id_exists(
    client: TestClient, engine: Engine, alice: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_id, secret = alice.split("_")[1], alice.split("_", 2)[2]
    wrong_secret = f"cahp_{key_id}_{'A' * 43 if not secret.startswith('A') else 'B' * 43}"
    unknown_id = f"cahp_{'z' * 12}_{secret}"
    assert key_id != "z" * 12
    verified: list[str] = []
    real_matches = keys_module.key_matches

    def counting(key: str, stored_hash: str) -> bool:
        verified.append(key)
        return real_matches(key, stored_hash)

    monkeypatch.setattr(keys_module, "key_matches", counting)
    statements: list[str] = []
    built: list[object] = []

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "api_keys" in statement:
            statements.append(statement)

    def on_load(target: object, context: object) -> None:
        built.append(target)

    event.listen(Engine, "before_cursor_execute", on_execute)
    event.listen(ApiKey, "load", on_load)
    work: dict[str, tuple[list[str], list[str], int]] = {}
    try:
        for name, key in (("unknown id", unknown_id), ("wrong secret", wrong_secret)):
            verified.clear()
            statements.clear()
            built.clear()
            _problem(client.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}), 401, "unauthenticated")
            work[name] = (list(verified), list(statements), len(built))
    finally:
        event.remove(Engine, "before_cursor_execute", on_execute)
        event.remove(ApiKey, "load", on_load)
    # Both paths verify one hash, run the same statement and build no row object.
    assert work["unknown id"][0] == [unknown_id] and work["wrong secret"][0] == [wrong_secret]
    assert work["unknown id"][1] == work["wrong secret"][1] and len(work["unknown id"][1]) == 1
    assert work["unknown id"][2] == work["wrong secret"][2] == 0
    assert client.get("/v1/jobs").status_code == 200


def test_the_strings_behind_the_dummy_hashes_are_not_keys(client: TestClient, engine: Engine) -> None:
    from app.core.db import repository

    with transaction(make_session_factory(engine)) as session:
        repository.ensure_local_principal(session)  # as a --no-auth server leaves it
    for key in ("no key has this value", "no key is local", "cahp_local_" + "x" * 43):
        _problem(client.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}), 401, "unauthenticated")


# --- hub revisions ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("revision", ["..", "a/../b", "../../../../tmp/x", "refs/../../x", "/main", "main/", "a//b",
                                      ".hidden", "a/.git", "a\\b", "..\\..\\x", "main\x00", "v1.", "x.lock", "-x"])
def test_a_hub_revision_that_is_path_like_is_a_422_naming_the_field(
    revision: str, client: TestClient, settings: Settings
) -> None:
    body = job_body("hf://org/model", f"file://{write_tiny_dataset(settings.allowed_local_roots[0] / 'd')}")
    body["model"]["revision"] = revision
    _problem(client.post("/v1/jobs", json=body), 422, "invalid_reference", "`model.revision`")


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "release/2024.1", "a" * 40, "my_branch-2"])
def test_branch_tag_and_commit_revisions_are_still_accepted(
    revision: str, client: TestClient, settings: Settings
) -> None:
    body = job_body("hf://org/model", f"file://{write_tiny_dataset(settings.allowed_local_roots[0] / 'd')}")
    body["model"]["revision"] = revision
    assert client.post("/v1/jobs", json=body).status_code == 202


def test_a_stored_path_like_revision_is_refused_by_the_worker_before_anything_runs(
    client: TestClient, settings: Settings, engine: Engine
) -> None:
    job_id = submit(client, {}, settings)
    with engine.begin() as connection:  # a row written before the rule, or by hand
        connection.execute(text("UPDATE jobs SET model_revision = '../../../x' WHERE id = :id"), {"id": job_id})
    ran: list[object] = []

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        ran.append(args)
        raise AssertionError("the pipeline ran")

    context = WorkerContext(settings=settings, sessions=make_session_factory(engine), store=open_store(settings),
                            worker_id="w")
    assert execute_job(job_id=job_id, context=context, pipeline=pipeline) is Outcome.failed
    error = client.get(f"/v1/jobs/{job_id}").json()["error"]
    assert error["code"] == "invalid_reference" and "`model.revision`" in error["message"] and not ran


# --- server paths in what callers read --------------------------------------------------------------------


def test_redaction_replaces_whole_path_prefixes_only() -> None:
    redact = Redactor((("/home/alice", "~"), ("/srv/cahp", "<data>"), ("/srv/cahp/work", "<work>"),
                       ("/srv/cahp/work/job1", "<job>")))
    cases = {
        "/home/alice/x.txt": "~/x.txt",
        "/home/alice": "~",
        "in /home/alice: denied": "in ~: denied",
        "'/home/alice/m'": "'~/m'",
        "file:///home/alice/m": "file://~/m",
        "cache=/srv/cahp/hub": "cache=<data>/hub",
        "(/srv/cahp)": "(<data>)",
        # Other paths that merely start with the same characters, or hold them inside, are not touched.
        "/home/alice2/x": "/home/alice2/x",
        "/home/alice.bak/x": "/home/alice.bak/x",
        "/home/alice-old": "/home/alice-old",
        "/backup/home/alice/x": "/backup/home/alice/x",
        "/srv/cahpx/y": "/srv/cahpx/y",
        # The longest directory wins, and a label is never rewritten by a shorter one.
        "/srv/cahp/work/job1/inputs/model": "<job>/inputs/model",
        "/srv/cahp/work/job12/x": "<work>/job12/x",
        "/srv/cahp/workers": "<data>/workers",
        "/srv/cahp/work/job1 and /home/alice": "<job> and ~",
    }
    assert {text: redact(text) for text in cases} == cases


def test_the_home_directory_is_not_told_by_redacting_inside_other_paths(tmp_path: Path) -> None:
    settings = service_settings(tmp_path)
    redact = job_redactor(settings, settings.resolved_work_dir / "job.1")
    home = str(Path.home()).rstrip("/")
    sibling = f"{home}2/models/x"
    assert redact(sibling) == sibling and redact(f"{home}/x") == "~/x"


def test_json_redaction_keeps_honest_bytes_and_changes_only_server_paths(tmp_path: Path) -> None:
    from worker.redaction import redact_json_file

    redact = Redactor((("/srv/cahp", "<data>"),))
    honest = tmp_path / "honest.json"
    honest.write_bytes(b'{"a": 1.0000000000000002, "b": NaN, "c": ["/srv/cahpx", "\\u00e9"], "d": {"e": null}}')
    before = honest.read_bytes()
    assert redact_json_file(honest, redact) is False and honest.read_bytes() == before
    payload = {"ref": "file:///srv/cahp/shared/m", "n": [0.1, 1e-07, 3], "/srv/cahp/k": {"x": "é /srv/cahp"}}
    leaky = tmp_path / "report.json"
    leaky.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    assert redact_json_file(leaky, redact) is True
    expected = {"ref": "file://<data>/shared/m", "n": [0.1, 1e-07, 3], "<data>/k": {"x": "é <data>"}}
    assert leaky.read_text() == json.dumps(expected, indent=2, sort_keys=False) + "\n"


def test_a_real_jobs_json_artifacts_hold_no_server_path_and_are_otherwise_the_engines_bytes(
    tmp_path: Path,
) -> None:
    # The operator lets jobs read a directory inside the data directory; the caller names a model there.
    data_dir = tmp_path / "cahp-data"
    shared = data_dir / "shared"
    shared.mkdir(parents=True)
    settings = service_settings(tmp_path, allowed_local_roots=(shared,))
    db = migrated_engine(settings)
    key = new_key(db, "alice")
    written: dict[str, bytes] = {}

    def pipeline(request: RunRequest, hooks: RunHooks) -> RunReport:
        report = run_pruning(request, hooks)
        output = Path(request.output_dir)
        written.update({p.name: p.read_bytes() for p in output.glob("*.json")})
        return report

    try:
        with TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"}) as client:
            model = f"file://{write_tiny_model(shared / 'm')}"
            data = f"file://{write_tiny_dataset(shared / 'd')}"
            job_id = client.post("/v1/jobs", json=job_body(model, data)).json()["id"]
            context = WorkerContext(settings=settings, sessions=make_session_factory(db),
                                    store=open_store(settings), worker_id="w")
            assert execute_job(job_id=job_id, context=context, pipeline=pipeline) is Outcome.succeeded
            manifest = {a["name"]: a for a in client.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]}
            stored = {name: client.get(f"/v1/jobs/{job_id}/artifacts/{name}").content
                      for name in manifest if name.endswith(".json")}
    finally:
        db.dispose()
    assert set(stored) == {"report.json", "mss_curve.json", "head_map.json"} == set(written)
    assert str(data_dir).encode() in written["report.json"]  # the engine wrote the server's path...
    for name, body in stored.items():
        assert str(data_dir).encode() not in body and str(tmp_path).encode() not in body, name  # ...no caller reads it
        assert hashlib.sha256(body).hexdigest() == manifest[name]["sha256"] and len(body) == manifest[name]["size"]
    report = json.loads(stored["report.json"])
    assert report["model"]["ref"] == "file://<data>/shared/m" and report["dataset"]["ref"] == "file://<data>/shared/d"
    # Everything but the paths is what the engine wrote, byte for byte.
    assert stored["mss_curve.json"] == written["mss_curve.json"]
    assert stored["head_map.json"] == written["head_map.json"]
    expected = json.loads(written["report.json"].decode().replace(str(data_dir), "<data>"))
    assert stored["report.json"].decode() == json.dumps(expected, indent=2, sort_keys=False) + "\n"


# --- the docs page --------------------------------------------------------------------------------------


def test_the_docs_page_its_assets_and_the_openapi_document_carry_the_consoles_security_headers(
    client: TestClient,
) -> None:
    console = client.get("/ui/")
    for url in ("/docs", "/docs/static/swagger-ui-bundle.js", "/docs/static/swagger-ui.css", "/openapi.json"):
        answer = client.get(url)
        assert answer.status_code == 200, url
        for name in ("X-Content-Type-Options", "Referrer-Policy", "X-Frame-Options"):
            assert answer.headers.get(name) == console.headers[name], (url, name)
        policy = answer.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy, url
    page = client.get("/docs")
    policy = dict(part.strip().split(" ", 1) for part in page.headers["Content-Security-Policy"].split(";"))
    # The one inline start-up script is allowed by its hash; no other inline script could run.
    inline = re.findall(r"<script>(.*?)</script>", page.text, re.DOTALL)
    assert len(inline) == 1 and "'unsafe-inline'" not in page.headers["Content-Security-Policy"]
    digest = base64.b64encode(hashlib.sha256(inline[0].encode()).digest()).decode()
    assert policy["script-src"] == f"'self' 'sha256-{digest}'"
    assert policy["connect-src"] == "'self'" and policy["form-action"] == "'none'"
    assert client.get("/openapi.json").json()["paths"]
    assert client.get("/redoc").status_code == 404
