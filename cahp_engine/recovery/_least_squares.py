"""The linear systems of layer-wise reconstruction: accumulated in float64, solved with a ridge term.

One :class:`NormalEquations` per refit projection gathers ``X^T X``, ``X^T Y`` and ``||Y||^2`` over
the calibration rows (``X``: the projection's input with a column of ones for the bias; ``Y``: what the
projection should output), so the rows never have to be held at once; ``X^T X`` is symmetric and only its
upper triangle is summed. Two solutions read the same sums, both by Cholesky:

- :func:`solve_ridge` refits the whole projection, shrunk towards its current weights:
  ``(X^T X + lambda I) W = X^T Y + lambda W0``;
- :func:`solve_scales` refits one scale per unit (a head's block of columns, or one neuron's column),
  the weights otherwise kept, as the mask tuning of Kwon et al. (2022) does.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.linalg import lapack

#: A system whose Gram matrix has a larger condition number (1-norm, LAPACK's estimate) is
#: ill-conditioned: its least-squares answer would follow the noise of the calibration rows, and only
#: the ridge term keeps it bounded.
ILL_CONDITIONED = 1e8


@dataclass(frozen=True)
class Solution:
    """A refit projection and how well it fits its calibration rows.

    Attributes
    ----------
    weight : Tensor of shape (out, in), float64
    bias : Tensor of shape (out,), float64
    error_before, error_after : float
        ``||X W^T + b - Y||^2 / ||Y||^2`` over the calibration rows, with the current and the refit
        weights.
    ridge : float
        The absolute ridge term ``lambda`` the solution used.
    condition : float
        The 1-norm condition number of the system's Gram matrix before the ridge term, as LAPACK
        estimates it (1e300 when singular).
    """

    weight: torch.Tensor
    bias: torch.Tensor
    error_before: float
    error_after: float
    ridge: float
    condition: float

    @property
    def ill_conditioned(self) -> bool:
        return not self.condition < ILL_CONDITIONED


class NormalEquations:
    """Sums over calibration rows of one projection's least-squares problem, in float64.

    Parameters
    ----------
    inputs : int
        Width ``d_in`` of the projection's input.
    outputs : int
        Width ``d_out`` of its output.
    """

    def __init__(self, inputs: int, outputs: int) -> None:
        self._upper = torch.zeros(inputs + 1, inputs + 1, dtype=torch.float64)
        self.cross = torch.zeros(inputs + 1, outputs, dtype=torch.float64)
        self.target_norm = 0.0
        self.rows = 0

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add rows ``x`` of shape (n, d_in) and their targets ``y`` of shape (n, d_out)."""
        x64 = x.detach().to("cpu", torch.float64)
        y64 = y.detach().to("cpu", torch.float64)
        inputs = x64.shape[1]
        _add_upper_gram(self._upper[:inputs, :inputs], x64)
        self._upper[:inputs, inputs] += x64.sum(dim=0)  # the column of ones that carries the bias
        self._upper[inputs, inputs] += x64.shape[0]
        self.cross[:inputs] += x64.T @ y64
        self.cross[inputs] += y64.sum(dim=0)
        self.target_norm += float((y64 * y64).sum())
        self.rows += int(x.shape[0])

    @property
    def gram(self) -> torch.Tensor:
        """``X^T X`` with the column of ones last, shape (d_in + 1, d_in + 1), exactly symmetric."""
        upper = torch.triu(self._upper)
        return upper + torch.triu(self._upper, diagonal=1).T

    @property
    def unknowns(self) -> int:
        """Unknowns per output of the full refit: the input width plus the bias."""
        return int(self._upper.shape[0])

    def error(self, weight: torch.Tensor, bias: torch.Tensor | None) -> float:
        """``||X W^T + b - Y||^2 / ||Y||^2`` from the sums alone (no bias: ``b = 0``)."""
        wa = _stacked(weight, bias)
        residual = self.target_norm - 2.0 * float((wa * self.cross).sum()) + float((wa * (self.gram @ wa)).sum())
        return max(residual, 0.0) / max(self.target_norm, 1e-300)


def _stacked(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``[W^T; b]``, shape (in + 1, out), in float64."""
    b = torch.zeros(weight.shape[0], dtype=torch.float64) if bias is None else bias.to(torch.float64)
    return torch.cat([weight.to(torch.float64).T, b[None, :]], dim=0)


#: Columns per block of the Gram matrix's upper triangle: blocks this wide keep the products as fast per
#: multiply-add as one whole product while skipping most of the lower triangle.
GRAM_BLOCK = 384


def _add_upper_gram(upper: torch.Tensor, x: torch.Tensor) -> None:
    """Add the upper triangle of ``x^T x`` to ``upper`` (block rows of the triangle, each one product), about
    ``(k + 1) / 2k`` of the whole product's work for ``k`` blocks; the sums below the diagonal are never read."""
    width = x.shape[1]
    blocks = max(1, math.ceil(width / GRAM_BLOCK))
    edges = [round(i * width / blocks) for i in range(blocks + 1)]
    for start, stop in itertools.pairwise(edges):
        upper[start:stop, start:] += x[:, start:stop].T @ x[:, start:]


def _condition(matrix: torch.Tensor) -> float:
    """The 1-norm condition number of a symmetric positive semi-definite ``matrix``, as LAPACK estimates it
    from a Cholesky factor (``dpocon``; seldom below the exact figure by more than a factor of 3, which itself
    lies between the 2-norm figure and ``n`` times it); 1e300 when the factor does not exist (singular to
    working precision)."""
    array = matrix.numpy()
    norm = float(np.abs(array).sum(axis=0).max())
    if not norm > 0:
        return 1e300
    factor, info = lapack.dpotrf(array, lower=False)
    if info != 0:
        return 1e300
    reciprocal, info = lapack.dpocon(factor, norm)  # the upper factor, LAPACK's default
    return 1e300 if info != 0 or not reciprocal > 1e-300 else min(1.0 / float(reciprocal), 1e300)


def _solve_spd(matrix: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``matrix^-1 rhs`` for a symmetric positive definite ``matrix`` (Cholesky; LU if rounding left it short)."""
    factor, info = torch.linalg.cholesky_ex(matrix)
    if int(info) != 0:
        return torch.linalg.solve(matrix, rhs)
    return torch.cholesky_solve(rhs if rhs.dim() == 2 else rhs[:, None], factor).reshape(rhs.shape)


def solve_ridge(system: NormalEquations, weight: torch.Tensor, bias: torch.Tensor | None, *,
                alpha: float) -> Solution:
    """Refit the whole projection: ``argmin ||X W^T + b - Y||^2 + lambda ||[W b] - [W0 b0]||^2``.

    Parameters
    ----------
    system : NormalEquations
    weight : Tensor of shape (out, in)
        The current weights ``W0``, towards which the ridge term shrinks the answer (a direction the
        calibration rows do not see keeps its trained weights instead of falling to zero).
    bias : Tensor of shape (out,), or None for a projection without one (the bias then stays 0)
    alpha : float
        The ridge term relative to the Gram matrix's mean diagonal: ``lambda = alpha * tr(X^T X) / k``,
        so the same ``alpha`` suits inputs of any scale.

    Notes
    -----
    Solved by Cholesky in float64 (the ridge term makes the matrix positive definite).
    """
    k = system.unknowns if bias is not None else system.unknowns - 1
    gram, cross = system.gram[:k, :k], system.cross[:k]
    start = _stacked(weight, bias)[:k]
    lam = alpha * float(torch.trace(gram)) / k
    answer = _solve_spd(gram + lam * torch.eye(k, dtype=torch.float64), cross + lam * start)
    new_weight = answer[: weight.shape[1]].T.contiguous()
    new_bias = answer[-1].contiguous() if bias is not None else torch.zeros(weight.shape[0], dtype=torch.float64)
    # The answer's own error without another product with G: G A = C + lambda (A0 - A), so
    # ||X A - Y||^2 = ||Y||^2 - 2 <A, C> + <A, G A> = ||Y||^2 - <A, C> + lambda <A, A0 - A>.
    residual = (system.target_norm - float((answer * cross).sum()) + lam * float((answer * (start - answer)).sum()))
    return Solution(weight=new_weight, bias=new_bias, error_before=system.error(weight, bias),
                    error_after=max(residual, 0.0) / max(system.target_norm, 1e-300), ridge=lam,
                    condition=_condition(gram))


def solve_scales(system: NormalEquations, weight: torch.Tensor, bias: torch.Tensor | None, *, unit: int,
                 alpha: float) -> Solution:
    """Refit one scale per unit of ``unit`` consecutive input columns, keeping the weights' directions.

    The output is ``sum_u s_u W0_u x_u + b0``; the Gram matrix of the units' contributions,
    ``G_uv = sum over the blocks of (X^T X)_uv * (W0^T W0)_uv``, and the right-hand side come from the
    same sums as the full refit. The ridge term shrinks the scales towards 1.

    Parameters
    ----------
    weight : Tensor of shape (out, U * unit)
    bias : Tensor of shape (out,), or None
    unit : int
        Columns per unit: the head dimension for attention heads, 1 for neurons.
    alpha : float
        As in :func:`solve_ridge`, relative to ``G``'s mean diagonal.
    """
    w0 = weight.to(torch.float64)
    b0 = torch.zeros(w0.shape[0], dtype=torch.float64) if bias is None else bias.to(torch.float64)
    inputs = w0.shape[1]
    units = inputs // unit
    full = system.gram  # built from the upper triangle on each read: read once
    xx = full[:inputs, :inputs]
    xsum = full[:inputs, -1]  # sum of each input column over the rows
    gram = (xx * (w0.T @ w0)).reshape(units, unit, units, unit).sum(dim=(1, 3))
    rhs_cols = (w0.T * (system.cross[:inputs] - xsum[:, None] * b0[None, :])).sum(dim=1)
    rhs = rhs_cols.reshape(units, unit).sum(dim=1)
    lam = alpha * float(torch.trace(gram)) / max(units, 1)
    scales = _solve_spd(gram + lam * torch.eye(units, dtype=torch.float64),
                        rhs + lam * torch.ones(units, dtype=torch.float64))
    new_weight = (w0.reshape(-1, units, unit) * scales[None, :, None]).reshape(w0.shape)
    return Solution(weight=new_weight, bias=b0.clone(), error_before=system.error(weight, bias),
                    error_after=system.error(new_weight, b0), ridge=lam, condition=_condition(gram))
