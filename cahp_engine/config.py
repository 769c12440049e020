"""One validated configuration object for a whole pruning run.

Every user-settable value of the engine lives in :class:`PruningConfig`. It is checked once, in
``__post_init__``, with messages of the form "`resolution` must be an integer >= 2, got 0", so a run
fails before any model is loaded rather than an hour into it.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Any, Literal

from cahp_engine.errors import ConfigError

Strategy = Literal["cahp", "salience", "random"]
DenseFinetune = Literal["auto", "always", "never"]

STRATEGIES: tuple[str, ...] = ("cahp", "salience", "random")
DENSE_FINETUNE_MODES: tuple[str, ...] = ("auto", "always", "never")
#: Polynomial degrees reported in ``knees_by_degree`` (the paper's sweep, Section IV-B.2).
REPORTED_DEGREES: tuple[int, ...] = (2, 3, 4, 5, 6)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _require_int(name: str, value: Any, *, minimum: int, maximum: int | None = None) -> None:
    bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
    if not _is_int(value) or value < minimum or (maximum is not None and value > maximum):
        raise ConfigError(f"`{name}` must be an integer {bound}, got {value!r}")


def _require_real(name: str, value: Any, *, low: float, high: float, low_open: bool, high_open: bool) -> None:
    ok = _is_real(value) and value == value  # NaN fails the second test
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        raise ConfigError(f"`{name}` must be a number in {left}{low}, {high}{right}, got {value!r}")


def _require_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"`{name}` must be one of {', '.join(choices)}, got {value!r}")


@dataclass(frozen=True)
class PruningConfig:
    """Settings of one CAHP run: head selection, recovery fine-tuning and evaluation.

    Parameters
    ----------
    poly_degree : int, default 2
        Degree of the polynomial Kneedle fits to the MSS curve (paper Section IV-B.2). Higher degrees
        follow the curve more closely and usually pick a smaller k*.
    heads_to_keep : int or None
        Keep exactly this many clusters (one representative each) instead of locating the knee.
    resolution : int or None
        Side B of the resized attention maps. ``None`` takes the 70th percentile of the tokenised
        lengths of the training split (paper Section IV-B.1).
    calibration_fraction : float, default 0.25
        Share of the training split, drawn with ``seed``, over which head salience is averaged.
    signature_samples : int, float or None
        Training samples profiled for signatures: ``None`` for all, an integer count, or a fraction
        in (0, 1].
    strategy : {"cahp", "salience", "random"}
        ``cahp`` is the paper's method; the others are baselines that keep the same number of heads
        (``heads_to_keep`` if given, otherwise the count CAHP would keep).
    seed : int
        Seeds every random choice: sample draws, t-SNE, FasterPAM, baselines and fine-tuning.
    batch_size : int, default 32
        Batch size of every pass: signatures, salience, fine-tuning and evaluation (paper: 32).
    max_length : int, default 512
        Longer inputs are truncated to this many tokens.
    perplexity : float or None
        t-SNE perplexity; ``None`` takes ``min(30, (N - 1) / 3)`` for N heads.
    var_floor : float, default 1e-10
        Floor on class variances before the Bhattacharyya distance, so a pixel with zero variance in
        both classes gives a finite distance.
    epochs, lr, warmup_ratio, weight_decay, max_grad_norm
        Recovery fine-tuning recipe (paper Section IV-B.5: 3, 2e-5, 0.1, 0.01, 1.0).
    dense_finetune : {"auto", "always", "never"}
        Whether to fine-tune the dense model first (``auto``: when its classifier head is untrained
        or its label count does not match the dataset).
    dense_epochs, dense_lr
        Recipe of that dense fine-tuning; the other values are shared with recovery.
    device : str
        ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    latency_warmup, latency_repeats : int
        Untimed and timed passes per model and batch size when measuring the speed-up.
    reported_degrees : tuple of int
        Polynomial degrees whose knees are reported next to the chosen one (default 2..6).
    """

    poly_degree: int = 2
    heads_to_keep: int | None = None
    resolution: int | None = None
    calibration_fraction: float = 0.25
    signature_samples: int | float | None = None
    strategy: Strategy = "cahp"
    seed: int = 42
    batch_size: int = 32
    max_length: int = 512
    perplexity: float | None = None
    var_floor: float = 1e-10
    epochs: float = 3
    lr: float = 2e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    dense_finetune: DenseFinetune = "auto"
    dense_epochs: float = 3
    dense_lr: float = 5e-5
    device: str = "auto"
    latency_warmup: int = 3
    latency_repeats: int = 20
    reported_degrees: tuple[int, ...] = field(default=REPORTED_DEGREES)

    def __post_init__(self) -> None:
        _require_int("poly_degree", self.poly_degree, minimum=1, maximum=10)
        if self.heads_to_keep is not None:
            _require_int("heads_to_keep", self.heads_to_keep, minimum=1)
        if self.resolution is not None:
            _require_int("resolution", self.resolution, minimum=2, maximum=512)
        _require_real("calibration_fraction", self.calibration_fraction,
                      low=0.0, high=1.0, low_open=True, high_open=False)
        s = self.signature_samples
        if s is not None:
            if _is_int(s):
                _require_int("signature_samples", s, minimum=2)
            elif _is_real(s):
                _require_real("signature_samples", s, low=0.0, high=1.0, low_open=True, high_open=False)
            else:
                raise ConfigError(
                    f"`signature_samples` must be an integer count >= 2, a fraction in (0, 1] or None, got {s!r}"
                )
        _require_choice("strategy", self.strategy, STRATEGIES)
        _require_int("seed", self.seed, minimum=0, maximum=2**32 - 1)
        _require_int("batch_size", self.batch_size, minimum=1, maximum=4096)
        _require_int("max_length", self.max_length, minimum=2, maximum=8192)
        if self.perplexity is not None:
            _require_real("perplexity", self.perplexity, low=0.0, high=1e6, low_open=True, high_open=True)
        _require_real("var_floor", self.var_floor, low=0.0, high=1.0, low_open=True, high_open=True)
        for name in ("epochs", "dense_epochs"):
            _require_real(name, getattr(self, name), low=0.0, high=1000.0, low_open=False, high_open=False)
        for name in ("lr", "dense_lr"):
            _require_real(name, getattr(self, name), low=0.0, high=1.0, low_open=True, high_open=False)
        _require_real("warmup_ratio", self.warmup_ratio, low=0.0, high=1.0, low_open=False, high_open=False)
        _require_real("weight_decay", self.weight_decay, low=0.0, high=1.0, low_open=False, high_open=False)
        _require_real("max_grad_norm", self.max_grad_norm, low=0.0, high=1e6, low_open=True, high_open=False)
        _require_choice("dense_finetune", self.dense_finetune, DENSE_FINETUNE_MODES)
        _require_int("latency_warmup", self.latency_warmup, minimum=0, maximum=1000)
        _require_int("latency_repeats", self.latency_repeats, minimum=1, maximum=10000)
        if not isinstance(self.device, str) or not _valid_device(self.device):
            raise ConfigError(f"`device` must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if not self.reported_degrees or not all(_is_int(d) and 1 <= d <= 10 for d in self.reported_degrees):
            raise ConfigError(
                f"`reported_degrees` must be a non-empty tuple of integers between 1 and 10, "
                f"got {self.reported_degrees!r}"
            )

    def replace(self, **changes: Any) -> PruningConfig:
        """Return a copy with ``changes`` applied and validated."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready mapping of every field."""
        out = dataclasses.asdict(self)
        out["reported_degrees"] = list(self.reported_degrees)
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PruningConfig:
        """Build from a mapping, rejecting unknown keys with the list of known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known settings: {', '.join(sorted(known))}")
        values = dict(values)
        if "reported_degrees" in values and isinstance(values["reported_degrees"], list):
            values["reported_degrees"] = tuple(values["reported_degrees"])
        return cls(**values)


def _valid_device(device: str) -> bool:
    if device in ("auto", "cpu", "cuda"):
        return True
    prefix, _, index = device.partition(":")
    return prefix == "cuda" and index.isdigit()
