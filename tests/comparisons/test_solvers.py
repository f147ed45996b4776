"""Tests of the seed-paper solvers in joker_ext.comparisons.solvers, each against an independent reference."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from joker_ext.kernels import GaussianKernel, LaplacianKernel
from joker_ext.comparisons.solvers import (
    ADMMSVM,
    ASkotch,
    DoublyStochasticGradient,
    EigenPro2,
    EigenPro3,
    HSSMatrix,
    svm_dual_objective,
)


pytestmark = pytest.mark.usefixtures("single_thread")  # tests/comparisons/conftest.py


def _dense(kernel, X, Z=None):
    Xt = torch.as_tensor(X)
    return kernel(Xt, Xt if Z is None else torch.as_tensor(Z)).numpy()


# ---------------------------------------------------------------------------- EigenPro
def _ep_problem(n=500, d=10, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(n)
    return X, y, LaplacianKernel(sigma=0.5 * np.sqrt(d))


def test_eigenpro2_interpolation_residual_goes_to_zero():
    X, y, k = _ep_problem()
    ep = EigenPro2(k, epochs=12).fit(X, y)
    res = [r for _, r in ep.history_]
    assert res[-1] < 1e-3 * res[0]
    assert all(b < a for a, b in zip(res[:-1], res[1:]))  # monotone decrease
    # independent reference: the interpolant K^{-1} y
    alpha = np.linalg.solve(_dense(k, X), y)
    assert np.linalg.norm(ep.alpha_[:, 0].numpy() - alpha) / np.linalg.norm(alpha) < 1e-2
    assert np.abs(ep.predict(X) - y).max() < 1e-2
    assert any("no ridge term" in s for s in ep.notes)


def test_eigenpro2_ridge_option_reaches_krr_solution():
    X, y, k = _ep_problem(n=400)
    n, penalty = X.shape[0], 1e-3
    ep = EigenPro2(k, ridge=n * penalty, epochs=15).fit(X, y)
    ref = np.linalg.solve(_dense(k, X) + n * penalty * np.eye(n), y)
    assert np.linalg.norm(ep.alpha_[:, 0].numpy() - ref) / np.linalg.norm(ref) < 1e-4


def _weighted_ls_point(K_XX, K_XZ, y, idx, q):
    """Lemma 6 of seed 001 with the Nystrom preconditioner: (K_ZX W K_XZ)^{-1} K_ZX W y, W = I - S Q_s K_sX."""
    n, s = K_XX.shape[0], len(idx)
    ev, E = np.linalg.eigh(K_XX[np.ix_(idx, idx)] / s)
    ev, E = ev[::-1], E[:, ::-1]
    tail, lam = ev[q], ev[:q]
    Qs = (E[:, :q] * ((1 - tail / lam) / (s * lam))) @ E[:, :q].T
    W = np.eye(n)
    W[idx, :] -= Qs @ K_XX[idx, :]
    A = K_XZ.T @ W @ K_XZ
    return np.linalg.solve(A, K_XZ.T @ W @ y)


@pytest.mark.parametrize("n_nystrom", [None, 150])
def test_eigenpro3_converges_to_weighted_least_squares_point(n_nystrom):
    X, y, k = _ep_problem(n=300)
    Z = X[:30]
    ep = EigenPro3(k, centers=Z, n_nystrom=n_nystrom, top_q=15, batch_size=X.shape[0], epochs=80,
                   projection="exact").fit(X, y)
    K_XX, K_XZ = _dense(k, X), _dense(k, X, Z)
    ref = _weighted_ls_point(K_XX, K_XZ, y, ep.nystrom_indices_.numpy(), 15)
    err = np.linalg.norm(ep.alpha_[:, 0].numpy() - ref) / np.linalg.norm(ref)
    assert err < 1e-6
    # the point is not the plain least-squares solution (so the check discriminates)
    ls = np.linalg.lstsq(K_XZ, y, rcond=None)[0]
    assert np.linalg.norm(ls - ref) / np.linalg.norm(ref) > 1e-2


def test_eigenpro3_inexact_projection_keeps_the_fixed_point():
    X, y, k = _ep_problem(n=300)
    Z = X[:30]
    ep = EigenPro3(k, centers=Z, n_nystrom=150, top_q=15, batch_size=X.shape[0], epochs=60,
                   projection="eigenpro2", projection_epochs=3).fit(X, y)
    ref = _weighted_ls_point(_dense(k, X), _dense(k, X, Z), y, ep.nystrom_indices_.numpy(), 15)
    assert np.linalg.norm(ep.alpha_[:, 0].numpy() - ref) / np.linalg.norm(ref) < 1e-3


def test_eigenpro3_stochastic_defaults_fit():
    X, y, k = _ep_problem(n=400)
    ep = EigenPro3(k, n_centers=100, epochs=5).fit(X, y)
    res = [r for _, r in ep.history_]
    assert res[-1] < 0.5 * res[0]
    assert ep.batch_size_ < X.shape[0]


# ---------------------------------------------------------------------------- ASkotch
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_askotch_linear_convergence_to_krr(device):
    rng = np.random.default_rng(1)
    n, d, lam = 400, 5, 1e-2
    X = rng.standard_normal((n, d))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(n)
    k = LaplacianKernel(sigma=3.0)
    ref = np.linalg.solve(_dense(k, X) + lam * np.eye(n), y)
    m = ASkotch(k, lam, block_size=80, rank=40, max_iter=400, tol=1e-10, device=device).fit(X, y)
    assert m.w_.device.type == device
    err = np.linalg.norm(m.w_[:, 0].cpu().numpy() - ref) / np.linalg.norm(ref)
    assert err < 1e-6
    it = np.array([i for i, _ in m.history_[1:]], dtype=float)
    lr = np.log10([r for _, r in m.history_[1:]])
    slope, icpt = np.polyfit(it, lr, 1)
    r2 = 1 - np.sum((lr - (slope * it + icpt)) ** 2) / np.sum((lr - lr.mean()) ** 2)
    assert slope < 0 and r2 > 0.95  # geometric decrease: log residual linear in the iteration count
    half = len(lr) // 2
    rate1 = (lr[half] - lr[0]) / (it[half] - it[0])
    rate2 = (lr[-1] - lr[half]) / (it[-1] - it[half])
    assert rate2 < 0.3 * rate1 < 0  # no stagnation: the second half keeps a comparable rate


def test_skotch_unaccelerated_converges():
    rng = np.random.default_rng(2)
    n, lam = 300, 1e-1
    X = rng.standard_normal((n, 4))
    y = X[:, 0] ** 2
    k = GaussianKernel(2.0)
    ref = np.linalg.solve(_dense(k, X) + lam * np.eye(n), y)
    m = ASkotch(k, lam, block_size=60, rank=30, accelerated=False, max_iter=300, tol=1e-9).fit(X, y)
    assert np.linalg.norm(m.w_[:, 0].numpy() - ref) / np.linalg.norm(ref) < 1e-5


# ---------------------------------------------------------------------------- doubly stochastic gradients
def test_dsg_error_decreases_like_one_over_t():
    rng = np.random.default_rng(0)
    n, sigma, nu, T = 300, 0.5, 0.02, 250
    X = rng.uniform(-1, 1, (n, 2))
    y = np.sin(2 * X[:, 0]) * X[:, 1] + 0.1 * rng.standard_normal(n)
    k = GaussianKernel(sigma)
    K = _dense(k, X)
    f_star = K @ np.linalg.solve(K + n * nu * np.eye(n), y)  # minimiser of (1/n) sum (f-y)^2/2 + nu/2 ||f||^2
    errs = []
    for seed in range(3):
        m = DoublyStochasticGradient("gaussian", sigma, "squared", nu=nu, theta=1.0, batch_size=8,
                                     n_features_per_iter=16, n_iter=4 * T, seed=seed).fit(X, y)
        errs.append([np.mean((m.decision_function(X, n_iter=t) - f_star) ** 2) for t in (T, 4 * T)])
    e_T, e_4T = np.mean(errs, axis=0)
    ratio = e_4T / e_T
    assert 0.1 < ratio < 0.42  # O(1/t) predicts 1/4; O(1/sqrt(t)) would give 1/2


def test_dsg_features_regenerated_from_seeds():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((200, 3))
    y = X[:, 0]
    kw = dict(kernel_family="laplacian", sigma=1.5, loss="squared", nu=1e-3, batch_size=16,
              n_features_per_iter=8, n_iter=300, seed=5)
    cached = DoublyStochasticGradient(**kw, keep_features=True).fit(X, y)
    regen = DoublyStochasticGradient(**kw).fit(X, y)
    assert regen._cache is None
    Xt = torch.as_tensor(X[:50])
    out = regen.predict(Xt)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), cached.predict(X[:50]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loss", ["hinge", "logistic"])
def test_dsg_classification(loss):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((400, 2))
    labels = np.where(X[:, 0] + X[:, 1] > 0, "pos", "neg")
    m = DoublyStochasticGradient("gaussian", 1.0, loss, nu=1e-3, theta=1.0, batch_size=32,
                                 n_features_per_iter=16, n_iter=300).fit(X, labels)
    assert (m.predict(X) == labels).mean() > 0.9


# ---------------------------------------------------------------------------- ADMM SVM
def _svm_problem(n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    y = np.where(X[:, 0] * X[:, 1] + 0.3 * rng.standard_normal(n) > 0, 1, -1)
    return X, y, GaussianKernel(1.0)


def test_admm_converged_mode_matches_exact_qp():
    from sklearn.svm import SVC

    X, y, k = _svm_problem()
    K, C = _dense(k, X), 1.0
    svc = SVC(kernel="precomputed", C=C, tol=1e-10).fit(K, y)
    a = np.zeros(len(y))
    a[svc.support_] = np.abs(svc.dual_coef_[0])
    ref = svm_dual_objective(K, y, a)
    m = ADMMSVM(k, C=C, beta=1.0, converged=True, max_iter=20000, tol=1e-9).fit(X, y)
    z = m.dual_coef_.numpy()
    assert m.n_iter_ < 20000
    assert abs(svm_dual_objective(K, y, z) - ref) / abs(ref) < 1e-5
    assert z.min() >= 0 and z.max() <= C and abs(y @ z) < 1e-6
    assert abs(m.intercept_ - svc.intercept_[0]) < 1e-3
    np.testing.assert_allclose(m.decision_function(X), svc.decision_function(K), atol=1e-3)


def test_admm_paper_mode_runs_but_does_not_reach_the_optimum():
    from sklearn.svm import SVC

    X, y, k = _svm_problem()
    K = _dense(k, X)
    svc = SVC(kernel="precomputed", C=1.0, tol=1e-10).fit(K, y)
    a = np.zeros(len(y))
    a[svc.support_] = np.abs(svc.dual_coef_[0])
    ref = svm_dual_objective(K, y, a)
    m = ADMMSVM(k, C=1.0).fit(X, y)  # paper: beta = 1e2, MaxIt = 10
    assert m.n_iter_ == 10 and m.beta_ == 100.0
    assert (m.objective_ - ref) / abs(ref) > 0.1  # far from the QP optimum
    assert m.dual_coef_.max() < 3 * 10 / 100.0  # iterates stay of size ~ MaxIt / beta
    assert any("not run to the QP optimum" in s for s in m.notes)
    assert (m.predict(X) == y).mean() > 0.7  # yet a usable classifier


def test_admm_hss_mode_close_to_exact():
    X, y, k = _svm_problem()
    exact = ADMMSVM(k, C=1.0, beta=1.0, converged=True, max_iter=20000, tol=1e-9).fit(X, y)
    hss = ADMMSVM(k, C=1.0, beta=1.0, converged=True, max_iter=20000, tol=1e-9, mode="hss",
                  hss_options=dict(max_rank=48, leaf_size=64)).fit(X, y)
    assert abs(hss.objective_ - exact.objective_) / abs(exact.objective_) < 1e-6
    assert abs(hss.intercept_ - exact.intercept_) < 1e-4


# ---------------------------------------------------------------------------- HSS
def test_hss_matvec_matches_dense():
    rng = np.random.default_rng(0)
    n = 2000
    X = rng.uniform(0, 1, (n, 2))
    k = GaussianKernel(0.3)
    H = HSSMatrix.from_kernel(k, X, max_rank=64, rel_tol=1e-13)
    V = rng.standard_normal((n, 3))
    ref = _dense(k, X) @ V
    assert np.linalg.norm(H.matvec(V) - ref) / np.linalg.norm(ref) < 1e-6
    v = torch.as_tensor(V[:, 0])
    out = H.matvec(v)
    assert isinstance(out, torch.Tensor) and out.shape == (n,)


def test_hss_solver_is_exact_for_the_compressed_matrix():
    rng = np.random.default_rng(1)
    n = 800
    X = rng.uniform(0, 1, (n, 3))
    k = GaussianKernel(0.5)
    H = HSSMatrix.from_kernel(k, X, max_rank=40, leaf_size=64)
    dense = H.to_dense().numpy()
    b = rng.standard_normal((n, 2))
    for shift in (1e-3, 10.0):
        x = H.factorize(shift).solve(b)
        ref = np.linalg.solve(dense + shift * np.eye(n), b)
        assert np.linalg.norm(x - ref) / np.linalg.norm(ref) < 1e-10
    raw = H.factorize(1e-3, refine=0).solve(b)  # the direct solve alone is already close
    ref = np.linalg.solve(dense + 1e-3 * np.eye(n), b)
    assert np.linalg.norm(raw - ref) / np.linalg.norm(ref) < 1e-6


def test_hss_memory_grows_like_n_r():
    rng = np.random.default_rng(2)
    k, r = GaussianKernel(0.3), 32
    mem = {}
    for n in (1000, 4000):
        X = rng.uniform(0, 1, (n, 2))
        H = HSSMatrix.from_kernel(k, X, max_rank=r)
        mem[n] = H.memory_numbers()
        assert mem[n] < 8 * n * r  # O(n r) with a small constant
        assert H.max_rank_used <= r
    assert mem[4000] / mem[1000] < 5.0  # linear growth (a dense matrix would grow 16x)
    assert mem[4000] < 4000 ** 2 / 10


# ---------------------------------------------------------------------------- API
def test_outputs_follow_input_type_and_target_shape():
    X, y, k = _ep_problem(n=200)
    Y2 = np.stack([y, -y], axis=1)
    ep = EigenPro2(k, epochs=2).fit(X, Y2)
    assert ep.predict(X).shape == (200, 2) and isinstance(ep.predict(X), np.ndarray)
    out = ep.predict(torch.as_tensor(X))
    assert isinstance(out, torch.Tensor) and out.shape == (200, 2)
    ask = ASkotch(k, 1.0, block_size=50, rank=10, max_iter=5).fit(torch.as_tensor(X), torch.as_tensor(y))
    assert ask.predict(X).shape == (200,)


def test_progress_callbacks():
    X, y, k = _ep_problem(n=200)
    seen = []
    ep = EigenPro2(k, epochs=3).fit(X, y, callback=seen.append)
    assert [i["epoch"] for i in seen] == [1, 2, 3]
    # without tol the residual is handed over as a function (a caller evaluates it off its clock)
    res = seen[-1]["relative_residual"]()
    reference = np.linalg.norm(_dense(k, X) @ ep.alpha_[:, 0].numpy() - y) / np.linalg.norm(y)
    assert res == pytest.approx(reference, rel=1e-10)
    np.testing.assert_allclose(seen[-1]["predict"](X[:5]), ep.predict(X[:5]))
    seen.clear()
    ep = EigenPro2(k, epochs=3, tol=1e-12).fit(X, y, callback=seen.append)  # tol: computed by fit itself
    assert seen[-1]["relative_residual"] == ep.history_[-1][1]
    seen.clear()
    ASkotch(k, 1.0, block_size=50, rank=10, max_iter=8, eval_every=4).fit(X, y, callback=seen.append)
    assert [i["iteration"] for i in seen] == [4, 8]
    with pytest.raises(TypeError, match="callback must be a callable"):
        EigenPro2(k).fit(X, y, callback=3)


@pytest.mark.parametrize("name", ["eigenpro2", "eigenpro3", "askotch", "dsg", "admm"])
def test_max_time_stops_each_solver_and_excludes_callbacks(name):
    """The time budget ends the fit early (stop_reason_ says so) and a slow progress callback does not use it up:
    the solver's clock excludes the callback (the harness evaluates its trace off the clock)."""
    import time

    X, y, k = _ep_problem(n=3000, d=5)
    make = {
        "eigenpro2": lambda t: EigenPro2(k, n_nystrom=300, ridge=3.0, epochs=10_000, batch_size=64, max_time=t),
        "eigenpro3": lambda t: EigenPro3(k, n_centers=200, n_nystrom=300, epochs=10_000, batch_size=64, max_time=t),
        "askotch": lambda t: ASkotch(k, 3.0, max_iter=10 ** 7, eval_every=10, tol=None, max_time=t),
        "dsg": lambda t: DoublyStochasticGradient("gaussian", 1.0, nu=1e-3, n_iter=10 ** 6, max_time=t),
        "admm": lambda t: ADMMSVM(k, C=1.0, converged=True, max_iter=10 ** 7, tol=0.0, eps_abs=0.0, max_time=t),
    }[name]
    target = np.sign(y) if name == "admm" else y
    t0 = time.perf_counter()
    m = make(0.5).fit(X, target)
    wall = time.perf_counter() - t0
    assert m.stop_reason_ == "max_time"
    assert 0.5 <= wall < 10.0
    # a callback that sleeps 0.2 s each time: the fit still gets its 1.5 s of work, so the wall time grows
    calls = []
    t0 = time.perf_counter()
    m = make(1.5).fit(X, target, callback=lambda info: (calls.append(1), time.sleep(0.2)))
    wall = time.perf_counter() - t0
    assert m.stop_reason_ == "max_time" and len(calls) >= 1
    assert wall >= 1.5 + 0.2 * len(calls) - 0.05


def test_stopping_rules_epochs_tol():
    X, y, k = _ep_problem(n=300)
    ep = EigenPro2(k, ridge=3.0, epochs=4).fit(X, y)
    assert ep.stop_reason_ == "epochs" and ep.epochs_done_ == 4
    ep = EigenPro2(k, ridge=3.0, epochs=200, tol=1e-3).fit(X, y)
    assert ep.stop_reason_ == "tol" and ep.history_[-1][1] <= 1e-3
    # independent check of the residual the rule tested
    r = (_dense(k, X) + 3.0 * np.eye(300)) @ ep.alpha_[:, 0].numpy() - y
    assert np.linalg.norm(r) / np.linalg.norm(y) <= 1e-3
    ep3 = EigenPro3(k, n_centers=50, epochs=500, tol=1e-3).fit(X, y)
    assert ep3.stop_reason_ == "tol" and ep3.epochs_done_ < 500
    ask = ASkotch(k, 1.0, block_size=50, rank=20, max_iter=5000, tol=1e-6).fit(X, y)
    assert ask.stop_reason_ == "tol" and ask.history_[-1][1] <= 1e-6
    assert ASkotch(k, 3.0, max_iter=7, tol=None).fit(X, y).stop_reason_ == "max_iter"
    assert DoublyStochasticGradient("gaussian", 1.0, nu=1e-3, n_iter=5).fit(X, y).n_iter_ == 5


@pytest.mark.parametrize(
    "make, exc, words",
    [
        (lambda: EigenPro2("gaussian"), TypeError, ["kernel", "joker_ext kernel", "str"]),
        (lambda: EigenPro2(GaussianKernel(1.0), batch_size=0), ValueError, ["batch_size", ">= 1", "0"]),
        (lambda: EigenPro2(GaussianKernel(1.0), step="big"), ValueError, ["step", "auto", "big"]),
        (lambda: EigenPro3(GaussianKernel(1.0)), ValueError, ["centers", "n_centers", "neither"]),
        (lambda: EigenPro3(GaussianKernel(1.0), n_centers=10, projection="cg"), ValueError,
         ["projection", "eigenpro2", "cg"]),
        (lambda: ASkotch(GaussianKernel(1.0), lam=0.0), ValueError, ["lam", "> 0", "0.0"]),
        (lambda: ASkotch(GaussianKernel(1.0), lam=1.0, rank=2.5), TypeError, ["rank", "integer", "2.5"]),
        (lambda: ASkotch(GaussianKernel(1.0), lam=1.0, rho="big"), ValueError, ["rho", "damped", "big"]),
        (lambda: DoublyStochasticGradient("rbf"), ValueError, ["kernel_family", "gaussian", "rbf"]),
        (lambda: DoublyStochasticGradient(loss="l1"), ValueError, ["loss", "hinge", "l1"]),
        (lambda: DoublyStochasticGradient(nu=-1.0), ValueError, ["nu", "> 0", "-1.0"]),
        (lambda: ADMMSVM(GaussianKernel(1.0), C=-1.0), ValueError, ["C", "> 0", "-1.0"]),
        (lambda: ADMMSVM(GaussianKernel(1.0), mode="ulv"), ValueError, ["mode", "exact", "ulv"]),
        (lambda: HSSMatrix.from_kernel(GaussianKernel(1.0), np.zeros((10, 2)), max_rank=0), ValueError,
         ["max_rank", ">= 1", "0"]),
    ],
)
def test_bad_arguments_are_named(make, exc, words):
    with pytest.raises(exc) as info:
        make()
    msg = str(info.value)
    for w in words:
        assert w in msg, (w, msg)


def test_bad_fit_inputs_are_named():
    k = GaussianKernel(1.0)
    X = np.zeros((10, 2))
    with pytest.raises(ValueError, match=r"y must have 10 rows.*got 9"):
        EigenPro2(k).fit(X, np.zeros(9))
    with pytest.raises(ValueError, match=r"y must contain exactly two classes, got 3"):
        ADMMSVM(k).fit(np.random.default_rng(0).standard_normal((9, 2)), np.arange(9) % 3)
    with pytest.raises(TypeError, match=r"X must be a numpy array or torch tensor.*str"):
        ASkotch(k, 1.0).fit("data", np.zeros(10))
    with pytest.raises(ValueError, match=r"n_nystrom must be at most.*n=10, got 20"):
        EigenPro2(k, n_nystrom=20).fit(X, np.zeros(10))
    with pytest.raises(RuntimeError, match="not fitted"):
        EigenPro2(k).predict(X)


def test_nystrom_factor_through_the_gram_matrix_is_algorithm_2_with_the_svd():
    """seed 004, Algorithm 2 written out with the SVD of the tall ``B``, against the factor, which takes the
    thin SVD through ``B^T B``: the same approximation ``U diag(L) U^T`` and orthonormal kept columns."""
    from joker_ext.comparisons.solvers.askotch import nystrom_approximation

    X = torch.randn(200, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    K = GaussianKernel(2.0)(X, X)
    U, L = nystrom_approximation(K, 60, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)  # the same test matrix
    Omega, _ = torch.linalg.qr(torch.randn(200, 60, generator=g, dtype=torch.float64))
    nu = torch.finfo(torch.float64).eps * float(K.trace())
    Ynu = K @ Omega + nu * Omega
    C = torch.linalg.cholesky(Omega.T @ Ynu).T
    B = torch.linalg.solve_triangular(C, Ynu, upper=True, left=False)
    Ur, S, _ = torch.linalg.svd(B, full_matrices=False)
    Lr = (S ** 2 - nu).clamp_min(0.0)
    ref = Ur @ torch.diag(Lr) @ Ur.T
    assert torch.allclose(U @ torch.diag(L) @ U.T, ref, rtol=0, atol=1e-10 * float(ref.abs().max()))
    assert torch.allclose(L, Lr, rtol=0, atol=1e-10 * float(Lr[0]))
    kept = L > 0
    assert torch.allclose(U[:, kept].T @ U[:, kept], torch.eye(int(kept.sum()), dtype=torch.float64), atol=1e-8)


def test_askotch_step_constant_is_the_preconditioned_top_eigenvalue():
    """get_L (seed 004, Algorithm 3), computed on the device without read-backs, against the top eigenvalue of
    ``(P + rho I)^{-1/2} H (P + rho I)^{-1/2}`` formed densely; ``rho`` as a float or a 0-d tensor alike."""
    from joker_ext.comparisons.solvers.askotch import _get_L, nystrom_approximation

    g = torch.Generator().manual_seed(0)
    X = torch.randn(120, 4, generator=g, dtype=torch.float64)
    K = GaussianKernel(1.5)(X, X)
    H = K + 0.01 * torch.eye(120, dtype=torch.float64)
    U, L = nystrom_approximation(K, 30, torch.Generator().manual_seed(1))
    rho = 0.01 + float(L[-1])
    P = U @ torch.diag(L) @ U.T + rho * torch.eye(120, dtype=torch.float64)
    lam, V = torch.linalg.eigh(P)
    P_half_inv = V @ torch.diag(lam.rsqrt()) @ V.T
    top = float(torch.linalg.eigvalsh(P_half_inv @ H @ P_half_inv)[-1])
    for r in (rho, torch.tensor(rho, dtype=torch.float64)):
        est = _get_L(H, U, L, r, torch.Generator().manual_seed(2), iters=200)
        assert torch.is_tensor(est) and est.dim() == 0
        assert float(est) == pytest.approx(top, rel=1e-6)
