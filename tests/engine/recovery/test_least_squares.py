"""The linear systems of layer-wise reconstruction: the sums, the ridge solution's error and the condition figure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cahp_engine.recovery._least_squares import GRAM_BLOCK, NormalEquations, solve_ridge, solve_scales


def _rows(n: int, d: int, outputs: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=generator)
    y = x @ torch.randn(d, outputs, generator=generator) + 0.3 * torch.randn(n, outputs, generator=generator)
    return x, y


def _system(x: torch.Tensor, y: torch.Tensor, batch: int = 97) -> NormalEquations:
    system = NormalEquations(x.shape[1], y.shape[1])
    for start in range(0, x.shape[0], batch):
        system.add(x[start:start + batch], y[start:start + batch])
    return system


@pytest.mark.parametrize("width", [7, GRAM_BLOCK, 2 * GRAM_BLOCK + 5])
def test_the_sums_are_those_of_the_rows_with_a_column_of_ones(width: int) -> None:
    # Wider than one block, the Gram matrix is summed block row by block row over its upper triangle.
    x, y = _rows(3 * width + 11, width, 3)
    system = _system(x, y)
    ones = torch.cat([x.double(), torch.ones(x.shape[0], 1, dtype=torch.float64)], dim=1)
    torch.testing.assert_close(system.gram, ones.T @ ones, rtol=1e-12, atol=1e-9)
    assert torch.equal(system.gram, system.gram.T)
    torch.testing.assert_close(system.cross, ones.T @ y.double(), rtol=1e-12, atol=1e-9)
    assert system.rows == x.shape[0] and system.unknowns == width + 1
    assert system.target_norm == pytest.approx(float((y.double() ** 2).sum()), rel=1e-12)


@pytest.mark.parametrize("with_bias", [True, False])
def test_a_ridge_solution_reports_the_error_its_rows_give(with_bias: bool) -> None:
    x, y = _rows(400, 30, 5, seed=1)
    system = _system(x, y)
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(5, 30, generator=generator)
    bias = torch.randn(5, generator=generator) if with_bias else None
    solution = solve_ridge(system, weight, bias, alpha=1e-2)

    def error(w: torch.Tensor, b: torch.Tensor | None) -> float:
        out = x.double() @ w.double().T + (0.0 if b is None else b.double())
        return float(((out - y.double()) ** 2).sum() / (y.double() ** 2).sum())

    assert solution.error_before == pytest.approx(error(weight, bias), rel=1e-9)
    assert solution.error_after == pytest.approx(error(solution.weight, solution.bias if with_bias else None),
                                                 rel=1e-9)
    assert solution.error_after < solution.error_before
    if not with_bias:
        assert not solution.bias.any()


def test_the_condition_figure_bounds_the_exact_one_and_flags_rows_that_span_too_little() -> None:
    x, y = _rows(600, 40, 4, seed=3)
    x[:, 1] = x[:, 0] * 10 + 1e-6 * x[:, 2]  # two nearly equal directions: ill-conditioned
    for rows, ill in ((_rows(600, 40, 4, seed=3)[0], False), (x, True)):
        system = _system(rows, y)
        exact = float(np.linalg.cond(system.gram.numpy(), 2))
        solution = solve_ridge(system, torch.zeros(4, 40), torch.zeros(4), alpha=1e-2)
        # LAPACK's 1-norm estimate: at least a third of the exact 2-norm figure, at most (k = 41) times it.
        assert exact / 3 <= solution.condition <= 41 * exact * 1.01
        assert solution.ill_conditioned is ill
        assert torch.isfinite(solution.weight).all()
    # Rows that leave a direction unseen: singular, reported as 1e300.
    zero = _rows(600, 40, 4, seed=3)[0]
    zero[:, 5] = 0.0
    assert solve_scales(_system(zero, y), torch.ones(4, 40), None, unit=1, alpha=1e-2).condition == 1e300
