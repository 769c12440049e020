"""Sampling with a stopping rule, shards and their exact merge, leave-one-shard-out stability."""

import numpy as np
import pytest
import torch

from cahp_engine.config import PruningConfig
from cahp_engine.data import LabelledTexts, LazyEncodedDataset, encode, iterate_batches, length_grouped_batches
from cahp_engine.selection import (
    SamplingRecord,
    SignatureProfiler,
    Signatures,
    analyze_heads,
    class_difference_noise,
    is_plateau,
    jaccard,
    ladder_sizes,
    merge_moments,
    resolve_amount,
    salience_noise,
    select_heads,
    stratified_order,
)
from tests.support.tiny_models import WORDS, make_classifier, make_tokenizer


def _texts(n: int, *, separated: bool, seed: int = 0) -> LabelledTexts:
    """Three classes. Separated: each class has its own sentence lengths (2-4, 10-12, 18-20 words),
    which changes every attention map; otherwise the labels are drawn independently of the texts."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 3
    texts = [" ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=int(rng.integers(2 + 8 * y, 5 + 8 * y))))
             for y in labels]
    if not separated:
        labels = rng.permutation(labels)
    return LabelledTexts(tuple(texts), labels.astype(np.int64), ("a", "b", "c"))


@pytest.fixture(scope="module")
def model():
    return make_classifier("bert", layers=3, heads=4, seed=1)


@pytest.fixture(scope="module")
def separated():
    return encode(make_tokenizer(), _texts(1500, separated=True), max_length=32)


@pytest.fixture(scope="module")
def indistinct():
    return encode(make_tokenizer(), _texts(1500, separated=False), max_length=32)


def test_every_prefix_of_the_order_is_stratified_and_so_is_every_shard():
    labels = np.repeat(np.arange(3), [500, 300, 200])
    order = stratified_order(labels, seed=3, shards=5)
    assert sorted(order.rows.tolist()) == list(range(1000))
    for m in (1, 7, 50, 333, 999):
        counts = np.bincount(labels[order.rows[:m]], minlength=3)
        assert np.all(np.abs(counts - m * np.array([0.5, 0.3, 0.2])) <= 1.0 + 1e-9)
    per_shard = np.stack([np.bincount(labels[order.rows[order.shard == k]], minlength=3) for k in range(5)])
    assert per_shard.tolist() == [[100, 60, 40]] * 5
    again = stratified_order(labels, seed=3, shards=5)
    np.testing.assert_array_equal(order.rows, again.rows)
    assert not np.array_equal(order.rows, stratified_order(labels, seed=4, shards=5).rows)


def test_amounts_and_checkpoints():
    assert resolve_amount("auto", 100) is None
    assert resolve_amount("all", 100) == 100
    assert resolve_amount(1.0, 100) == 100 and resolve_amount(0.25, 1001) == 250
    assert resolve_amount(40, 100) == 40 and resolve_amount(400, 100) == 100
    assert ladder_sizes(2000, first=512, growth=1.5) == [512, 768, 1152, 1728, 2000]
    assert ladder_sizes(300, first=512, growth=1.5) == [300]


def test_merging_shards_gives_the_single_pass_statistics(model, separated):
    batches = length_grouped_batches(separated.lengths, np.arange(400), 32)
    order = stratified_order(separated.labels[:400], seed=0, shards=5)
    shard_of = np.empty(400, dtype=np.int64)
    shard_of[order.rows] = order.shard
    with SignatureProfiler(model, num_classes=3, resolution=6) as single:
        for batch in iterate_batches(separated, batches):
            single.update(batch)
    with SignatureProfiler(model, num_classes=3, resolution=6, shards=5) as sharded:
        for idx, batch in zip(batches, iterate_batches(separated, batches), strict=True):
            sharded.update(batch, torch.as_tensor(shard_of[idx]))
    one, parts = single.snapshot().merged(), sharded.snapshot()
    assert parts.counts.shape == (5, 3) and parts.samples == 400
    merged = parts.merged()
    np.testing.assert_array_equal(merged.counts, one.counts)
    np.testing.assert_allclose(merged.mean, one.mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(merged.var, one.var, rtol=0, atol=1e-12)
    # Leaving shard 2 out gives the statistics of the other shards' samples alone (batched differently,
    # so float32 attention differs in its last bits: compared to 1e-8).
    rest = np.flatnonzero(shard_of != 2)
    with SignatureProfiler(model, num_classes=3, resolution=6) as direct:
        for batch in iterate_batches(separated, length_grouped_batches(separated.lengths, rest, 32)):
            direct.update(batch)
    left_out, expected = parts.merged(leave_out=2), direct.snapshot().merged()
    np.testing.assert_array_equal(left_out.counts, expected.counts)
    np.testing.assert_allclose(left_out.mean, expected.mean, rtol=0, atol=1e-8)
    np.testing.assert_allclose(left_out.var, expected.var, rtol=0, atol=1e-8)


def test_merge_moments_against_numpy():
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(n, 4)) * 2 + 1 for n in (3, 11, 1, 20)]
    counts = np.array([[len(p)] for p in parts])
    means = np.stack([p.mean(axis=0)[None] for p in parts])
    m2s = np.stack([((p - p.mean(axis=0)) ** 2).sum(axis=0)[None] for p in parts])
    n, mean, m2 = merge_moments(counts, means, m2s)
    pooled = np.concatenate(parts)
    assert n.tolist() == [35]
    np.testing.assert_allclose(mean[0], pooled.mean(axis=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(m2[0] / 35, pooled.var(axis=0), rtol=0, atol=1e-12)


def test_noise_shares_are_about_one_for_noise_and_small_for_signal():
    rng = np.random.default_rng(1)

    def signatures(shift: float, n: int) -> Signatures:
        x = [rng.normal(size=(n, 6, 100)) + shift * c for c in range(2)]
        return Signatures(mean=np.stack([v.mean(axis=0) for v in x]), var=np.stack([v.var(axis=0) for v in x]),
                          counts=np.array([n, n]), resolution=10, num_layers=2, num_heads=3)

    assert class_difference_noise(signatures(0.0, 400), var_floor=1e-6) > 0.8
    assert class_difference_noise(signatures(0.5, 400), var_floor=1e-6) < 0.1
    scores = rng.normal(size=(40, 2, 3)) * 0.01 + np.arange(6).reshape(2, 3)
    assert salience_noise(scores.sum(axis=0), (scores**2).sum(axis=0), 40) < 1e-4
    flat = rng.normal(size=(40, 2, 3))
    assert salience_noise(flat.sum(axis=0), (flat**2).sum(axis=0), 40) > 0.3


def test_the_rule_stops_early_on_well_separated_classes(model, separated):
    analysis = analyze_heads(model, separated, PruningConfig(resolution=6, seed=2))
    record = analysis.signature_sampling
    assert record.mode == "auto" and record.stopped == "converged"
    assert record.samples == analysis.signature_samples < len(separated)
    assert record.samples == record.rungs[-1] and record.measures[-1] <= 0.2
    assert analysis.calibration_sampling.mode == "auto"
    assert analysis.calibration_samples == analysis.calibration_sampling.samples <= len(separated)


def test_the_rule_runs_to_the_cap_on_indistinguishable_classes(model, indistinct):
    config = PruningConfig(resolution=6, seed=2)
    record = analyze_heads(model, indistinct, config).signature_sampling
    assert record.stopped == "cap" and record.samples == len(indistinct)
    # A share that never fell from 1 is no plateau, however flat: no signal has shown yet.
    assert all(m > 0.8 for m in record.measures) and len(record.measures) == 3
    assert not is_plateau(record.measures)


def test_the_plateau_rule_stops_on_a_plateau_and_not_on_a_steady_decline():
    # all-MiniLM-L6-v2 with a new head on SST-5, 512 ... 5,832 rows: the signature share never reaches 0.2.
    first = [1.0, 0.82, 0.63, 0.61, 0.55, 0.60, 0.47]
    assert [is_plateau(first[: i + 1]) for i in range(len(first))] == [False] * 4 + [True] * 3
    # The same model on other sample orders: flat near 1 while the signal emerges, then a floor.
    later = [1.0, 1.0, 0.967, 0.646, 0.616, 0.562, 0.443]
    assert [is_plateau(later[: i + 1]) for i in range(len(later))] == [False] * 5 + [True, False]
    assert not any(is_plateau([1.0, 1.0, 1.0, 0.947, 0.941, 0.577, 0.564][:j]) for j in range(8))
    # A fixed signal under sampling noise, 1 / (1 + n / n0) at x1.5 rows a checkpoint, is never a plateau,
    # from pure noise to mostly signal; nor is a steady 20 % fall per checkpoint.
    for n0 in (50, 500, 5_000, 50_000):
        shares = [1 / (1 + 512 * 1.5**i / n0) for i in range(12)]
        assert not any(is_plateau(shares[:j]) for j in range(13)), n0
    assert not any(is_plateau([0.9 * 0.8**i for i in range(j)]) for j in range(1, 8))
    # A share that rises after the signal showed is no progress either.
    assert is_plateau([0.5, 0.45, 0.55]) and is_plateau([0.8, 0.75, 0.7])
    assert not is_plateau([0.5, 0.5]) and not is_plateau(first, min_gain=None)


def test_a_pass_records_the_plateau_it_stopped_at(model, indistinct, monkeypatch):
    from cahp_engine.selection import _convergence

    scripted = iter([1.0, 0.82, 0.63, 0.61, 0.55, 0.60, 0.47])
    measured: list[float] = []

    def minilm_like(signatures, *, var_floor):
        measured.append(next(scripted))
        return measured[-1]

    monkeypatch.setattr(_convergence, "class_difference_noise", minilm_like)
    big = encode(make_tokenizer(), _texts(6000, separated=False, seed=4), max_length=32)
    config = PruningConfig(resolution=6, seed=2, calibration_fraction=0.05, stability_shards=0)
    record = analyze_heads(model, big, config, plateau_gain=_convergence.PLATEAU_GAIN).signature_sampling
    assert record.stopped == "plateau" and record.rungs == (512, 768, 1152, 1728, 2592)
    assert record.samples == 2592 and record.measures == (1.0, 0.82, 0.63, 0.61, 0.55)
    assert record.reason == ("noise share 0.550 after 2592 of 6000 rows, only 13% below its 0.630 at 1152 rows: "
                             "it stopped falling, and more rows buy little")


def test_the_sampling_record_writes_its_rungs_and_reads_a_report_that_called_them_checkpoints():
    record = SamplingRecord(mode="auto", samples=768, available=2000, stopped="converged", reason="r",
                            rungs=(512, 768), measures=(0.4, 0.15))
    written = record.to_dict()
    assert written["rungs"] == [512, 768] and "checkpoints" not in written
    assert SamplingRecord.from_dict(written) == record
    older = {("checkpoints" if key == "rungs" else key): value for key, value in written.items()}
    assert SamplingRecord.from_dict(older) == record
    with pytest.raises(ValueError, match="unknown keys"):
        SamplingRecord.from_dict({**written, "ladder": [1]})


@pytest.mark.parametrize(("amount", "expected"), [(700, 700), ("all", 1500), (1.0, 1500), (0.3, 450)])
def test_explicit_signature_samples_are_honoured_exactly(model, indistinct, amount, expected):
    config = PruningConfig(resolution=6, signature_samples=amount, calibration_fraction=0.1, stability_shards=0)
    analysis = analyze_heads(model, indistinct, config)
    assert analysis.signature_samples == expected
    assert analysis.signature_sampling.mode == "fixed" and analysis.signature_sampling.stopped == "requested"
    assert analysis.signature_sampling.rungs == ()
    assert analysis.calibration_samples == 150 and analysis.calibration_sampling.mode == "fixed"
    assert analysis.leave_one_out == ()


def test_leave_one_shard_out_selections(model, separated):
    result = select_heads(model, separated, PruningConfig(resolution=6, seed=2, signature_samples=600))
    stability = result.stability
    assert stability is not None and stability.shards == 5
    assert len(stability.k_stars) == len(stability.heads_kept) == 5
    freq = np.asarray(stability.kept_frequency)
    assert freq.shape == (3, 4) and ((freq >= 0) & (freq <= 1)).all()
    # Each head's frequency is the share of the five head sets that kept it.
    assert freq.sum() == pytest.approx(sum(stability.heads_kept) / 5)
    assert 0 <= stability.min_jaccard <= stability.mean_jaccard <= 1
    assert stability.seconds > 0 and result.timings["stability"] > 0
    assert result.analysis.graph_space.perplexity == pytest.approx(11 / 3)
    # The leave-one-out analyses are whole analyses of 4/5 of the samples each.
    config = PruningConfig(resolution=6, seed=2, signature_samples=600)
    analysis = analyze_heads(model, separated, config)
    assert len(analysis.leave_one_out) == 5
    assert [a.signature_samples for a in analysis.leave_one_out] == [480] * 5
    for loo in analysis.leave_one_out:
        assert loo.curve.ks.tolist() == analysis.curve.ks.tolist()
    off = select_heads(model, separated, config.replace(stability_shards=0))
    assert off.stability is None and "stability" not in off.timings
    np.testing.assert_array_equal(off.selection.kept_mask.shape, (3, 4))


def test_jaccard():
    a = np.array([[True, False], [True, True]])
    assert jaccard(a, a) == 1.0 and jaccard(a, ~a) == 0.0
    assert jaccard(a, np.array([[True, True], [False, True]])) == 0.5
    assert jaccard(np.zeros(3, bool), np.zeros(3, bool)) == 1.0


def test_a_lazy_split_tokenises_only_the_rows_selection_reads(model):
    texts = _texts(3000, separated=True, seed=5)
    tokenizer = make_tokenizer()

    class Counting:
        """The tokenizer, counting the texts it is asked to encode."""

        def __init__(self) -> None:
            self.rows = 0

        def __call__(self, texts, *args, **kwargs):
            self.rows += len(texts)
            return tokenizer(texts, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(tokenizer, name)

    counting = Counting()
    lazy = LazyEncodedDataset(counting, texts, max_length=32)
    config = PruningConfig(resolution=6, seed=2)
    analysis = analyze_heads(model, lazy, config)
    assert analysis.signature_sampling.stopped == "converged"
    assert counting.rows == analysis.signature_samples + analysis.calibration_samples < 3000
    # The same rows, tokenised up front, give the same analysis.
    eager = analyze_heads(model, encode(tokenizer, texts, max_length=32), config)
    np.testing.assert_array_equal(eager.curve.mss, analysis.curve.mss)
    np.testing.assert_array_equal(eager.salience, analysis.salience)


@pytest.mark.parametrize(("dense_finetune", "whole_split_before_selection"), [("never", False), ("always", True)])
def test_a_run_tokenises_the_whole_split_before_selection_only_to_fine_tune(
    tmp_path, monkeypatch, dense_finetune, whole_split_before_selection
):
    from cahp_engine.run import RunRequest, run_pruning
    from cahp_engine.run import _steps as steps
    from tests.engine.golden.make_golden import write_inputs

    model, data = write_inputs(tmp_path)
    seen: list[bool] = []
    select = steps.select

    def watching_select(run, *, model, train):
        seen.append("encoded" in vars(train))  # the cached whole-split tokenisation, if anything asked for it
        return select(run, model=model, train=train)

    monkeypatch.setattr(steps, "select", watching_select)
    config = PruningConfig(epochs=0, dense_finetune=dense_finetune, untrained_dense="warn", dense_epochs=0.1,
                           batch_size=16, max_length=32,
                           seed=3, device="cpu", export="none", recovery_loss="ce", stability_shards=0,
                           latency_warmup=0, latency_repeats=1)
    run_pruning(RunRequest(model_ref=str(model), dataset_ref=str(data), output_dir=tmp_path / "out", config=config))
    assert seen == [whole_split_before_selection]
