"""Selection on an MNLI-size dataset: a synthetic 400,000-row sentence-pair CSV with MNLI's shape.

``generate`` writes ``train.csv`` (``premise``, ``hypothesis``, ``label``) and a small ``test.csv``:
premises of about 22 words and hypotheses of about 11 (MNLI's means), the words drawn from
all-MiniLM-L6-v2's WordPiece vocabulary (whole words only), and three classes built the way MNLI's
differ: an *entailment* hypothesis is mostly premise words in order, a *contradiction* takes half of
its words from the premise and adds a negation, a *neutral* one is mostly new words. The selection
then runs on all-MiniLM-L6-v2 (classifier head untrained; the cost does not depend on it) with the
engine's defaults, through the same reader, lazy tokenisation and stopping rules as ``cahp prune``,
once on every row and once on a 10 % subset, each in a fresh process (time and peak memory). The
generated data and the finished runs are kept in ``--cache`` (default studies/results/cache/mnli_synth/,
not tracked by git), so a rerun on the same checkout resumes; the ratio to SST-5 reads the selection
benchmark's bench/results/selection_sampling.json.

Run: ``python -m studies mnli-synth [--rows 400000] [--repeats 2]``
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS as BENCH_RESULTS
from studies.common import RESULTS, PeakRss, minilm_path, pin_threads, rss_bytes, save

NEGATIONS = ("not", "never", "no", "nobody", "nothing", "none")
LABELS = ("entailment", "neutral", "contradiction")


def vocabulary() -> list[str]:
    words = (Path(minilm_path()) / "vocab.txt").read_text().split("\n")
    return [w for w in words if w.isalpha() and w.isascii() and len(w) >= 3]


def _pair(rng: np.random.Generator, vocab: list[str], label: int) -> tuple[str, str]:
    premise = [vocab[i] for i in rng.integers(0, len(vocab), size=int(np.clip(rng.normal(22, 6), 6, 60)))]
    size = int(np.clip(rng.normal(11, 3), 3, 30))
    share = (0.8, 0.2, 0.5)[label]
    hypothesis: list[str] = []
    start = int(rng.integers(0, max(1, len(premise) - size)))
    for i in range(size):
        if rng.random() < share and start + i < len(premise):
            hypothesis.append(premise[start + i])
        else:
            hypothesis.append(vocab[int(rng.integers(0, len(vocab)))])
    if label == 2:
        hypothesis.insert(int(rng.integers(0, len(hypothesis) + 1)), NEGATIONS[int(rng.integers(0, len(NEGATIONS)))])
    return " ".join(premise), " ".join(hypothesis)


def generate(directory: Path, rows: int, *, seed: int = 0, test_rows: int = 2000) -> Path:
    """Write ``train.csv`` (``rows`` rows) and ``test.csv`` into ``directory`` unless they exist."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    rng = np.random.default_rng(seed)
    for name, n in (("test", test_rows), ("train", rows)):
        path = directory / f"{name}.csv"
        if path.is_file():
            continue
        tmp = path.with_suffix(".tmp")
        with tmp.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(("premise", "hypothesis", "label"))
            for label in rng.integers(0, 3, size=n):
                writer.writerow((*_pair(rng, vocab, int(label)), LABELS[int(label)]))
        os.replace(tmp, path)
    return directory


def child(data: Path) -> dict[str, Any]:
    """Read, select with the defaults, and measure; run in a fresh process."""
    pin_threads(1)
    from cahp_engine.config import PruningConfig
    from cahp_engine.data import DatasetOptions, LazyEncodedDataset, load_splits
    from cahp_engine.models import load_classifier
    from cahp_engine.selection import select_heads

    before = rss_bytes()
    start = time.perf_counter()
    options = DatasetOptions(text_column="premise", text_pair_column="hypothesis", eval_split="test")
    splits = load_splits(data, options)
    loaded = load_classifier(minilm_path(), num_labels=3)
    rows = LazyEncodedDataset(loaded.tokenizer, splits.train, max_length=512)
    load_s = time.perf_counter() - start
    after_load = rss_bytes()
    with PeakRss() as peak:
        start = time.perf_counter()
        result = select_heads(loaded.model.eval(), rows, PruningConfig())
        selection_s = time.perf_counter() - start
    return {
        "train_rows": len(rows), "load_s": load_s, "selection_s": selection_s, "timings_s": result.timings,
        "rss_mib_after_load": (after_load - before) / 2**20, "selection_peak_extra_mib": peak.extra_mib,
        "signature_sampling": (result.analysis.signature_sampling.to_dict()
                               if result.analysis.signature_sampling else None),
        "calibration_sampling": (result.analysis.calibration_sampling.to_dict()
                                 if result.analysis.calibration_sampling else None),
        "resolution": result.analysis.resolution, "k_star": result.k_star, "heads_kept": result.selection.num_kept,
        "stability_mean_jaccard": result.stability.mean_jaccard if result.stability else None,
        "load_average_1min": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m studies mnli-synth")
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--cache", type=Path, default=RESULTS / "cache" / "mnli_synth")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return
    sizes = {"full": args.rows, "tenth": args.rows // 10}
    dirs = {}
    for name, rows in sizes.items():
        start = time.perf_counter()
        dirs[name] = generate(args.cache / f"rows{rows}", rows)
        print(f"{name}: {rows} rows ready in {time.perf_counter() - start:.0f} s", flush=True)
    results_file = args.cache / "runs.json"
    runs: dict[str, list[dict[str, Any]]] = json.loads(results_file.read_text()) if results_file.is_file() else {}
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    for _ in range(args.repeats):
        for name in sizes:  # interleaved, so load changes hit both sizes alike
            if len(runs.get(name, [])) >= args.repeats:
                continue
            proc = subprocess.run([sys.executable, "-m", "studies", "mnli-synth", "--child", str(dirs[name])],
                                  env=env, capture_output=True, text=True, timeout=3600)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-3000:])
            run = json.loads(proc.stdout.strip().splitlines()[-1])
            runs.setdefault(name, []).append(run)
            results_file.write_text(json.dumps(runs, indent=1))
            print(f"{name}: selection {run['selection_s']:.1f} s, read {run['load_s']:.1f} s, "
                  f"{run['signature_sampling']['samples']} signature / {run['calibration_sampling']['samples']} "
                  f"calibration samples, peak +{run['selection_peak_extra_mib']:.0f} MiB", flush=True)
    median = {name: {key: statistics.median(r[key] for r in rs)
                     for key in ("selection_s", "load_s", "selection_peak_extra_mib", "rss_mib_after_load")}
              for name, rs in runs.items()}
    reference = BENCH_RESULTS / "selection_sampling.json"
    sst5 = json.loads(reference.read_text())["auto_selection_s_median"] if reference.is_file() else None
    payload = {
        "dataset": f"synthetic MNLI-shaped pairs, {args.rows} train rows (and a {args.rows // 10}-row subset)",
        "model": "all-MiniLM-L6-v2, classifier head untrained, 3 labels",
        "median": median,
        "sst5_auto_selection_s_median": sst5,
        "ratio_to_sst5": None if sst5 is None else median["full"]["selection_s"] / sst5,
        "peak_memory_full_over_tenth": median["full"]["selection_peak_extra_mib"]
        / max(median["tenth"]["selection_peak_extra_mib"], 1e-9),
        "runs": runs,
    }
    path = save("mnli_synth_selection.json", payload, command="python -m studies mnli-synth " + " ".join(argv or []),
                protocol="1 torch thread; engine defaults (stopping rules, B from the 70th percentile of a 10,000-row "
                "sample); one fresh process per run, sizes interleaved; selection_s = select_heads on the lazily "
                "tokenised split; load_s = reading the CSV and the model; medians")
    print(json.dumps({k: payload[k] for k in ("median", "sst5_auto_selection_s_median", "ratio_to_sst5",
                                              "peak_memory_full_over_tenth")}, indent=1))
    print(f"saved {path}")
