"""Kernel evaluation against scikit-learn's and scipy's own formulas."""
import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from sklearn.gaussian_process.kernels import Matern
from sklearn.metrics.pairwise import laplacian_kernel, rbf_kernel

from joker_ext.kernels import (
    CallableKernel,
    GaussianKernel,
    LaplacianKernel,
    LaplacianL1Kernel,
    MaternKernel,
    StationaryKernel,
    SumKernel,
    make_kernel,
    median_heuristic,
)


@pytest.fixture
def data():
    g = np.random.default_rng(1)
    return g.standard_normal((40, 4)), g.standard_normal((30, 4))


def T(a):
    return torch.as_tensor(a, dtype=torch.float64)


def test_gaussian_matches_sklearn_rbf(data):
    A, B = data
    sigma = 1.7
    K = GaussianKernel(sigma)(T(A), T(B)).numpy()
    np.testing.assert_allclose(K, rbf_kernel(A, B, gamma=1 / (2 * sigma**2)), rtol=1e-12, atol=1e-14)


def test_gaussian_ard_and_outputscale(data):
    A, B = data
    sig = np.array([0.5, 1.0, 2.0, 3.0])
    K = GaussianKernel(sig, outputscale=2.5)(T(A), T(B)).numpy()
    ref = 2.5 * rbf_kernel(A / sig, B / sig, gamma=0.5)
    np.testing.assert_allclose(K, ref, rtol=1e-12, atol=1e-14)


def test_laplacian_l1_matches_sklearn(data):
    A, B = data
    K = LaplacianL1Kernel(2.0)(T(A), T(B)).numpy()
    np.testing.assert_allclose(K, laplacian_kernel(A, B, gamma=0.5), rtol=1e-12)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_matern_matches_sklearn(data, nu):
    A, B = data
    K = MaternKernel(1.3, nu=nu)(T(A), T(B)).numpy()
    ref = Matern(length_scale=1.3, nu=nu)(A, B)
    np.testing.assert_allclose(K, ref, rtol=1e-10, atol=1e-12)


def test_laplacian_l2_is_matern_half(data):
    A, B = data
    K = LaplacianKernel(0.8)(T(A), T(B)).numpy()
    D = np.sqrt(((A[:, None, :] - B[None, :, :]) ** 2).sum(-1))
    np.testing.assert_allclose(K, np.exp(-D / 0.8), rtol=1e-10, atol=1e-12)


def test_diagonal_is_exactly_outputscale_and_psd(data):
    A, _ = data
    k = GaussianKernel(0.7, outputscale=3.0)
    K = k(T(A), T(A))
    np.testing.assert_allclose(torch.diagonal(K).numpy(), 3.0, rtol=1e-14)
    assert torch.linalg.eigvalsh(K).min() > -1e-10


def test_mmv_chunks_match_dense(data):
    A, B = data
    v = T(np.random.default_rng(2).standard_normal((30, 3)))
    for k in (GaussianKernel(1.1), MaternKernel(0.9, 2.5), SumKernel([GaussianKernel(1.0), LaplacianL1Kernel(2.0)])):
        dense = k(T(A), T(B)) @ v
        np.testing.assert_allclose(k.mmv(T(A), T(B), v, chunk_size=7).numpy(), dense.numpy(), rtol=1e-12)


def test_keops_backend_gives_same_numbers(data):
    pytest.importorskip("pykeops")
    A, B = data
    v = T(np.random.default_rng(3).standard_normal((30, 2)))
    for k in (GaussianKernel(1.1), LaplacianKernel(1.0), MaternKernel(0.9, 1.5), LaplacianL1Kernel(2.0)):
        ref = k(T(A), T(B)) @ v
        got = k.mmv(T(A), T(B), v, backend="keops")
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-9, atol=1e-11)


def test_sum_and_callable_kernels(data):
    A, B = data
    k = GaussianKernel(1.0) + MaternKernel(2.0, 1.5)
    ref = rbf_kernel(A, B, gamma=0.5) + Matern(length_scale=2.0, nu=1.5)(A, B)
    np.testing.assert_allclose(k(T(A), T(B)).numpy(), ref, rtol=1e-10)
    lin = CallableKernel(lambda X1, X2: X1 @ X2.T, name="linear")
    np.testing.assert_allclose(lin(T(A), T(B)).numpy(), A @ B.T, rtol=1e-12)


def test_median_heuristic_matches_scipy(data):
    A, _ = data
    assert median_heuristic(A) == pytest.approx(np.median(pdist(A)), rel=1e-12)
    assert median_heuristic(A, metric="l1") == pytest.approx(np.median(pdist(A, "cityblock")), rel=1e-12)
    k = make_kernel("gaussian", "median", X=A)
    assert float(k.sigma) == pytest.approx(np.median(pdist(A)), rel=1e-12)


@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        (dict(family="gauss", sigma=1.0), ValueError, "family"),
        (dict(family="gaussian", sigma=0.0), ValueError, "sigma"),
        (dict(family="gaussian", sigma=-1.0), ValueError, "sigma"),
        (dict(family="gaussian", sigma=float("nan")), ValueError, "sigma"),
        (dict(family="gaussian", sigma="wide"), TypeError, "sigma"),
        (dict(family="matern", sigma=1.0, nu=0.7), ValueError, "nu"),
        (dict(family="gaussian", sigma=1.0, outputscale=0.0), ValueError, "outputscale"),
    ],
)
def test_bad_kernel_arguments_name_the_argument(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        StationaryKernel(**kwargs)


def test_make_kernel_rejects_unknown_names():
    with pytest.raises(ValueError, match="kernel"):
        make_kernel("polynomial")
    with pytest.raises(ValueError, match="sigma"):
        make_kernel("gaussian", "mean", X=np.zeros((3, 2)))


def test_per_dimension_sigma_width_mismatch(data):
    A, B = data
    with pytest.raises(ValueError, match="sigma"):
        GaussianKernel([1.0, 2.0])(T(A), T(B))
