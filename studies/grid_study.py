"""The command-line side shared by the studies run on the quality study's cache.

``python -m studies quality-causes`` and ``python -m studies distill-study`` each recover the grid's heads
with one thing changed (the heads, or the recovery loss) beside the grid's own cells: the same options
(seeds, degrees, variants, cache, ``--report-only``), the paper's 3-epoch protocol, and a JSON plus
markdown report under studies/results/. Their cells go to the grid's cache (default
studies/results/cache/quality_sst5/, not tracked by git): they resume, and compare, only where the
grid's own cells are.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from studies import common, quality
from studies.common import minilm_path

#: ``run(protocol, variants, *, base, cache, data_dir, compute, say) -> payload``
StudyRun = Callable[..., dict[str, Any]]


def main(argv: list[str] | None, *, name: str, seeds: str, degrees: str, variants: tuple[str, ...],
         check: Callable[[tuple[str, ...]], None], run: StudyRun, markdown: Callable[[dict[str, Any]], str],
         protocol_text: str) -> None:
    """Parse the study's options, run it (or only report), and save ``<name>.json`` and ``<name>.md``.

    ``name`` is the command's name (``quality-causes``); ``check`` raises SystemExit for variants the
    study does not know.
    """
    p = argparse.ArgumentParser(prog=f"python -m studies {name}")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", default=seeds)
    p.add_argument("--degrees", default=degrees)
    p.add_argument("--variants", default=",".join(variants))
    p.add_argument("--data", type=Path, default=common.SST5)
    p.add_argument("--cache-dir", type=Path, default=common.RESULTS / "cache" / "quality_sst5")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    common.pin_threads(args.threads)
    chosen = tuple(v for v in args.variants.split(",") if v)
    check(chosen)
    protocol = replace(quality.Protocol(), name="quality_sst5_paper", recovery_epochs=3.0,
                       seeds=tuple(int(v) for v in args.seeds.split(",") if v),
                       degrees=tuple(int(v) for v in args.degrees.split(",") if v))

    def say(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    start = time.perf_counter()
    payload = run(protocol, chosen, base=minilm_path(), cache=args.cache_dir, data_dir=args.data,
                  compute=not args.report_only, say=say)
    payload["wall_s_this_invocation"] = time.perf_counter() - start
    payload["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    stem = name.replace("-", "_")
    path = common.save(f"{stem}.json", payload, command=f"python -m studies {name} {' '.join(argv or [])}".strip(),
                       protocol=protocol_text)
    text = markdown(json.loads(path.read_text()))
    (common.RESULTS / f"{stem}.md").write_text(text)
    print(text)
