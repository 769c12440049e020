"""The benchmarks' and studies' code paths on tiny random models (neither ever runs for real in tests)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from bench import common, speed, stages
from cahp_engine.models import heads_per_layer, save_pruned
from studies import quality
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer


def _write_split(path: Path, n: int, seed: int) -> None:
    texts, labels = make_texts(n, num_classes=5, seed=seed)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(zip(texts, labels.tolist(), strict=True))


@pytest.fixture()
def tiny_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    data = tmp_path / "data"
    data.mkdir()
    _write_split(data / "train.csv", 60, seed=1)
    _write_split(data / "test.csv", 30, seed=2)
    base = tmp_path / "base"
    save_pruned(make_classifier("bert", num_labels=5, layers=3, heads=4), make_tokenizer(), base)
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    protocol = quality.Protocol(name="tiny", model="tiny", seeds=(1, 2), degrees=(2, 6), dense_epochs=1,
                                dense_lr=1e-3, recovery_lr=1e-3, dense_cpu_path="native")
    return {"data": data, "base": str(base), "cache": tmp_path / "cache", "protocol": protocol}


def _run(setup: dict[str, object], **kwargs: object) -> dict:
    return quality.run(setup["protocol"], base=setup["base"], data_dir=setup["data"],  # type: ignore[arg-type]
                       cache=setup["cache"], device=torch.device("cpu"), say=lambda _line: None, **kwargs)


def test_quality_protocol_compares_the_three_methods_at_the_same_head_count(tiny_setup):
    payload = _run(tiny_setup)
    assert payload["complete"]
    cells = payload["cells"]
    assert len(cells) == 2 * 2 * 3
    for seed in (1, 2):
        for degree in (2, 6):
            group = [c for c in cells if c["seed"] == seed and c["degree"] == degree]
            assert {c["strategy"] for c in group} == set(quality.STRATEGIES)
            kept = payload["selections"][str(seed)]["degrees"][str(degree)]
            counts = {len(kept["kept"][s]) for s in quality.STRATEGIES}
            assert counts == {kept["heads_kept"]}  # the baselines keep exactly CAHP's count
            assert kept["retention"] == pytest.approx(kept["heads_kept"] / 12)
            assert all(0.0 <= c["accuracy"] <= 1.0 and c["accuracy_before_recovery"] is not None for c in group)
    summary = payload["summary"]["2"]["cahp"]
    assert summary["seeds"] == [1, 2] and len(summary["jaccard"]["pairs"]) == 1
    assert summary["accuracy_std"] is not None


def test_quality_rerun_skips_finished_cells_and_redoes_a_missing_one(tiny_setup, monkeypatch):
    first = _run(tiny_setup)
    cells_file = tiny_setup["cache"] / tiny_setup["protocol"].cells_file()
    cells = json.loads(cells_file.read_text())
    dropped = quality._cell_key(2, 6, "random")
    del cells[dropped]
    cells_file.write_text(json.dumps(cells))
    calls = []
    real = quality.finetune

    def counting(model, data, recipe, **kwargs):
        calls.append(recipe.seed)
        return real(model, data, recipe, **kwargs)

    monkeypatch.setattr(quality, "finetune", counting)
    second = _run(tiny_setup)
    assert calls == [2]  # only the dropped cell was trained again: no dense fine-tuning, no other cell
    assert second["complete"]
    same = [c for c in first["cells"] if c["strategy"] != "random" or c["seed"] != 2 or c["degree"] != 6]
    assert all(c in second["cells"] for c in same)


def test_quality_with_distillation_adds_a_set_of_cells_and_keeps_the_cross_entropy_ones(tiny_setup, monkeypatch):
    ce_only = _run(tiny_setup)
    passes = []
    real = quality.teacher_logits

    def counting(*args, **kwargs):
        passes.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(quality, "teacher_logits", counting)
    tiny_setup["protocol"] = quality.replace(tiny_setup["protocol"], losses=("ce", "distill"))
    both = _run(tiny_setup)
    assert passes == [1]  # one teacher pass for the six distilled cells
    assert (tiny_setup["cache"] / "teacher-logits.npy").is_file()
    distilled = [c for c in both["cells"] if c["loss"] == "distill"]
    assert len(distilled) == 12 and all(c in both["cells"] for c in ce_only["cells"])
    assert set(both["summary"]["2"]) == {"cahp", "salience", "random", "cahp+distill", "salience+distill",
                                         "random+distill"}
    again = _run(tiny_setup)  # cached: neither the teacher nor any cell runs again
    assert passes == [1] and again["cells"] == both["cells"]
    table = quality.markdown({**both, "date": "d", "command": "c", "machine": {"cpu": "x", "cores": 2,
                                                                              "torch_threads": 1, "gpu": None},
                              "protocol": "p"})
    assert "| CAHP + distill |" in table and "Salience top-k + distill" in table


def test_quality_report_only_names_the_run_that_computed_the_figures(tiny_setup, tmp_path):
    cache, protocol = tiny_setup["cache"], tiny_setup["protocol"]
    payload = _run(tiny_setup)
    computing_machine = {**common.machine(), "torch_threads": 1, "vector_isa": ["avx2", "fma"],
                         "cpu_path": {"MKL_CBWR": "AVX2"}}
    runs = quality.record_invocation(cache, protocol, {"command": "python -m studies quality --seeds 1,2",
                                                       "date": "2026-11-29T10:00:00+00:00", "wall_s": 120.0,
                                                       "machine": computing_machine})
    other = quality.replace(protocol, recovery_epochs=3.0)
    quality.record_invocation(cache, other, {"command": "python -m studies quality --paper-protocol",
                                             "date": "2026-11-29T11:00:00+00:00", "wall_s": 60.0})
    assert quality.record_invocation(cache, protocol, None) == runs and len(runs) == 1
    doc = {**payload, "date": "2026-11-29T12:00:00+00:00", "command": runs[-1]["command"],
           "machine": common.machine(), "protocol": protocol.describe(), "computed_by": runs,
           "report_rebuilt_by": "python -m studies quality --report-only"}
    header = quality.markdown(doc).splitlines()[2]
    assert header.startswith("Date 2026-11-29T12:00:00+00:00; command `python -m studies quality --seeds 1,2` (this "
                             "report rebuilt by `python -m studies quality --report-only`; computed by `python -m "
                             "studies quality --seeds 1,2` on 2026-11-29T10:00:00+00:00 in 2 min (1 torch threads, "
                             "avx2/fma, MKL_CBWR=AVX2))")
    # The rebuild's own thread count is not the computing run's: it is left out of a rebuilt header.
    assert "torch threads)" not in header.split("; machine ")[-1]


def test_the_pinned_dense_model_is_trained_in_a_child_and_reproduced_from_its_record(tiny_setup, tmp_path):
    protocol = quality.replace(tiny_setup["protocol"], dense_cpu_path="pinned")
    cache = tmp_path / "pinned"
    args = (tiny_setup["base"], tiny_setup["data"], cache, protocol, torch.device("cpu"), lambda _line: None)
    _model, _tokenizer, record = quality.dense_model(*args)
    assert record["trained_on"]["cpu_path"] == {k: v for k, v in quality.DENSE_PINS.items()
                                                if k in common.CPU_PATH_PINS}
    assert record["trained_on"]["torch_threads"] == 1
    # A later session without the model files: the child retrains on the same path and matches the record.
    shutil.rmtree(cache / "dense")
    _model, _tokenizer, again = quality.dense_model(*args)
    assert again == record and (cache / "dense" / "config.json").is_file()
    # A record the retrained model does not match is refused, not mixed with the cells.
    shutil.rmtree(cache / "dense")
    tampered = {**record, "test": {**record["test"], "confusion": [[0]]}}
    (cache / "dense.json").write_text(json.dumps(tampered))
    with pytest.raises(SystemExit, match="failed"):
        quality.dense_model(*args)


def test_quality_refuses_a_cache_of_another_dense_recipe(tiny_setup):
    tiny_setup["cache"].mkdir(parents=True)
    (tiny_setup["cache"] / "manifest.json").write_text(json.dumps({"model": "something else"}))
    with pytest.raises(SystemExit, match="another protocol"):
        _run(tiny_setup)


def test_quality_report_files(tiny_setup):
    payload = _run(tiny_setup)
    path = common.save("tiny.json", payload, command="test", protocol=tiny_setup["protocol"].describe())
    doc = json.loads(path.read_text())
    table = quality.markdown(doc)
    for label in quality.LABELS.values():
        assert f"| {label} |" in table
    assert "Poly 2" in table and "Poly 6" in table and "Public CAHP" not in table
    assert "Macro-F1 (%) after recovery" in table
    f1 = doc["summary"]["2"]["cahp"]["macro_f1_mean"]
    assert f"| CAHP | {100 * f1:.1f} ± " in table.split("Macro-F1")[1]
    png = path.with_suffix(".png")
    quality.plot(doc, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pairwise_jaccard():
    a, b, c = {(0, 0), (0, 1)}, {(0, 1), (1, 1)}, {(0, 0), (0, 1)}
    result = quality.pairwise_jaccard([a, b, c])
    assert result["pairs"] == pytest.approx([1 / 3, 1.0, 1 / 3])
    assert result["min"] == pytest.approx(1 / 3) and result["max"] == 1.0
    assert quality.pairwise_jaccard([a])["mean"] is None


def test_flops_per_token_counts_each_block():
    dense = speed.EncoderShape(heads_per_layer=(2, 2), head_dim=4, hidden=8, intermediate=16)
    flops = speed.flops_per_token(dense, seq_len=10)
    # per layer: projections 8*8*8 = 512, scores 4*10*8 = 320, feed-forward 4*8*16 = 512
    assert flops == {"projections": 1024.0, "scores": 640.0, "feed_forward": 1024.0, "total": 2688.0}
    half = speed.EncoderShape(heads_per_layer=(1, 1), head_dim=4, hidden=8, intermediate=16)
    assert speed.predicted_speedup(dense, half, 10) == pytest.approx(2688 / (512 + 320 + 1024))


def test_pruned_copy_keeps_the_count_with_a_head_in_every_layer():
    model = make_classifier("bert", layers=3, heads=4)
    pruned, kept = speed.pruned_copy(model, 0.25, seed=0)
    assert kept == 3 and heads_per_layer(pruned) == [1, 1, 1]
    assert heads_per_layer(model) == [4, 4, 4]
    shape = speed.encoder_shape(pruned)
    assert shape.heads_per_layer == (1, 1, 1) and shape.head_dim == 8
    counts = [len(v) for v in speed.random_heads(6, 12, 11, seed=3).values()]
    assert sum(counts) == 11 and min(counts) >= 1
    with pytest.raises(ValueError):
        speed.random_heads(6, 12, 5, seed=0)
    assert speed.random_heads(6, 12, 11, seed=3) == speed.random_heads(6, 12, 11, seed=3)


def test_stage_costs_after_selection_on_a_tiny_shape():
    row = stages.downstream_costs(2, 4, samples=40, head_dim=4, repeats=1, seed=0, threads=1)
    assert row["surgery_s"]["median"] > 0 and "surgery_s" not in row["pruned"]
    for name in ("dense", "pruned"):
        assert row[name]["finetune_epoch_s"] > 0 and row[name]["evaluation_s"]["median"] > 0
        assert row[name]["finetune_peak_extra_mib"] > 0  # each model in a fresh process: nothing to reuse
    assert stages.half_of_each_layer(2, 4) == {0: [0, 1], 1: [0, 1]}


def test_stages_rerun_of_one_section_keeps_the_others(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    tiny = ["--threads", "1", "--repeats", "1", "--head-dim", "2", "--shapes", "1x2", "--memory-samples", "40,80",
            "--downstream-samples", "40"]
    stages.main([*tiny, "--sections", "sweep"])
    first = json.loads((tmp_path / "stages.json").read_text())
    assert set(first["section_runs"]) == {"sweep"} and "downstream" not in first
    stages.main([*tiny, "--sections", "downstream,scaling"])
    doc = json.loads((tmp_path / "stages.json").read_text())
    assert doc["sweep_384"] == first["sweep_384"]
    assert set(doc["section_runs"]) == {"sweep", "downstream", "scaling"}
    assert doc["section_runs"]["sweep"] == first["section_runs"]["sweep"]
    assert [r["samples"] for r in doc["scaling"]["rows"]] == [40, 80]
    assert all(r["finetune_epoch"]["s"] > 0 and r["salience"]["calibration_samples"] == n // 4
               for r, n in zip(doc["scaling"]["rows"], (40, 80), strict=True))
    with pytest.raises(SystemExit):
        stages.main([*tiny, "--sections", "everything"])


def test_quality_selections_carry_leave_one_shard_out_stability(tiny_setup):
    payload = _run(tiny_setup)
    for selection in payload["selections"].values():
        for info in selection["degrees"].values():
            assert set(info["stability"]) == set(quality.STRATEGIES)
            assert all(0.0 <= s["mean_jaccard"] <= 1.0 and len(s["k_stars"]) == 5 for s in info["stability"].values())
    assert "Leave-one-shard-out stability" in quality.markdown(
        {**payload, "date": "d", "command": "c", "protocol": "p",
         "machine": {"cpu": "x", "cores": 2, "torch_threads": 1, "gpu": None}})


def test_quality_resumes_committed_state_by_retraining_the_same_dense_model(tiny_setup):
    """A fresh clone holds the cache's JSON files but not the model: the dense model is trained again and
    must give the recorded test confusion matrix, else the cells are not comparable and the run stops."""
    import shutil

    first = _run(tiny_setup)
    cache = tiny_setup["cache"]
    shutil.rmtree(cache / "dense")
    lines: list[str] = []
    again = quality.run(tiny_setup["protocol"], base=tiny_setup["base"], data_dir=tiny_setup["data"], cache=cache,
                        device=torch.device("cpu"), say=lines.append)
    assert any("dense model reproduced" in line for line in lines)
    assert again["cells"] == first["cells"]  # every cell was kept, none recomputed
    shutil.rmtree(cache / "dense")
    record = json.loads((cache / "dense.json").read_text())
    record["test"]["confusion"][0][0] += 1
    (cache / "dense.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit, match="not the one the cached cells were computed from"):
        _run(tiny_setup)


def test_store_cell_keeps_the_cells_another_run_wrote(tmp_path):
    path = tmp_path / "cells.json"
    quality.store_cell(path, "seed=1/degree=2/strategy=cahp", {"accuracy": 0.5})
    mine = quality.store_cell(path, "seed=2/degree=2/strategy=cahp", {"accuracy": 0.6})
    assert set(mine) == {"seed=1/degree=2/strategy=cahp", "seed=2/degree=2/strategy=cahp"}


def test_cause_variants_keep_cahps_head_count(tiny_setup):
    import numpy as np

    from studies import quality_causes

    salience = np.array([[1.0, 0.9, 0.1], [0.8, 0.0, 0.2]])
    labels = np.array([0, 0, 1, 0, 2, 1])
    # D'Hondt on the clusters' salience mass: the salient cluster takes every seat it can hold.
    assert quality_causes.cluster_salience(labels, salience, 3).tolist() == [[True, True, False], [True, False, False]]
    assert quality_causes.cluster_salience(labels, salience, 4).sum() == 4
    assert quality_causes.salience_in_layers(salience, np.array([1, 2])).tolist() == [[True, False, False],
                                                                                       [True, False, True]]
    protocol = quality.replace(tiny_setup["protocol"], seeds=(1,), degrees=(6,))
    _run({**tiny_setup, "protocol": protocol})
    payload = quality_causes.run(protocol, quality_causes.VARIANTS, base=tiny_setup["base"],
                                 cache=tiny_setup["cache"], data_dir=tiny_setup["data"], compute=True,
                                 say=lambda _line: None)
    assert {c["variant"] for c in payload["cells"]} == set(quality_causes.VARIANTS)
    cahp = next(c for c in payload["reference_cells"] if c["strategy"] == "cahp")
    for cell in payload["cells"]:
        if cell["variant"] in ("salience_in_cahp_layers", "cluster_salience"):
            assert cell["heads_kept"] == cahp["heads_kept"] == len(cell["kept"])
    table = quality_causes.markdown({**payload, "date": "d", "command": "c"})
    assert "| Cluster salience (D'Hondt seats) |" in table and "| CAHP |" in table
    per_layer = payload["heads_per_layer"]["seed=1/degree=6"]
    assert sum(per_layer["cahp"]) == cahp["heads_kept"] and len(per_layer["cluster_salience"]) == 3
    assert "Heads kept per layer at degree 6" in table


def test_distill_study_recovers_cahps_heads_with_other_losses_beside_the_grid(tiny_setup):
    from studies import distill_study

    assert distill_study.parse_variant("distill_a0.9_t4") == {"alpha": 0.9, "temperature": 4.0}
    assert distill_study.parse_variant("hidden_b1") == {"beta": 1.0}
    with pytest.raises(ValueError, match="unknown variant 'hidden'"):
        distill_study.parse_variant("hidden")
    with pytest.raises(ValueError, match="alpha must be in"):
        distill_study.parse_variant("distill_a2_t4")
    protocol = quality.replace(tiny_setup["protocol"], seeds=(1,), degrees=(2,), losses=("ce", "distill"))
    _run({**tiny_setup, "protocol": protocol})
    variants = ("distill_a0.9_t2", "hidden_b1")
    payload = distill_study.run(protocol, variants, base=tiny_setup["base"], cache=tiny_setup["cache"],
                                data_dir=tiny_setup["data"], compute=True, say=lambda _line: None)
    assert [c["variant"] for c in payload["cells"]] == list(variants)
    assert {c["loss"] for c in payload["reference_cells"]} == {"ce", "distill"}
    cahp = payload["reference_cells"][0]
    for cell in payload["cells"]:
        assert cell["heads_kept"] == cahp["heads_kept"] and 0.0 <= cell["accuracy"] <= 1.0
    # The hidden-state term changes the training: its losses are not the default distillation's.
    default = next(c for c in payload["reference_cells"] if c["loss"] == "distill")
    hidden = payload["cells"][1]
    assert hidden["recovery"]["loss_per_epoch"] != default["recovery"]["loss_per_epoch"]
    table = distill_study.markdown({**payload, "date": "d", "command": "c"})
    assert "| Distillation, alpha 0.9, T 2 |" in table and "| Cross-entropy (the paper's) |" in table
    assert "| Distillation (alpha 0.5, T 4) + hidden states x 1 |" in table
    # A rerun finds every cell and computes nothing.
    again = distill_study.run(protocol, variants, base=tiny_setup["base"], cache=tiny_setup["cache"],
                              data_dir=tiny_setup["data"], compute=True,
                              say=lambda line: pytest.fail(f"recomputed: {line}"))
    assert again["cells"] == payload["cells"]


def test_the_hidden_state_term_is_zero_against_itself_and_masks_padding():
    from cahp_engine.data import LabelledTexts, collate, encode
    from studies.distill_study import hidden_state_loss

    texts, labels = make_texts(8, num_classes=3, seed=4)
    data = encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)
    batch = collate(data, torch.arange(8).numpy())
    dense, other = make_classifier("bert", seed=0).eval(), make_classifier("bert", seed=1).eval()
    assert bool((batch["attention_mask"] == 0).any())  # rows of several lengths: some padding
    term = hidden_state_loss(dense, beta=2.0)
    with torch.no_grad():
        same = dense(**batch_inputs(batch), output_hidden_states=True)
        moved = other(**batch_inputs(batch), output_hidden_states=True)
        assert float(term(same, batch)) == 0.0 and float(term(moved, batch)) > 0.0
        # beta scales it; what sits on padded positions does not count.
        half = hidden_state_loss(dense, beta=1.0)
        assert float(term(moved, batch)) == pytest.approx(2 * float(half(moved, batch)))
        padded = type(moved)(logits=moved.logits, hidden_states=tuple(
            h + 100.0 * (1 - batch["attention_mask"].unsqueeze(-1)) for h in moved.hidden_states))
        assert float(term(padded, batch)) == pytest.approx(float(term(moved, batch)))


def batch_inputs(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k != "labels"}


def test_reconstruction_bench_reports_the_gap_closed_per_variant(tmp_path):
    from bench import reconstruction
    from tests.support.helpers import write_split
    from tests.support.tiny_models import make_classifier, make_tokenizer

    dense = tmp_path / "dense"
    make_classifier("bert", layers=2, heads=4, num_labels=3, seed=2).save_pretrained(dense)
    make_tokenizer().save_pretrained(dense)
    for split, n in (("train", 60), ("test", 30)):
        write_split(tmp_path / "data" / f"{split}.csv", n, seed=len(split))
    reconstruction.main(["--data", str(tmp_path / "data"), "--dense", str(dense), "--degrees", "2",
                         "--calibration-rows", "40", "--results", str(tmp_path), "--out", "r.json"])
    cells = json.loads((tmp_path / "r.json").read_text())["cells"]
    assert [(c["seed"], c["degree"], c["strategy"]) for c in cells] == [(42, 2, "cahp")]
    assert set(cells[0]["variants"]) == set(reconstruction.VARIANTS)
    assert all(v["seconds"] > 0 and v["rows"] > 0 for v in cells[0]["variants"].values())
    assert all(v["cpu_seconds"] > 0 for v in cells[0]["variants"].values())
    reconstruction.main(["--data", str(tmp_path / "data"), "--dense", str(dense), "--degrees", "2",
                         "--calibration-rows", "40", "--results", str(tmp_path), "--out", "one.json",
                         "--variants", "ridge-residual", "--epoch", "0.5"])
    only = json.loads((tmp_path / "one.json").read_text())["cells"][0]
    assert set(only["variants"]) == {"ridge-residual"} and only["epoch_cpu_seconds"] > 0


def test_the_benches_read_a_sentence_pair_task_and_score_its_validation_matched_split(tmp_path):
    """A directory shaped as MNLI's (premise, hypothesis; no test.csv) is read as pairs and scored on
    ``validation_matched``; SST-5's shape on ``test``."""
    import csv

    from bench import reconstruction
    from bench.common import task_options
    from tests.support.helpers import make_texts, write_split
    from tests.support.tiny_models import make_classifier, make_tokenizer

    pairs = tmp_path / "pairs"
    pairs.mkdir()
    for split, n, seed in (("train", 60, 1), ("validation_matched", 23, 2)):
        first, labels = make_texts(n, num_classes=3, seed=seed)
        second, _ = make_texts(n, num_classes=3, seed=seed + 10)
        with open(pairs / f"{split}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["premise", "hypothesis", "label"])
            writer.writerows(zip(first, second, labels.tolist(), strict=True))
    options = task_options(pairs)
    assert (options.text_column, options.text_pair_column, options.eval_split) == (
        "premise", "hypothesis", "validation_matched")
    write_split(tmp_path / "single" / "train.csv", 10, seed=1)
    assert (task_options(tmp_path / "single").text_pair_column, task_options(tmp_path / "single").eval_split) == (
        None, "test")

    dense = tmp_path / "dense"
    make_classifier("bert", layers=2, heads=4, num_labels=3, seed=2).save_pretrained(dense)
    make_tokenizer().save_pretrained(dense)
    reconstruction.main(["--data", str(pairs), "--dense", str(dense), "--degrees", "2", "--variants",
                         "ridge-residual", "--calibration-rows", "40", "--results", str(tmp_path), "--out", "p.json"])
    cell = json.loads((tmp_path / "p.json").read_text())["cells"][0]
    # Accuracy on 23 rows moves in steps of 1/23 (the 60 training rows would not): they were scored.
    for value in (cell["dense"], cell["pruned"], cell["variants"]["ridge-residual"]["accuracy"]):
        assert abs(value * 23 - round(value * 23)) < 1e-9
