"""Random features against the kernels they approximate (Bochner's theorem)."""
import math

import numpy as np
import pytest
import torch

from joker_ext.features import NystromFeatureMap, RandomFeatureMap, make_feature_map
from joker_ext.kernels import GaussianKernel, LaplacianKernel, LaplacianL1Kernel, MaternKernel, SumKernel

g = np.random.default_rng(0)
X = torch.as_tensor(g.standard_normal((200, 3)), dtype=torch.float64)

KERNELS = {
    "gaussian": GaussianKernel(1.5),
    "laplacian": LaplacianKernel(2.0),
    "laplacian_l1": LaplacianL1Kernel(3.0),
    "matern15": MaternKernel(1.5, nu=1.5),
    "matern25": MaternKernel(1.5, nu=2.5, outputscale=2.0),
    "gaussian_ard": GaussianKernel([0.8, 1.5, 3.0]),
}


def gram_error(kernel, M, seed, **kw):
    fmap = make_feature_map(kernel, M, seed=seed, **kw)
    Phi = fmap(X)
    K = kernel(X, X)
    return float((Phi @ Phi.T - K).norm() / K.norm())


@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("form", ["cossin", "cos"])
def test_gram_error_decays_like_inverse_sqrt_M(name, form):
    kernel = KERNELS[name]
    Ms = [128, 512, 2048, 8192]
    errs = [np.mean([gram_error(kernel, M, s, form=form) for s in range(3)]) for M in Ms]
    slope = np.polyfit(np.log(Ms), np.log(errs), 1)[0]
    assert -0.65 < slope < -0.35, (errs, slope)
    # and the constant is sane: error * sqrt(M) stays bounded
    assert errs[-1] * math.sqrt(Ms[-1]) < 10.0


def test_orthogonal_features_beat_iid_for_gaussian():
    kernel = GaussianKernel(1.0)
    M = 96  # a few orthogonal blocks of d = 3
    iid = np.mean([gram_error(kernel, M, s) for s in range(30)])
    orf = np.mean([gram_error(kernel, M, s, orthogonal=True) for s in range(30)])
    assert orf < 0.9 * iid, (orf, iid)


def test_orthogonal_features_are_unbiased_for_matern():
    kernel = MaternKernel(1.2, nu=2.5)
    errs = [gram_error(kernel, M, 0, orthogonal=True) for M in (256, 4096)]
    assert errs[1] < errs[0] / 2.5


def test_same_seed_same_features_other_seed_other_features():
    k = GaussianKernel(1.0)
    a = RandomFeatureMap(k, 64, seed=3)(X)
    b = RandomFeatureMap(k, 64, seed=3)(X)
    c = RandomFeatureMap(k, 64, seed=4)(X)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    # dtype does not change the draw: float32 features equal float64 ones up to rounding
    d = RandomFeatureMap(k, 64, seed=3)(X.float())
    np.testing.assert_allclose(d.double().numpy(), a.numpy(), atol=2e-5)


def test_odd_number_of_cossin_features_is_unbiased():
    k = GaussianKernel(1.0)
    Phi = RandomFeatureMap(k, 4097, seed=0)(X)
    assert Phi.shape == (200, 4097)
    K = k(X, X)
    assert float((Phi @ Phi.T - K).norm() / K.norm()) < 0.05


def test_sum_kernel_features_concatenate():
    k = SumKernel([GaussianKernel(1.0), LaplacianL1Kernel(2.0)])
    Phi = make_feature_map(k, 8000, seed=1)(X)
    K = k(X, X)
    assert float((Phi @ Phi.T - K).norm() / K.norm()) < 0.05


def test_nystrom_features_reproduce_kernel_on_centres():
    k = GaussianKernel(1.0)
    Z = X[:50]
    fmap = NystromFeatureMap(k, Z)
    P = fmap(X)
    KXZ = k(X, Z)
    ref = KXZ @ torch.linalg.solve(k(Z, Z), KXZ.T)
    np.testing.assert_allclose((P @ P.T).numpy(), ref.numpy(), atol=1e-8)
    np.testing.assert_allclose((fmap(Z) @ fmap(Z).T).numpy(), k(Z, Z).numpy(), atol=1e-10)


def test_feature_map_errors_name_the_argument():
    with pytest.raises(ValueError, match="n_features"):
        RandomFeatureMap(GaussianKernel(1.0), 0)
    with pytest.raises(ValueError, match="form"):
        RandomFeatureMap(GaussianKernel(1.0), 10, form="sin")
    with pytest.raises(ValueError, match="radial"):
        RandomFeatureMap(LaplacianL1Kernel(1.0), 10, orthogonal=True)
    fmap = RandomFeatureMap(GaussianKernel(1.0), 10)
    fmap(X)
    with pytest.raises(ValueError, match="features"):
        fmap(X[:, :2])


def test_compute_dtype_float32_is_the_float32_map_returned_in_float64():
    X = torch.randn(200, 4, dtype=torch.float64).float().double()  # float32 data held in float64
    k = GaussianKernel(1.5)
    mixed = RandomFeatureMap(k, 301, seed=3, compute_dtype=torch.float32)
    single = RandomFeatureMap(k, 301, seed=3)
    full = RandomFeatureMap(k, 301, seed=3)
    out = mixed(X)
    assert out.dtype == torch.float64
    assert torch.equal(out, single(X.float()).double())  # the same deterministic map, in float64
    assert float((out - full(X)).abs().max()) < 1e-5  # and float32-close to the float64 evaluation
    with pytest.raises(ValueError, match="compute_dtype"):
        RandomFeatureMap(k, 10, compute_dtype=torch.int32)


@pytest.mark.parametrize("form", ["cossin", "cos"])
@pytest.mark.parametrize("M", [300, 301])
def test_pass_features_are_the_map_up_to_layout_and_scale(form, M):
    """The solver's pass evaluation (unscaled, blocked by rows, into a reused buffer) is the map:
    ``phi(X)[:, order] == scale * pass_features(X)``, with more rows than one row block."""
    from joker_ext.features import ROW_BLOCK

    Xl = torch.as_tensor(g.standard_normal((2 * ROW_BLOCK + 17, 3)), dtype=torch.float64)
    fmap = RandomFeatureMap(GaussianKernel(1.5, outputscale=2.0), M, form=form, seed=4)
    phi = fmap(Xl)
    scale, order = fmap.pass_layout(Xl.device)
    ref = phi if order is None else phi[:, order]
    np.testing.assert_allclose((scale * fmap.pass_features(Xl)).numpy(), ref.numpy(), rtol=1e-13, atol=1e-14)
    buf = torch.full((Xl.shape[0], M), math.nan, dtype=torch.float64)
    out = fmap.pass_features(Xl, out=buf)
    assert out.data_ptr() == buf.data_ptr()
    np.testing.assert_allclose((scale * buf).numpy(), ref.numpy(), rtol=1e-13, atol=1e-14)


# ----------------------------------------------------------------------------- kernels build their own features
from sklearn.gaussian_process.kernels import RationalQuadratic  # noqa: E402
from sklearn.metrics.pairwise import rbf_kernel  # noqa: E402

from joker_ext.features import ColumnsFeatureMap, ConcatFeatureMap  # noqa: E402
from joker_ext.kernels import (  # noqa: E402
    ActiveDimsKernel,
    CallableKernel,
    Kernel,
    RationalQuadraticKernel,
    SpectralKernel,
    StationaryKernel,
)

MS = (256, 1024, 4096, 16384)


def mc_bound(s, n, M, K):
    """Root-mean-square bound on ``||Phi Phi^T - K||_F / ||K||_F`` for M i.i.d. random features of a kernel with
    ``k(x, x) = s``: with cos/sin pairs (m = M / 2 frequencies) ``phi(x)^T phi(y) = (s / m) sum_j cos(w_j^T (x -
    y))``, a mean of m i.i.d. terms in [-1, 1], so each entry has variance <= s^2 / m = 2 s^2 / M; with random
    phases ``(s / M) sum_j [cos(w_j^T (x - y)) + cos(w_j^T (x + y) + 2 b_j)]``, whose terms have second moment
    <= 1 + 1/2, variance <= 1.5 s^2 / M. Unbiased features therefore have
    ``E ||Phi Phi^T - K||_F^2 <= 2 s^2 n^2 / M``."""
    return s * n * math.sqrt(2.0 / M) / float(K.norm())


def mean_sq_error(fmap_of_seed, K, seeds=range(6)):
    errs = []
    for seed in seeds:
        P = fmap_of_seed(seed)(X)
        errs.append(float((P @ P.T - K).norm() / K.norm()) ** 2)
    return float(np.mean(errs))


@pytest.mark.parametrize("alpha", [0.4, 2.0])
@pytest.mark.parametrize("form", ["cossin", "cos"])
@pytest.mark.parametrize("orthogonal", [False, True], ids=["iid", "orf"])
def test_rational_quadratic_features_converge_to_the_kernel(alpha, form, orthogonal):
    """The Gamma scale mixture (lengthscale^-2 ~ Gamma(alpha, rate alpha sigma^2)) gives unbiased features of the RQ
    kernel: the mean squared Gram error stays under the Monte-Carlo bound, which shrinks like 1/sqrt(M), against
    scikit-learn's RationalQuadratic (ARD through scaled inputs). Orthogonal features are held to the i.i.d. bound
    (they vary less for radial densities)."""
    ls, s = np.array([0.8, 1.5, 3.0]), 1.4
    K = torch.as_tensor(s * RationalQuadratic(length_scale=1.0, alpha=alpha)(X.numpy() / ls))
    k = RationalQuadraticKernel(ls, alpha, outputscale=s)
    assert k.supports_random_features and k.supports_orthogonal_features
    bounds = [mc_bound(s, X.shape[0], M, K) for M in MS]
    # the test can fail: a Gaussian of the same lengthscales (alpha -> infinity) is far outside the last bound
    gauss = torch.as_tensor(s * rbf_kernel(X.numpy() / ls, gamma=0.5))
    assert float((gauss - K).norm() / K.norm()) > 5 * bounds[-1]
    errs = []
    for M, bound in zip(MS, bounds):
        e2 = mean_sq_error(lambda seed: make_feature_map(k, M, form=form, orthogonal=orthogonal, seed=seed), K)
        assert e2 <= bound**2, (M, e2, bound**2)
        errs.append(math.sqrt(e2))
    slope = np.polyfit(np.log(MS), np.log(errs), 1)[0]
    assert -0.7 < slope < -0.3, (errs, slope)


def test_active_dims_features_are_the_base_features_of_the_selected_columns():
    dims = [2, 0]
    k = ActiveDimsKernel(GaussianKernel(0.9, outputscale=2.0), dims)
    K = torch.as_tensor(2.0 * rbf_kernel(X.numpy()[:, dims], gamma=1 / (2 * 0.9**2)))
    fmap = make_feature_map(k, 64, seed=3)
    assert isinstance(fmap, ColumnsFeatureMap)
    base = make_feature_map(GaussianKernel(0.9, outputscale=2.0), 64, seed=3)
    assert torch.equal(fmap(X), base(X[:, dims]))
    for M in (1024, 16384):
        e2 = mean_sq_error(lambda seed: make_feature_map(k, M, seed=seed), K)
        assert e2 <= mc_bound(2.0, X.shape[0], M, K) ** 2
    torch.testing.assert_close(fmap.expected_gram(X, X), K, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="columns"):
        fmap(X[:, :2])


class ProductCauchyKernel(SpectralKernel):
    """A user's kernel: ``k(x, y) = s prod_k 1 / (1 + ((x_k - y_k) / l)^2)``. In one dimension
    ``int e^{i w t} e^{-|w|} / 2 dw = 1 / (1 + t^2)``, so its spectral density is a product of Laplace(0, 1 / l)
    coordinates. It is defined here, in a test, and reaches make_feature_map without any change there."""

    def __init__(self, l: float, outputscale: float = 1.0):
        self.l, self.outputscale = l, outputscale

    def __call__(self, X1, X2):
        D = (X1[:, None, :] - X2[None, :, :]) / self.l
        return self.outputscale / (1.0 + D * D).prod(-1)

    def spectral_frequencies(self, d, m, generator, *, orthogonal=False):
        u = torch.rand(d, m, generator=generator, dtype=torch.float64) - 0.5
        return -torch.sign(u) * torch.log1p(-2.0 * u.abs()) / self.l  # Laplace(0, 1 / l) by inversion


def test_a_new_kernel_with_a_spectral_density_plugs_in():
    k = ProductCauchyKernel(1.3, outputscale=0.8)
    Xn = X.numpy()
    D = (Xn[:, None, :] - Xn[None, :, :]) / 1.3
    K = torch.as_tensor(0.8 / (1.0 + D**2).prod(-1))  # the closed form, not the class's own evaluation
    for M in (1024, 16384):
        e2 = mean_sq_error(lambda seed: make_feature_map(k, M, seed=seed), K)
        assert e2 <= mc_bound(0.8, X.shape[0], M, K) ** 2
    with pytest.raises(ValueError, match="radial"):
        make_feature_map(k, 16, orthogonal=True)
    # in a sum (orthogonal features where a part allows them) and on selected columns
    s = k + GaussianKernel(1.0)
    fmap = make_feature_map(s, 4000, seed=1, orthogonal=True)
    assert isinstance(fmap, ConcatFeatureMap) and fmap.n_features == 4000
    Ks = K + torch.as_tensor(rbf_kernel(Xn, gamma=0.5))
    assert float((fmap(X) @ fmap(X).T - Ks).norm() / Ks.norm()) <= 3 * mc_bound(1.8, X.shape[0], 2000, Ks)
    assert make_feature_map(ActiveDimsKernel(k, [1]), 8, seed=0)(X).shape == (X.shape[0], 8)


def test_make_feature_map_asks_the_kernel():
    calls = []

    class Spy(Kernel):
        def random_features(self, n_features, **kw):
            calls.append((n_features, kw))
            return "the kernel's own map"

    out = make_feature_map(Spy(), 12, form="cos", orthogonal=True, seed=5, compute_dtype=torch.float32)
    assert out == "the kernel's own map"
    assert calls == [(12, dict(form="cos", orthogonal=True, seed=5, compute_dtype=torch.float32))]


def test_features_of_a_kernel_without_spectral_density_name_it_and_the_modes_that_work():
    lin = CallableKernel(lambda A, B: A @ B.T, name="my-linear")
    for kernel in (lin, GaussianKernel(1.0) + lin):
        with pytest.raises(ValueError, match="my-linear") as info:
            make_feature_map(kernel, 16)
        assert "nystrom" in str(info.value) and "exact" in str(info.value)
    with pytest.raises(TypeError, match="spectral density"):
        RandomFeatureMap(lin, 16)
    with pytest.raises(ValueError, match="spectral"):
        make_feature_map(object(), 16)


def test_sum_with_laplacian_l1_part_drops_orthogonality_for_that_part_only():
    k = GaussianKernel(1.0) + LaplacianL1Kernel(2.0)
    fmap = make_feature_map(k, 10, orthogonal=True, seed=0)
    assert [m.orthogonal for m in fmap.maps] == [True, False]
    with pytest.raises(ValueError, match="radial"):
        make_feature_map(StationaryKernel("laplacian_l1", 1.0), 10, orthogonal=True)
