"""ONNX export, parity, int8 quantization and onnxruntime timing on tiny random models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from transformers import AutoTokenizer

from cahp_engine.data import LabelledTexts, collate, encode
from cahp_engine.errors import ConfigError, ExportParityError, PipelineError
from cahp_engine.export import (
    OPSET,
    check_parity,
    compare_runtimes,
    evaluate_onnx,
    export_onnx,
    generated_rows,
    onnx_input_names,
    onnx_session,
    quantize_int8,
    run_logits,
    run_logits_rowwise,
)
from cahp_engine.models import prune_heads
from cahp_engine.recovery import evaluate
from tests.support.tiny_models import FAMILIES, make_classifier, make_config, make_texts, make_tokenizer

# Uneven heads per layer, and layer 1 without any.
KEPT = {0: [1, 3], 1: [], 2: [0, 1, 2]}


def _pruned(family: str = "bert", **kwargs) -> torch.nn.Module:
    model = make_classifier(family, layers=3, heads=4, **kwargs)
    # The default init (std 0.02) gives nearly constant logits: removing 7 of the 12 heads moves them by
    # about 1e-4, so a 1e-4 parity check could not tell a wrong graph from a right one. Wider weights
    # (and drawn biases) move them by about 1, as in the surgery tests.
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2 or name.endswith(".bias"):
                parameter.normal_(0.0, 0.2, generator=generator)
    prune_heads(model, KEPT)
    return model.eval()


def _rows(n: int = 24, seed: int = 3):
    texts, labels = make_texts(n, seed=seed)
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)


def _logits(model: torch.nn.Module, batch: dict, names) -> np.ndarray:
    with torch.no_grad():
        return model(**{k: batch[k] for k in names}).logits.numpy()


@pytest.fixture(scope="module")
def bert_export(tmp_path_factory):
    """A pruned BERT exported once, with the rows its parity was checked on."""
    model, rows = _pruned("bert"), _rows()
    directory = tmp_path_factory.mktemp("bert") / "onnx"
    return model, rows, directory, export_onnx(model, make_tokenizer(), directory, data=rows)


@pytest.mark.slow  # an ONNX export and onnxruntime sessions per family
@pytest.mark.parametrize("family", FAMILIES)
def test_pruned_export_reproduces_pytorch_with_left_and_right_padding(family: str, tmp_path: Path) -> None:
    model, rows = _pruned(family), _rows()
    result = export_onnx(model, make_tokenizer(), tmp_path / "onnx", data=rows)

    assert result.parity is not None and result.parity.passed
    assert result.parity.max_abs_diff <= 1e-4 and result.parity.threshold == 1e-4
    assert result.parity.source == "data" and result.parity.samples == len(rows)
    assert result.parity.padding_sides == ("right", "left")
    assert result.heads_per_layer == (2, 0, 3) and result.opset == OPSET
    assert {"model.onnx", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(result.files)
    config = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert config["cahp"]["kept_heads"] == {"0": [1, 3], "1": [], "2": [0, 1, 2]}

    # What a deployer does: a default session, the tokenizer saved beside it.
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"))
    # token_type_ids only where the model has more than one token type, as Optimum exports them.
    takes_types = family != "distilbert" and int(getattr(model.config, "type_vocab_size", 0) or 0) > 1
    expected_inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if takes_types else [])
    assert [i.name for i in session.get_inputs()] == expected_inputs
    assert all(i.shape == ["batch_size", "sequence_length"] and i.type == "tensor(int64)"
               for i in session.get_inputs())
    assert [o.name for o in session.get_outputs()] == ["logits"]
    assert session.get_outputs()[0].shape == ["batch_size", 3]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "onnx")
    encoded = tokenizer(["good film", "a very dull and boring plot"], padding=True, return_tensors="np")
    feed = {name: encoded[name] for name in expected_inputs}
    got = session.run(["logits"], feed)[0]
    np.testing.assert_allclose(got, _logits(model, {k: torch.from_numpy(v) for k, v in feed.items()},
                                            expected_inputs), atol=1e-4)
    # Left padding changes every position of the shorter rows; the graph must follow it.
    left = collate(rows, np.arange(8), padding_side="left")
    assert (left["attention_mask"][:, 0] == 0).any()
    np.testing.assert_allclose(run_logits(session, left), _logits(model, left, expected_inputs), atol=1e-4)


@pytest.mark.slow  # an ONNX export of DeBERTa
def test_deberta_with_its_own_position_projections_exports(tmp_path: Path) -> None:
    # share_att_key=False: pos_key_proj/pos_query_proj lose the same heads as q/k/v; with absolute
    # positions added to the input and the convolution after the first layer (the surgery tests' layout).
    model = _pruned("deberta-v2", share_att_key=False, pos_att_type="p2c|c2p", position_biased_input=True,
                    conv_kernel_size=3, position_buckets=-1, max_relative_positions=16, norm_rel_ebd="none")
    attention = model.deberta.encoder.layer[0].attention.self
    assert attention.pos_key_proj.out_features == attention.pos_query_proj.out_features == 2 * 8
    result = export_onnx(model, make_tokenizer(), tmp_path / "onnx", data=_rows())
    assert result.parity is not None and result.parity.passed and result.parity.max_abs_diff <= 1e-4
    assert result.parity.padding_sides == ("right", "left") and result.heads_per_layer == (2, 0, 3)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_modernbert_exports_with_either_pooling_when_its_sliding_layer_keeps_heads(pooling: str,
                                                                                   tmp_path: Path) -> None:
    # The config of a default ModernBERT classifier, scaled down: layer 1 attends in a window of 8
    # tokens each side. Under left padding, position 0 of a short row is padding whose whole window is
    # padding: PyTorch's sdpa answers it with zeros, and "cls" pooling reads exactly that position.
    model = make_classifier("modernbert", layers=3, heads=4, head_dim=16, local_attention=16,
                            global_attn_every_n_layers=2, classifier_pooling=pooling)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2 or name.endswith(".bias"):
                parameter.normal_(0.0, 0.2, generator=generator)
    prune_heads(model, {0: [1, 3], 1: [0, 2], 2: [0, 1, 2]})
    texts, labels = make_texts(32, seed=3, max_len=40)
    rows = encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=64)
    left = collate(rows, np.arange(16), padding_side="left")
    assert ((left["attention_mask"] == 0).sum(dim=1) > 8).any()  # some row's first window is all padding

    result = export_onnx(model, make_tokenizer(), tmp_path / "onnx", data=rows)

    assert result.parity is not None and result.parity.passed and result.parity.max_abs_diff <= 1e-4
    assert result.heads_per_layer == (2, 2, 3)
    session = onnx_session(tmp_path / "onnx")
    np.testing.assert_allclose(run_logits(session, left), _logits(model, left, ("input_ids", "attention_mask")),
                               atol=1e-4)
    assert model.config._attn_implementation == "sdpa"  # the model is left as it was given


def test_inputs_follow_what_the_model_can_use(tmp_path: Path) -> None:
    assert onnx_input_names(_pruned("bert")) == ("input_ids", "attention_mask", "token_type_ids")
    assert onnx_input_names(_pruned("distilbert")) == ("input_ids", "attention_mask")
    # A real RoBERTa has one token type: the input is left out, as its tokenizer returns none.
    config = make_config("roberta", layers=3)
    config.type_vocab_size = 1
    torch.manual_seed(0)
    from transformers import AutoModelForSequenceClassification

    roberta = AutoModelForSequenceClassification.from_config(config).eval()
    prune_heads(roberta, KEPT)
    result = export_onnx(roberta, make_tokenizer(), tmp_path / "roberta", data=_rows())
    assert result.inputs == ("input_ids", "attention_mask")
    assert result.parity is not None and result.parity.max_abs_diff <= 1e-4


def test_parity_without_data_uses_generated_ids_with_two_token_types(bert_export) -> None:
    model, _rows_, directory, _ = bert_export
    parity = check_parity(model, directory, samples=20, seed=5)
    assert parity.source == "generated" and parity.samples == 20 and parity.passed
    rows = generated_rows(model.config, 20, seed=5, token_types=True)
    assert all(0 in t and 1 in t for t in rows.token_type_ids) and rows.lengths.min() >= 2
    assert all(0 not in ids for ids in rows.input_ids)  # no pad (or other special) ids inside a row


def test_a_perturbed_graph_fails_parity_with_its_code(bert_export, tmp_path: Path) -> None:
    model, rows, directory, _ = bert_export
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    graph = onnx.load(str(broken / "model.onnx"))
    weight = next(i for i in graph.graph.initializer if "classifier" in i.name and len(i.dims) == 2)
    values = numpy_helper.to_array(weight).copy()
    values[0, 0] += 0.05
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save(graph, str(broken / "model.onnx"))

    with pytest.raises(ExportParityError) as caught:
        check_parity(model, broken, data=rows)
    assert caught.value.code == "export_parity_failed"
    assert isinstance(caught.value, PipelineError)
    assert caught.value.parity.max_abs_diff > 1e-4 and not caught.value.parity.passed
    assert "threshold 0.0001" in str(caught.value)
    measured = check_parity(model, broken, data=rows, threshold=None)
    assert measured.passed and measured.threshold is None and measured.max_abs_diff > 1e-4


def test_parity_leaves_the_model_as_it_was_and_checks_its_arguments(bert_export) -> None:
    model, rows, directory, _ = bert_export
    model.train()
    try:
        check_parity(model, directory, data=rows, samples=4)
        assert model.training
    finally:
        model.eval()
    with pytest.raises(ConfigError, match="`threshold` must be a number > 0"):
        check_parity(model, directory, threshold=0)
    with pytest.raises(ConfigError, match="`samples` must be an integer >= 1"):
        check_parity(model, directory, samples=0)


def test_int8_quantizes_every_weight_product_and_reports(bert_export, tmp_path: Path) -> None:
    model, rows, directory, _ = bert_export
    result = quantize_int8(directory, tmp_path / "onnx-int8", model=model, parity_data=rows, eval_data=rows)

    graph = onnx.load(str(tmp_path / "onnx-int8" / "model.onnx"))
    assert result.quantized_nodes == sum(n.op_type == "MatMulInteger" for n in graph.graph.node) > 0
    assert result.size_bytes < result.fp32_size_bytes
    assert {"model.onnx", "config.json", "tokenizer.json"} <= set(result.files)
    assert result.deviation is not None and result.deviation.threshold is None
    assert result.deviation.samples == len(rows) and 0 <= result.deviation.prediction_agreement <= 1
    assert result.accuracy is not None and result.accuracy.n == len(rows)
    assert result.accuracy == evaluate_onnx(tmp_path / "onnx-int8", rows)
    json.dumps(result.to_dict())


def test_onnx_accuracy_matches_pytorch(bert_export) -> None:
    model, rows, directory, _ = bert_export
    assert evaluate_onnx(directory, rows) == evaluate(model, rows)


def test_runtimes_are_timed_together_against_a_baseline(bert_export, tmp_path: Path) -> None:
    pruned, rows, directory, _ = bert_export
    dense = make_classifier("bert", layers=3, heads=4)
    export_onnx(dense, None, tmp_path / "dense", check=False)
    speed = compare_runtimes({"onnx_dense": tmp_path / "dense", "onnx_pruned": directory},
                             torch_models={"torch_dense": dense, "torch_pruned": pruned},
                             batch_sizes=(1, 2), seq_len=8, warmup=0, repeats=2)
    assert speed.baseline == "torch_dense" and speed.device == "cpu" and speed.threads >= 1
    assert speed.runtimes["onnx_pruned"].startswith("onnxruntime ")
    assert speed.runtimes["torch_dense"].startswith("torch ")
    assert [r.batch_size for r in speed.results] == [1, 2]
    for row in speed.results:
        assert set(row.latency) == {"onnx_dense", "onnx_pruned", "torch_dense", "torch_pruned"}
        assert row.speedup["torch_dense"] == 1.0
        assert all(lat.repeats == 2 and lat.seq_len == 8 for lat in row.latency.values())
    json.dumps(speed.to_dict())
    with pytest.raises(ConfigError, match="`baseline` must be one of"):
        compare_runtimes({"a": directory}, baseline="b")


def test_an_export_that_cannot_run_is_reported_as_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"not a graph")
    from cahp_engine.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="onnxruntime cannot load"):
        onnx_session(tmp_path)


def test_static_int8_gives_a_row_the_same_class_alone_and_inside_a_padded_batch_of_200(bert_export,
                                                                                       tmp_path: Path) -> None:
    model, _, directory, _ = bert_export
    rows = _rows(200, seed=5)
    result = quantize_int8(directory, tmp_path / "onnx-int8", model=model, parity_data=rows, eval_data=rows,
                           per_channel=True, calibration_data=_rows(64, seed=9))
    graph = onnx.load(str(tmp_path / "onnx-int8" / "model.onnx"))
    assert any(n.op_type == "QuantizeLinear" for n in graph.graph.node) and result.quantized_nodes > 0
    assert not any(n.op_type in ("DynamicQuantizeLinear", "MatMulInteger") for n in graph.graph.node)
    session = onnx_session(tmp_path / "onnx-int8")
    # All 200 rows padded to the longest, and each row alone: the same class for every row.
    together = run_logits(session, collate(rows, np.arange(len(rows))))
    alone = np.concatenate([run_logits(session, collate(rows, np.array([i]))) for i in range(len(rows))])
    assert (together.argmax(axis=-1) == alone.argmax(axis=-1)).all()
    np.testing.assert_allclose(together, alone, atol=1e-4)


def test_dynamic_int8_run_a_row_at_a_time_gives_a_row_the_same_class_alone_and_inside_a_padded_batch_of_200(
    bert_export, tmp_path: Path
) -> None:
    model, _, directory, _ = bert_export
    rows = _rows(200, seed=5)
    quantize_int8(directory, tmp_path / "onnx-int8", per_channel=True)
    graph = onnx.load(str(tmp_path / "onnx-int8" / "model.onnx"))
    assert any(n.op_type == "DynamicQuantizeLinear" for n in graph.graph.node)  # scales from the input
    session = onnx_session(tmp_path / "onnx-int8")
    together = run_logits_rowwise(session, collate(rows, np.arange(len(rows))))  # padded to the longest
    alone = np.concatenate([run_logits_rowwise(session, collate(rows, np.array([i]))) for i in range(len(rows))])
    np.testing.assert_array_equal(together, alone)
    # Left padding too: each row keeps the positions its mask marks.
    batch = collate(rows, np.arange(8))
    mask = np.asarray(batch["attention_mask"])
    flipped = {k: np.stack([np.roll(np.asarray(v)[i], -int(mask[i].sum())) for i in range(8)])
               for k, v in batch.items() if k != "labels"}
    np.testing.assert_array_equal(run_logits_rowwise(session, flipped), together[:8])
