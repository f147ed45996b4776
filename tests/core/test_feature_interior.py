"""The feature Newton engine's interior-point start for the kinked losses, against dense solves and cvxpy."""
import numpy as np
import pytest
import torch

from joker_ext.data import BlockData
from joker_ext.distributed import SingleProcess
from joker_ext.feature_interior import FeatureGram
from joker_ext.features import NystromFeatureMap, RandomFeatureMap
from joker_ext.interior_point import solve_box_qp
from joker_ext.kernels import GaussianKernel
from joker_ext.losses import get_loss
from joker_ext.operators import FeatureOperator
from joker_ext.primal_newton import _Passes, feature_newton
from joker_ext.solver import SolverOptions

from conftest import PARAMS, cvxpy_primal, make_binary, make_regression

F64 = torch.float64
KINKED = ["hinge", "absolute", "epsilon_insensitive", "pinball"]
STARTED = ["absolute", "epsilon_insensitive", "pinball"]  # zero lies in the middle of their boxes


def _setup(kind: str, name: str = "hinge", n: int = 400, M: int = 30, seed: int = 3):
    loss = get_loss(name, **PARAMS)
    X, y = (make_binary if loss.margin else make_regression)(n=n, seed=seed)
    Xt = torch.as_tensor(X)
    fmap = NystromFeatureMap(GaussianKernel(1.0), Xt[::n // M][:M]) if kind == "nystrom" else \
        RandomFeatureMap(GaussianKernel(1.0), M, seed=4)
    op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), chunk_rows=128)
    return loss, Xt, torch.as_tensor(y).reshape(-1, 1), fmap, op


def _gram(op, loss, Y, h):
    passes = _Passes(op, Y, loss, torch.ones_like(Y), SingleProcess(), cache=True)
    norms = passes.feature_norms()
    return FeatureGram(passes.kept_product, passes.transpose_product, passes.gram_factor, h, norms), norms


@pytest.mark.parametrize("kind", ["nystrom", "random"])
def test_feature_gram_products_and_solves_are_those_of_the_dense_matrix(kind):
    """``diag(Phi Phi^T)``, ``Q @ a`` and the Woodbury solve of ``(Q + D) x = r`` (through the kept features and the
    M x M factor) equal the formed ``Q = Phi Phi^T + diag(h)`` and ``torch.linalg.solve`` on it."""
    loss, Xt, Y, fmap, op = _setup(kind)
    n = Xt.shape[0]
    g = torch.Generator().manual_seed(1)
    h = torch.rand(n, generator=g, dtype=F64) * 0.1
    gram, norms = _gram(op, loss, Y, h)
    Phi = fmap(Xt)
    Q = Phi @ Phi.T + torch.diag(h)
    torch.testing.assert_close(norms, (Phi * Phi).sum(1), rtol=1e-12, atol=1e-12)
    a = torch.randn(n, generator=g, dtype=F64)
    torch.testing.assert_close(gram @ a, Q @ a, rtol=1e-12, atol=1e-12)
    D = torch.exp(torch.randn(n, generator=g, dtype=F64) * 2.0)  # barrier curvatures over a few decades
    R = torch.randn(n, 2, generator=g, dtype=F64)
    x = gram.factor(D).solve(R)
    torch.testing.assert_close(x, torch.linalg.solve(Q + torch.diag(D), R), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", KINKED)
def test_solve_box_qp_on_the_feature_gram_reaches_the_cvxpy_optimum(name):
    """The interior point with ``Q`` given as :class:`FeatureGram` (never formed) solves the dual of the feature
    problem: its objective is cvxpy's."""
    pytest.importorskip("cvxpy")
    loss, Xt, Y, fmap, op = _setup("nystrom", name)
    n = Xt.shape[0]
    c = torch.full((n,), 5.0, dtype=F64)
    y = Y[:, 0]
    zero = torch.zeros_like(y)
    lo, hi = loss.box(y, c)
    gram, _ = _gram(op, loss, Y, loss.psi_hess(zero, y, c))
    lin = y - loss.psi_grad(zero, y, c)
    a, _, iterations, converged = solve_box_qp(gram, lin, float(loss.kink), lo, hi, None, tol=1e-10)
    assert converged and iterations <= 40
    Phi = fmap(Xt)
    beta = Phi.T @ a
    dual = 0.5 * float(beta @ beta) + float(loss.conj(a, y, c).sum())
    # the dual's optimum is minus the primal's (strong duality): cvxpy solves the primal
    ref = cvxpy_primal(name, (Phi @ Phi.T).numpy(), y.numpy(), c.numpy())
    assert -dual == pytest.approx(ref, rel=1e-7)


@pytest.mark.parametrize("kind", ["nystrom", "random"])
@pytest.mark.parametrize("name", STARTED)
def test_kinked_fits_from_the_interior_point_end_at_the_cvxpy_optimum_within_twenty_iterations(name, kind):
    """Kept features, a kinked loss, a cold start, two target columns: the engine's first iterations are the interior
    point's (their records carry no smoothing; each advances both columns), it finishes on the active sets, and the
    fit is at cvxpy's optimum in at most 20 iterations (JokerFalkon's default ``maxiter``): 13-15 here, where the
    smoothing continuation alone takes 32-46."""
    pytest.importorskip("cvxpy")
    loss, Xt, Y, fmap, op = _setup(kind, name, n=600, M=40)
    Y = torch.cat([Y, -Y if loss.margin else torch.cos(2 * Y)], dim=1)
    c = torch.full((600,), 10.0, dtype=F64)
    res = feature_newton(op, Y, loss, c, SolverOptions(max_iter=20, tol=1e-10))
    assert res.status == "converged" and res.n_iter <= 20 and res.rel_gap <= 1e-10
    assert res.history[0]["smoothing"] == 0.0 and res.history[1]["smoothing"] == 0.0
    Phi = fmap(Xt)
    K = (Phi @ Phi.T).numpy()
    ref = sum(cvxpy_primal(name, K, Y[:, t].numpy(), c.numpy()) for t in range(2))
    assert res.primal == pytest.approx(ref, rel=1e-8)
    np.testing.assert_allclose((Phi @ res.state["beta"]).numpy(), (Phi @ (Phi.T @ res.alpha)).numpy(), atol=1e-9)


@pytest.mark.parametrize("quantile", [None, 0.9])
def test_boxes_far_from_zero_take_the_working_set_start(quantile, monkeypatch):
    """The hinge loss's boxes ``[0, C]`` (and the pinball loss's at quantile 0.9) would start the interior point far
    from zero, where it was measured to cost more iterations than it saves: the working-set engine on the features'
    linear kernel solves the fit instead, in one iteration of the fit (no smoothing), at cvxpy's optimum."""
    pytest.importorskip("cvxpy")
    import conftest

    name = "hinge" if quantile is None else "pinball"
    if quantile is not None:
        monkeypatch.setitem(conftest.PARAMS, "quantile", quantile)  # for the loss and for cvxpy's reference
    loss, Xt, Y, fmap, op = _setup("random", name, n=600, M=40)
    c = torch.full((600,), 10.0, dtype=F64)
    res = feature_newton(op, Y, loss, c, SolverOptions(max_iter=300, tol=1e-10))
    assert res.status == "converged" and res.n_iter == 1 and res.history[-1]["smoothing"] == 0.0
    Phi = fmap(Xt)
    assert res.primal == pytest.approx(cvxpy_primal(name, (Phi @ Phi.T).numpy(), Y[:, 0].numpy(), c.numpy()),
                                       rel=1e-8)


def test_a_gram_that_cannot_be_factored_is_retried_with_a_lower_cap():
    """Where ``I + Phi^T E Phi`` cannot be factored, ``E`` is capped 100x lower and factored again: the solve is then
    that of the capped system, ``(Phi Phi^T + max(D + h, floor))^{-1}`` formed densely."""
    loss, Xt, Y, fmap, op = _setup("random")
    n = Xt.shape[0]
    h = torch.zeros(n, dtype=F64)
    gram, _ = _gram(op, loss, Y, h)
    factor = gram.gram_factor
    calls = []

    def fails_once(w):
        calls.append(float(w.max()))
        return None if len(calls) == 1 else factor(w)

    gram.gram_factor = fails_once
    D = torch.full((n,), 1e-14, dtype=F64)  # below the floor: E is capped
    R = torch.randn(n, 1, generator=torch.Generator().manual_seed(2), dtype=F64)
    x = gram.factor(D).solve(R)
    assert len(calls) == 2 and calls[1] == pytest.approx(calls[0] / 100.0)
    Phi = fmap(Xt)
    capped = torch.full((n,), 100.0 * gram.floor, dtype=F64)
    # (a capped E of 1e7 / mean diag costs the Woodbury form a few digits: 4e-6 relative here)
    ref = torch.linalg.solve(Phi @ Phi.T + torch.diag(capped), R)
    assert float((x - ref).norm() / ref.norm()) <= 1e-4


def test_nystrom_hessian_of_a_wide_kernel_is_factored_as_formed_from_the_features():
    """Nystrom features of a wide kernel (``K_ZZ`` near singular) with curvatures of 1e4, as the smoothed kinked
    losses have at small penalties: ``I + Phi^T W Phi`` is factored without a shift, and ``L L^T`` equals that matrix
    formed from the map's own features ``Phi = fmap(X)``. Formed as ``R^{-T} (G^T W G) R^{-1}``, the rounding of
    ``G^T W G`` times ``|R^{-1}|^2`` made it indefinite: its factorisation failed and the Newton steps of such fits
    went unpreconditioned."""
    n, M = 2000, 300
    Xt = torch.as_tensor(np.random.default_rng(0).standard_normal((n, 6)))
    fmap = NystromFeatureMap(GaussianKernel(7.0), Xt[:M])
    assert float(torch.linalg.eigvalsh(fmap.kernel(Xt[:M], Xt[:M])).min()) < 1e-8  # near singular
    op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), chunk_rows=256)
    loss = get_loss("absolute")
    Y = torch.zeros(n, 1, dtype=F64)
    passes = _Passes(op, Y, loss, torch.ones_like(Y), SingleProcess(), cache=True)
    W = torch.full((n, 1), 1e4, dtype=F64)
    W[::3] = 0.0  # a band: the rows without curvature are left out
    hessian = passes.exact_hessian(W, 0, shift=False)
    assert hessian.L is not None
    Phi = fmap(Xt)
    P = torch.eye(M, dtype=F64) + Phi.T @ (W * Phi)
    torch.testing.assert_close(hessian.L @ hessian.L.T, P, rtol=1e-9, atol=1e-9 * float(P.diagonal().max()))
