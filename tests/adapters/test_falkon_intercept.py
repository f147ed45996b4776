"""JokerFalkon / JokerLogisticFalkon with ``fit_intercept=True`` (the core intercept search of joker_ext.intercept, or
the engine's own intercept) against independent references: kernel ridge regression with an unpenalised intercept
in closed form (the bordered system with Falkon's lambda, ``C = 1 / (n penalty)``), LIBSVM's SVC / SVR and
scikit-learn's LogisticRegression (whose lbfgs intercept is unpenalised) on the same kernel. Falkon itself has no
intercept, so it is not the reference here; Falkon need not be installed."""
import pickle

import numpy as np
import pytest
import torch

from joker_ext import GaussianKernel
from joker_ext.adapters.falkon import JokerFalkon, JokerLogisticFalkon

F64 = torch.float64
SIGMA = 1.0


def _data(n=60, T=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, generator=g, dtype=F64)
    cols = [torch.sin(2 * X[:, 0]) + 3.0, X[:, 1] * X[:, 2] - 2.0]
    Y = torch.stack(cols[:T], 1) + 0.1 * torch.randn(n, T, generator=g, dtype=F64)
    Xq = torch.randn(25, 3, generator=g, dtype=F64)
    return X, Y, Xq


def _bordered_krr(X, Y, Xq, penalty):
    """Falkon's ``(1/n) sum (y - f - b)^2 + penalty ||f||^2`` with ``b`` unpenalised: ``[[K + n penalty I, 1],
    [1^T, 0]] [alpha; b] = [y; 0]`` (CONVENTIONS.md section 2: C = 1 / (n penalty)); predictions at Xq and b."""
    n = X.shape[0]
    k = GaussianKernel(SIGMA)
    A = torch.zeros(n + 1, n + 1, dtype=F64)
    A[:n, :n] = k(X, X) + n * penalty * torch.eye(n, dtype=F64)
    A[:n, n] = 1.0
    A[n, :n] = 1.0
    sol = torch.linalg.solve(A, torch.cat([Y, torch.zeros(1, Y.shape[1], dtype=F64)]))
    return k(Xq, X) @ sol[:n] + sol[n], sol[n]


@pytest.mark.parametrize("features, solver, T, mode", [
    ("exact", "auto", 1, "engine"),        # active_set fits b itself
    ("exact", "dbcd_tr", 2, "search"),     # the core search around DBCD-TR
    ("nystrom", "auto", 1, "engine"),      # M = n centres: Nystrom is the exact kernel; Newton fits b in its steps
    ("nystrom", "auto", 2, "engine"),
])
def test_squared_with_intercept_is_krr_with_an_unpenalised_intercept(features, solver, T, mode):
    X, Y, Xq = _data(T=T)
    penalty = 1e-2
    kw = {"center_selection": X} if features == "nystrom" else {}
    m = JokerFalkon(GaussianKernel(SIGMA), penalty, X.shape[0], features=features, solver=solver, fit_intercept=True,
                    tol=1e-13, seed=0, **kw).fit(X, Y)
    assert m.fit_plan_.intercept == mode and m.status_ == "converged"
    assert m.n_intercept_rounds_ >= 1
    f_ref, b_ref = _bordered_krr(X, Y, Xq, penalty)
    assert m.intercept_.shape == (T,)
    torch.testing.assert_close(m.intercept_, b_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(m.predict(Xq), f_ref, rtol=1e-9, atol=1e-9)
    back = pickle.loads(pickle.dumps(m))  # the intercept travels with the pickled model
    assert torch.equal(back.intercept_, m.intercept_) and torch.equal(back.predict(Xq), m.predict(Xq))


def test_default_keeps_falkons_model_without_intercept():
    X, Y, Xq = _data()
    m = JokerFalkon(GaussianKernel(SIGMA), 1e-2, 20, features="nystrom", seed=0).fit(X, Y)
    assert m.fit_intercept is False and m.intercept_ is None and m.fit_plan_.intercept == "none"
    assert m.n_intercept_rounds_ == 0


def _precomputed(X):
    return GaussianKernel(SIGMA)(X, X).numpy()


def test_hinge_with_intercept_is_libsvm_svc():
    from sklearn.svm import SVC

    X, _, _ = _data(n=80, seed=1)
    y = torch.where(X[:, 0] + 0.5 * torch.sin(3 * X[:, 1]) > 0, 1.0, -1.0).to(F64)
    n, penalty = X.shape[0], 1e-2
    C = 1.0 / (n * penalty)  # LIBSVM's C is the loss weight of every row
    K = _precomputed(X)
    svc = SVC(C=C, kernel="precomputed", tol=1e-10).fit(K, y.numpy())
    m = JokerFalkon(GaussianKernel(SIGMA), penalty, n, loss="hinge", features="exact", solver="dbcd_tr",
                    fit_intercept=True, tol=1e-13, maxiter=2000, seed=0).fit(X, y)
    assert m.fit_plan_.intercept == "search" and m.status_ == "converged"
    f_ref = svc.decision_function(K)
    np.testing.assert_allclose(m.predict(X)[:, 0].numpy(), f_ref, atol=1e-5 * np.abs(f_ref).max())


def test_epsilon_insensitive_with_intercept_is_libsvm_svr():
    from sklearn.svm import SVR

    X, Y, Xq = _data(n=80, seed=2)
    n, penalty, eps = X.shape[0], 5e-3, 0.1
    C = 1.0 / (n * penalty)
    svr = SVR(C=C, epsilon=eps, kernel="precomputed", tol=1e-10).fit(_precomputed(X), Y[:, 0].numpy())
    m = JokerFalkon(GaussianKernel(SIGMA), penalty, n, loss="epsilon_insensitive", epsilon=eps, features="exact",
                    solver="dbcd_tr", fit_intercept=True, tol=1e-13, maxiter=2000, seed=0).fit(X, Y)
    assert m.fit_plan_.intercept == "search" and m.status_ == "converged"
    f_ref = svr.predict(GaussianKernel(SIGMA)(Xq, X).numpy())
    np.testing.assert_allclose(m.predict(Xq)[:, 0].numpy(), f_ref, atol=1e-5 * np.abs(f_ref).max())


def test_logistic_falkon_with_intercept_is_logistic_regression_with_an_intercept():
    """The last stage's problem ``1/2 ||f||^2 + C sum log(1 + exp(-y (f + b)))``, C = 1 / (n penalty): scikit-learn's
    LogisticRegression(C, fit_intercept=True) on features L with L L^T = K (its lbfgs leaves the intercept
    unpenalised)."""
    from sklearn.linear_model import LogisticRegression

    X, _, Xq = _data(n=80, seed=3)
    y = torch.where(X[:, 0] - 0.3 * X[:, 1] > 0.8, 1.0, -1.0).to(F64)  # unbalanced: the intercept matters
    n, pens = X.shape[0], [1e-1, 1e-2]
    m = JokerLogisticFalkon(GaussianKernel(SIGMA), pens, [20, 20], "logistic", n, center_selection=X,
                            features="nystrom", fit_intercept=True, tol=1e-13, seed=0).fit(X, y)
    assert m.fit_plan_.intercept == "engine" and m.status_ == "converged"  # b inside the Newton steps
    K = _precomputed(X)
    lam, Q = np.linalg.eigh(K)
    keep = lam > 1e-12 * lam.max()
    L = Q[:, keep] * np.sqrt(lam[keep])
    lr = LogisticRegression(C=1.0 / (n * pens[-1]), fit_intercept=True, tol=1e-12, max_iter=100000).fit(L, y.numpy())
    f_ref = lr.decision_function(L)
    np.testing.assert_allclose(m.predict(X)[:, 0].numpy(), f_ref, atol=1e-5 * np.abs(f_ref).max())
    np.testing.assert_allclose(float(m.intercept_[0]), lr.intercept_[0], atol=1e-5 * max(1.0, abs(lr.intercept_[0])))


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_fit_intercept_must_be_a_bool(value):
    X, Y, _ = _data(n=20)
    with pytest.raises(TypeError, match="fit_intercept must be True or False"):
        JokerFalkon(GaussianKernel(SIGMA), 1e-2, 10, fit_intercept=value).fit(X, Y)
    with pytest.raises(TypeError, match="fit_intercept must be True or False"):
        JokerLogisticFalkon(GaussianKernel(SIGMA), [1e-2], [5], "logistic", 10, fit_intercept=value).fit(
            X, torch.where(Y[:, 0] > 3.0, 1.0, -1.0).to(F64))


def test_warm_start_with_intercept_continues_from_the_fit():
    X, Y, Xq = _data()
    m = JokerFalkon(GaussianKernel(SIGMA), 1e-2, X.shape[0], features="nystrom", center_selection=X,
                    fit_intercept=True, tol=1e-13, seed=0).fit(X, Y)
    first = m.predict(Xq)
    m.fit(X, Y, warm_start=m.beta_)
    assert m.n_intercept_rounds_ == 1  # started at the solution, intercept included
    torch.testing.assert_close(m.predict(Xq), first, rtol=1e-10, atol=1e-10)
