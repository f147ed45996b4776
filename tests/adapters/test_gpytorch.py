"""GPyTorch adapter: kernel translation and JokerGP, checked against GPyTorch itself, scikit-learn, cvxpy
and closed forms."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

gpytorch = pytest.importorskip("gpytorch")

from gpytorch import kernels as gk  # noqa: E402

import joker_ext  # noqa: E402
from joker_ext import JokerClassifier, JokerRegressor  # noqa: E402
from joker_ext.adapters import translate_kernel as dispatch_translate  # noqa: E402
from joker_ext.adapters.gpytorch import (  # noqa: E402
    ActiveDimsKernel,
    JokerGP,
    RationalQuadraticKernel,
    random_feature_map,
    rq_quadrature,
    translate_kernel,
)
from joker_ext.kernels import CallableKernel, StationaryKernel, SumKernel  # noqa: E402

D = 3


def _data(n=200, d=D, seed=0, m=60):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.sin(X @ torch.linspace(0.5, 1.5, d, dtype=torch.float64)) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    Xt = torch.randn(m, d, generator=g, dtype=torch.float64)
    return X, y + 2.0, Xt


def _scale_rbf():
    k = gk.ScaleKernel(gk.RBFKernel()).double()
    k.outputscale = 1.7
    k.base_kernel.lengthscale = 0.8
    return k


def _scale_matern_ard():
    k = gk.ScaleKernel(gk.MaternKernel(nu=2.5, ard_num_dims=D)).double()
    k.outputscale = 0.6
    k.base_kernel.lengthscale = torch.tensor([0.7, 1.3, 2.1])
    return k


def _sum_kernel():
    a = gk.ScaleKernel(gk.RBFKernel(ard_num_dims=D)).double()
    a.outputscale = 1.2
    a.base_kernel.lengthscale = torch.tensor([0.9, 1.6, 1.1])
    b = gk.ScaleKernel(gk.MaternKernel(nu=1.5)).double()
    b.outputscale = 0.4
    b.base_kernel.lengthscale = 2.5
    return a + b


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self, X, y, likelihood, covar, mean):
        super().__init__(X, y, likelihood)
        self.covar_module = covar
        self.mean_module = mean

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _gpytorch_posterior_mean(X, y, Xt, covar, likelihood, mean):
    """GPyTorch's exact GP posterior mean (eval mode, Cholesky: fast computations off)."""
    model = _ExactGP(X, y, likelihood, covar, mean).double()
    model.eval()
    likelihood.eval()
    with torch.no_grad(), gpytorch.settings.fast_computations(covar_root_decomposition=False, log_prob=False,
                                                              solves=False):
        return model(Xt).mean.clone()


def _gaussian_lik(noise=0.05):
    lik = gpytorch.likelihoods.GaussianLikelihood().double()
    lik.noise = noise
    return lik


def _const_mean(c=1.5):
    m = gpytorch.means.ConstantMean().double()
    m.constant = c
    return m


def _rel(a, b):
    return float((a - b).norm() / b.norm())


# ----------------------------------------------------------------------------------------------- translation


TRANSLATABLE = {
    "rbf": lambda: gk.RBFKernel(),
    "rbf_ard": lambda: gk.RBFKernel(ard_num_dims=D),
    "matern05": lambda: gk.MaternKernel(nu=0.5, ard_num_dims=D),
    "matern15": lambda: gk.MaternKernel(nu=1.5),
    "matern25_ard": lambda: gk.MaternKernel(nu=2.5, ard_num_dims=D),
    "scale_rbf": _scale_rbf,
    "scale_matern_ard": _scale_matern_ard,
    "sum": _sum_kernel,
    "scale_of_sum": lambda: gk.ScaleKernel(gk.RBFKernel() + gk.MaternKernel(nu=0.5)),
    "rq": lambda: gk.ScaleKernel(gk.RQKernel(ard_num_dims=D)),
    "active_dims_sum": lambda: gk.ScaleKernel(gk.RBFKernel(active_dims=[0])) + gk.MaternKernel(nu=2.5, active_dims=[2, 1]),
    "scale_active_ard": lambda: gk.ScaleKernel(gk.RBFKernel(ard_num_dims=2, active_dims=[1, 2])),
}


def _randomise(k, seed=0):
    """Non-default hyperparameters for every raw parameter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in k.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return k


@pytest.mark.parametrize("name", sorted(TRANSLATABLE))
def test_translation_matches_gpytorch_matrix(name):
    k = _randomise(TRANSLATABLE[name]().double(), seed=len(name))
    X1 = torch.randn(40, D, dtype=torch.float64)
    X2 = torch.randn(30, D, dtype=torch.float64)
    jk = translate_kernel(k)
    assert not isinstance(jk, CallableKernel)
    assert dispatch_translate(k).__class__ is jk.__class__  # adapters.translate_kernel routes here
    with torch.no_grad():
        ref = k(X1, X2).to_dense()
    torch.testing.assert_close(jk(X1, X2), ref, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        ref_diag = k(X1, X1, diag=True)
    torch.testing.assert_close(jk.diag(X1), ref_diag, rtol=1e-12, atol=1e-12)


def test_translation_reads_constrained_values():
    k = gk.ScaleKernel(gk.MaternKernel(nu=0.5, ard_num_dims=D)).double()
    k.outputscale = 2.5
    k.base_kernel.lengthscale = torch.tensor([0.5, 1.0, 3.0])
    jk = translate_kernel(k)
    assert isinstance(jk, StationaryKernel) and jk.family == "laplacian"
    assert jk.outputscale == pytest.approx(2.5, rel=1e-12)
    torch.testing.assert_close(jk.sigma, torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64))
    s = translate_kernel(_sum_kernel())
    assert isinstance(s, SumKernel) and len(s.parts) == 2
    a = translate_kernel(gk.RBFKernel(active_dims=[2]))
    assert isinstance(a, ActiveDimsKernel) and a.dims.tolist() == [2]


NON_TRANSLATABLE = {
    "linear": lambda: gk.LinearKernel(),
    "polynomial": lambda: gk.PolynomialKernel(power=2),
    "product": lambda: gk.RBFKernel() * gk.PeriodicKernel(),
    "scale_linear": lambda: gk.ScaleKernel(gk.LinearKernel()),
    "sum_with_linear": lambda: gk.ScaleKernel(gk.RBFKernel()) + gk.LinearKernel(active_dims=[0]),
}


@pytest.mark.parametrize("name", sorted(NON_TRANSLATABLE))
def test_other_kernels_run_through_their_own_evaluation(name):
    k = _randomise(NON_TRANSLATABLE[name]().double(), seed=3)
    jk = translate_kernel(k)
    parts = jk.parts if isinstance(jk, SumKernel) else [jk]
    assert any(isinstance(p, CallableKernel) for p in parts)
    X1 = torch.randn(25, D, dtype=torch.float64)
    X2 = torch.randn(15, D, dtype=torch.float64)
    with torch.no_grad():
        ref = k(X1, X2).to_dense()
    torch.testing.assert_close(jk(X1, X2), ref, rtol=1e-12, atol=1e-12)
    # float32 inputs evaluate a float32 copy of the module, not a mixed-dtype product
    assert jk(X1.float(), X2.float()).dtype == torch.float32


def test_translation_is_a_snapshot():
    k = _scale_rbf()
    jk = translate_kernel(k)
    lin = gk.LinearKernel().double()
    jl = translate_kernel(lin)
    X = torch.randn(5, D, dtype=torch.float64)
    before, before_lin = jk(X, X).clone(), jl(X, X).clone()
    k.outputscale = 9.0
    lin.variance = 9.0
    torch.testing.assert_close(jk(X, X), before)
    torch.testing.assert_close(jl(X, X), before_lin)


# ------------------------------------------------------------------------------------- rational quadratic


@pytest.mark.parametrize("alpha", [0.1, math.log(2.0), 2.0, 30.0])
def test_rq_quadrature_error_is_as_documented(alpha):
    tol = 1e-3
    scales, weights, err = rq_quadrature(alpha, tol=tol)
    assert err <= tol
    # independent check on random distances (not the construction grid), against the closed form
    r = np.concatenate([np.random.default_rng(0).uniform(0, 5, 3000), np.exp(np.random.default_rng(1).uniform(0, 12, 3000))])
    approx = (weights[None, :] * np.exp(-(r[:, None] ** 2) / (2 * scales[None, :] ** 2))).sum(1)
    exact = (1 + r**2 / (2 * alpha)) ** (-alpha)
    assert np.abs(approx - exact).max() <= 1.05 * tol


def test_rq_quadrature_kernel_and_exact_features():
    k = gk.ScaleKernel(gk.RQKernel(ard_num_dims=D)).double()
    k.outputscale = 1.4
    k.base_kernel.lengthscale = torch.tensor([0.6, 1.0, 1.8])
    k.base_kernel.alpha = 0.7
    X = torch.randn(120, D, dtype=torch.float64)
    with torch.no_grad():
        ref = k(X, X).to_dense()
    quad = translate_kernel(k, rq="quadrature", rq_tol=1e-4)
    assert isinstance(quad, SumKernel) and quad.supports_random_features
    assert float((quad(X, X) - ref).abs().max()) <= 1.4 * 1e-4
    exact = translate_kernel(k)
    assert isinstance(exact, RationalQuadraticKernel)
    # Gamma-mixture random features are unbiased for the RQ kernel: Gram error ~ 1/sqrt(M)
    errs = {}
    for M in (256, 8192):
        P = random_feature_map(exact, M, seed=2)(X)
        errs[M] = float((P @ P.T - ref).norm() / ref.norm())
        assert errs[M] <= 4.0 / math.sqrt(M)
    assert errs[8192] < errs[256]


# ------------------------------------------------------------------------------------------ JokerGP, exact


@pytest.mark.parametrize("make_kernel", [_scale_rbf, _scale_matern_ard, _sum_kernel],
                         ids=["scale_rbf", "scale_matern52_ard", "sum"])
def test_jokergp_equals_gpytorch_exact_posterior_mean(make_kernel):
    X, y, Xt = _data()
    covar, lik, mean = make_kernel(), _gaussian_lik(0.05), _const_mean(1.5)
    ref = _gpytorch_posterior_mean(X, y, Xt, covar, lik, mean)
    # the reference is what the algebra says (guards against the GPyTorch settings not being applied)
    with torch.no_grad():
        K = covar(X, X).to_dense() + 0.05 * torch.eye(len(X), dtype=torch.float64)
        alg = 1.5 + covar(Xt, X).to_dense() @ torch.cholesky_solve((y - 1.5)[:, None], torch.linalg.cholesky(K))[:, 0]
    torch.testing.assert_close(ref, alg, rtol=1e-9, atol=1e-9)
    jgp = JokerGP(covar, lik, mean).fit(X, y)
    assert jgp.status_ == "converged" and jgp.block_size_ == len(X)
    pred = jgp.predict(Xt)
    assert isinstance(pred, torch.Tensor) and pred.shape == (len(Xt),)
    assert _rel(pred, ref) <= 1e-6
    # C mapping: with the outputscale inside the translated kernel, the dual is (K_o + s2 I)^{-1}(y - m)
    with torch.no_grad():
        alpha_ref = torch.cholesky_solve((y - 1.5)[:, None], torch.linalg.cholesky(K))[:, 0]
    assert _rel(jgp.alpha_, alpha_ref) <= 1e-6


def test_jokergp_callable_kernel_matches_exact_reference():
    X, y, Xt = _data(n=150)
    covar = gk.ScaleKernel(gk.RBFKernel() * gk.PeriodicKernel()).double()
    _randomise(covar, seed=5)
    lin = gk.LinearKernel(active_dims=[1]).double()
    lin.variance = 0.3
    covar = covar + lin
    lik, mean = _gaussian_lik(0.1), _const_mean(-0.7)
    ref = _gpytorch_posterior_mean(X, y, Xt, covar, lik, mean)
    jgp = JokerGP(covar, lik, mean).fit(X, y)
    assert _rel(jgp.predict(Xt), ref) <= 1e-6


def test_callable_kernel_is_evaluated_in_blocks():
    X, y, Xt = _data(n=160)
    shapes = []

    class Recording(gk.Kernel):
        def forward(self, x1, x2, **params):
            shapes.append((x1.shape[-2], x2.shape[-2]))
            return torch.exp(-torch.cdist(x1, x2) / 1.5)

    kern = Recording()
    lik = _gaussian_lik(1.0)
    ref = _gpytorch_posterior_mean(X, y, Xt, kern, lik, gpytorch.means.ZeroMean())
    shapes.clear()
    jgp = JokerGP(kern, lik, block_size=80, max_iter=4000, tol=1e-12).fit(X, y)
    assert jgp.status_ == "converged"
    # evaluated in row chunks: K(X_chunk, X) (the Newton engine forms K when it fits the memory budget),
    # K(X_B, X_B) / K(X, X_B) blocks for DBCD-TR, and K(X_test, X) for predictions
    assert shapes and max(a * b for a, b in shapes) <= 160 * 160
    assert _rel(jgp.predict(Xt), ref) <= 1e-5


def test_huber_with_large_delta_is_the_posterior_mean_and_small_delta_matches_cvxpy():
    cp = pytest.importorskip("cvxpy")
    X, y, Xt = _data(n=80)
    y = y.clone()
    y[::9] += 6.0  # outliers
    covar, lik, mean = _scale_rbf(), _gaussian_lik(0.1), _const_mean(2.0)
    ref = _gpytorch_posterior_mean(X, y, Xt, covar, lik, mean)
    assert _rel(JokerGP(covar, lik, mean, loss="huber", delta=1e6).fit(X, y).predict(Xt), ref) <= 1e-6
    # robust fit: 1/2 ||f||^2 + (1/noise) sum huber_delta(y - m - f); cvxpy's huber is twice ours
    delta = 0.3
    jgp = JokerGP(covar, lik, mean, loss="huber", delta=delta).fit(X, y)
    with torch.no_grad():
        K = covar(X, X).to_dense() + 1e-10 * torch.eye(len(X), dtype=torch.float64)
        Kt = covar(Xt, X).to_dense()
    L = torch.linalg.cholesky(K).numpy()
    w = cp.Variable(len(X))
    r = (y - 2.0).numpy() - L @ w
    cp.Problem(cp.Minimize(0.5 * cp.sum_squares(w) + (1 / 0.1) * 0.5 * cp.sum(cp.huber(r, delta)))).solve(
        solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    a = torch.linalg.solve_triangular(torch.linalg.cholesky(K).T, torch.as_tensor(w.value)[:, None], upper=True)[:, 0]
    cvx_pred = 2.0 + Kt @ a
    assert _rel(jgp.predict(Xt), cvx_pred) <= 1e-4
    assert _rel(jgp.predict(Xt), ref) > 1e-2  # the robust fit differs from the Gaussian one


def test_fixed_noise_likelihood_and_linear_mean():
    X, y, Xt = _data(n=120)
    noise = torch.linspace(0.02, 0.5, len(X), dtype=torch.float64)
    lik = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=noise).double()
    mean = gpytorch.means.LinearMean(D).double()
    _randomise(mean, seed=1)
    covar = _scale_matern_ard()
    ref = _gpytorch_posterior_mean(X, y, Xt, covar, lik, mean)
    assert _rel(JokerGP(covar, lik, mean).fit(X, y).predict(Xt), ref) <= 1e-6


# ------------------------------------------------------------------------------------ JokerGP, features


def test_random_features_converge_to_the_exact_posterior_mean():
    X, y, Xt = _data(n=300)
    covar, lik, mean = _scale_matern_ard(), _gaussian_lik(0.05), _const_mean(1.5)
    ref = _gpytorch_posterior_mean(X, y, Xt, covar, lik, mean)
    err = {}
    for M in (256, 4096):
        e = []
        for seed in range(3):
            jgp = JokerGP(covar, lik, mean, n_features=M, seed=seed).fit(X, y)
            assert jgp.status_ == "converged"
            e.append(_rel(jgp.predict(Xt), ref))
        err[M] = float(np.mean(e))
        assert err[M] <= 4.0 / math.sqrt(M), (M, err[M])
    assert err[4096] < err[256]


def test_random_features_of_sums_active_dims_and_rq_run():
    X, y, Xt = _data(n=200)
    covar = gk.ScaleKernel(gk.RQKernel(active_dims=[0, 1])) + gk.MaternKernel(nu=0.5, active_dims=[2])
    covar = _randomise(covar.double(), seed=4)
    lik = _gaussian_lik(0.05)
    ref = _gpytorch_posterior_mean(X, y, Xt, covar, lik, gpytorch.means.ZeroMean())
    e = [_rel(JokerGP(covar, lik, n_features=M, seed=1).fit(X, y).predict(Xt), ref) for M in (128, 8192)]
    assert e[1] <= 4.0 / math.sqrt(8192) * 2 and e[1] < e[0]


def test_predictive_variance_is_the_feature_kernel_gp_posterior():
    X, y, Xt = _data(n=150)
    covar, lik, mean = _scale_rbf(), _gaussian_lik(0.05), _const_mean(1.5)
    jgp = JokerGP(covar, lik, mean, n_features=64, predictive_variance=True).fit(X, y)
    mu, var = jgp.predict(Xt, return_var=True)
    # dense GP with the feature kernel Phi Phi^T (the same features): independent algebra
    P, Pt = jgp.feature_map_(X), jgp.feature_map_(Xt)
    K = P @ P.T + 0.05 * torch.eye(len(X), dtype=torch.float64)
    Lc = torch.linalg.cholesky(K)
    A = torch.cholesky_solve(P @ Pt.T, Lc)
    var_ref = (Pt * Pt).sum(1) - ((Pt @ P.T) * A.T).sum(1)
    mu_ref = 1.5 + Pt @ P.T @ torch.cholesky_solve((y - 1.5)[:, None], Lc)[:, 0]
    torch.testing.assert_close(var, var_ref, rtol=1e-7, atol=1e-10)
    assert _rel(mu, mu_ref) <= 1e-6
    assert bool((var > 0).all())


# ------------------------------------------------------------------------------------ classification


def _klr_reference(K, Kt, y_pm, C=1.0):
    """Kernel logistic regression with scikit-learn: features L (K = L L^T), f = L w, a = L^-T w."""
    from sklearn.linear_model import LogisticRegression

    L = torch.linalg.cholesky(K + 1e-10 * torch.eye(len(K), dtype=K.dtype))
    lr = LogisticRegression(C=C, fit_intercept=False, tol=1e-12, max_iter=100000)
    lr.fit(L.numpy(), y_pm.numpy())
    w = torch.as_tensor(lr.coef_[0])
    a = torch.linalg.solve_triangular(L.T, w[:, None], upper=True)[:, 0]
    return Kt @ a


def test_bernoulli_likelihood_is_kernel_logistic_regression():
    X, _, Xt = _data(n=150)
    labels01 = (X[:, 0] + 0.5 * X[:, 1] + 0.3 * torch.randn(len(X), dtype=torch.float64, generator=torch.Generator().manual_seed(1)) > 0).double()
    covar = _scale_rbf()
    lik = gpytorch.likelihoods.BernoulliLikelihood()
    with torch.no_grad():
        K, Kt = covar(X, X).to_dense(), covar(Xt, X).to_dense()
    ref = _klr_reference(K, Kt, 2 * labels01 - 1)
    jgp = JokerGP(covar, lik).fit(X, labels01)
    f = jgp.predict(Xt)
    assert _rel(f, ref) <= 1e-5
    f_pm = JokerGP(covar, lik).fit(X, 2 * labels01 - 1).predict(Xt)
    torch.testing.assert_close(f_pm, f, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(jgp.predict_proba(Xt), torch.sigmoid(ref), rtol=1e-5, atol=1e-6)
    # the same problem through the scikit-learn face with the GPyTorch kernel
    clf = JokerClassifier(loss="logistic", C=1.0, kernel=covar).fit(X.numpy(), labels01.numpy())
    assert _rel(torch.as_tensor(clf.decision_function(Xt.numpy())), ref) <= 1e-5


def test_jokerregressor_accepts_gpytorch_kernels():
    X, y, Xt = _data(n=150)
    covar = gk.ScaleKernel(gk.MaternKernel(nu=1.5, ard_num_dims=D))  # float32 module, as GPyTorch's default
    covar.outputscale = 0.9
    covar.base_kernel.lengthscale = torch.tensor([0.8, 1.1, 1.9])
    lik = _gaussian_lik(0.05)
    reg = JokerRegressor(C=1 / 0.05, kernel=covar, block_size=150).fit(X.numpy(), y.numpy())
    rf = JokerRegressor(C=1 / 0.05, kernel=covar, n_features=4096, block_size=150).fit(X.numpy(), y.numpy())
    ref = _gpytorch_posterior_mean(X, y, Xt, copy.deepcopy(covar).double(), lik, gpytorch.means.ZeroMean())
    # (the float32 module's hyperparameters are read as GPyTorch evaluates them, in float32; the reference
    # evaluates the same raw values in float64: they differ by ~1e-8 here)
    assert _rel(torch.as_tensor(reg.predict(Xt.numpy())), ref) <= 1e-6
    assert _rel(torch.as_tensor(rf.predict(Xt.numpy())), ref) <= 4.0 / math.sqrt(4096)


class _UserKernel(gk.Kernel):
    """A user's own GPyTorch kernel, defined outside gpytorch."""

    def forward(self, x1, x2, **params):
        return (1.0 + x1 @ x2.transpose(-1, -2) / 4.0) ** 2 + torch.exp(-torch.cdist(x1, x2))


def test_user_gpytorch_kernel_in_the_sklearn_faces():
    X, y, Xt = _data(n=120)
    kern = _UserKernel()
    lik = _gaussian_lik(0.3)
    ref = _gpytorch_posterior_mean(X, y, Xt, kern, lik, gpytorch.means.ZeroMean())
    reg = JokerRegressor(C=1 / 0.3, kernel=kern, block_size=120).fit(X.numpy(), y.numpy())
    assert isinstance(reg.kernel_, CallableKernel)
    assert _rel(torch.as_tensor(reg.predict(Xt.numpy())), ref) <= 1e-6


# ------------------------------------------------------------------------------- data inputs, module API


class _Stream(torch.utils.data.IterableDataset):
    def __init__(self, X, y):
        self.X, self.y = X, y

    def __iter__(self):
        return iter(zip(self.X, self.y))


def test_dataset_and_dataloader_inputs(pair_dataset):
    X, y, Xt = _data(n=120)
    covar, lik, mean = _scale_rbf(), _gaussian_lik(0.05), _const_mean(1.5)
    ref = _gpytorch_posterior_mean(X, y, Xt, covar, lik, mean)
    tds = torch.utils.data.TensorDataset(X, y)
    for src in (tds, torch.utils.data.DataLoader(tds, batch_size=16, shuffle=True), pair_dataset(X, y),
                torch.utils.data.DataLoader(pair_dataset(X, y), batch_size=7)):
        assert _rel(JokerGP(covar, lik, mean).fit(src).predict(Xt), ref) <= 1e-6
    # random features read a map-style Dataset block by block
    a = JokerGP(covar, lik, mean, n_features=128).fit(pair_dataset(X, y)).predict(Xt)
    b = JokerGP(covar, lik, mean, n_features=128).fit(X, y).predict(Xt)
    torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8)
    with pytest.raises(TypeError, match="train_x.*IterableDataset"):
        JokerGP(covar, lik).fit(_Stream(X, y))
    with pytest.raises(TypeError, match="train_x.*IterableDataset"):
        JokerGP(covar, lik).fit(torch.utils.data.DataLoader(_Stream(X, y), batch_size=8))


def test_bad_inputs_are_refused_clearly():
    X, y, Xt = _data(n=50)
    covar, lik = _scale_rbf(), _gaussian_lik()
    with pytest.raises(TypeError, match="likelihood"):
        JokerGP(covar, gpytorch.likelihoods.StudentTLikelihood()).fit(X, y)
    with pytest.raises(ValueError, match="train_y must be 1-D"):
        JokerGP(covar, lik).fit(X, y[:, None])
    with pytest.raises(ValueError, match="train_y has 49 values"):
        JokerGP(covar, lik).fit(X, y[:-1])
    with pytest.raises(ValueError, match=r"train_x must have shape"):
        JokerGP(covar, lik).fit(X[None], y)
    with pytest.raises(ValueError, match="NaN"):
        JokerGP(covar, lik).fit(X, torch.full_like(y, float("nan")))
    with pytest.raises(RuntimeError, match="not fitted"):
        JokerGP(covar, lik).predict(Xt)
    jgp = JokerGP(covar, lik).fit(X, y)
    with pytest.raises(ValueError, match="test_x has 2 features"):
        jgp.predict(Xt[:, :2])
    with pytest.raises(ValueError, match="predictive variance"):
        jgp.predict(Xt, return_var=True)
    with pytest.raises(ValueError, match="predictive_variance=True needs random features"):
        JokerGP(covar, lik, predictive_variance=True).fit(X, y)
    bern = gpytorch.likelihoods.BernoulliLikelihood()
    with pytest.raises(ValueError, match="labels in"):
        JokerGP(covar, bern).fit(X, y)
    with pytest.raises(ValueError, match="regression loss"):
        JokerGP(covar, bern, loss="huber").fit(X, (y > 2).double())
    with pytest.raises(ValueError, match="classification loss"):
        JokerGP(covar, lik, loss="hinge").fit(X, y)
    with pytest.raises(ValueError, match="non-zero mean_module"):
        JokerGP(covar, bern, _const_mean(0.3)).fit(X, (y > 2).double())
    with pytest.raises(ValueError, match="no spectral description"):
        JokerGP(gk.LinearKernel(), lik, n_features=64).fit(X, y)
    with pytest.raises(ValueError, match="batched GPyTorch kernels"):
        translate_kernel(gk.RBFKernel(batch_shape=torch.Size([2])))
    with pytest.raises(TypeError, match="gpytorch.kernels.Kernel"):
        translate_kernel("rbf")
    with pytest.raises(ValueError, match="active_dims"):
        translate_kernel(gk.RBFKernel(active_dims=[5]))(X, X)


def test_nn_module_behaviour_state_dict_and_dtype():
    assert joker_ext.JokerGP is JokerGP
    X, y, Xt = _data(n=100)
    covar, lik, mean = _scale_matern_ard(), _gaussian_lik(0.05), _const_mean(1.5)
    for n_features in (None, 256):
        jgp = JokerGP(covar, lik, mean, n_features=n_features).fit(X, y)
        pred = jgp.predict(Xt)
        assert "alpha_" in dict(jgp.named_buffers())
        sd = jgp.state_dict()
        fresh = JokerGP(gk.ScaleKernel(gk.MaternKernel(nu=2.5, ard_num_dims=D)).double(),
                        _gaussian_lik(1.0), _const_mean(0.0), n_features=n_features)
        fresh.load_state_dict(sd)
        torch.testing.assert_close(fresh.predict(Xt), pred, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(fresh(Xt), pred, rtol=1e-12, atol=1e-12)  # forward is predict
        low = copy.deepcopy(jgp).float()  # (a copy: .float() also converts the shared GPyTorch modules)
        p32 = low.predict(Xt)
        assert p32.dtype == torch.float32
        torch.testing.assert_close(p32.double(), pred, rtol=1e-4, atol=1e-4)
        jgp.to("cpu")


@pytest.mark.parametrize("n_features", [None, 128], ids=["exact", "rff"])
@pytest.mark.parametrize("mean", ["zero", "constant", "linear"])
def test_fitted_jokergp_round_trips_through_pickle_and_state_dict(n_features, mean):
    """issue #15: a fitted JokerGP (GPyTorch ScaleKernel, any mean module) predicts identically after pickle
    (its mean snapshot was a local closure) and after torch.save / torch.load(weights_only=True) of its state_dict."""
    import io
    import pickle

    X, y, Xt = _data(n=90)

    def modules():
        means = {"zero": None, "constant": _const_mean(0.4), "linear": gpytorch.means.LinearMean(D).double()}
        m = means[mean]
        if mean == "linear":
            with torch.no_grad():
                m.weights.copy_(torch.tensor([[0.3], [-0.2], [0.1]], dtype=torch.float64))
        return _scale_matern_ard(), _gaussian_lik(0.05), m

    jgp = JokerGP(*modules(), n_features=n_features, max_iter=40).fit(X, y)
    ref = jgp.predict(Xt)
    back = pickle.loads(pickle.dumps(jgp))
    assert torch.equal(back.predict(Xt), ref)
    buf = io.BytesIO()
    torch.save(jgp.state_dict(), buf)
    buf.seek(0)
    fresh = JokerGP(*modules(), n_features=n_features, max_iter=40)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(fresh.predict(Xt), ref)


@pytest.mark.parametrize("n_features", [None, 256], ids=["exact", "rff"])
def test_jokergp_with_rq_and_active_dims_round_trips_through_pickle_and_state_dict(n_features):
    """The RQ and active-dims kernels (core kernels since issue #15, with their own random features) in a fitted
    JokerGP: identical predictions after pickle and after a state_dict round trip."""
    import io
    import pickle

    X, y, Xt = _data(n=90)

    def covar():
        k = gk.AdditiveKernel(gk.ScaleKernel(gk.RQKernel(active_dims=[0, 2])), gk.MaternKernel(nu=2.5, active_dims=[1]))
        return k.double()

    jgp = JokerGP(covar(), _gaussian_lik(0.05), n_features=n_features, max_iter=40).fit(X, y)
    parts = jgp.kernel_.parts
    assert [type(p).__name__ for p in parts] == ["ActiveDimsKernel", "ActiveDimsKernel"]
    assert type(parts[0].base).__name__ == "RationalQuadraticKernel"
    ref = jgp.predict(Xt)
    assert torch.equal(pickle.loads(pickle.dumps(jgp)).predict(Xt), ref)
    buf = io.BytesIO()
    torch.save(jgp.state_dict(), buf)
    buf.seek(0)
    fresh = JokerGP(covar(), _gaussian_lik(0.05), n_features=n_features, max_iter=40)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(fresh.predict(Xt), ref)
