"""The conjugate-loss registry against numerical conjugates, finite differences and Fenchel-Young."""
import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar

from joker_ext.losses import (
    HuberLoss,
    Loss,
    available_losses,
    get_loss,
    infimal_convolution,
    register_loss,
    scaled,
)

PARAMS = dict(delta=0.7, epsilon=0.3, quantile=0.3)
BUILTIN = ["squared", "huber", "epsilon_insensitive", "absolute", "pinball", "hinge", "squared_hinge", "logistic"]


def t(x):
    return torch.as_tensor(np.atleast_1d(x), dtype=torch.float64)


def sample(loss, seed=0, n=25):
    g = np.random.default_rng(seed)
    y = np.where(g.random(n) > 0.5, 1.0, -1.0) if loss.margin else g.standard_normal(n)
    c = g.uniform(0.3, 3.0, n)
    lo, hi = loss.box(t(y), t(c))
    lo = np.maximum(lo.numpy(), -5 * c)
    hi = np.minimum(hi.numpy(), 5 * c)
    a = lo + (hi - lo) * g.uniform(0.02, 0.98, n)
    return y, c, a


def numeric_conjugate(loss, a, y, c):
    """g(a) = sup_f [-a f - c l(y, f)] by bounded 1-D maximisation (independent of the loss's own g)."""
    obj = lambda f: a * f + c * float(loss.value(t(y), t(f)))
    res = minimize_scalar(obj, bounds=(-60, 60), method="bounded", options={"xatol": 1e-11, "maxiter": 2000})
    return -res.fun


@pytest.mark.parametrize("name", BUILTIN)
def test_conjugate_matches_numerical_sup(name):
    loss = get_loss(name, **PARAMS)
    y, c, a = sample(loss)
    g = loss.conj(t(a), t(y), t(c)).numpy()
    ref = np.array([numeric_conjugate(loss, a[i], y[i], c[i]) for i in range(len(a))])
    np.testing.assert_allclose(g, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", BUILTIN)
def test_gradient_and_hessian_match_finite_differences(name):
    loss = get_loss(name, **PARAMS)
    y, c, a = sample(loss, seed=1)
    if loss.kink:
        a = np.where(np.abs(a) < 1e-3, 1e-3, a)  # away from the kink
    h = 1e-6
    A, Y, Cc = t(a), t(y), t(c)
    smooth = lambda z: (loss.psi(z, Y, Cc) - z * Y).numpy()
    fd_grad = (smooth(A + h) - smooth(A - h)) / (2 * h)
    np.testing.assert_allclose(loss.conj_grad(A, Y, Cc).numpy(), fd_grad, rtol=1e-5, atol=1e-6)
    gr = lambda z: loss.conj_grad(z, Y, Cc).numpy()
    fd_hess = (gr(A + h) - gr(A - h)) / (2 * h)
    np.testing.assert_allclose(loss.psi_hess(A, Y, Cc).numpy(), fd_hess, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", BUILTIN)
def test_fenchel_young_is_nonnegative_and_tight(name):
    loss = get_loss(name, **PARAMS)
    y, c, a = sample(loss, seed=2, n=200)
    g = np.random.default_rng(3)
    f = g.standard_normal(200) * 2
    Y, C, A, F = t(y), t(c), t(a), t(f)
    fy = loss.fenchel_young(Y, F, A, C).numpy()
    assert np.all(fy >= 0)
    generic = (C * loss.value(Y, F) + loss.conj(A, Y, C) + A * F).numpy()
    np.testing.assert_allclose(fy, generic, rtol=1e-9, atol=1e-9)
    # tight at a* = argmax_a [-a f - g(a)] = the dual variable optimal for f
    if name in ("squared", "huber"):
        lo, hi = loss.box(Y, C)
        astar = torch.minimum(torch.maximum(C * (Y - F), lo), hi)
        np.testing.assert_allclose(loss.fenchel_young(Y, F, astar, C).numpy(), 0.0, atol=1e-12)


@pytest.mark.parametrize("name", BUILTIN)
def test_residual_losses_depend_on_y_minus_f_alone(name):
    """``loss.residual`` (the engines then take the targets' level off, into the intercept) holds exactly for the
    losses of ``y - f``: shifting ``y`` and ``f`` together changes neither the loss nor ``psi`` nor the box; the margin
    losses are not residual (their values change under such a shift)."""
    loss = get_loss(name, **PARAMS)
    y, c, a = sample(loss)
    f = np.random.default_rng(1).standard_normal(len(y))
    m = 123.25
    moved = not torch.allclose(loss.value(t(y + m), t(f + m)), loss.value(t(y), t(f)))
    assert loss.residual == (name in ("squared", "huber", "epsilon_insensitive", "absolute", "pinball"))
    if loss.residual:
        assert not moved
        torch.testing.assert_close(loss.psi(t(a), t(y + m), t(c)), loss.psi(t(a), t(y), t(c)))
        for side, side_m in zip(loss.box(t(y), t(c)), loss.box(t(y + m), t(c))):
            assert torch.equal(side, side_m)
    else:
        assert moved
    assert scaled(loss, 2.0).residual == loss.residual
    assert infimal_convolution(get_loss("squared"), get_loss("absolute")).residual


def test_huber_by_infimal_convolution_equals_builtin():
    delta = 0.7
    composed = infimal_convolution(get_loss("squared"), scaled(get_loss("absolute"), delta))
    builtin = HuberLoss(delta)
    g = np.random.default_rng(4)
    y = t(g.standard_normal(50))
    f = t(g.standard_normal(50) * 3)
    c = t(g.uniform(0.5, 2.0, 50))
    np.testing.assert_allclose(composed.value(y, f).numpy(), builtin.value(y, f).numpy(), rtol=1e-9, atol=1e-12)
    lo1, hi1 = composed.box(y, c)
    lo2, hi2 = builtin.box(y, c)
    np.testing.assert_allclose(lo1.numpy(), lo2.numpy())
    np.testing.assert_allclose(hi1.numpy(), hi2.numpy())
    a = lo2 + (hi2 - lo2) * t(g.uniform(0, 1, 50))
    np.testing.assert_allclose(composed.conj(a, y, c).numpy(), builtin.conj(a, y, c).numpy(), rtol=1e-12)
    np.testing.assert_allclose(composed.psi_hess(a, y, c).numpy(), builtin.psi_hess(a, y, c).numpy())


def test_scaled_loss_is_loss_times_constant():
    base = get_loss("pinball", quantile=0.2)
    s = scaled(base, 3.0)
    y, f = t([0.5, -1.0, 2.0]), t([0.0, 0.3, 2.5])
    np.testing.assert_allclose(s.value(y, f).numpy(), 3.0 * base.value(y, f).numpy())


def test_register_custom_loss_and_errors():
    class Cubicish(Loss):
        name = "my_squared_twice"

        def value(self, y, f):
            return (y - f) ** 2

        def psi(self, a, y, c):
            return a * a / (4 * c)

        def psi_grad(self, a, y, c):
            return a / (2 * c)

        def psi_hess(self, a, y, c):
            return (1 / (2 * c)).expand_as(a)

        def box(self, y, c):
            inf = torch.full_like(y, float("inf"))
            return -inf, inf

    register_loss("my_squared_twice", Cubicish)
    assert "my_squared_twice" in available_losses()
    loss = get_loss("my_squared_twice")
    assert numeric_conjugate(loss, 0.4, 1.0, 2.0) == pytest.approx(float(loss.conj(t(0.4), t(1.0), t(2.0))), rel=1e-6)
    with pytest.raises(ValueError, match="already registered"):
        register_loss("my_squared_twice", Cubicish)
    with pytest.raises(TypeError, match="factory"):
        register_loss("other", 3)


@pytest.mark.parametrize(
    "name, kw, word",
    [
        ("pinball", dict(quantile=1.0), "quantile"),
        ("pinball", dict(quantile=0.0), "quantile"),
        ("huber", dict(delta=-1.0), "delta"),
        ("huber", dict(delta=0.0), "delta"),
        ("epsilon_insensitive", dict(epsilon=-0.1), "epsilon"),
        ("hinge_loss", {}, "unknown loss"),
    ],
)
def test_bad_loss_parameters(name, kw, word):
    with pytest.raises(ValueError, match=word):
        get_loss(name, **kw)


def test_margin_losses_reject_other_labels():
    with pytest.raises(ValueError, match="-1"):
        get_loss("hinge").check_targets(t([0.0, 1.0]))


def test_logistic_box_is_strictly_inside_in_float32():
    loss = get_loss("logistic")
    c = torch.tensor([1.0, 1e4], dtype=torch.float32)
    y = torch.tensor([1.0, -1.0], dtype=torch.float32)
    lo, hi = loss.box(y, c)
    u_lo = torch.minimum(y * lo, y * hi)
    u_hi = torch.maximum(y * lo, y * hi)
    assert torch.all(u_lo > 0) and torch.all(c - u_hi > 0)
    for a in (lo, hi):
        assert torch.all(torch.isfinite(loss.conj_grad(a, y, c)))
        assert torch.all(torch.isfinite(loss.psi_hess(a, y, c)))
