"""The model card: metadata a hub reads, and a body a person reads."""

from __future__ import annotations

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


def test_metadata_names_base_model_dataset_metrics_tags_and_heads() -> None:
    card = build_model_card(FULL)
    data = card.data.to_dict()
    assert data["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert data["datasets"] == ["SetFit/sst5"] and data["license"] == "apache-2.0"
    assert data["pipeline_tag"] == "text-classification" and data["library_name"] == "transformers"
    assert {"cahp", "pruned", "onnx", "bert"} <= set(data["tags"])
    assert data["cahp"] == {"strategy": "cahp", "k_star": 5, "poly_degree": 2, "heads_total": 12, "heads_kept": 5,
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
    assert "| onnxruntime int8 | pruned | 32 | 64 | 320.00 | x3.12 |" in text
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
