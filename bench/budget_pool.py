"""An accuracy budget's search on a pool of 1 and of 2 workers: the wall time, and whether the answer is the same.

The job service with Redis as its broker, the real app in this process (``TestClient``, SQLite) and
``--workers`` real ``cahp worker`` processes (prefork, one job at a time, one torch thread each). The
same budget job (a 3-layer x 4-head BERT with a learnt dense model, 300 training rows at batch 2, two
head counts per round: ``budget_parallel: 2``, so a round has up to 4 candidates) is submitted to a pool
of each size in turn, ``--repeats`` times, alternating the sizes. Per run: the job's wall time (claim to
end), the search's own seconds (``budget.search_seconds``) and its answer (heads kept, and the whole
``budget`` record without its seconds, compared with the first run's).

On this 2-core machine two workers is the most that can run side by side; a pool's speed-up with W
workers is at most the rung's width (4 here) and is cut by the rungs where fewer candidates are left.

    python -m bench budget-pool --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import machine

RESULTS = Path(__file__).parent / "results" / "budget_pool.json"
PARAMS: dict[str, Any] = {
    "dense_finetune": "always", "dense_epochs": 4, "dense_lr": 2e-3, "lr": 5e-4, "batch_size": 2, "max_length": 32,
    "epochs": 16, "eval_steps": 150 * 4, "max_accuracy_drop": 3.0, "budget_screen_epochs": 4.0,
    "budget_parallel": 2, "resolution": 6, "signature_samples": "all", "calibration_fraction": 1.0,
    "stability_shards": 0, "latency_repeats": 1, "latency_warmup": 0, "seed": 5, "export": "none",
}


def _inputs(local: Path) -> tuple[str, str]:
    from tests.support.helpers import write_split
    from tests.support.tiny_models import make_classifier, make_tokenizer

    make_classifier("bert", layers=3, heads=4, head_dim=16, num_labels=3, seed=2).save_pretrained(local / "model")
    make_tokenizer().save_pretrained(local / "model")
    for split, (n, seed) in {"train": (300, 0), "validation": (90, 2), "test": (60, 1)}.items():
        write_split(local / "data" / f"{split}.csv", n, seed=seed)
    return f"file://{local / 'model'}", f"file://{local / 'data'}"


def _timeless(budget: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in budget.items() if k not in ("search_seconds", "final_recovery_seconds",
                                                          "cost_vs_single_run")}
    out["candidates"] = [{k: v for k, v in c.items() if k != "seconds"} for c in budget["candidates"]]
    return out


def _one(root: Path, workers: int, redis_url: str, model: str, data: str) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from app.api.main import create_app
    from app.core.db import make_session_factory
    from app.core.models import Job
    from tests.support.helpers import migrated_engine, new_key, service_settings
    from tests.support.processes import child_env, start, stop, wait_for

    run_root = root / f"w{workers}-{uuid.uuid4().hex[:6]}"
    run_root.mkdir()
    settings = service_settings(run_root, broker_url=redis_url, queue=f"cahp-bench-{uuid.uuid4().hex[:8]}",
                                allowed_local_roots=(root / "local",), lease_s=30.0, heartbeat_interval_s=2.0)
    engine = migrated_engine(settings)
    key = new_key(engine, "bench")
    env = child_env(**{k[len("CAHP_"):].lower(): v for k, v in settings.child_environment().items()})
    processes = [start(["worker", "--pool", "prefork", "--name", f"w{i}@%h", "--log-level", "warning"], env,
                       run_root / f"w{i}.log") for i in range(workers)]
    try:
        time.sleep(8)  # the workers connect and wait for messages
        with TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"}) as client:
            body = {"model": {"uri": model}, "dataset": {"uri": data}, "params": PARAMS}
            job_id = client.post("/v1/jobs", json=body).json()["id"]
            sessions = make_session_factory(engine)

            def ended() -> bool:
                with sessions() as session:
                    job = session.get(Job, job_id)
                    return job is not None and job.status in ("succeeded", "failed", "cancelled")

            wait_for(ended, timeout=3600, what="the budget job")
            with sessions() as session:
                job = session.get(Job, job_id)
                assert job is not None and job.status == "succeeded", (job.status, job.error_message) if job else None
                wall = (job.finished_at - job.started_at).total_seconds()
            report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
    finally:
        for process in processes:
            stop(process, grace_s=20)
        engine.dispose()
    budget = report["budget"]
    return {"workers": workers, "job_wall_s": wall, "search_s": budget["search_seconds"],
            "final_recovery_s": budget["final_recovery_seconds"], "heads_kept": report["summary"]["heads_kept"],
            "candidates": len(budget["candidates"]), "rounds": len({c["round"] for c in budget["candidates"]}),
            "budget": _timeless(budget)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench budget-pool", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=3, help="runs per pool size, alternated (default 3)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="the broker")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cahp-bench-pool-") as tmp:
        root = Path(tmp)
        (root / "local").mkdir()
        model, data = _inputs(root / "local")
        for repeat in range(args.repeats):
            for workers in (1, 2) if repeat % 2 == 0 else (2, 1):
                run = _one(root, workers, args.redis_url, model, data)
                print(f"{workers} worker(s): job {run['job_wall_s']:.1f} s, search {run['search_s']:.1f} s, "
                      f"{run['heads_kept']} heads", flush=True)
                runs.append(run)
    first = runs[0]["budget"]
    figures = {}
    for workers in (1, 2):
        mine = [r for r in runs if r["workers"] == workers]
        figures[str(workers)] = {
            "job_wall_s_median": statistics.median(r["job_wall_s"] for r in mine),
            "job_wall_s": [round(r["job_wall_s"], 2) for r in mine],
            "search_s_median": statistics.median(r["search_s"] for r in mine),
            "search_s": [round(r["search_s"], 2) for r in mine],
        }
    result = {
        "command": "python -m bench budget-pool " + " ".join(argv or []), "date": datetime.now(UTC).isoformat(),
        "machine": machine(), "params": PARAMS, "repeats": args.repeats, "by_workers": figures,
        "search_speedup_2_over_1": figures["1"]["search_s_median"] / figures["2"]["search_s_median"],
        "job_speedup_2_over_1": figures["1"]["job_wall_s_median"] / figures["2"]["job_wall_s_median"],
        "same_answer_every_run": all(r["budget"] == first for r in runs),
        "heads_kept": sorted({r["heads_kept"] for r in runs}), "candidates": runs[0]["candidates"],
        "rounds": runs[0]["rounds"], "ladder": first["ladder"],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "params"}, indent=2))
