"""The documentation builds, its examples run, and its conventions table is true.

* ``test_sphinx_builds``: ``python -m sphinx -W -b html`` and ``-b doctest`` on ``docs/`` (warnings are
  errors; the doctest builder runs every example of the pages). Skipped without Sphinx / numpydoc.
* ``test_convention``: every row of the table in ``docs/conventions.rst`` is read from the file (its
  *relation* and *helper* columns are evaluated as written) and checked numerically against the libraries
  themselves: scikit-learn's kernels and estimators, GPyTorch's kernels and posterior mean, Falkon's
  kernels, Falkon and LogisticFalkon (when installed), and the closed-form minimisers of the objectives
  ASkotch and doubly stochastic gradients state.
* ``test_wrong_relation_is_caught``: the checks fail on a deliberately wrong relation.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Optional

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CONVENTIONS = DOCS / "conventions.rst"
TABLE_NAME = "conventions-table"


# ============================================================================ reading the table
def _literal(cell: str) -> Optional[str]:
    """The first ``literal`` of a cell, or None for '--' / no literal."""
    m = re.search(r"``(.+?)``", cell)
    return m.group(1).strip() if m else None


def parse_list_table(text: str, name: str) -> list:
    """Rows (lists of cell strings) of the ``.. list-table::`` whose ``:name:`` is ``name``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(".. list-table::"):
            j = i + 1
            opts = {}
            while j < len(lines) and lines[j].strip().startswith(":"):
                key, _, val = lines[j].strip()[1:].partition(":")
                opts[key] = val.strip()
                j += 1
            if opts.get("name") != name:
                continue
            rows, cell = [], None
            for line in lines[j:]:
                if line.strip() == "":
                    continue
                if not line.startswith("   "):  # back at the margin: the table is over
                    break
                s = line[3:]
                if s.startswith("* - "):
                    rows.append([s[4:].strip()])
                elif s.startswith("  - "):
                    rows[-1].append(s[4:].strip())
                elif s.startswith("    "):  # continuation of the current cell
                    rows[-1][-1] += " " + s.strip()
                else:
                    raise AssertionError(f"unexpected line in the list-table {name!r}: {line!r}")
            return rows
    raise AssertionError(f"no list-table named {name!r} in {CONVENTIONS}")


_SAFE = {"__builtins__": {}, "sqrt": math.sqrt, "pi": math.pi}


class Relation:
    """``lhs = expression`` from the table, evaluated with named inputs."""

    def __init__(self, text: str):
        lhs, sep, rhs = text.partition("=")
        if not sep or not lhs.strip().isidentifier():
            raise AssertionError(f"a relation must read 'name = expression', got {text!r}")
        self.text = text
        self.lhs = lhs.strip()
        self.code = compile(rhs.strip(), f"<relation {text!r}>", "eval")

    def __call__(self, **inputs) -> float:
        return float(eval(self.code, dict(_SAFE), dict(inputs)))


def read_conventions(path: Path = CONVENTIONS) -> Dict[str, dict]:
    rows = parse_list_table(path.read_text(), TABLE_NAME)
    header = [c.lower() for c in rows[0]]
    assert header[0] == "key" and "relation" in header and "helper" in header, header
    i_rel, i_help = header.index("relation"), header.index("helper")
    out = {}
    for row in rows[1:]:
        assert len(row) == len(header), f"row {row[0]!r} has {len(row)} cells, the header {len(header)}"
        key = _literal(row[0])
        assert key and key not in out, f"missing or repeated key in row {row!r}"
        rel = _literal(row[i_rel])
        assert rel, f"row {key!r} has no relation"
        out[key] = {"relation": Relation(rel), "helper": _literal(row[i_help]), "row": row}
    return out


def eval_helper(expr: str, **inputs) -> float:
    from joker_ext import conversions

    ns = {name: getattr(conversions, name) for name in conversions.__all__}
    return float(eval(expr, {"__builtins__": {}, **ns}, dict(inputs)))


# ============================================================================ shared data and helpers
def _close(a, b, tol: float, what: str) -> None:
    a = np.asarray(a.detach().cpu() if torch.is_tensor(a) else a, dtype=np.float64)
    b = np.asarray(b.detach().cpu() if torch.is_tensor(b) else b, dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shapes {a.shape} and {b.shape}"
    err = np.max(np.abs(a - b)) / max(1.0, np.max(np.abs(b)))
    assert err <= tol, f"{what}: relative difference {err:.3g} > {tol:.1e}"


def _points(n: int, d: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d))


def _regression(n: int = 80, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)
    Xt = rng.standard_normal((30, 3))
    return X, y, Xt


def _binary(n: int = 100, seed: int = 1):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 3))
    y = (X[:, 0] + 0.5 * X[:, 1] + 0.5 * rng.standard_normal(n) > 0).astype(int)
    Xt = rng.standard_normal((30, 3))
    return X, y, Xt


def _joker_kernel_matrix(kernel, X, Y=None) -> np.ndarray:
    Xt = torch.as_tensor(X, dtype=torch.float64)
    Yt = Xt if Y is None else torch.as_tensor(Y, dtype=torch.float64)
    return kernel(Xt, Yt).numpy()


def _gram_grad_zero(K: np.ndarray, alpha: np.ndarray, grad: np.ndarray, what: str, tol: float) -> None:
    """``grad`` (a gradient in alpha of an objective over f = K alpha) vanishes, relative to its parts."""
    scale = max(np.max(np.abs(K @ alpha)), 1.0)
    assert np.max(np.abs(grad)) <= tol * scale, f"{what}: gradient {np.max(np.abs(grad)):.3g} is not zero"


# ============================================================================ one check per row
CHECKS: Dict[str, Callable] = {}


def check(key: str, lhs: str, **inputs):
    """Register the check of row ``key``: ``lhs`` is the name the relation must define, ``inputs`` the
    values its right-hand side is evaluated at (also used for the helper)."""

    def deco(fn):
        CHECKS[key] = (fn, lhs, inputs)
        return fn

    return deco


@check("rbf-gamma", "gamma", sigma=0.7)
def _rbf_gamma(rel, sigma):
    from sklearn.metrics.pairwise import rbf_kernel

    from joker_ext import GaussianKernel

    X, Y = _points(20), _points(15, seed=1)
    _close(rbf_kernel(X, Y, gamma=rel(sigma=sigma)), _joker_kernel_matrix(GaussianKernel(sigma), X, Y), 1e-12,
           "rbf_kernel vs GaussianKernel")


@check("laplacian-l1-gamma", "gamma", sigma=1.3)
def _laplacian_gamma(rel, sigma):
    from sklearn.metrics.pairwise import laplacian_kernel

    from joker_ext import LaplacianL1Kernel

    X, Y = _points(20), _points(15, seed=1)
    _close(laplacian_kernel(X, Y, gamma=rel(sigma=sigma)), _joker_kernel_matrix(LaplacianL1Kernel(sigma), X, Y),
           1e-12, "laplacian_kernel vs LaplacianL1Kernel")


@check("sklearn-gp-length-scale", "length_scale", sigma=0.9)
def _sklearn_gp(rel, sigma):
    from sklearn.gaussian_process.kernels import RBF, Matern

    from joker_ext import GaussianKernel, LaplacianKernel, MaternKernel

    X, Y = _points(20), _points(15, seed=1)
    ls = rel(sigma=sigma)
    _close(RBF(length_scale=ls)(X, Y), _joker_kernel_matrix(GaussianKernel(sigma), X, Y), 1e-12, "RBF")
    _close(Matern(length_scale=ls, nu=0.5)(X, Y), _joker_kernel_matrix(LaplacianKernel(sigma), X, Y), 1e-12,
           "Matern(nu=0.5) vs LaplacianKernel")
    for nu in (0.5, 1.5, 2.5):
        _close(Matern(length_scale=ls, nu=nu)(X, Y), _joker_kernel_matrix(MaternKernel(sigma, nu), X, Y), 1e-12,
               f"Matern(nu={nu})")


@check("gpytorch-lengthscale", "lengthscale", sigma=0.8)
def _gpytorch_lengthscale(rel, sigma):
    gpytorch = pytest.importorskip("gpytorch")
    from joker_ext import GaussianKernel, LaplacianKernel, MaternKernel

    X, Y = _points(20), _points(15, seed=1)
    Xt, Yt = torch.as_tensor(X), torch.as_tensor(Y)

    def dense(k):
        with torch.no_grad():
            return k.double()(Xt, Yt).to_dense()

    # GPyTorch forms squared distances as |x|^2 + |y|^2 - 2 x.y (and stores the lengthscale through a
    # softplus): agreement to ~1e-9, not to the last bit.
    ls = rel(sigma=sigma)
    k = gpytorch.kernels.RBFKernel()
    k.lengthscale = ls
    _close(dense(k), _joker_kernel_matrix(GaussianKernel(sigma), X, Y), 1e-7, "RBFKernel")
    for nu in (0.5, 1.5, 2.5):
        k = gpytorch.kernels.MaternKernel(nu=nu)
        k.lengthscale = ls
        _close(dense(k), _joker_kernel_matrix(MaternKernel(sigma, nu), X, Y), 1e-7, f"MaternKernel(nu={nu})")
        if nu == 0.5:
            _close(dense(k), _joker_kernel_matrix(LaplacianKernel(sigma), X, Y), 1e-7, "MaternKernel(0.5) vs Laplacian")
    # one lengthscale per dimension (ard_num_dims) is a vector sigma
    sig = np.array([0.5, 1.0, 2.0])
    k = gpytorch.kernels.RBFKernel(ard_num_dims=3)
    k.lengthscale = torch.tensor([[rel(sigma=s) for s in sig]])
    _close(dense(k), _joker_kernel_matrix(GaussianKernel(sig), X, Y), 1e-7, "RBFKernel(ard_num_dims=3)")


@check("gpytorch-outputscale", "outputscale", s=2.5)
def _gpytorch_outputscale(rel, s):
    gpytorch = pytest.importorskip("gpytorch")
    from joker_ext import GaussianKernel

    X, Y = _points(20), _points(15, seed=1)
    k = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    k.base_kernel.lengthscale = 1.1
    k.outputscale = rel(s=s)
    with torch.no_grad():
        K = k(torch.as_tensor(X), torch.as_tensor(Y)).to_dense()
    _close(K, _joker_kernel_matrix(GaussianKernel(1.1, outputscale=s), X, Y), 1e-7, "ScaleKernel(RBFKernel)")


@check("falkon-sigma", "sigma_falkon", sigma=1.2)
def _falkon_sigma(rel, sigma):
    falkon = pytest.importorskip("falkon")
    from joker_ext import GaussianKernel, LaplacianKernel, MaternKernel

    X, Y = _points(20), _points(15, seed=1)
    Xt, Yt = torch.as_tensor(X), torch.as_tensor(Y)
    s = rel(sigma=sigma)
    opt = falkon.FalkonOptions(use_cpu=True, keops_active="no")
    pairs = [(falkon.kernels.GaussianKernel(sigma=s, opt=opt), GaussianKernel(sigma)),
             (falkon.kernels.LaplacianKernel(sigma=s, opt=opt), LaplacianKernel(sigma))]
    pairs += [(falkon.kernels.MaternKernel(sigma=s, nu=nu, opt=opt), MaternKernel(sigma, nu)) for nu in (0.5, 1.5, 2.5)]
    for fk, jk in pairs:
        _close(fk(Xt, Yt), _joker_kernel_matrix(jk, X, Y), 1e-7, f"Falkon {type(fk).__name__}")


@check("krr-alpha", "C", alpha=0.3)
def _krr_alpha(rel, alpha):
    from sklearn.kernel_ridge import KernelRidge

    from joker_ext import JokerRegressor

    X, y, Xt = _regression()
    sigma = 1.4
    krr = KernelRidge(alpha=alpha, kernel="rbf", gamma=1 / (2 * sigma**2)).fit(X, y)
    joker = JokerRegressor(C=rel(alpha=alpha), sigma=sigma).fit(X, y)
    _close(joker.predict(Xt), krr.predict(Xt), 1e-8, "JokerRegressor vs KernelRidge")


@check("svc-C", "C_svc", C=2.0)
def _svc_C(rel, C):
    from sklearn.svm import SVC

    from joker_ext import JokerClassifier

    X, y, Xt = _binary()
    sigma = 1.5
    svc = SVC(C=rel(C=C), kernel="rbf", gamma=1 / (2 * sigma**2), tol=1e-10).fit(X, y)
    joker = JokerClassifier(loss="hinge", C=C, sigma=sigma, fit_intercept=True).fit(X, y)
    _close(joker.decision_function(Xt), svc.decision_function(Xt), 1e-5, "JokerClassifier(hinge) vs SVC")


@check("logistic-regression-C", "C_lr", C=3.0)
def _logistic_C(rel, C):
    from sklearn.linear_model import LogisticRegression

    from joker_ext import GaussianKernel, JokerClassifier

    X, y, _ = _binary()
    sigma = 1.5
    K = _joker_kernel_matrix(GaussianKernel(sigma), X)
    w, U = np.linalg.eigh(K)
    keep = w > 1e-12 * w.max()
    L = U[:, keep] * np.sqrt(w[keep])  # L L^T = K: exact kernel features of the training points
    lr = LogisticRegression(C=rel(C=C), fit_intercept=False, tol=1e-12, max_iter=10_000).fit(L, y)
    joker = JokerClassifier(loss="logistic", C=C, sigma=sigma).fit(X, y)
    _close(joker.decision_function(X), L @ lr.coef_[0], 1e-5, "JokerClassifier(logistic) vs LogisticRegression")


def _falkon_krr(falkon, X, y, Xt, sigma, penalty):
    """Falkon with every training point as a centre: the exact minimiser of its objective."""
    opt = falkon.FalkonOptions(use_cpu=True, keops_active="no", cg_tolerance=1e-12)
    model = falkon.Falkon(kernel=falkon.kernels.GaussianKernel(sigma=sigma, opt=opt), penalty=penalty, M=len(X),
                          maxiter=200, seed=0, options=opt)
    model.fit(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1))
    return model.predict(torch.as_tensor(Xt)).numpy()[:, 0]


@check("falkon-penalty", "C", penalty=1e-3, n=80)
def _falkon_penalty(rel, penalty, n):
    falkon = pytest.importorskip("falkon")
    from joker_ext import JokerFalkon, JokerRegressor

    X, y, Xt = _regression(n)
    sigma = 1.4
    reference = _falkon_krr(falkon, X, y, Xt, sigma, penalty)
    joker = JokerRegressor(C=rel(penalty=penalty, n=n), sigma=sigma).fit(X, y)
    _close(joker.predict(Xt), reference, 1e-7, "JokerRegressor vs Falkon")
    # JokerFalkon takes Falkon's penalty itself (exact kernel: the same problem as Falkon with M = n).
    opt = falkon.FalkonOptions(use_cpu=True, keops_active="no")
    jf = JokerFalkon(falkon.kernels.GaussianKernel(sigma=sigma, opt=opt), penalty, n, seed=0, options=opt,
                     features="exact", tol=1e-14, maxiter=200)
    jf.fit(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1))
    _close(jf.predict(torch.as_tensor(Xt))[:, 0], reference, 1e-7, "JokerFalkon vs Falkon")


@check("falkon-penalty-krr", "alpha", penalty=1e-3, n=80)
def _falkon_penalty_krr(rel, penalty, n):
    falkon = pytest.importorskip("falkon")
    from sklearn.kernel_ridge import KernelRidge

    X, y, Xt = _regression(n)
    sigma = 1.4
    krr = KernelRidge(alpha=rel(penalty=penalty, n=n), kernel="rbf", gamma=1 / (2 * sigma**2)).fit(X, y)
    _close(krr.predict(Xt), _falkon_krr(falkon, X, y, Xt, sigma, penalty), 1e-7, "KernelRidge vs Falkon")


@check("logistic-falkon-penalty", "C", penalty=1e-3, n=100)
def _logistic_falkon(rel, penalty, n):
    falkon = pytest.importorskip("falkon")
    from falkon.gsc_losses import LogisticLoss

    from joker_ext import JokerClassifier

    X, y, Xt = _binary(n)
    sigma = 1.5
    opt = falkon.FalkonOptions(use_cpu=True, keops_active="no", cg_tolerance=1e-12)
    kernel = falkon.kernels.GaussianKernel(sigma=sigma, opt=opt)
    # Newton steps on a decreasing path, then repeated at the target penalty until converged.
    path = [1e-1, 1e-2] + [penalty] * 6
    lf = falkon.LogisticFalkon(kernel=kernel, penalty_list=path, iter_list=[30] * len(path),
                               loss=LogisticLoss(kernel), M=n, seed=0, options=opt)
    lf.fit(torch.as_tensor(X), torch.as_tensor(2.0 * y - 1.0).reshape(-1, 1))
    joker = JokerClassifier(loss="logistic", C=rel(penalty=penalty, n=n), sigma=sigma).fit(X, y)
    _close(joker.decision_function(Xt), lf.predict(torch.as_tensor(Xt)).numpy()[:, 0], 1e-6,
           "JokerClassifier(logistic) vs LogisticFalkon")


def _gp_posterior_mean(X, y, Xt, lengthscale, outputscale, noise):
    """GPyTorch's exact posterior mean (zero mean, ScaleKernel(RBF), Gaussian noise), by Cholesky."""
    gpytorch = pytest.importorskip("gpytorch")

    class Model(gpytorch.models.ExactGP):
        def __init__(self, x, t, likelihood):
            super().__init__(x, t, likelihood)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = Model(torch.as_tensor(X), torch.as_tensor(y), likelihood).double()
    model.covar_module.base_kernel.lengthscale = lengthscale
    model.covar_module.outputscale = outputscale
    likelihood.noise = noise
    model.eval()
    likelihood.eval()
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(10**5), gpytorch.settings.skip_posterior_variances(True):
        return model(torch.as_tensor(Xt)).mean.numpy()


@check("gp-noise", "C", noise=0.05, outputscale=2.0)
def _gp_noise(rel, noise, outputscale):
    from joker_ext import JokerRegressor

    X, y, Xt = _regression()
    ls = 1.2
    mean = _gp_posterior_mean(X, y, Xt, ls, outputscale, noise)
    joker = JokerRegressor(C=rel(noise=noise, outputscale=outputscale), sigma=ls).fit(X, y)  # unit kernel
    _close(joker.predict(Xt), mean, 1e-8, "JokerRegressor (unit kernel) vs GP posterior mean")


@check("gp-noise-scaled", "C", noise=0.05, outputscale=2.0)
def _gp_noise_scaled(rel, noise, outputscale):
    from joker_ext import GaussianKernel, JokerRegressor

    X, y, Xt = _regression()
    ls = 1.2
    mean = _gp_posterior_mean(X, y, Xt, ls, outputscale, noise)
    joker = JokerRegressor(C=rel(noise=noise), kernel=GaussianKernel(ls, outputscale=outputscale)).fit(X, y)
    _close(joker.predict(Xt), mean, 1e-8, "JokerRegressor (scaled kernel) vs GP posterior mean")


def _falkon_objective_minimiser(K, y, Kt, penalty):
    """Minimiser of Falkon's ``(1/n)||y - f||^2 + penalty ||f||^2``, predicted at ``Kt = K(X_test, X)``.

    By the representer theorem f = K a; the gradient ``(2/n) K (K a - y) + 2 penalty K a`` vanishes when
    ``(K + n penalty I) a = y``.
    """
    n = len(y)
    a = np.linalg.solve(K + n * penalty * np.eye(n), y)
    return Kt @ a


@check("gp-noise-penalty", "noise", penalty=1e-3, n=80, outputscale=2.0)
def _gp_noise_penalty(rel, penalty, n, outputscale):
    from joker_ext import GaussianKernel

    X, y, Xt = _regression(n)
    ls = 1.2
    k = GaussianKernel(ls)
    reference = _falkon_objective_minimiser(_joker_kernel_matrix(k, X), y, _joker_kernel_matrix(k, Xt, X), penalty)
    mean = _gp_posterior_mean(X, y, Xt, ls, outputscale, rel(penalty=penalty, n=n, outputscale=outputscale))
    _close(mean, reference, 1e-6, "GP posterior mean vs the minimiser of Falkon's objective")


@check("askotch-lambda", "lambda_askotch", penalty=1e-3, n=80)
def _askotch_lambda(rel, penalty, n):
    from joker_ext import GaussianKernel

    X, y, _ = _regression(n)
    K = _joker_kernel_matrix(GaussianKernel(1.4), X)
    lam = rel(penalty=penalty, n=n)
    w = np.linalg.solve(K + lam * np.eye(n), y)  # ASkotch's system
    # ... is a stationary point of Falkon's objective (1/n)||y - K w||^2 + penalty w^T K w:
    grad = (2.0 / n) * K @ (K @ w - y) + 2.0 * penalty * K @ w
    _gram_grad_zero(K, w, grad, "ASkotch's solution in Falkon's objective", 1e-10)


@check("dsg-nu", "nu", C=5.0, n=80)
def _dsg_nu(rel, C, n):
    from joker_ext import JokerRegressor

    X, y, _ = _regression(n)
    joker = JokerRegressor(C=C, sigma=1.4).fit(X, y)
    K = _joker_kernel_matrix(joker.kernel_, X)
    a = joker.dual_coef_[:, 0]
    nu = rel(C=C, n=n)
    # DSG's objective (1/n) sum_i (f_i - y_i)^2 / 2 + (nu / 2) ||f||^2 at f = K a: gradient in a is zero.
    grad = (1.0 / n) * K @ (K @ a - y) + nu * K @ a
    _gram_grad_zero(K, a, grad, "Joker's solution in the DSG objective", 1e-10)


# ============================================================================ the tests
TABLE = read_conventions()


def test_every_row_has_a_check_and_every_check_a_row():
    assert set(TABLE) == set(CHECKS), (
        f"rows without a check: {sorted(set(TABLE) - set(CHECKS))}; checks without a row: "
        f"{sorted(set(CHECKS) - set(TABLE))}"
    )


@pytest.mark.parametrize("key", sorted(CHECKS))
def test_convention(key):
    fn, lhs, inputs = CHECKS[key]
    row = TABLE[key]
    rel = row["relation"]
    assert rel.lhs == lhs, f"row {key!r}: the relation should define {lhs!r}, it reads {rel.text!r}"
    if row["helper"]:
        value = rel(**inputs)
        helper = eval_helper(row["helper"], **inputs)
        assert helper == pytest.approx(value, rel=1e-12), f"row {key!r}: helper {row['helper']} = {helper}, relation {value}"
    fn(rel, **inputs)


@pytest.mark.parametrize("key, wrong", [
    ("rbf-gamma", "gamma = 1 / sigma**2"),
    ("krr-alpha", "C = 2 / alpha"),
    ("gp-noise", "C = 1 / noise"),
    ("gp-noise-penalty", "noise = penalty * outputscale"),
    ("dsg-nu", "nu = 1 / C"),
])
def test_wrong_relation_is_caught(key, wrong):
    fn, _, inputs = CHECKS[key]
    with pytest.raises(AssertionError):
        fn(Relation(wrong), **inputs)


def test_table_parser_reads_the_rows():
    rows = parse_list_table(CONVENTIONS.read_text(), TABLE_NAME)
    assert [c.lower() for c in rows[0]][:1] == ["key"] and len(rows) == len(TABLE) + 1
    assert TABLE["rbf-gamma"]["relation"](sigma=1.0) == 0.5
    assert TABLE["falkon-penalty"]["relation"](penalty=0.1, n=10) == pytest.approx(1.0)


# ============================================================================ commands shown on the pages
def _harness_commands():
    """Every ``python -m joker_ext.comparisons ...`` command line of the pages (shell examples are not run by the
    doctest builder: their flags are checked here instead)."""
    out = []
    for page in sorted(DOCS.glob("*.rst")):
        text = re.sub(r"\\\n\s*", " ", page.read_text())  # shell line continuations
        for line in text.splitlines():
            m = re.match(r"\s*python -m joker_ext.comparisons(\s.*)?$", line)
            if m:
                out.append((page.name, line.split("#")[0].strip()))
    return out


def test_harness_commands_in_the_docs_parse(monkeypatch):
    import shlex

    from joker_ext.comparisons.spec import spec_from_args

    monkeypatch.chdir(ROOT)  # relative paths on the pages are relative to the repository root
    commands = _harness_commands()
    assert len(commands) >= 5, commands
    for page, line in commands:
        argv = shlex.split(line)[3:]
        if "--help" in argv:
            continue
        specs, run = spec_from_args(argv)  # raises on an unknown flag or a bad value
        assert specs, f"{page}: {line!r} gives no experiment"


# ============================================================================ the builds
def _sphinx(builder: str, out: Path, doctrees: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, MPLBACKEND="Agg", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, "-d", str(doctrees),
           str(DOCS), str(out)]
    return subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=900)


def test_sphinx_builds(tmp_path):
    """``sphinx -W -b html`` then ``-b doctest`` (sharing the parsed sources) succeed."""
    pytest.importorskip("sphinx")
    pytest.importorskip("numpydoc")
    doctrees = tmp_path / "doctrees"
    html = _sphinx("html", tmp_path / "html", doctrees)
    assert html.returncode == 0, f"html build failed:\n{html.stdout[-4000:]}\n{html.stderr[-8000:]}"
    for page in ("index", "installation", "quickstart", "math", "conventions", "losses", "comparisons",
                 "performance", "seed_solvers", "api/index"):
        assert (tmp_path / "html" / f"{page}.html").is_file(), f"{page}.html was not written"
    doctest = _sphinx("doctest", tmp_path / "doctest", doctrees)
    report = (tmp_path / "doctest" / "output.txt")
    text = report.read_text() if report.is_file() else ""
    assert doctest.returncode == 0, f"doctest build failed:\n{text[-6000:]}\n{doctest.stderr[-4000:]}"
    summary = text[text.rfind("Doctest summary"):]
    ran = re.search(r"^\s*(\d+) tests?\s*$", summary, re.M)
    failed = re.search(r"^\s*(\d+) failures? in tests\s*$", summary, re.M)
    assert ran and failed, f"no doctest summary in output.txt:\n{text[-3000:]}"
    assert int(failed.group(1)) == 0, text[-6000:]
    assert int(ran.group(1)) >= 40, f"only {ran.group(1)} examples ran:\n{text[-3000:]}"
