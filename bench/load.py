"""Load on the job API: a burst of concurrent submissions, then many clients polling job status,
against a real ``cahp serve`` on loopback, with SQLite and with PostgreSQL as the job database.

Protocol, per database: start ``cahp serve --workers 0`` (embedded broker, no worker: the jobs stay
queued, so the API has both cores to itself apart from this client); send ``--submitters``
submissions at once, each with its own Idempotency-Key, naming a tiny real model and dataset
(``epochs=0``); then ``--pollers`` clients poll ``GET /v1/jobs/{id}`` of random submitted jobs
back to back for ``--duration`` seconds. Every request's latency and status is kept. Afterwards the
job rows and broker messages are counted: every accepted submission must have exactly one row and
one message, and no row may exist that no answer reported.

Then the cost of one status poll (:mod:`bench.httpload`): ``wrk -t2 -c50 -d10s`` against
``GET /v1/jobs/{id}`` and against ``GET /healthz``, alternated ``--wrk-runs`` times in the same server
after a 3 s warm-up of each. The ratio of the medians says what a status poll costs next to the
cheapest route; the CPU time per request (the server's, plus its PostgreSQL backends' for that
database) says it too and moves less with the machine's other work. Then ``--paced-rate`` status
GETs a second for ``--paced-duration`` seconds, open loop, for the latency a polling CI fleet sees.
The load average is recorded with each run: the machine is shared.

Run: ``python -m bench load [--database sqlite|postgresql|both] [--duration 60] [--submitters 100]
[--pollers 50] [--wrk-runs 3] [--wrk-duration 10] [--paced-rate 50] [--paced-duration 20]
[--postgres-url URL]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import create_engine, make_url, text

from bench.common import save
from bench.httpload import paced, postgres_pids, run_wrk

DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@dataclass
class Sample:
    """Latencies (s) and status codes of one kind of request."""

    latencies: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def summary(self, wall_s: float) -> dict[str, Any]:
        lat = np.array(self.latencies) * 1000
        return {
            "requests": len(self.statuses),
            "per_s": round(len(self.statuses) / wall_s, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 1) if lat.size else None,
            "p99_ms": round(float(np.percentile(lat, 99)), 1) if lat.size else None,
            "max_ms": round(float(lat.max()), 1) if lat.size else None,
            "status_5xx": sum(s >= 500 for s in self.statuses),
            "status_counts": {str(s): self.statuses.count(s) for s in sorted(set(self.statuses))},
            "transport_errors": len(self.errors),
        }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tiny_inputs(root: Path) -> tuple[str, str]:
    """A random two-layer BERT classifier with its tokenizer, and a small labelled dataset."""
    import transformers

    words = [f"w{i}" for i in range(200)]
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    model_dir = root / "model"
    config = transformers.BertConfig(  # type: ignore[call-arg]
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, num_labels=3)
    transformers.BertForSequenceClassification(config).save_pretrained(model_dir)
    transformers.BertTokenizerFast(vocab=vocab).save_pretrained(model_dir)  # type: ignore[attr-defined]
    data_dir = root / "data"
    data_dir.mkdir()
    rng = random.Random(0)
    for split, n in (("train", 60), ("test", 30)):
        rows = ["text,label"] + [f"{' '.join(rng.choices(words, k=8))},{i % 3}" for i in range(n)]
        (data_dir / f"{split}.csv").write_text("\n".join(rows) + "\n")
    return f"file://{model_dir}", f"file://{data_dir}"


@contextmanager
def _postgres_schema(url: str) -> Iterator[str]:
    admin = create_engine(url)
    schema = f"cahp_load_{uuid.uuid4().hex[:10]}"
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        # application_name marks the server's own connections, so that their backends' CPU can be told
        # from that of other work on the same PostgreSQL (bench.httpload.postgres_pids).
        yield make_url(url).update_query_dict({"options": f"-csearch_path={schema}",
                                               "application_name": schema}).render_as_string(
            hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@contextmanager
def _server(env: dict[str, str], log: Path) -> Iterator[tuple[str, int]]:
    port = _free_port()
    with open(log, "wb") as handle:
        process = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--workers", "0",
                                    "--log-level", "warning"], env=env, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"cahp serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url, process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _timed(
    client: httpx.AsyncClient, sample: Sample, method: str, url: str, **kwargs: Any
) -> httpx.Response | None:
    start = time.perf_counter()
    try:
        response = await client.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        sample.errors.append(f"{type(exc).__name__}: {exc}")
        return None
    sample.latencies.append(time.perf_counter() - start)
    sample.statuses.append(response.status_code)
    return response


async def _load(url: str, key: str, body: dict[str, Any], *, submitters: int, pollers: int, duration: float
                ) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=submitters + pollers, max_keepalive_connections=submitters + pollers)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=120) as client:
        submits = Sample()
        keys = [f"load-{i}-{uuid.uuid4().hex[:8]}" for i in range(submitters)]
        start = time.perf_counter()
        answers = await asyncio.gather(*(
            _timed(client, submits, "POST", "/v1/jobs", json=body, headers={"Idempotency-Key": k}) for k in keys))
        submit_wall = time.perf_counter() - start
        accepted = [a.json()["id"] for a in answers if a is not None and a.status_code == 202]

        polls = Sample()
        stop_at = time.perf_counter() + duration

        async def poll(seed: int) -> None:
            rng = random.Random(seed)
            while time.perf_counter() < stop_at:
                await _timed(client, polls, "GET", f"/v1/jobs/{rng.choice(accepted)}")

        start = time.perf_counter()
        if accepted:
            await asyncio.gather(*(poll(i) for i in range(pollers)))
        poll_wall = time.perf_counter() - start
    return {"submissions": submits.summary(submit_wall), "polling": polls.summary(poll_wall),
            "accepted_ids": accepted, "idempotency_keys": keys,
            "errors": (submits.errors + polls.errors)[:5]}


def _count(database_url: str, broker_db: Path, accepted: list[str]) -> dict[str, Any]:
    """Rows and messages against what the answers reported: lost and duplicated jobs."""
    from app.api.background import job_id_of

    engine = create_engine(database_url)
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT id, idempotency_key FROM jobs")).all()
    engine.dispose()
    broker = create_engine(f"sqlite:///{broker_db}")
    with broker.connect() as connection:
        messages = [job_id_of(p) for p in connection.execute(text("SELECT payload FROM kombu_message")).scalars()]
    broker.dispose()
    ids = [row.id for row in rows]
    return {
        "job_rows": len(rows),
        "lost": len(set(accepted) - set(ids)),
        "unreported_rows": len(set(ids) - set(accepted)),
        "duplicate_idempotency_keys": len(rows) - len({row.idempotency_key for row in rows}),
        "broker_messages": len(messages),
        "jobs_without_one_message": sum(messages.count(job) != 1 for job in accepted),
    }


@dataclass(frozen=True)
class PollCost:
    """How the cost of one status poll is measured (see the module docstring)."""

    wrk_runs: int = 3
    wrk_duration_s: float = 10.0
    paced_rate: float = 50.0
    paced_duration_s: float = 20.0


def poll_cost(url: str, key: str, job_id: str, cost: PollCost, *, pid: int,
              backends: Callable[[], list[int]]) -> dict[str, Any]:
    """wrk on the status route and on /healthz, alternated; then the paced status GETs.

    CPU per request counts the server process ``pid`` and the database backends serving it.
    """
    status_path = f"/v1/jobs/{job_id}"
    runs: dict[str, list[dict[str, Any]]] = {"status": [], "healthz": []}
    if cost.wrk_runs:
        # Warm-up, not recorded: the pools fill, statements get prepared, caches warm up.
        run_wrk(url, "/healthz", key=None, duration_s=min(3.0, cost.wrk_duration_s))
        run_wrk(url, status_path, key=key, duration_s=min(3.0, cost.wrk_duration_s))
    for _ in range(cost.wrk_runs):
        runs["healthz"].append(run_wrk(url, "/healthz", key=None, duration_s=cost.wrk_duration_s,
                                       cpu_of=[pid, *backends()]).as_dict())
        runs["status"].append(run_wrk(url, status_path, key=key, duration_s=cost.wrk_duration_s,
                                      cpu_of=[pid, *backends()]).as_dict())
    figures: dict[str, Any] = {"wrk_runs": runs}
    if cost.wrk_runs:
        median = {name: float(np.median([r["per_s"] for r in found])) for name, found in runs.items()}
        figures["saturation"] = {
            "status_per_s": round(median["status"], 1),
            "healthz_per_s": round(median["healthz"], 1),
            "ratio": round(median["status"] / median["healthz"], 3),
            "status_p50_ms": float(np.median([r["p50_ms"] for r in runs["status"]])),
            "status_p99_ms": float(np.median([r["p99_ms"] for r in runs["status"]])),
            "errors": sum(r["non_2xx"] + r["socket_errors"] for found in runs.values() for r in found),
            "status_cpu_us": float(np.median([r["cpu_us_per_request"] for r in runs["status"]])),
            "healthz_cpu_us": float(np.median([r["cpu_us_per_request"] for r in runs["healthz"]])),
        }
    if cost.paced_duration_s > 0:
        figures["paced"] = paced(url, status_path, key=key, rate=cost.paced_rate, duration_s=cost.paced_duration_s)
    return figures


def run_one(database: str, *, postgres_url: str, submitters: int, pollers: int, duration: float,
            cost: PollCost | None = None) -> dict[str, Any]:
    from app.core.db import make_engine, make_session_factory, upgrade_database
    from app.core.security import create_api_key

    with tempfile.TemporaryDirectory(prefix="cahp-load-") as tmp, (
        _postgres_schema(postgres_url) if database == "postgresql" else _no_schema()
    ) as pg_url:
        root = Path(tmp)
        data_dir = root / "cahp-data"
        database_url = pg_url or f"sqlite:///{data_dir / 'cahp.db'}"
        inputs = root / "inputs"
        inputs.mkdir()
        model_uri, data_uri = _tiny_inputs(inputs)
        engine = make_engine(database_url)
        upgrade_database(engine)
        with make_session_factory(engine)() as session:
            key = create_api_key(session=session, name="load")
        engine.dispose()
        env = {**os.environ, "CAHP_DATA_DIR": str(data_dir), "CAHP_DATABASE_URL": database_url,
               "CAHP_ALLOWED_LOCAL_ROOTS": str(inputs), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
               # One key sends every submission: the per-key quota must not be what is measured.
               "CAHP_MAX_ACTIVE_JOBS_PER_KEY": "1000000"}
        body = {"model": {"uri": model_uri}, "dataset": {"uri": data_uri},
                "params": {"epochs": 0, "dense_finetune": "never", "untrained_dense": "warn", "max_length": 32,
                           "batch_size": 16}}
        with _server(env, root / "serve.log") as (url, pid):
            figures = asyncio.run(_load(url, key, body, submitters=submitters, pollers=pollers, duration=duration))
            if cost is not None and figures["accepted_ids"]:
                backends = (lambda: postgres_pids(database_url)) if database == "postgresql" else (lambda: [])
                figures["poll_cost"] = poll_cost(url, key, figures["accepted_ids"][0], cost, pid=pid, backends=backends)
        figures["rows"] = _count(database_url, data_dir / "broker.db", figures.pop("accepted_ids"))
        figures.pop("idempotency_keys")
        return figures


@contextmanager
def _no_schema() -> Iterator[None]:
    yield None


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of polling")
    parser.add_argument("--submitters", type=int, default=100)
    parser.add_argument("--pollers", type=int, default=50)
    parser.add_argument("--wrk-runs", type=int, default=3, help="wrk runs on each route, alternated (0: none)")
    parser.add_argument("--wrk-duration", type=float, default=10.0, help="seconds of each wrk run")
    parser.add_argument("--paced-rate", type=float, default=50.0, help="status GETs a second in the paced phase")
    parser.add_argument("--paced-duration", type=float, default=20.0, help="seconds of the paced phase (0: none)")
    parser.add_argument("--postgres-url", default=os.environ.get("CAHP_TEST_POSTGRES_URL", DEFAULT_POSTGRES))
    parser.add_argument("--output", default="load.json", help="file name under bench/results/")
    args = parser.parse_args(argv)
    databases = ["sqlite", "postgresql"] if args.database == "both" else [args.database]
    results: dict[str, Any] = {}
    cost = PollCost(wrk_runs=args.wrk_runs, wrk_duration_s=args.wrk_duration, paced_rate=args.paced_rate,
                    paced_duration_s=args.paced_duration)
    load_before = round(os.getloadavg()[0], 2)
    for database in databases:
        print(f"load: {database}: {args.submitters} concurrent submissions, then {args.pollers} pollers for "
              f"{args.duration:.0f} s ...", file=sys.stderr)
        results[database] = run_one(database, postgres_url=args.postgres_url, submitters=args.submitters,
                                    pollers=args.pollers, duration=args.duration, cost=cost)
        _print(database, results[database])
    protocol = (f"cahp serve --workers 0 on 127.0.0.1 (embedded broker, no worker running: jobs stay queued); "
                f"{args.submitters} concurrent POST /v1/jobs with distinct Idempotency-Keys, then {args.pollers} "
                f"clients polling GET /v1/jobs/{{id}} back to back for {args.duration:.0f} s; one asyncio+httpx "
                "client process on the same machine; then, per database, wrk -t2 -c50 against GET /healthz and "
                f"GET /v1/jobs/{{id}} alternated {args.wrk_runs} times ({args.wrk_duration:.0f} s each; medians), and "
                f"{args.paced_rate:.0f} status GETs/s open loop for {args.paced_duration:.0f} s")
    path = save(args.output, {"results": results, "load_average_at_start": load_before},
                command="python -m bench load " + " ".join(argv), protocol=protocol)
    print(f"saved {path}", file=sys.stderr)


def _print(database: str, figures: dict[str, Any]) -> None:
    for phase in ("submissions", "polling"):
        f = figures[phase]
        print(f"{database:10s} {phase:11s} requests={f['requests']:6d} ({f['per_s']:7.1f}/s) p50={f['p50_ms']} ms "
              f"p99={f['p99_ms']} ms max={f['max_ms']} ms 5xx={f['status_5xx']} errors={f['transport_errors']} "
              f"statuses={f['status_counts']}")
    rows = figures["rows"]
    print(f"{database:10s} rows        {rows}")
    cost = figures.get("poll_cost", {})
    if "saturation" in cost:
        s = cost["saturation"]
        print(f"{database:10s} wrk         status {s['status_per_s']}/s (p50 {s['status_p50_ms']} ms, p99 "
              f"{s['status_p99_ms']} ms), healthz {s['healthz_per_s']}/s, ratio {s['ratio']}, errors {s['errors']}; "
              f"CPU per request: status {s['status_cpu_us']} us, healthz {s['healthz_cpu_us']} us")
    if "paced" in cost:
        p = cost["paced"]
        print(f"{database:10s} paced       {p['rate_per_s']}/s: p50 {p['p50_ms']} ms p99 {p['p99_ms']} ms max "
              f"{p['max_ms']} ms non-2xx {p['non_2xx']} errors {p['transport_errors']} (load {p['load_average']})")
