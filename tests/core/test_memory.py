"""Memory estimates, budgets, and recovery from a block that does not fit."""
import numpy as np
import pytest
import torch

from joker_ext.features import make_feature_map
from joker_ext.kernels import GaussianKernel
from joker_ext.losses import get_loss
from joker_ext.memory import estimate_fit_memory, parse_memory, plan_blocks
from joker_ext.model import fit_dual
from joker_ext.solver import SolverOptions

from conftest import make_regression


def test_parse_memory_units_and_errors():
    assert parse_memory("2GB") == 2 * 1024**3
    assert parse_memory("512 mb") == 512 * 1024**2
    assert parse_memory(1000) == 1000
    for bad in ("lots", "-1GB", 0, -5, True):
        with pytest.raises((ValueError, TypeError), match="max_memory"):
            parse_memory(bad)


def test_estimate_counts_the_block_and_feature_matrices():
    est = estimate_fit_memory(10_000, 10, 1, n_features=2000, block_size=1000, itemsize=4)
    # the block's features alone: 2 x 1000 x 2000 float32
    assert est.per_block >= 2 * 1000 * 2000 * 4
    assert est.model >= 2000 * 4
    exact = estimate_fit_memory(10_000, 10, 1, block_size=1000, itemsize=8)
    assert exact.per_block >= 1000 * 1000 * 8


def test_plan_blocks_fits_the_budget_and_refuses_impossible_ones():
    b, r, est = plan_blocks("64MB", 100_000, 20, 1, n_features=4096, block_size=2048, itemsize=4)
    assert est.total <= 64 * 2**20 and b >= 1
    assert b < 2048
    with pytest.raises(ValueError, match="max_memory"):
        plan_blocks(1000, 100_000, 20, 1, n_features=4096)


class FlakyFeatures:
    """A feature map that runs out of memory on blocks larger than ``limit`` rows."""

    def __init__(self, inner, limit):
        self.inner, self.limit, self.n_features = inner, limit, inner.n_features

    def __call__(self, X):
        if X.shape[0] > self.limit:
            raise torch.OutOfMemoryError("simulated: not enough memory for this block")
        return self.inner(X)


def test_block_that_does_not_fit_is_shrunk_with_a_warning_and_the_fit_completes():
    X, y = make_regression(n=400)
    kernel = GaussianKernel(1.0)
    fmap = make_feature_map(kernel, 64, seed=0)
    Xt, Y = torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1)
    C = 1.0
    c = torch.full((400,), C, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="did not fit"):
        m = fit_dual(Xt, Y, loss=get_loss("squared"), c=c, kernel=kernel, feature_map=FlakyFeatures(fmap, 120),
                     options=SolverOptions(block_size=400, max_iter=3000, tol=1e-11), chunk_rows=100,
                     solver="dbcd_tr")
    assert m.result.status == "converged"
    # closed form in feature space: beta = (Phi^T Phi + I / C)^-1 Phi^T y
    Phi = fmap(Xt)
    beta = torch.linalg.solve(Phi.T @ Phi + torch.eye(64, dtype=torch.float64) / C, Phi.T @ Y)
    np.testing.assert_allclose(m.beta.numpy(), beta.numpy(), rtol=1e-4, atol=1e-6)


def test_max_memory_budget_reduces_the_block_with_a_warning():
    X, y = make_regression(n=3000, d=5)
    with pytest.warns(RuntimeWarning, match="block_size reduced"):
        m = fit_dual(torch.as_tensor(X), torch.as_tensor(y), loss=get_loss("squared"),
                     c=torch.full((3000,), 1.0, dtype=torch.float64), kernel=GaussianKernel(1.0),
                     options=SolverOptions(block_size=3000, max_iter=20), max_memory="40MB")
    assert torch.all(torch.isfinite(m.alpha))
