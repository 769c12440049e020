"""``dense_finetune: auto`` looks at what a classification head does, not only whether its weights are there."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cahp_engine.config import PruningConfig
from cahp_engine.errors import UntrainedModelError
from cahp_engine.recovery import ClassificationMetrics
from cahp_engine.run import RunHooks, RunRequest, run_pruning
from cahp_engine.run._dense_probe import untrained_in_effect
from tests.support.helpers import write_tiny_dataset
from tests.support.tiny_models import make_classifier, make_tokenizer


def _metrics(confusion: list[list[int]]) -> ClassificationMetrics:
    from cahp_engine.recovery import classification_metrics

    true = np.concatenate([np.full(sum(row), i) for i, row in enumerate(confusion)])
    pred = np.concatenate([np.repeat(np.arange(len(row)), row) for row in confusion])
    return classification_metrics(true, pred, len(confusion))


def test_a_head_near_chance_or_no_better_than_the_largest_class_is_taken_for_untrained() -> None:
    one_class = _metrics([[0, 20, 0, 0, 0]] * 5)  # five balanced classes, always the second: 20 %
    reason = untrained_in_effect(one_class)
    assert reason is not None and "near chance" in reason and "taken for untrained" in reason
    # 90/10 classes: a macro-F1 above chance, and an accuracy no better than always guessing the largest class.
    lazy = _metrics([[85, 5], [5, 5]])
    reason = untrained_in_effect(lazy)
    assert reason is not None and "largest class" in reason and "largest class 90.0%" in reason
    assert untrained_in_effect(_metrics([[17, 2, 1], [2, 16, 2], [1, 2, 17]])) is None


@pytest.mark.slow
def test_auto_fine_tunes_a_saved_random_head_and_says_why(tmp_path: Path) -> None:
    # Saved with its three labels, as from_pretrained(num_labels=3) would: the weights are there, untrained.
    model = tmp_path / "model"
    make_classifier("bert", num_labels=3, layers=2, heads=4, seed=0).save_pretrained(model)
    make_tokenizer().save_pretrained(model)
    data = write_tiny_dataset(tmp_path / "data")
    lines: list[str] = []
    config = PruningConfig(epochs=0.5, dense_epochs=1, batch_size=16, max_length=32, seed=3, device="cpu",
                           latency_warmup=1, latency_repeats=2, strategy="random", heads_to_keep=5, export="none")
    report = run_pruning(RunRequest(model_ref=str(model), dataset_ref=str(data), output_dir=tmp_path / "out",
                                    config=config),
                         RunHooks(log=lines.append))
    assert report.dense_finetune.mode == "auto" and report.dense_finetune.ran
    assert "taken for untrained" in report.dense_finetune.reason
    # The head's placeholder names (LABEL_0...) gave way to the dataset's, as the model card says them.
    saved = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    assert saved["id2label"] == {str(i): name for i, name in enumerate(report.dataset.label_names)}
    text = "\n".join(lines)
    assert "dense model as loaded: accuracy" in text and "dense fine-tuning (its classification head" in text

    # The same model with dense fine-tuning off fails at the dense evaluation, saying what to set.
    off = PruningConfig(**{**config.to_dict(), "dense_finetune": "never"})
    lines.clear()
    with pytest.raises(UntrainedModelError, match="set `dense_finetune=always`") as refused:
        run_pruning(RunRequest(model_ref=str(model), dataset_ref=str(data), output_dir=tmp_path / "never", config=off),
                    RunHooks(log=lines.append))
    assert refused.value.code == "untrained_model" and "near chance" in str(refused.value)
    assert "selecting heads" not in "\n".join(lines)  # before the selection's cost
    assert not (tmp_path / "never").exists()
    # Asked to go on anyway, it prunes it and flags the dense model as near chance.
    warned = run_pruning(RunRequest(model_ref=str(model), dataset_ref=str(data), output_dir=tmp_path / "warned",
                                    config=PruningConfig(**{**off.to_dict(), "untrained_dense": "warn"})))
    flag = next(f for f in warned.quality.flags if f.model == "dense" and f.kind == "near_chance")
    assert "`dense_finetune=always`" in flag.message
