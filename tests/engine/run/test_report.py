"""The typed run report: report.json both ways, and a summary a schema can be generated from."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from cahp_engine.config import PruningConfig
from cahp_engine.recovery import ClassificationMetrics, TeacherRecord, TrainingResult
from cahp_engine.results import ValidationPoint
from cahp_engine.run import RunReport, RunRequest, RunSummary, run_pruning
from tests.engine.golden.make_golden import HERE, write_inputs


def test_a_report_json_reads_back_to_the_same_dict_keys_in_order():
    text = (HERE / "report.json").read_text()
    report = RunReport.from_dict(json.loads(text))
    assert json.dumps(report.to_dict(), indent=2) + "\n" == text
    assert report.summary.k_star == report.selection.k_star and report.selection.kept[0] == (2,)
    assert report.config == PruningConfig.from_dict(json.loads(text)["config"])
    assert isinstance(report.metrics.dense, ClassificationMetrics)
    assert report.dense_finetune.training is not None and report.dense_finetune.training.steps > 0
    assert report.selection.knees_by_degree == {2: 4, 3: 4, 4: 4, 5: 4, 6: 4}
    assert report.speed.results[1].batch_size == 32 and report.summary.speedup == report.speed.results[1].speedup


def test_reading_refuses_unknown_and_missing_keys():
    data = json.loads((HERE / "report.json").read_text())
    with pytest.raises(ValueError, match=r"unknown keys \['extra'\]"):
        RunReport.from_dict({**data, "summary": {**data["summary"], "extra": 1}})
    with pytest.raises(ValueError, match=r"missing keys \['seed'\]"):
        RunReport.from_dict({k: v for k, v in data.items() if k != "seed"})


def test_the_summary_generates_a_schema():
    schema = TypeAdapter(RunSummary).json_schema()
    assert list(schema["properties"]) == [f.name for f in dataclasses.fields(RunSummary)]
    # The ONNX and int8 figures came later and default to None (a report without them still reads).
    required = {f.name for f in dataclasses.fields(RunSummary) if f.default is dataclasses.MISSING}
    assert set(schema["required"]) == required and "onnx_speedup" not in required
    assert schema["properties"]["k_star"]["type"] == "integer"
    assert {"type": "null"} in schema["properties"]["speedup"]["anyOf"]
    assert RunSummary.__doc__ is not None and "speedup : float or None" in RunSummary.__doc__


def test_training_result_keeps_its_dict_form():
    result = TrainingResult(steps=2, epochs=1.0, loss_per_epoch=(0.5,), wall_s=0.1, seconds_per_epoch=(0.1,),
                            device="cpu", precision="fp32")
    assert result.to_dict() == {"steps": 2, "epochs": 1.0, "loss_per_epoch": [0.5], "wall_s": 0.1,
                                "seconds_per_epoch": [0.1], "device": "cpu", "precision": "fp32", "loss": "ce",
                                "alpha": None, "temperature": None, "teacher": None, "class_weights": None,
                                "validation": [], "best_step": None, "best_epoch": None, "stopped_early": False,
                                "early_stopping_patience": 0}
    assert TrainingResult.from_dict(result.to_dict()) == result
    # A report written before the loss, or the validation curve, was recorded reads back as cross-entropy
    # on the paper's fixed epochs.
    later = ("loss", "alpha", "temperature", "teacher", "class_weights", "validation", "best_step", "best_epoch",
             "stopped_early", "early_stopping_patience")
    old = {k: v for k, v in result.to_dict().items() if k not in later}
    assert TrainingResult.from_dict(old) == result
    watched = dataclasses.replace(result, validation=(ValidationPoint(step=0, epoch=0.0, score=0.5, accuracy=0.5,
                                                                      macro_f1=0.4, lost_classes=(2,)),),
                                  best_step=0, best_epoch=0.0, early_stopping_patience=1, class_weights=(1.0, 2.0))
    assert TrainingResult.from_dict(json.loads(json.dumps(watched.to_dict()))) == watched
    distilled = dataclasses.replace(result, loss="distill", alpha=0.5, temperature=4.0,
                                    teacher=TeacherRecord(passes=1, rows=60, seconds=0.2))
    assert TrainingResult.from_dict(distilled.to_dict()) == distilled


@pytest.mark.slow
def test_run_pruning_returns_the_report_it_writes(tmp_path: Path):
    model, data = write_inputs(tmp_path)
    config = PruningConfig(epochs=0.25, dense_finetune="never", untrained_dense="warn", batch_size=16, max_length=32,
                           seed=3, device="cpu",
                           latency_warmup=0, latency_repeats=1, strategy="random", heads_to_keep=5)
    report = run_pruning(RunRequest(model_ref=str(model), dataset_ref=str(data), output_dir=tmp_path / "out",
                                    config=config))
    assert isinstance(report, RunReport)
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert RunReport.from_dict(written) == report
    golden = json.loads((HERE / "report.json").read_text())
    assert list(written) == list(golden)
    sections = [k for k, v in golden.items() if isinstance(v, dict) and k != "timings_s"]  # no dense stage here
    assert all(list(written[k]) == list(golden[k]) for k in sections)
    assert report.dataset.source == str(data.resolve()) and report.model.ref == str(model)
    assert (report.selection.strategy, report.summary.heads_kept, report.selection.knee_found) == ("random", 5, None)
    assert report.wall_time_s >= sum(report.timings_s.values()) > 0
