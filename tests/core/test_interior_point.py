"""The interior-point box-QP solver of the working set's subproblems against cvxpy."""
import cvxpy as cp
import numpy as np
import pytest
import torch

from joker_ext import interior_point
from joker_ext.interior_point import box_qp_iterates, solve_box_qp
from joker_ext.kernels import GaussianKernel

from conftest import spy

F64 = torch.float64


def _problem(m: int, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((m, 4))
    K = GaussianKernel(2.0)(torch.as_tensor(X), torch.as_tensor(X))  # smooth kernel: numerically singular
    lin = torch.as_tensor(rng.standard_normal(m))
    return K, lin, rng


def _cvxpy(K, lin, kink, lo, hi, total):
    m = lin.numel()
    L = np.linalg.cholesky(K.numpy() + 1e-12 * np.eye(m))
    a = cp.Variable(m)
    objective = 0.5 * cp.sum_squares(L.T @ a) - lin.numpy() @ a + kink * cp.norm1(a)
    constraints = [a >= lo.numpy(), a <= hi.numpy()]
    if total is not None:
        constraints.append(cp.sum(a) == total)
    cp.Problem(cp.Minimize(objective), constraints).solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12,
                                                          tol_feas=1e-12)
    return a.value


def _objective(K, lin, kink, a):
    a = torch.as_tensor(a, dtype=F64)
    return float(0.5 * a @ K @ a - lin @ a + kink * a.abs().sum())


CASES = ["split_with_total", "one_sided_with_total", "box_without_total", "fixed_and_h"]


@pytest.mark.parametrize("mixed", [False, True], ids=["float64_factor", "float32_factor"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", CASES)
def test_solve_box_qp_reaches_the_cvxpy_optimum(case, seed, mixed, monkeypatch):
    """Both factorisations: float64, and float32 refined in float64 (which large subproblems use), forced here at
    m = 120 by lowering the size at which it starts."""
    factors = []
    monkeypatch.setattr(interior_point, "MIXED_PRECISION_MIN", 1 if mixed else 10**9)
    monkeypatch.setattr(interior_point, "_Factor", spy(interior_point._Factor, factors))
    K, lin, rng = _problem(120, seed=10 * CASES.index(case) + seed)
    m = lin.numel()
    C = torch.as_tensor(rng.uniform(0.5, 3.0, m))
    kink, total = 0.0, None
    if case == "split_with_total":  # epsilon-insensitive: |a| <= C with a kink, sum a = 0
        lo, hi, kink, total = -C, C, 0.1, 0.0
    elif case == "one_sided_with_total":  # hinge: a y in [0, C]
        y = torch.as_tensor(rng.choice([-1.0, 1.0], m))
        lo, hi, total = torch.minimum(torch.zeros(m, dtype=F64), y * C), torch.maximum(torch.zeros(m, dtype=F64), y * C), 0.0
    elif case == "box_without_total":  # absolute loss without intercept
        lo, hi = -C, C
    else:  # a kink with one-sided and fixed coordinates, a strongly convex part, sum a = 0.3
        lo, hi, kink, total = -C, C, 0.05, 0.3
        lo[:10], hi[10:20], lo[20:25] = 0.2, -0.1, 0.0
        hi[20:25] = 0.0  # fixed at zero
        K = K + torch.diag(torch.as_tensor(rng.uniform(0.0, 0.5, m)))
    a, eta, iterations, converged = solve_box_qp(K, lin, kink, lo, hi, total)
    assert converged and iterations < 40
    assert factors and all(f.mixed == mixed for f in factors)
    assert bool((a >= lo - 1e-12).all() and (a <= hi + 1e-12).all())
    if total is not None:
        assert float(a.sum()) == pytest.approx(total, abs=1e-9)
    ref = _cvxpy(K, lin, kink, lo, hi, total)
    p, p_ref = _objective(K, lin, kink, a), _objective(K, lin, kink, ref)
    assert p <= p_ref + 1e-9 * max(1.0, abs(p_ref))
    assert p == pytest.approx(p_ref, rel=1e-7, abs=1e-9)
    if total is not None:  # the multiplier: a coordinate strictly inside its box (and off the kink) has zero gradient
        g = (K @ a - lin + eta).numpy()
        # (the interior-point answer is within about 1e-6 of the bounds it is active on)
        inside = ((a > lo + 1e-4) & (a < hi - 1e-4) & (a.abs() > 1e-4)).numpy()
        np.testing.assert_allclose(g[inside] + kink * np.sign(a.numpy()[inside]), 0.0, atol=1e-6)


def test_probe_levels_are_tried_in_turn_at_the_first_iterate_past_each():
    """With several levels, a declined probe is called again at the first iterate past the next level (the iterates
    read off the solver's own generator run without a probe), and the solve ends where a plain one does."""
    K, lin, _ = _problem(60, 3)
    lo, hi = torch.full((60,), -1.0, dtype=F64), torch.full((60,), 1.0, dtype=F64)
    levels = (1e-2, 1e-5)
    steps = box_qp_iterates(K, lin, 0.1, lo, hi, 0.0, tol=1e-11)
    relative = []
    while True:
        try:
            relative.append(next(steps)[3])
        except StopIteration as done:
            plain = done.value
            break
    first = next(i for i, r in enumerate(relative) if r <= levels[0])
    second = next(i for i, r in enumerate(relative) if r <= levels[1])
    assert first < second  # the problem crosses the two levels at different iterates
    seen, passed = [], []

    def declining(a, eta, level):
        seen.append(a.clone())
        passed.append(level)
        return False

    probed = solve_box_qp(K, lin, 0.1, lo, hi, total=0.0, tol=1e-11, probe=declining, probe_tol=levels)
    assert len(seen) == 2 and torch.equal(probed[0], plain[0]) and probed[2] == plain[2]
    replay = box_qp_iterates(K, lin, 0.1, lo, hi, 0.0, tol=1e-11)
    iterates = [next(replay)[1] for _ in range(second + 1)]
    assert torch.equal(seen[0], iterates[first]) and torch.equal(seen[1], iterates[second])
    assert passed == list(levels)  # each call names the level its iterate passed


def test_probe_names_the_smallest_level_an_iterate_passed():
    """An iterate that passes two levels at once is probed once, with the smaller of them (the caller's snap may
    depend on how tight the iterate is)."""
    K, lin, _ = _problem(60, 3)
    lo, hi = torch.full((60,), -1.0, dtype=F64), torch.full((60,), 1.0, dtype=F64)
    relative = [step[3] for step in box_qp_iterates(K, lin, 0.1, lo, hi, 0.0, tol=1e-11)]
    first = next(r for r in relative if r <= 1e-1)
    assert first < 1e-1
    levels = (1e-1, first)  # the first iterate under 1e-1 passes both
    passed = []
    solve_box_qp(K, lin, 0.1, lo, hi, total=0.0, tol=1e-11, probe=lambda a, eta, level: passed.append(level),
                 probe_tol=levels)
    assert passed == [first]


@pytest.mark.parametrize("fixed", [False, True])
def test_probe_is_called_once_at_its_tolerance_and_can_stop_the_solver(fixed):
    """``probe`` sees the first iterate whose relative complementarity is at most ``probe_tol`` (inside the box; an
    interior-point iterate need not be on the hyperplane yet); answering False leaves the solve as it was, True stops
    it there."""
    K, lin, _ = _problem(60, 3)
    lo, hi = torch.full((60,), -1.0, dtype=F64), torch.full((60,), 1.0, dtype=F64)
    if fixed:  # a few coordinates fixed: the probe still sees every coordinate
        lo[:5] = hi[:5] = 0.25
    plain = solve_box_qp(K, lin, 0.1, lo, hi, total=0.0, tol=1e-11)
    seen = []

    def declining(a, eta, level):
        seen.append((a.clone(), eta))
        return False

    probed = solve_box_qp(K, lin, 0.1, lo, hi, total=0.0, tol=1e-11, probe=declining, probe_tol=1e-3)
    assert len(seen) == 1 and probed[2] == plain[2] and torch.equal(probed[0], plain[0])
    a, eta = seen[0]
    assert a.numel() == 60 and bool((a >= lo).all() and (a <= hi).all()) and torch.equal(a[:5], lo[:5]) == fixed
    assert not torch.equal(a, plain[0])  # an earlier iterate than the solution
    stopped = solve_box_qp(K, lin, 0.1, lo, hi, total=0.0, tol=1e-11, probe=lambda a, eta, level: True, probe_tol=1e-3)
    assert torch.equal(stopped[0], a) and stopped[1] == eta and stopped[2] < plain[2] and stopped[3]
