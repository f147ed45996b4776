"""The Newton engines against independent references: cvxpy, scikit-learn, closed forms, finite differences."""
import math

import numpy as np
import pytest
import torch

from joker_ext.data import BlockData
from joker_ext.engines import available_solvers, get_solver, resolve_solver
from joker_ext.features import make_feature_map
from joker_ext.kernels import GaussianKernel
from joker_ext.losses import get_loss, infimal_convolution, scaled
from joker_ext.model import fit_dual
from joker_ext.operators import ExactOperator, FeatureOperator
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


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("C", [1.0, 30.0])
def test_logistic_primal_steps_from_the_coarse_start_reach_the_cvxpy_optimum(monkeypatch, intercept, C):
    """The primal Newton steps of the logistic loss start from the solution on a quarter of the rows (its own start
    from a sixteenth): the same optimum as cvxpy's, in no more iterations than from ``w = 0`` (which the test also
    runs, with the coarse start switched off; with Armijo's halvings the coarse start saved iterations here, with
    the exact line search both take the same number)."""
    pytest.importorskip("cvxpy")
    import joker_ext.newton_exact as ne

    monkeypatch.setattr(ne, "COARSE_MIN_ROWS", 100)  # coarse starts at n = 400 and at its quarter, 100
    coarse = []
    start = ne._Column._coarse_start
    monkeypatch.setattr(ne._Column, "_coarse_start", lambda self: coarse.append(self.y.numel()) or start(self))
    loss, X, y = _problem("logistic", n=400, seed=4)
    kernel = GaussianKernel(1.0)
    c = torch.full((400,), C, dtype=F64)
    fits = {}
    for rows in (100, 10**9):
        monkeypatch.setattr(ne, "COARSE_MIN_ROWS", rows)
        fits[rows] = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=c, kernel=kernel,
                              options=SolverOptions(max_iter=100, tol=1e-13), solver="newton", intercept=intercept)
        assert fits[rows].result.status == "converged" and fits[rows].result.rel_gap <= 1e-13
    assert coarse == [400, 100]
    assert fits[100].result.n_iter <= fits[10**9].result.n_iter
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    ref = cvxpy_primal("logistic", K, y, c.numpy(), intercept=intercept)
    assert fits[100].result.primal == pytest.approx(ref, rel=1e-6)


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


@pytest.mark.parametrize("name", SMOOTH + KINKED)
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


@pytest.mark.parametrize("mixed", ["float64", "float32", "stale"],
                         ids=["float64_system", "float32_factor_cg", "stale_float32_factor"])
def test_exact_newton_logistic_is_scikit_learn_logistic_regression_in_a_few_primal_newton_steps(mixed, monkeypatch):
    """Exact kernel, logistic loss ('auto' takes the exact Newton engine, which steps on the primal for it): the
    model of scikit-learn's LogisticRegression on features ``L`` with ``L L^T = K``, in 6-8 iterations (C = 1 to
    100). Projected Newton on the dual took 19-20 from ``a = 0`` and 12-13 from the middle of the box. Every way of
    solving the Newton system: a float64 factor, conjugate gradients in float64 through a float32 factor (forced here
    at n = 1000; the solves must have gone that way), and through the previous step's float32 factor once the steps
    are short (forced at n = 1000: fewer factorisations than solves)."""
    from sklearn.linear_model import LogisticRegression

    from joker_ext import newton_exact

    monkeypatch.setattr(newton_exact, "MIXED_PRECISION_MIN", 10**9 if mixed == "float64" else 1)
    monkeypatch.setattr(newton_exact, "STALE_MIN_ROWS", 1 if mixed == "stale" else 10**9)
    monkeypatch.setattr(newton_exact, "STALE_ROWS", 50)  # (up to 20 iterations through the last factor)
    mixed_solves, factors = [], []
    pcg, cholesky = newton_exact.cholesky_pcg, newton_exact.cholesky_ex
    monkeypatch.setattr(newton_exact, "cholesky_pcg", lambda *a, **k: mixed_solves.append(a[0]) or pcg(*a, **k))
    monkeypatch.setattr(newton_exact, "cholesky_ex", lambda *a, **k: factors.append(1) or cholesky(*a, **k))

    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=1000, n_features=8, flip_y=0.05, random_state=0)
    X = (X - X.mean(0)) / X.std(0)
    C, kernel = 10.0, GaussianKernel(3.0)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(2.0 * y - 1.0).reshape(-1, 1), loss=get_loss("logistic"),
                 c=torch.full((len(y),), C, dtype=F64), kernel=kernel, options=SolverOptions(tol=1e-14, max_iter=50),
                 solver="auto")
    assert m.extra["solver"] == "newton" and m.result.status == "converged" and m.result.n_iter <= 10
    # (one solve per iteration, and one more for the step that settles the iterate once the gap is met)
    if mixed == "float64":
        assert not mixed_solves
    elif mixed == "float32":
        assert m.result.n_iter <= len(mixed_solves) <= m.result.n_iter + 1
    else:  # solves through the last factor, which did not need a new one
        assert len(factors) < m.result.n_iter and len({id(L) for L in mixed_solves}) == len(factors)
    K = kernel(torch.as_tensor(X), torch.as_tensor(X))
    L = torch.linalg.cholesky(K + 1e-10 * torch.eye(len(y), dtype=F64)).numpy()
    sk = LogisticRegression(C=C, fit_intercept=False, tol=1e-12, max_iter=10000).fit(L, y)
    f_sklearn = L @ sk.coef_[0]
    f = (K @ m.alpha).numpy()[:, 0]
    np.testing.assert_allclose(f, f_sklearn, atol=1e-4 * np.abs(f_sklearn).max())


@pytest.mark.parametrize("shift", [0.05, 0.7, 2.5, 9.0])
def test_primal_newton_line_search_finds_the_minimum_along_the_direction(shift):
    """The exact line search of the primal Newton steps on ``phi(t) = 1/2 q t^2 + sum_i log(1 + exp(m_i (s - t)))``
    (a quadratic plus softplus terms, as the logistic primal along a descent direction): its step is scipy's bounded
    minimiser, short of the full step or beyond it, and the longest step allowed where the minimum lies further."""
    from scipy.optimize import minimize_scalar

    import joker_ext.newton_exact as ne

    m, q = np.linspace(0.5, 3.0, 7), 0.1

    def phi(t):
        return 0.5 * q * t * t + np.logaddexp(0.0, m * (shift - t)).sum()

    def derivatives(t):
        p = 1.0 / (1.0 + np.exp(-m * (shift - t)))
        return q * t - float((m * p).sum()), q + float((m * m * p * (1.0 - p)).sum())

    slope = derivatives(0.0)[0]
    t = ne._line_minimum(derivatives, slope)
    best = minimize_scalar(phi, bounds=(0.0, ne.LINE_MAX), method="bounded", options={"xatol": 1e-12}).x
    if best < ne.LINE_MAX - 1e-6:
        assert abs(derivatives(t)[0]) <= ne.LINE_TOL * -slope
        assert t == pytest.approx(best, rel=1e-2, abs=1e-4)
    else:
        assert t == ne.LINE_MAX


@pytest.mark.parametrize("C", [10.0, 1e4])
def test_exact_newton_logistic_fits_the_intercept_in_its_newton_steps(C):
    """Logistic loss with an intercept on the exact Newton engine: ``b`` is one more unknown of the primal Newton steps
    (no intercept search: the plan says 'engine'), and the model is scikit-learn's LogisticRegression with an
    unpenalised intercept on features ``L`` with ``L L^T = K``; the certified dual point sums to zero. At C = 10^4
    (nearly separable) the search took 60 rounds and 230 Newton iterations and stalled at a gap of 1e-11 (n = 2000);
    the joint steps converge in a few tens."""
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    X, y = make_classification(n_samples=500, n_features=5, n_informative=4, n_redundant=0, flip_y=0.05,
                               random_state=3)
    X = (X - X.mean(0)) / X.std(0)
    kernel = GaussianKernel(1.6)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(2.0 * y - 1.0).reshape(-1, 1), loss=get_loss("logistic"),
                 c=torch.full((len(y),), C, dtype=F64), kernel=kernel, options=SolverOptions(tol=1e-12, max_iter=60),
                 solver="newton", intercept=True)
    assert m.extra["solver"] == "newton" and "intercept_rounds" not in m.result.state
    assert m.result.status == "converged" and m.result.n_iter <= 40, (m.result.status, m.result.n_iter)
    assert abs(float(m.alpha.sum())) <= 1e-10 * float(m.alpha.abs().sum())
    b = float(m.result.state["intercept"][0])
    K = kernel(torch.as_tensor(X), torch.as_tensor(X))
    f = (K @ m.alpha).numpy()[:, 0] + b
    L = torch.linalg.cholesky(K + 1e-10 * torch.eye(len(y), dtype=F64)).numpy()
    sk = LogisticRegression(C=C, tol=1e-12, max_iter=100000).fit(L, y)
    f_sklearn = L @ sk.coef_[0] + sk.intercept_[0]
    # ours certified to a gap of 1e-12; lbfgs stops near 1e-7 of the optimum (relative): the decisions are compared
    np.testing.assert_allclose(f, f_sklearn, atol=2e-3 * np.abs(f_sklearn).max())
    assert b == pytest.approx(float(sk.intercept_[0]), abs=2e-3 * max(1.0, abs(b)))


@pytest.mark.parametrize("compute_dtype", [None, torch.float32])
def test_feature_newton_squared_is_ridge_in_one_conjugate_gradient_run(compute_dtype):
    """A quadratic primal: one Newton step whose CG stops at the duality gap (``k`` products plus the two
    gradient passes), landing on the ridge closed form ``(Phi^T C Phi + I) beta = Phi^T C y``; float32
    feature passes included (the float64 gradient pass certifies the gap)."""
    from joker_ext.features import RandomFeatureMap

    X, y = make_regression(n=500, seed=4)
    C = 50.0
    fmap = RandomFeatureMap(GaussianKernel(1.0), 120, seed=1, compute_dtype=compute_dtype)
    Xt = torch.as_tensor(X)
    op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), chunk_rows=128)
    res = feature_newton(op, torch.as_tensor(y).reshape(-1, 1), get_loss("squared"),
                         torch.full((500,), C, dtype=F64),
                         SolverOptions(max_iter=20, tol=1e-9, max_cg=200, newton_rank=5, newton_sketch_rows=100))
    assert res.status == "converged" and res.rel_gap <= 1e-9
    Phi = fmap(Xt)
    ref = torch.linalg.solve(C * Phi.T @ Phi + torch.eye(120, dtype=F64), C * Phi.T @ torch.as_tensor(y))
    np.testing.assert_allclose(res.state["beta"][:, 0].numpy(), ref.numpy(), rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
    if compute_dtype is None:  # float64 passes: the in-CG gap is exact, one Newton step suffices
        assert res.n_iter == 1 and res.history[-1]["passes"] > 10  # (a weak preconditioner: many CG steps)
        assert res.rel_gap > 1e-13  # stopped at the gap, not run on to a residual at rounding level

@pytest.mark.parametrize("max_cg", [1, 3, 10])
def test_feature_newton_budget_stop_inside_its_cg_run_returns_the_cg_iterate(max_cg):
    """Squared loss stopped by its budget inside its single CG run (``max_iter=1``, ``max_cg`` products; a GPU fit
    with ``max_time`` did the same): far from the optimum the relative gap is about 1 at the start and at the CG
    iterate alike (1 + 1e-6 against 1 + 1e-5), and the fit returned the zero start, whose gap was smaller. The
    returned model is the CG iterate: its primal objective, computed here from ``beta``, is the reported one and
    lies below the start's ``C / 2 sum y^2``."""
    from joker_ext.features import RandomFeatureMap

    X, y = make_regression(n=600, seed=5)
    C = 1e4
    fmap = RandomFeatureMap(GaussianKernel(1.0), 150, seed=1)
    Xt = torch.as_tensor(X)
    op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), chunk_rows=256)
    res = feature_newton(op, torch.as_tensor(y).reshape(-1, 1), get_loss("squared"), torch.full((600,), C, dtype=F64),
                         SolverOptions(max_iter=1, tol=1e-10, max_cg=max_cg, newton_rank=10, newton_sketch_rows=200))
    assert res.status == "max_iter" and res.rel_gap > 0.5  # far from the optimum, as in the bug
    beta = res.state["beta"][:, 0]
    residual = torch.as_tensor(y) - fmap(Xt) @ beta
    primal = 0.5 * float(beta @ beta) + 0.5 * C * float(residual @ residual)
    assert primal == pytest.approx(res.primal, rel=1e-9)
    assert primal < 0.9 * 0.5 * C * float(np.sum(y ** 2))


@pytest.mark.parametrize("loss", ["squared", "huber", "absolute"])
def test_feature_newton_feature_cache_gives_the_recomputed_fit_to_the_bit(loss):
    """``newton_cache`` keeps the Hessian products' feature chunks from the first product: the same chunks, the
    same numbers, hence the same iterates as computing them at every product (and the same count of products)."""
    from joker_ext.features import RandomFeatureMap

    X, y = make_regression(n=900, seed=7)
    fmap = RandomFeatureMap(GaussianKernel(1.0), 48, seed=3)
    kw = {"delta": 0.3} if loss == "huber" else {}
    fits = []
    for cache in (False, True):
        op = FeatureOperator(fmap, BlockData(torch.as_tensor(X), F64, torch.device("cpu")), chunk_rows=128)
        fits.append(feature_newton(op, torch.as_tensor(y).reshape(-1, 1), get_loss(loss, **kw),
                                   torch.full((900,), 10.0, dtype=F64),
                                   SolverOptions(max_iter=100, tol=1e-10, newton_rank=8, newton_sketch_rows=300,
                                                 newton_cache=cache)))
    assert fits[0].status == fits[1].status == "converged"
    assert torch.equal(fits[0].state["beta"], fits[1].state["beta"])
    assert fits[0].history[-1]["passes"] == fits[1].history[-1]["passes"] > 5


def _count_hessian_forming(monkeypatch) -> list:
    """A list that grows by one each time the feature Newton engine forms its Hessian (``_Passes.exact_hessian``)."""
    import joker_ext.primal_newton as pn

    formed = []
    exact_hessian = pn._Passes.exact_hessian

    def counted(self, *args, **kwargs):
        formed.append(1)
        return exact_hessian(self, *args, **kwargs)

    monkeypatch.setattr(pn._Passes, "exact_hessian", counted)
    return formed


def test_feature_newton_forms_the_hessian_when_its_steps_crawl(monkeypatch):
    """Logistic loss, random features not kept, a sketch on 60 of 1500 rows and three conjugate-gradient products per
    Newton step: the truncated steps are whole, yet the relative gap stays near 1 (three products from a sketch of so
    few rows leave them far from the Newton step). After CRAWL_STEPS such steps the Hessian is formed (from a pass), and the fit
    ends at scikit-learn's LogisticRegression on the same features; with that rule switched off (and too few
    products per step for the other one) the gap is still 1 after 40 iterations."""
    from sklearn.linear_model import LogisticRegression

    import joker_ext.primal_newton as pn
    from joker_ext.features import RandomFeatureMap

    X, y = make_binary(n=1500, d=4, seed=3)
    C = 300.0
    fmap = RandomFeatureMap(GaussianKernel(1.0), 200, seed=2)
    Xt = torch.as_tensor(X)
    formed = _count_hessian_forming(monkeypatch)
    fits, rule = {}, pn.CRAWL_RATIO
    for ratio in (rule, math.inf):
        monkeypatch.setattr(pn, "CRAWL_RATIO", ratio)
        formed.clear()
        op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), chunk_rows=256)
        fits[ratio] = (feature_newton(op, torch.as_tensor(y).reshape(-1, 1), get_loss("logistic"),
                                      torch.full((1500,), C, dtype=F64),
                                      SolverOptions(max_iter=40, tol=1e-12, max_cg=3, newton_sketch_rows=60,
                                                    newton_cache=False)), len(formed))
    crawl, formed_crawl = fits[rule]
    plain, formed_plain = fits[math.inf]
    assert crawl.status == "converged" and formed_crawl > 0, (crawl.status, crawl.n_iter, crawl.rel_gap)
    assert formed_plain == 0 and plain.status == "max_iter" and plain.rel_gap > 0.5
    Phi = fmap(Xt).numpy()
    sk = LogisticRegression(C=C, fit_intercept=False, tol=1e-12, max_iter=100000).fit(Phi, (y > 0).astype(int))
    f = Phi @ crawl.state["beta"][:, 0].numpy()
    f_sklearn = Phi @ sk.coef_[0]
    np.testing.assert_allclose(f, f_sklearn, atol=1e-4 * np.abs(f_sklearn).max())


def _float32_ridge(n, M, C, seed=3):
    """Squared loss on float32 random features solved in float64 (the Hessian products run in float32): the
    operator, the targets, and the closed-form ridge weights on the same (rounded) features."""
    from joker_ext.features import RandomFeatureMap

    X, y = make_regression(n=n, d=4, seed=seed)
    fmap = RandomFeatureMap(GaussianKernel(1.0), M, seed=2, compute_dtype=torch.float32)
    Xt = torch.as_tensor(X)
    op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), chunk_rows=256)
    Phi = fmap(Xt).double().numpy()
    beta = np.linalg.solve(np.eye(Phi.shape[1]) + C * Phi.T @ Phi, C * Phi.T @ y)
    return op, torch.as_tensor(y).reshape(-1, 1), Phi, beta


def test_feature_newton_quadratic_cg_refreshes_its_float32_residual(monkeypatch):
    """Squared loss, float32 Hessian products, C = 1e4 (a sketch on 1000 of 2000 rows, no Hessian formed), one Newton
    step of at most 300 products. The CG recurrence's residual carries an error of float32's rounding times the
    first residual's norm: unrefreshed, it reaches its target (or its gap test closes) where the true gap is still
    above 1e-6. Refreshed from passes in float64 each time it has fallen 1e4-fold, the one run ends within a gap
    of 1e-8; given three Newton iterations the fit converges to 1e-10, at the closed-form ridge solution on the
    same features."""
    import joker_ext.primal_newton as pn

    monkeypatch.setattr(pn, "KINKED_HESSIAN_MAX_FEATURES", 16)  # (the sketch throughout)
    C, n = 1e4, 2000
    op, Y, Phi, beta = _float32_ridge(n, 200, C)

    def fit(max_iter):
        opts = SolverOptions(max_iter=max_iter, tol=1e-10, max_cg=300, newton_sketch_rows=1000, newton_cache=False)
        return feature_newton(op, Y, get_loss("squared"), torch.full((n,), C, dtype=F64), opts)

    one_run = fit(1)
    assert one_run.rel_gap <= 1e-8, (one_run.status, one_run.rel_gap)
    res = fit(3)
    assert res.status == "converged" and res.rel_gap <= 1e-10, (res.status, res.rel_gap)
    f = Phi @ res.state["beta"][:, 0].numpy()
    np.testing.assert_allclose(f, Phi @ beta, atol=1e-6 * np.abs(Phi @ beta).max())
    monkeypatch.setattr(pn, "REFRESH_DROP", 0.0)
    stale = fit(1)
    assert stale.rel_gap > 1e-6, (stale.status, stale.rel_gap)


def test_feature_newton_quadratic_forms_the_hessian_where_its_first_cg_run_falls_short(monkeypatch):
    """Squared loss, C = 1e5, features not kept, a sketch on 40 of 2000 rows and 30 products per run: where the
    Hessian can be formed from a pass (M <= KINKED_HESSIAN_MAX_FEATURES, no rank asked for), the first run's shortfall
    forms it and the fit converges within 4 Newton iterations to the closed-form ridge solution; with the sketch
    throughout, 4 iterations (up to 120 products) leave the gap far above the tolerance."""
    import joker_ext.primal_newton as pn

    C = 1e5
    op, Y, Phi, beta = _float32_ridge(2000, 200, C)
    opts = SolverOptions(max_iter=4, tol=1e-9, max_cg=30, newton_sketch_rows=40, newton_cache=False)
    formed = _count_hessian_forming(monkeypatch)
    monkeypatch.setattr(pn, "EXACT_HESSIAN_MAX_FEATURES", 16)  # (not formed from the start)
    res = feature_newton(op, Y, get_loss("squared"), torch.full((2000,), C, dtype=F64), opts)
    assert res.status == "converged" and formed, (res.status, res.rel_gap, len(formed))
    f = Phi @ res.state["beta"][:, 0].numpy()
    np.testing.assert_allclose(f, Phi @ beta, atol=1e-6 * np.abs(Phi @ beta).max())
    monkeypatch.setattr(pn, "KINKED_HESSIAN_MAX_FEATURES", 16)
    sketch = feature_newton(op, Y, get_loss("squared"), torch.full((2000,), C, dtype=F64), opts)
    assert sketch.status == "max_iter" and sketch.rel_gap > 1e-6, (sketch.status, sketch.rel_gap)


def test_feature_newton_quadratic_cg_run_stops_inside_at_max_time(monkeypatch):
    """``max_time`` is read inside the squared loss's long CG run, not only between Newton iterations: with the
    budget spent after the run's fifth product (``Monitor.out_of_time`` made to say so), the fit ends 'max_time' a
    product or two later instead of running its 100 products."""
    import joker_ext.engines as engines
    import joker_ext.primal_newton as pn

    monkeypatch.setattr(pn, "KINKED_HESSIAN_MAX_FEATURES", 16)
    op, Y, _, _ = _float32_ridge(1000, 100, 1e5)
    asked = []
    monkeypatch.setattr(engines.Monitor, "out_of_time", lambda self: asked.append(1) or len(asked) > 4)
    res = feature_newton(op, Y, get_loss("squared"), torch.full((1000,), 1e5, dtype=F64),
                         SolverOptions(max_iter=1, tol=1e-14, max_cg=100, newton_sketch_rows=40, newton_cache=False,
                                       max_time=1e9))
    assert res.status == "max_time" and res.history[-1]["passes"] <= 1 + 5 + 3, (res.status, res.history[-1])


def test_feature_newton_intercept_steps_converge_where_the_schur_complement_cancels(monkeypatch):
    """Logistic loss with the intercept on random features (a sketch on 300 of 3000 rows, C = 1000, no Hessian formed):
    the Newton step's intercept comes from the Schur complement ``sum w - v^T H^{-1} v``, a difference of nearly equal
    terms. With ``H^{-1} v`` solved only to the gradient's relative residual the intercept swung from step to step
    and the gap stayed near 1e-4 for 30 iterations; solved to its square, the fit converges and is scikit-learn's
    LogisticRegression (unpenalised intercept) on the same features."""
    from sklearn.linear_model import LogisticRegression

    import joker_ext.primal_newton as pn
    from joker_ext.features import RandomFeatureMap

    monkeypatch.setattr(pn, "KINKED_HESSIAN_MAX_FEATURES", 16)  # (the sketch throughout)
    X, y = make_binary(n=3000, d=4, seed=3)
    C = 1000.0
    fmap = RandomFeatureMap(GaussianKernel(1.0), 300, seed=2)
    Xt = torch.as_tensor(X)
    op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), chunk_rows=256)
    res = feature_newton(op, torch.as_tensor(y).reshape(-1, 1), get_loss("logistic"), torch.full((3000,), C, dtype=F64),
                         SolverOptions(max_iter=40, tol=1e-12, max_cg=50, newton_sketch_rows=300, newton_cache=False),
                         intercept=True)
    assert res.status == "converged", (res.status, res.n_iter, res.rel_gap)
    Phi = fmap(Xt).numpy()
    sk = LogisticRegression(C=C, solver="newton-cholesky", tol=1e-12, max_iter=1000).fit(Phi, (y > 0).astype(int))
    f = Phi @ res.state["beta"][:, 0].numpy() + float(res.state["intercept"][0])
    f_sklearn = sk.decision_function(Phi)
    np.testing.assert_allclose(f, f_sklearn, atol=1e-4 * np.abs(f_sklearn).max())


@pytest.mark.parametrize("loss", ["hinge", "absolute"])
def test_feature_newton_exact_hessian_takes_one_cg_step_per_newton_step_to_cvxpys_optimum(loss, monkeypatch):
    """Kept features and a rank covering all M features, or no rank given and M <= EXACT_HESSIAN_MAX_FEATURES (here
    with a default rank of 8, below M): the Newton systems take the Hessian itself (:class:`ExactHessian`, formed in
    one pass), so every Newton step is one gradient pass, one pass forming the matrix and one CG product (two when
    the preconditioned residual rounds off). Against the rank-8 sketch on a sample of rows and against cvxpy on the
    same features. (The Newton steps alone: the kinked losses' starts, which would end these fits, are tested in
    test_feature_interior.py and below.)"""
    cp = pytest.importorskip("cvxpy")
    import joker_ext.primal_newton as pn
    from joker_ext.features import RandomFeatureMap

    monkeypatch.setattr(pn, "default_rank", lambda n_features, device=None: min(n_features, 8))
    monkeypatch.setattr(pn, "worth_starting", lambda *args: False)
    monkeypatch.setattr(pn, "_working_set_start", lambda *args: None)

    X, y = make_regression(n=600, seed=8)
    if loss == "hinge":
        y = np.where(y > np.median(y), 1.0, -1.0)
    M, C = 40, 10.0
    fmap = RandomFeatureMap(GaussianKernel(1.0), M, seed=4)
    fits = {}
    for rank in (M, None, 8):
        op = FeatureOperator(fmap, BlockData(torch.as_tensor(X), F64, torch.device("cpu")), chunk_rows=128)
        fits[rank] = feature_newton(op, torch.as_tensor(y).reshape(-1, 1), get_loss(loss),
                                    torch.full((600,), C, dtype=F64),
                                    SolverOptions(max_iter=300, tol=1e-11, newton_rank=rank, newton_sketch_rows=200))
        assert fits[rank].status == "converged", (rank, fits[rank].status, fits[rank].rel_gap)
    Phi = fmap(torch.as_tensor(X)).numpy()
    beta = cp.Variable(M)
    f = Phi @ beta
    terms = cp.abs(y - f) if loss == "absolute" else cp.pos(1 - cp.multiply(y, f))
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(beta) + C * cp.sum(terms)))
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    for res in fits.values():
        assert res.primal == pytest.approx(prob.value, rel=1e-8)
    sketch = fits[8]
    for exact in (fits[M], fits[None]):
        passes_per_step = exact.history[-1]["passes"] / exact.n_iter
        # (3-4 a step; the odd step takes one more pass: 45 in 11 steps with numpy 2.4, scipy 1.17; the sketch 19-29)
        assert passes_per_step <= 4.5 < 10.0 < sketch.history[-1]["passes"] / sketch.n_iter


def test_hinge_on_kept_features_is_solved_by_the_working_set_start_to_cvxpys_optimum():
    """The hinge loss on kept features (two target columns, unequal sample costs, C up to 1e4): the working-set
    engine on the features' linear kernel ends the fit in one iteration of the Newton engine at cvxpy's optimum of
    each column, where the continuation alone needs tens of Newton iterations."""
    cp = pytest.importorskip("cvxpy")
    X, y = make_regression(n=500, seed=3)
    Y = torch.as_tensor(np.stack([np.where(y > np.median(y), 1.0, -1.0), np.where(X[:, 0] > 0.2, 1.0, -1.0)], 1))
    c = torch.as_tensor(np.where(np.arange(500) % 3 == 0, 1e4, 30.0))
    fmap = make_feature_map(GaussianKernel(1.0), 60, seed=2)
    op = FeatureOperator(fmap, BlockData(torch.as_tensor(X), F64, torch.device("cpu")), chunk_rows=128)
    res = feature_newton(op, Y, get_loss("hinge"), c, SolverOptions(max_iter=20, tol=1e-10))
    assert res.status == "converged" and res.n_iter == 1 and res.rel_gap <= 1e-10
    Phi = fmap(torch.as_tensor(X)).numpy()
    for t in range(2):
        b = cp.Variable(60)
        prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(b)
                                      + cp.sum(cp.multiply(c.numpy(), cp.pos(1 - cp.multiply(Y[:, t].numpy(), Phi @ b))))))
        prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
        beta = res.state["beta"][:, t].numpy()
        value = 0.5 * beta @ beta + float((c.numpy() * np.maximum(1 - Y[:, t].numpy() * (Phi @ beta), 0)).sum())
        assert value == pytest.approx(prob.value, rel=1e-8)


@pytest.mark.parametrize("name", KINKED)
def test_feature_newton_finishing_step_lands_on_the_exact_kkt_point_of_the_feature_problem(name):
    """Kept features and M <= EXACT_HESSIAN_MAX_FEATURES, a kinked loss, two target columns: once a smoothed
    problem's dual solution has at most M free coordinates, the finishing step solves the free rows for those sets.
    The fit ends at cvxpy's optimum with every free coordinate's row on its margin, ``f_i = y_i - psi'(a_i) - kink
    sign(a_i)``, to rounding (the smoothed solutions' margins stayed 9e-13 to 3e-10 off, their gaps 1e-14 to 6e-12)."""
    pytest.importorskip("cvxpy")
    from joker_ext.features import RandomFeatureMap

    loss, X, y = _problem(name, n=600, seed=8)
    Y = np.stack([y, np.cos(2 * y) if not loss.margin else -y], axis=1)
    fmap = RandomFeatureMap(GaussianKernel(1.0), 40, seed=4)
    op = FeatureOperator(fmap, BlockData(torch.as_tensor(X), F64, torch.device("cpu")), chunk_rows=128)
    Yt, c = torch.as_tensor(Y), torch.full((600, 2), 10.0, dtype=F64)
    res = feature_newton(op, Yt, loss, c[:, 0], SolverOptions(max_iter=300, tol=1e-15))
    assert res.status == "converged" and res.rel_gap <= 1e-15
    Phi = fmap(torch.as_tensor(X))
    f, a = Phi @ res.state["beta"], res.alpha
    lo, hi = loss.box(Yt, c)
    free = (a > lo + 1e-9) & (a < hi - 1e-9) & ((a.abs() > 1e-9) if loss.kink else True)
    margin = Yt - loss.psi_grad(torch.zeros_like(Yt), Yt, c) - loss.kink * torch.sign(a)
    assert int(free.sum()) > 20
    assert float((f - margin)[free].abs().max()) <= 1e-12
    K = (Phi @ Phi.T).numpy()
    assert res.primal == pytest.approx(sum(cvxpy_primal(name, K, Y[:, t], c[:, t].numpy()) for t in range(2)),
                                       rel=1e-8)


def _kinked_feature_problem(name, kind, n=600, M=40):
    from joker_ext.features import NystromFeatureMap, RandomFeatureMap

    loss, X, y = _problem(name, n=n, seed=3)
    Xt = torch.as_tensor(X)
    fmap = NystromFeatureMap(GaussianKernel(1.0), Xt[::n // M][:M]) if kind == "nystrom" else \
        RandomFeatureMap(GaussianKernel(1.0), M, seed=4)
    return loss, Xt, torch.as_tensor(y).reshape(-1, 1), fmap


@pytest.mark.parametrize("kind", ["nystrom", "random"])
def test_band_hessian_is_the_hessian_of_all_rows(kind):
    """:meth:`_Passes.exact_hessian` over the rows with curvature (from the band's features alone, from a pass, or
    from the kept features) is ``I + Phi^T W Phi`` formed from the explicit feature matrix."""
    from joker_ext.distributed import SingleProcess
    from joker_ext.primal_newton import _Passes

    loss, Xt, Y, fmap = _kinked_feature_problem("hinge", kind)
    Phi = fmap(Xt)
    g = torch.Generator().manual_seed(0)
    for share in (0.05, 0.9, 1.0):
        W = torch.rand(600, 1, generator=g, dtype=F64) * (torch.rand(600, 1, generator=g, dtype=F64) < share)
        ref = torch.eye(40, dtype=F64) + Phi.T @ (W * Phi)
        for cache in (False, True):
            op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), chunk_rows=128)
            passes = _Passes(op, Y, loss, torch.ones(600, 1, dtype=F64), SingleProcess(), cache=cache)
            if cache:
                passes.hessian_product(torch.zeros(40, 1, dtype=F64), W)  # fills the feature cache
            L = passes.exact_hessian(W, 0).L
            torch.testing.assert_close(L @ L.T, ref, rtol=1e-11, atol=1e-10)


@pytest.mark.parametrize("kind", ["nystrom", "random"])
@pytest.mark.parametrize("name", ["hinge", "epsilon_insensitive"])
def test_kinked_losses_take_the_band_hessian_without_kept_features(name, kind, monkeypatch):
    """A kinked loss, no ``newton_rank``, features not kept, the continuation alone (no interior-point start): the
    Newton steps take the Hessian of the band's rows (one gradient pass, one forming it and one or two CG products
    per step) where Falkon's preconditioner (Nystrom features) or a sketch on 100 sampled rows took 22-33 passes per
    step; the fit ends at cvxpy's optimum of the same features."""
    import joker_ext.primal_newton as pn

    pytest.importorskip("cvxpy")
    monkeypatch.setattr(pn, "worth_starting", lambda *args: False)
    loss, Xt, Y, fmap = _kinked_feature_problem(name, kind)
    op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), chunk_rows=128)
    c = torch.full((600,), 10.0, dtype=F64)
    res = feature_newton(op, Y, loss, c, SolverOptions(max_iter=300, tol=1e-12, newton_cache=False,
                                                       newton_sketch_rows=100))
    assert res.status == "converged"
    assert res.history[-1]["passes"] <= 5 * res.n_iter + 10
    Phi = fmap(Xt)
    assert res.primal == pytest.approx(cvxpy_primal(name, (Phi @ Phi.T).numpy(), Y[:, 0].numpy(), c.numpy()),
                                       rel=1e-8)


@pytest.mark.parametrize("name", ["epsilon_insensitive", "absolute", "pinball"])
def test_interior_start_without_kept_features_converges_at_cvxpy(name):
    """Features not kept (each of the interior point's products is a pass over the data): the interior-point start
    still runs and, with the continuation after it, the fit meets ``tol`` within Falkon's default 20 iterations, at
    cvxpy's optimum of the same features (without the start: 40-100 iterations at 2-3 passes each)."""
    pytest.importorskip("cvxpy")
    loss, Xt, Y, fmap = _kinked_feature_problem(name, "nystrom")
    op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), chunk_rows=128)
    c = torch.full((600,), 10.0, dtype=F64)
    res = feature_newton(op, Y, loss, c, SolverOptions(max_iter=20, tol=1e-10, newton_cache=False))
    assert res.status == "converged" and res.n_iter <= 20
    assert res.history[0]["smoothing"] == 0.0  # the first records are the interior point's iterates
    Phi = fmap(Xt)
    assert res.primal == pytest.approx(cvxpy_primal(name, (Phi @ Phi.T).numpy(), Y[:, 0].numpy(), c.numpy()),
                                       rel=1e-8)


@pytest.mark.parametrize("n", [0, 1, 7, 64, 200])
def test_row_block_sums_equal_the_whole_sums_empty_shards_included(n):
    from joker_ext.primal_newton import _row_sums

    A = torch.randn(n, 3, dtype=F64, generator=torch.Generator().manual_seed(n))
    s, q = _row_sums(lambda lo, hi: (A[lo:hi].sum(0), (A[lo:hi] ** 2).sum(0)), n, rows=16)
    torch.testing.assert_close(s, A.sum(0), rtol=1e-14, atol=1e-13)
    torch.testing.assert_close(q, (A ** 2).sum(0), rtol=1e-14, atol=1e-13)
    assert s.shape == (3,)


@pytest.mark.parametrize("source", ["tensor", "numpy"])
def test_feature_newton_streamed_inputs_give_the_resident_fit(monkeypatch, source):
    """Inputs not resident on the device are copied in spans of whole chunks (``STREAM_BYTES``, here 3 chunks and a
    ragged last span): the same chunk boundaries as slices of a resident copy, hence the same fit to the bit, on
    float32 inputs of a float64 fit (the spans converted once to the pass dtype); squared and a kinked loss."""
    import joker_ext.primal_newton as pn
    from joker_ext.features import RandomFeatureMap

    X, y = make_regression(n=1000, seed=6)
    Xs = X.astype(np.float32) if source == "numpy" else torch.as_tensor(X, dtype=torch.float32)
    fmap = RandomFeatureMap(GaussianKernel(1.0), 64, seed=2, compute_dtype=torch.float32)
    chunk = 96
    monkeypatch.setattr(pn, "STREAM_BYTES", 3 * chunk * X.shape[1] * 4 + 5)
    for loss in (get_loss("squared"), get_loss("huber", delta=0.2)):
        fits = []
        for resident in (True, False):
            op = FeatureOperator(fmap, BlockData(Xs, F64, torch.device("cpu")), chunk_rows=chunk)
            fits.append(feature_newton(op, torch.as_tensor(y).reshape(-1, 1), loss,
                                       torch.full((1000,), 10.0, dtype=F64),
                                       SolverOptions(max_iter=30, tol=1e-10, newton_rank=8, newton_sketch_rows=200,
                                                     newton_resident=resident)))
        assert fits[0].status == fits[1].status == "converged"
        assert torch.equal(fits[0].state["beta"], fits[1].state["beta"])
        assert fits[0].history[-1]["passes"] == fits[1].history[-1]["passes"]


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


QUADRATIC_CONJ = ["squared", "huber", "squared_hinge"] + KINKED


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("name", QUADRATIC_CONJ)
def test_active_set_reaches_the_cvxpy_optimum(name, intercept):
    pytest.importorskip("cvxpy")
    loss, X, y = _problem(name, n=160, seed=4)
    kernel = GaussianKernel(1.0)
    c = torch.full((len(y),), 3.0, dtype=F64)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=c, kernel=kernel,
                 options=SolverOptions(max_iter=100, tol=1e-10), solver="active_set", intercept=intercept)
    res = m.result
    assert res.status == "converged" and res.rel_gap <= 1e-10
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    assert res.primal == pytest.approx(cvxpy_primal(name, K, y, c.numpy(), intercept=intercept), rel=1e-6)
    lo, hi = loss.box(torch.as_tensor(y).reshape(-1, 1), c.reshape(-1, 1))
    assert bool(((m.alpha >= lo) & (m.alpha <= hi)).all())  # dual feasible
    if intercept:  # the intercept's constraint, and b is the multiplier: the primal at (K alpha + b) is optimal
        assert abs(float(m.alpha.sum())) <= 1e-9 * float(m.alpha.abs().sum())
        f = torch.as_tensor(K) @ m.alpha + res.state["intercept"]
        primal = 0.5 * float((m.alpha * (f - res.state["intercept"])).sum()) + \
            float((c.reshape(-1, 1) * loss.value(torch.as_tensor(y).reshape(-1, 1), f)).sum())
        assert primal == pytest.approx(res.primal, rel=1e-12)


def _libsvm_and_ours(X, sigma, ref, m):
    """The Gram matrix, libsvm's dual coefficients and decision values on X, and ours; asserts that the two
    decision functions agree (the primal is strongly convex in f)."""
    K = GaussianKernel(sigma)(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    a_ref = np.zeros(len(X))
    a_ref[ref.support_] = ref.dual_coef_[0]
    f_ref = K @ a_ref + ref.intercept_[0]
    f = K @ m.alpha[:, 0].numpy() + float(m.result.state["intercept"][0])
    np.testing.assert_allclose(f, f_ref, atol=2e-3 * np.abs(f_ref).max())
    return K, a_ref, f_ref, f


@pytest.mark.parametrize("solver", ["active_set", "working_set"])
@pytest.mark.parametrize("C", [1.0, 50.0])
def test_hinge_with_intercept_is_libsvm_svc(C, solver):
    """Beyond BASE_ROWS rows (the coarse start runs): the SVC of LIBSVM, solved to a tight tolerance."""
    from sklearn.svm import SVC

    X, y = make_binary(n=1500, d=4, seed=7)
    sigma = 1.5
    svc = SVC(C=C, gamma=1.0 / (2 * sigma ** 2), tol=1e-8).fit(X, y)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("hinge"),
                 c=torch.full((len(y),), C, dtype=F64), kernel=GaussianKernel(sigma),
                 options=SolverOptions(tol=1e-12, max_iter=300), solver=solver, intercept=True)
    assert m.result.status == "converged" and m.result.rel_gap <= 1e-12
    # the primal is strongly convex in f: the decision functions agree, and ours is at least as good
    K, a_ref, f_ref, f = _libsvm_and_ours(X, sigma, svc, m)

    def primal(a, f):
        return 0.5 * a @ K @ a + C * np.maximum(0.0, 1.0 - y * f).sum()

    assert primal(m.alpha[:, 0].numpy(), f) <= primal(a_ref, f_ref) * (1 + 1e-9)


@pytest.mark.parametrize("solver", ["active_set", "working_set"])
@pytest.mark.parametrize("name, C", [("hinge", 0.3), ("epsilon_insensitive", 0.3), ("absolute", 1.0)])
def test_active_set_steps_stop_between_the_bounds(monkeypatch, solver, name, C):
    """At small C many prox-gradient points lie beyond the whole box. Within a round, no coordinate goes from one
    bound of its box straight to the other (it stops free, or at the kink where the kink is inside the box), the
    stop is exercised, and the fit reaches cvxpy's optimum with the intercept."""
    pytest.importorskip("cvxpy")
    import joker_ext.active_set as act
    import joker_ext.working_set as ws

    monkeypatch.setattr(ws, "USE_SMO", False)  # the decomposition's own rounds, from zero

    jumps, stopped = [], []
    stop = act._Column._stop_on_the_way

    def spy_stop(self, code, sgn, new_code, new_sgn, new_value):
        stopped.append(int(((code * new_code) == act.LOWER * act.UPPER).sum()))
        return stop(self, code, sgn, new_code, new_sgn, new_value)

    round_ = act._Column.round

    def spy_round(self, *args, **kwargs):
        codes, solve = [], self.solve

        def recording(code, *rest, **kw):
            codes.append(code.clone())
            return solve(code, *rest, **kw)

        self.solve = recording
        try:
            return round_(self, *args, **kwargs)
        finally:
            del self.solve
            for old, new in zip(codes, codes[1:]):
                lower_upper = ((old == act.LOWER) & (new == act.UPPER)) | ((old == act.UPPER) & (new == act.LOWER))
                jumps.append(int(lower_upper.sum()))

    monkeypatch.setattr(act._Column, "_stop_on_the_way", spy_stop)
    monkeypatch.setattr(act._Column, "round", spy_round)
    loss, X, y = _problem(name, n=300, seed=3)
    c = torch.full((len(y),), C, dtype=F64)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=c, kernel=GaussianKernel(0.5),
                 options=SolverOptions(tol=1e-10, max_iter=2000), solver=solver, intercept=True)
    assert m.result.status == "converged" and m.result.rel_gap <= 1e-10
    assert sum(stopped) > 0 and not any(jumps)
    K = GaussianKernel(0.5)(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    assert m.result.primal == pytest.approx(cvxpy_primal(name, K, y, c.numpy(), intercept=True), rel=1e-6)


@pytest.mark.parametrize("cache_columns", [40, None])
@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("name", KINKED + ["squared_hinge"])
def test_working_set_reaches_the_cvxpy_optimum(name, intercept, cache_columns):
    """Small working sets (24 of 160 coordinates; their cap of 2 q = 48 must grow where the solution has
    more free coordinates, e.g. absolute) with a row cache smaller than the union of the sets touched (LRU
    eviction) or the default one (all of K, formed lazily): the decomposition, its cache and its
    intercept bookkeeping, against cvxpy."""
    pytest.importorskip("cvxpy")
    from joker_ext.working_set import working_set

    loss, X, y = _problem(name, n=160, seed=4)
    kernel = GaussianKernel(1.0)
    c = torch.full((len(y),), 3.0, dtype=F64)
    op = ExactOperator(kernel, BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    res = working_set(op, torch.as_tensor(y).reshape(-1, 1), loss, c, SolverOptions(max_iter=2000, tol=1e-10),
                      intercept=intercept, working_set_size=24, cache_columns=cache_columns)
    assert res.status == "converged" and res.rel_gap <= 1e-10
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    assert res.primal == pytest.approx(cvxpy_primal(name, K, y, c.numpy(), intercept=intercept), rel=1e-6)
    lo, hi = loss.box(torch.as_tensor(y).reshape(-1, 1), c.reshape(-1, 1))
    assert bool(((res.alpha >= lo) & (res.alpha <= hi)).all())
    np.testing.assert_allclose(res.state["f"].numpy(), K @ res.alpha.numpy(), atol=1e-9)  # f kept = K alpha
    if intercept:
        assert abs(float(res.alpha.sum())) <= 1e-9 * float(res.alpha.abs().sum())


@pytest.mark.parametrize("name", ["hinge", "epsilon_insensitive"])
def test_working_set_first_step_frees_only_the_worst_violators(monkeypatch, name):
    """With FIRST_FREE = 4, a subproblem's first active-set step moves at most 4 violators off their status
    (the others keep theirs, the free ones stay free), and the decomposition still reaches cvxpy's optimum
    with the intercept."""
    pytest.importorskip("cvxpy")
    import joker_ext.working_set as ws

    monkeypatch.setattr(ws, "USE_SMO", False)  # the decomposition's own first steps, from zero

    monkeypatch.setattr(ws, "FIRST_FREE", 4)
    seen = []
    first_sets = ws._first_sets

    def spy(sub, a, f, b, sigma, keep=None):
        code, sgn, value = first_sets(sub, a, f, b, sigma, keep)
        cur = sub.status(a)
        moved = int(((code != cur[0]) | (sgn != cur[1])).sum())
        pred = sub.predict(a, f, b, sigma / sub.c, a)
        free = int((cur[0] == 0).sum())
        limit = 4 * max(1, free // 4) if keep is None else keep
        seen.append((moved, int(((pred[0] != cur[0]) | (pred[1] != cur[1])).sum()), limit))
        return code, sgn, value

    monkeypatch.setattr(ws, "_first_sets", spy)
    loss, X, y = _problem(name, n=160, seed=4)
    kernel = GaussianKernel(1.0)
    c = torch.full((len(y),), 3.0, dtype=F64)
    op = ExactOperator(kernel, BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    res = ws.working_set(op, torch.as_tensor(y).reshape(-1, 1), loss, c, SolverOptions(max_iter=2000, tol=1e-10),
                         intercept=True, working_set_size=24)
    assert res.status == "converged" and res.rel_gap <= 1e-10
    assert all(moved <= limit for moved, _, limit in seen)
    assert any(would > limit for _, would, limit in seen)  # the limit was exercised
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    assert res.primal == pytest.approx(cvxpy_primal(name, K, y, c.numpy(), intercept=True), rel=1e-6)


def test_working_set_epsilon_insensitive_is_libsvm_svr():
    """The default engine for epsilon-insensitive with an intercept is LIBSVM's SVR, solved tightly."""
    from sklearn.svm import SVR

    X, y = make_regression(n=1500, seed=8)
    sigma, C, eps = 1.5, 5.0, 0.1
    svr = SVR(C=C, gamma=1.0 / (2 * sigma ** 2), epsilon=eps, tol=1e-8).fit(X, y)
    loss = get_loss("epsilon_insensitive", epsilon=eps)
    assert resolve_solver("auto", "exact", 1500, 8, loss) == "working_set"
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss,
                 c=torch.full((len(y),), C, dtype=F64), kernel=GaussianKernel(sigma),
                 options=SolverOptions(tol=1e-12, max_iter=300), solver="auto", intercept=True)
    assert m.extra["solver"] == "working_set"
    assert m.result.status == "converged" and m.result.rel_gap <= 1e-12
    K, a_ref, f_ref, f = _libsvm_and_ours(X, sigma, svr, m)

    def primal(a, f):
        return 0.5 * a @ K @ a + C * np.maximum(0.0, np.abs(y - f) - eps).sum()

    assert primal(m.alpha[:, 0].numpy(), f) <= primal(a_ref, f_ref) * (1 + 1e-9)


def _recorded_subproblem_sizes(monkeypatch) -> list:
    """The sizes of the working sets that :func:`joker_ext.working_set._subproblem` solves from now on (the list
    fills as they are solved)."""
    import joker_ext.working_set as ws

    sizes, subproblem = [], ws._subproblem

    def recording(col, K_BB, B, *args, **kw):
        sizes.append(B.numel())
        return subproblem(col, K_BB, B, *args, **kw)

    monkeypatch.setattr(ws, "_subproblem", recording)
    return sizes


def test_a_round_whose_sets_keep_changing_is_abandoned_at_the_stall_step():
    """A proximal round whose predicted sets keep changing as many coordinates as at its first step (here sets drawn
    at random at every step) is abandoned at step ``STALL_STEP`` with ``stall``, and runs to its step limit without."""
    from joker_ext.active_set import MAX_INNER, STALL_STEP, _Column

    n = 200
    X, y = make_binary(n=n, seed=2)
    K = GaussianKernel(1.0)(torch.as_tensor(X), torch.as_tensor(X))
    col = _Column(K, K.diagonal().clone(), get_loss("hinge"), torch.as_tensor(y), torch.full((n,), 2.0, dtype=F64),
                  True)
    rng = np.random.default_rng(0)
    width = (col.hi - col.lo).clamp(max=4.0)
    col.predict = lambda a, f, b, s, abar: col._sets(
        col.lo - 0.5 * width + 2 * width * torch.as_tensor(rng.random(n)), torch.ones(n, dtype=F64))
    solves = []
    solve = col.solve
    col.solve = lambda *args, **kw: solves.append(1) or solve(*args, **kw)
    a = torch.zeros(n, dtype=F64)
    assert col.round(a, a.clone(), 0.0, a.clone(), 1e-6, stall=0.75) is None
    assert len(solves) == STALL_STEP
    solves.clear()
    assert col.round(a, a.clone(), 0.0, a.clone(), 1e-6) is None
    assert len(solves) == MAX_INNER


def test_box_check_refuses_a_coefficient_beyond_its_box_and_passes_rounding():
    """The certificate's check of feasibility: the hinge dual's box is ``[0, C]`` for ``y = +1`` and ``[-C, 0]`` for
    ``y = -1``; a coefficient 0.1 beyond it raises (naming its row), one a few units in the last place beyond does
    not."""
    from joker_ext.active_set import _BoxCheck, _Column

    n, C = 40, 2.0
    y = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    c = torch.full((n,), C, dtype=F64)
    check = _BoxCheck([_Column(None, torch.ones(n, dtype=F64), get_loss("hinge"), torch.as_tensor(y), c, True)])
    alpha = torch.as_tensor(np.where(y > 0, C, -C)).reshape(n, 1)  # every coefficient at its outer bound
    check(alpha)
    alpha[4, 0] = C * (1 + 4 * np.finfo(np.float64).eps)
    alpha[7, 0] = -C * (1 + 4 * np.finfo(np.float64).eps)
    check(alpha)
    alpha[6, 0] = 0.1  # y = +1's box is [0, C]: inside
    alpha[9, 0] = 0.1  # y = -1's box is [-C, 0]: 0.1 beyond
    with pytest.raises(RuntimeError, match="row 9, column 0"):
        check(alpha)


def test_stalling_subproblems_escalate_their_weight_and_reach_libsvm(monkeypatch):
    """make_moons at ten times scikit-learn's 'scale' gamma, C = 10 (n = 4000, hinge with an intercept): subproblems
    whose rounds stall at small proximal weights (abandoned, the weight escalated) and whose interior-point solution
    will not snap to the active sets its prediction gives (weakly active coordinates; the crossover finds that few of
    them lie between strictly active and free, so the column's later subproblems skip the interior point). The fit
    reaches LIBSVM's optimum (tol 1e-8) with a certified gap."""
    from sklearn.datasets import make_moons
    from sklearn.svm import SVC

    import joker_ext.active_set as act
    import joker_ext.working_set as ws

    X, y01 = make_moons(4000, noise=0.3, random_state=0)
    y = 2.0 * y01 - 1.0
    C, gamma = 10.0, 10.0 / (X.shape[1] * X.var())
    stalled, snap_failed = [], []
    round_, interior_point = act._Column.round, ws._interior_point

    def recording_round(self, *args, stall=None, **kw):
        out = round_(self, *args, stall=stall, **kw)
        if stall is not None:
            stalled.append(out is None)
        return out

    def recording_interior_point(*args):
        out = interior_point(*args)
        snap_failed.append(out is not None and out[3])
        assert out is None or not out[4]  # not a degenerate optimum
        return out

    monkeypatch.setattr(act._Column, "round", recording_round)
    monkeypatch.setattr(ws, "_interior_point", recording_interior_point)
    sigma = (0.5 / gamma) ** 0.5
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("hinge"),
                 c=torch.full((len(y),), C, dtype=F64), kernel=GaussianKernel(sigma),
                 options=SolverOptions(tol=1e-12, max_iter=300), solver="working_set", intercept=True)
    assert m.result.status == "converged" and m.result.rel_gap <= 1e-12
    assert any(stalled) and not all(stalled)  # rounds abandoned, and rounds at escalated weights that settled
    assert True in snap_failed and snap_failed.index(True) == len(snap_failed) - 1  # none after the first failure
    K, a_ref, f_ref, f = _libsvm_and_ours(X, sigma, SVC(C=C, gamma=gamma, tol=1e-8).fit(X, y), m)

    def primal(a, f):
        return 0.5 * a @ K @ a + C * np.maximum(0.0, 1.0 - y * f).sum()

    assert primal(m.alpha[:, 0].numpy(), f) <= primal(a_ref, f_ref) * (1 + 1e-9)


def test_near_sets_put_coordinates_within_reach_of_a_bound_or_the_kink_there():
    """The crossover's sets by distance: within ``share`` of its box's width from a bound a coordinate is at that bound
    (its value the bound's), as near zero (losses with a kink inside the box) at the kink with sign 0, else free."""
    from joker_ext.active_set import _Column
    from joker_ext.box_sets import FREE, LOWER, UPPER, ZERO

    n, C, share = 6, 2.0, 1e-3
    c = torch.full((n,), C, dtype=F64)
    # hinge: [0, 2] for y = +1, [-2, 0] for y = -1; reach 2e-3
    hinge = _Column(None, torch.ones(n, dtype=F64), get_loss("hinge"),
                    torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0], dtype=F64), c, True)
    code, _, value = hinge.near_sets(torch.tensor([1e-3, C - 1.9e-3, 2.5e-3, -1e-4, -C + 5e-3, -1.0], dtype=F64), share)
    assert code.tolist() == [LOWER, UPPER, FREE, UPPER, FREE, FREE]
    assert value.tolist() == [0.0, C, 0.0, 0.0, 0.0, 0.0]
    # epsilon-insensitive: [-2, 2] with the kink at zero; reach 4e-3
    eps = _Column(None, torch.ones(n, dtype=F64), get_loss("epsilon_insensitive", epsilon=0.1),
                  torch.zeros(n, dtype=F64), c, True)
    code, sgn, value = eps.near_sets(torch.tensor([3e-3, -C + 1e-3, 0.5, -0.5, C - 5e-3, -3.9e-3], dtype=F64), share)
    assert code.tolist() == [ZERO, LOWER, FREE, FREE, FREE, ZERO]
    assert sgn.tolist() == [0.0, -1.0, 1.0, -1.0, 1.0, 0.0] and value.tolist() == [0.0, -C, 0.0, 0.0, 0.0, 0.0]


def test_degenerate_hinge_optimum_is_crossed_over_to_a_certified_gap(monkeypatch):
    """magic (4,000 rows whose labels are their position: its first rows all share a class, a third of them
    flipped), its columns rescaled 0.1-10x, hinge at 0.03x 'scale', C = 1: the margin points' kernel block is
    numerically of low rank and the optimum degenerate; the interior point leaves hundreds of coordinates about the
    square root of its complementarity inside their box, where the proximal rounds took them for free and stalled at
    a relative gap of 6e-8. The crossover finds the optimum degenerate and the fit ends certified: the gap, recomputed
    here from the dense kernel matrix, is below 1e-10, every coefficient in its box, the objective at or below that
    of LIBSVM's solution."""
    from sklearn.svm import SVC
    from joker_ext.comparisons.datasets import load
    import joker_ext.working_set as ws

    ds = load("magic", n_test=100, seed=0)
    X, labels = np.asarray(ds.X_train, dtype=np.float64)[:4000], np.asarray(ds.y_train)[:4000]
    y = np.where(labels == labels[0], 1.0, -1.0)
    assert (y == 1.0).all()  # the class of its first rows: the labels below are the rows' positions
    y[: y.size // 3] = -1.0
    X = X * np.random.default_rng(7).uniform(0.1, 10.0, X.shape[1])
    C, gamma = 1.0, 0.03 / (X.shape[1] * X.var())
    crossover, verdicts = ws._crossover, []

    def recorded(*args):
        out = crossover(*args)
        verdicts.append(out[1])
        return out

    monkeypatch.setattr(ws, "_crossover", recorded)
    sigma = (0.5 / gamma) ** 0.5
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("hinge"),
                 c=torch.full((len(y),), C, dtype=F64), kernel=GaussianKernel(sigma),
                 options=SolverOptions(tol=1e-14, max_iter=300), solver="working_set", intercept=True)
    assert m.result.status == "converged" and any(verdicts)
    a, b = m.alpha[:, 0].numpy(), float(m.result.state["intercept"][0])
    assert (a * y >= 0).all() and (a * y <= C).all() and abs(a.sum()) <= 1e-10 * C * len(y)
    K = GaussianKernel(sigma)(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    f = K @ a
    primal = 0.5 * a @ f + C * np.maximum(0.0, 1.0 - y * (f + b)).sum()
    dual = -0.5 * a @ f + y @ a
    assert 0 <= primal - dual <= 1e-10 * primal
    svc = SVC(C=C, gamma=gamma, tol=1e-3).fit(X, y)
    a_ref = np.zeros(len(y))
    a_ref[svc.support_] = svc.dual_coef_[0]
    f_ref = K @ a_ref
    assert primal <= 0.5 * a_ref @ f_ref + C * np.maximum(0.0, 1.0 - y * (f_ref + svc.intercept_[0])).sum()


@pytest.mark.parametrize("name", ["hinge", "epsilon_insensitive"])
def test_working_set_with_most_support_vectors_free_reaches_libsvm(monkeypatch, name):
    """A problem whose free set outgrows the working set's cap several times (d = 20: most support vectors on the
    margin), with small subproblems (q = 64) so that the cap doubles and the quick active-set steps at the smallest
    weight meet sets far from settled: LIBSVM's optimum, to its tol 1e-10."""
    from sklearn.datasets import make_classification as sk_classification, make_regression as sk_regression
    from sklearn.svm import SVC, SVR

    import joker_ext.working_set as ws

    n, gamma, C = 900, 0.05, 10.0
    if name == "hinge":
        X, y = sk_classification(n_samples=n, n_features=20, flip_y=0.05, random_state=3)
        y = 2.0 * y - 1.0
        ref, loss = SVC(C=C, gamma=gamma, tol=1e-10), get_loss("hinge")
    else:
        X, y = sk_regression(n_samples=n, n_features=20, noise=10.0, random_state=3)
        y = (y - y.mean()) / y.std()
        ref, loss = SVR(C=C, gamma=gamma, epsilon=0.1, tol=1e-10), get_loss("epsilon_insensitive", epsilon=0.1)
    X = (X - X.mean(0)) / X.std(0)
    sizes = _recorded_subproblem_sizes(monkeypatch)
    sigma = (0.5 / gamma) ** 0.5
    op = ExactOperator(GaussianKernel(sigma), BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    res = ws.working_set(op, torch.as_tensor(y).reshape(-1, 1), loss, torch.full((n,), C, dtype=F64),
                         SolverOptions(max_iter=500, tol=1e-11), intercept=True, working_set_size=64)
    assert res.status == "converged" and res.rel_gap <= 1e-11
    assert max(sizes) > 4 * 64  # the cap (2 q) doubled at least twice: most support vectors are free
    ref.fit(X, y)

    class _Model:
        alpha, result = res.alpha, res

    K, a_ref, f_ref, f = _libsvm_and_ours(X, sigma, ref, _Model)
    a = res.alpha[:, 0].numpy()
    if name == "hinge":
        def primal(a, f):
            return 0.5 * a @ K @ a + C * np.maximum(0.0, 1.0 - y * f).sum()
    else:
        def primal(a, f):
            return 0.5 * a @ K @ a + C * np.maximum(0.0, np.abs(y - f) - 0.1).sum()
    assert primal(a, f) <= primal(a_ref, f_ref) * (1 + 1e-9)


@pytest.mark.parametrize("name", ["hinge", "epsilon_insensitive", "pinball", "absolute"])
def test_intercept_bounds_are_the_intervals_of_the_optimality_conditions(name):
    """Each coordinate's interval of intercepts ``b`` with ``0 in g_i + b + k d|a_i| + N_[lo_i, hi_i](a_i)``, against
    that set worked out per coordinate from the definitions (``d|a| = {sign a}`` off zero, ``[-1, 1]`` at it; the
    normal cone ``{0}`` inside the box, ``[0, inf)`` at ``hi``, ``(-inf, 0]`` at ``lo``), to the last bit: coordinates
    at either bound, at the kink, free on either side. (The kink's sign at a bound was once a float32 1, and
    ``0.1 * float32(1)`` is 0.1 only to 1.5e-9.)"""
    from joker_ext.active_set import _Column

    n = 400
    rng = np.random.default_rng(1)
    loss = get_loss(name, **PARAMS)
    y = torch.as_tensor(np.where(rng.random(n) < 0.5, 1.0, -1.0) * (1.0 if loss.margin else rng.random(n) * 3))
    c = torch.as_tensor(rng.uniform(0.5, 2.0, n))
    col = _Column(None, torch.ones(n, dtype=F64), loss, y, c, True)
    lo, hi = col.lo.numpy(), col.hi.numpy()
    pick = rng.integers(0, 5, n)  # at lo, at hi, at zero, free below zero, free above zero (where the box allows)
    inside = np.where(pick == 3, np.maximum(lo, -1.0) * 0.5, np.minimum(hi, 1.0) * 0.5)
    a = np.where(pick == 0, lo, np.where(pick == 1, hi, np.where(pick == 2, 0.0, inside)))
    a = np.where(np.isfinite(a), a, 0.0)
    g = rng.standard_normal(n)
    lower, upper = col.intercept_bounds(torch.as_tensor(a), torch.as_tensor(g))
    k = float(loss.kink)
    for i in range(n):
        s_lo, s_hi = (-1.0, 1.0) if a[i] == 0 and k else (float(np.sign(a[i])),) * 2
        n_lo = -math.inf if a[i] <= lo[i] else 0.0
        n_hi = math.inf if a[i] >= hi[i] else 0.0
        # b = -g - k s - m over s in [s_lo, s_hi], m in [n_lo, n_hi]
        want = (-g[i] - k * s_hi - n_hi, -g[i] - k * s_lo - n_lo)
        assert (float(lower[i]), float(upper[i])) == want, (i, a[i], lo[i], hi[i])
    inside = (a > lo) & (a < hi)
    cases = [a <= lo, a >= hi, inside & (a < 0), inside & (a > 0)] + ([inside & (a == 0)] if k else [])
    assert all(case.sum() >= 20 for case in cases)  # every case checked


@pytest.mark.parametrize("n_free", [200, 60])
def test_working_set_of_a_mostly_free_problem_adds_the_worst_violators_that_are_not_free(n_free):
    """With at least a quarter of the coordinates free, the working set is the free set and the worst violators among
    the other coordinates (by their intercept bounds, half from each side), a tenth as many as the free ones but at
    least q / 2 (here 16 + 16); below, the worst violators of all coordinates, which may be free ones already in the
    set. The references are numpy's orderings of the bounds."""
    from joker_ext.active_set import _Column
    import joker_ext.working_set as ws

    n, q = 400, 64
    rng = np.random.default_rng(0)
    y = torch.as_tensor(np.where(rng.random(n) < 0.5, 1.0, -1.0))
    col = _Column(None, torch.ones(n, dtype=F64), get_loss("hinge"), y, torch.ones(n, dtype=F64), True)
    a = torch.where(torch.as_tensor(rng.random(n) < 0.5), col.lo, col.hi)  # every coordinate at a bound ...
    free = np.sort(rng.choice(n, n_free, replace=False))
    a[free] = 0.5 * (col.lo + col.hi)[free]  # ... but these
    lower = torch.as_tensor(rng.standard_normal(n))
    upper = lower + torch.as_tensor(rng.random(n))
    B = ws._select(col, a, (lower, upper), q, True, cap=4 * n).numpy()
    assert set(free) <= set(B)
    added = np.setdiff1d(B, free)
    if n_free == 200:  # half of them free
        others = np.setdiff1d(np.arange(n), free)
        half = 16
        up = others[np.argsort(-lower.numpy()[others])[:half]]
        down = others[np.argsort(upper.numpy()[others])[:half]]
        np.testing.assert_array_equal(added, np.union1d(up, down))
    else:  # 15% free: the plain choice, 2 |free| coordinates in all, the worst of all coordinates, free ones among them
        half = (max(q, 2 * n_free) - n_free) // 2
        up, down = np.argsort(-lower.numpy())[:half], np.argsort(upper.numpy())[:half]
        np.testing.assert_array_equal(B, np.union1d(free, np.union1d(up, down)))
        assert np.intersect1d(np.union1d(up, down), free).size > 0


def test_working_set_cap_takes_a_stable_free_set_that_exact_subproblems_leave_beyond_it(monkeypatch):
    """The absolute loss with a narrow kernel interpolates: every coordinate is free at the solution, 25 times what
    the first cap (2 q = 24) admits. Warm-started near the solution, the free set stays that large from one exact
    subproblem solve to the next: the cap then grows at once to hold it (before: one doubling per three cut
    subproblems: 16 subproblems where this makes 2), and the fit ends at cvxpy's optimum."""
    import joker_ext.working_set as ws

    n, C = 300, 10.0
    X, y = make_regression(n, d=3, seed=5)
    sigma = 0.15  # a narrow kernel: K near the identity, every residual zero at the solution
    op = ExactOperator(GaussianKernel(sigma), BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    loss, c, Y = get_loss("absolute"), torch.full((n,), C, dtype=F64), torch.as_tensor(y).reshape(-1, 1)
    opts = SolverOptions(max_iter=200, tol=1e-11)
    first = ws.working_set(op, Y, loss, c, opts, intercept=True, working_set_size=12)
    a = first.alpha[:, 0]
    assert int(((a.abs() > 0) & (a.abs() < C)).sum()) >= 0.9 * n  # most coordinates free: 20x the first cap's 12
    sizes = _recorded_subproblem_sizes(monkeypatch)
    res = ws.working_set(op, Y, loss, c, opts, alpha0=0.9 * first.alpha, intercept=True, working_set_size=12)
    assert res.status == "converged" and res.rel_gap <= 1e-11
    assert len(sizes) <= 5, sizes  # one cut subproblem, then the whole free set
    K = op.kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    a = res.alpha[:, 0].numpy()
    f = K @ a + float(res.state["intercept"][0])
    ours = 0.5 * a @ K @ a + C * np.abs(y - f).sum()
    ref = cvxpy_primal("absolute", K, y, np.full(n, C), intercept=True)
    assert abs(ours - ref) <= 1e-6 * abs(ref)


def test_working_set_stops_at_the_rounding_floor_of_the_default_tolerance():
    """At the estimators' default tol (1e-14, below the gap's rounding floor on an ill-conditioned problem) the
    working set stops as converged once its exact subproblem solves stop lowering the gap, at LIBSVM's optimum,
    instead of running to max_iter (it did: 100 iterations, status 'max_iter', on this problem)."""
    from sklearn.svm import SVR

    from joker_ext.defaults import ROUNDING_GAP, precision_tol

    from sklearn.datasets import make_regression as sklearn_regression

    X, y = sklearn_regression(n_samples=800, n_features=8, noise=10.0, random_state=0)
    X, y = (X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std()
    gamma, C, eps = 0.05, 10.0, 0.1
    loss = get_loss("epsilon_insensitive", epsilon=eps)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss,
                 c=torch.full((len(y),), C, dtype=F64), kernel=GaussianKernel((0.5 / gamma) ** 0.5),
                 options=SolverOptions(tol=precision_tol(F64), max_iter=100), solver="working_set", intercept=True)
    assert m.result.status == "converged" and m.result.n_iter < 60
    assert m.result.rel_gap <= ROUNDING_GAP[F64]
    svr = SVR(C=C, gamma=gamma, epsilon=eps, tol=1e-10).fit(X, y)
    K, a_ref, f_ref, f = _libsvm_and_ours(X, (0.5 / gamma) ** 0.5, svr, m)

    def primal(a, f):
        return 0.5 * a @ K @ a + C * np.maximum(0.0, np.abs(y - f) - eps).sum()

    a = m.alpha[:, 0].numpy()
    assert primal(a, f) <= primal(a_ref, f_ref)  # LIBSVM at tol 1e-10 stops about 2e-6 short
    # the duality gap recomputed here (the negative dual, feasible: |a| <= C, sum a = 0) is at the rounding floor
    assert np.abs(a).max() <= C and abs(a.sum()) <= 1e-10 * np.abs(a).sum()
    negative_dual = 0.5 * a @ K @ a - a @ y + eps * np.abs(a).sum()
    assert primal(a, f) + negative_dual <= 1e-10 * primal(a, f)


@pytest.mark.parametrize("name", ["squared", "huber", "squared_hinge"])
def test_active_set_in_float32_with_intercept_reaches_cvxpy(name):
    """float32 with an intercept: the active-set rounds settle (their test of ``sum a = 0`` held float32 sums to
    1e-10 and rejected every round: the fit never left its start, 100 iterations at gap 1.0, or the escalated
    proximal weight ended in a factorisation error) and the model is cvxpy's to float32's accuracy."""
    loss = get_loss(name, **PARAMS)
    X, y = (make_binary if loss.margin else make_regression)(n=200, seed=4)
    y = y + (0.0 if loss.margin else 3.0)  # an intercept to find
    kernel = GaussianKernel(1.0)
    c = torch.full((200,), 2.0, dtype=torch.float32)
    m = fit_dual(torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32).reshape(-1, 1),
                 loss=loss, c=c, kernel=kernel, options=SolverOptions(tol=1e-6, max_iter=100), solver="active_set",
                 intercept=True, dtype=torch.float32)
    assert m.result.status == "converged" and m.alpha.dtype == torch.float32
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    ref = cvxpy_primal(name, K, y, c.double().numpy(), intercept=True)
    assert m.result.primal == pytest.approx(ref, rel=1e-5)


def test_working_set_in_float32_reaches_libsvm_and_reports_float32():
    """float32 inputs: the working set computes in float64 (in float32 its active sets never settled: 100
    iterations, gap 0.17, on this problem) and hands float32 iterates to the callback and back; its model is
    LIBSVM's SVR on the same (float32-rounded) points."""
    from sklearn.svm import SVR

    from sklearn.datasets import make_regression as sklearn_regression

    X, y = sklearn_regression(n_samples=800, n_features=8, noise=10.0, random_state=0)
    X, y = (X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std()
    X32, y32 = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    gamma, C, eps = 0.05, 10.0, 0.1
    seen = []
    m = fit_dual(X32, y32.reshape(-1, 1), loss=get_loss("epsilon_insensitive", epsilon=eps),
                 c=torch.full((len(y),), C, dtype=torch.float32), kernel=GaussianKernel((0.5 / gamma) ** 0.5),
                 options=SolverOptions(tol=1e-7, max_iter=100), solver="working_set", intercept=True,
                 dtype=torch.float32,
                 callback=lambda info: seen.append((info["alpha"].dtype, info["state"]["intercept"].dtype)))
    assert m.result.status == "converged" and m.result.rel_gap <= 1e-7
    assert m.alpha.dtype == torch.float32 and m.result.state["intercept"].dtype == torch.float32
    assert seen and set(seen) == {(torch.float32, torch.float32)}
    Xr, yr = X32.double().numpy(), y32.double().numpy()
    svr = SVR(C=C, gamma=gamma, epsilon=eps, tol=1e-10).fit(Xr, yr)
    K, a_ref, f_ref, f = _libsvm_and_ours(Xr, (0.5 / gamma) ** 0.5, svr, m)

    def primal(a, f):
        return 0.5 * a @ K @ a + C * np.maximum(0.0, np.abs(yr - f) - eps).sum()

    # float32 alpha: its rounding (1e-7 relative) moves the objective by about that much
    assert primal(m.alpha[:, 0].double().numpy(), f) <= primal(a_ref, f_ref) * (1 + 1e-6)


def _float32_full_dual_fit(loss: str, solver: str, C: float, **data):
    """A float32 fit of ``loss`` by the full-dual engine ``solver`` (tol 1e-6) on scikit-learn's
    ``make_classification(**data)`` with labels -1 / 1, Gaussian kernel with gamma 0.1, checked to converge and to
    report float32: ``(y, K, coefficients)``, ``K`` and the coefficients in float64 from the float32 points and
    results."""
    from sklearn.datasets import make_classification

    X, labels = make_classification(**data)
    y = np.where(labels == 1, 1.0, -1.0)
    X32 = torch.as_tensor(X, dtype=torch.float32)
    kernel = GaussianKernel(math.sqrt(1 / (2 * 0.1)))
    m = fit_dual(X32, torch.as_tensor(y, dtype=torch.float32).reshape(-1, 1), loss=get_loss(loss),
                 c=torch.full((len(y),), C, dtype=torch.float32), kernel=kernel, dtype=torch.float32,
                 options=SolverOptions(tol=1e-6, max_iter=100), solver=solver)
    assert m.result.status == "converged" and m.alpha.dtype == torch.float32, (m.result.status, m.result.rel_gap)
    return y, kernel(X32.double(), X32.double()).numpy(), m.alpha[:, 0].double().numpy()


def test_active_set_in_float32_at_large_C_converges_and_reports_float32():
    """float32 squared hinge at C = 10^4 on 1,500 points: the active set computes in float64 when ``K`` fits its
    budget in float64 (in float32 its rounds cycled on the ill-conditioned free block: 100 rounds, 4.6 s, relative
    gap 4e-3) and returns float32. The gap recomputed here in float64 from the float32 ``alpha`` (feasible:
    ``y alpha >= 0``) is a tenth of the tolerance asked for (the rounding of ``alpha`` to float32 leaves about 5e-9)."""
    C = 1e4
    y, K, a = _float32_full_dual_fit("squared_hinge", "active_set", C, n_samples=1500, n_features=10,
                                     n_informative=6, n_clusters_per_class=1, flip_y=0.05, weights=[0.8, 0.2],
                                     random_state=7)
    assert (y * a >= 0).all()
    f = K @ a
    primal = 0.5 * a @ f + 0.5 * C * (np.maximum(0.0, 1.0 - y * f) ** 2).sum()  # loss max(0, 1 - y f)^2 / 2
    negative_dual = 0.5 * a @ f - y @ a + (a ** 2).sum() / (2 * C)
    assert primal + negative_dual <= 1e-7 * primal  # a tenth of the tolerance asked for


def test_exact_logistic_in_float32_at_large_C_converges():
    """float32 logistic regression at C = 100 on 2,000 points: the exact Newton engine computes in float64 when ``K``
    fits its budget in float64 (in float32 its steps stalled: 'stalled' at a relative gap of 3e-4 with a
    ConvergenceWarning). The gap between the primal at the float32 model ``w`` and the dual at the point
    ``a_i = C y_i sigmoid(-y_i f_i)`` it predicts, recomputed here in float64, is at float32's tolerance or below."""
    from scipy.special import expit, xlogy

    C = 100.0
    y, K, w = _float32_full_dual_fit("logistic", "newton", C, n_samples=2000, n_features=10, n_informative=6,
                                     flip_y=0.05, random_state=1)
    f = K @ w
    primal = 0.5 * w @ f + C * np.logaddexp(0.0, -y * f).sum()
    a = C * y * expit(-y * f)
    p = y * a / C  # in (0, 1)
    negative_dual = 0.5 * a @ K @ a + C * (xlogy(p, p) + xlogy(1 - p, 1 - p)).sum()
    assert 0 <= primal + negative_dual <= 1e-6 * primal


@pytest.mark.parametrize("solver", ["active_set", "working_set"])
def test_several_targets_equal_separate_fits(solver):
    loss, X, y = _problem("epsilon_insensitive", n=200, seed=2)
    Y = np.stack([y, -2 * y + 1], axis=1)
    c = torch.as_tensor(np.random.default_rng(0).uniform(0.5, 4.0, 200))  # sample weights: c_i = C w_i
    kw = dict(loss=loss, c=c, kernel=GaussianKernel(1.0),
              options=SolverOptions(tol=1e-12, max_iter=300), solver=solver, intercept=True)
    both = fit_dual(torch.as_tensor(X), torch.as_tensor(Y), **kw)
    for t in range(2):
        one = fit_dual(torch.as_tensor(X), torch.as_tensor(Y[:, t:t + 1]), **kw)
        np.testing.assert_allclose(both.alpha[:, t].numpy(), one.alpha[:, 0].numpy(), atol=1e-8)
        assert float(both.result.state["intercept"][t]) == pytest.approx(float(one.result.state["intercept"][0]),
                                                                          abs=1e-8)


def test_working_set_computes_kernel_rows_only_for_coordinates_that_move(monkeypatch):
    """``K_BB`` comes from the points of the working set (its rows are not cached); a row of ``K`` is computed only
    when its coordinate moves (f's update), so a point that never leaves zero (far outside the margin) costs no
    row."""
    pytest.importorskip("cvxpy")
    from joker_ext import working_set as ws

    monkeypatch.setattr(ws, "USE_SMO", False)  # the SMO phase forms the rows of the worst violators ahead of need

    filled = []
    fill = ws._ColumnCache._fill

    def spy(self, slots, idx):
        filled.extend(idx.tolist())
        fill(self, slots, idx)

    monkeypatch.setattr(ws._ColumnCache, "_fill", spy)
    loss, X, y = _problem("hinge", n=300, seed=5)
    kernel = GaussianKernel(1.0)
    c = torch.full((300,), 2.0, dtype=F64)
    snapshots = [torch.zeros(300, dtype=F64)]
    op = ExactOperator(kernel, BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    res = ws.working_set(op, torch.as_tensor(y).reshape(-1, 1), loss, c, SolverOptions(max_iter=500, tol=1e-12),
                         intercept=True, working_set_size=32,
                         callback=lambda info: snapshots.append(info["alpha"][:, 0].clone()) and False)
    assert res.status == "converged" and res.rel_gap <= 1e-12
    moved = set()
    for before, after in zip(snapshots[:-1], snapshots[1:]):
        moved |= set(torch.nonzero(after != before).reshape(-1).tolist())
    assert set(filled) <= moved and len(filled) == len(set(filled)) < 300
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    assert res.primal == pytest.approx(cvxpy_primal("hinge", K, y, c.numpy(), intercept=True), rel=1e-6)
    np.testing.assert_allclose(res.state["f"].numpy(), K @ res.alpha.numpy(), atol=1e-9)


def test_working_set_block_gathered_from_the_cached_rows_is_the_kernels():
    """Where the cache keeps every row and holds (nearly) all of ``B``'s, ``K_BB`` is gathered from them into memory
    kept between calls (the missing rows formed: at most a quarter of the block's cost), or is the cache's buffer
    itself when ``B`` holds every point; else it is evaluated from the points. Either way it is the kernel's
    block, to rounding."""
    from joker_ext import working_set as ws

    _, X, _ = _problem("hinge", n=200, seed=3)
    kernel = GaussianKernel(1.0)
    op = ExactOperator(kernel, BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    cache = ws._ColumnCache(op, 200, F64, torch.device("cpu"))
    rows = ws._KernelRows(cache)
    K = kernel(cache.X, cache.X)
    cache(torch.arange(0, 200, 2))  # the even rows
    B = torch.arange(0, 120, 2)
    first = rows.block(B)  # every row at hand: gathered
    # (to rounding: the blocks from the points differ from K's by a few units in the last place, 1.8e-15 on the
    # diagonal of ones)
    torch.testing.assert_close(first, K[B][:, B], rtol=0, atol=1e-14)
    B2 = torch.cat([torch.arange(0, 100, 2), torch.tensor([1, 3])])  # two rows missing: formed, then gathered
    second = rows.block(B2)
    assert bool(cache.have[B2].all()) and second.data_ptr() == first.data_ptr()
    torch.testing.assert_close(second, K[B2][:, B2], rtol=0, atol=1e-14)
    B3 = torch.arange(101, 181, 2)  # 40 of 40 rows missing: evaluated from the points, no row formed
    third = rows.block(B3)
    assert not bool(cache.have[B3].any())
    torch.testing.assert_close(third, K[B3][:, B3], rtol=0, atol=1e-14)
    cache(torch.arange(1, 150, 2))  # all but 25 rows: the whole matrix is the cache's buffer itself
    whole = rows.block(torch.arange(200))
    assert whole.data_ptr() == cache.buffer.data_ptr() and bool(cache.have.all())
    torch.testing.assert_close(whole, K, rtol=0, atol=1e-14)


def test_working_set_under_max_memory_gives_the_same_model(monkeypatch):
    """``max_memory`` bounds the kernel-column cache (here to 20 of 700 columns): same optimum."""
    from joker_ext import working_set as ws

    capacities = []
    init = ws._ColumnCache.__init__

    def spy(self, operator, capacity, dtype, device):
        init(self, operator, capacity, dtype, device)
        capacities.append(self.capacity)

    monkeypatch.setattr(ws._ColumnCache, "__init__", spy)
    loss, X, y = _problem("hinge", n=700, seed=9)
    kw = dict(loss=loss, c=torch.full((700,), 5.0, dtype=F64), kernel=GaussianKernel(1.0),
              options=SolverOptions(tol=1e-12, max_iter=500), solver="working_set", intercept=True)
    free = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), **kw)
    tight = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), max_memory=2 * 700 * 8 * 20, **kw)
    assert capacities == [700, 20]  # all columns fit by default (4 q >= n); 20 under the budget
    assert free.result.status == tight.result.status == "converged"
    assert tight.result.primal == pytest.approx(free.result.primal, rel=1e-10)
    np.testing.assert_allclose(tight.result.state["f"].numpy(), free.result.state["f"].numpy(), atol=1e-8)


def test_active_set_refuses_a_loss_without_quadratic_or_linear_conjugate():
    # (intercept=True with an engine that does not fit it, e.g. dbcd_tr, runs the intercept search: test_intercept.py)
    _, X, y = _problem("hinge", n=50)
    with pytest.raises(ValueError, match="quadratic or linear conjugate"):
        fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("logistic"),
                 c=torch.ones(50, dtype=F64), kernel=GaussianKernel(1.0), solver="active_set")


@pytest.mark.parametrize("solver", ["active_set", "working_set"])
def test_box_engines_refuse_a_zero_c(solver):
    """c_i = 0 (a zero sample weight) makes the box a point and the proximal weight sigma / c_i infinite: a clear
    error naming c (the estimators leave rows of zero weight out before the engine)."""
    _, X, y = _problem("hinge", n=50)
    c = torch.ones(50, dtype=F64)
    c[3] = 0.0
    with pytest.raises(ValueError, match=r"needs c > 0 .* got values such as \[0\.0\]"):
        fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("hinge"), c=c,
                 kernel=GaussianKernel(1.0), solver=solver, intercept=True)


def test_auto_policy_and_registry():
    sq, hinge = get_loss("squared"), get_loss("hinge")
    assert resolve_solver("auto", "exact", 1000, 8, sq) == "active_set"
    for linear in ("hinge", "epsilon_insensitive", "absolute", "pinball"):  # never forms K: any n
        assert resolve_solver("auto", "exact", 1000, 8, get_loss(linear)) == "working_set"
        assert resolve_solver("auto", "exact", 10**6, 8, get_loss(linear)) == "working_set"
    assert resolve_solver("auto", "exact", 1000, 8, get_loss("squared_hinge")) == "active_set"
    assert resolve_solver("auto", "exact", 1000, 8, get_loss("logistic")) == "newton"
    assert resolve_solver("auto", "exact", 10**6, 8, sq) == "dbcd_tr"  # K does not fit the default budget
    assert resolve_solver("auto", "exact", 1000, 8, sq, max_memory=1000) == "dbcd_tr"
    assert resolve_solver("auto", "features", 10**7, 4, get_loss("logistic")) == "newton"
    assert resolve_solver("auto", "features", 1000, 8, hinge) == "newton"  # centred smoothing: every loss
    assert "newton" in available_solvers("features") and "dbcd_tr" in available_solvers("exact")
    with pytest.raises(ValueError, match="solver must be one of"):
        get_solver("lbfgs", "exact")


def test_engines_declare_the_losses_whose_intercept_they_fit():
    """``register_solver(intercept=...)``: True for every loss, a predicate for some. The exact Newton engine fits it
    for the logistic loss (primal steps) and the box-QP losses (its active-set method), not for a kinked user loss
    that it smooths: that one gets the search, which the plan says."""
    from joker_ext.engines import register_solver, supports_intercept
    from joker_ext.losses import Loss
    from joker_ext.plan import make_fit_plan

    class SmoothedAbsolute(Loss):  # the absolute loss declared non-quadratic: the projected Newton path smooths it
        name, quadratic, kink = "smoothed_absolute", False, 1.0

        def __init__(self):
            self._base = get_loss("absolute")

        def __getattr__(self, attr):
            return getattr(self._base, attr)

    assert supports_intercept("working_set", "exact", get_loss("hinge"))
    assert supports_intercept("newton", "exact", get_loss("logistic"))
    assert supports_intercept("newton", "exact", get_loss("hinge"))
    assert not supports_intercept("newton", "exact", SmoothedAbsolute())
    assert not supports_intercept("dbcd_tr", "exact", get_loss("logistic"))
    # features: the Newton steps take b for the losses that need no smoothing; the kinked ones get the search
    assert supports_intercept("newton", "features", get_loss("logistic"))
    assert supports_intercept("newton", "features", get_loss("squared_hinge"))
    assert not supports_intercept("newton", "features", get_loss("hinge"))
    assert not supports_intercept("newton", "features", SmoothedAbsolute())
    for loss, how in ((get_loss("logistic"), "engine"), (SmoothedAbsolute(), "search")):
        assert make_fit_plan(GaussianKernel(1.0), loss, n=50, solver="newton", intercept=True).intercept == how
    register_solver("only_squared", "exact", get_solver("active_set", "exact"),
                    intercept=lambda loss: loss.name == "squared")
    try:
        assert supports_intercept("only_squared", "exact", get_loss("squared"))
        assert not supports_intercept("only_squared", "exact", get_loss("hinge"))
        assert supports_intercept("only_squared", "exact")  # for some losses
        register_solver("only_squared", "exact", get_solver("active_set", "exact"), overwrite=True)
        assert not supports_intercept("only_squared", "exact", get_loss("squared"))
    finally:
        from joker_ext import engines
        engines._SOLVERS.pop(("only_squared", "exact"), None)
        engines._WITH_INTERCEPT.pop(("only_squared", "exact"), None)


@pytest.mark.parametrize("solver, name, features", [("newton", "logistic", False), ("active_set", "squared", False),
                                                    ("working_set", "hinge", False), ("newton", "squared", True),
                                                    ("newton", "hinge", True), ("dbcd_tr", "squared", False)])
def test_callback_sees_the_converged_model(solver, name, features):
    """Every engine hands its callback the iterate it returns (a Falkon error_fn then reports the final model, as
    Falkon's last iteration does): the last callback's duals are the result's."""
    loss, X, y = _problem(name, n=200, seed=3)
    kernel = GaussianKernel(1.0)
    fmap = make_feature_map(kernel, 64, seed=0) if features else None
    seen = []
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss,
                 c=torch.full((200,), 2.0, dtype=F64), kernel=kernel, feature_map=fmap,
                 options=SolverOptions(max_iter=3000, tol=1e-8), solver=solver,
                 callback=lambda info: seen.append(info["alpha"].clone()) and False)
    assert m.result.status == "converged" and seen
    torch.testing.assert_close(seen[-1], m.result.alpha, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["logistic", "hinge"])
def test_gradient_pass_of_float32_features_does_not_depend_on_its_blocking(name):
    """The gradient pass of float32 features in a float64 fit, its loss steps block by block (the CPU's way) or on
    whole chunks with each product converting the chunk again (a GPU's way), gives the same predictions, dual
    point, gradient and gap terms (to float64 rounding), and its predictions are the float64 products of the
    float32 features (against the map evaluated densely)."""
    from joker_ext.distributed import SingleProcess
    from joker_ext.primal_newton import _Passes

    loss, X, y = _problem(name, n=700, seed=2)
    Xt = torch.as_tensor(X, dtype=torch.float32)
    fmap = make_feature_map(GaussianKernel(1.0), 96, seed=0, compute_dtype=torch.float32)
    Y = torch.as_tensor(y, dtype=F64).reshape(-1, 1)
    c = torch.full((700, 1), 3.0, dtype=F64)
    beta = torch.randn(96, 1, generator=torch.Generator().manual_seed(3), dtype=F64)
    out = {}
    for whole in (False, True):
        op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), chunk_rows=128)
        passes = _Passes(op, Y, loss, c, SingleProcess())
        assert passes.low and passes.convert_rows < passes.grad_rows
        passes.whole_chunk_duals = whole
        out[whole] = passes.gradient(passes.basis.to_internal(beta), 0.1)
    for key in ("F", "A", "W", "grad", "primal", "dual", "share"):
        torch.testing.assert_close(out[True][key], out[False][key], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out[True]["F"], fmap(Xt).to(F64) @ beta, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("svd", [True, False])
@pytest.mark.parametrize("block", [2**22, 700])  # one block; blocks of 7 rows (M = 300, r = 100) for the in-place maps
@pytest.mark.parametrize("two_pass", [False, True])
def test_nystrom_preconditioner_is_exact_on_a_low_rank_hessian(svd, block, two_pass, monkeypatch):
    """With ``Phi^T W Phi`` of rank 20 below the sketch's rank, the randomized Nystrom approximation is exact, so
    the preconditioner's inverse is ``(I + Phi^T W Phi)^{-1}`` itself (checked against a dense solve), through the
    CPU's SVD and the GPU's eigen route alike, whatever the row blocks of the in-place triangular solve and factor,
    and with the GPU's one-buffer sketch (``two_pass``: rank 60, a Gaussian test matrix drawn in blocks of 7 or
    all rows, drawn again for the shift and the core)."""
    import joker_ext.primal_newton as pn

    monkeypatch.setattr(pn, "IN_PLACE_BLOCK", block)
    g = torch.Generator().manual_seed(0)
    n, M, k = 500, 300, 20
    Phi = torch.randn(n, k, generator=g, dtype=F64) @ torch.randn(k, M, generator=g, dtype=F64) / 10
    w = torch.rand(n, generator=g, dtype=F64) + 0.5
    H = torch.eye(M, dtype=F64) + Phi.T @ (w[:, None] * Phi)

    def rows():
        for s in range(0, n, 128):
            yield torch.arange(s, min(s + 128, n)), Phi[s:s + 128]

    rank = 60 if two_pass else 100  # (two passes draw a Gaussian test matrix: 4 r <= M)
    P = pn.NystromPreconditioner.sketch(rows, w, M, rank, 1.0, torch.Generator().manual_seed(1), svd=svd,
                                        two_pass=two_pass)
    assert P.U.shape == (M, rank)
    v = torch.randn(M, generator=g, dtype=F64)
    torch.testing.assert_close(P.apply(v), torch.linalg.solve(H, v), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("solver, name, features", [("newton", "logistic", True), ("newton", "logistic", False),
                                                    ("working_set", "hinge", False)])
def test_callback_every_is_honoured_by_the_newton_type_engines(monkeypatch, solver, name, features):
    """``callback_every = 2``: the callback sees the even iterations and the converged one (it was called at every
    iteration: JokerFalkon's ``error_every`` did nothing with its default engine). The working-set engine starts
    from zero, without its SMO phase, so that the fit takes enough iterations to show it."""
    from joker_ext import working_set
    monkeypatch.setattr(working_set, "USE_SMO", False)
    loss, X, y = _problem(name, n=300, seed=4)
    kernel = GaussianKernel(1.0)
    seen = []
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss,
                 c=torch.full((300,), 50.0, dtype=F64), kernel=kernel,
                 feature_map=make_feature_map(kernel, 128, seed=0) if features else None,
                 options=SolverOptions(max_iter=3000, tol=1e-10, callback_every=2), solver=solver,
                 callback=lambda info: seen.append(info["iteration"]) and False)
    last = m.result.n_iter
    assert m.result.status == "converged" and last >= 3
    assert seen[-1] == last and all(i % 2 == 0 for i in seen[:-1])
    assert seen[0] <= 2 and seen[:-1] == list(range(seen[0], seen[-2] + 1, 2))  # none skipped (engines start at 0 or 1)


def _squared_feature_problem(n=3000, M=400, C=10.0):
    g = torch.Generator().manual_seed(5)
    X = torch.randn(n, 4, generator=g, dtype=F64)
    y = torch.sin(2 * X[:, :1]) + 0.2 * torch.randn(n, 1, generator=g, dtype=F64)
    kernel = GaussianKernel(0.7)
    fmap = make_feature_map(kernel, M, seed=0)
    return X, y, kernel, fmap, torch.full((n,), C, dtype=F64)


def test_callback_sees_the_cg_iterates_of_the_squared_loss():
    """``callback_cg_every``: the one CG run of a quadratic primal reports its iterates; each report's weights give
    predictions ``Phi beta`` and a primal objective that match the independent evaluation at those weights, the
    counts run 1, 2, 3, ..., and the last report is the returned model (its record is not reported twice)."""
    X, y, kernel, fmap, c = _squared_feature_problem()
    seen = []
    m = fit_dual(X, y, loss=get_loss("squared"), c=c, kernel=kernel, feature_map=fmap, solver="newton",
                 options=SolverOptions(max_iter=20, tol=1e-9, callback_cg_every=1, newton_rank=20),
                 callback=lambda info: seen.append(info) and False)
    res = m.result
    assert res.status == "converged"
    inner = [s for s in seen if s["iteration"] == 0 and s["cg_iterations"] > 0]
    assert len(inner) >= 5 and [s["cg_iterations"] for s in inner] == list(range(1, len(inner) + 1))
    Phi = fmap(X)
    for s in inner[::max(1, len(inner) // 4)]:  # the certificate of a report, recomputed from its weights alone
        beta = s["state"]["beta"]
        f = Phi @ beta
        primal = 0.5 * float((beta * beta).sum()) + 0.5 * float((c[:, None] * (y - f) ** 2).sum())
        assert s["primal"] == pytest.approx(primal, rel=1e-9)
    torch.testing.assert_close(seen[-1]["state"]["beta"], res.state["beta"], rtol=0, atol=0)
    assert [s["cg_iterations"] for s in seen].count(seen[-1]["cg_iterations"]) == 1


def test_a_cg_report_that_asks_to_stop_ends_the_fit_at_that_iterate():
    X, y, kernel, fmap, c = _squared_feature_problem()
    seen = []

    def stop_at_five(info):
        seen.append(info)
        return info.get("cg_iterations") == 5

    m = fit_dual(X, y, loss=get_loss("squared"), c=c, kernel=kernel, feature_map=fmap, solver="newton",
                 options=SolverOptions(max_iter=20, tol=1e-14, callback_cg_every=1, newton_rank=20),
                 callback=stop_at_five)
    res = m.result
    assert res.status == "callback" and res.history[-1]["cg_iterations"] == 5
    five = next(s for s in seen if s.get("cg_iterations") == 5)
    torch.testing.assert_close(res.state["beta"], five["state"]["beta"], rtol=1e-12, atol=1e-12)
    assert res.rel_gap > 1e-10  # stopped early: the certificate says so


def test_working_set_carried_factors_of_several_targets_equal_separate_fits(monkeypatch):
    """Each target column keeps its own free-block factor from one subproblem to the next: two columns fitted
    together (whose factors are carried over, relabelled to each new working set) equal the columns fitted one at
    a time, and every fit reaches a relative gap of 1e-12."""
    import joker_ext.free_factor as ff
    from joker_ext import working_set as ws

    relabelled = []
    relabel = ff.FreeFactor.relabel

    def spy(self, U):
        relabelled.append(U.numel())
        relabel(self, U)

    monkeypatch.setattr(ff.FreeFactor, "relabel", spy)
    loss, X, y = _problem("epsilon_insensitive", n=1200, seed=3)
    Y = torch.as_tensor(np.stack([y, np.sin(3 * y)], axis=1))
    c = torch.as_tensor(np.random.default_rng(1).uniform(5.0, 20.0, 1200))
    op = ExactOperator(GaussianKernel(0.5), BlockData(torch.as_tensor(X), F64, torch.device("cpu")))

    def fit(Y):
        return ws.working_set(op, Y, loss, c, SolverOptions(tol=1e-12, max_iter=300), intercept=True,
                              working_set_size=128)

    both = fit(Y)
    assert both.status == "converged" and both.rel_gap <= 1e-12
    assert relabelled and max(relabelled) >= ff.MIN_UPDATE_SIZE  # the carried factors were used
    for t in range(2):
        one = fit(Y[:, t:t + 1])
        assert one.status == "converged"
        np.testing.assert_allclose(both.alpha[:, t].numpy(), one.alpha[:, 0].numpy(), atol=1e-7)


@pytest.mark.parametrize("name", ["epsilon_insensitive", "absolute", "pinball"])
def test_working_set_stops_at_the_rounding_noise_of_a_large_c(name):
    """At C = 10^4 the duals reach 10^4 while ``f = K alpha`` stays of the order of the targets: the gap's rounding
    noise lies above the float64 floor of 1e-11, and the gap stops falling there. The fit stops within a few
    iterations of that (it ran to ``max_iter`` before), certified to 1e-8, at cvxpy's optimum."""
    pytest.importorskip("cvxpy")
    from joker_ext.working_set import working_set

    loss, X, y = _problem(name, n=300, seed=0)
    C = 1e4
    c = torch.full((len(y),), C, dtype=F64)
    kernel = GaussianKernel(0.5)
    op = ExactOperator(kernel, BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    res = working_set(op, torch.as_tensor(y).reshape(-1, 1), loss, c, SolverOptions(tol=1e-14, max_iter=300),
                      intercept=True)
    assert res.status in ("converged", "stalled") and res.n_iter <= 60, (res.status, res.n_iter, res.rel_gap)
    assert res.rel_gap <= 1e-8
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    assert res.primal == pytest.approx(cvxpy_primal(name, K, y, c.numpy(), intercept=True), rel=1e-6)


@pytest.mark.parametrize("name, C", [("epsilon_insensitive", 0.1), ("huber", 1.0)])
def test_intercept_search_on_features_reports_the_primal_of_its_model(name, C):
    """The Newton engine on random features with the intercept search around it: the reported primal is that of the
    returned model, ``1/2 |beta|^2 + sum c_i l(y_i, phi_i^T beta + b)`` (it was ``1/2 alpha^T Phi beta + ...``,
    which is below the optimum while ``Phi^T alpha != beta``), and no less than cvxpy's optimum on the same features."""
    pytest.importorskip("cvxpy")
    rng = np.random.default_rng(4)
    X = rng.standard_normal((80, 3))
    y = np.sin(2 * X[:, 0]) + 0.2 * rng.standard_normal(80)
    w = torch.as_tensor(rng.uniform(0.2, 3.0, 80))
    loss = get_loss(name, **PARAMS)
    kernel = GaussianKernel(1.3)
    fmap = make_feature_map(kernel, 40, seed=3)
    c = C * w
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=c, kernel=kernel,
                 feature_map=fmap, options=SolverOptions(tol=1e-14, max_iter=300), solver="newton", intercept=True)
    beta, b = m.result.state["beta"][:, 0], float(m.result.state["intercept"][0])
    Phi = fmap(torch.as_tensor(X))
    own = 0.5 * float(beta @ beta) + float((c * loss.value(torch.as_tensor(y), Phi @ beta + b)).sum())
    assert m.result.primal == pytest.approx(own, rel=1e-12)
    opt = cvxpy_primal(name, (Phi @ Phi.T).numpy(), y, c.numpy(), intercept=True)
    assert m.result.primal >= opt * (1 - 1e-9) and m.result.rel_gap >= -1e-12
    assert m.result.primal == pytest.approx(opt, rel=max(2 * m.result.rel_gap, 1e-8))


@pytest.mark.parametrize("solver", ["newton", "active_set"])
@pytest.mark.parametrize("name, C", [("absolute", 100.0), ("epsilon_insensitive", 1000.0), ("pinball", 1000.0),
                                     ("hinge", 1000.0)])
def test_box_duals_at_a_large_c_reach_cvxpy_with_every_exact_newton_engine(solver, name, C):
    """Box-constrained duals at large C. ``solver='newton'`` took projected Newton steps that stalled far from the
    optimum (relative gaps 0.16-0.98 after 100 iterations); it runs the semismooth Newton method of the active-set
    engine for these losses. Both reach cvxpy's optimum; pinball at C = 1000, which ran the active-set engine to
    max_iter at a gap of 1e-11 (the rounding noise of ``f = K alpha``), stops within a few tens of iterations
    ('stalled', or 'converged' where its best iterate, which it returns, lies at the rounding floor)."""
    pytest.importorskip("cvxpy")
    loss, X, y = _problem(name, n=60, seed=1)
    c = torch.full((60,), C, dtype=F64)
    kernel = GaussianKernel(1.0)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=c, kernel=kernel,
                 options=SolverOptions(tol=1e-14, max_iter=100), solver=solver)
    if name == "pinball":
        # 'stalled' in the noise, or 'converged' at its best iterate when that lies at the rounding floor
        assert m.result.status in ("stalled", "converged") and m.result.n_iter < 50, (m.result.status, m.result.n_iter)
    assert m.result.rel_gap <= 1e-8
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    assert m.result.primal == pytest.approx(cvxpy_primal(name, K, y, c.numpy()), rel=1e-7)


@pytest.mark.parametrize("name", ["hinge", "epsilon_insensitive"])
def test_exact_newton_projected_steps_for_a_conjugate_it_cannot_tell_is_linear(monkeypatch, name):
    """A user loss whose conjugate is linear on its box but not declared so (``quadratic = False``) keeps the exact
    Newton engine's own path, projected Newton steps with a smoothing continuation: they are taken, and the fit
    reaches cvxpy's optimum of the same loss."""
    pytest.importorskip("cvxpy")
    import joker_ext.newton_exact as ne

    directions = []
    direction = ne.newton_direction
    monkeypatch.setattr(ne, "newton_direction", lambda *a, **k: directions.append(1) or direction(*a, **k))
    builtin, X, y = _problem(name, n=80, seed=2)

    class Undeclared(type(builtin)):
        quadratic = False

    loss = Undeclared(**({"epsilon": PARAMS["epsilon"]} if name == "epsilon_insensitive" else {}))
    c = torch.full((80,), 1.0, dtype=F64)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=c, kernel=GaussianKernel(1.0),
                 options=SolverOptions(tol=1e-8, max_iter=500), solver="newton")
    assert directions and m.result.status == "converged"
    K = GaussianKernel(1.0)(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    assert m.result.primal == pytest.approx(cvxpy_primal(name, K, y, c.numpy()), rel=1e-6)


def test_active_set_raises_a_cycling_weight_tenfold_not_back_to_the_first():
    """One feature, noise-free targets (a kernel matrix near singular): the rounds at the smallest proximal weights
    cycle. Raising the weight that cycled back to the first one (0.1) restarted the descent every fourth round: 100
    rounds to a gap of 2e-6, 1.4e-6 above cvxpy's optimum. Ten times the weight that cycled converges."""
    pytest.importorskip("cvxpy")
    g = np.random.default_rng(3)
    g.standard_normal((60, 2)), g.standard_normal(60)
    X = g.standard_normal((40, 1))
    y = np.sin(X[:, 0])
    c = torch.full((40,), 5.0, dtype=F64)
    kernel = GaussianKernel(math.sqrt(0.5))
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("absolute"), c=c,
                 kernel=kernel, options=SolverOptions(tol=1e-14, max_iter=100), solver="active_set")
    assert m.result.status == "converged" and m.result.n_iter < 40, (m.result.status, m.result.n_iter)
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    assert m.result.primal == pytest.approx(cvxpy_primal("absolute", K, y, c.numpy()), rel=1e-9)


@pytest.mark.parametrize("C", [1e3, 1e4])
def test_active_set_certificate_is_that_of_its_model_at_a_large_c(C):
    """Hinge at C = 10^3-10^4 on 50 nearly separable points: the rounds update ``f = K alpha`` step by step, and the
    rounding they accumulated put the certificate off the model (the reported primal 2.4e-8 above the model's own,
    a gap stuck there to max_iter). The reported primal is the model's (``1/2 a^T K a + C sum hinge``, computed
    here in numpy), and the fit converges to cvxpy's optimum."""
    pytest.importorskip("cvxpy")
    g = np.random.default_rng(0)
    X = g.standard_normal((50, 2))
    y = np.where(X[:, 0] + 0.5 * X[:, 1] > 0.3, 1.0, -1.0)
    flip = g.uniform(size=50) < 0.1
    y[flip] = -y[flip]
    kernel = GaussianKernel(math.sqrt(1 / 1.4))
    c = torch.full((50,), C, dtype=F64)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("hinge"), c=c, kernel=kernel,
                 options=SolverOptions(tol=1e-14, max_iter=100), solver="active_set")
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    a = m.result.alpha[:, 0].numpy()
    f = K @ a
    own = 0.5 * a @ f + C * np.maximum(0.0, 1.0 - y * f).sum()
    # (to the rounding of f = K a, |a| up to C: 1.3e-12 at C = 10^4 between two float64 products)
    assert m.result.primal == pytest.approx(own, rel=1e-10)
    assert m.result.status == "converged" and m.result.rel_gap <= 1e-10, (m.result.status, m.result.rel_gap)
    assert own == pytest.approx(cvxpy_primal("hinge", K, y, c.numpy()), rel=1e-7)


def test_working_set_subproblem_keeps_the_interior_points_solution_when_its_sets_do_not_snap(monkeypatch):
    """A mostly free subproblem whose interior-point solution will not snap to active sets (here: every snap
    fails) still ends at the subproblem's optimum: the proximal rounds start from the interior point's converged
    iterate (they started from the old point, which left the subproblem far from solved). Reference: cvxpy's
    optimum of the same box QP (hinge dual with an intercept's equality)."""
    cp = pytest.importorskip("cvxpy")
    import joker_ext.working_set as ws
    from joker_ext.free_factor import FreeFactor
    from joker_ext.dense import cholesky_shifted

    n, C = 300, 10.0
    X, y = make_binary(n=n, seed=11)
    X, y = torch.as_tensor(X), torch.as_tensor(y, dtype=F64)
    K = GaussianKernel(1.0)(X, X)
    c = torch.full((n,), C, dtype=F64)
    col = ws._Column(K, K.diagonal().clone(), get_loss("hinge"), y, c, True)
    monkeypatch.setattr(ws, "_round_at_floor", lambda *args, **kw: None)
    zero = torch.zeros(n, dtype=F64)
    aB, b, *_ = ws._subproblem(col, K, torch.arange(n), zero, zero.clone(), 0.0, col.scale, ws.SIGMA_FLOOR * col.scale,
                               FreeFactor(cholesky_shifted), True)
    a = cp.Variable(n)
    Kn, yn = K.numpy(), y.numpy()
    L = np.linalg.cholesky(Kn + 1e-12 * np.eye(n))
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(L.T @ a) - yn @ a),
                      [cp.multiply(yn, a) >= 0, cp.multiply(yn, a) <= C, cp.sum(a) == 0])
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    ours = 0.5 * float(aB @ K @ aB) - float(y @ aB)
    assert abs(float(aB.sum())) < 1e-9 * C and bool(((y * aB) >= -1e-12).all() and ((y * aB) <= C + 1e-12).all())
    assert ours == pytest.approx(prob.value, rel=1e-8)


def test_feature_newton_shares_one_preconditioner_between_targets_with_the_same_curvature(monkeypatch):
    """Squared loss, three targets: one Hessian (the curvature is the same for every column) where there were three,
    and each column at the closed form ``(I + C Phi^T Phi) beta = C Phi^T y``; logistic targets (curvatures that
    differ) keep one each."""
    import joker_ext.primal_newton as pn
    from joker_ext.features import RandomFeatureMap

    X, y = make_regression(n=500, seed=3)
    Y = np.stack([y, np.sin(y), y ** 2 / 10], 1)
    M, C = 30, 2.0
    fmap = RandomFeatureMap(GaussianKernel(1.0), M, seed=1)
    built = []
    original = pn._Passes.exact_hessian
    monkeypatch.setattr(pn._Passes, "exact_hessian", lambda self, W, t: built.append(t) or original(self, W, t))

    def fit(loss, targets):
        op = FeatureOperator(fmap, BlockData(torch.as_tensor(X), F64, torch.device("cpu")), chunk_rows=128)
        return feature_newton(op, torch.as_tensor(targets), get_loss(loss), torch.full((500,), C, dtype=F64),
                              SolverOptions(max_iter=100, tol=1e-12))

    res = fit("squared", Y)
    assert res.status == "converged" and set(built) == {0}
    Phi = fmap(torch.as_tensor(X)).numpy()
    beta = np.linalg.solve(np.eye(M) + C * Phi.T @ Phi, C * Phi.T @ Y)
    np.testing.assert_allclose(res.state["beta"].numpy(), beta, rtol=1e-8, atol=1e-10 * np.abs(beta).max())
    built.clear()
    fit("logistic", np.where(Y > np.median(Y, 0), 1.0, -1.0))
    assert set(built) == {0, 1, 2}


def _with_duplicates(name, seed=5):
    """A problem whose rows repeat: 40 rows copied once or twice (same x and y), plus rows with the x of another
    row and another y (not duplicates of it); weights vary within the groups."""
    loss, X, y = _problem(name, n=120, seed=seed)
    g = np.random.default_rng(seed)
    copies = np.concatenate([g.choice(120, 40, replace=False), g.choice(120, 10, replace=False)])
    X = np.concatenate([X, X[copies], X[:5]])
    y = np.concatenate([y, y[copies], -y[:5] if loss.margin else y[:5] + 1.0])
    c = g.uniform(0.5, 3.0, X.shape[0]) * 5.0
    return loss, X, y, c


@pytest.mark.parametrize("solver", ["working_set", "active_set"])
@pytest.mark.parametrize("name", ["hinge", "epsilon_insensitive", "pinball", "squared_hinge"])
@pytest.mark.parametrize("intercept", [False, True])
def test_box_qp_engines_merge_duplicate_rows_into_the_same_problem(solver, name, intercept):
    """Rows with the same x and y make K_FF singular; the box-QP engines solve them as one row of weight
    ``c_G`` and reports ``a_i = a_G c_i / c_G``. Checked against cvxpy on the problem as given (every row), the
    box of every row, the intercept's constraint, and against the engine on the data merged by hand (the same
    iterations: without the merge the engine runs another path)."""
    pytest.importorskip("cvxpy")
    loss, X, y, c = _with_duplicates(name)
    kernel = GaussianKernel(1.0)
    op = ExactOperator(kernel, BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    Y, ct = torch.as_tensor(y).reshape(-1, 1), torch.as_tensor(c)
    seen = []
    engine = get_solver(solver, "exact")
    res = engine(op, Y, loss, ct, SolverOptions(tol=1e-13, max_iter=300), intercept=intercept,
                 callback=lambda info: seen.append(tuple(info["alpha"].shape)))
    assert res.status == "converged" and res.rel_gap <= 1e-12
    assert res.alpha.shape == (X.shape[0], 1) and set(seen) == {(X.shape[0], 1)}
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    assert res.primal == pytest.approx(cvxpy_primal(name, K, y, c, intercept=intercept), rel=1e-7, abs=1e-9)
    lo, hi = loss.box(Y, ct.reshape(-1, 1))
    assert bool(((res.alpha >= lo - 1e-12) & (res.alpha <= hi + 1e-12)).all())
    if intercept:
        assert abs(float(res.alpha.sum())) <= 1e-10 * float(res.alpha.abs().sum())
    # the same fit on the rows merged by hand
    rows = np.concatenate([X, y.reshape(-1, 1)], axis=1)
    _, first, group = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first)
    keep, rank = first[order], np.empty_like(order)
    rank[order] = np.arange(order.size)
    group = rank[group.ravel()]
    c_m = np.bincount(group, weights=c)
    op_m = ExactOperator(kernel, BlockData(torch.as_tensor(X[keep]), F64, torch.device("cpu")))
    ref = engine(op_m, torch.as_tensor(y[keep]).reshape(-1, 1), loss, torch.as_tensor(c_m),
                 SolverOptions(tol=1e-13, max_iter=300), intercept=intercept)
    assert res.n_iter == ref.n_iter
    merged = np.bincount(group, weights=res.alpha[:, 0].numpy())
    np.testing.assert_allclose(merged, ref.alpha[:, 0].numpy(), rtol=0, atol=1e-12 * float(np.abs(c_m).max()))


def test_rows_equal_up_to_their_last_bits_are_merged_as_duplicates():
    """Copies whose inputs differ in their last bits (a relative change of a few units of rounding) are the same
    row to the engines; copies with another target (in any of several columns), or farther apart (1e-9), are not."""
    from joker_ext.active_set import merge_duplicate_rows

    g = np.random.default_rng(3)
    X = 3.0 + g.standard_normal((60, 4))
    y = np.sign(g.standard_normal(60))
    wiggle = 1.0 + 4 * np.finfo(float).eps * g.choice([-1.0, 1.0], size=(20, 4))
    # (the copies, their targets, the rows left after the merge)
    cases = {"last bits": (X[:20] * wiggle, y[:20], 60), "other target": (X[:20] * wiggle, -y[:20], 80),
             "1e-9 apart": (X[:20] * (1 + 1e-9), y[:20], 80)}
    for case, (X_copy, y_copy, groups) in cases.items():
        X_all, y_all = np.concatenate([X, X_copy]), np.concatenate([y, y_copy])
        # the copies interleaved with the rows (the order must not matter)
        perm = g.permutation(80)
        op = ExactOperator(GaussianKernel(1.0), BlockData(torch.as_tensor(X_all[perm]), F64, torch.device("cpu")))
        merged, Y_m, c_m, _, expand = merge_duplicate_rows(op, torch.as_tensor(y_all[perm]).reshape(-1, 1),
                                                           torch.ones(80, dtype=F64), None)
        assert Y_m.shape[0] == groups, case
        assert float(c_m.sum()) == 80.0
    # several target columns (one-vs-rest): copies merge only where every column agrees, whichever column differs
    Y = np.stack([y, np.sign(g.standard_normal(60)), np.sign(g.standard_normal(60))], axis=1)
    for col, groups in [(None, 60), (0, 80), (2, 80)]:
        Y_copy = Y[:20].copy()
        if col is not None:
            Y_copy[:, col] *= -1
        op = ExactOperator(GaussianKernel(1.0), BlockData(torch.as_tensor(np.concatenate([X, X[:20] * wiggle])),
                                                          F64, torch.device("cpu")))
        _, Y_m, _, _, _ = merge_duplicate_rows(op, torch.as_tensor(np.concatenate([Y, Y_copy])),
                                               torch.ones(80, dtype=F64), None)
        assert Y_m.shape[0] == groups, col


def test_working_set_on_rows_equal_up_to_their_last_bits_matches_cvxpy():
    """Epsilon-insensitive with the intercept, a third of the rows copied with a change in their last bits: the
    same fit as on exact copies (which are merged), at cvxpy's optimum of the data as given. Kept apart, such
    copies made the free block singular and the working set ran to its iteration budget."""
    pytest.importorskip("cvxpy")
    loss, X, y = _problem("epsilon_insensitive", n=150, seed=2)
    copies = np.random.default_rng(2).choice(150, 50, replace=False)
    wiggle = 1.0 + 2 * np.finfo(float).eps * np.random.default_rng(4).choice([-1.0, 1.0], size=(50, X.shape[1]))
    kernel = GaussianKernel(1.0)
    c = torch.full((200,), 10.0, dtype=F64)
    engine = get_solver("working_set", "exact")
    fits = {}
    for case, X_copy in [("exact", X[copies]), ("last bits", X[copies] * wiggle)]:
        X_all = np.concatenate([X, X_copy])
        op = ExactOperator(kernel, BlockData(torch.as_tensor(X_all), F64, torch.device("cpu")))
        fits[case] = engine(op, torch.as_tensor(np.concatenate([y, y[copies]])).reshape(-1, 1), loss, c,
                            SolverOptions(tol=1e-13, max_iter=300), intercept=True)
        assert fits[case].status == "converged", case
    assert fits["last bits"].n_iter == fits["exact"].n_iter
    X_all = np.concatenate([X, X[copies] * wiggle])
    K = kernel(torch.as_tensor(X_all), torch.as_tensor(X_all)).numpy()
    ref = cvxpy_primal("epsilon_insensitive", K, np.concatenate([y, y[copies]]), c.numpy(), intercept=True)
    assert fits["last bits"].primal == pytest.approx(ref, rel=1e-7)
    assert fits["last bits"].primal == pytest.approx(fits["exact"].primal, rel=1e-12)


def test_duplicate_rows_with_an_invalid_weight_are_refused_as_given():
    """The merge must not hide a bad weight inside a positive group sum: c = (2, -1) on two identical rows."""
    loss = get_loss("hinge")
    X = torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]], dtype=F64)
    op = ExactOperator(GaussianKernel(1.0), BlockData(X, F64, torch.device("cpu")))
    Y = torch.tensor([[1.0], [1.0], [-1.0]], dtype=F64)
    for solver in ("working_set", "active_set"):
        with pytest.raises(ValueError, match=r"needs c > 0"):
            get_solver(solver, "exact")(op, Y, loss, torch.tensor([2.0, -1.0, 1.0], dtype=F64))


@pytest.mark.parametrize("name", ["huber", "squared_hinge", "logistic"])
def test_line_search_steps_to_the_minimiser_along_a_long_step(name):
    """A step so long that the primal rises at ``t = 1`` (Armijo's condition fails): the line search returns a step whose
    primal ``1/2 |beta + t d|^2 + sum_i c l(y_i, f_i + t z_i)`` is within 1e-3 (relative to the decrease) of the
    smallest on a grid of 2001 steps in ``[0, 1]`` (the loss's own ``value``; Armijo's halving stopped at the first
    power of 1/2 that met the condition)."""
    from joker_ext.distributed import SingleProcess
    from joker_ext.primal_newton import _line_search

    g = torch.Generator().manual_seed(5)
    n, M = 400, 12
    loss = get_loss(name)
    Phi = torch.randn(n, M, generator=g, dtype=F64)
    y = torch.randn(n, 1, generator=g, dtype=F64)
    Y = torch.sign(y) if loss.margin else y
    c = torch.full((n, 1), 3.0, dtype=F64)
    beta = 0.1 * torch.randn(M, 1, generator=g, dtype=F64)

    def primal(b):
        return 0.5 * float((b * b).sum()) + float((c * loss.value(Y, Phi @ b)).sum())

    a, _ = loss.smoothed_dual(Phi @ beta, Y, c, 0.0)
    grad = beta - Phi.T @ a
    D = -torch.linalg.solve(torch.eye(M, dtype=F64) + Phi.T @ Phi, grad)  # a descent direction
    while not primal(beta + D) > primal(beta):  # made long enough for Armijo's condition to fail at t = 1
        D = 2.0 * D
    t = _line_search(loss, Y, c, beta, D, Phi @ beta, Phi @ D, grad, 0.0, SingleProcess())
    grid = [primal(beta + s * D) for s in np.linspace(0.0, 1.0, 2001)]
    assert 0 < t < 1
    assert primal(beta + t * D) - min(grid) <= 1e-3 * (primal(beta) - min(grid))


@pytest.mark.parametrize("start", ["zero", "coarse"])
def test_active_set_round_out_of_steps_hands_its_sets_to_the_next_round(monkeypatch, start):
    """Squared hinge with an intercept at C = 1000 on 2,000 points. From zero (a warm start at zero: every row free
    at the first step), the first round's damped steps were still moving 16 coordinates a step when its 15 steps ran
    out; restarting the next round from the first sets again threw that work away (10 rounds). Going on from the sets
    it reached, the fit converges within 6. The default start (the coarse solution on a quarter of the rows, which
    squared hinge's half-line box now gets too) converges as well. The solution satisfies the squared hinge's
    optimality condition ``alpha_i = C y_i max(0, 1 - y_i f_i)`` with ``f = K alpha + b``, and ``sum alpha = 0``."""
    import joker_ext.active_set as active_set_module
    from sklearn.datasets import make_classification

    ran_out, steps = [], []
    round_, solve = active_set_module._Column.round, active_set_module._Column.solve

    def spy_solve(self, *args, **kwargs):
        steps.append(1)
        return solve(self, *args, **kwargs)

    def spy_round(self, *args, **kwargs):
        steps.clear()
        out = round_(self, *args, **kwargs)
        ran_out.append(out is None and len(steps) >= active_set_module.MAX_INNER)
        return out

    monkeypatch.setattr(active_set_module._Column, "round", spy_round)
    monkeypatch.setattr(active_set_module._Column, "solve", spy_solve)
    X, labels = make_classification(n_samples=2000, n_features=10, n_informative=6, flip_y=0.05, random_state=3)
    y = np.where(labels == 1, 1.0, -1.0)
    C = 1000.0
    kernel = GaussianKernel(math.sqrt(1 / (2 * 0.1)))  # gamma = 0.1
    c = torch.full((len(y),), C, dtype=F64)
    alpha0 = torch.zeros(len(y), 1, dtype=F64) if start == "zero" else None
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("squared_hinge"), c=c,
                 kernel=kernel, options=SolverOptions(tol=1e-12, max_iter=6), solver="active_set", intercept=True,
                 alpha0=alpha0)
    if start == "zero":
        assert ran_out[0], "the first round settled: the case no longer tests a round that runs out of steps"
    assert m.result.status == "converged" and m.result.rel_gap <= 1e-12, (m.result.status, m.result.n_iter)
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    a = m.result.alpha[:, 0].numpy()
    f = K @ a + float(m.result.state["intercept"][0])
    np.testing.assert_allclose(a, C * y * np.maximum(0.0, 1.0 - y * f), atol=1e-8 * C)
    assert abs(a.sum()) <= 1e-10 * np.abs(a).sum()


@pytest.mark.parametrize("name", ["hinge", "pinball"])
@pytest.mark.parametrize("solver", ["working_set", "active_set"])
def test_a_fit_that_wanders_from_its_best_iterate_returns_that_iterate(solver, name):
    """With a kernel of low rank (the linear kernel on 5 features) the box-QP engines reach the rounding floor within a
    few iterations and then wander: their steps move ``alpha`` along the kernel's null space, and the gap rose to
    3e-8 to 1e-6 before the fit ended 'stalled' 30 iterations later. The fit now stops soon after its gap has risen
    100-fold above a best at the floor and returns that best iterate: its certified gap is the smallest the history
    holds, and its primal objective is cvxpy's (with the intercept)."""
    pytest.importorskip("cvxpy")
    from joker_ext.kernels import CallableKernel

    loss = get_loss(name, **PARAMS)
    X, y = (make_binary if loss.margin else make_regression)(n=400, d=5, seed=3)
    kernel = CallableKernel(lambda A, B: A @ B.T, name="linear")
    c = torch.full((len(y),), 100.0, dtype=F64)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=c, kernel=kernel,
                 options=SolverOptions(tol=1e-14, max_iter=100), solver=solver, intercept=True)
    res = m.result
    assert res.status == "converged" and res.rel_gap <= 1e-11 and res.n_iter < 30, (res.status, res.rel_gap, res.n_iter)
    assert res.rel_gap == min(r["rel_gap"] for r in res.history)
    K = X @ X.T
    assert res.primal == pytest.approx(cvxpy_primal(name, K, y, c.numpy(), intercept=True), rel=1e-7)


def _interpolating_quantile_fit(n: int, d: int, C: float, tol: float, **kwargs):
    """The working set on a pinball problem whose solution frees every coordinate (``C`` large: the kernel's
    interpolant), from scikit-learn's ``make_regression``."""
    from sklearn.datasets import make_regression as sk_regression
    from joker_ext.working_set import working_set

    X, y = sk_regression(n_samples=n, n_features=d, noise=1.0, random_state=0)
    kernel = GaussianKernel(math.sqrt(d * X.var() / 2))  # gamma = 1 / (d var(X)), scikit-learn's 'scale'
    op = ExactOperator(kernel, BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    return working_set(op, torch.as_tensor(y).reshape(-1, 1), get_loss("pinball", quantile=0.5),
                       torch.full((n,), C, dtype=F64), SolverOptions(tol=tol, max_iter=200), intercept=True, **kwargs)


def test_working_set_grows_fast_toward_a_free_set_that_takes_every_violator():
    """Where an exact subproblem frees most of the violators its working set took, the next set takes twice as many
    (:data:`~joker_ext.working_set.GROWTH_FREED`). Near interpolation nearly every coordinate ends free (all but one
    here): with subproblems of 32 coordinates the fit took 7 outer iterations when each set added a tenth of the free
    set, and 3 now; it ends certified at the rounding floor."""
    res = _interpolating_quantile_fit(1500, 10, 1e4, 1e-14, working_set_size=32)
    assert res.status == "converged" and res.rel_gap <= 1e-11, (res.status, res.rel_gap)
    assert res.n_iter <= 4, res.n_iter
    assert int((res.alpha.abs() < 0.5 * 1e4).sum()) >= 0.99 * 1500  # strictly inside the box [-C / 2, C / 2]: free


def test_working_set_stops_once_its_exact_whole_solves_no_longer_lower_the_gap(monkeypatch):
    """A fit whose rounding floor lies above what its exact solves of the whole problem reach (here the floor is set
    below float64's reach) stops two iterations after the first such solve, 'stalled', with its best iterate
    (:class:`~joker_ext.working_set._SolvedStall`). Before, it repeated the solve until the gap's own stall test gave
    up: 11 iterations here, and 24 repeated solves of 0.8 s each for pinball at n = 10,000."""
    from joker_ext.defaults import ROUNDING_GAP

    monkeypatch.setitem(ROUNDING_GAP, torch.float64, 1e-17)
    res = _interpolating_quantile_fit(400, 5, 100.0, 1e-16)
    assert res.status == "stalled" and res.rel_gap <= 1e-12, (res.status, res.rel_gap)
    assert res.n_iter <= 4, res.n_iter
    assert res.rel_gap == min(r["rel_gap"] for r in res.history)


def _first_stop(changes, free, max_steps=15):
    """The step at which :meth:`_Column._refactoring_to_the_end` stops a quick round whose steps changed the sets of
    ``changes[k]`` coordinates of a free set of ``free[k]`` (None: never)."""
    from joker_ext.active_set import _Column
    from joker_ext.box_sets import FREE, LOWER

    for step in range(2, len(changes) + 1):
        code = torch.full((10_000,), LOWER, dtype=torch.int8)
        code[:free[step - 1]] = FREE
        if _Column._refactoring_to_the_end(changes[step - 1], changes[step - 2], max_steps - step, code):
            return step
    return None


def test_quick_rounds_stop_once_their_steps_cannot_become_factor_updates():
    """Recorded quick rounds of the working set (epsilon-insensitive on flights, n = 10,000, C = 710): the first
    subproblem's steps changed thousands of coordinates of a 5,700-7,900 free block, falling by a tenth a step, each a
    fresh factorisation of 1.5-1.9 s; 15 of them (25 s) did not settle. Such a round now stops at its second step. The
    round that did settle on the same problem (its changes fell fast, then became factor updates) is never stopped,
    nor is the same slow round on a block small enough that a fresh factorisation is cheap."""
    from joker_ext.active_set import QUICK_PROJECTED_MIN

    slow = [5377, 4837, 4153, 3746, 3263, 2819, 2549, 2297, 2141, 1888, 1799, 1652, 1524, 1459, 1398]
    slow_free = [8196, 5747, 7058, 6855, 7311, 7284, 7589, 7488, 7699, 7604, 7842, 7673, 7859, 7759, 7872]
    assert _first_stop(slow, slow_free) == 2
    settling = [249, 52, 45, 28, 26, 23, 11, 6, 1]
    assert _first_stop(settling, [8278, 8031, 8041, 8040, 8040, 8040, 8035, 8034, 8032]) is None
    small = QUICK_PROJECTED_MIN - 1
    assert _first_stop([c * small // 8000 for c in slow], [small] * len(slow)) is None


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("solver", ["working_set", "active_set"])
def test_box_qp_engines_hand_out_ordinary_tensors(solver, dtype):
    """The box-QP engines compute under ``torch.inference_mode`` (no autograd bookkeeping on their many small
    operations); what they hand out is ordinary: the callback runs with autograd enabled and gets tensors it may
    update in place or differentiate through, and so does the caller with the fitted model's dual variables. Also
    when the iterates are expanded from merged duplicate rows and cast to the inputs' dtype (float32)."""
    loss, X, y = _problem("hinge", n=120, seed=2)
    if dtype == torch.float32:  # ten duplicated rows: the engine solves the merged problem and expands its iterates
        X, y = np.vstack([X, X[:10]]), np.concatenate([y, y[:10]])
    n = len(y)
    seen = []

    def callback(info):
        a = info["alpha"]
        seen.append((torch.is_grad_enabled(), a.is_inference(), info["state"]["f"].is_inference()))
        w = torch.ones(a.shape[0], dtype=a.dtype, requires_grad=True)
        (w @ a[:, 0]).backward()  # autograd through the iterate
        a.mul_(1.0)  # an in-place update of the copy it was handed
        return False

    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=torch.full((n,), 3.0, dtype=F64),
                 kernel=GaussianKernel(1.0), options=SolverOptions(tol=1e-12, max_iter=100), solver=solver,
                 intercept=True, callback=callback, dtype=dtype)
    assert m.result.status == "converged" and seen and all(s == (True, False, False) for s in seen), seen
    assert m.alpha.dtype == dtype and m.alpha.shape[0] == n
    assert not m.alpha.is_inference() and not m.result.state["intercept"].is_inference()
    m.alpha.add_(0.0)
