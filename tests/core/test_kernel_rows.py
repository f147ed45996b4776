"""The compiled kernel rows (joker_ext.kernel_rows) against extended-precision references of the same formulas."""
import math

import numpy as np
import pytest
import torch

from joker_ext.kernel_rows import EXP_FLOOR, exp_nonpositive, form_row, row_former
from joker_ext.kernels import (CallableKernel, GaussianKernel, LaplacianKernel, LaplacianL1Kernel, MaternKernel,
                               RationalQuadraticKernel)
from joker_ext.smo import smo_available

pytestmark = pytest.mark.skipif(not smo_available(), reason="numba is not installed")


def _ulps(value: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|value - exact| in units of the last place of ``exact`` (extended precision), normal results only."""
    exact64 = exact.astype(np.float64)
    return (np.abs(value.astype(np.longdouble) - exact) / np.spacing(np.abs(exact64))).astype(np.float64)


def test_exp_nonpositive_is_within_one_ulp_of_the_exponential():
    """Against numpy's exponential in extended precision (80-bit on x86, 64-bit mantissa), over [-708, 0] (random
    and at the ends of the reduction intervals, k ln 2 / 2); below -708 it returns 0 (the true value is subnormal,
    under 3.3e-308)."""
    if np.finfo(np.longdouble).nmant < 63:
        pytest.skip("no extended precision on this platform")
    rng = np.random.default_rng(0)
    x = np.concatenate([-rng.random(200_000) * 708.0, -rng.random(50_000) * 1e-3, -np.arange(0, 1022) * math.log(2) / 2,
                        [0.0, -0.0, -5e-324, -1e-300, -1e-17, EXP_FLOOR]])
    out, scratch = np.empty_like(x), np.empty_like(x)
    exp_nonpositive(x, out, scratch)
    exact = np.exp(x.astype(np.longdouble))
    assert _ulps(out, exact).max() <= 1.0
    assert np.all(out[x == 0.0] == 1.0)
    tiny = np.array([-708.5, -745.2, -1e4, -np.inf])
    exp_nonpositive(tiny, out[:4], scratch[:4])
    assert out[:4].tolist() == [0.0] * 4


def _reference_rows(kernel, X: np.ndarray, rows) -> np.ndarray:
    """k(x_i, X) in extended precision, from the kernels' table (the module docstring of joker_ext.kernels)."""
    sigma = np.asarray(kernel.sigma, dtype=np.longdouble).reshape(-1)
    P = X.astype(np.longdouble) / sigma
    diff = P[rows][:, None, :] - P[None, :, :]
    if kernel.family == "laplacian_l1":
        r = np.abs(diff).sum(-1)
        value = np.exp(-r)
    else:
        r2 = (diff * diff).sum(-1)
        if kernel.family == "gaussian":
            value = np.exp(-r2 / 2)
        else:
            t = np.sqrt(np.longdouble(2 * kernel.nu)) * np.sqrt(r2)
            poly = {0.5: 1.0, 1.5: 1 + t, 2.5: 1 + t + t * t / 3}[kernel.nu]
            value = poly * np.exp(-t)
    return kernel.outputscale * value


@pytest.mark.parametrize("d", [1, 4, 30])
@pytest.mark.parametrize("kernel", [GaussianKernel(0.9), GaussianKernel([0.5, 1.0, 2.0, 4.0] * 30, outputscale=2.5),
                                    LaplacianKernel(1.7), LaplacianL1Kernel(3.0), MaternKernel(1.2, nu=1.5),
                                    MaternKernel(0.8, nu=2.5, outputscale=0.3)], ids=lambda k: f"{k.family}-{k.nu}")
def test_form_row_matches_the_kernel_in_extended_precision(kernel, d):
    """Every family, a bandwidth per dimension and an output scale: each formed row within a few units of rounding
    of the exact value where that is above 1e-300 (relative ``8 eps (1 + |log k / s|)``: the exponential passes on
    the rounding of its argument times the argument), its diagonal exactly the output scale, and within 1e-13 of
    the kernel's own torch blocks (which use the Gram form of the distances); the former's points are ``x / sigma``
    to the last bit."""
    if np.finfo(np.longdouble).nmant < 63:
        pytest.skip("no extended precision on this platform")
    if kernel.is_ard:
        kernel = kernel.with_sigma(kernel.sigma[:d])
    rng = np.random.default_rng(d)
    X = rng.standard_normal((300, d)) * 1.5
    X[7] = X[3]  # a duplicate: distance exactly zero
    Xt = torch.as_tensor(X)
    former = row_former(kernel, Xt)
    rows = [0, 3, 7, 299]
    exact = _reference_rows(kernel, X, rows)
    torch_rows = kernel(Xt[rows], Xt).numpy()
    row = np.empty(300)
    for r, i in enumerate(rows):
        form_row(former.points, former.family, former.scale, i, row, former.scratch)
        value = exact[r].astype(np.float64)
        big = value > 1e-300
        rel = np.abs(row[big] - value[big]) / value[big]
        assert np.all(rel <= 8 * np.finfo(np.float64).eps * (1 + np.abs(np.log(value[big] / kernel.outputscale))))
        assert row[i] == kernel.outputscale
        assert np.abs(row - torch_rows[r]).max() <= 1e-13 * kernel.outputscale
    # the points by dimension: numpy's quotients x / sigma (correctly rounded), transposed
    np.testing.assert_array_equal(former.points, (X / kernel.sigma.numpy()).T)
    assert former.points.shape == (d, 300) and former.points.flags.c_contiguous


def test_row_former_refuses_bandwidths_of_another_length_as_the_kernel_does():
    """A vector of bandwidths whose length is not the inputs' dimension: the former raises the kernel's own error
    (it names sigma and both lengths), not a broadcasting error."""
    X = torch.randn(20, 3, dtype=torch.float64)
    kernel = GaussianKernel([0.5, 1.0])
    for call in (lambda: kernel.scale_inputs(X), lambda: row_former(kernel, X)):
        with pytest.raises(ValueError, match="sigma has 2 entries but the data have 3 features"):
            call()


def test_row_former_declines_kernels_it_cannot_form():
    """Kernels other than the stationary families (a callable, a rational quadratic, a sum) keep the blocks."""
    X = torch.randn(20, 3, dtype=torch.float64)
    for kernel in (CallableKernel(GaussianKernel(1.0)), RationalQuadraticKernel(1.0, alpha=2.0),
                   GaussianKernel(1.0) + LaplacianKernel(2.0)):
        assert row_former(kernel, X) is None
