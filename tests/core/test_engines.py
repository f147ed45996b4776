"""The Newton engines against independent references: cvxpy, scikit-learn, closed forms, finite differences."""
import numpy as np
import pytest
import torch

from joker_ext.data import BlockData
from joker_ext.engines import available_solvers, get_solver, resolve_solver
from joker_ext.features import make_feature_map
from joker_ext.kernels import GaussianKernel
from joker_ext.losses import get_loss, infimal_convolution, scaled
from joker_ext.model import fit_dual
from joker_ext.operators import FeatureOperator
from joker_ext.primal_newton import feature_newton
from joker_ext.solver import SolverOptions

from conftest import PARAMS, cvxpy_primal, make_binary, make_regression

F64 = torch.float64
SMOOTH = ["squared", "huber", "squared_hinge", "logistic"]
KINKED = ["hinge", "absolute", "epsilon_insensitive", "pinball"]


def _problem(name, n=150, seed=0):
    loss = get_loss(name, **PARAMS)
    X, y = (make_binary if loss.margin else make_regression)(n=n, seed=seed)
    return loss, X, y


@pytest.mark.parametrize("name", SMOOTH + ["hinge"])
def test_exact_newton_reaches_the_cvxpy_optimum(name):
    pytest.importorskip("cvxpy")
    loss, X, y = _problem(name)
    kernel = GaussianKernel(1.0)
    c = torch.full((len(y),), 3.0, dtype=F64)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=c, kernel=kernel,
                 options=SolverOptions(max_iter=300, tol=1e-10), solver="newton")
    res = m.result
    assert m.extra["solver"] == "newton" and res.status == "converged" and res.rel_gap <= 1e-10
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    ref = cvxpy_primal(name, K, y, c.numpy())
    assert res.primal == pytest.approx(ref, rel=1e-6)
    lo, hi = loss.box(torch.as_tensor(y).reshape(-1, 1), c.reshape(-1, 1))
    assert bool(((m.alpha >= lo) & (m.alpha <= hi)).all())  # dual feasible


def test_exact_newton_squared_is_kernel_ridge_in_one_iteration():
    from sklearn.kernel_ridge import KernelRidge

    X, y = make_regression(n=300, seed=3)
    C = 7.0
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("squared"),
                 c=torch.full((300,), C, dtype=F64), kernel=GaussianKernel(1.5), options=SolverOptions(tol=1e-12),
                 solver="newton")
    assert m.result.n_iter == 1 and m.result.status == "converged"
    krr = KernelRidge(alpha=1.0 / C, kernel="rbf", gamma=1.0 / (2 * 1.5 ** 2)).fit(X, y)
    np.testing.assert_allclose(m.alpha[:, 0].numpy(), krr.dual_coef_, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", SMOOTH)
def test_feature_newton_reaches_the_cvxpy_optimum_of_the_feature_problem(name):
    pytest.importorskip("cvxpy")
    loss, X, y = _problem(name, n=200, seed=1)
    fmap = make_feature_map(GaussianKernel(1.0), 60, seed=2)
    Xt = torch.as_tensor(X)
    c = torch.full((len(y),), 2.0, dtype=F64)
    op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), chunk_rows=64)
    res = feature_newton(op, torch.as_tensor(y).reshape(-1, 1), loss, c,
                         SolverOptions(max_iter=100, tol=1e-10, newton_rank=20, newton_sketch_rows=100))
    assert res.status == "converged" and res.rel_gap <= 1e-10
    Phi = fmap(Xt)
    ref = cvxpy_primal(name, (Phi @ Phi.T).numpy(), y, c.numpy())
    assert res.primal == pytest.approx(ref, rel=1e-6)


def test_feature_newton_logistic_matches_scikit_learn_logistic_regression():
    from sklearn.linear_model import LogisticRegression

    X, y = make_binary(n=400, seed=5)
    fmap = make_feature_map(GaussianKernel(1.0), 80, seed=0)
    Phi = fmap(torch.as_tensor(X)).numpy()
    C = 4.0
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("logistic"),
                 c=torch.full((400,), C, dtype=F64), kernel=GaussianKernel(1.0), feature_map=fmap,
                 options=SolverOptions(tol=1e-12, max_iter=50), solver="auto")
    assert m.extra["solver"] == "newton"
    sk = LogisticRegression(C=C, fit_intercept=False, tol=1e-12, max_iter=10000).fit(Phi, y)
    np.testing.assert_allclose(m.beta[:, 0].numpy(), sk.coef_[0], rtol=1e-4, atol=1e-6)  # lbfgs stops near 1e-7


def test_feature_newton_several_targets_equal_separate_fits():
    X, y = make_regression(n=300, seed=2)
    Y = np.stack([y, np.sin(3 * y)], axis=1)
    fmap = make_feature_map(GaussianKernel(1.0), 50, seed=0)
    opts = SolverOptions(tol=1e-12, max_iter=50)
    kw = dict(loss=get_loss("huber", delta=0.3), c=torch.full((300,), 5.0, dtype=F64), kernel=GaussianKernel(1.0),
              feature_map=fmap, options=opts, solver="newton")
    both = fit_dual(torch.as_tensor(X), torch.as_tensor(Y), **kw)
    for j in range(2):
        one = fit_dual(torch.as_tensor(X), torch.as_tensor(Y[:, j:j + 1]), **kw)
        np.testing.assert_allclose(both.beta[:, j].numpy(), one.beta[:, 0].numpy(), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", SMOOTH + KINKED)
def test_smoothed_dual_is_the_loss_and_its_derivatives(name):
    """At smoothing 0 the value is c l(y, f) (the loss's own closed form); a(f) and w are its first and
    second derivatives (central differences), for smoothed losses too; a(f) is in the box."""
    loss, _, _ = _problem(name)
    g = torch.Generator().manual_seed(0)
    f = 2 * torch.randn(300, 1, generator=g, dtype=F64)
    y = torch.sign(torch.randn(300, 1, generator=g, dtype=F64)) if loss.margin else \
        torch.randn(300, 1, generator=g, dtype=F64)
    c = 0.5 + torch.rand(300, 1, generator=g, dtype=F64)
    a, _ = loss.smoothed_dual(f, y, c, 0.0)
    np.testing.assert_allclose(loss.smoothed_value(f, y, c, a).numpy(), (c * loss.value(y, f)).numpy(), atol=1e-12)
    for s in (0.0, 0.3):
        a, w = loss.smoothed_dual(f, y, c, s)
        lo, hi = loss.box(y, c)
        assert bool(((a >= lo) & (a <= hi)).all())
        h = 1e-6
        ap, _ = loss.smoothed_dual(f + h, y, c, s)
        am, _ = loss.smoothed_dual(f - h, y, c, s)
        dv = (loss.smoothed_value(f + h, y, c, ap, s) - loss.smoothed_value(f - h, y, c, am, s)) / (2 * h)
        # away from the points where the curvature jumps
        smooth = ((ap - am) / (2 * h) + w).abs() < 1e-3 * (1 + w.abs())
        assert float(smooth.double().mean()) > 0.9
        np.testing.assert_allclose(dv.numpy(), (-a).numpy(), atol=1e-5)


def test_smoothed_dual_of_a_user_infimal_convolution_uses_the_generic_path():
    loss = infimal_convolution(get_loss("squared"), scaled(get_loss("absolute"), 0.5))  # = huber(0.5)
    huber = get_loss("huber", delta=0.5)
    f = torch.linspace(-3, 3, 101, dtype=F64).reshape(-1, 1)
    y, c = torch.zeros_like(f), torch.ones_like(f)
    for s in (0.0, 0.2):
        np.testing.assert_allclose(loss.smoothed_dual(f, y, c, s)[0].numpy(), huber.smoothed_dual(f, y, c, s)[0].numpy(),
                                   atol=1e-10)


def test_auto_policy_and_registry():
    sq, hinge = get_loss("squared"), get_loss("hinge")
    assert resolve_solver("auto", "exact", 1000, 8, sq) == "newton"
    assert resolve_solver("auto", "exact", 10**6, 8, sq) == "dbcd_tr"  # K does not fit the default budget
    assert resolve_solver("auto", "exact", 1000, 8, sq, max_memory=1000) == "dbcd_tr"
    assert resolve_solver("auto", "features", 10**7, 4, get_loss("logistic")) == "newton"
    assert resolve_solver("auto", "features", 1000, 8, hinge) == "dbcd_tr"
    assert "newton" in available_solvers("features") and "dbcd_tr" in available_solvers("exact")
    with pytest.raises(ValueError, match="solver must be one of"):
        get_solver("lbfgs", "exact")
