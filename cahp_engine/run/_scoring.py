"""The budget's candidates scored after reconstruction, on demand: a bisection per strategy, not the whole ladder.

:class:`LazyScores` prunes, reconstructs and scores a candidate on the validation split only when the
search asks for it, remembers every score (and hands each to a :class:`ScoreBook`, so a resumed run
does not score it again), and answers the search's one question, :meth:`LazyScores.first`: the fewest
heads of the ladder whose candidate passes a test.

**The assumption.** A strategy's reconstructed score rises, roughly, with the head count (more heads
kept, less removed). :meth:`LazyScores.first` therefore bisects each strategy's ladder on the test
(a pass moves the upper end down, a miss the lower end up) until the fewest passing count is bracketed
between two neighbouring steps of the ladder: about log2(steps + 1) scores a strategy instead of one
per step. The strategies are searched in ``budget_strategies``' order, each below the fewest heads an
earlier one passed at, so a later strategy only looks where it could win.

**Where the score is not monotone.** Validation scores near the threshold are noisy, so a count may miss
where the next smaller one would pass. Once a strategy's bracket closes on a miss at step ``i``, the
step below it (``i - 1``) is scored too; if it passes, the assumption broke there and the bisection
starts again below it (between the largest miss under it and it), with the same look below when it
closes. The upper end only moves down, so this ends; it costs one score a strategy when the scores are
monotone. A dip further from the bracket stays unseen: that is the price of not scoring every step.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from torch import nn

from cahp_engine.models import prune_heads
from cahp_engine.recovery import Reconstruction
from cahp_engine.results import SkippedCandidate, ValidationPoint
from cahp_engine.run._budget import LadderStep
from cahp_engine.run._candidates import CandidateResult, CandidateSpec, SearchInputs
from cahp_engine.run._holdout import ValidationScorer
from cahp_engine.run._reconstruct import calibration_batches, reconstruct_pruned
from cahp_engine.selection import Selection

__all__ = ["Judged", "LazyScores", "ScoreBook", "ScoreKeeping", "Scored", "every_step", "rebuild"]

#: What scoring one candidate gives: its validation point, its predictions there, its reconstruction.
Scored = tuple[ValidationPoint, np.ndarray, Reconstruction | None]


class ScoreBook(Protocol):
    """Where the scores of a search judged after reconstruction are kept for a resumed run.

    ``saved_scores()`` answers what an earlier attempt of the same run recorded (JSON objects);
    ``save_scores(entries)`` replaces the record with ``entries``.
    """

    def saved_scores(self) -> list[dict[str, Any]]: ...

    def save_scores(self, entries: list[dict[str, Any]]) -> None: ...


@dataclass
class Judged:
    """A candidate scored after reconstruction, and its fine-tuning if the search ran one."""

    strategy: str
    k: int
    selection: Selection
    step: int
    point: ValidationPoint
    predictions: np.ndarray
    seconds: float
    meets: bool
    reconstruction: Reconstruction | None = None
    order: int = 0  # its place on the search's path (0: scored first)
    note: str = ""  # why the search scored it
    restored: bool = False  # scored by an earlier attempt of the run
    spec: CandidateSpec | None = None
    last: CandidateResult | None = None
    chosen: bool = False

    def rank(self) -> tuple[bool, float]:
        point = self.point if self.last is None else self.last.best
        return (not point.lost_classes, point.score)

    def to_book(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "k": self.k, "heads": self.selection.num_kept, "step": self.step,
                "point": self.point.to_dict(), "predictions": np.asarray(self.predictions).astype(int).tolist(),
                "seconds": self.seconds, "note": self.note,
                "reconstruction": None if self.reconstruction is None else self.reconstruction.to_dict()}


@dataclass(frozen=True)
class ScoreKeeping:
    """What a run does with the scores of a :class:`LazyScores` as they come.

    Attributes
    ----------
    book : ScoreBook, optional
        Restores an earlier attempt's scores and keeps each new one.
    scored : callable(done, expected), optional
        Progress: candidates scored so far, against the search's expected number (it may run past it).
    """

    book: ScoreBook | None = None
    scored: Callable[[int, int], None] | None = None


class LazyScores:
    """The ladder's candidates, each pruned, reconstructed and scored the first time the search asks.

    Parameters
    ----------
    steps : list of LadderStep
        The ladder, fewest heads first.
    inputs : SearchInputs
    say : callable(str)
        A line per candidate scored (or restored).
    keeping : ScoreKeeping, optional
        Where the scores are kept and their progress heard (default: neither).
    score : callable(strategy, selection) -> Scored, optional
        Scores one candidate (default: prune a copy of the dense model, reconstruct it, score it on the
        validation split); a test may construct the scores.
    """

    def __init__(self, steps: list[LadderStep], inputs: SearchInputs, *, say: Callable[[str], None],
                 keeping: ScoreKeeping | None = None, score: Callable[[str, Selection], Scored] | None = None) -> None:
        keeping = keeping or ScoreKeeping()
        book = keeping.book
        self.steps, self.inputs, self.say, self._scored, self._book = steps, inputs, say, keeping.scored, book
        self._score = score if score is not None else self._reconstruct_and_score
        self.path: list[Judged] = []  # in the order scored: the search's path
        self.misses: dict[tuple[str, int], str] = {}  # (strategy, step) -> why it did not pass the last test
        self._by: dict[tuple[str, int], Judged] = {}
        self._saved: dict[tuple[str, int], Mapping[str, Any]] = {}
        for entry in (book.saved_scores() if book is not None else []):
            self._saved[(str(entry["strategy"]), int(entry["k"]))] = entry
        self._batches: list[Any] | None = None
        self._scorer: ValidationScorer | None = None
        strategies = len(inputs.config.budget_strategies)
        # A bisection and its look below per strategy, and the chosen count's other strategies.
        self.expected = min(sum(len(s.options) for s in steps),
                            strategies * (int(np.ceil(np.log2(len(steps) + 1))) + 1) + strategies)
        self.strategies = tuple(inputs.config.budget_strategies)

    @property
    def fresh(self) -> int:
        """Candidates scored by this attempt (not restored)."""
        return sum(1 for j in self.path if not j.restored)

    def option(self, i: int, strategy: str) -> tuple[str, Selection]:
        """The candidate that stands for ``strategy`` at step ``i``: its own, or the earlier one its heads repeat."""
        step = self.steps[i]
        name = dict(step.same).get(strategy, strategy)
        for option in step.options:
            if option[0] == name:
                return option
        return step.options[0]

    def at(self, i: int, strategy: str, why: str = "") -> Judged:
        """``strategy``'s candidate at step ``i``, scored now if it never was."""
        name, selection = self.option(i, strategy)
        known = self._by.get((name, i))
        if known is not None:
            return known
        saved = self._saved.get((name, self.steps[i].k))
        t0 = time.perf_counter()
        if saved is not None and int(saved["heads"]) == selection.num_kept:
            point = ValidationPoint.from_dict(saved["point"])
            predictions = np.asarray(saved["predictions"], dtype=np.int64)
            rebuilt = None if saved.get("reconstruction") is None else Reconstruction.from_dict(saved["reconstruction"])
            seconds, why, restored = float(saved["seconds"]), str(saved.get("note") or why), True
        else:
            point, predictions, rebuilt = self._score(name, selection)
            seconds, restored = time.perf_counter() - t0, False
        entry = Judged(strategy=name, k=self.steps[i].k, selection=selection, step=i, point=point,
                       predictions=predictions, seconds=seconds, meets=self.inputs.meets(point, predictions),
                       reconstruction=rebuilt, order=len(self.path), note=why, restored=restored)
        self._by[(name, i)] = entry
        self.path.append(entry)
        config = self.inputs.config
        self.say(f"  [{len(self.path)}] {name} at {selection.num_kept} heads: {config.budget_metric} "
                  f"{point.score:.4f} after reconstruction "
                  + ("(scored by an earlier attempt)" if restored else f"({seconds:.1f} s)")
                  + (" - within the budget" if entry.meets else "") + (f"; {why}" if why else ""))
        if self._book is not None and not restored:
            self._book.save_scores([j.to_book() for j in self.path])
        if self._scored is not None:
            self._scored(len(self.path), max(self.expected, len(self.path)))
        return entry

    def group(self, i: int) -> list[Judged]:
        """Every candidate of step ``i``, each strategy's distinct choice, scored."""
        return [self.at(i, name, "another strategy at the chosen head count") for name, _ in self.steps[i].options]

    def first(self, lo: int, hi: int, passes: Callable[[Judged], bool], *, why: str = "") -> int | None:
        """The fewest-heads step in ``(lo, hi)`` (both excluded) where some strategy's candidate passes.

        A bisection per strategy with a look below the closed bracket (the module's docstring); None
        when no strategy passes at any step it scored. ``why`` names the test in each skip's reason.
        """
        answer: int | None = None
        for strategy in self.strategies:
            top = hi if answer is None else answer
            found = self._bisect(strategy, lo, top, passes, why)
            if found is not None:
                answer = found
        return answer

    def _bisect(self, strategy: str, lo: int, hi: int, passes: Callable[[Judged], bool], why: str) -> int | None:
        def test(i: int, note: str) -> bool:
            entry = self.at(i, strategy, note)
            ok = passes(entry)
            if ok:
                self.misses.pop((strategy, i), None)
            else:
                self.misses[(strategy, i)] = (f"{entry.strategy} at {entry.selection.num_kept} heads scored "
                                              f"{entry.point.score:.4f} after reconstruction{why}")
            return ok

        a, b, found = lo, hi, None
        while True:
            while b - a > 1:
                m = (a + b) // 2
                if test(m, f"{strategy}'s bisection between {self._heads(a)} and {self._heads(b)} heads"):
                    b = found = m
                else:
                    a = m
            if a - 1 <= lo or not test(a - 1, f"the step below {strategy}'s miss at {self._heads(a)} heads "
                                              "(in case the score is not monotone there)"):
                return found
            b = found = a - 1  # the score is not monotone here: search again below
            a = max([lo, *(i for (s, i) in self.misses if s == strategy and i < b)])

    def _heads(self, i: int) -> str:
        return "0" if i < 0 else ("all" if i >= len(self.steps) else str(self.steps[i].heads))

    def skipped(self, chosen: int | None) -> tuple[SkippedCandidate, ...]:
        """Every candidate of the ladder the search did not score, with why (``chosen``: the chosen step)."""
        out = []
        for i, step in enumerate(self.steps):
            for name, selection in step.options:
                if (name, i) in self._by:
                    continue
                if chosen is not None and i > chosen:
                    reason = (f"not scored: {self.steps[chosen].heads} heads already met the budget and the search "
                              "looks for the fewest")
                else:
                    above = sorted(j for (s, j) in self.misses if s == name and j > i)
                    reason = ("not scored: " + self.misses[(name, above[0])] + "; the search assumes the score rises "
                              "with the head count, so fewer heads would miss too") if above else (
                        "not scored: below the bracket the fine-tuned candidates closed")
                out.append(SkippedCandidate(strategy=name, k=step.k, heads_kept=selection.num_kept, reason=reason))
        return tuple(out)

    def _reconstruct_and_score(self, strategy: str, selection: Selection) -> Scored:
        inputs, config = self.inputs, self.inputs.config
        if self._batches is None:
            self._batches = calibration_batches(inputs.train, config, inputs.device)
            self._scorer = ValidationScorer(inputs.validation, config.budget_metric, inputs.dense_validation,
                                            config.batch_size, inputs.device)
        assert self._scorer is not None
        model = copy.deepcopy(inputs.dense)
        prune_heads(model, selection.kept)
        model.eval()
        rebuilt = reconstruct_pruned(inputs.dense, model, self._batches, config, should_cancel=inputs.should_cancel)
        point = self._scorer(model, 0, 0.0)
        return point, self._scorer.predictions[-1], rebuilt


def rebuild(selection: Selection, inputs: SearchInputs) -> tuple[nn.Module, Reconstruction]:
    """A candidate's reconstructed model again (the scoring does not keep the models), with its reconstruction."""
    model = copy.deepcopy(inputs.dense)
    prune_heads(model, selection.kept)
    model.eval()
    rebuilt = reconstruct_pruned(inputs.dense, model, calibration_batches(inputs.train, inputs.config, inputs.device),
                                 inputs.config)
    return model, rebuilt


def every_step(steps: Sequence[LadderStep]) -> int:
    """Candidates of the ladder: what scoring all of them would take."""
    return sum(len(step.options) for step in steps)
