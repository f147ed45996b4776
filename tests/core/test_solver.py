"""DBCD-TR against independent references: cvxpy on the primal, closed forms, duality."""
import math
import time

import numpy as np
import pytest
import torch

from joker_ext.data import BlockData
from joker_ext.features import make_feature_map
from joker_ext.kernels import GaussianKernel, LaplacianKernel
from joker_ext.losses import get_loss
from joker_ext.model import fit_dual
from joker_ext.operators import ExactOperator
from joker_ext.solver import SolverOptions, dbcd_tr

from conftest import PARAMS, cvxpy_primal, make_binary, make_regression

pytest.importorskip("cvxpy")

LOSSES = ["squared", "huber", "epsilon_insensitive", "absolute", "pinball", "hinge", "squared_hinge", "logistic"]
F64 = torch.float64


def problem(loss, n=100, seed=0):
    X, y = (make_binary if loss.margin else make_regression)(n=n, seed=seed)
    return X, y


def solve(loss_name, X, y, c, kernel, **opts):
    loss = get_loss(loss_name, **PARAMS)
    solver = opts.pop("solver", "auto")
    o = SolverOptions(block_size=opts.pop("block_size", len(y)), max_iter=opts.pop("max_iter", 500), tol=1e-13, **opts)
    return fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=torch.as_tensor(c),
                    kernel=kernel, options=o, dtype=F64, solver=solver)


@pytest.mark.parametrize("loss_name", LOSSES)
def test_primal_matches_cvxpy_and_gap_closes(loss_name):
    loss = get_loss(loss_name, **PARAMS)
    X, y = problem(loss)
    c = np.random.default_rng(1).uniform(0.5, 4.0, len(y))  # sample weights too
    kernel = GaussianKernel(0.7)
    model = solve(loss_name, X, y, c, kernel)
    res = model.result
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    ref = cvxpy_primal(loss_name, K, y, c)
    # primal of the returned model, recomputed here from alpha
    a = model.alpha.numpy()[:, 0]
    f = K @ a
    P = 0.5 * a @ K @ a + float((torch.as_tensor(c) * loss.value(torch.as_tensor(y), torch.as_tensor(f))).sum())
    assert P == pytest.approx(ref, rel=1e-6)
    assert res.rel_gap < 1e-8
    assert res.gap >= 0


def test_squared_loss_equals_closed_form():
    X, y = make_regression(n=150)
    C = 5.0
    kernel = LaplacianKernel(1.3)
    model = solve("squared", X, y, np.full(150, C), kernel)
    K = kernel(torch.as_tensor(X), torch.as_tensor(X)).numpy()
    alpha = np.linalg.solve(K + np.eye(150) / C, y)
    np.testing.assert_allclose(model.alpha.numpy()[:, 0], alpha, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("loss_name", ["squared", "hinge", "logistic", "epsilon_insensitive"])
def test_gap_never_negative_and_dual_never_increases(loss_name):
    loss = get_loss(loss_name, **PARAMS)
    X, y = problem(loss, n=160)
    kernel = GaussianKernel(1.0)
    Xt = torch.as_tensor(X)
    K = kernel(Xt, Xt)
    Y = torch.as_tensor(y).reshape(-1, 1)
    c = torch.full((160,), 2.0, dtype=F64)
    duals, gaps = [], []

    def cb(info):
        a = info["alpha"]
        D = 0.5 * float(a[:, 0] @ K @ a[:, 0]) + float(loss.conj(a, Y, c.reshape(-1, 1)).sum())
        duals.append(D)
        gaps.append(info["gap"])

    op = ExactOperator(kernel, BlockData(Xt, F64, torch.device("cpu")))
    dbcd_tr(op, Y, loss, c, SolverOptions(block_size=40, max_iter=120, tol=0.0, callback_every=1), callback=cb)
    assert len(duals) == 120
    assert min(gaps) >= 0
    inc = np.diff(duals)
    assert np.all(inc <= 1e-10 * np.abs(duals[:-1]).max()), inc.max()
    assert duals[-1] < duals[0]


def test_many_blocks_converge_to_single_block_solution():
    X, y = make_binary(n=200)
    kernel = GaussianKernel(0.8)
    c = np.full(200, 1.0)
    one = solve("hinge", X, y, c, kernel)
    many = solve("hinge", X, y, c, kernel, block_size=32, max_iter=4000, block_selection="cyclic")
    assert many.result.rel_gap < 1e-6
    f1 = one.decision(torch.as_tensor(X))
    f2 = many.decision(torch.as_tensor(X))
    assert float((f1 - f2).norm() / f1.norm()) < 1e-3


def test_multi_output_equals_separate_fits_with_per_target_radii():
    X, y1 = make_regression(n=120, seed=0)
    y2 = 10.0 * np.cos(X[:, 1])  # a different scale: per-target radii matter
    Y = np.column_stack([y1, y2])
    kernel = GaussianKernel(1.0)
    loss = get_loss("huber", delta=0.5)
    c = torch.full((120,), 3.0, dtype=F64)
    o = SolverOptions(block_size=120, max_iter=300, tol=1e-13)
    both = fit_dual(torch.as_tensor(X), torch.as_tensor(Y), loss=loss, c=c, kernel=kernel, options=o)
    for j in range(2):
        sep = fit_dual(torch.as_tensor(X), torch.as_tensor(Y[:, j : j + 1]), loss=loss, c=c, kernel=kernel, options=o)
        np.testing.assert_allclose(both.alpha[:, j].numpy(), sep.alpha[:, 0].numpy(), rtol=1e-6, atol=1e-8)


def test_sample_weight_two_equals_duplicated_row():
    X, y = make_regression(n=60)
    kernel = GaussianKernel(1.0)
    w = np.ones(60)
    w[:10] = 2.0
    m1 = solve("epsilon_insensitive", X, y, 1.5 * w, kernel)
    Xd = np.vstack([X, X[:10]])
    yd = np.concatenate([y, y[:10]])
    m2 = solve("epsilon_insensitive", Xd, yd, np.full(70, 1.5), kernel)
    Xt = torch.as_tensor(X)
    np.testing.assert_allclose(m1.decision(Xt).numpy(), m2.decision(Xt).numpy(), rtol=1e-6, atol=1e-7)


def test_warm_start_from_solution_stops_at_once():
    X, y = make_binary(n=100)
    kernel = GaussianKernel(1.0)
    c = np.full(100, 2.0)
    first = solve("squared_hinge", X, y, c, kernel)
    loss = get_loss("squared_hinge")
    again = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=torch.as_tensor(c),
                     kernel=kernel, options=SolverOptions(block_size=100, max_iter=50, tol=1e-10),
                     alpha0=first.alpha)
    assert again.result.n_iter <= 1
    assert again.result.status == "converged"


@pytest.mark.parametrize("loss_name", ["squared", "hinge"])
def test_random_feature_models_converge_to_exact_model(loss_name):
    loss = get_loss(loss_name)
    X, y = problem(loss, n=150)
    kernel = GaussianKernel(1.2)
    c = np.full(150, 2.0)
    exact = solve(loss_name, X, y, c, kernel)
    Xt = torch.as_tensor(X)
    f_exact = exact.decision(Xt)
    errs = []
    for M in (64, 512, 4096):
        errs.append(np.mean([
            float((fit_dual(Xt, torch.as_tensor(y).reshape(-1, 1), loss=loss, c=torch.as_tensor(c), kernel=kernel,
                            feature_map=make_feature_map(kernel, M, seed=s),
                            options=SolverOptions(block_size=150, max_iter=300, tol=1e-12)).decision(Xt)
                   - f_exact).norm() / f_exact.norm())
            for s in range(3)
        ]))
    assert errs[0] > errs[1] > errs[2]
    assert errs[2] < 0.1


def test_feature_mode_gap_closes_in_feature_space():
    X, y = make_binary(n=300)
    kernel = GaussianKernel(1.0)
    fmap = make_feature_map(kernel, 100, seed=0)
    m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=get_loss("logistic"),
                 c=torch.full((300,), 1.0, dtype=F64), kernel=kernel, feature_map=fmap,
                 options=SolverOptions(block_size=100, max_iter=3000, tol=1e-9), solver="dbcd_tr")
    assert m.result.status == "converged"
    # DBCD-TR keeps beta equal to Phi^T alpha, recomputed independently
    Phi = fmap(torch.as_tensor(X))
    np.testing.assert_allclose(m.beta.numpy(), (Phi.T @ m.alpha).numpy(), rtol=1e-8, atol=1e-10)


def test_float32_logistic_near_box_edges_stays_finite():
    X, y = make_binary(n=200)
    # huge C and a narrow kernel push many dual variables to the box edges
    kernel = GaussianKernel(0.3)
    m = fit_dual(torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32).reshape(-1, 1),
                 loss=get_loss("logistic"), c=torch.full((200,), 1e4), kernel=kernel,
                 options=SolverOptions(block_size=100, max_iter=100, tol=1e-6), dtype=torch.float32)
    assert torch.all(torch.isfinite(m.alpha))
    assert math.isfinite(m.result.gap) and m.result.gap >= 0
    f = m.decision(torch.as_tensor(X, dtype=torch.float32))
    assert torch.all(torch.isfinite(f))
    assert float((torch.sign(f[:, 0]) == torch.as_tensor(y, dtype=torch.float32)).float().mean()) > 0.95


def test_time_budget_and_callback_stop():
    X, y = make_regression(n=400)
    kernel = GaussianKernel(1.0)
    t0 = time.perf_counter()
    # DBCD-TR: the second-order engines solve this problem to its rounding floor within the budget
    m = solve("hinge", X, np.sign(y - np.median(y)), np.full(400, 1e3), kernel, block_size=20, max_iter=10**6,
              max_time=0.5, solver="dbcd_tr")
    assert m.result.status == "max_time"
    assert time.perf_counter() - t0 < 5
    calls = []
    op = ExactOperator(kernel, BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    res = dbcd_tr(op, torch.as_tensor(y).reshape(-1, 1), get_loss("squared"), torch.full((400,), 1e3, dtype=F64),
                  SolverOptions(block_size=20, max_iter=100, tol=0.0, callback_every=3),
                  callback=lambda info: calls.append(info["iteration"]) or len(calls) >= 4)
    assert calls == [3, 6, 9, 12] and res.status == "callback" and res.n_iter == 12


def test_keyboard_interrupt_keeps_a_consistent_model():
    X, y = make_regression(n=200)
    kernel = GaussianKernel(1.0)
    op = ExactOperator(kernel, BlockData(torch.as_tensor(X), F64, torch.device("cpu")))

    def cb(info):
        if info["iteration"] == 5:
            raise KeyboardInterrupt

    with pytest.warns(RuntimeWarning, match="interrupted"):
        res = dbcd_tr(op, torch.as_tensor(y).reshape(-1, 1), get_loss("squared"), torch.full((200,), 10.0, dtype=F64),
                      SolverOptions(block_size=50, max_iter=100, tol=0.0, callback_every=1), callback=cb)
    assert res.status == "interrupted" and res.n_iter == 5
    K = kernel(torch.as_tensor(X), torch.as_tensor(X))
    np.testing.assert_allclose(res.state["f"].numpy(), (K @ res.alpha).numpy(), rtol=1e-10, atol=1e-10)
