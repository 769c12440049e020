"""The model card: metadata a hub reads, and a body a person reads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from cahp_engine.errors import InvalidInputError
from cahp_engine.export import ModelCardInputs, SpeedFigure, build_model_card, write_model_card

FULL = ModelCardInputs(
    family="bert",
    num_layers=3,
    num_heads=4,
    kept_heads=((0, 2), (), (1, 2, 3)),
    base_model="sentence-transformers/all-MiniLM-L6-v2",
    dataset="SetFit/sst5",
    eval_split="test",
    label_names=("very negative", "negative", "neutral", "positive", "very positive"),
    strategy="cahp",
    k_star=5,
    poly_degree=2,
    dense_accuracy=0.5123,
    accuracy_before_recovery=0.31,
    pruned_accuracy=0.5011,
    int8_accuracy=0.4987,
    dense_parameters=22_000_000,
    pruned_parameters=20_000_000,
    speed=(SpeedFigure("PyTorch fp32", "dense", 32, 64, 1000.0, 1.0),
           SpeedFigure("onnxruntime int8", "pruned", 32, 64, 320.0, 3.125)),
    onnx_max_abs_diff=1.2e-7,
    license="apache-2.0",
)
#: What a pruning job knows besides: who asked, with which labels, which release, how, and what went wrong.
JOB = dataclasses.replace(
    FULL, model_name="sst5-minilm-pruned", job_id="0123abcd", labels={"git/commit": "4f2c9e1", "branch": "main"},
    cahp_version="0.1.0", dense_macro_f1=0.18, pruned_macro_f1=0.47, int8_macro_f1=0.46, onnx_accuracy=0.5011,
    onnx_macro_f1=0.47, recall={"dense": (0.0, 0.9, None, 0.8, 0.0), "pruned": (0.1, 0.6, None, 0.7, 0.2)},
    recipe=("classification head: created by cahp for the dataset's classes", "recovery fine-tuning: 3 of 3 epochs"),
    warnings=("the dense model never predicts 'very negative', 'very positive': it predicts 2 of the 4 classes",),
    speed=(SpeedFigure("PyTorch", "dense", 32, 64, 100.0, 1.0, 1.0, 1.0, 95.0, 110.0),
           SpeedFigure("PyTorch", "pruned", 32, 64, 104.0, 0.96, 0.88, 1.05, 96.0, 112.0, current=True),
           SpeedFigure("onnxruntime int8", "pruned", 32, 64, 40.0, 2.5, 2.3, 2.7, 39.0, 42.0)),
)


def test_metadata_names_base_model_dataset_metrics_tags_and_heads() -> None:
    card = build_model_card(FULL)
    data = card.data.to_dict()
    assert data["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert data["datasets"] == ["SetFit/sst5"] and data["license"] == "apache-2.0"
    assert data["pipeline_tag"] == "text-classification" and data["library_name"] == "transformers"
    assert {"cahp", "pruned", "bert"} <= set(data["tags"]) and "onnx" not in data["tags"]
    assert data["cahp"] == {"variant": "pytorch", "base_model": "sentence-transformers/all-MiniLM-L6-v2",
                            "strategy": "cahp", "k_star": 5, "poly_degree": 2, "heads_total": 12, "heads_kept": 5,
                            "kept_heads": {"0": [0, 2], "1": [], "2": [1, 2, 3]}}
    [result] = data["model-index"][0]["results"]
    assert result["metrics"] == [{"type": "accuracy", "value": 0.5011}]
    assert result["dataset"] == {"name": "SetFit/sst5", "type": "SetFit/sst5", "split": "test"}
    # The YAML survives a round trip through the hub's own parser.
    assert ModelCard(str(card)).data.to_dict() == data


def test_body_has_heads_accuracy_parameters_speed_and_loading() -> None:
    text = build_model_card(FULL).text
    assert "keeps **5 of 12 heads** (41.67%)" in text
    assert "k* = 5 clusters of heads (Kneedle polynomial degree 2)" in text
    assert "| 1 | 0 / 4 | none (attention skipped) |" in text and "| 2 | 3 / 4 | 1, 2, 3 |" in text
    for row in ("| dense | 51.23% |", "| pruned, before recovery fine-tuning | 31.00% |", "| pruned | 50.11% |",
                "| pruned, ONNX int8 | 49.87% |"):
        assert row in text
    assert "Parameters: 22,000,000 dense, 20,000,000 pruned (9.09% fewer)." in text
    assert "| onnxruntime int8 | pruned | 32 | 64 | 320.00 | x3.12 |" in text  # measured without an interval
    assert "1.2e-07" in text
    assert 'load_pruned("model")' in text and 'ort.InferenceSession("onnx/model.onnx")' in text
    assert "0 = `very negative`" in text


def test_unknown_facts_are_left_out_and_paths_stay_out_of_the_metadata() -> None:
    card = build_model_card(ModelCardInputs(family="distilbert", num_layers=2, num_heads=2, kept_heads=((1,), (0, 1)),
                                            base_model="/models/my-classifier", dataset="/data/reviews"))
    data = card.data.to_dict()
    assert "base_model" not in data and "datasets" not in data and "model-index" not in data
    assert "## Results" not in card.text and "## Speed" not in card.text and "k*" not in card.text
    assert card.text.startswith("# my-classifier (CAHP-pruned, 3/4 heads)")


def test_inputs_are_checked() -> None:
    with pytest.raises(InvalidInputError, match="must list all 3 layers, got 2"):
        ModelCardInputs(family="bert", num_layers=3, num_heads=4, kept_heads=((0,), (1,)))
    with pytest.raises(InvalidInputError, match=r"head indices in \[0, 4\), got \[4\]"):
        ModelCardInputs(family="bert", num_layers=1, num_heads=4, kept_heads=((4,),))


def test_written_to_every_directory(tmp_path: Path) -> None:
    dirs = [tmp_path / "model", tmp_path / "onnx"]
    for d in dirs:
        d.mkdir()
    card = write_model_card(FULL, dirs)
    assert [(d / "README.md").read_text() for d in dirs] == [str(card), str(card)]


def test_a_jobs_card_says_what_the_model_is_how_it_was_made_and_warns_first() -> None:
    card = build_model_card(JOB)
    data, text = card.data.to_dict(), card.text
    assert text.startswith("# sst5-minilm-pruned\n\n> **Quality warnings**")
    assert "> - the dense model never predicts 'very negative', 'very positive'" in text
    assert data["cahp"]["job_id"] == "0123abcd" and data["cahp"]["labels"] == {"git/commit": "4f2c9e1",
                                                                              "branch": "main"}
    assert data["cahp"]["version"] == "0.1.0" and data["cahp"]["warnings"] == list(JOB.warnings)
    assert data["metrics"] == ["accuracy", "f1"]
    [result] = data["model-index"][0]["results"]
    assert data["model-index"][0]["name"] == "sst5-minilm-pruned"
    assert result["metrics"] == [{"type": "accuracy", "value": 0.5011},
                                 {"type": "f1", "value": 0.47, "name": "macro-F1", "args": {"average": "macro"}}]
    for line in ("- base model: `sentence-transformers/all-MiniLM-L6-v2` "
                 "([hub](https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2))",
                 "- dataset: `SetFit/sst5`, evaluated on its `test` split", "- job: `0123abcd`",
                 "- labels: `branch=main`, `git/commit=4f2c9e1`", "- made by cahp 0.1.0",
                 "## How it was made", "- classification head: created by cahp for the dataset's classes",
                 "| dense | 51.23% | 18.00% |", "| pruned | 50.11% | 47.00% |",
                 "| pruned, ONNX int8 | 49.87% | 46.00% |",
                 "| class | dense | pruned |", "| 0 `very negative` | 0.00% | 10.00% |", "| 2 `neutral` |  |  |"):
        assert line in text, line


def test_a_speed_up_inside_its_noise_reads_no_measurable_change() -> None:
    text = build_model_card(JOB).text
    assert ("| **PyTorch** | **pruned** | 32 | 64 | 104.00 (96.00-112.00) | no measurable change (x0.96, 95 % "
            "interval x0.88-x1.05) |") in text
    assert "| onnxruntime int8 | pruned | 32 | 64 | 40.00 (39.00-42.00) | x2.50 (95 % interval x2.30-x2.70) |" in text
    assert "x0.96 |" not in text  # never shown as a bare slowdown


def test_each_variant_quotes_its_own_graph() -> None:
    onnx = build_model_card(dataclasses.replace(JOB, variant="onnx", parity_max_abs_diff=5.7e-7,
                                                parity_agreement=1.0))
    int8 = build_model_card(dataclasses.replace(JOB, variant="onnx-int8", parity_max_abs_diff=0.021,
                                                parity_agreement=0.983))
    torch_card = build_model_card(dataclasses.replace(JOB, parity_max_abs_diff=0.0))
    assert "The ONNX export reproduces the PyTorch logits to 5.7e-07" in onnx.text
    assert "same class on 100.00% of them" in onnx.text and "0.021" not in onnx.text
    assert "This int8 graph's logits differ from the pruned PyTorch model's by up to 0.021" in int8.text
    assert "same class on 98.30%" in int8.text and "5.7e-07" not in int8.text
    assert "The checkpoint, reloaded, reproduces the pruned model's logits to 0.0e+00" in torch_card.text
    int8_data = int8.data.to_dict()
    assert int8_data["library_name"] == "onnx" and {"onnx", "int8"} <= set(int8_data["tags"])
    [result] = int8_data["model-index"][0]["results"]
    assert result["metrics"][0] == {"type": "accuracy", "value": 0.4987}
    assert result["metrics"][1]["value"] == 0.46
    assert "int8 ONNX graph" in int8.text or "dynamically quantized int8" in int8.text
    with pytest.raises(InvalidInputError, match="`variant` must be one of pytorch, onnx, onnx-int8, got 'tflite'"):
        dataclasses.replace(JOB, variant="tflite")
