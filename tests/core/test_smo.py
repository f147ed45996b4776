"""The SMO phase (joker_ext.smo) against cvxpy's solution of the same box QP, and its budget."""
import threading
import time

import numpy as np
import pytest
import torch
from sklearn.svm import SVC

from joker_ext import JokerClassifier
from joker_ext.active_set import _Column
from joker_ext.data import BlockData
from joker_ext.kernels import CallableKernel, GaussianKernel
from joker_ext.losses import get_loss
from joker_ext.model import fit_dual
from joker_ext.operators import ExactOperator
from joker_ext import smo
from joker_ext.smo import smo_available, smo_phase
from joker_ext.solver import SolverOptions
from joker_ext.working_set import _ColumnCache

from conftest import PARAMS, make_binary, make_regression

F64 = torch.float64
BOX_LOSSES = ["hinge", "epsilon_insensitive", "absolute", "pinball", "squared_hinge", "squared"]

pytestmark = pytest.mark.skipif(not smo_available(), reason="numba is not installed")


def _box_qp(name: str, intercept: bool, n: int = 160, C: float = 2.0, seed: int = 0, rows: str = "loop"):
    """The box QP of a loss on a small problem; ``rows``: 'loop' (a Gaussian kernel, whose rows the compiled loop
    forms itself) or 'blocks' (the same kernel as a callable: rows come through the cache, in blocks)."""
    loss = get_loss(name, **PARAMS)
    X, y = (make_binary if loss.margin else make_regression)(n=n, seed=seed)
    kernel = GaussianKernel(0.7) if rows == "loop" else CallableKernel(GaussianKernel(0.7))
    op = ExactOperator(kernel, BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    cache = _ColumnCache(op, n, F64, torch.device("cpu"))
    diag = op.kernel.diag(cache.X)
    yt = torch.as_tensor(y, dtype=F64)
    col = _Column(None, diag, loss, yt, torch.full((n,), C, dtype=F64), intercept)
    K = op.kernel(cache.X, cache.X).numpy()
    return cache, diag, col, K


def _objective(K, col, a):
    h = np.broadcast_to(torch.as_tensor(col.h).numpy(), a.shape)
    return 0.5 * a @ K @ a - col.lin.numpy() @ a + 0.5 * (h * a * a).sum() + col.kink * np.abs(a).sum()


def _cvxpy_optimum(K, col) -> float:
    cp = pytest.importorskip("cvxpy")
    n = K.shape[0]
    a = cp.Variable(n)
    h = np.broadcast_to(torch.as_tensor(col.h).numpy(), (n,))
    L = np.linalg.cholesky(K + 1e-12 * np.eye(n))
    obj = 0.5 * cp.sum_squares(L.T @ a) - col.lin.numpy() @ a + 0.5 * cp.sum(cp.multiply(h, cp.square(a)))
    if col.kink:
        obj = obj + col.kink * cp.norm1(a)
    lo, hi = col.lo.numpy(), col.hi.numpy()
    cons = [a[np.isfinite(lo)] >= lo[np.isfinite(lo)], a[np.isfinite(hi)] <= hi[np.isfinite(hi)]]
    if col.intercept:
        cons.append(cp.sum(a) == 0)
    prob = cp.Problem(cp.Minimize(obj), [c for c in cons if c is not None])
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    return float(prob.value)


def _compact_every_shrinking(monkeypatch, share: float = 0.9) -> list:
    """Make every shrinking (every 20 steps) that keeps at most ``share`` of the coordinates hand the steps to a
    ``_Compact`` block, whatever ``n``; returns the list that receives each block's size."""
    for key, value in [("COMPACT_MIN_N", 0), ("COMPACT_SHARE", share), ("SHRINK_FIRST", 20), ("SHRINK_EVERY", 20),
                       ("SHRINK_KEEP_MAX", share)]:
        monkeypatch.setattr(smo, key, value)
    blocks = []
    block_type = smo._Compact
    monkeypatch.setattr(smo, "_Compact", lambda A, *args: blocks.append(A.size) or block_type(A, *args))
    return blocks


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("rows", ["loop", "blocks", "budget"])
@pytest.mark.parametrize("intercept", [True, False])
@pytest.mark.parametrize("name", BOX_LOSSES)
def test_smo_phase_reaches_the_cvxpy_optimum_of_the_box_qp(monkeypatch, name, intercept, rows, compact):
    """Run to a tight tolerance, the steps stay in the box (and on sum a = 0 with an intercept) and reach the
    optimal value cvxpy finds for the same QP, whether the loop forms its kernel rows, the cache does, or the loop
    forms them up to its budget (inputs above ``FORM_MAX_DIM`` dimensions: ``FORM_SHARE n`` rows) and the cache
    the rest. ``compact``: every shrinking hands the steps to a block of the coordinates it kept (``_Compact``,
    below its size here); the phase still ends at the optimum, and the ``K a`` read off its gradient (the shrunk
    coordinates' part brought up to date as each block ends) is the product with the kernel matrix."""
    cache, diag, col, K = _box_qp(name, intercept, rows="blocks" if rows == "blocks" else "loop")
    n = K.shape[0]
    in_blocks = []
    if rows == "budget":
        monkeypatch.setattr(smo, "FORM_MAX_DIM", 0)
        monkeypatch.setattr(smo, "FORM_SHARE", 0.25)
        monkeypatch.setattr(smo, "LOOP_GRANT_POINTS_SHARE", 0.0)  # no leave beyond the budget (its own test below)
        fill = cache._fill
        monkeypatch.setattr(cache, "_fill", lambda slots, idx: in_blocks.append(idx.numel()) or fill(slots, idx))
    blocks = _compact_every_shrinking(monkeypatch) if compact else []
    a = torch.zeros(n, dtype=F64)
    product = torch.full((n,), float("nan"), dtype=F64)
    steps = smo_phase(cache, diag, col, a, tol=1e-10, deadline=float("inf"), max_steps=10**6, product=product)
    a = a.numpy()
    assert steps > 0
    if rows == "budget" and not compact:  # the loop formed its quarter of the rows (no more), the cache at least one
        assert in_blocks and int(cache.have.sum()) - sum(in_blocks) == n // 4  # block
    if compact and name != "squared":  # blocks were made (a squared loss has no bounds to shrink at)
        assert blocks and max(blocks) < n
    assert np.abs(product.numpy() - K @ a).max() <= 1e-11 * max(1.0, np.abs(K @ a).max())
    assert np.all(a >= col.lo.numpy()) and np.all(a <= col.hi.numpy())
    if intercept:
        assert abs(a.sum()) <= 1e-10 * np.abs(a).sum()
    best = _cvxpy_optimum(K, col)
    assert _objective(K, col, a) <= best + 1e-8 * max(1.0, abs(best))


@pytest.mark.parametrize("intercept", [True, False])
@pytest.mark.parametrize("name", ["hinge", "epsilon_insensitive"])
def test_smo_phase_from_a_warm_start_keeps_its_sum_and_only_decreases_the_objective(name, intercept):
    """From a feasible nonzero start (half the optimum: on sum a = 0 with an intercept), the objective does not
    rise, the sum stays (with an intercept), and the phase ends at the same optimum as from zero."""
    cache, diag, col, K = _box_qp(name, intercept, seed=1)
    a = torch.zeros(K.shape[0], dtype=F64)
    smo_phase(cache, diag, col, a, tol=1e-10, deadline=float("inf"), max_steps=10**6)
    start = 0.5 * a.clone()
    a = start.clone()
    smo_phase(cache, diag, col, a, tol=1e-10, deadline=float("inf"), max_steps=5)
    assert _objective(K, col, a.numpy()) <= _objective(K, col, start.numpy()) + 1e-12
    smo_phase(cache, diag, col, a, tol=1e-10, deadline=float("inf"), max_steps=10**6)
    if intercept:
        assert abs(float(a.sum()) - float(start.sum())) <= 1e-10 * float(a.abs().sum())
    best = _cvxpy_optimum(K, col)
    assert _objective(K, col, a.numpy()) <= best + 1e-8 * abs(best)


def _rows_the_loop_may_form(n: int, d: int, held: int) -> int:
    """The budget of the loop's row former on ``n`` Gaussian points of ``d`` dimensions with the cache holding the
    first ``held`` rows."""
    X = torch.as_tensor(np.random.default_rng(0).standard_normal((n, d)))
    op = ExactOperator(GaussianKernel(float(np.sqrt(d))), BlockData(X, F64, torch.device("cpu")))
    cache = _ColumnCache(op, n, F64, torch.device("cpu"))
    cache(torch.arange(held))
    return int(smo._row_former(cache).left[0])


@pytest.mark.parametrize("d", [5, 30, 61, 300])
def test_the_loop_forms_rows_without_limit_up_to_form_max_dim_then_up_to_its_share_then_a_falling_share(d):
    """Up to ``FORM_MAX_DIM`` dimensions the loop may form every row; up to ``FORM_SHARE_MAX_DIM`` it may form
    ``FORM_SHARE n`` rows less those the cache holds; beyond, ``FORM_SHARE_HIGH_DIM FORM_SHARE_MAX_DIM n / d`` less
    those (none when the cache holds more)."""
    n = 200
    left = _rows_the_loop_may_form(n, d, held=10)
    if d <= smo.FORM_MAX_DIM:
        assert left >= n
    elif d <= smo.FORM_SHARE_MAX_DIM:
        assert left == int(smo.FORM_SHARE * n) - 10
    else:
        share = smo.FORM_SHARE_HIGH_DIM * smo.FORM_SHARE_MAX_DIM / d
        assert left == max(0, int(share * n) - 10)
        assert left < int(smo.FORM_SHARE * n) - 10


@pytest.mark.parametrize("d", [5, 30, 61])
def test_points_beyond_a_cores_cache_leave_the_loop_a_small_share_of_rows(monkeypatch, d):
    """Points that outgrow ``FORM_POINTS_SHARE`` of a core's cache (here a cache of 4 KiB: 200 points of 30
    dimensions take 47 KiB) cut the share beyond ``FORM_MAX_DIM`` dimensions to ``FORM_SHARE_BEYOND``; up to
    ``FORM_MAX_DIM`` the loop still forms every row."""
    n = 200
    monkeypatch.setattr(smo, "_core_cache_bytes", lambda: 4096)
    left = _rows_the_loop_may_form(n, d, held=2)
    if d <= smo.FORM_MAX_DIM:
        assert left >= n
    else:
        assert left == max(0, int(smo.FORM_SHARE_BEYOND * n) - 2) < int(smo.FORM_SHARE_HIGH_DIM * n)


def test_the_cores_cache_size_is_read_from_the_system_in_bytes():
    """Linux says '2048K' (or '1M'); the size comes back in bytes, between 32 KiB and 256 MiB."""
    assert 2 ** 15 <= smo._core_cache_bytes.__wrapped__() <= 2 ** 28


def test_blocks_of_guessed_rows_stay_within_twice_the_rows_the_steps_use(monkeypatch):
    """Where the loop forms no rows (d = 70, its share beyond ``FORM_SHARE_MAX_DIM`` set to none), a missing row comes
    in a block with the rows of the worst violators. On an easy problem (two well-separated classes, 150 of 3000
    points end as support vectors) the steps use few of those guesses, and the blocks shrink: the rows formed stay
    within twice the support vectors (blocks of 256 formed 1,531 rows here, ten times as many)."""
    n, d = 3000, 70
    rng = np.random.default_rng(0)
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    X = rng.standard_normal((n, d)) + 4.0 * y[:, None] * np.eye(d)[0]
    op = ExactOperator(GaussianKernel(float(np.sqrt(d))), BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    cache = _ColumnCache(op, n, F64, torch.device("cpu"))
    assert d > smo.FORM_SHARE_MAX_DIM
    monkeypatch.setattr(smo, "FORM_SHARE_HIGH_DIM", 0.0)
    diag = op.kernel.diag(cache.X)
    col = _Column(None, diag, get_loss("hinge"), torch.as_tensor(y), torch.full((n,), 1.0, dtype=F64), True)
    a = torch.zeros(n, dtype=F64)
    smo_phase(cache, diag, col, a, tol=1e-3, deadline=float("inf"))
    support = int((a != 0).sum())
    assert 50 <= support <= 300  # the easy problem it is meant to be
    assert int(cache.have.sum()) <= 2 * support


@pytest.mark.parametrize("shrunk", [False, True])
def test_partner_scan_picks_the_first_coordinate_of_largest_second_order_gain(shrunk):
    """The partner of ``i`` (vectorized scan over all coordinates, or the loop over a shrunk set) is the first
    coordinate of largest ``(g_k + down_off_k - dp_i)^2 / max(curvature_k, tau)``, computed here with numpy, with
    blocked coordinates (``down_off = -inf``: no gain), a copy of ``i``'s point (curvature ``2 h``, zero without
    ``h``: the floor ``tau``) and exact ties among the candidates."""
    rng = np.random.default_rng(3)
    n = 1003  # (not a multiple of the scan's eight running maxima)
    for trial in range(50):
        g = rng.standard_normal(n)
        down_off = np.where(rng.random(n) < 0.3, -np.inf, rng.choice([-0.1, 0.1], n))
        diag, h = np.full(n, 1.3), np.full(n, 0.2 * (trial % 2))
        Ri = rng.random(n)
        Ri[rng.integers(n)] = diag[0]  # a copy of i's point: K_ij = K_ii
        if trial % 5 == 0:  # ties: the first of equals
            g[n // 2:] = g[: n - n // 2]
            Ri[n // 2:] = Ri[: n - n // 2]
            down_off[n // 2:] = down_off[: n - n // 2]
        qi, dp_i, tau = diag[0] + h[0], float(rng.standard_normal()), 1e-12 * 1.3
        act = np.arange(n, dtype=np.int64)
        n_act = n
        if shrunk:
            act = np.sort(rng.permutation(n)[: n // 3]).astype(np.int64)
            act = np.concatenate([act, np.zeros(n - act.size, dtype=np.int64)])
            n_act = n // 3
        idx = act[:n_act]
        diff = np.maximum(g[idx] + down_off[idx] - dp_i, 0.0)
        gain = diff ** 2 / np.maximum(qi + diag[idx] + h[idx] - 2.0 * Ri[idx], tau)
        expected = int(idx[np.argmax(gain)]) if gain.max() > 0 else -1
        assert smo._partner(g, down_off, diag, h, Ri, qi, dp_i, tau, act, n_act, np.empty(n)) == expected


def _costs(rng, n: int, trial: int):
    """A gradient and offsets with blocked directions (``up_off = inf`` at the upper bound, ``down_off = -inf`` at
    the lower one), every direction blocked in some trials, and exact ties in others."""
    g = rng.standard_normal(n)
    up_off = np.where(rng.random(n) < 0.3, np.inf, rng.choice([-0.1, 0.1], n))
    down_off = np.where(rng.random(n) < 0.3, -np.inf, np.minimum(up_off, rng.choice([-0.1, 0.1], n)))
    if trial % 5 == 0:  # ties: the first of equals
        g[n // 2:] = g[: n - n // 2]
        up_off[n // 2:] = up_off[: n - n // 2]
        down_off[n // 2:] = down_off[: n - n // 2]
    if trial % 7 == 3:  # every coordinate at its upper bound: nothing can move up
        up_off[:] = np.inf
    return g, up_off, down_off


def test_in_order_scans_pick_the_first_coordinate_of_cheapest_move_up_and_of_largest_single_gain():
    """The two-pass scans over all coordinates in order against numpy: ``i`` the first coordinate of smallest
    ``g_k + up_off_k`` (-1 when every move up is blocked), ``dp_i`` that cost, ``dm_max`` the largest ``g_k +
    down_off_k``; without an intercept also ``s``, the first coordinate of largest ``w_k^2 / max(Q_kk, tau)`` with
    ``w_k = max(-min(g_k + up_off_k, 0), max(g_k + down_off_k, 0))`` (-1 when no coordinate violates its condition),
    and the largest violation ``max w_k``."""
    rng = np.random.default_rng(4)
    n = 1003  # (not a multiple of the scans' four or eight running extremes)
    for trial in range(60):
        g, up_off, down_off = _costs(rng, n, trial)
        diag, h = rng.uniform(0.5, 1.5, n), np.full(n, 0.2 * (trial % 2))
        if trial % 5 == 0:
            diag[n // 2:] = diag[: n - n // 2]
        tau = 1e-12 * float(diag.mean())
        up, down = g + up_off, g + down_off
        i = int(np.argmin(up)) if np.isfinite(up.min()) else -1
        assert smo._cheapest_up_in_order(g, up_off, down_off, n) == (i, up.min(), down.max())
        worst = np.maximum(-np.minimum(up, 0.0), np.maximum(down, 0.0))
        gain = worst ** 2 / np.maximum(diag + h, tau)
        s = int(np.argmax(gain)) if gain.max() > 0 else -1
        out = smo._worst_single_and_cheapest_up_in_order(g, up_off, down_off, diag, h, tau, n, np.empty(n))
        assert out == (s, worst.max(), i, up.min(), down.max())


def test_smo_phase_keeps_its_budget():
    """A passed deadline or an interrupt takes no step; ``max_steps`` bounds the steps."""
    cache, diag, col, K = _box_qp("hinge", True)
    a = torch.zeros(K.shape[0], dtype=F64)
    assert smo_phase(cache, diag, col, a, tol=1e-10, deadline=time.perf_counter() - 1.0) == 0
    assert smo_phase(cache, diag, col, a, tol=1e-10, deadline=float("inf"), interrupted=lambda: True) == 0
    assert float(a.abs().max()) == 0.0
    assert smo_phase(cache, diag, col, a, tol=1e-10, deadline=float("inf"), max_steps=7) == 7


@pytest.mark.parametrize("intercept", [True, False])
@pytest.mark.parametrize("name", ["hinge", "epsilon_insensitive", "squared_hinge"])
def test_phases_hand_over_k_alpha_from_their_gradients_only_while_its_rounding_stays_at_a_products(
        monkeypatch, name, intercept):
    """The ``K a`` a phase reads off its gradient (``g + lin - h a``) is the product with the kernel matrix formed
    apart to a few units of float64's rounding; ``smo_columns`` reports it for the phases of at most
    ``PRODUCT_FROM_GRADIENT_STEPS n`` steps and leaves the longer ones to the caller's product."""
    cache, diag, col, K = _box_qp(name, intercept)
    n = K.shape[0]
    alpha = torch.zeros(n, 2, dtype=F64)
    products = torch.full((n, 2), float("nan"), dtype=F64)
    with torch.inference_mode():
        formed = smo.smo_columns(cache, diag, [col, col], alpha, tols=[1e-3, 1e-3], deadline=float("inf"),
                                 max_steps=n, products=products)
    assert formed == [True, True]
    expected = K @ alpha.numpy()
    assert np.abs(products.numpy() - expected).max() <= 1e-13 * np.abs(expected).max()
    # a limit below the steps taken: not reported (the caller forms K a from the rows)
    monkeypatch.setattr(smo, "PRODUCT_FROM_GRADIENT_STEPS", 1.0 / n)
    with torch.inference_mode():
        formed = smo.smo_columns(cache, diag, [col], torch.zeros(n, 1, dtype=F64), tols=[1e-3],
                                 deadline=float("inf"), max_steps=n, products=torch.empty(n, 1, dtype=F64))
    assert formed == [False]


@pytest.mark.parametrize("name", ["hinge", "pinball"])
def test_working_set_reaches_the_same_certified_optimum_with_and_without_the_smo_phase(monkeypatch, name):
    """The decomposition alone (as on a GPU, or without numba) and after the SMO phase (which a default fit on the CPU
    runs): both certified at a relative gap of 1e-10 with the intercept, and their primal objectives agree."""
    import joker_ext.working_set as ws

    loss = get_loss(name, **PARAMS)
    X, y = (make_binary if loss.margin else make_regression)(n=300, seed=4)
    steps = []
    phase = smo.smo_phase
    monkeypatch.setattr(smo, "smo_phase", lambda *a, **k: steps.append(phase(*a, **k)) or steps[-1])
    objectives = []
    for use in (True, False):
        monkeypatch.setattr(ws, "USE_SMO", use)
        m = fit_dual(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1), loss=loss, c=torch.full((300,), 5.0,
                     dtype=F64), kernel=GaussianKernel(0.5), options=SolverOptions(tol=1e-10, max_iter=500),
                     solver="working_set", intercept=True)
        assert m.result.status == "converged" and m.result.rel_gap <= 1e-10
        objectives.append(m.result.primal)
        assert (len(steps) == 1 and steps[0] > 0) if use else len(steps) == 1  # the phase ran in the first fit only
    assert abs(objectives[0] - objectives[1]) <= 1e-9 * abs(objectives[1])


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("warm", [False, True])
def test_one_vs_rest_columns_on_threads_end_where_they_end_one_after_another_at_svcs_models(monkeypatch, warm,
                                                                                            compact):
    """Four one-vs-rest columns (d = 3: the loop forms every row) on two threads: the phases run at once (a barrier
    that each phase must pass after its first chunk of steps, which one thread alone would never pass), share the
    cache's rows, and end with the very numbers of the phases one after another (a race on a row half-way through
    forming, or on its flag, would change them); the certified fit is then each class against the rest as SVC
    fits it at tol 1e-10. ``warm``: from a nonzero feasible start, whose rows the cache forms first. ``compact``:
    the phases go on in blocks of the coordinates each shrinking keeps."""
    blocks = _compact_every_shrinking(monkeypatch, share=1.0) if compact else []
    rng = np.random.default_rng(3)
    n = 400
    X = rng.standard_normal((n, 3))
    y = np.argmax(X @ rng.standard_normal((3, 4)) + 0.5 * rng.standard_normal((n, 4)), axis=1)
    loss = get_loss("hinge")
    op = ExactOperator(GaussianKernel(1.0), BlockData(torch.as_tensor(X), F64, torch.device("cpu")))
    Y = torch.as_tensor(np.where(y[:, None] == np.arange(4), 1.0, -1.0))
    c = torch.full((n,), 2.0, dtype=F64)

    def run(workers, barrier=None):
        cache = _ColumnCache(op, n, F64, torch.device("cpu"))
        diag = op.kernel.diag(cache.X)
        columns = [_Column(None, diag, loss.column(t), Y[:, t], c, True) for t in range(4)]
        alpha = torch.zeros(n, 4, dtype=F64)
        if warm:  # a feasible start on sum a = 0: one point of each sign per column
            for t in range(4):
                i, j = int(torch.nonzero(Y[:, t] > 0)[0]), int(torch.nonzero(Y[:, t] < 0)[0])
                alpha[i, t], alpha[j, t] = 1.0, -1.0
        with torch.inference_mode():
            smo.smo_columns(cache, diag, columns, alpha, tols=[1e-3] * 4, deadline=float("inf"), max_steps=5 * n,
                            workers=workers, interrupted=barrier or (lambda: False))
        assert bool(cache.have.any())
        return alpha

    one_by_one = run(1)
    barrier = threading.Barrier(2, timeout=30)
    passed = threading.local()

    def meet():  # polled before each chunk of steps: each thread's first phase waits there for the other's
        if not getattr(passed, "done", False):
            passed.done = True
            barrier.wait()  # BrokenBarrierError after 30 s unless another phase runs at the same time
        return False

    together = run(2, meet)
    assert torch.equal(together, one_by_one)
    assert bool(blocks) == compact

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    clf = JokerClassifier(loss="hinge", C=2.0, gamma=1.0, fit_intercept=True, tol=1e-10, multi_class="ovr").fit(X, y)
    assert clf.relative_gap_ <= 1e-10
    for k in range(4):
        ref = SVC(C=2.0, gamma=1.0, tol=1e-10).fit(X, (y == k).astype(int))
        assert np.abs(clf.decision_function(X)[:, k] - ref.decision_function(X)).max() <= 1e-6


@pytest.mark.parametrize("compact", [False, True])
def test_columns_on_threads_beyond_form_max_dim_form_their_rows_in_the_loop_not_through_the_cache(monkeypatch,
                                                                                                   compact):
    """On 40 dimensions (above ``FORM_MAX_DIM``, within ``CONCURRENT_MAX_DIM``) the phases run at once and form every
    row they read in the loop: the cache forms none while they run (nor when a block of shrunk coordinates ends,
    with ``compact``); the certified one-vs-rest fit is then each class against the rest as SVC fits it at tol
    1e-10."""
    assert smo.FORM_MAX_DIM < 40 <= smo.CONCURRENT_MAX_DIM
    blocks = _compact_every_shrinking(monkeypatch, share=1.0) if compact else []
    rng = np.random.default_rng(5)
    n = 300
    X = rng.standard_normal((n, 40))
    y = np.argmax(X[:, :3] + 0.5 * rng.standard_normal((n, 3)), axis=1)
    through_cache = []
    fill, phase = _ColumnCache._fill, smo.smo_phase
    monkeypatch.setattr(_ColumnCache, "_fill", lambda self, slots, idx: through_cache.append(idx.numel()) or
                        fill(self, slots, idx))
    seen = []  # per phase: whether it forms every row, the cache's fills before it and after it

    def checked(*args, **kwargs):
        before = len(through_cache)
        steps = phase(*args, **kwargs)
        seen.append((kwargs.get("every_row", False), before, len(through_cache)))
        return steps

    monkeypatch.setattr(smo, "smo_phase", checked)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    gamma = 1.0 / 40
    clf = JokerClassifier(loss="hinge", C=2.0, gamma=gamma, fit_intercept=True, tol=1e-10,
                          multi_class="ovr").fit(X, y)
    assert len(seen) == 3 and all(every and before == after == seen[0][1] for every, before, after in seen)
    assert bool(blocks) == compact
    assert clf.relative_gap_ <= 1e-10
    for k in range(3):
        ref = SVC(C=2.0, gamma=gamma, tol=1e-10).fit(X, (y == k).astype(int))
        assert np.abs(clf.decision_function(X)[:, k] - ref.decision_function(X)).max() <= 1e-6


def test_a_phase_that_raises_stops_the_phases_beside_it_and_its_error_reaches_the_caller(monkeypatch):
    """One column's phase raises (as on a step of negative curvature) while another runs on the second thread: the
    running one is told to stop (its ``interrupted`` turns true), the columns not started are skipped, and the error
    comes out of :func:`smo_columns`."""
    cache, diag, col, K = _box_qp("hinge", True)
    n = K.shape[0]
    started, stopped = [], []

    def phase(cache, diag, column, a, **kwargs):
        t = len(started)
        started.append(t)
        if t == 1:
            time.sleep(0.05)  # the other phase is polling by then
            raise torch.linalg.LinAlgError("negative curvature")
        deadline = time.perf_counter() + 20.0
        while not kwargs["interrupted"]():
            assert time.perf_counter() < deadline, "the phase beside the failed one was not stopped"
            time.sleep(0.001)
        stopped.append(t)
        return 0

    monkeypatch.setattr(smo, "smo_phase", phase)
    with pytest.raises(torch.linalg.LinAlgError, match="negative curvature"):
        smo.smo_columns(cache, diag, [col] * 6, torch.zeros(n, 6, dtype=F64), tols=[1e-3] * 6,
                        deadline=float("inf"), workers=2)
    assert stopped == [0] and len(started) == 2


@pytest.mark.parametrize("intercept", [True, False])
def test_smo_phase_refuses_a_kernel_that_is_not_positive_semidefinite(intercept):
    """A tanh kernel (indefinite: numpy finds a negative eigenvalue of its matrix) makes a step of negative
    curvature: the phase raises LinAlgError instead of returning a point that no certificate covers."""
    from joker_ext.kernels import CallableKernel

    X, y = make_binary(n=120, seed=0)
    tanh = CallableKernel(lambda P, Q: torch.tanh(0.5 * P @ Q.T - 1.0), name="tanh")
    Xt = torch.as_tensor(X)
    assert np.linalg.eigvalsh(tanh(Xt, Xt).numpy()).min() < -1e-3
    op = ExactOperator(tanh, BlockData(Xt, F64, torch.device("cpu")))
    cache = _ColumnCache(op, 120, F64, torch.device("cpu"))
    diag = op.kernel.diag(cache.X)
    col = _Column(None, diag, get_loss("hinge"), torch.as_tensor(y, dtype=F64), torch.full((120,), 100.0, dtype=F64),
                  intercept)
    with pytest.raises(torch.linalg.LinAlgError, match="not positive semidefinite"):
        smo_phase(cache, diag, col, torch.zeros(120, dtype=F64), tol=1e-10, deadline=float("inf"))


def test_without_an_intercept_pair_steps_spare_the_zigzag_of_one_coordinate_steps():
    """Hinge without an intercept at C = 100 on a smooth kernel: one-coordinate steps alone zigzag along the kernel's
    nearly constant top eigenvector (97,825 steps to tol 1e-8 here); with the pair steps beside them the phase reaches
    cvxpy's optimum in 8,373."""
    cache, diag, col, K = _box_qp("hinge", False, n=300, C=100.0)
    a = torch.zeros(300, dtype=F64)
    steps = smo_phase(cache, diag, col, a, tol=1e-8, deadline=float("inf"), max_steps=10**6)
    ref = _cvxpy_optimum(K, col)
    assert _objective(K, col, a.numpy()) - ref <= 1e-9 * abs(ref)
    assert steps < 20_000


def test_smo_phase_stops_once_its_sets_have_settled():
    """With ``settled`` = 1 every round of steps counts as settled (a round of at least 1000 steps changes the sets
    of at most the 160 coordinates there are): the phase stops after its first round, where without the rule it goes
    on to the tolerance."""
    from joker_ext import smo

    cache, diag, col, K = _box_qp("absolute", False)
    a = torch.zeros(K.shape[0], dtype=F64)
    assert smo_phase(cache, diag, col, a, tol=1e-10, deadline=float("inf"), settled=1.0) == smo.SETTLE_MIN_STEPS
    a.zero_()
    assert smo_phase(cache, diag, col, a, tol=1e-10, deadline=float("inf"), max_steps=10**6) > 2 * smo.SETTLE_MIN_STEPS


def test_sets_with_fewer_free_coordinates_than_settle_min_free_never_count_as_settled(monkeypatch):
    """The settling rule leaves the free set's linear system to a factorisation; a free set below
    ``SETTLE_MIN_FREE`` times a round's steps is the steps' own: with the share raised above what 160 coordinates can
    reach, ``settled`` = 1 stops nothing, and the phase ends at the tolerance, at cvxpy's optimum."""
    cache, diag, col, K = _box_qp("absolute", False)
    monkeypatch.setattr(smo, "SETTLE_MIN_FREE", (K.shape[0] + 1) / smo.SETTLE_MIN_STEPS)
    a = torch.zeros(K.shape[0], dtype=F64)
    steps = smo_phase(cache, diag, col, a, tol=1e-10, deadline=float("inf"), settled=1.0, max_steps=10**6)
    assert steps > 2 * smo.SETTLE_MIN_STEPS
    ref = _cvxpy_optimum(K, col)
    assert _objective(K, col, a.numpy()) - ref <= 1e-9 * abs(ref)


def test_smo_phase_shrinks_across_the_calls_of_its_compiled_loop(monkeypatch):
    """The compiled loop returns to the driver every ``CHUNK_STEPS`` steps (and whenever a row is missing): with
    calls shorter than the shrinking's period (100 steps here, against every 160 = n steps), the countdown carries
    over, so the choice set still shrinks to the coordinates within the current extremes (it was restarted at every
    call, and never reached). The result stays cvxpy's optimum."""
    from joker_ext import smo

    monkeypatch.setattr(smo, "CHUNK_STEPS", 100)
    chosen_from = []
    steps = smo._pair_steps

    def recorded(*args):
        out = steps(*args)
        chosen_from.append(out[3])  # the size of the choice set on return
        return out

    monkeypatch.setattr(smo, "_pair_steps", recorded)
    cache, diag, col, K = _box_qp("hinge", True, C=100.0, rows="blocks")
    a = torch.zeros(K.shape[0], dtype=F64)
    smo_phase(cache, diag, col, a, tol=1e-10, deadline=float("inf"), max_steps=10**6)
    assert min(chosen_from) < K.shape[0]
    best = _cvxpy_optimum(K, col)
    assert _objective(K, col, a.numpy()) <= best + 1e-8 * max(1.0, abs(best))


@pytest.mark.parametrize("n, d", [(1500, 16), (2000, 10)])
def test_first_subproblem_after_the_smo_phase_tries_the_exact_steps_before_a_proximal_round(monkeypatch, n, d):
    """After the SMO phase, whose sets are nearly the solution's, the first subproblem of mostly violators first takes
    active-set steps at the smallest proximal weight: on these easy problems the fit ends after that one outer iteration
    (a proximal round first took 2-3), with SVC's decision function (tol 1e-10)."""
    from sklearn.datasets import make_classification
    from sklearn.svm import SVC
    from joker_ext import JokerClassifier
    import joker_ext.working_set as ws

    X, y = make_classification(n_samples=n, n_features=d, n_informative=d // 2, class_sep=1.5, flip_y=0.0,
                               random_state=2)
    gamma = 1.0 / (d * X.var())
    subproblem, select = ws._subproblem, ws._select
    fits = []
    for near_first in (True, False):
        if not near_first:  # every subproblem as any other: a proximal round first, the usual fillers
            monkeypatch.setattr(ws, "_subproblem", lambda *args, **kw: subproblem(*args[:-1], False, **kw))
            monkeypatch.setattr(ws, "_select", lambda *args, **kw: select(*args[:-1], False, **kw))
        est = JokerClassifier(loss="hinge", C=1.0, gamma=gamma, fit_intercept=True).fit(X, y)
        assert est.status_ == "converged" and est.relative_gap_ <= 1e-10
        fits.append(est)
    assert fits[0].n_iter_ == 1 and fits[1].n_iter_ >= 2
    svc = SVC(C=1.0, gamma=gamma, tol=1e-10).fit(X, y)
    np.testing.assert_allclose(fits[0].decision_function(X[:200]), svc.decision_function(X[:200]), atol=1e-5)


def test_first_working_set_after_the_smo_phase_holds_every_violator_with_few_fillers(monkeypatch):
    """optdigits (class 0 against the rest, n = 4000, C = 1): after the SMO phase one or two coordinates outside the
    free set violate their optimality conditions. The first working set holds every violator at the intercept the
    set is chosen at, with far fewer fillers than ``q = 512`` would bring (the usual set is larger by 200 or more);
    the fit ends after that one subproblem with SVC's decision function (tol 1e-10)."""
    from sklearn.svm import SVC
    from joker_ext import JokerClassifier
    from joker_ext.comparisons.datasets import load
    import joker_ext.working_set as ws

    ds = load("optdigits", n_train=4000, n_test=100, seed=0)
    X, y = np.asarray(ds.X_train, dtype=np.float64), (np.asarray(ds.y_train) == 0).astype(np.int64)
    gamma = 1.0 / (X.shape[1] * X.var())
    select, chosen = ws._select, []

    def recorded(col, a, bounds, q, intercept, b, cap, is_free, near, **kw):
        B = select(col, a, bounds, q, intercept, b, cap, is_free, near, **kw)
        if near:
            usual = select(col, a, bounds, q, intercept, b, cap, is_free, False, **kw)
            violators = torch.nonzero((bounds[0] > b) | (bounds[1] < b)).reshape(-1)
            chosen.append((B, usual, violators, int(is_free.sum())))
        return B

    monkeypatch.setattr(ws, "_select", recorded)
    est = JokerClassifier(loss="hinge", C=1.0, gamma=gamma, fit_intercept=True).fit(X, y)
    assert est.status_ == "converged" and est.relative_gap_ <= 1e-13 and est.n_iter_ == 1
    (B, usual, violators, n_free), = chosen
    assert torch.isin(violators, B).all()
    assert B.numel() <= n_free + max(ws.NEAR_FILL, 2 * violators.numel()) and usual.numel() >= B.numel() + 200
    svc = SVC(C=1.0, gamma=gamma, tol=1e-10).fit(X, y)
    np.testing.assert_allclose(est.decision_function(X[:200]), svc.decision_function(X[:200]), atol=1e-5)


def test_first_subproblem_after_the_smo_phase_finishes_by_active_set_steps_that_do_not_shrink(monkeypatch):
    """spambase (hinge, C = 10, gamma 4x 'scale'; 1,350 of its 1,361 coordinates free): the quick steps of the first
    subproblem after the SMO phase changed more than twice as many sets at their second step as at their first and
    stopped there for an interior-point solve; allowed ``QUICK_SHRINK_NEAR`` times as many, they settle without the
    interior point. Both models are SVC's (tol 1e-10)."""
    from sklearn.svm import SVC
    from joker_ext import JokerClassifier
    from joker_ext.comparisons.datasets import load
    import joker_ext.working_set as ws

    ds = load("spambase", n_test=100, seed=0)
    X, y = np.asarray(ds.X_train, dtype=np.float64), np.asarray(ds.y_train)
    gamma = 4.0 / (X.shape[1] * X.var())
    interior, calls = ws._interior_point, []
    monkeypatch.setattr(ws, "_interior_point", lambda *args: calls.append(1) or interior(*args))
    counts, fits = [], []
    for shrink in (ws.QUICK_SHRINK_NEAR, ws.QUICK_SHRINK):
        monkeypatch.setattr(ws, "QUICK_SHRINK_NEAR", shrink)
        calls.clear()
        fits.append(JokerClassifier(loss="hinge", C=10.0, gamma=gamma, fit_intercept=True).fit(X, y))
        assert fits[-1].status_ == "converged" and fits[-1].relative_gap_ <= 1e-13
        counts.append(len(calls))
    assert counts[0] == 0 and counts[1] >= 1
    svc = SVC(C=10.0, gamma=gamma, tol=1e-10).fit(X, y)
    for est in fits:
        np.testing.assert_allclose(est.decision_function(X[:200]), svc.decision_function(X[:200]), atol=1e-5)


def test_a_working_set_that_adds_no_violator_after_an_exact_solve_is_not_solved_again(monkeypatch):
    """optdigits (class 0 against the rest, n = 4000, C = 10): the first subproblem after the SMO phase is solved
    exactly at a gap of 1e-14; the next working set differs from it by one filler, a coordinate that satisfies its
    optimality condition. That set poses the same subproblem: the fit ends without solving it (when only an equal set
    counted as the same, it was solved a second time), and without an outer iteration to find that out (no
    coordinate outside the solved set violates its conditions: the fit stops at the certificate after the solve).
    The model is SVC's (tol 1e-10)."""
    from sklearn.svm import SVC
    from joker_ext import JokerClassifier
    from joker_ext.comparisons.datasets import load
    import joker_ext.working_set as ws

    ds = load("optdigits", n_train=4000, n_test=100, seed=0)
    X, y = np.asarray(ds.X_train, dtype=np.float64), (np.asarray(ds.y_train) == 0).astype(np.int64)
    gamma = 1.0 / (X.shape[1] * X.var())
    # (the loop forms its rows whatever the core's cache: rows formed in blocks round differently, and the SMO phase
    # then ends elsewhere, from where the first subproblem's solution leaves no such filler)
    monkeypatch.setattr(smo, "FORM_POINTS_SHARE", float("inf"))
    solved = []
    subproblem = ws._subproblem
    monkeypatch.setattr(ws, "_subproblem", lambda *args, **kw: solved.append(1) or subproblem(*args, **kw))
    counts, iterations = [], []
    for rule in ("violators", "equal sets"):
        if rule == "equal sets":
            monkeypatch.setattr(ws, "_violates", lambda idx, bounds, b: idx.numel() > 0)
        solved.clear()
        est = JokerClassifier(loss="hinge", C=10.0, gamma=gamma, fit_intercept=True).fit(X, y)
        assert est.status_ == "converged" and est.relative_gap_ <= 1e-13
        counts.append(len(solved))
        iterations.append(est.n_iter_)
    assert counts == [1, 2]
    assert iterations[0] == 1
    svc = SVC(C=10.0, gamma=gamma, tol=1e-10).fit(X, y)
    np.testing.assert_allclose(est.decision_function(X[:200]), svc.decision_function(X[:200]), atol=1e-5)


@pytest.mark.parametrize("allowed", [True, False])
def test_blocks_that_guess_badly_give_the_loop_leave_to_form_rows_and_the_phase_still_reaches_the_optimum(
        monkeypatch, allowed):
    """At small ``C`` every coordinate starts with the same violation, and the blocks' guessed rows (the worst
    violators') are mostly not the ones the steps read. Once fewer than ``1 / PREFETCH_WASTE`` of them were used, a
    loop with no budget of its own (``FORM_SHARE = 0``) gets leave to form ``LOOP_GRANT`` rows at a time, while the
    points take at most ``LOOP_GRANT_POINTS_SHARE`` of a core's cache (``allowed``; else every row still comes in
    blocks); the phase ends at cvxpy's optimum either way."""
    monkeypatch.setattr(smo, "FORM_MAX_DIM", 0)
    monkeypatch.setattr(smo, "FORM_SHARE", 0.0)
    monkeypatch.setattr(smo, "PREFETCH_WASTE_ROWS", 16)
    monkeypatch.setattr(smo, "LOOP_GRANT", 8)
    if not allowed:
        monkeypatch.setattr(smo, "LOOP_GRANT_POINTS_SHARE", 0.0)
    cache, diag, col, K = _box_qp("hinge", True, n=300, C=0.02)
    in_blocks = []
    fill = cache._fill
    monkeypatch.setattr(cache, "_fill", lambda slots, idx: in_blocks.append(idx.numel()) or fill(slots, idx))
    a = torch.zeros(K.shape[0], dtype=F64)
    smo_phase(cache, diag, col, a, tol=1e-10, deadline=float("inf"), max_steps=10**6)
    in_loop = int(cache.have.sum()) - sum(in_blocks)
    assert in_blocks
    assert (in_loop > 0) == allowed
    best = _cvxpy_optimum(K, col)
    assert _objective(K, col, a.numpy()) <= best + 1e-8 * max(1.0, abs(best))
