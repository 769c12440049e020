"""Does an int8 answer depend on the batch? Dynamic, dynamic a row at a time, and static (calibrated) int8.

The classifier head is fitted on the frozen encoder's pooled output (logistic regression on the first
``--train`` training rows), so the model reads the text; the encoder is as published. The fp32 ONNX
export is quantized twice with :func:`cahp_engine.export.quantize_int8`: dynamically (activation scales
from each batch at run time) and statically (scales calibrated on 256 training rows). Each graph scores
the first ``--test`` test rows at batch 1, 32 and all of them at once (each row padded to the batch's
longest); the share of rows whose class differs between batch 1 and the whole batch is the dependence
on the batch. ``dynamic_rowwise`` is the dynamic graph run a row at a time on the row's own tokens
(:func:`cahp_engine.export.run_logits_rowwise`). Latency: :func:`cahp_engine.export.compare_runtimes`
on random ids, batch 1 and 32; and the seconds to score the real test rows in padded batches of 32 and
of all of them against a row at a time (median of 3, interleaved).

Run: ``python -m bench int8-batch [--train 1000] [--test 200] [--repeats 10] [--data DIR]``
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from onnxruntime.quantization import CalibrationMethod, QuantType
from sklearn.linear_model import LogisticRegression

from bench.common import SST5, minilm_path, pin_threads, save
from cahp_engine.data import DatasetOptions, collate, encode, load_splits
from cahp_engine.export import compare_runtimes, export_onnx, quantize_int8
from cahp_engine.export._calibration import quantize_static_qdq
from cahp_engine.export._runtime import onnx_session, run_logits, run_logits_rowwise
from cahp_engine.models import load_classifier


def _classes(session: Any, rows: Any, batch: int, *, rowwise: bool = False) -> np.ndarray:
    run = run_logits_rowwise if rowwise else run_logits
    out = [run(session, collate(rows, np.arange(i, min(i + batch, len(rows))))).argmax(-1)
           for i in range(0, len(rows), batch)]
    return np.concatenate(out)


def _scoring_s(session: Any, rows: Any, *, repeats: int) -> dict[str, float]:
    """Seconds to score every row of ``rows`` (real sentences): batches of 32 and of all rows, each padded
    to its longest, and a row at a time without padding; interleaved, the median of ``repeats``."""
    ways = {"batch_32": lambda: _classes(session, rows, 32), "batch_all": lambda: _classes(session, rows, len(rows)),
            "rowwise": lambda: _classes(session, rows, len(rows), rowwise=True)}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, way in ways.items():
            started = time.perf_counter()
            way()
            times[name].append(time.perf_counter() - started)
    return {name: float(np.median(t)) for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench int8-batch")
    parser.add_argument("--train", type=int, default=1000)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--data", default=str(SST5), help="the dataset directory (default: the shared SST-5)")
    args = parser.parse_args(argv)
    pin_threads(1)
    splits = load_splits(args.data, DatasetOptions())
    loaded = load_classifier(minilm_path(), num_labels=len(splits.label_names), device="cpu", seed=0)
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    train = encode(tokenizer, splits.train.subset(np.arange(min(args.train, len(splits.train)))), max_length=64)
    test = encode(tokenizer, splits.eval.subset(np.arange(min(args.test, len(splits.eval)))), max_length=64)
    pooled, labels = [], []
    with torch.no_grad():
        for i in range(0, len(train), 32):
            idx = np.arange(i, min(i + 32, len(train)))
            batch = collate(train, idx)
            out = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            pooled.append(out.pooler_output.numpy())
            labels.append(batch["labels"].numpy())
    fit = LogisticRegression(max_iter=2000, C=10.0).fit(np.concatenate(pooled), np.concatenate(labels))
    model.classifier.weight.data = torch.tensor(fit.coef_, dtype=torch.float32)
    model.classifier.bias.data = torch.tensor(fit.intercept_, dtype=torch.float32)
    calibration = encode(tokenizer, splits.train.subset(np.arange(256)), max_length=64)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        export_onnx(model, tokenizer, work / "fp32", check=False)
        quantize_int8(work / "fp32", work / "dynamic", per_channel=True)
        variants = {"static_s8_minmax": (QuantType.QInt8, CalibrationMethod.MinMax),
                    "static_u8_minmax": (QuantType.QUInt8, CalibrationMethod.MinMax),
                    "static_u8_percentile": (QuantType.QUInt8, CalibrationMethod.Percentile)}
        for name, (kind, method) in variants.items():
            (work / name).mkdir()
            for item in (work / "fp32").iterdir():
                if item.name != "model.onnx":
                    shutil.copy2(item, work / name / item.name)
            quantize_static_qdq(work / "fp32" / "model.onnx", work / name / "model.onnx", calibration,
                                per_channel=True, external=False, activation_type=kind, method=method)
        shutil.copytree(work / "dynamic", work / "dynamic_rowwise")  # the same graph, run a row at a time
        names = ["fp32", "dynamic", "dynamic_rowwise", *variants]
        truth = np.asarray(test.labels)[: len(test)]
        for name in names:
            session = onnx_session(work / name, threads=1)
            rowwise = name == "dynamic_rowwise"
            by_batch = {b: _classes(session, test, b, rowwise=rowwise) for b in (1, 32, len(test))}
            results[name] = {
                "accuracy": {str(b): float((c == truth).mean()) for b, c in by_batch.items()},
                "changed_1_vs_all": float((by_batch[1] != by_batch[len(test)]).mean()),
            }
            print(name, results[name], flush=True)
        fp32_alone = _classes(onnx_session(work / "fp32", threads=1), test, 1)
        for name in names[1:]:
            results[name]["agreement_with_fp32_batch1"] = float((_classes(
                onnx_session(work / name, threads=1), test, 1, rowwise=name == "dynamic_rowwise") == fp32_alone).mean())
        # Scoring the real test rows: padded batches against a row at a time (dynamic int8 and fp32).
        results["scoring_s_real_rows"] = {name: _scoring_s(onnx_session(work / name, threads=1), test, repeats=3)
                                          for name in ("fp32", "dynamic")}
        print(results["scoring_s_real_rows"], flush=True)
        names.remove("dynamic_rowwise")  # the same graph as dynamic: its speed is the rowwise scoring above
        speed = compare_runtimes({n: work / n for n in names}, batch_sizes=(1, 32),
                                 seq_len=64, warmup=2, repeats=args.repeats, threads=1)
        results["latency_ms_p50"] = {str(r.batch_size): {k: v.p50_ms for k, v in r.latency.items()}
                                     for r in speed.results}
        print(results["latency_ms_p50"], flush=True)
    save("int8_batch.json", results, command="python -m bench int8-batch " + " ".join(argv or []),
         protocol="all-MiniLM-L6-v2, head fitted on frozen pooled output; 1 thread; see bench/int8_batch.py")


if __name__ == "__main__":
    main()
