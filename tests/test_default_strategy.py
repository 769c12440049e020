"""The product's default head-selection strategy is the one the documentation states: the configuration,
the budget's candidates, the README, docs/method.md, docs/performance.md's study section and the
benchmarks study that decides it all name the same strategy."""

from __future__ import annotations

import re
from pathlib import Path

from cahp_engine._spec import SETTINGS
from cahp_engine.config import PruningConfig
from studies import benchmarks_report

ROOT = Path(__file__).resolve().parents[1]
STATED = re.compile(r"default strategy:?\**\s+`([a-z-]+)`", re.IGNORECASE)


def _stated(path: str) -> set[str]:
    return set(STATED.findall(" ".join((ROOT / path).read_text().split())))


def test_the_default_strategy_is_what_the_docs_state():
    default = PruningConfig().strategy
    assert {s.default for s in SETTINGS if s.name == "strategy"} == {default}
    assert default in PruningConfig().budget_strategies  # a budget always weighs the default's heads
    assert benchmarks_report.DEFAULT == default  # the rule's tie-break and "change the default" read it
    for path in ("README.md", "docs/method.md", "docs/performance.md"):
        assert _stated(path) == {default}, f"{path} states the default strategy as {_stated(path) or 'nothing'}"


def test_the_statement_pattern_reads_what_it_should():
    assert STATED.findall("**Default strategy: `salience`** (") == ["salience"]
    assert STATED.findall("(default strategy:\n`stability-selection`; ...)".replace("\n", " ")) == [
        "stability-selection"]
    assert STATED.findall("the default strategy stays `cahp` (docs/method.md)") == []
