"""``cahp prune`` end to end on a tiny random model and a tiny dataset written here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from PIL import Image

from cahp_engine.models import load_pruned
from cahp_engine.recovery import count_parameters
from cahp_engine.run import FailedRunReport
from tests.support.fragile import write_fragile_model
from tests.support.tiny_models import make_classifier, make_tokenizer, write_dataset

ROOT = Path(__file__).resolve().parents[2]


def write_model(directory: Path, family="bert", **kwargs) -> Path:
    model = make_classifier(family, **kwargs)
    model.save_pretrained(directory)
    make_tokenizer().save_pretrained(directory)
    return directory


def cahp(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "app.cli", "prune", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prune")
    model = write_model(tmp / "model", layers=3, heads=4, num_labels=3)
    data = write_dataset(tmp / "data", string_labels=True)
    out = tmp / "out"
    proc = cahp(str(model), str(data), "--output", str(out), "--epochs", "1", "--latency-repeats", "2",
                "--poly-degree", "3", "--seed", "7", "--signature-samples", "80", cwd=tmp)
    return tmp, out, proc


@pytest.mark.slow  # a whole `cahp prune` process
def test_prune_writes_every_artifact_with_its_schema(run):
    tmp, out, proc = run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "heads kept:" in proc.stdout and "k* =" in proc.stdout
    names = {p.name for p in out.iterdir()}
    assert names == {"model", "onnx", "mss_curve.json", "mss_curve.png", "head_map.json", "head_map.png",
                     "layer_retention.png", "report.json"}
    assert not [p for p in tmp.iterdir() if ".partial-" in p.name]
    curve = json.loads((out / "mss_curve.json").read_text())
    assert curve["k"] == list(range(2, 12)) and len(curve["mss"]) == 10
    assert curve["polynomial_degree"] == 3
    assert set(curve["knees_by_degree"]) == {"2", "3", "4", "5", "6"}
    assert curve["knee"] == curve["knees_by_degree"]["3"]
    head_map = json.loads((out / "head_map.json").read_text())
    assert (head_map["num_layers"], head_map["num_heads"]) == (3, 4)
    assert np.asarray(head_map["salience"]).shape == (3, 4)
    assert np.asarray(head_map["cluster"]).shape == (3, 4)
    assert np.asarray(head_map["graph_space"]).shape == (12, 2)
    kept = {int(k): v for k, v in head_map["kept"].items()}
    assert len(head_map["representatives"]) == curve["knee"]
    for layer, head in head_map["representatives"] + head_map["layer_safety_added"]:
        assert head in kept[layer]
    assert all(kept[layer] for layer in range(3))
    for png in ("mss_curve.png", "head_map.png", "layer_retention.png"):
        with Image.open(out / png) as image:
            assert image.format == "PNG" and image.size[0] > 200
    report = json.loads((out / "report.json").read_text())
    s = report["summary"]
    assert s["heads_total"] == 12 and s["heads_kept"] == sum(len(v) for v in kept.values())
    assert s["retention"] == pytest.approx(s["heads_kept"] / 12)
    assert report["dataset"]["label_names"] == ["class0", "class1", "class2"]
    assert report["dataset"]["eval_split"] == "test"
    for key in ("dense", "pruned_before_recovery", "pruned"):
        assert 0 <= report["metrics"][key]["accuracy"] <= 1
    assert report["config"]["seed"] == 7 and report["seed"] == 7
    assert {"signatures", "salience", "recovery", "surgery", "artifacts"} <= set(report["timings_s"])
    assert report["environment"]["versions"]["torch"]
    assert [row["batch_size"] for row in report["speed"]["results"]] == [1, 32]
    # A random head saved with the checkpoint scores near chance: `auto` takes it for untrained and fine-tunes.
    assert report["dense_finetune"]["ran"] is True and "taken for untrained" in report["dense_finetune"]["reason"]
    sel = report["selection"]
    assert sel["perplexity"] == pytest.approx(11 / 3)  # min(10, (N - 1) / 3) for 12 heads
    assert sel["signature_samples"] == 80 and sel["signature_sampling"]["mode"] == "fixed"
    assert sel["signature_sampling"]["stopped"] == "requested" and sel["signature_sampling"]["available"] == 90
    assert sel["calibration_sampling"]["mode"] == "auto" and sel["calibration_sampling"]["samples"] == 90
    assert sel["stability"]["shards"] == 5 and len(sel["stability"]["k_stars"]) == 5
    assert np.asarray(sel["stability"]["kept_frequency"]).shape == (3, 4)
    assert np.asarray(head_map["kept_frequency"]).shape == (3, 4)
    assert "stability" in report["timings_s"]
    assert "signature samples: 80 of 90" in proc.stdout and "stability: mean Jaccard" in proc.stdout
    # The ONNX export is on by default: its parity and onnxruntime timing are in the report.
    onnx = report["export"]["onnx"]
    assert onnx["path"] == "onnx" and {"model.onnx", "config.json", "tokenizer.json"} <= set(onnx["files"])
    assert onnx["parity"]["passed"] and onnx["parity"]["max_abs_diff"] <= 1e-4 <= onnx["parity"]["threshold"]
    assert onnx["parity"]["padding_sides"] == ["right", "left"] and onnx["parity"]["source"] == "data"
    assert s["onnx_max_abs_diff"] == onnx["parity"]["max_abs_diff"] and s["onnx_speedup"] > 0
    assert report["export"]["onnx_int8"] is None and s["int8_accuracy"] is None
    speed = report["export"]["speed"]
    assert speed["baseline"] == "torch_dense" and [row["batch_size"] for row in speed["results"]] == [1, 32]
    for row in speed["results"]:
        assert set(row["latency"]) == {"torch_dense", "torch_pruned", "onnx_dense", "onnx_pruned"}
        assert all(0 < lat["p50_ms"] <= lat["p95_ms"] for lat in row["latency"].values())
    assert "onnxruntime" in (out / "model" / "README.md").read_text()
    # Each directory has its own card: the onnx/ one quotes the graph's parity and scores the graph.
    onnx_card = (out / "onnx" / "README.md").read_text()
    assert onnx_card != (out / "model" / "README.md").read_text()
    assert "variant: onnx" in onnx_card and f"to {onnx['parity']['max_abs_diff']:.1e}" in onnx_card


def test_the_pruned_checkpoint_loads_and_is_smaller(run):
    tmp, out, proc = run
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    pruned = load_pruned(out / "model")
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["cahp"]["kept_heads"] == report["selection"]["kept"]
    counts = count_parameters(pruned)
    assert counts.total == report["parameters"]["pruned"]["total"]
    assert counts.total < report["parameters"]["dense"]["total"]
    assert counts.attention < report["parameters"]["dense"]["attention"]
    assert sum(counts.heads_per_layer) == report["summary"]["heads_kept"]
    ids = torch.randint(5, 30, (2, 9))
    with torch.no_grad():
        assert pruned(input_ids=ids).logits.shape == (2, 3)


@pytest.mark.slow  # a whole `cahp prune` process
def test_the_output_directory_and_everything_in_it_can_be_read_by_a_server(run):
    # A model directory is read by servers running as other users: no part of it may stay private
    # (the staging directory it was written in is created 0700).
    _tmp, out, proc = run
    assert proc.returncode == 0, proc.stderr[-3000:]
    private = [str(p.relative_to(out.parent)) for p in (out, *out.rglob("*"))
               if p.stat().st_mode & (0o055 if p.is_dir() else 0o044) != (0o055 if p.is_dir() else 0o044)]
    assert private == []


@pytest.mark.slow  # a whole `cahp prune` process
def test_json_flag_prints_the_report(tmp_path):
    model = write_model(tmp_path / "model", layers=2, heads=4, num_labels=2)
    data = write_dataset(tmp_path / "data", num_classes=2, n_train=40, n_test=10)
    proc = cahp(str(model), str(data), "-o", str(tmp_path / "out"), "--epochs", "0", "--latency-repeats", "1",
                "--strategy", "salience", "--heads-to-keep", "3", "--signature-samples", "all",
                "--calibration-fraction", "0.25", "--stability-shards", "0", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["selection"]["strategy"] == "salience"
    assert report["summary"]["heads_kept"] == 3
    assert report["selection"]["signature_samples"] == 40 and report["selection"]["calibration_samples"] == 10
    assert report["selection"]["calibration_sampling"]["mode"] == "fixed"
    assert report["selection"]["stability"] is None


@pytest.mark.slow  # a whole `cahp prune` process
def test_name_and_labels_name_the_model_in_its_report_card_and_summary(tmp_path):
    model = write_model(tmp_path / "model", layers=2, heads=4, num_labels=2)
    data = write_dataset(tmp_path / "data", num_classes=2, n_train=40, n_test=10)
    out = tmp_path / "out"
    proc = cahp(str(model), str(data), "-o", str(out), "--epochs", "0", "--latency-repeats", "1",
                "--strategy", "salience", "--heads-to-keep", "3", "--signature-samples", "all",
                "--calibration-fraction", "0.25", "--stability-shards", "0", "--export", "none",
                "--name", "reviews-pruned", "--label", "git/commit=4f2c9e1", "--label", "branch=main", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "  name: reviews-pruned; labels: branch=main git/commit=4f2c9e1" in proc.stdout
    identity = json.loads((out / "report.json").read_text())["identity"]
    assert identity["name"] == "reviews-pruned" and identity["labels"] == {"git/commit": "4f2c9e1", "branch": "main"}
    card = ModelCard.load(out / "model" / "README.md")
    assert card.text.startswith("# reviews-pruned\n")
    assert card.data.to_dict()["model-index"][0]["name"] == "reviews-pruned"
    assert card.data.to_dict()["cahp"]["labels"] == {"git/commit": "4f2c9e1", "branch": "main"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--label", "commit"], "--label: takes KEY=VALUE, got 'commit'"),
        (["--label", "bad key=1"], "label key 'bad key' must be 1 to 63 letters"),
        (["--name", "  "], "--name: must be 1 to 200 characters, got 0"),
    ],
)
def test_a_bad_name_or_label_is_a_usage_error(capsys, flags, message):
    import argparse

    from app.cli.prune import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["prune", "m", "d", "-o", "out", *flags])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_name_and_labels_reach_the_runs_identity():
    import argparse

    from app.cli.prune import identity_from_args, register
    from cahp_engine.errors import InvalidInputError

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    plain = identity_from_args(parser.parse_args(["prune", "m", "d", "-o", "out"]))
    assert (plain.name, plain.labels) == (None, {})
    given = identity_from_args(parser.parse_args(["prune", "m", "d", "-o", "out", "--name", " sst5-minilm ",
                                                  "--label", "k=v=w", "--label", "b=", "--label", "k=2"]))
    assert (given.name, given.labels) == ("sst5-minilm", {"k": "2", "b": ""})
    too_many = [arg for i in range(21) for arg in ("--label", f"k{i}=v")]
    with pytest.raises(InvalidInputError, match="at most 20 labels, got 21"):
        identity_from_args(parser.parse_args(["prune", "m", "d", "-o", "out", *too_many]))


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], {"signature_samples": "auto", "calibration_fraction": "auto", "stability_shards": 5, "perplexity": None}),
        (["--signature-samples", "2000"], {"signature_samples": 2000}),
        (["--signature-samples", "all"], {"signature_samples": "all"}),
        (["--signature-samples", "1.0"], {"signature_samples": 1.0}),
        (["--signature-samples", "0.5", "--calibration-fraction", "0.25"],
         {"signature_samples": 0.5, "calibration_fraction": 0.25}),
        (["--calibration-fraction", "auto", "--stability-shards", "0", "--perplexity", "5"],
         {"calibration_fraction": "auto", "stability_shards": 0, "perplexity": 5.0}),
        ([], {"recovery_loss": "distill", "distill_alpha": 0.5, "distill_temperature": 4.0,
              "max_accuracy_drop": None, "budget_metric": "accuracy", "budget_screen_epochs": 1.0,
              "budget_strategies": ("cahp", "salience"), "budget_confidence": None, "early_stopping_patience": 0,
              "eval_steps": 0, "class_weight": "none"}),
        (["--budget-strategies", "salience,cahp,random", "--budget-confidence", "0.9", "--early-stopping-patience",
          "2", "--eval-steps", "50", "--class-weight", "balanced"],
         {"budget_strategies": ("salience", "cahp", "random"), "budget_confidence": 0.9,
          "early_stopping_patience": 2, "eval_steps": 50, "class_weight": "balanced"}),
        (["--recovery-loss", "ce", "--distill-alpha", "0.25", "--distill-temperature", "2"],
         {"recovery_loss": "ce", "distill_alpha": 0.25, "distill_temperature": 2.0}),
        (["--max-accuracy-drop", "1", "--budget-metric", "macro_f1", "--budget-screen-epochs", "0.5"],
         {"max_accuracy_drop": 1.0, "budget_metric": "macro_f1", "budget_screen_epochs": 0.5}),
    ],
)
def test_sampling_flags_reach_the_config_exactly(flags, expected):
    import argparse

    from app.cli.prune import config_from_args, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    config, _ = config_from_args(parser.parse_args(["prune", "m", "d", "-o", "out", *flags]))
    for name, value in expected.items():
        got = getattr(config, name)
        assert got == value and type(got) is type(value), (name, got)


def test_a_bad_sample_amount_is_a_usage_error(capsys):
    import argparse

    from app.cli.prune import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["prune", "m", "d", "-o", "out", "--signature-samples", "many"])
    assert "expected auto, all, a count like 2000 or a fraction like 0.5, got 'many'" in capsys.readouterr().err


@pytest.mark.slow  # a `cahp prune` process per case
@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing_model", "does not exist"),
        ("missing_column", "column 'sentence'"),
        ("missing_split", "'dev'"),
        ("output_not_empty", "--overwrite"),
        ("unsupported", "not supported"),
        ("bad_degree", "`poly_degree` must be an integer between 1 and 10, got 0"),
        ("too_many_rows", "more than 5 rows, the limit per split"),
        ("negative_budget", "`max_accuracy_drop` must be a number in [0.0, 100.0], got -1.0"),
        ("budget_over_100", "`max_accuracy_drop` must be a number in [0.0, 100.0], got 101.0"),
        ("budget_and_heads", "`max_accuracy_drop` searches for the head count and `heads_to_keep` fixes it"),
        ("budget_strategy", "`budget_strategies` must be a non-empty list of distinct names from cahp, salience"),
        ("too_small_to_carve", "carving needs at least 2 rows of every class"),
        ("target_below_one", "`target_speedup` must be a number in [1.0, 1000.0], got 0.5"),
        ("target_and_heads", "`target_speedup` decides how many heads each layer keeps and `heads_to_keep` fixes"),
        ("target_unreachable", "`target_speedup` 500 is beyond what this model reaches"),
        ("fastest_without_budget", "`budget_objective` 'speed' looks for the fastest model within an accuracy budget"),
        ("fastest_with_target", "`budget_objective` 'speed' searches for the speed target and `target_speedup` fixes"),
        ("fastest_with_heads", "`max_accuracy_drop` searches for the head count and `heads_to_keep` fixes it"),
        ("fastest_finetune", "set `recovery` to 'reconstruct' or 'reconstruct+finetune'"),
    ],
)
def test_bad_input_exits_2_and_leaves_nothing(tmp_path, case, message):
    model = write_model(tmp_path / "model", layers=2, heads=4, num_labels=3)
    data = write_dataset(tmp_path / "data")
    out = tmp_path / "out"
    args = [str(model), str(data), "-o", str(out), "--epochs", "0"]
    if case == "missing_model":
        args[0] = str(tmp_path / "nope")
    elif case == "missing_column":
        args += ["--text-column", "sentence"]
    elif case == "missing_split":
        args += ["--eval-split", "dev"]
    elif case == "output_not_empty":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif case == "unsupported":
        import transformers as tf

        tf.GPT2ForSequenceClassification(tf.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=40)).save_pretrained(
            tmp_path / "gpt2")
        make_tokenizer().save_pretrained(tmp_path / "gpt2")
        args[0] = str(tmp_path / "gpt2")
    elif case == "bad_degree":
        args += ["--poly-degree", "0"]
    elif case == "too_many_rows":
        args += ["--max-dataset-rows", "5"]
    elif case == "negative_budget":
        args += ["--max-accuracy-drop=-1"]
    elif case == "budget_over_100":
        args += ["--max-accuracy-drop", "101"]
    elif case == "budget_and_heads":
        args += ["--max-accuracy-drop", "1", "--heads-to-keep", "4"]
    elif case == "budget_strategy":
        args += ["--max-accuracy-drop", "1", "--budget-strategies", "cahp,topk"]
    elif case.startswith("fastest_"):
        budget = ["--max-accuracy-drop", "1", "--recovery", "reconstruct"]
        args += {"fastest_without_budget": ["--recovery", "reconstruct"],
                 "fastest_with_target": [*budget, "--target-speedup", "2"],
                 "fastest_with_heads": [*budget, "--heads-to-keep", "4"],
                 "fastest_finetune": ["--max-accuracy-drop", "1", "--recovery", "finetune"]}[case] + [
                     "--budget-objective", "speed"]
    elif case.startswith("target_"):
        speedup = {"target_below_one": "0.5", "target_and_heads": "2", "target_unreachable": "500"}[case]
        args += ["--target-speedup", speedup] + (["--heads-to-keep", "4"] if case == "target_and_heads" else [])
    elif case == "too_small_to_carve":
        data = write_dataset(tmp_path / "small", n_train=4, num_classes=3)  # one row of the third class
        args[1] = str(data)
        args += ["--max-accuracy-drop", "1"]
    proc = cahp(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert message in proc.stderr
    if case == "output_not_empty":
        assert [p.name for p in out.iterdir()] == ["keep.txt"]
    else:
        assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


@pytest.mark.slow  # a whole `cahp prune` process per family
@pytest.mark.parametrize(
    "family", ["deberta-v2", "modernbert", "camembert", "data2vec-text", "roberta-prelayernorm", "xlm-roberta-xl"]
)
def test_prune_runs_end_to_end_on_the_newer_encoder_layouts(tmp_path, family):
    model = write_model(tmp_path / "model", family=family, layers=3, heads=4, num_labels=3)
    data = write_dataset(tmp_path / "data")
    out = tmp_path / "out"
    proc = cahp(str(model), str(data), "-o", str(out), "--epochs", "1", "--latency-repeats", "1", "--seed", "3",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["family"] == family
    kept = {int(k): v for k, v in report["selection"]["kept"].items()}
    assert 0 < report["summary"]["heads_kept"] == sum(len(v) for v in kept.values()) < 12
    pruned = load_pruned(out / "model")
    assert type(pruned).__name__.lower().startswith(family.replace("-", ""))
    assert count_parameters(pruned).heads_per_layer == tuple(len(kept[layer]) for layer in range(3))
    assert count_parameters(pruned).total == report["parameters"]["pruned"]["total"]
    # ... and through the ONNX export (on by default), checked against PyTorch with both paddings.
    onnx = report["export"]["onnx"]
    assert (out / "onnx" / "model.onnx").is_file() and onnx["parity"]["passed"]
    assert onnx["parity"]["max_abs_diff"] <= 1e-4 and onnx["parity"]["padding_sides"] == ["right", "left"]
    assert onnx["heads_per_layer"] == [len(kept[layer]) for layer in range(3)]
    ids = torch.randint(5, 30, (2, 9))
    with torch.no_grad():
        assert torch.isfinite(pruned(input_ids=ids, attention_mask=torch.ones_like(ids)).logits).all()


@pytest.mark.slow  # a whole `cahp prune` process
def test_prune_reads_a_dataset_configuration_with_mnli_splits(tmp_path):
    from tests.support.datasets import write_glue_like_dataset

    repository = write_glue_like_dataset(tmp_path / "glue-like")
    model = write_model(tmp_path / "model", layers=2, heads=4, num_labels=3)
    env_cache = tmp_path / "hf-cache"
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", "prune", str(model), str(repository), "--output", str(tmp_path / "out"),
         "--dataset-config", "mnli", "--text-column", "premise", "--text-pair-column", "hypothesis",
         "--epochs", "1", "--latency-repeats", "1", "--export", "none", "--json"],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_DATASETS_CACHE=str(env_cache)),
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["dataset"]["eval_split"] == "validation_matched" and report["dataset"]["format"] == "repository"
    assert report["dataset"]["text_pair_column"] == "hypothesis"
    refused = cahp(str(model), str(repository), "--output", str(tmp_path / "out2"), "--text-column", "premise",
                   cwd=tmp_path)
    assert refused.returncode == 2 and "--dataset-config" in refused.stderr


@pytest.mark.slow  # a whole `cahp prune` process
def test_a_missed_budget_exits_1_and_leaves_the_candidates_report(tmp_path):
    # A dense model whose heads cancel each other's offsets, trained on these rows: no pruned copy is
    # within 0 points.
    model = write_fragile_model(tmp_path / "model", train_rows=150, train_seed=0)
    data = write_dataset(tmp_path / "data", n_train=150)
    out = tmp_path / "out"
    proc = cahp(str(model), str(data), "-o", str(out), "--dense-finetune", "never", "--untrained-dense", "warn",
                "--epochs", "1", "--recovery", "finetune",
                "--max-accuracy-drop", "0", "--budget-metric", "macro_f1", "--stability-shards", "0",
                "--export", "none", "--name", "fragile-pruned", "--label", "git/commit=4f2c9e1", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "failed (accuracy_budget_not_met)" in proc.stderr and f"report and plots are in {out}" in proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "failed" and report["budget"]["chosen"] is None
    assert (out / "mss_curve.png").is_file() and (out / "head_map.png").is_file() and not (out / "model").exists()
    # What the model would have been: the same records as a succeeded report, after the keys such reports had.
    assert list(report)[-4:] == ["validation", "identity", "recipe", "quality"]
    identity = report["identity"]
    assert (identity["name"], identity["labels"], identity["base_model"], identity["dataset"]) == (
        "fragile-pruned", {"git/commit": "4f2c9e1"}, "model", "data")
    assert identity["class_names"] == report["dataset"]["label_names"] and identity["job_id"] is None
    recipe = report["recipe"]
    assert recipe["recovery"] is None and recipe["dense_finetune"] is None and recipe["classifier_head"] == "checkpoint"
    assert (recipe["k_star"], recipe["heads_kept"]) == (report["selection"]["k_star"],
                                                        report["selection"]["heads_kept"])
    assert recipe["max_accuracy_drop"] == 0.0 and recipe["train_rows"] == report["dataset"]["train_rows"]
    quality = report["quality"]
    assert quality["drop_rule"] == "budget" and quality["max_accuracy_drop"] == 0.0
    # The dense model is trained: nothing to flag, and only the dense model is checked.
    assert all(flag["model"] == "dense" for flag in quality["flags"])
    assert FailedRunReport.from_dict(report).to_dict() == report

