"""JokerGP with ``fit_intercept=True``: a constant offset with a flat prior added to the latent function, fitted by
the engine or by the core intercept search (joker_ext.intercept), against independent references: the bordered
GP / kernel ridge system with the likelihood's noise, and scikit-learn's LogisticRegression with an (unpenalised)
intercept for the Bernoulli likelihood."""
from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch

gpytorch = pytest.importorskip("gpytorch")

from gpytorch import kernels as gk  # noqa: E402

from joker_ext.adapters.gpytorch import JokerGP  # noqa: E402

F64 = torch.float64


def _data(n=80, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, generator=g, dtype=F64)
    y = torch.sin(X[:, 0]) + 0.5 * X[:, 1] + 4.0 + 0.1 * torch.randn(n, generator=g, dtype=F64)
    Xq = torch.randn(20, 3, generator=g, dtype=F64)
    return X, y, Xq


def _covar():
    k = gk.ScaleKernel(gk.RBFKernel()).double()
    k.outputscale = 1.7
    k.base_kernel.lengthscale = 0.8
    return k


def _lik(noise=0.05):
    lik = gpytorch.likelihoods.GaussianLikelihood().double()
    lik.noise = noise
    return lik


def _bordered(K, Kq, r, s2):
    """``[[K + s2 I, 1], [1^T, 0]] [alpha; b] = [r; 0]``: the posterior mean ``Kq alpha + b`` of a GP with noise s2
    and a flat prior on a constant offset b (kernel ridge with an unpenalised intercept)."""
    n = K.shape[0]
    A = torch.zeros(n + 1, n + 1, dtype=F64)
    A[:n, :n] = K + s2 * torch.eye(n, dtype=F64)
    A[:n, n] = 1.0
    A[n, :n] = 1.0
    sol = torch.linalg.solve(A, torch.cat([r, torch.zeros(1, dtype=F64)]))
    return Kq @ sol[:n] + sol[n], sol[n]


@pytest.mark.parametrize("n_features, mode", [(None, "engine"), (64, "engine")], ids=["exact", "rff"])
@pytest.mark.parametrize("with_mean", [False, True], ids=["zero_mean", "constant_mean"])
def test_gaussian_likelihood_with_intercept_is_the_bordered_gp_system(n_features, mode, with_mean):
    X, y, Xq = _data()
    covar, lik = _covar(), _lik(0.05)
    mean = None
    if with_mean:
        mean = gpytorch.means.ConstantMean().double()
        mean.constant = 1.5
    jgp = JokerGP(covar, lik, mean, n_features=n_features, fit_intercept=True, tol=1e-14).fit(X, y)
    assert jgp.fit_plan_.intercept == mode and jgp.status_ == "converged" and jgp.n_intercept_rounds_ >= 1
    with torch.no_grad():
        if n_features is None:
            K, Kq = covar(X, X).to_dense(), covar(Xq, X).to_dense()
        else:  # the random-feature kernel Phi Phi^T the fit used
            P, Pq = jgp.feature_map_(X), jgp.feature_map_(Xq)
            K, Kq = P @ P.T, Pq @ P.T
        m = 1.5 if with_mean else 0.0
        f_ref, b_ref = _bordered(K, Kq, y - m, float(lik.noise))
    torch.testing.assert_close(jgp.intercept_, b_ref.reshape(1), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(jgp.predict(Xq), f_ref + m, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("n_features", [None, 64], ids=["exact", "rff"])
def test_intercept_round_trips_through_pickle_and_state_dict(n_features):
    X, y, Xq = _data()
    jgp = JokerGP(_covar(), _lik(), n_features=n_features, fit_intercept=True).fit(X, y)
    ref = jgp.predict(Xq)
    assert "intercept_" in dict(jgp.named_buffers())
    assert torch.equal(pickle.loads(pickle.dumps(jgp)).predict(Xq), ref)
    buf = io.BytesIO()
    torch.save(jgp.state_dict(), buf)
    buf.seek(0)
    fresh = JokerGP(_covar(), _lik(), n_features=n_features, fit_intercept=True)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(fresh.predict(Xq), ref)


def test_state_dict_without_intercept_still_loads():
    """A state dict saved before JokerGP had an intercept (no 'intercept_' key) loads strictly: no intercept."""
    X, y, Xq = _data()
    jgp = JokerGP(_covar(), _lik()).fit(X, y)
    assert jgp.intercept_.numel() == 0 and jgp.fit_plan_.intercept == "none"
    old = {k: v for k, v in jgp.state_dict().items() if k != "intercept_"}
    fresh = JokerGP(_covar(), _lik())
    fresh.load_state_dict(old)
    assert torch.equal(fresh.predict(Xq), jgp.predict(Xq))


def test_bernoulli_logistic_with_intercept_is_logistic_regression_with_an_intercept():
    """Logistic loss with c_i = 1 and an unpenalised b: scikit-learn's LogisticRegression(C=1, fit_intercept=True)
    on features L with L L^T = K (its lbfgs does not penalise the intercept). Exact kernel: the exact Newton engine,
    which fits it in its primal Newton steps (it took the core search before)."""
    from sklearn.linear_model import LogisticRegression

    X, _, _ = _data(n=70, seed=1)
    y01 = (X[:, 0] - 0.3 * X[:, 1] > 0.7).to(F64)  # unbalanced: the intercept matters
    covar = _covar()
    jgp = JokerGP(covar, gpytorch.likelihoods.BernoulliLikelihood(), fit_intercept=True, tol=1e-14).fit(X, y01)
    assert jgp.fit_plan_.intercept == "engine" and jgp.status_ == "converged"
    with torch.no_grad():
        K = covar(X, X).to_dense().numpy()
    lam, Q = np.linalg.eigh(K)
    keep = lam > 1e-12 * lam.max()
    L = Q[:, keep] * np.sqrt(lam[keep])
    lr = LogisticRegression(C=1.0, fit_intercept=True, tol=1e-12, max_iter=100000).fit(L, y01.numpy())
    f_ref = lr.decision_function(L)
    np.testing.assert_allclose(jgp.predict(X).numpy(), f_ref, atol=1e-5 * np.abs(f_ref).max())
    np.testing.assert_allclose(float(jgp.intercept_[0]), lr.intercept_[0], atol=1e-5 * max(1.0, abs(lr.intercept_[0])))


def test_bad_fit_intercept():
    X, y, _ = _data(n=20)
    with pytest.raises(TypeError, match="fit_intercept must be True or False, got str 'yes'"):
        JokerGP(_covar(), _lik(), fit_intercept="yes").fit(X, y)
    with pytest.raises(ValueError, match="predictive_variance=True .* fit_intercept=True"):
        JokerGP(_covar(), _lik(), n_features=16, predictive_variance=True, fit_intercept=True).fit(X, y)
