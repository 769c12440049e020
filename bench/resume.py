"""What a lost worker costs a job: an attempt that resumes from its saved resume state against a fresh run.

The real all-MiniLM-L6-v2 with a new classification head (so dense fine-tuning runs and is saved) on
``--rows`` rows drawn from SST-5's train split (``--test-rows`` from its test split, seeded), 3 recovery
epochs, distillation (the engine's defaults otherwise), through :func:`cahp_engine.run.run_pruning`
with a :class:`~cahp_engine.run.DirectoryResumeStore` store, as the job service's worker runs it:

1. ``fresh``: the whole run, timed;
2. ``stopped``: the same run stopped as soon as recovery has saved its first epoch (what a ``kill -9``
   leaves after an epoch; a worker told to stop saves the step it stopped at as well);
3. ``resumed``: a new run on the same store: it takes the dense model, the selection and the pruned
   model's scores from the resume store and goes on from the saved recovery step.

Reported: each run's wall time and stage timings, ``resumed / fresh``, whether the resumed model equals
the fresh one (largest absolute weight difference), and the resume state's size. One thread; one repeat
(the resumed run's saving is what the stage timings show; run it again for another sample).

    OMP_NUM_THREADS=1 python -m bench resume --rows 800 --test-rows 400
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import SST5, machine, minilm_path, pin_threads, save


def _subset(source: Path, target: Path, rows: int, test_rows: int) -> Path:
    """A seeded random sample of each split (the files are ordered, so their heads are skewed)."""
    target.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", rows), ("test", test_rows)):
        with open(source / f"{split}.csv", newline="") as handle:
            header, *body = list(csv.reader(handle))
        kept = random.Random(0).sample(body, min(n, len(body)))
        with open(target / f"{split}.csv", "w", newline="") as handle:
            csv.writer(handle).writerows([header, *kept])
    return target


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench resume", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--data", type=Path, default=SST5, help="SST-5 directory (train.csv, test.csv)")
    parser.add_argument("--rows", type=int, default=800, help="training rows (default 800)")
    parser.add_argument("--test-rows", type=int, default=400, help="test rows (default 400)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    pin_threads(args.threads)

    from safetensors.torch import load_file

    from cahp_engine.config import PruningConfig
    from cahp_engine.errors import JobCancelledError
    from cahp_engine.run import DirectoryResumeStore, RunHooks, RunRequest, run_pruning

    config = PruningConfig(epochs=3, dense_finetune="always", dense_epochs=3, seed=0, export="none",
                           latency_repeats=3, latency_warmup=1)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cahp-bench-resume-") as tmp:
        root = Path(tmp)
        data = str(_subset(args.data, root / "data", args.rows, args.test_rows))
        model = minilm_path()
        started = time.perf_counter()
        fresh = run_pruning(RunRequest(model_ref=model, dataset_ref=data, output_dir=root / "fresh", config=config))
        figures["fresh_s"] = time.perf_counter() - started
        figures["fresh_timings_s"] = fresh.timings_s

        store = DirectoryResumeStore(root / "checkpoints")

        def after_first_epoch() -> bool:
            saved = store.restore().get("recovery_training")
            return saved is not None and json.loads((saved / "stage.json").read_text())["step"] >= 1

        started = time.perf_counter()
        try:
            run_pruning(RunRequest(model_ref=model, dataset_ref=data, output_dir=root / "stopped", config=config),
                        RunHooks(resume_store=store, should_cancel=after_first_epoch))
        except JobCancelledError:
            pass
        figures["stopped_after_s"] = time.perf_counter() - started
        saved = store.restore()
        figures["checkpoint_stages"] = sorted(saved)
        figures["checkpoint_bytes"] = {stage: _size(path) for stage, path in saved.items()}
        figures["saved_recovery_step"] = json.loads((saved["recovery_training"] / "stage.json").read_text())["step"]

        lines: list[str] = []
        started = time.perf_counter()
        resumed = run_pruning(RunRequest(model_ref=model, dataset_ref=data, output_dir=root / "resumed",
                                         config=config),
                              RunHooks(resume_store=store, log=lines.append))
        figures["resumed_s"] = time.perf_counter() - started
        figures["resumed_timings_s"] = resumed.timings_s
        figures["resumed_over_fresh"] = figures["resumed_s"] / figures["fresh_s"]
        figures["resumed_log"] = [line for line in lines if "earlier attempt" in line]
        ours = load_file(str(root / "resumed" / "model" / "model.safetensors"))
        theirs = load_file(str(root / "fresh" / "model" / "model.safetensors"))
        figures["max_abs_weight_diff"] = max(float((ours[k] - theirs[k]).abs().max()) for k in ours)
        figures["same_heads"] = resumed.selection.kept == fresh.selection.kept
        figures["accuracy"] = {"fresh": fresh.summary.pruned_accuracy, "resumed": resumed.summary.pruned_accuracy}
    payload = {"rows": args.rows, "test_rows": args.test_rows, "threads": args.threads, "machine": machine(),
               "config": config.to_dict(), "figures": figures}
    path = save("resume.json", payload, command="python -m bench resume " + " ".join(argv or []),
                protocol=__doc__.split("\n\n")[1])
    print(json.dumps(figures, indent=2))
    print(f"saved {path}")
