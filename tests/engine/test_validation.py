"""One rule in one place: intervals, choices, the device name, the dataset option names."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from cahp_engine._validation import Amount, Device, Interval, OffOr, Options, TupleOf, check, parse_device
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


SAMPLES = Amount(Interval("real", 0.0, 1.0, closed="right"), ("auto", "all"), "a count, a fraction, 'all' or 'auto'",
                 count=Interval("integer", 2, None, closed="left"))
FRACTION = Amount(Interval("real", 0.0, 1.0, closed="right"), ("auto",), "a number in (0.0, 1.0] or 'auto'")


@pytest.mark.parametrize(
    ("rule", "inside", "refused"),
    [
        # A count is judged as a count, another number as a fraction, anything else by the whole rule.
        (SAMPLES, [2, 10**6, 0.5, 1.0, "auto", "all"],
         [(1, "an integer >= 2"), (1.5, "a number in (0.0, 1.0]"), ("some", "a count, a fraction, 'all' or 'auto'"),
          (None, "a count, a fraction, 'all' or 'auto'"), (True, "a count, a fraction, 'all' or 'auto'")]),
        # Without counts an integer is a fraction (1 is every row).
        (FRACTION, [1, 0.25, "auto"], [(0, "a number in (0.0, 1.0]"), ("all", "a number in (0.0, 1.0] or 'auto'")]),
        (OffOr(Interval("integer", 2, 20)), [0, 2, 20],
         [(1, "0 (off) or an integer between 2 and 20"), (21, "0 (off) or an integer between 2 and 20"),
          (False, "0 (off) or an integer between 2 and 20")]),
        (TupleOf(Interval("integer", 1, 10), "a non-empty tuple of degrees"), [(2, 3), [1, 10]],
         [((), "a non-empty tuple of degrees"), ((0,), "a non-empty tuple of degrees"),
          (3, "a non-empty tuple of degrees")]),
        (Device(), ["auto", "cuda:1"], [("tpu", "auto, cpu, cuda or cuda:N")]),
    ],
)
def test_named_rules_accept_their_values_and_say_what_a_refused_one_must_be(rule, inside, refused):
    for value in inside:
        assert value in rule, value
        check("x", value, rule)
    for value, words in refused:
        assert value not in rule and rule.describe(value) == words
        with pytest.raises(ConfigError, match=rf"^`x` must be {re.escape(words)}, got {re.escape(repr(value))}$"):
            check("x", value, rule)


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
