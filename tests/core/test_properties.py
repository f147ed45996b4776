"""Property-based tests (hypothesis): Fenchel-Young, gap >= 0, KKT conditions at convergence."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from joker_ext.kernels import GaussianKernel
from joker_ext.losses import get_loss
from joker_ext.model import fit_dual
from joker_ext.solver import SolverOptions

LOSSES = ["squared", "huber", "epsilon_insensitive", "absolute", "pinball", "hinge", "squared_hinge", "logistic"]
finite = st.floats(min_value=-50, max_value=50, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(LOSSES), y=finite, f=finite, c=st.floats(1e-3, 1e3), frac=st.floats(0, 1),
       delta=st.floats(1e-3, 10), eps=st.floats(0, 5), tau=st.floats(1e-3, 1 - 1e-3))
@example(name="pinball", y=1.0, f=0.0, c=6.3136859573092305, frac=1.0, delta=1.0, eps=0.0, tau=0.25)
def test_fenchel_young_inequality(name, y, f, c, frac, delta, eps, tau):
    loss = get_loss(name, delta=delta, epsilon=eps, quantile=tau)
    if loss.margin:
        y = 1.0 if y >= 0 else -1.0
    Y, F, C = (torch.tensor([v], dtype=torch.float64) for v in (y, f, c))
    lo, hi = loss.box(Y, C)
    lo = torch.clamp(lo, min=-1e3 * c)
    hi = torch.clamp(hi, max=1e3 * c)
    # a feasible point: lo + frac (hi - lo) may round past hi (pinball, frac = 1: 4.4e-16 above c tau, where the
    # Fenchel-Young value came out at -4.4e-16), so it is clipped into the box
    A = torch.minimum(torch.maximum(lo + frac * (hi - lo), lo), hi)
    fy = loss.fenchel_young(Y, F, A, C)
    assert float(fy) >= 0
    # c l(y, f) >= -a f - g(a) for every feasible a: the conjugate is a sup
    lhs = float(C * loss.value(Y, F))
    rhs = float(-A * F - loss.conj(A, Y, C))
    assert lhs >= rhs - 1e-9 * max(1.0, abs(lhs), abs(rhs))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(LOSSES), seed=st.integers(0, 10_000), logC=st.floats(-1, 2), sigma=st.floats(0.3, 3))
def test_gap_nonnegative_and_kkt_at_convergence(name, seed, logC, sigma):
    loss = get_loss(name, delta=0.5, epsilon=0.1, quantile=0.7)
    g = np.random.default_rng(seed)
    n = 40
    X = g.standard_normal((n, 2))
    y = np.sin(X[:, 0]) + 0.2 * g.standard_normal(n)
    if loss.margin:
        y = np.where(y > 0, 1.0, -1.0)
    C = 10.0 ** logC
    Y = torch.as_tensor(y).reshape(-1, 1)
    c = torch.full((n,), C, dtype=torch.float64)
    m = fit_dual(torch.as_tensor(X), Y, loss=loss, c=c, kernel=GaussianKernel(sigma),
                 options=SolverOptions(block_size=n, max_iter=400, tol=1e-13))
    res = m.result
    assert res.gap >= 0 and all(h["gap"] >= 0 for h in res.history)
    assert res.rel_gap < 1e-7
    # KKT: the dual variable is optimal for its own prediction, coordinate by coordinate:
    # -f_i is in the subdifferential of g_i at alpha_i (checked through the projected gradient)
    a = m.alpha
    f = m.decision(torch.as_tensor(X))
    lo, hi = loss.box(Y, c.reshape(-1, 1))
    grad = f + loss.conj_grad(a, Y, c.reshape(-1, 1))
    if loss.kink:
        k = loss.kink
        grad = torch.where(a > 0, grad + k, torch.where(a < 0, grad - k, torch.sign(grad) * (grad.abs() - k).clamp_min(0)))
    pg = torch.where(a <= lo, grad.clamp(max=0), torch.where(a >= hi, grad.clamp(min=0), grad))
    scale = 1.0 + float(f.abs().max()) + float(Y.abs().max())
    assert float(pg.abs().max()) < 1e-4 * scale
