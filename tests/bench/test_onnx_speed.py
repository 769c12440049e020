"""The ONNX speed benchmark's code path on tiny random models (the benchmark itself never runs in tests)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from bench.onnx_speed import CANDIDATES, half_heads, measure
from cahp_engine.data import LabelledTexts, encode
from cahp_engine.models import heads_per_layer, prune_heads
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer


def test_measure_exports_quantizes_scores_and_times_every_candidate(tmp_path: Path) -> None:
    dense = make_classifier("bert", layers=2, heads=4)
    pruned = copy.deepcopy(dense)
    prune_heads(pruned, half_heads(dense, seed=0))
    assert heads_per_layer(pruned) == [2, 2]
    texts, labels = make_texts(12, seed=1)
    rows = encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)

    figures = measure(dense, pruned, make_tokenizer(), tmp_path, rows=rows, batch_sizes=(1, 2), seq_len=8,
                      counts={1: (0, 1), 2: (0, 1)}, seed=0, say=lambda _line: None)

    assert set(figures["accuracy"]) == set(CANDIDATES) - {"onnx_dense"}
    assert all(e["parity"]["max_abs_diff"] <= 1e-4 for e in figures["export"].values())
    assert [row["batch_size"] for row in figures["speed"]] == [1, 2]
    assert set(figures["speed"][0]["latency_ms"]) == set(CANDIDATES)
    assert figures["speed"][0]["speedup_vs_torch_dense"]["torch_dense"] == 1.0
    json.dumps(figures)
