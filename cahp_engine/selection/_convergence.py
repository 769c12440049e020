"""Sampling with a stopping rule: the signature and calibration passes read training samples in a
seeded stratified order and stop once what they estimate is mostly signal, not sampling noise.

Both passes read the rows of a :class:`~cahp_engine.selection._sampling.SampleOrder` in chunks. With an explicit
amount they read exactly that many rows. With ``"auto"`` they look at a ladder of row counts (its
rungs: the first once every class has its floor of samples, then x :data:`GROWTH` each time, the last at
every row: the cap) and stop at the first rung where the noise share of what they measure is small:

* **signatures**: :func:`class_difference_noise`, the share of the measured squared class-mean
  differences (summed over heads, class pairs and pixels, each in units of the pooled variance, as
  Eq. 1 weighs them) that sampling noise alone would produce; stop at <= :data:`SIGNATURE_NOISE`.
  Classes that the attention maps do not tell apart keep it near 1, so the pass reads every row;
* **calibration**: :func:`salience_noise`, the share of the between-head variance of the mean
  salience that is sampling noise (one minus its reliability), from the batch-to-batch spread of each
  head's score; stop at <= :data:`SALIENCE_NOISE`.

Either pass also stops on a **plateau** (:func:`is_plateau`): once a signal has shown (the noise
share was at most :data:`PLATEAU_ONSET` two rungs ago) and the share fell by less than
:data:`PLATEAU_GAIN` of itself since (while the rows read grew x2.25). With a fixed signal and sampling
noise alone the share is 1 / (1 + n / n0), whose fall over two rungs from a share of 0.8 or less
is 20 % or more: a smaller fall means it stopped following 1 / n (a floor), and more rows buy little.
A share still near 1 is not a plateau: there the signal may not have emerged yet (all-MiniLM-L6-v2
with a new head on SST-5 read 1.0, 1.0, 0.97 at 512, 768 and 1,152 rows, then 0.65 at 1,728).

``docs/method.md`` gives the measurements behind the thresholds.

References
----------
The squared-difference bias E[(m1 - m2)^2] = (mu1 - mu2)^2
+ s1^2/n1 + s2^2/n2 of two sample means; the reliability coefficient of a mean over repeated measures.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from cahp_engine.data import TrainRows, iterate_batches, length_grouped_batches, take_rows
from cahp_engine.errors import PipelineError
from cahp_engine.progress import Monitor
from cahp_engine.selection._records import SamplingRecord
from cahp_engine.selection._salience import HeadImportance
from cahp_engine.selection._sampling import SampleOrder, class_floor_size, ladder_sizes
from cahp_engine.selection._signatures import ShardedSignatures, SignatureProfiler, Signatures

#: Each rung reads this many times the samples of the one before.
GROWTH = 1.5
#: Signatures: no stop before every class has this many samples (or all of its rows), nor before
#: :data:`SIGNATURE_FIRST` samples in all.
SIGNATURE_CLASS_FLOOR = 32
SIGNATURE_FIRST = 512
#: Calibration: the same for the salience pass.
CALIBRATION_CLASS_FLOOR = 16
CALIBRATION_FIRST = 256
#: Stop the signature pass when at most this share of the measured class differences is noise
#: (signal-to-noise ratio >= 4).
SIGNATURE_NOISE = 0.2
#: Stop the calibration pass when at most this share of the salience differences between heads is
#: noise (reliability >= 0.9).
SALIENCE_NOISE = 0.1
#: Stop either pass when its noise share fell by less than this share of itself over the last two
#: rungs (the rows read x2.25), once it was at most :data:`PLATEAU_ONSET` at the first of them.
#: A share 1 / (1 + n / n0) (fixed signal, sampling noise alone) falls by 1.25a / (1 + 2.25a) there,
#: a = n / n0: at least 0.2 from a share of 0.8 (a = 0.25) down, 0.56 when mostly signal.
PLATEAU_GAIN = 0.2
#: A plateau counts only from a noise share this low: a fifth of the measured differences is signal.
#: Paired with :data:`PLATEAU_GAIN` so that the 1 / (1 + n / n0) curve itself is never taken for one.
PLATEAU_ONSET = 0.8
#: Rows read (and tokenised) at a time, at most.
CHUNK_ROWS = 2048


def plan(order: SampleOrder, labels: np.ndarray, amount: int | None, *, floor: int, first: int) -> list[int]:
    """The sample counts at which a pass looks: ``[amount]`` when fixed, else the ladder."""
    n = len(order)
    if amount is not None:
        return [amount]
    start = max(first, class_floor_size(labels, order, floor))
    return ladder_sizes(n, first=start, growth=GROWTH)


def class_difference_noise(signatures: Signatures, *, var_floor: float) -> float:
    """Share of the measured squared class-mean differences that sampling noise accounts for.

    Parameters
    ----------
    signatures : Signatures
        Means and (population) variances of shape (C, N, B * B) and the counts n_c.
    var_floor : float
        Floor on the unbiased variances, as before Eq. 1.

    Returns
    -------
    float
        ``sum v / sum d^2`` over heads, class pairs (i, j) and pixels, where ``d^2 = (m_i - m_j)^2
        / (s_i + s_j)`` is the measured squared difference in units of the pooled variance and
        ``v = (s_i / n_i + s_j / n_j) / (s_i + s_j)`` its expected value when the classes do not
        differ. About 1 for classes the maps do not tell apart; it falls as 1 / n when they differ.
        1.0 when a class has fewer than two samples.

    References
    ----------
    Paper Eq. 1 (the mean term of the Bhattacharyya distance weighs differences by the pooled
    variance); E[(m_i - m_j)^2] = (mu_i - mu_j)^2 + s_i / n_i + s_j / n_j.
    """
    n = signatures.counts.astype(np.float64)
    if (n < 2).any():
        return 1.0
    unbiased = np.maximum(signatures.var * (n / (n - 1)).reshape(-1, 1, 1), var_floor)
    noise = 0.0
    measured = 0.0
    for i, j in itertools.combinations(range(n.size), 2):
        pooled = unbiased[i] + unbiased[j]
        noise += float(((unbiased[i] / n[i] + unbiased[j] / n[j]) / pooled).sum())
        measured += float(((signatures.mean[i] - signatures.mean[j]) ** 2 / pooled).sum())
    return 1.0 if measured <= 0 else min(1.0, noise / measured)


def salience_noise(sums: np.ndarray, squares: np.ndarray, batches: int) -> float:
    """Share of the between-head variance of the mean salience that is sampling noise.

    Parameters
    ----------
    sums, squares : ndarray of shape (L, H)
        Sum over the batches of each head's per-batch score, and of its square.
    batches : int
        m, the number of batches.

    Returns
    -------
    float
        ``mean_h(s_h^2 / m) / var_h(mean_h)``: the mean squared standard error of the heads' mean
        scores over the variance of those means across heads (one minus the reliability of the
        ranking; the Spearman correlation of two independent calibrations is about one minus twice
        this). 1.0 with fewer than two batches or when every head scores the same.
    """
    if batches < 2:
        return 1.0
    mean = sums / batches
    spread = np.maximum(squares / batches - mean * mean, 0.0) * batches / (batches - 1)
    between = float(mean.var())
    return 1.0 if between <= 0 else min(1.0, float((spread / batches).mean()) / between)


def is_plateau(measures: Sequence[float], *, min_gain: float | None = PLATEAU_GAIN,
               onset: float = PLATEAU_ONSET) -> bool:
    """Whether a noise share stopped improving after a signal showed: it was at most ``onset`` two
    rungs ago and fell by less than ``min_gain`` of itself since.

    Parameters
    ----------
    measures : sequence of float
        The noise share at each rung so far, in order (each rung reads x1.5 the rows of the one
        before).
    min_gain : float or None
        The smallest relative fall ``(m[-3] - m[-1]) / m[-3]`` that is not a plateau; None turns the
        rule off.
    onset : float
        A share above it at ``m[-3]`` is not a plateau, however flat: the signal may not have
        emerged from the noise yet.

    Returns
    -------
    bool
        False with fewer than three measures (two steps are needed to tell a plateau from one noisy
        step) or when ``min_gain`` is None. A share that rose counts as a plateau.
    """
    if min_gain is None or len(measures) < 3 or not 0 < measures[-3] <= onset:
        return False
    return (measures[-3] - measures[-1]) / measures[-3] < min_gain


def _chunks(sizes: list[int]) -> Iterator[tuple[int, int, bool]]:
    """``(start, stop, at_rung)`` pieces of at most :data:`CHUNK_ROWS` rows covering every size."""
    done = 0
    for size in sizes:
        while done < size:
            stop = min(size, done + CHUNK_ROWS)
            yield done, stop, stop == size
            done = stop


@dataclass
class _Ladder:
    """Where a pass's stopping rule has looked so far: the rows read at each rung and the noise share there."""

    threshold: float
    plateau_gain: float | None
    rows: list[int] = field(default_factory=list)
    measures: list[float] = field(default_factory=list)

    def stop_at(self, rows: int, noise: float) -> str | None:
        """Record a rung; why the pass stops there (``converged``, ``plateau``), or None to read on."""
        self.rows.append(rows)
        self.measures.append(noise)
        if noise <= self.threshold:
            return "converged"
        return "plateau" if is_plateau(self.measures, min_gain=self.plateau_gain) else None

    def record(self, auto: bool, samples: int, available: int, stopped: str, what: str) -> SamplingRecord:
        measures, threshold = self.measures, self.threshold
        reasons = {
            "requested": f"{samples} {what}, as asked",
            "converged": f"noise share {measures[-1]:.3f} <= {threshold} after {samples} of {available} rows"
            if measures else "",
            "plateau": f"noise share {measures[-1]:.3f} after {samples} of {available} rows, only "
                       f"{1 - measures[-1] / measures[-3]:.0%} below its {measures[-3]:.3f} at {self.rows[-3]} "
                       "rows: it stopped falling, and more rows buy little" if len(measures) >= 3 else "",
            "cap": f"read every row ({available}); the noise share was still "
                   f"{measures[-1]:.3f} > {threshold} at the last rung" if measures
                   else f"read every row ({available}): fewer than the first rung",
        }
        return SamplingRecord(mode="auto" if auto else "fixed", samples=samples, available=available,
                              stopped=stopped, reason=reasons[stopped], rungs=tuple(self.rows),
                              measures=tuple(float(m) for m in measures))


def run_signatures(
    model: nn.Module,
    train: TrainRows,
    order: SampleOrder,
    sizes: list[int],
    *,
    auto: bool,
    resolution: int,
    var_floor: float,
    batch_size: int,
    device: torch.device,
    monitor: Monitor,
    plateau_gain: float | None = PLATEAU_GAIN,
) -> tuple[ShardedSignatures, SamplingRecord]:
    """Profile the rows of ``order`` up to the first rung of ``sizes`` where the class
    differences are mostly signal or stopped falling (:func:`is_plateau` with ``plateau_gain``), or
    exactly ``sizes[-1]`` rows when not ``auto``.

    Returns
    -------
    signatures : ShardedSignatures
        Per-shard statistics of the rows read (shard of each row from ``order``).
    record : SamplingRecord
    """
    tick = monitor.counter("signatures", sizes[-1])
    ladder = _Ladder(SIGNATURE_NOISE, plateau_gain)
    stopped = "cap" if auto else "requested"
    with SignatureProfiler(model, num_classes=train.num_classes, resolution=resolution,
                           shards=order.shards) as profiler:
        for start, stop, at_rung in _chunks(sizes):
            chunk = take_rows(train, order.rows[start:stop])
            shard = order.shard[start:stop]
            for batch_idx in length_grouped_batches(chunk.lengths, np.arange(len(chunk)), batch_size,
                                                    longest_first=True):
                batch = next(iterate_batches(chunk, [batch_idx], device))
                profiler.update(batch, torch.as_tensor(shard[batch_idx], device=device))
                tick(len(batch_idx))
            if auto and at_rung and stop < sizes[-1]:
                ended = ladder.stop_at(stop, class_difference_noise(profiler.snapshot().merged(), var_floor=var_floor))
                if ended is not None:
                    stopped = ended
                    break
        signatures = profiler.snapshot()
    record = ladder.record(auto, signatures.samples, len(train), stopped, "signature samples")
    return signatures, record


@dataclass(frozen=True)
class Calibration:
    """Head importance accumulated per shard.

    Attributes
    ----------
    sums : ndarray of shape (K, L, H), float64
        Per shard, the sum of the importance's per-batch scores over its batches.
    batches : ndarray of shape (K,), int64
        Batches per shard.
    samples : int
        Rows read.
    record : SamplingRecord
    """

    sums: np.ndarray
    batches: np.ndarray
    samples: int
    record: SamplingRecord

    def raw(self, leave_out: int | None = None) -> np.ndarray:
        """Mean score over the batches of every shard but ``leave_out`` (all when None), shape (L, H)."""
        keep = [k for k in range(self.sums.shape[0]) if k != leave_out and self.batches[k] > 0]
        return self.sums[keep].sum(axis=0) / self.batches[keep].sum()


def run_calibration(
    model: nn.Module,
    train: TrainRows,
    order: SampleOrder,
    sizes: list[int],
    *,
    auto: bool,
    importance: HeadImportance,
    shape: tuple[int, int],
    batch_size: int,
    seed: int,
    device: torch.device,
    monitor: Monitor,
    plateau_gain: float | None = PLATEAU_GAIN,
) -> Calibration:
    """Average ``importance`` over the rows of ``order`` up to the first rung of ``sizes`` where
    the salience ranking is reliable or its noise share stopped falling (:func:`is_plateau` with
    ``plateau_gain``), or exactly ``sizes[-1]`` rows when not ``auto``.

    Within each chunk the rows are grouped by length into batches and the batches run in a seeded
    random order (``seed``); batch j of the pass belongs to shard ``j mod K``. ``importance`` is
    called on one batch at a time, so that the batch-to-batch spread of the scores is known.
    """
    shards = order.shards
    sums = np.zeros((shards, *shape), dtype=np.float64)
    squares = np.zeros(shape, dtype=np.float64)
    counts = np.zeros(shards, dtype=np.int64)
    rng = np.random.default_rng(seed)
    tick = monitor.counter("salience", sizes[-1])
    ladder = _Ladder(SALIENCE_NOISE, plateau_gain)
    stopped = "cap" if auto else "requested"
    seen = 0
    for start, stop, at_rung in _chunks(sizes):
        chunk = take_rows(train, order.rows[start:stop])
        batches = length_grouped_batches(chunk.lengths, np.arange(len(chunk)), batch_size, longest_first=True)
        for i in rng.permutation(len(batches)):
            batch = next(iterate_batches(chunk, [batches[i]], device))
            scores = importance(model, [batch])
            if tuple(scores.shape) != shape:
                raise PipelineError(
                    f"the head importance has shape {tuple(scores.shape)}; one score per head was expected"
                )
            values = scores.detach().to("cpu", torch.float64).numpy()
            shard = int(counts.sum()) % shards
            sums[shard] += values
            squares += values * values
            counts[shard] += 1
            tick(len(batches[i]))
        seen = stop
        if auto and at_rung and stop < sizes[-1]:
            ended = ladder.stop_at(stop, salience_noise(sums.sum(axis=0), squares, int(counts.sum())))
            if ended is not None:
                stopped = ended
                break
    if counts.sum() == 0:
        raise PipelineError("no calibration batches: cannot compute salience")
    record = ladder.record(auto, seen, len(train), stopped, "calibration samples")
    return Calibration(sums=sums, batches=counts, samples=seen, record=record)
