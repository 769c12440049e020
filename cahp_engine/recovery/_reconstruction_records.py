"""What a layer-wise reconstruction did, as records: light (no torch), so ``report.json``'s types load without it.

:func:`cahp_engine.recovery.reconstruct` returns a :class:`Reconstruction`; the run report carries it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cahp_engine.results import JsonRecord


@dataclass(frozen=True)
class LayerFit(JsonRecord):
    """One refit projection.

    ``error_before`` and ``error_after`` are ``||output - target||^2 / ||target||^2`` over the
    calibration tokens, before and after the refit; ``ridge`` is the absolute ridge term used and
    ``condition`` the Gram matrix's 1-norm condition number before it, as LAPACK estimates it
    (``ill_conditioned`` above 1e8: the ridge term, not the rows, decided the unseen directions).
    """

    layer: int
    sublayer: str
    units: int
    unknowns: int
    rows: int
    error_before: float
    error_after: float
    ridge: float
    condition: float
    ill_conditioned: bool


@dataclass(frozen=True)
class Reconstruction(JsonRecord):
    """What :func:`reconstruct` did: one :class:`LayerFit` per refit projection, in order.

    ``target`` is the attention refit's target and ``ffn_target`` the feed-forward refit's (None when no
    feed-forward projection was refit).
    """

    fits: tuple[LayerFit, ...]
    method: str
    target: str
    alpha: float
    rows: int
    seconds: float
    notes: tuple[str, ...] = ()
    ffn_target: str | None = None

    @property
    def ill_conditioned(self) -> tuple[LayerFit, ...]:
        return tuple(f for f in self.fits if f.ill_conditioned)

    def describe(self) -> str:
        """One line for the run's log: the layers' mean error before and after, and the time."""
        if not self.fits:
            return "layer-wise reconstruction: nothing to refit"
        before = sum(f.error_before for f in self.fits) / len(self.fits)
        after = sum(f.error_after for f in self.fits) / len(self.fits)
        targets = f"{self.target} target" + ("" if self.ffn_target is None else f", feed-forward {self.ffn_target}")
        return (f"layer-wise reconstruction ({self.method}, {targets}) of {len(self.fits)} projections "
                f"on {self.rows} tokens in {self.seconds:.1f} s: relative error {before:.3f} -> {after:.3f}"
                + (f"; {len(self.ill_conditioned)} ill-conditioned, held by the ridge term" if self.ill_conditioned
                   else ""))
