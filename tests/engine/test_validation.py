"""One rule in one place: intervals, choices, the device name, the dataset option names."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cahp_engine._validation import Interval, Options, check, parse_device
from cahp_engine.data import DATASET_OPTION_FIELDS, DatasetOptions
from cahp_engine.errors import ConfigError


@pytest.mark.parametrize(
    ("interval", "text", "inside", "outside"),
    [
        (Interval("integer", 1, 10), "an integer between 1 and 10", [1, 10, np.int64(5)], [0, 11, 2.0, True, None]),
        (Interval("integer", 1, None, closed="left"), "an integer >= 1", [1, 10**9], [0, -1, 1.5]),
        (Interval("real", 0.0, 1.0, closed="right"), "a number in (0.0, 1.0]", [1, 0.5, np.float32(0.1)],
         [0, 0.0, 1.5, float("nan"), "0.5"]),
        (Interval("real", 0, None, closed="neither"), "a number > 0", [1e-12, 5], [0, -1, float("inf"), False]),
        (Interval("real", 0, 1), "a number in [0, 1]", [0, 1, 0.5], [-0.1, 1.1]),
        (Interval("real", None, 0, closed="right"), "a number <= 0", [0, -3.5], [0.1]),
    ],
)
def test_intervals_say_what_they_accept(interval, text, inside, outside):
    assert str(interval) == text
    assert all(v in interval for v in inside)
    assert not any(v in interval for v in outside)


def test_check_messages_and_none():
    with pytest.raises(ConfigError, match=r"^`poly_degree` must be an integer between 1 and 10, got 0$"):
        check("poly_degree", 0, Interval("integer", 1, 10))
    with pytest.raises(ConfigError, match=r"^`mode` must be one of a, b, got 'c'$"):
        check("mode", "c", Options(("a", "b")))
    check("heads_to_keep", None, Interval("integer", 1, None, closed="left"), allow_none=True)
    with pytest.raises(ConfigError):
        check("heads_to_keep", None, Interval("integer", 1, None, closed="left"))


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_names_accepted(name):
    assert parse_device(name) == name


@pytest.mark.parametrize("name", ["tpu", "cuda:", "cuda:x", "CPU", "", None, 0, "cpu:0"])
def test_device_names_refused(name):
    with pytest.raises(ConfigError, match=r"`device` must be auto, cpu, cuda or cuda:N, got"):
        parse_device(name)


def test_dataset_option_fields_come_from_the_dataclass():
    assert DATASET_OPTION_FIELDS == ("text_column", "text_pair_column", "label_column", "train_split", "eval_split",
                                     "config")
    assert DATASET_OPTION_FIELDS == tuple(f.name for f in dataclasses.fields(DatasetOptions))
