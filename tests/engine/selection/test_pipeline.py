import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cahp_engine.config import PruningConfig
from cahp_engine.data import LabelledTexts, encode
from cahp_engine.errors import ConfigError, DatasetError, InvalidInputError, JobCancelledError
from cahp_engine.selection import select_heads
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

ROOT = Path(__file__).resolve().parents[3]


def _encoded(n=120, num_classes=3, seed=0):
    texts, labels = make_texts(n, num_classes=num_classes, seed=seed)
    names = tuple(str(i) for i in range(num_classes))
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, names), max_length=32)


@pytest.fixture(scope="module")
def model():
    return make_classifier("bert", layers=3, heads=4, seed=1)


def test_selection_is_complete_and_consistent(model):
    data = _encoded()
    stages = []
    result = select_heads(model, data, PruningConfig(resolution=6), progress=lambda s, f: stages.append(s))
    sel = result.selection
    assert result.k_star == result.knee.k and result.knee.degree == 2
    assert set(result.analysis.knees) == {2, 3, 4, 5, 6}
    assert len(sel.representatives) == result.k_star
    assert sel.num_kept == result.k_star + len(sel.layer_safety_added)
    assert all(sel.kept[layer] for layer in range(3))  # layer safety
    assert result.analysis.curve.ks.tolist() == list(range(2, 12))
    assert result.analysis.graph_space.points.shape == (12, 2)
    assert result.analysis.salience.min() == 0 and result.analysis.salience.max() == 1
    assert result.clustering.k == result.k_star
    # Each representative is the most salient head of its cluster.
    flat = result.analysis.salience.reshape(-1)
    for layer, head in sel.representatives:
        members = np.flatnonzero(result.clustering.labels == result.clustering.labels[layer * 4 + head])
        assert flat[layer * 4 + head] == flat[members].max()
    # 120 rows are fewer than the first rung of either stopping rule: both read every row.
    assert result.analysis.signature_samples == 120 and result.analysis.calibration_samples == 120
    assert result.analysis.signature_sampling.stopped == result.analysis.calibration_sampling.stopped == "cap"
    assert {"signatures", "separation", "graph_space", "sweep", "knee", "salience", "stability",
            "selection"} <= set(result.timings)
    assert stages[0] == "signatures" and stages[-1] == "selection"


def test_same_inputs_and_seed_give_the_same_selection(model):
    data = _encoded()
    config = PruningConfig(resolution=6, seed=3, signature_samples=0.5)
    a, b = select_heads(model, data, config), select_heads(model, data, config)
    np.testing.assert_array_equal(a.selection.kept_mask, b.selection.kept_mask)
    np.testing.assert_array_equal(a.analysis.curve.mss, b.analysis.curve.mss)
    np.testing.assert_array_equal(a.analysis.graph_space.points, b.analysis.graph_space.points)


def test_fixed_head_count_skips_the_knee_and_baselines_match_it(model):
    data = _encoded()
    fixed = select_heads(model, data, PruningConfig(resolution=6, heads_to_keep=5))
    assert fixed.k_star == 5 and fixed.knee is None
    assert len(fixed.selection.representatives) == 5
    for strategy in ("salience", "random"):
        base = select_heads(model, data, PruningConfig(resolution=6, heads_to_keep=5, strategy=strategy))
        assert base.selection.num_kept == 5 and base.selection.strategy == strategy
        assert base.analysis.graph_space.points.shape == (12, 2)
    cahp = select_heads(model, data, PruningConfig(resolution=6))
    same_count = select_heads(model, data, PruningConfig(resolution=6, strategy="salience"))
    assert same_count.selection.num_kept == cahp.selection.num_kept


def test_cancellation_stops_between_batches(model):
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(JobCancelledError):
        select_heads(model, _encoded(), PruningConfig(resolution=6, batch_size=8), should_cancel=cancel)


def test_bad_inputs_are_rejected_before_any_computation(model):
    with pytest.raises(DatasetError, match="at least two classes"):
        select_heads(model, _encoded(num_classes=1), PruningConfig())
    data = _encoded(n=60)
    with pytest.raises(DatasetError, match="fewer than two of the 2 signature samples"):
        select_heads(model, data, PruningConfig(signature_samples=2))
    gap = type(data)(**{**data.__dict__, "labels": np.where(data.labels == 1, 0, data.labels)})
    with pytest.raises(DatasetError, match=r"classes \[1\] have no samples"):
        select_heads(model, gap, PruningConfig())
    with pytest.raises(ConfigError, match="at most 11"):
        select_heads(model, data, PruningConfig(heads_to_keep=12))
    with pytest.raises(InvalidInputError, match="at least 5"):
        select_heads(make_classifier("bert", layers=1, heads=4), data, PruningConfig())
    with pytest.raises(ConfigError, match="`resolution` must be an integer between 2 and 512, got 1"):
        PruningConfig(resolution=1)
    empty = _encoded(n=60)
    empty = type(empty)(input_ids=(), token_type_ids=None, labels=np.zeros(0, dtype=np.int64),
                        lengths=np.zeros(0, dtype=np.int64), num_classes=3, pad_token_id=0)
    with pytest.raises(DatasetError, match="no rows"):
        select_heads(model, empty, PruningConfig())


SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    torch.set_num_threads(int(sys.argv[1]))
    from cahp_engine.config import PruningConfig
    from cahp_engine.data import LabelledTexts, encode
    from cahp_engine.selection._select_heads import select_heads
    from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer
    texts, labels = make_texts(700, num_classes=3, seed=4)  # past the first rungs of both rules
    data = encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)
    model = make_classifier("bert", layers=4, heads=6, seed=2)
    r = select_heads(model, data, PruningConfig(seed=11))
    print(json.dumps({"k": r.k_star, "kept": r.selection.kept, "mss": r.analysis.curve.mss.round(9).tolist(),
                      "samples": [r.analysis.signature_samples, r.analysis.calibration_samples],
                      "stability": r.stability.kept_frequency}))
    """
)


@pytest.mark.slow
def test_selection_does_not_depend_on_the_number_of_threads():
    outs = []
    for threads in ("1", "2"):
        env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, "-c", SCRIPT, threads], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert outs[0] == outs[1]
