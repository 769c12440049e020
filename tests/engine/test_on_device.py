"""The engine on an accelerator: the paths that differ there (fused attention kernels, mixed precision,
device-side accumulators) against the CPU.

Runs on the device named by ``CAHP_TEST_DEVICE`` (``bench/gpu_check.sh`` sets it: ``cuda``, or ``cpu``
with ``--cpu`` to check the script itself); without it, on CUDA when there is one, else skipped (the
CPU suite covers the CPU).
"""

from __future__ import annotations

import copy
import math
import os

import numpy as np
import pytest
import torch

from cahp_engine.config import PruningConfig
from cahp_engine.data import LabelledTexts, encode, iterate_batches, length_grouped_batches
from cahp_engine.models import gate_heads, prune_heads
from cahp_engine.recovery import TrainingRecipe
from cahp_engine.recovery import _training as training
from cahp_engine.selection import extract_signatures, gradient_salience, select_heads
from tests.support.surgery import KEPT
from tests.support.surgery import gates as _gates
from tests.support.surgery import padded_batch as _batch
from tests.support.surgery import spread_model as _model
from tests.support.tiny_models import WORDS, make_classifier, make_tokenizer


def _device() -> torch.device:
    name = os.environ.get("CAHP_TEST_DEVICE")
    if name is None:
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device (set CAHP_TEST_DEVICE=cpu to run these on the CPU)")
        name = "cuda"
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(f"CAHP_TEST_DEVICE={name} but torch sees no CUDA device")
    return torch.device(name)


@pytest.fixture(scope="module")
def device() -> torch.device:
    return _device()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    labels = np.arange(900) % 3
    texts = [" ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=int(rng.integers(2 + 8 * y, 5 + 8 * y))))
             for y in labels]
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels.astype(np.int64), ("a", "b", "c")),
                  max_length=32)


def test_signatures_and_salience_match_the_cpu(device, data):
    model = make_classifier("bert", layers=3, heads=4, seed=1)
    batches = length_grouped_batches(data.lengths, np.arange(200), 32)
    cpu_sig = extract_signatures(model, iterate_batches(data, batches), num_classes=3, resolution=6)
    cpu_sal = gradient_salience(model, iterate_batches(data, batches))
    moved = copy.deepcopy(model).to(device)
    sig = extract_signatures(moved, iterate_batches(data, batches, device), num_classes=3, resolution=6)
    sal = gradient_salience(moved, iterate_batches(data, batches, device))
    np.testing.assert_allclose(sig.mean, cpu_sig.mean, rtol=0, atol=1e-5)
    np.testing.assert_allclose(sig.var, cpu_sig.var, rtol=0, atol=1e-5)
    torch.testing.assert_close(sal, cpu_sal, rtol=1e-3, atol=1e-7)


def test_selection_with_the_stopping_rules_runs_on_the_device(device, data):
    model = make_classifier("bert", layers=3, heads=4, seed=1)
    config = PruningConfig(resolution=6, seed=2, device=str(device))
    cpu = select_heads(model, data, config)
    on = select_heads(copy.deepcopy(model).to(device), data, config)
    assert on.analysis.signature_sampling.samples == cpu.analysis.signature_sampling.samples
    np.testing.assert_allclose(on.analysis.signature_sampling.measures, cpu.analysis.signature_sampling.measures,
                               rtol=1e-4)
    assert on.analysis.calibration_sampling.samples == cpu.analysis.calibration_sampling.samples
    assert on.stability is not None and on.stability.shards == 5
    assert on.selection.kept_mask.shape == (3, 4)


@pytest.mark.parametrize("family", ["bert", "distilbert", "modernbert"])
def test_empty_layers_run_with_sdpa_on_the_device(device, family):
    model = _model(family)
    assert model.config._attn_implementation == "sdpa"
    batch = {k: v.to(device) for k, v in _batch("right").items()}
    model.to(device)
    with gate_heads(model, [g.to(device) for g in _gates(KEPT)]), torch.no_grad():
        expected = model(**batch).logits
    prune_heads(model, KEPT)
    with torch.no_grad():
        got = model(**batch).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("precision", ["native", "fp16"])
def test_recovery_in_mixed_precision(device, data, precision, monkeypatch):
    if precision == "fp16":
        if device.type != "cuda":
            pytest.skip("fp16 with loss scaling is a CUDA path")
        monkeypatch.setattr(training, "precision_for", lambda _dev: "fp16")
    model = make_classifier("bert", layers=2, heads=4, seed=3).to(device)
    prune_heads(model, {0: [0, 2], 1: []})
    result = training.finetune(model, data, TrainingRecipe(epochs=3, lr=1e-3, batch_size=32, warmup_ratio=0.1,
                                                           weight_decay=0.01, max_grad_norm=1.0, seed=0, device=device))
    expected = {"cpu": "fp32"}.get(device.type, "fp16" if precision == "fp16" else ("bf16" if
                                   torch.cuda.is_bf16_supported() else "fp16"))
    assert result.precision == expected
    assert all(math.isfinite(v) for v in result.loss_per_epoch)
    assert result.loss_per_epoch[-1] < result.loss_per_epoch[0]
