import numpy as np
import pytest

from cahp_engine.data import LabelledTexts, collate, draw_subset, encode, encode_labels, length_grouped_batches
from cahp_engine.errors import DatasetError
from tests.support.tiny_models import make_tokenizer


def test_integer_labels_must_be_zero_based_and_contiguous():
    labels, names = encode_labels([0, 2, 1, 2])
    assert labels.tolist() == [0, 2, 1, 2] and names == ("0", "1", "2")
    assert encode_labels([1.0, 0.0])[0].tolist() == [1, 0]
    with pytest.raises(DatasetError, match="0..C-1"):
        encode_labels([1, 2, 3])
    with pytest.raises(DatasetError, match="0..C-1"):
        encode_labels([0, 2])
    with pytest.raises(DatasetError, match="no label"):
        encode_labels([0, None])
    with pytest.raises(DatasetError, match="no rows"):
        encode_labels([])


def test_string_labels_are_mapped_not_rejected():
    labels, names = encode_labels(["pos", "neg", "pos", "neutral"])
    assert names == ("neg", "neutral", "pos") and labels.tolist() == [2, 0, 2, 1]
    labels, names = encode_labels(["b", "a"], label_names=["b", "a"])
    assert labels.tolist() == [0, 1]
    with pytest.raises(DatasetError, match="not among the known labels"):
        encode_labels(["c"], label_names=["a", "b"])


def test_collate_pads_on_the_requested_side():
    tok = make_tokenizer()
    data = encode(tok, LabelledTexts(("good", "very bad movie"), np.array([0, 1]), ("a", "b")), max_length=16)
    right = collate(data, np.array([0, 1]))
    left = collate(data, np.array([0, 1]), padding_side="left")
    assert right["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert left["attention_mask"].tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert right["input_ids"][0, :3].tolist() == left["input_ids"][0, 2:].tolist()
    assert right["labels"].tolist() == [0, 1]


def test_length_grouping_and_subsets():
    lengths = np.array([5, 1, 9, 3, 7, 2])
    batches = length_grouped_batches(lengths, np.arange(6), 2)
    assert [lengths[b].tolist() for b in batches] == [[1, 2], [3, 5], [7, 9]]
    backwards = length_grouped_batches(lengths, np.arange(6), 2, longest_first=True)
    assert [lengths[b].tolist() for b in backwards] == [[7, 9], [3, 5], [1, 2]]
    shuffled = length_grouped_batches(lengths, np.arange(6), 2, shuffle_seed=0)
    assert sorted(np.concatenate(shuffled).tolist()) == list(range(6))
    labels = np.array([0] * 80 + [1] * 20)
    sub = draw_subset(100, 0.25, seed=0, labels=labels)
    assert len(sub) == 25 and (labels[sub] == 1).sum() == 5
    assert draw_subset(100, None, seed=0).tolist() == list(range(100))
    assert len(draw_subset(100, 10, seed=0)) == 10
    with pytest.raises(DatasetError, match="labels"):
        LabelledTexts(("a",), np.array([0, 1]), ("x",))
