"""``cahp export`` on saved pruned checkpoints, in process, with its exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from huggingface_hub import ModelCard
from onnx import numpy_helper

from app.cli import main
from app.cli.export import EXPORT_FORMATS, export_command
from cahp_engine.export import _onnx as export_module
from cahp_engine.models import prune_heads, save_pruned
from tests.support.tiny_models import make_classifier, make_tokenizer, write_dataset


def _checkpoint(directory: Path, family: str) -> Path:
    model = make_classifier(family, layers=3, heads=4)
    prune_heads(model, {0: [0, 2], 1: [], 2: [3]})
    save_pruned(model, make_tokenizer(), directory)
    return directory


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "data", n_train=30, n_test=20)


def test_int8_export_with_data_writes_a_served_directory(tmp_path: Path, data: Path, capsys, monkeypatch) -> None:
    checkpoint = _checkpoint(tmp_path / "pruned", "distilbert")
    out = tmp_path / "served"
    code = main(["export", str(checkpoint), "--format", "onnx-int8", "-o", str(out), "--data", str(data),
                 "--latency-repeats", "1", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)

    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.onnx", "tokenizer.json",
                                                   "tokenizer_config.json"]
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    assert result["format"] == "onnx-int8" and result["heads_per_layer"] == [2, 0, 1]
    assert result["parity"]["source"] == "data" and result["parity"]["max_abs_diff"] <= 1e-4
    assert result["parity"]["samples"] == 20 and result["eval_split"] == "test"
    assert result["onnx"]["path"] == "" and result["int8"]["path"] == str(out.resolve())
    assert result["int8"]["quantized_nodes"] > 0 and result["int8"]["deviation"]["threshold"] is None
    assert set(result["accuracy"]) == {"pytorch", "onnx-int8"}
    assert result["accuracy"]["onnx-int8"]["n"] == 20
    assert {"pytorch", "onnx", "onnx-int8"} == set(result["speed"]["results"][0]["latency"])
    assert result["speed"]["baseline"] == "pytorch"
    graph = onnx.load(str(out / "model.onnx"))
    assert any(n.op_type == "MatMulInteger" for n in graph.graph.node)

    card = ModelCard.load(out / "README.md")
    assert card.data.cahp["kept_heads"] == {"0": [0, 2], "1": [], "2": [3]}
    assert "cahp" in card.data.tags and "onnx" in card.data.tags
    assert "| 1 | 0 / 4 | none (attention skipped) |" in card.text
    # The int8 card quotes the int8 graph's own deviation, not the fp32 graph's parity.
    deviation = result["int8"]["deviation"]["max_abs_diff"]
    assert card.data.cahp["variant"] == "onnx-int8" and "int8" in card.data.tags
    assert f"This int8 graph's logits differ from the pruned PyTorch model's by up to {deviation:.2g}" in card.text
    assert f"{result['parity']['max_abs_diff']:.1e}" not in card.text
    # The card's two loading recipes run as printed.
    cahp_recipe, onnx_recipe = _code_blocks(card.text)
    monkeypatch.chdir(out.parent)
    scope: dict = {}
    exec(onnx_recipe, scope)
    assert scope["logits"].shape == (1, 3)
    scope = {}
    exec(cahp_recipe, scope)
    np.testing.assert_allclose(scope["logits"].detach().numpy(),
                               ort.InferenceSession(str(out / "model.onnx")).run(
                                   ["logits"], _encode(out))[0], atol=0.05)


def _encode(out: Path) -> dict:
    from transformers import AutoTokenizer

    encoded = AutoTokenizer.from_pretrained(out)(["a gripping, beautifully acted film"], return_tensors="np")
    return {k: encoded[k] for k in ("input_ids", "attention_mask")}


def test_fp32_export_without_data_checks_on_generated_ids(tmp_path: Path, capsys) -> None:
    checkpoint = _checkpoint(tmp_path / "pruned", "bert")
    out = tmp_path / "onnx"
    assert main(["export", str(checkpoint), "-o", str(out), "--latency-repeats", "0", "--samples", "8"]) == 0
    summary = capsys.readouterr().out
    assert "parity: max |logit difference|" in summary and "on 8 generated samples" in summary
    assert "latency" not in summary
    session = ort.InferenceSession(str(out / "model.onnx"))
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    card = ModelCard.load(out / "README.md")
    assert card.data.cahp["heads_kept"] == 3 and "## Speed" not in card.text
    # The README's five lines serve it on a machine without torch and without cahp.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    recipe = next(block for block in _code_blocks(readme) if "ort.InferenceSession" in block)
    blocked = "import sys\nfor name in ('torch', 'cahp_engine', 'app'):\n    sys.modules[name] = None\n"
    served = subprocess.run([sys.executable, "-c", blocked + recipe + "\nprint(logits.shape)"], cwd=out.parent,
                            capture_output=True, text=True, timeout=120)
    assert served.returncode == 0, served.stderr[-2000:]
    assert served.stdout.strip() == "(1, 3)"


def test_parity_failure_exits_1_with_its_code_and_writes_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    real_export = export_module._export_graph

    def export_then_perturb(wrapper, example, names, path):
        real_export(wrapper, example, names, path)
        graph = onnx.load(str(path))
        weight = next(i for i in graph.graph.initializer if "classifier" in i.name and len(i.dims) == 2)
        weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) + 0.05, weight.name))
        onnx.save(graph, str(path))

    monkeypatch.setattr(export_module, "_export_graph", export_then_perturb)
    checkpoint = _checkpoint(tmp_path / "pruned", "bert")
    out = tmp_path / "out"
    assert main(["export", str(checkpoint), "-o", str(out), "--latency-repeats", "0"]) == 1
    err = capsys.readouterr().err
    assert "failed (export_parity_failed)" in err and "does not reproduce the PyTorch model" in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_bad_input_exits_2_before_exporting(tmp_path: Path, data: Path, capsys) -> None:
    assert main(["export", str(tmp_path / "missing"), "-o", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    checkpoint = _checkpoint(tmp_path / "pruned", "bert")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("x")
    assert main(["export", str(checkpoint), "-o", str(busy)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    four_classes = write_dataset(tmp_path / "four", n_train=20, n_test=8, num_classes=4)
    assert main(["export", str(checkpoint), "-o", str(tmp_path / "o"), "--data", str(four_classes)]) == 2
    assert "the dataset has 4 classes but the model predicts 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", str(checkpoint), "-o", str(tmp_path / "o"), "--format", "tflite"])


def test_the_cahp_command_has_export() -> None:
    from app.cli import build_parser
    from cahp_engine.export import _from_checkpoint as export_checkpoint

    args = build_parser().parse_args(["export", "pruned", "-o", "out", "--format", "onnx-int8"])
    assert args.func is export_command and args.format == "onnx-int8" and args.data is None
    assert EXPORT_FORMATS == export_checkpoint.EXPORT_FORMATS
