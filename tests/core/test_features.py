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
