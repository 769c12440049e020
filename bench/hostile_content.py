"""What hostile uploads cost the API: its resident memory, ``/healthz`` while they are inspected, the database.

Three of the attacks tests/reliability/test_hostile_content.py replays (a 104 MB safetensors header
in a 100 KB archive, an 857-byte dictionary-encoded Parquet file of 2 GB of text, a 300 MB CSV in a
1 MB archive) are uploaded to a real ``cahp serve`` (SQLite, a local store) while ``/healthz`` is
probed in a loop. For each: the answer, how far the API process's peak resident memory rose above
where it was (``VmHWM`` against the ``VmRSS`` before, from /proc; the inspection children are other
processes), the ``/healthz`` probes and the slowest, and how much the database (with its WAL) grew.
Short (about two minutes); nothing to resume.

    OMP_NUM_THREADS=1 python -m bench hostile-content
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import machine

RESULTS = Path(__file__).parent / "results" / "hostile_content.json"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench hostile-content", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--output", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args(argv)

    import httpx
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.reliability import test_hostile_content as attacks
    from tests.support.helpers import migrated_engine, new_key, service_settings, write_tiny_dataset
    from tests.support.processes import stop
    from tests.support.stack import start_server

    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cahp-bench-hostile-") as tmp:
        root = Path(tmp)
        settings = service_settings(root, max_upload_bytes=16 * 1024**2, max_dataset_rows=100_000)
        engine = migrated_engine(settings)
        server = start_server(settings, root / "serve.log")
        served = attacks.Served(url=server.url, pid=server.process.pid, settings=settings, engine=engine,
                                key=new_key(engine, "bench"))

        def replay(name: str, request: Callable[[], httpx.Response], sent: int) -> None:
            rss_before, peak_before = attacks._memory(served.pid)
            db_before = served.db_bytes()
            answers: list[httpx.Response] = []
            thread = threading.Thread(target=lambda: answers.append(request()))
            thread.start()
            probes: list[tuple[int, float]] = []
            with httpx.Client(base_url=served.url, timeout=60) as http:
                while thread.is_alive():
                    start = time.perf_counter()
                    status = http.get("/healthz").status_code
                    probes.append((status, time.perf_counter() - start))
                    thread.join(0.05)
            thread.join()
            _, peak_after = attacks._memory(served.pid)
            figures[name] = {
                "bytes_sent": sent, "status": answers[0].status_code,
                "api_peak_rss_rise_mb": round(max(0, peak_after - rss_before) / 2**20 if peak_after > peak_before
                                              else 0.0, 1),
                "api_rss_before_mb": round(rss_before / 2**20, 1),
                "healthz_probes": len(probes), "healthz_all_200": all(s == 200 for s, _ in probes),
                "healthz_slowest_ms": round(max((t for _, t in probes), default=0.0) * 1000, 1),
                "db_growth_kb": round((served.db_bytes() - db_before) / 1024, 1),
            }
            print(name, json.dumps(figures[name]), flush=True)

        try:
            header = b'{"w":{"dtype":"F16","shape":[' + b"0," * 51_999_999 + b'0],"data_offsets":[0,0]}}'
            files = attacks._model_files(root / "model")
            files["model/model.safetensors"] = struct.pack("<Q", len(header)) + header
            archive = attacks._tar_gz(files)
            replay("safetensors_header_104mb", lambda: served.upload("model.tar.gz", archive), len(archive))

            table = pa.table({
                "text": pa.DictionaryArray.from_arrays(pa.array([0] * 20_000, pa.int32()), pa.array(["x" * 100_000])),
                "label": pa.array([i % 3 for i in range(20_000)], pa.int64())})
            sink = io.BytesIO()
            pq.write_table(table, sink, compression="zstd")
            bomb = sink.getvalue()
            replay("parquet_dictionary_2gb", lambda: served.upload("train.parquet", bomb), len(bomb))

            row = b"a fine sentence about nothing in particular that repeats itself,0\n"
            rows = 300_000_000 // len(row) // 10_000 * 10_000

            def chunks() -> Any:
                yield b"text,label\n"
                for _ in range(rows // 10_000):
                    yield row * 10_000

            dataset = write_tiny_dataset(root / "data")
            members = {"data/test.csv": (dataset / "test.csv").read_bytes(), "data/train.csv": chunks}
            csv_archive = attacks._tar_gz(members, sizes={"data/train.csv": 11 + rows * len(row)})
            replay("csv_300mb", lambda: served.upload("data.tar.gz", csv_archive), len(csv_archive))
        finally:
            stop(server.process)
            engine.dispose()
    result = {"command": "python -m bench hostile-content " + " ".join(argv or []),
              "date": datetime.now(UTC).isoformat(), "machine": machine(), "attacks": figures}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
