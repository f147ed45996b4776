"""Feature mode: every block model ('gram', 'kernel', 'products') solves the same random-feature problem.

The 'kernel' model uses the kernel's K_BB in the trust-region model instead of Phi_B Phi_B^T (and, for
the squared loss, preconditioned CG on the true block matrix). References: cvxpy on the random-feature
primal (as a kernel problem with K = Phi Phi^T), the closed-form ridge solution in feature space,
and the dual recomputed from alpha with Phi.
"""
import numpy as np
import pytest
import torch

from joker_ext.data import BlockData
from joker_ext.features import NystromFeatureMap, make_feature_map
from joker_ext.kernels import GaussianKernel, MaternKernel
from joker_ext.losses import get_loss
from joker_ext.model import fit_dual
from joker_ext.operators import FeatureOperator
from joker_ext.solver import SolverOptions, dbcd_tr

from conftest import PARAMS, cvxpy_primal, make_binary, make_regression

pytest.importorskip("cvxpy")

LOSSES = ["squared", "huber", "epsilon_insensitive", "absolute", "pinball", "hinge", "squared_hinge", "logistic"]
F64 = torch.float64


# Degenerate duals (linear conjugate, many coordinates at the kinks) close their gap slowly by block
# coordinate descent with any block model; they are solved here with one block.
DEGENERATE = ("absolute", "pinball", "epsilon_insensitive")
CASES = [(loss, model) for loss in LOSSES for model in ("kernel", "gram")] + \
    [(loss, "products") for loss in ("squared", "hinge", "logistic")]


@pytest.mark.parametrize("loss_name,block_model", CASES)
def test_every_block_model_reaches_the_random_feature_optimum(loss_name, block_model):
    loss = get_loss(loss_name, **PARAMS)
    X, y = (make_binary if loss.margin else make_regression)(n=120, d=2)
    kernel = GaussianKernel(1.0)
    fmap = make_feature_map(kernel, 256, seed=1)  # M = 256 > 8 d: "auto" would pick "kernel"
    c = np.full(120, 2.0)
    model = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=torch.as_tensor(c),
                     kernel=kernel, feature_map=fmap, block_model=block_model,
                     options=SolverOptions(block_size=120 if loss_name in DEGENERATE else 40, max_iter=1500, tol=1e-9))
    Phi = fmap(torch.as_tensor(X)).numpy()
    ref = cvxpy_primal(loss_name, Phi @ Phi.T, y, c)
    assert model.result.rel_gap <= 1e-8, model.result.rel_gap
    assert abs(model.result.primal - ref) <= 1e-6 * abs(ref)


def test_kernel_model_squared_loss_equals_feature_space_ridge():
    X, y = make_regression(n=200, d=3)
    kernel = MaternKernel(1.3, nu=1.5)
    fmap = make_feature_map(kernel, 300, seed=0)
    C = 5.0
    model = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("squared"),
                     c=torch.full((200,), C, dtype=F64), kernel=kernel, feature_map=fmap, block_model="kernel",
                     options=SolverOptions(block_size=50, max_iter=3000, tol=1e-12))
    Phi = fmap(torch.as_tensor(X)).numpy()
    # primal ridge in feature space: (Phi^T Phi + I / C) w = Phi^T y
    w = np.linalg.solve(Phi.T @ Phi + np.eye(Phi.shape[1]) / C, Phi.T @ y)
    assert model.result.status == "converged"
    np.testing.assert_allclose(model.beta.numpy()[:, 0], w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss_name", ["squared", "hinge", "logistic", "huber"])
def test_kernel_model_never_increases_the_random_feature_dual(loss_name):
    loss = get_loss(loss_name, **PARAMS)
    X, y = (make_binary if loss.margin else make_regression)(n=160, d=2)
    kernel = GaussianKernel(0.7)
    fmap = make_feature_map(kernel, 40, seed=3)  # few features: the kernel model is far from Phi Phi^T
    Xt = torch.as_tensor(X)
    Phi = fmap(Xt)
    Y = torch.as_tensor(y).reshape(-1, 1)
    c = torch.full((160,), 20.0, dtype=F64)
    duals = []

    def cb(info):
        a = info["alpha"]
        u = Phi.T @ a
        duals.append(0.5 * float((u * u).sum()) + float(loss.conj(a, Y, c.reshape(-1, 1)).sum()))

    op = FeatureOperator(fmap, BlockData(Xt, F64, torch.device("cpu")), block_model="kernel")
    dbcd_tr(op, Y, loss, c, SolverOptions(block_size=40, max_iter=150, tol=0.0, callback_every=1), callback=cb)
    inc = np.diff(duals)
    assert np.all(inc <= 1e-10 * np.abs(duals).max()), inc.max()
    assert duals[-1] < duals[0]


def test_auto_picks_the_kernel_model_only_for_unbiased_maps():
    X = torch.randn(50, 3, dtype=F64)
    kernel = GaussianKernel(1.0)
    data = BlockData(X, F64, torch.device("cpu"))
    many = FeatureOperator(make_feature_map(kernel, 100), data)
    few = FeatureOperator(make_feature_map(kernel, 20), data)
    nys = FeatureOperator(NystromFeatureMap(kernel, X[:30]), data)
    assert many._model_for(X[:10]) == "gram"  # outside the solver: always an exact model
    for op in (many, few, nys):
        op.prepare(newton_steps=True)
    assert many._model_for(X[:10]) == "kernel"
    assert many._model_for(torch.cat([X, X])[:60]) == "gram"  # b > M / 2: Phi_B Phi_B^T is far from K_BB
    assert few._model_for(X[:10]) == "gram"  # M <= 8 d
    assert nys._model_for(X[:10]) == "gram"
    # the solver tells the operator when its loss takes trust-region (not Newton) steps
    dbcd_tr(many, torch.ones(50, 1, dtype=F64), get_loss("hinge"), torch.ones(50, dtype=F64),
            SolverOptions(block_size=10, max_iter=1))
    assert many._model_for(X[:10]) == "gram"
    dbcd_tr(many, torch.ones(50, 1, dtype=F64), get_loss("squared"), torch.ones(50, dtype=F64),
            SolverOptions(block_size=10, max_iter=1))
    assert many._model_for(X[:10]) == "kernel"
    with pytest.raises(ValueError, match="block_model"):
        FeatureOperator(make_feature_map(kernel, 100), data, block_model="fast")
    with pytest.raises(ValueError, match="block_model='kernel'"):
        FeatureOperator(NystromFeatureMap(kernel, X[:30]), data, block_model="kernel")


def test_newton_steps_in_float32_at_large_C_with_duplicated_rows():
    """K_BB + I/C is singular in float32 here (C = 1e6, duplicated rows): the preconditioner is shifted,
    the Newton steps still decrease the true dual, and as fast as the exact model does in float64."""
    X, y = make_regression(n=200, d=2)
    X = np.concatenate([X[:100], X[:100]])  # every row twice
    y = np.concatenate([y[:100], y[:100] + 0.05])
    kernel = GaussianKernel(1.0)
    fmap = make_feature_map(kernel, 400, seed=0)
    C = 1e6
    Xt, Yt = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32).reshape(-1, 1)
    op = FeatureOperator(fmap, BlockData(Xt, torch.float32, torch.device("cpu")))
    Phi = fmap(torch.as_tensor(X)).double()
    duals = []

    def cb(info):
        a = info["alpha"].double()
        u = Phi.T @ a
        duals.append(0.5 * float((u * u).sum()) + float((a * a).sum() / (2 * C) - (a * Yt.double()).sum()))

    res = dbcd_tr(op, Yt, get_loss("squared"), torch.full((200,), C), callback=cb,
                  options=SolverOptions(block_size=50, max_iter=400, tol=0.0, callback_every=1, max_cg=200))
    assert op._model_for(Xt[:50]) == "kernel"
    inc = np.diff(duals)
    assert np.all(inc <= 1e-5 * np.abs(duals).max()), inc.max()  # float32 rounding of the recomputed dual
    # as much progress as the exact model (Phi_B Phi_B^T formed, trust-region steps) makes in float64
    exact = []
    op64 = FeatureOperator(fmap, BlockData(Xt.double(), F64, torch.device("cpu")), block_model="gram")
    dbcd_tr(op64, Yt.double(), get_loss("squared"), torch.full((200,), C, dtype=F64), callback=lambda i: exact.append(
        0.5 * float((i["state"]["beta"] ** 2).sum()) + float((i["alpha"] ** 2).sum() / (2 * C) -
                                                             (i["alpha"] * Yt.double()).sum())),
        options=SolverOptions(block_size=50, max_iter=400, tol=0.0, callback_every=1))
    assert duals[-1] <= 0.9 * exact[-1] < 0


def test_newton_steps_with_several_targets_and_sample_weights():
    X, y = make_regression(n=150, d=3)
    Y = np.stack([y, np.cos(X[:, 1]), -2 * y], axis=1)
    kernel = GaussianKernel(1.1)
    fmap = make_feature_map(kernel, 300, seed=2)
    c = np.random.default_rng(0).uniform(0.2, 2.0, 150)
    model = fit_dual(torch.as_tensor(X), torch.as_tensor(Y), loss=get_loss("squared"), c=torch.as_tensor(c),
                     kernel=kernel, feature_map=fmap, options=SolverOptions(block_size=50, max_iter=2000, tol=1e-10))
    assert model.result.status == "converged"
    Phi = fmap(torch.as_tensor(X)).numpy()
    # dual optimum: (Phi Phi^T + diag(1 / c)) alpha = Y, per target
    alpha = np.linalg.solve(Phi @ Phi.T + np.diag(1.0 / c), Y)
    np.testing.assert_allclose(model.alpha.numpy(), alpha, rtol=1e-4, atol=1e-5 * np.abs(alpha).max())


def test_block_model_policy_decides_matrix_newton_and_direct_solve():
    from joker_ext.defaults import DIRECT_MAX, GRAM_MAX, SINGULAR_DIRECT_MAX
    from joker_ext.operators import block_model

    # feature blocks: the exact model forms Phi_B Phi_B^T up to GRAM_MAX rows, products above
    assert block_model(GRAM_MAX, requested="exact").matrix == "gram"
    assert block_model(GRAM_MAX + 1, requested="exact").matrix == "products"
    # 'auto' takes the kernel's block only for Newton losses with wide, unbiased features
    assert block_model(10, newton_steps=True, wide=True, kernel_ok=True).matrix == "kernel"
    for kw in (dict(newton_steps=False, wide=True, kernel_ok=True), dict(newton_steps=True, wide=False, kernel_ok=True),
               dict(newton_steps=True, wide=True, kernel_ok=False)):
        assert block_model(10, **kw).matrix == "gram"
    # Newton steps need the kernel model and a strictly convex quadratic
    assert block_model(10, matrix="kernel", newton_steps=True, positive_curvature=True).newton
    assert not block_model(10, matrix="kernel", newton_steps=True, positive_curvature=False).newton
    assert not block_model(10, matrix="gram", newton_steps=True, positive_curvature=True).newton
    # direct solve: formed matrices up to DIRECT_MAX rows; singular ones (no curvature) only up to SINGULAR_DIRECT_MAX
    assert block_model(DIRECT_MAX, matrix="gram", positive_curvature=True).direct
    assert not block_model(DIRECT_MAX + 1, matrix="gram", positive_curvature=True).direct
    assert block_model(SINGULAR_DIRECT_MAX, matrix="gram").direct
    assert not block_model(SINGULAR_DIRECT_MAX + 1, matrix="gram").direct
    assert not block_model(10, matrix="products", positive_curvature=True).direct
    assert not block_model(10, matrix="gram", positive_curvature=True, subproblem="cg").direct
    assert block_model(10, matrix="products", subproblem="direct").direct
    with pytest.raises(ValueError, match="block_model"):
        block_model(10, requested="fast")


@pytest.mark.parametrize("loss_name,b,direct", [("hinge", 520, False), ("hinge", 500, True), ("squared", 520, True)])
def test_large_singular_blocks_are_solved_by_cg_not_eigendecomposition(monkeypatch, loss_name, b, direct):
    """The policy seen from outside: which subproblem solver a DBCD-TR iteration on an exact kernel calls."""
    import joker_ext.solver as solver

    calls = {"direct": 0, "cg": 0}
    real_direct, real_cg = solver._direct_subspace, solver.cg_steihaug

    def count(name, fn):
        def wrapped(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(solver, "_direct_subspace", count("direct", real_direct))
    monkeypatch.setattr(solver, "cg_steihaug", count("cg", real_cg))
    loss = get_loss(loss_name)
    X, y = (make_binary if loss.margin else make_regression)(n=b, d=2)
    from joker_ext.operators import ExactOperator

    op = ExactOperator(GaussianKernel(1.0), BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    res = dbcd_tr(op, torch.as_tensor(y, dtype=F64).reshape(-1, 1), loss, torch.ones(b, dtype=F64),
                  SolverOptions(block_size=b, max_iter=2, tol=0.0))
    assert res.n_iter == 2
    assert (calls["direct"] > 0) == direct and (calls["cg"] > 0) == (not direct)
