"""The golden run: ``run_pruning`` (what ``cahp prune`` calls) on a tiny random model and dataset.

``python -m tests.engine.golden.make_golden`` rewrites the committed files in this directory from the
code as it is now; ``python -m tests.engine.golden.make_golden --out DIR`` writes them to ``DIR``
instead (what :mod:`tests.engine.run.test_golden_report` does, in a subprocess so that torch runs on one
thread and no test's global state reaches the run).

The files were committed from the code before the run report became typed and the selection a
registry of strategies, and regenerated when the selection defaults changed on purpose; the
test compares a fresh run with them.

Files written: ``report.json``, ``head_map.json`` and ``mss_curve.json`` of the run, and
``selections.json``: ``select_heads`` for each strategy, with and without a fixed head count.

The run is made under :data:`PINNED_ENV` (the script re-executes itself with it): torch's, MKL's,
oneDNN's, OpenBLAS's and numpy's CPU kernels each pick their code path from the processor's
instruction set, so the salience of two machines differs in the 8th digit, and t-SNE turns such a
difference into another embedding, other clusters and another knee on a model this small (seen
between an AVX-512 machine and an AMD EPYC without it). Pinned to the portable paths, the same
libraries give the same numbers on any x86-64 machine with AVX2.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: CPU code paths pinned to ones every x86-64 machine with AVX2 has, one thread each.
PINNED_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "OPENBLAS_CORETYPE": "Haswell",
    "NPY_DISABLE_CPU_FEATURES": "AVX512F,AVX512_SKX,AVX512_CLX,AVX512_CNL,AVX512_ICL,AVX512_SPR",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
}
FILES = ("report.json", "head_map.json", "mss_curve.json", "selections.json")
#: Settings of the golden run: one recovery epoch, a short dense fine-tuning so its record is filled,
#: degree 3 so the chosen knee is not the default degree's, two timed latency passes; the recovery the
#: files were made with, named though it is the default (fine-tuning from the pruned weights).
CONFIG: dict[str, Any] = {
    "poly_degree": 3,
    "recovery": "finetune",
    "export": "none",
    "epochs": 1,
    "dense_finetune": "always",
    "dense_epochs": 4,
    "dense_lr": 5e-3,
    "lr": 1e-3,
    "batch_size": 16,
    "max_length": 32,
    "seed": 7,
    "device": "cpu",
    "latency_warmup": 1,
    "latency_repeats": 2,
}
#: ``select_heads`` settings recorded in ``selections.json`` (every strategy, knee and fixed count).
SELECTIONS: tuple[dict[str, Any], ...] = (
    {"strategy": "cahp"},
    {"strategy": "salience"},
    {"strategy": "random"},
    {"strategy": "cahp", "heads_to_keep": 5},
    {"strategy": "salience", "heads_to_keep": 4},
    {"strategy": "random", "heads_to_keep": 7},
    {"strategy": "cahp", "heads_to_keep": 1},
)


def _write_split(path: Path, n: int, *, seed: int) -> None:
    from tests.support.tiny_models import make_texts

    texts, labels = make_texts(n, num_classes=3, seed=seed)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(zip(texts, labels.tolist(), strict=True))


def write_inputs(root: Path) -> tuple[Path, Path]:
    """A random 3x4-head BERT with its tokenizer, and a three-class train/test CSV dataset."""
    from tests.support.tiny_models import make_classifier, make_tokenizer

    model_dir, data_dir = root / "model", root / "data"
    make_classifier("bert", num_labels=3, layers=3, heads=4, seed=0).save_pretrained(model_dir)
    make_tokenizer().save_pretrained(model_dir)
    data_dir.mkdir()
    _write_split(data_dir / "train.csv", 60, seed=1)
    _write_split(data_dir / "test.csv", 30, seed=2)
    return model_dir, data_dir


def _selections() -> list[dict[str, Any]]:
    from cahp_engine.config import PruningConfig
    from cahp_engine.data import LabelledTexts, encode
    from cahp_engine.selection import select_heads
    from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

    texts, labels = make_texts(90, num_classes=3, seed=3)
    data = encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)
    model = make_classifier("bert", layers=3, heads=4, seed=1)
    out = []
    for changes in SELECTIONS:
        result = select_heads(model, data, PruningConfig(resolution=6, seed=5, **changes))
        sel = result.selection
        out.append({
            "settings": changes,
            "strategy": sel.strategy,
            "k_star": result.k_star,
            "knee": None if result.knee is None else {"k": result.knee.k, "found": result.knee.found},
            "knees": {str(d): k.k for d, k in sorted(result.analysis.knees.items())},
            "kept": {str(layer): heads for layer, heads in sel.kept.items()},
            "representatives": [list(h) for h in sel.representatives],
            "layer_safety_added": [list(h) for h in sel.layer_safety_added],
            "cluster": None if result.clustering is None else result.clustering.labels.tolist(),
            "salience": result.analysis.salience.tolist(),
            "salience_raw": result.analysis.salience_raw.tolist(),
            "mss": result.analysis.curve.mss.tolist(),
        })
    return out


def make(out: Path) -> None:
    """Run the golden run and the selections; write :data:`FILES` to ``out``."""
    import torch

    from cahp_engine.config import PruningConfig
    from cahp_engine.run import RunRequest, run_pruning

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, data_dir = write_inputs(Path(tmp))
        run_dir = Path(tmp) / "run"
        run_pruning(RunRequest(model_ref=str(model_dir), dataset_ref=str(data_dir), output_dir=run_dir,
                               config=PruningConfig(**CONFIG), model_shown_as="tiny-random-bert",
                               dataset_shown_as="tiny-three-class"))
        for name in ("report.json", "head_map.json", "mss_curve.json"):
            (out / name).write_text((run_dir / name).read_text())
    (out / "selections.json").write_text(json.dumps(_selections(), indent=2) + "\n")


def pinned() -> bool:
    """True when this process runs under :data:`PINNED_ENV` (the variables are read at start-up)."""
    return all(os.environ.get(name) == value for name, value in PINNED_ENV.items())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.engine.golden.make_golden")
    parser.add_argument("--out", type=Path, default=HERE, help=f"default: {HERE} (the committed files)")
    args = parser.parse_args(argv)
    if not pinned():
        argv = sys.argv[1:] if argv is None else argv
        os.execve(sys.executable, [sys.executable, "-m", "tests.engine.golden.make_golden", *argv],
                  {**os.environ, **PINNED_ENV})
    make(args.out)


if __name__ == "__main__":
    main()
