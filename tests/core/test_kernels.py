"""Kernel evaluation against scikit-learn's and scipy's own formulas."""
import warnings

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


def test_gaussian_of_points_spread_over_billions_of_bandwidths_is_exact_and_psd():
    """Points at 0, 0, 2.7e-7, 1e-17, 2.3e-255 and 757 with the median heuristic's bandwidth (2.7e-7): the scaled
    points lie 2.8e9 apart, where the Gram form's squared distances err by about 1.7e3; the kernel matrix must still
    be the Gaussian of the points' differences (numpy's, from ``x_i - x_j`` directly) and positive semidefinite, and
    the squared loss's fit on it must converge (it raised: its Newton system could not be factored)."""
    from joker_ext import JokerRegressor

    x = np.array([0.0, 0.0, 757.0, 2.7153465941274725e-07, 1.0000000000000001e-17, 2.3186018373145222e-255])
    X = x.reshape(-1, 1)
    sigma = median_heuristic(X)
    ref = np.exp(-0.5 * ((x[:, None] - x[None, :]) / sigma) ** 2)
    for K in (GaussianKernel(sigma)(T(X), T(X)), GaussianKernel(sigma).against(T(X))(T(X)),
              torch.exp(-0.5 * GaussianKernel(sigma).scaled_distance(T(X), T(X)))):
        np.testing.assert_allclose(K.numpy(), ref, rtol=1e-14, atol=1e-300)
    assert np.linalg.eigvalsh(ref).min() >= -1e-12
    y = np.array([0.1257302210933933, -0.1321048632913019, 0.6404226504432821, 0.10490011715303971,
                  -0.535669373161111, 0.36159505490948474])
    est = JokerRegressor().fit(X, y)
    assert est.status_ == "converged" and np.isfinite(est.predict(X)).all()


def test_gaussian_ard_and_outputscale(data):
    A, B = data
    sig = np.array([0.5, 1.0, 2.0, 3.0])
    K = GaussianKernel(sig, outputscale=2.5)(T(A), T(B)).numpy()
    ref = 2.5 * rbf_kernel(A / sig, B / sig, gamma=0.5)
    np.testing.assert_allclose(K, ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kernel", [GaussianKernel(1.7), GaussianKernel([0.5, 1.0, 2.0, 3.0], outputscale=2.5),
                                    MaternKernel(1.2, nu=1.5), CallableKernel(GaussianKernel(0.9))],
                         ids=["gaussian", "gaussian-ard", "matern", "callable"])
def test_rows_against_fixed_points_match_scikit_learn_block_by_block(data, kernel):
    """``kernel.against(B)`` (the Gaussian prepares B once) gives, block by block, the kernel's own blocks bit for
    bit and scikit-learn's values to rounding, in float64 and float32."""
    A, B = data
    sig = np.broadcast_to(np.asarray(getattr(kernel, "sigma", 0.9), dtype=np.float64), (4,))
    scale = getattr(kernel, "outputscale", 1.0)
    if isinstance(kernel, StationaryKernel) and kernel.family == "matern":
        ref = scale * Matern(length_scale=1.0, nu=1.5)(A / sig, B / sig)
    else:
        ref = scale * rbf_kernel(A / sig, B / sig, gamma=0.5)
    for dtype, rtol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        rows = kernel.against(T(B).to(dtype))
        for part in (slice(0, 7), slice(7, 40)):
            got = rows(T(A[part]).to(dtype))
            assert torch.equal(got, kernel(T(A[part]).to(dtype), T(B).to(dtype)))
            np.testing.assert_allclose(got.double().numpy(), ref[part], rtol=rtol, atol=10 * rtol)


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


# ----------------------------------------------------------------------------- rational quadratic, active dims
from sklearn.gaussian_process.kernels import RationalQuadratic  # noqa: E402

from joker_ext.kernels import (  # noqa: E402
    ActiveDimsKernel,
    Kernel,
    RationalQuadraticKernel,
    kernel_from_description,
)


@pytest.mark.parametrize("length_scale, alpha, s", [(1.3, 0.3, 1.0), (0.7, 2.0, 2.5), (2.0, 50.0, 0.4)])
def test_rational_quadratic_matches_sklearn(data, length_scale, alpha, s):
    """k = s (1 + ||x - y||^2 / (2 alpha l^2))^(-alpha), scikit-learn's RationalQuadratic (times a constant)."""
    A, B = data
    K = RationalQuadraticKernel(length_scale, alpha, outputscale=s)(T(A), T(B)).numpy()
    np.testing.assert_allclose(K, s * RationalQuadratic(length_scale=length_scale, alpha=alpha)(A, B),
                               rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(RationalQuadraticKernel(length_scale, alpha, s).diag(T(A)).numpy(), s, rtol=1e-15)


def test_rational_quadratic_matches_gpytorch_ard(data):
    gk = pytest.importorskip("gpytorch").kernels
    A, B = data
    k = gk.RQKernel(ard_num_dims=4).double()
    k.lengthscale = T([0.5, 1.0, 2.0, 3.0])
    k.alpha = T(0.8)
    with torch.no_grad():
        ref = k(T(A), T(B)).to_dense()
    ls, alpha = k.lengthscale.detach().reshape(-1), float(k.alpha.detach())  # the values GPyTorch evaluates with
    torch.testing.assert_close(ls, T([0.5, 1.0, 2.0, 3.0]), rtol=1e-12, atol=0)
    ours = RationalQuadraticKernel(ls, alpha)(T(A), T(B))
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)


def test_rational_quadratic_tends_to_the_gaussian(data):
    """(1 + r^2 / (2 a))^(-a) -> exp(-r^2 / 2) as a -> infinity, with error ~ r^4 / (8 a)."""
    A, B = data
    K = RationalQuadraticKernel(1.7, 1e7)(T(A), T(B)).numpy()
    np.testing.assert_allclose(K, rbf_kernel(A, B, gamma=1 / (2 * 1.7**2)), atol=1e-6)


def test_rational_quadratic_arguments_are_checked():
    with pytest.raises(ValueError, match="alpha"):
        RationalQuadraticKernel(1.0, alpha=0.0)
    with pytest.raises(ValueError, match="outputscale"):
        RationalQuadraticKernel(1.0, outputscale=-1.0)
    with pytest.raises(ValueError, match="sigma"):
        RationalQuadraticKernel(-1.0)


@pytest.mark.parametrize("dims", [[2], [3, 0], [1, 1, 2]])
def test_active_dims_matches_gpytorch(data, dims):
    """GPyTorch selects the columns in Kernel.__call__ (in the order given, repeats kept)."""
    gk = pytest.importorskip("gpytorch").kernels
    A, B = data
    gp = gk.MaternKernel(nu=2.5, active_dims=dims).double()
    gp.lengthscale = T(0.9)
    with torch.no_grad():
        ref = gp(T(A), T(B)).to_dense()
    assert float(gp.lengthscale.detach()) == pytest.approx(0.9, rel=1e-13)
    ours = ActiveDimsKernel(MaternKernel(0.9, 2.5), dims)
    torch.testing.assert_close(ours(T(A), T(B)), ref, rtol=1e-12, atol=1e-12)
    # and the closed form: scikit-learn's Matern on the selected columns
    np.testing.assert_allclose(ours(T(A), T(B)).numpy(), Matern(0.9, nu=2.5)(A[:, dims], B[:, dims]), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(ours.diag(T(A)).numpy(), 1.0)
    v = T(np.random.default_rng(5).standard_normal(30))
    np.testing.assert_allclose(ours.mmv(T(A), T(B), v, chunk_size=7).numpy(), ref.numpy() @ v.numpy(), rtol=1e-12)


def test_active_dims_errors():
    with pytest.raises(ValueError, match="dims"):
        ActiveDimsKernel(GaussianKernel(1.0), [])
    with pytest.raises(ValueError, match="dims"):
        ActiveDimsKernel(GaussianKernel(1.0), [-1])
    with pytest.raises(TypeError, match="base"):
        ActiveDimsKernel(lambda a, b: a @ b.T, [0])
    with pytest.raises(ValueError, match="columns"):
        ActiveDimsKernel(GaussianKernel(1.0), [5])(torch.zeros(2, 3), torch.zeros(2, 3))


def _linear(A, B):
    return A @ B.T


SCALABLE = {
    "gaussian": lambda: GaussianKernel([0.5, 1.0, 2.0, 3.0], outputscale=1.5),
    "rq": lambda: RationalQuadraticKernel(1.2, 0.6, outputscale=0.7),
    "sum": lambda: GaussianKernel(1.0) + RationalQuadraticKernel(2.0, 3.0),
    "active_dims": lambda: ActiveDimsKernel(RationalQuadraticKernel(0.8, 1.5), [3, 1]),
    "callable": lambda: CallableKernel(_linear, name="linear"),
}


@pytest.mark.parametrize("name", list(SCALABLE))
def test_scaled_multiplies_the_kernel(data, name):
    A, B = data
    k = SCALABLE[name]()
    torch.testing.assert_close(k.scaled(2.5)(T(A), T(B)), 2.5 * k(T(A), T(B)), rtol=1e-13, atol=1e-14)
    with pytest.raises(ValueError, match="factor"):
        k.scaled(0.0)


@pytest.mark.parametrize("name", [n for n in SCALABLE if n != "callable"])
def test_descriptions_rebuild_the_same_kernel(data, name):
    import json

    A, B = data
    k = SCALABLE[name]()
    back = kernel_from_description(json.loads(json.dumps(k.describe())))
    assert type(back) is type(k)
    torch.testing.assert_close(back(T(A), T(B)), k(T(A), T(B)), rtol=0, atol=0)


def test_kernels_without_a_spectral_density_name_themselves_and_the_modes_that_work():
    lin = CallableKernel(_linear, name="my-linear")

    class Plain(Kernel):  # a user's kernel that only evaluates itself
        def __call__(self, X1, X2):
            return X1 @ X2.T

    for k, name in [(lin, "my-linear"), (Plain(), "Plain"), (GaussianKernel(1.0) + lin, "my-linear"),
                    (ActiveDimsKernel(lin, [0]), "my-linear on columns [0]")]:
        assert not k.supports_random_features
        with pytest.raises(ValueError, match="spectral") as info:
            k.random_features(16)
        msg = str(info.value)
        assert name in msg and "nystrom" in msg and "exact" in msg, msg


def test_scikit_learn_rational_quadratic_translates_to_the_core_kernel(data):
    from sklearn.gaussian_process.kernels import ConstantKernel

    from joker_ext.adapters.sklearn import translate_kernel

    A, B = data
    sk = ConstantKernel(0.5) * RationalQuadratic(length_scale=1.2, alpha=0.8)
    k = translate_kernel(sk)
    assert type(k) is RationalQuadraticKernel and k.outputscale == 0.5 and k.alpha == 0.8
    np.testing.assert_allclose(k(T(A), T(B)).numpy(), sk(A, B), rtol=1e-12, atol=1e-14)
    assert k.supports_random_features  # so scikit-learn's RQ runs with n_features= too


class _DenseLazyTensor:
    """A stand-in for pykeops' LazyTensor that evaluates densely (the operations ``_keops_mmv`` uses)."""

    def __init__(self, t):
        self.t = t

    def _wrap(self, other):
        return other.t if isinstance(other, _DenseLazyTensor) else other

    def __sub__(self, other):
        return _DenseLazyTensor(self.t - self._wrap(other))

    def __pow__(self, k):
        return _DenseLazyTensor(self.t ** k)

    def __rmul__(self, other):
        return _DenseLazyTensor(other * self.t)

    def __mul__(self, other):
        return _DenseLazyTensor(self.t * self._wrap(other))

    def __neg__(self):
        return _DenseLazyTensor(-self.t)

    def sum(self, dim):
        return _DenseLazyTensor(self.t.sum(dim))

    def exp(self):
        return _DenseLazyTensor(self.t.exp())

    def __matmul__(self, V):
        return self.t @ V


def _fake_pykeops(monkeypatch, lazy_tensor):
    import sys
    import types

    import joker_ext.kernels as kernels_module
    top, sub = types.ModuleType("pykeops"), types.ModuleType("pykeops.torch")
    sub.LazyTensor = lazy_tensor
    top.torch = sub
    monkeypatch.setitem(sys.modules, "pykeops", top)
    monkeypatch.setitem(sys.modules, "pykeops.torch", sub)
    monkeypatch.setattr(kernels_module, "_KEOPS_WORKS", {})
    return kernels_module


def test_keops_works_falls_back_with_a_warning_when_pykeops_imports_but_cannot_compile(monkeypatch):
    """The device machine of session 22: pykeops installed, its first compilation failed (ModuleNotFoundError of
    the compiled module). An automatic backend choice must see False (and say why), not fail the fit."""
    def broken(_):
        raise ModuleNotFoundError("No module named 'pykeops_cpp_ab481490b9'")

    kernels_module = _fake_pykeops(monkeypatch, broken)
    assert kernels_module.keops_available()
    with pytest.warns(RuntimeWarning, match=r"does not run on cpu \(ModuleNotFoundError: .*pykeops_cpp"):
        assert kernels_module.keops_works("cpu") is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels_module.keops_works("cpu") is False  # cached: no second compilation, no second warning


def test_keops_works_accepts_a_pykeops_that_runs(monkeypatch):
    kernels_module = _fake_pykeops(monkeypatch, _DenseLazyTensor)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels_module.keops_works("cpu") is True
    k = kernels_module.StationaryKernel("gaussian", 0.7)
    X = torch.randn(7, 3, dtype=torch.float64)
    v = torch.randn(7, 2, dtype=torch.float64)
    torch.testing.assert_close(k.mmv(X, X, v, backend="keops"), k(X, X) @ v)


@pytest.mark.parametrize("family, nu", [("laplacian", None), ("matern", 1.5), ("matern", 2.5)])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-11), (torch.float32, 3e-7)])
def test_euclidean_kernels_are_accurate_at_zero_distance(family, nu, dtype, tol):
    """The L2 families' kernel values against scipy's distances (``pdist``, from the differences) on points away
    from the origin, with a near-duplicate pair: the diagonal, the pair and the rest to the dtype's accuracy. The
    Gram form's rounding, magnified by the square root near zero, put the Laplacian diagonal 7e-8 off in float64
    and 2e-3 off in float32."""
    g = np.random.default_rng(0)
    X = 3.0 + 2.0 * g.standard_normal((300, 6))
    X[1] = X[0] + 1e-4
    X = X.astype(np.float32 if dtype == torch.float32 else np.float64).astype(np.float64)  # the inputs as given
    from scipy.spatial.distance import squareform

    k = make_kernel(family, 2.0, nu=nu)
    ref = k.profile(torch.as_tensor(squareform(pdist(X / 2.0))))
    K = k(torch.as_tensor(X, dtype=dtype), torch.as_tensor(X, dtype=dtype))
    assert K.dtype == dtype
    assert float((K.double() - ref).abs().max()) <= tol
