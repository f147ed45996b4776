"""The intercept search of joker_ext.intercept, reached through fit_dual(intercept=True) with engines that do not fit
the intercept themselves, against independent references: the bordered linear system of kernel ridge regression with
an unpenalised intercept, and LIBSVM's SVC / SVR on a precomputed kernel."""
import ast
from pathlib import Path

import numpy as np
import pytest
import torch

import joker_ext
from joker_ext.checkpoint import load_solver_state
from joker_ext.kernels import GaussianKernel
from joker_ext.losses import get_loss
from joker_ext.model import fit_dual
from joker_ext.features import make_feature_map
from joker_ext.plan import make_fit_plan
from joker_ext.results import SolverResult
from joker_ext.solver import SolverOptions

from conftest import make_binary, make_regression

F64 = torch.float64


def _bordered(K, Y, c):
    """[alpha; b] of ``min 1/2 a^T K a + sum_i (a_i^2 / (2 c_i) - a_i y_i)`` s.t. ``sum_i a_i = 0`` for each column of
    Y: the solution of ``[[K + diag(1/c), 1], [1^T, 0]] [alpha; b] = [y; 0]`` (kernel ridge regression with an
    unpenalised intercept b; ``c_i = C w_i``)."""
    n = K.shape[0]
    A = np.zeros((n + 1, n + 1))
    A[:n, :n] = K + np.diag(1.0 / c)
    A[:n, n] = 1.0
    A[n, :n] = 1.0
    sol = np.linalg.solve(A, np.vstack([Y, np.zeros((1, Y.shape[1]))]))
    return sol[:n], sol[n]


def _targets(T, n=100, seed=0):
    X, y = make_regression(n=n, seed=seed)
    Y = np.c_[y + 3.0, -2.0 * y + X[:, 2] - 1.5][:, :T]
    return X, Y


@pytest.mark.parametrize("T", [1, 2])
def test_dbcd_tr_with_intercept_is_the_bordered_closed_form(T):
    """fit_dual(intercept=True, solver='dbcd_tr') (which used to raise: DBCD-TR cannot keep sum alpha = 0) runs the
    search and lands on the bordered system's solution, per-sample costs included."""
    X, Y = _targets(T)
    n = X.shape[0]
    c = np.linspace(0.5, 4.0, n)
    kernel = GaussianKernel(1.2)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(Y), loss=get_loss("squared"), c=torch.as_tensor(c),
                 kernel=kernel, options=SolverOptions(tol=1e-14, max_iter=2000), solver="dbcd_tr", intercept=True)
    res = m.result
    assert isinstance(res, SolverResult) and res.status == "converged"
    assert m.extra["solver"] == "dbcd_tr" and m.extra["intercept"] == "search"
    a_ref, b_ref = _bordered(kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy(), Y, c)
    b = res.state["intercept"]
    assert b.dtype == F64 and tuple(b.shape) == (T,)
    np.testing.assert_allclose(b.numpy(), b_ref, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(m.alpha.numpy(), a_ref, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(m.alpha.sum(0).numpy(), 0.0, atol=1e-10)
    # the rounds are reported in the result: their number, one history record each, the iterations of all solves
    rounds = int(res.state["intercept_rounds"])
    assert 1 <= rounds == len(res.history)
    assert [h["round"] for h in res.history] == list(range(1, rounds + 1))
    assert res.history[-1]["iteration"] == res.n_iter
    np.testing.assert_allclose(res.state["f"].numpy(), kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
                               @ m.alpha.numpy(), atol=1e-10)


def test_feature_newton_with_intercept_is_the_bordered_closed_form_of_the_feature_kernel():
    """Random features with the feature Newton engine, which fits the intercept inside its Newton steps (no search):
    the bordered system on ``K = Phi Phi^T``."""
    X, Y = _targets(2, n=120, seed=1)
    kernel = GaussianKernel(1.0)
    fmap = make_feature_map(kernel, 40, seed=3)
    c = np.full(X.shape[0], 5.0)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(Y), loss=get_loss("squared"), c=torch.as_tensor(c),
                 kernel=kernel, feature_map=fmap, options=SolverOptions(tol=1e-14, max_iter=200), solver="newton",
                 intercept=True)
    assert m.result.status == "converged" and "intercept" not in m.extra
    assert "intercept_rounds" not in m.result.state
    Phi = fmap(torch.as_tensor(X)).numpy()
    a_ref, b_ref = _bordered(Phi @ Phi.T, Y, c)
    np.testing.assert_allclose(m.result.state["intercept"].numpy(), b_ref, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(m.beta.numpy(), Phi.T @ a_ref, rtol=1e-7, atol=1e-7)
    assert m.beta.shape == (40, 2)  # the base features' weights, not those of the augmented problem


@pytest.mark.parametrize("loss_name", ["logistic", "squared_hinge"])
def test_feature_newton_fits_the_intercept_of_a_smooth_classification_loss_as_scikit_learn(loss_name):
    """Logistic and squared hinge losses, sample weights, unbalanced classes (an intercept far from 0), random
    features: the intercept is fitted inside the Newton steps (no search), at scikit-learn's LogisticRegression /
    LinearSVC (squared hinge, dual=False) optimum on the same features with an unpenalised intercept."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    X, y = make_binary(n=400, seed=4)
    y = np.where(np.arange(400) % 5 == 0, y, 1.0)  # mostly one class
    kernel = GaussianKernel(1.5)
    fmap = make_feature_map(kernel, 60, seed=2)
    c = np.random.default_rng(3).uniform(0.5, 4.0, 400)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss(loss_name), c=torch.as_tensor(c),
                 kernel=kernel, feature_map=fmap, options=SolverOptions(tol=1e-14, max_iter=100), solver="newton",
                 intercept=True)
    assert m.result.status == "converged" and "intercept" not in m.extra
    Phi = fmap(torch.as_tensor(X)).numpy()
    if loss_name == "logistic":
        ref = LogisticRegression(C=1.0, tol=1e-12, max_iter=10_000).fit(Phi, y, sample_weight=c)
    else:  # C sum max(0, 1 - y f)^2 with weights c / 2; LinearSVC penalises its intercept, whose constant feature of
        # scale 1e3 makes that penalty negligible
        ref = LinearSVC(C=1.0, loss="squared_hinge", dual=False, tol=1e-12, max_iter=100_000,
                        intercept_scaling=1e3).fit(Phi, y, sample_weight=0.5 * c)
    b = float(m.result.state["intercept"][0])
    assert abs(b) > 0.5  # the intercept matters here
    np.testing.assert_allclose(m.beta[:, 0].numpy(), ref.coef_[0], rtol=0, atol=1e-5 * np.abs(ref.coef_).max())
    assert b == pytest.approx(float(ref.intercept_[0]), abs=1e-5 * max(1.0, abs(b)))
    assert abs(float(m.alpha.sum())) <= 1e-10 * float(m.alpha.abs().sum())  # the certified dual point: sum a = 0


@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_feature_newton_fits_a_far_huber_intercept_as_cvxpy(offset):
    """Huber loss (threshold 1) on random features with the targets shifted by ``offset``: at ``b = 0`` every residual
    lies beyond the threshold, no row has curvature and the bordered Newton step cannot move ``b`` (the fit stalled at
    a relative gap of 1.0); ``b`` then goes alone to its minimiser. The optimum is cvxpy's on the same features."""
    cp = pytest.importorskip("cvxpy")
    X, y = make_regression(n=200, seed=5)
    y = y + offset
    kernel = GaussianKernel(1.0)
    fmap = make_feature_map(kernel, 30, seed=1)
    C = 2.0
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("huber"),
                 c=torch.full((200,), C, dtype=F64), kernel=kernel, feature_map=fmap,
                 options=SolverOptions(tol=1e-12, max_iter=100), solver="newton", intercept=True)
    assert m.result.status == "converged" and "intercept" not in m.extra, (m.result.status, m.result.rel_gap)
    Phi = fmap(torch.as_tensor(X)).numpy()
    beta, b = cp.Variable(30), cp.Variable()
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(beta) + C * cp.sum(0.5 * cp.huber(y - Phi @ beta - b, 1.0))))
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    bm = float(m.result.state["intercept"][0])
    assert bm == pytest.approx(float(b.value), abs=1e-6 * max(1.0, abs(offset)))
    assert m.result.primal == pytest.approx(prob.value, rel=1e-7)


def _precomputed(X, sigma):
    return GaussianKernel(sigma)(torch.as_tensor(X), torch.as_tensor(X)).numpy()


@pytest.mark.parametrize("C", [1.0, 10.0])
def test_hinge_with_intercept_through_dbcd_tr_is_libsvm_svc(C):
    """LIBSVM's C is the loss weight c_i = C; its decision function K a + b on a precomputed kernel."""
    from sklearn.svm import SVC

    X, y = make_binary(n=150, seed=2)
    K = _precomputed(X, 1.0)
    svc = SVC(C=C, kernel="precomputed", tol=1e-10).fit(K, y)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("hinge"),
                 c=torch.full((len(y),), C, dtype=F64), kernel=GaussianKernel(1.0),
                 options=SolverOptions(tol=1e-13, max_iter=20000), solver="dbcd_tr", intercept=True)
    assert m.result.status == "converged"
    f_ref = svc.decision_function(K)
    f = K @ m.alpha[:, 0].numpy() + float(m.result.state["intercept"][0])
    np.testing.assert_allclose(f, f_ref, atol=1e-4 * np.abs(f_ref).max())
    assert abs(float(m.result.state["intercept"][0]) - svc.intercept_[0]) <= 1e-4 * max(1.0, abs(svc.intercept_[0]))


def test_epsilon_insensitive_with_intercept_through_dbcd_tr_is_libsvm_svr():
    from sklearn.svm import SVR

    X, y = make_regression(n=150, seed=4)
    y = y + 2.0
    C, eps = 3.0, 0.15
    K = _precomputed(X, 1.0)
    svr = SVR(C=C, epsilon=eps, kernel="precomputed", tol=1e-10).fit(K, y)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("epsilon_insensitive",
                 epsilon=eps), c=torch.full((len(y),), C, dtype=F64), kernel=GaussianKernel(1.0),
                 options=SolverOptions(tol=1e-13, max_iter=20000), solver="dbcd_tr", intercept=True)
    assert m.result.status == "converged"
    f_ref = svr.predict(K)
    f = K @ m.alpha[:, 0].numpy() + float(m.result.state["intercept"][0])
    np.testing.assert_allclose(f, f_ref, atol=1e-4 * np.abs(f_ref).max())


def test_warm_start_intercept_and_callback_per_round():
    X, Y = _targets(1)
    kernel = GaussianKernel(1.2)
    kw = dict(loss=get_loss("squared"), c=torch.full((X.shape[0],), 2.0, dtype=F64), kernel=kernel,
              options=SolverOptions(tol=1e-14, max_iter=2000), solver="dbcd_tr", intercept=True)
    seen = []
    first = fit_dual(torch.as_tensor(X), torch.as_tensor(Y), callback=lambda info: seen.append(info) and False, **kw)
    assert len(seen) >= 1 and {"round", "iteration", "alpha", "state", "rel_gap"} <= set(seen[0])
    assert "intercept" in seen[0]["state"]
    stopped = fit_dual(torch.as_tensor(X), torch.as_tensor(Y), callback=lambda info: True, **kw)
    assert stopped.result.status == "callback" and int(stopped.result.state["intercept_rounds"]) == 1
    # from the solution: converged at once, the same intercept
    again = fit_dual(torch.as_tensor(X), torch.as_tensor(Y), alpha0=first.alpha,
                     intercept0=first.result.state["intercept"], **kw)
    assert int(again.result.state["intercept_rounds"]) == 1
    np.testing.assert_allclose(again.result.state["intercept"].numpy(), first.result.state["intercept"].numpy(),
                               atol=1e-10)


def test_search_refuses_validation_and_takes_a_checkpoint_of_another_fit_as_a_warm_start():
    X, Y = _targets(1, n=30)
    kw = dict(loss=get_loss("squared"), c=torch.ones(30, dtype=F64), kernel=GaussianKernel(1.0), solver="dbcd_tr",
              intercept=True, options=SolverOptions(tol=1e-12, max_iter=5000))
    with pytest.raises(ValueError, match="validation cannot be used with intercept=True"):
        fit_dual(torch.as_tensor(X), torch.as_tensor(Y), validation=lambda *a: 0.0, **kw)
    # a checkpoint of DBCD-TR without the search (e.g. of a fit without intercept): its alpha is a warm start
    engine_alone = fit_dual(torch.as_tensor(X), torch.as_tensor(Y), **{**kw, "intercept": False})
    resume = {"alpha": engine_alone.alpha, "state": engine_alone.result.state}
    with pytest.warns(RuntimeWarning, match="checkpoint of solver 'dbcd_tr' alone"):
        m = fit_dual(torch.as_tensor(X), torch.as_tensor(Y), resume=resume, **kw)
    alpha, b = _bordered(GaussianKernel(1.0)(torch.as_tensor(X), torch.as_tensor(X)).numpy(), Y, np.ones(30))
    np.testing.assert_allclose(m.result.state["intercept"].numpy(), b, atol=1e-6)


def test_engine_fitting_the_intercept_takes_a_search_checkpoint_as_a_warm_start(tmp_path):
    """A checkpoint written by the intercept search around DBCD-TR, resumed with an engine that fits the intercept
    itself (the active-set method): a warm start from its alpha and intercept (RuntimeWarning), ending at the
    bordered system's solution."""
    X, Y = _targets(1, n=40)
    kw = dict(loss=get_loss("squared"), c=torch.ones(40, dtype=F64), kernel=GaussianKernel(1.0), intercept=True,
              options=SolverOptions(tol=1e-12, max_iter=5000))
    ck = tmp_path / "search.ckpt"
    fit_dual(torch.as_tensor(X), torch.as_tensor(Y), solver="dbcd_tr", checkpoint_path=ck, checkpoint_every=1, **kw)
    with pytest.warns(RuntimeWarning, match="holds a checkpoint of the intercept search"):
        m = fit_dual(torch.as_tensor(X), torch.as_tensor(Y), solver="active_set", resume=ck, **kw)
    alpha, b = _bordered(GaussianKernel(1.0)(torch.as_tensor(X), torch.as_tensor(X)).numpy(), Y, np.ones(40))
    np.testing.assert_allclose(m.result.state["intercept"].numpy(), b, atol=1e-8)
    np.testing.assert_allclose(m.alpha.numpy(), alpha, atol=1e-8)


class _Crash(Exception):
    pass


@pytest.mark.parametrize("mode,solver,loss_name", [("exact", "dbcd_tr", "squared"), ("features", "newton", "hinge"),
                                                   ("features", "newton", "epsilon_insensitive")])
def test_search_resumed_from_its_checkpoint_ends_bitwise_where_the_uninterrupted_search_does(tmp_path, mode, solver,
                                                                                          loss_name):
    """A search that crashes after its third round and is resumed from the checkpoint written after its second
    makes the same solves: the same dual variables, intercept, gap and history as a search never interrupted; and
    its result solves the problem (relative gap within tol)."""
    loss = get_loss(loss_name)
    X, y = (make_binary if loss.margin else make_regression)(n=400, seed=4)
    Y = torch.as_tensor(y + (0.0 if loss.margin else 2.5)).reshape(-1, 1)
    kernel = GaussianKernel(1.0)
    fmap = (lambda: None) if mode == "exact" else (lambda: make_feature_map(kernel, 48, seed=2))
    kw = dict(loss=loss, c=torch.full((400,), 10.0, dtype=F64), kernel=kernel, solver=solver, intercept=True,
              options=SolverOptions(tol=1e-10, max_iter=3000, seed=1))
    full = fit_dual(torch.as_tensor(X), Y, feature_map=fmap(), **kw)
    assert int(full.result.state["intercept_rounds"]) >= 4 and full.result.rel_gap <= 1e-10

    def crash_after_round_3(info):
        if info["round"] == 3:
            raise _Crash

    ck = tmp_path / "search.ckpt"
    with pytest.raises(_Crash):
        fit_dual(torch.as_tensor(X), Y, feature_map=fmap(), checkpoint_path=ck, checkpoint_every=1,
                 callback=crash_after_round_3, **kw)
    saved = load_solver_state(ck)
    # written after round 1 or 2 (round 3's callback raised before its checkpoint; a round without engine
    # iterations, where the solve started converged, passes no multiple of checkpoint_every)
    assert 1 <= saved["search"]["rounds"] <= 2
    resumed = fit_dual(torch.as_tensor(X), Y, feature_map=fmap(), resume=ck, **kw)
    assert torch.equal(resumed.alpha, full.alpha)
    assert torch.equal(resumed.result.state["intercept"], full.result.state["intercept"])
    assert resumed.result.n_iter == full.result.n_iter and resumed.result.rel_gap == full.result.rel_gap
    assert [r["rel_gap"] for r in resumed.result.history] == [r["rel_gap"] for r in full.result.history]
    # the same checkpoint for the problem at another C: its brackets on b belong to the other problem, so it is only
    # a warm start; the fit still solves its own problem (a cold fit's primal objective)
    other = dict(kw, c=torch.full((400,), 30.0, dtype=F64))
    with pytest.warns(RuntimeWarning, match="intercept search of another problem"):
        warm = fit_dual(torch.as_tensor(X), Y, feature_map=fmap(), resume=ck, **other)
    cold = fit_dual(torch.as_tensor(X), Y, feature_map=fmap(), **other)
    assert warm.result.rel_gap <= 1e-10
    assert warm.result.primal == pytest.approx(cold.result.primal, rel=1e-9)


@pytest.mark.parametrize("mode,loss_name", [("exact", "logistic"), ("exact", "hinge"), ("features", "logistic")])
def test_engine_fitting_the_intercept_resumes_from_its_checkpoint(tmp_path, monkeypatch, mode, loss_name):
    """The engines that fit the intercept themselves (exact Newton's primal steps, the working set, feature Newton)
    save it with their iterate; a fit crashed half way and resumed ends at the uninterrupted fit's optimum
    (within tol), its intercept saved in the checkpoint. The working set starts without its SMO phase, after which
    it solves this problem in one certified outer iteration (a resumed fit goes on with the decomposition alone)."""
    import joker_ext.working_set as ws

    monkeypatch.setattr(ws, "USE_SMO", False)
    loss = get_loss(loss_name)
    X, y = make_binary(n=500, seed=6)
    Y = torch.as_tensor(y).reshape(-1, 1)
    kernel = GaussianKernel(1.0)
    fmap = (lambda: None) if mode == "exact" else (lambda: make_feature_map(kernel, 64, seed=3))
    kw = dict(loss=loss, c=torch.full((500,), 20.0, dtype=F64), kernel=kernel, intercept=True,
              options=SolverOptions(tol=1e-12))
    full = fit_dual(torch.as_tensor(X), Y, feature_map=fmap(), **kw)
    assert full.result.n_iter >= 2
    half = full.result.n_iter // 2

    def crash(info):
        if info["iteration"] == half:
            raise _Crash

    ck = tmp_path / "engine.ckpt"
    with pytest.raises(_Crash):
        fit_dual(torch.as_tensor(X), Y, feature_map=fmap(), checkpoint_path=ck, checkpoint_every=1, callback=crash,
                 **kw)
    saved = load_solver_state(ck)
    assert "intercept" in saved["state"] and 1 <= saved["iteration"] <= half
    resumed = fit_dual(torch.as_tensor(X), Y, feature_map=fmap(), resume=ck, **kw)
    assert resumed.result.status == "converged" and resumed.result.rel_gap <= 1e-12
    assert resumed.result.primal == pytest.approx(full.result.primal, rel=1e-10)
    np.testing.assert_allclose(resumed.result.state["intercept"].numpy(), full.result.state["intercept"].numpy(),
                               atol=1e-5)


def test_plan_intercept_must_be_a_bool():
    with pytest.raises(TypeError, match="intercept must be True or False, got str 'yes'"):
        make_fit_plan(GaussianKernel(1.0), get_loss("squared"), n=10, intercept="yes")
    plan = make_fit_plan(GaussianKernel(1.0), get_loss("squared"), n=10, solver="dbcd_tr", intercept=np.bool_(True))
    assert plan.intercept == "search"


def test_intercept_module_imports_neither_estimators_nor_model():
    """The search is core: it must not reach back into a face (and gets the engine run passed in)."""
    src = Path(joker_ext.__file__).with_name("intercept.py").read_text()
    names = {node.module for node in ast.walk(ast.parse(src)) if isinstance(node, ast.ImportFrom) and node.module}
    assert not names & {"estimators", "model", "plan"}, names


def test_search_out_of_rounds_with_budget_left_reports_stalled():
    """A search whose engine keeps returning alphas that do not sum to zero ends after its rounds. With most of the
    iteration budget left that is 'stalled' (raising max_iter would not help), not 'max_iter'."""
    from joker_ext.data import BlockData
    from joker_ext.intercept import MAX_INTERCEPT_ROUNDS, fit_intercept_search

    X, y = make_regression(n=40, seed=0)
    Y = torch.as_tensor(y).reshape(-1, 1)
    calls = []

    def noisy_solve(loss, kernel, feature_map, options, alpha0):
        calls.append(options.max_iter)
        alpha = torch.full((40, 1), (-1.0) ** len(calls) * 1e-3, dtype=F64)  # sum alpha never settles
        f = kernel(torch.as_tensor(X), torch.as_tensor(X)) @ alpha
        return SolverResult(alpha=alpha, state={"f": f}, n_iter=1, status="converged", primal=0.0, dual=0.0,
                            gap=0.0, rel_gap=0.0, radius=torch.ones(1, dtype=F64))

    res = fit_intercept_search(BlockData(torch.as_tensor(X), F64, torch.device("cpu")), Y, loss=get_loss("squared"),
                               c=torch.ones(40, dtype=F64), kernel=GaussianKernel(1.0), feature_map=None,
                               options=SolverOptions(tol=1e-12, max_iter=10_000), dtype=F64,
                               device=torch.device("cpu"), solve=noisy_solve)
    assert len(calls) == MAX_INTERCEPT_ROUNDS and res.n_iter < 10_000
    assert res.status == "stalled"


@pytest.mark.parametrize("solver", ["dbcd_tr", "newton"])
def test_search_brackets_a_far_intercept_where_every_alpha_is_at_a_bound(solver):
    """Hinge at C = 0.01, classes of nearly equal weight: every alpha sits at a bound of its box, so
    ``s(b) = sum alpha`` is flat (and small: the classes' weights nearly cancel) over a long range of b, and the
    proximal steps ``rho s`` ran out of rounds far from the root. The search doubles its step where s did not
    change, and reaches cvxpy's optimum. (The exact Newton engine now fits the hinge loss's intercept itself, inside
    its active-set method: no search, the same optimum.)"""
    pytest.importorskip("cvxpy")
    from conftest import cvxpy_primal

    g = np.random.default_rng(5)
    X = g.standard_normal((60, 2))
    y = np.where(np.arange(60) < 30, 1.0, -1.0)
    c = np.full(60, 0.01)
    c[30] = 0.0112  # sum_i y_i c_i = -1.2e-3
    kernel = GaussianKernel(1.0)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("hinge"), c=torch.as_tensor(c),
                 kernel=kernel, options=SolverOptions(tol=1e-12, max_iter=5000), solver=solver, intercept=True)
    from joker_ext.intercept import MAX_INTERCEPT_ROUNDS

    assert m.result.status == "converged", (m.result.status, m.result.rel_gap)
    if solver == "dbcd_tr":
        assert int(m.result.state["intercept_rounds"]) < MAX_INTERCEPT_ROUNDS
    else:
        assert "intercept_rounds" not in m.result.state
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    assert m.result.primal == pytest.approx(cvxpy_primal("hinge", K, y, c, intercept=True), rel=1e-7)


@pytest.mark.parametrize("name", ["hinge", "epsilon_insensitive", "absolute", "pinball"])
def test_feature_newton_search_rounds_restart_at_the_warm_dual_point(name):
    """Kinked losses, random features, the feature Newton engine inside the search: every round after the first is
    warm-started, and its smoothing continuation is centred at the warm dual point, so it takes a fraction of the
    first (cold) round's Newton iterations. Before, each round restarted the continuation centred at zero and paid
    about as many as the first (n = 20,000, M = 256, hinge: 15 rounds of ~35-55 iterations, 50 s, 'max_iter'; now 12
    s, converged). The optimum is cvxpy's on ``K = Phi Phi^T`` with an unregularized intercept."""
    pytest.importorskip("cvxpy")
    from conftest import PARAMS, cvxpy_primal

    X, y = make_regression(n=300, seed=2)
    yy = np.where(y > np.median(y) + 0.3, 1.0, -1.0) if name == "hinge" else y + 2.0
    params = {"epsilon_insensitive": {"epsilon": PARAMS["epsilon"]}, "pinball": {"quantile": PARAMS["quantile"]}}
    kernel = GaussianKernel(1.0)
    fmap = make_feature_map(kernel, 40, seed=3)
    c = np.full(300, 10.0)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(yy).reshape(-1, 1), loss=get_loss(name, **params.get(name, {})),
                 c=torch.as_tensor(c), kernel=kernel, feature_map=fmap, options=SolverOptions(tol=1e-10, max_iter=2000),
                 solver="newton", intercept=True)
    assert m.result.status == "converged", (m.result.status, m.result.rel_gap)
    iters = [rec["iteration"] for rec in m.result.history]
    assert len(iters) >= 3
    warm_mean = (iters[-1] - iters[0]) / (len(iters) - 1)
    assert warm_mean <= 0.6 * iters[0], iters  # before: 1.0-1.1x the first round's
    Phi = fmap(torch.as_tensor(X)).numpy()
    assert m.result.primal == pytest.approx(cvxpy_primal(name, Phi @ Phi.T, yy, c, intercept=True), rel=1e-8)
