"""One-vs-one classification: a binary problem for every pair of classes, on their points only (SVC's model).

With ``k`` classes there are ``k (k - 1) / 2`` pairs; pair ``(i, j)``, ``i < j``, is the binary problem of the
points of classes ``i`` (target +1) and ``j`` (target -1), with the same kernel (its bandwidth from all the data),
loss, ``C`` and weights as a fit on all points. Its decision function ``f_ij(x) = sum_{p in i, j} alpha_p k(x_p, x)
+ b_ij`` votes for ``i`` where positive, for ``j`` otherwise; ``predict`` is the class with the most votes (the
first of them on a tie), as LIBSVM's.

**The pairs solved together.** Each pair is a small problem (letter, 26 classes, n = 4000: 325 pairs of about 300
points), and a fit through the working-set engine has fixed costs of about 3 ms (its sets, factors and certificates
in Python) where the problem's own steps take 0.3 ms: 325 separate fits took 8x SVC's time. For the box-QP losses
(hinge, squared hinge, squared: those of :mod:`joker_ext.smo`) with a kernel whose rows the compiled loop forms
(:func:`joker_ext.kernel_rows.forms_rows`), on the CPU, one compiled call solves a range of pairs (the threads take
ranges in turn), each pair in three steps:

1. SMO steps (:func:`joker_ext.smo._pair_steps`, or the steps without an intercept) from zero to a maximal
   violation of ``SMO_TOL`` (times the targets' scale), forming the rows they read;
2. a polish: the KKT system on the free coordinates found (``(K_FF + diag h_F) a_F + b 1 = lin_F - kink sign_F -
   K_FA a_A``, ``1^T a_F = -1^T a_A``; without an intercept no border), solved exactly; kept when its solution stays
   inside the box (on its side of the kink) and the coordinates at a bound satisfy their conditions to
   ``POLISH_TOL``; otherwise SMO goes on to a tolerance 100 times smaller and polishes again (at most
   ``POLISH_TRIES`` times);
3. ``K a`` recomputed from the formed rows (free of the steps' rounding) for the certificate.

Each pair is then certified by its duality gap, computed as the engines compute it (:func:`pair_gaps`), and a pair
whose relative gap is above the fit's tolerance (or the rounding floor, for a polished pair) is fitted again by the
engines, a binary fit of its own (``fit_pair`` of :func:`fit_one_vs_one`); so is every pair of another loss, kernel
or device, or whose kernel block would pass ``PAIR_BLOCK_BYTES``.

Cost per pair of ``m`` points: the SMO steps (``O(m)`` each, LIBSVM's count), the rows they read (``O(m d)`` each),
the polish (``|F|^3 / 3`` for ``F`` free coordinates) and ``K a`` (``O(m)`` per support vector). Memory: a pair's
block ``m x m`` per thread, touched only in the rows the steps read; the model's coefficients are ``n x k (k - 1) /
2``.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, NamedTuple, Optional, Tuple

import numpy as np
import torch

from .active_set import box_qp, certificate
from .defaults import ROUNDING_GAP
from .kernel_rows import RowFormer, forms_rows, row_former
from .losses import Loss
from .smo import (SHRINK_FIRST, TAU, _STEPS, _add_rows, _cheapest_up_in_order, _formed, _free_sum_steps, _njit,
                  _offsets, _pair_steps, numba)

__all__ = ["class_pairs", "pair_rows", "PairSolution", "OneVsOneFit", "batch_applies", "solve_pairs_batch", "pair_gaps",
           "fit_one_vs_one", "vote", "ovr_scores", "coupled_probabilities"]

#: Maximal violation (times the targets' scale, ``max |lin|``) at which the SMO steps hand a pair to the polish.
SMO_TOL = 1e-3
#: Largest violation (times the same scale) of a polished solution's conditions at the bounds.
POLISH_TOL = 1e-9
#: Polishes per pair before the batch gives it up (each after SMO to a tolerance 100 times smaller).
POLISH_TRIES = 3
#: SMO steps per pair, times its size (plus 10,000), before the batch gives it up.
MAX_STEPS_PER_POINT = 100

#: A polished coordinate this far outside its box (relative to the box's size) is at the bound, moved out by rounding.
BOX_ROUNDING = 1e-12

#: Ranges of pairs per thread, taken in turn by the threads as they finish one (a pair's cost is about ``m^2`` only
#: roughly: it grows with its support vectors, whose rows the steps form).
SPANS_PER_THREAD = 8

#: Below this total of the pairs' squared sizes (about 2 ns each on one core) the pairs are solved on one thread:
#: starting threads costs about 0.5 ms (iris, 3 pairs of 100 points: 1.95 ms a fit on two threads).
THREADS_MIN_WORK = 2e6

#: Largest kernel block of a pair the batch solves (bytes, ``8 m^2``; and at most the fit's ``max_memory`` over the
#: threads): 1 GiB, pairs of up to 11,585 points. Larger pairs are solved by the engines, which bound their memory.
PAIR_BLOCK_BYTES = 2.0 ** 30


def class_pairs(k: int) -> List[Tuple[int, int]]:
    """The pairs ``(i, j)``, ``i < j``, in LIBSVM's (and SVC's) order: ``(0, 1), (0, 2), ..., (1, 2), ...``."""
    return [(i, j) for i in range(k) for j in range(i + 1, k)]


class PairSolution(NamedTuple):
    """The batch's solutions: ``alpha`` and ``f = K_pp alpha`` concatenated over the pairs (pair ``p`` at
    ``offsets[p]:offsets[p + 1]``, its rows ``rows[...]``, targets ``y[...]``), the intercepts ``b``, and per pair
    whether its polish solved it (``solved``) and the SMO steps it took."""
    rows: np.ndarray
    y: np.ndarray
    offsets: np.ndarray
    alpha: np.ndarray
    f: np.ndarray
    b: np.ndarray
    solved: np.ndarray
    steps: np.ndarray


def batch_applies(kernel, loss: Loss, device: torch.device, c: torch.Tensor) -> bool:
    """Whether :func:`solve_pairs_batch` applies: numba at hand, a kernel whose rows the loop forms, the CPU, a loss
    whose dual is a box QP (the SMO phase's losses) with zero inside the box of every point, as +1 and as -1."""
    if numba is None or not forms_rows(kernel) or device.type != "cpu" or not getattr(loss, "quadratic", False):
        return False
    for sign in (1.0, -1.0):
        lo, hi = loss.box(torch.full_like(c, sign), c)
        if not bool((lo <= 0).all() and (hi >= 0).all()):
            return False
    return True


@_njit
def _polish(R, h, kink, lo, hi, lin, a, g, intercept, tol):  # pragma: no cover - compiled
    """Solve the KKT system of the free coordinates ``F`` of ``a`` (their rows in ``R``) exactly::

        (K_FF + diag h_F) a_F + b 1 = lin_F - kink sign(a_F) - K_FA a_A,    1^T a_F = -1^T a_A

    (no ``b`` and no second equation without an intercept; ``K_FA a_A`` read off ``g = K a + h a - lin``). When the
    solution stays in its box and the other coordinates' conditions hold to ``tol`` at it, ``a`` and ``g`` take it
    and ``(True, b)`` is returned; otherwise ``(False, 0)``, ``a`` and ``g`` unchanged."""
    m = a.shape[0]
    free = np.empty(m, dtype=np.int64)
    nf = 0
    for k in range(m):
        if lo[k] < a[k] < hi[k] and (kink == 0.0 or a[k] != 0.0):
            free[nf] = k
            nf += 1
    size = nf + 1 if intercept else nf
    M = np.zeros((size, size))
    rhs = np.empty(size)
    fixed_sum = 0.0
    for k in range(m):
        fixed_sum += a[k]
    for p in range(nf):
        i = free[p]
        Ri = R[i]
        for q in range(nf):
            M[p, q] = Ri[free[q]]
        M[p, p] += h[i]
        # K_FA a_A = (K a)_i - K_iF a_F, from g = K a + h a - lin
        s = g[i] + lin[i] - h[i] * a[i]
        for q in range(nf):
            s -= Ri[free[q]] * a[free[q]]
        rhs[p] = lin[i] - (kink if a[i] > 0.0 else -kink) - s
        fixed_sum -= a[i]
        if intercept:
            M[p, nf] = 1.0
            M[nf, p] = 1.0
    if intercept:
        rhs[nf] = -fixed_sum
    if nf == 0:  # every coordinate at a bound (or the kink): the conditions decide, at LIBSVM's intercept
        sol = rhs
        b = _middle_intercept(a, g, lo, hi, kink) if intercept else 0.0
    else:
        solved = True
        try:
            sol = np.linalg.solve(M, rhs)
        except Exception:  # exactly singular
            solved = False
            sol = rhs
        if not solved or not _inside(sol, free, nf, lo, hi, kink, a):
            # repeated points among the free ones make the system singular (consistent where their targets agree):
            # the least-squares solution of least norm shares their total equally, inside the box where any share is
            sol = np.linalg.lstsq(M, rhs)[0]
            if not _inside(sol, free, nf, lo, hi, kink, a):
                return False, 0.0
        b = sol[nf] if intercept else 0.0
    # the conditions at the bounds, from the updated gradient
    g_new = g.copy()
    moved = free[:nf]
    change = sol[:nf] - a[moved]
    _add_rows(R, moved, change, g_new)
    for p in range(nf):
        g_new[moved[p]] += h[moved[p]] * change[p]
    a_new = a.copy()
    for p in range(nf):
        a_new[free[p]] = sol[p]
    up_off, down_off = _offsets(a_new, lo, hi, kink)
    for k in range(m):
        if up_off[k] < math.inf and g_new[k] + up_off[k] + b < -tol:
            return False, 0.0
        if down_off[k] > -math.inf and g_new[k] + down_off[k] + b > tol:
            return False, 0.0
    a[:] = a_new
    g[:] = g_new
    return True, b


@_njit
def _inside(sol, free, nf, lo, hi, kink, a):  # pragma: no cover - compiled
    """Whether the free coordinates' new values ``sol[:nf]`` lie inside their boxes (an excess of rounding's size,
    ``BOX_ROUNDING`` of the box, is clipped in place) and on the side of the kink where they were."""
    for p in range(nf):
        i = free[p]
        v = sol[p]
        slack = BOX_ROUNDING * max(abs(lo[i]) if lo[i] > -math.inf else 0.0, abs(hi[i]) if hi[i] < math.inf else 0.0)
        if not lo[i] - slack <= v <= hi[i] + slack or (kink != 0.0 and v * a[i] < 0.0):
            return False
        sol[p] = min(max(v, lo[i]), hi[i])
    return True


@_njit
def _middle_intercept(a, g, lo, hi, kink):  # pragma: no cover - compiled
    """LIBSVM's intercept where no coordinate is free: the middle of ``[-min dp, -max dm]``."""
    up_off, down_off = _offsets(a, lo, hi, kink)
    _, dp, dm = _cheapest_up_in_order(g, up_off, down_off, a.shape[0])
    if dp == math.inf and dm == -math.inf:
        return 0.0
    if dp == math.inf:
        return -dm
    if dm == -math.inf:
        return -dp
    return -0.5 * (dp + dm)


@_njit
def _solve_pair(points, family, scale, rows, y, lin_pos, lin_neg, h_pos, h_neg, lo_pos, lo_neg, hi_pos, hi_neg, kink,
                intercept, smo_tol, polish_tol, max_steps, a, f):  # pragma: no cover - compiled
    """One pair (its points ``rows`` of ``points``, targets ``y``): SMO, polish, ``f = K a``; ``a`` and ``f`` are
    written; returns ``(solved, b, steps)``. ``smo_tol`` and ``polish_tol`` are in units of the gradient."""
    d = points.shape[0]
    m = rows.shape[0]
    pts = np.empty((d, m))
    for c in range(d):
        for q in range(m):
            pts[c, q] = points[c, rows[q]]
    former = RowFormer(pts, family, scale, np.empty((4, m)), np.array([np.iinfo(np.int64).max], dtype=np.int64))
    R = np.empty((m, m))
    have = np.zeros(m, dtype=np.bool_)
    outside = (R, have, np.zeros(0, dtype=np.int64), former)
    lin, h, lo, hi = np.empty(m), np.empty(m), np.empty(m), np.empty(m)
    for q in range(m):
        r = rows[q]
        if y[q] > 0:
            lin[q], h[q], lo[q], hi[q] = lin_pos[r], h_pos[r], lo_pos[r], hi_pos[r]
        else:
            lin[q], h[q], lo[q], hi[q] = lin_neg[r], h_neg[r], lo_neg[r], hi_neg[r]
    diag = np.full(m, scale)
    tau = TAU * scale
    for q in range(m):
        a[q] = 0.0
    g = -lin
    act = np.arange(m)
    n_act, countdown = m, min(m, SHRINK_FIRST)
    taken = 0
    solved, b = False, 0.0
    tol = smo_tol
    for _ in range(POLISH_TRIES):
        while taken < max_steps:
            if intercept:
                done, status, row, n_act, countdown = _pair_steps(R, have, former, outside, diag, h, kink, lo, hi, a,
                                                                  g, tol, tau, max_steps - taken, act, n_act,
                                                                  countdown, 0)
            else:
                done, status, row, n_act, countdown = _free_sum_steps(R, have, former, outside, diag, h, kink, lo,
                                                                      hi, a, g, tol, tau, max_steps - taken, act,
                                                                      n_act, countdown, 0)
            taken += done
            if status != _STEPS:  # converged, or a step that cannot be taken: on to the polish
                break
        for q in range(m):  # the rows of the free coordinates (moved, so formed, unless the start was free)
            if lo[q] < a[q] < hi[q]:
                _formed(R, have, former, q)
        solved, b = _polish(R, h, kink, lo, hi, lin, a, g, intercept, polish_tol)
        if solved or taken >= max_steps:
            break
        tol *= 0.01
    if not solved:
        b = _middle_intercept(a, g, lo, hi, kink) if intercept else 0.0
    nonzero = np.flatnonzero(a)
    for q in nonzero:
        _formed(R, have, former, q)
    f[:] = 0.0
    _add_rows(R, nonzero, a[nonzero], f)
    return solved, b, taken


@_njit
def _solve_range(points, family, scale, rows, y, offsets, lin_pos, lin_neg, h_pos, h_neg, lo_pos, lo_neg, hi_pos,
                 hi_neg, kink, intercept, smo_tol, polish_tol, first, last, todo, alpha, f, b, solved,
                 steps):  # pragma: no cover - compiled
    """:func:`_solve_pair` on the pairs ``first`` to ``last - 1`` marked in ``todo`` (concatenated as in
    :class:`PairSolution`)."""
    for p in range(first, last):
        if not todo[p]:
            continue
        s, e = offsets[p], offsets[p + 1]
        max_steps = MAX_STEPS_PER_POINT * (e - s) + 10_000
        ok, bp, taken = _solve_pair(points, family, scale, rows[s:e], y[s:e], lin_pos, lin_neg, h_pos, h_neg, lo_pos,
                                    lo_neg, hi_pos, hi_neg, kink, intercept, smo_tol, polish_tol, max_steps,
                                    alpha[s:e], f[s:e])
        b[p] = bp
        solved[p] = ok
        steps[p] = taken


def _dual_data(loss: Loss, c: torch.Tensor, sign: float):
    """``(lin, h, lo, hi)`` of every row (float64 numpy, length n) as a point of target ``sign``
    (:func:`joker_ext.active_set.box_qp`)."""
    y = torch.full_like(c, sign)
    return tuple(np.ascontiguousarray(torch.as_tensor(t, dtype=c.dtype).expand(c.shape[0]).numpy(), dtype=np.float64)
                 for t in box_qp(loss, y, c))


def pair_rows(y_idx: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, y, offsets)`` of every pair of :func:`class_pairs`, concatenated: pair ``(i, j)``'s rows are those
    of class ``i`` (target +1) then of class ``j`` (-1), each in their order in the data."""
    members = [np.flatnonzero(y_idx == i) for i in range(k)]
    rows, y, offsets = [], [], [0]
    for i, j in class_pairs(k):
        rows += [members[i], members[j]]
        y += [np.ones(members[i].size), -np.ones(members[j].size)]
        offsets.append(offsets[-1] + members[i].size + members[j].size)
    return np.concatenate(rows).astype(np.int64), np.concatenate(y), np.asarray(offsets, dtype=np.int64)


def _ranges(offsets: np.ndarray, parts: int) -> List[Tuple[int, int]]:
    """Consecutive ranges of pairs of about equal work (a pair of ``m`` points costs about ``m^2``)."""
    sizes = np.diff(offsets).astype(np.float64)
    work = np.cumsum(sizes ** 2)
    cuts = [0] + [int(np.searchsorted(work, work[-1] * q / parts)) + 1 for q in range(1, parts)] + [sizes.size]
    cuts = sorted(set(min(max(cut, 0), sizes.size) for cut in cuts))
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def solve_pairs_batch(kernel, loss: Loss, X: torch.Tensor, y_idx: np.ndarray, c: torch.Tensor, k: int, *,
                      intercept: bool, threads: int = 1, todo: Optional[np.ndarray] = None) -> PairSolution:
    """The problems of the pairs marked in ``todo`` (default: all) by the compiled batch (see the module's
    docstring), on ``threads`` threads; the others are left at zero, unsolved. ``X``: the inputs (n x d, float64,
    CPU); ``c``: the costs ``C w`` (float64, n); the kernel's rows must be formable in the loop
    (:func:`batch_applies`)."""
    rows, y, offsets = pair_rows(y_idx, k)
    todo = np.ones(offsets.size - 1, dtype=np.bool_) if todo is None else np.asarray(todo, dtype=np.bool_)
    former = row_former(kernel, X)
    pos, neg = _dual_data(loss, c, 1.0), _dual_data(loss, c, -1.0)
    unit = max(float(np.abs(pos[0]).max()), float(np.abs(neg[0]).max()), float(loss.kink), 1e-300)
    P = offsets.size - 1
    alpha, f = np.zeros(rows.size), np.zeros(rows.size)
    b, solved, steps = np.zeros(P), np.zeros(P, dtype=np.bool_), np.zeros(P, dtype=np.int64)

    def run(span):
        _solve_range(former.points, former.family, former.scale, rows, y, offsets, pos[0], neg[0], pos[1], neg[1],
                     pos[2], neg[2], pos[3], neg[3], float(loss.kink), bool(intercept), SMO_TOL * unit,
                     POLISH_TOL * unit, span[0], span[1], todo, alpha, f, b, solved, steps)

    work = float((np.diff(offsets).astype(np.float64)[todo] ** 2).sum())
    threads = max(1, int(threads)) if work > THREADS_MIN_WORK else 1
    spans = _ranges(offsets, threads * SPANS_PER_THREAD if threads > 1 else 1)
    if threads == 1 or len(spans) == 1:
        for span in spans:
            run(span)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(run, spans))
    return PairSolution(rows, y, offsets, alpha, f, b, solved, steps)


def pair_gaps(loss: Loss, sol: PairSolution, c: torch.Tensor):
    """``(primal, dual, gap, rel_gap)`` per pair (float64 numpy arrays): the engines' certificate of a column
    (:func:`joker_ext.active_set.certificate`), its sums taken over each pair's rows."""
    P = sol.offsets.size - 1
    which = torch.from_numpy(np.repeat(np.arange(P), np.diff(sol.offsets)))
    b = torch.from_numpy(sol.b)

    def per_pair(values):
        return torch.zeros(P, dtype=torch.float64).index_add_(0, which, values.reshape(-1))

    column = [torch.from_numpy(v).reshape(-1, 1) for v in (sol.y, sol.f, sol.alpha)]
    out = certificate(loss, *column, c[torch.from_numpy(sol.rows)].reshape(-1, 1), b,
                      b_rows=b[which].reshape(-1, 1), total=per_pair)
    return tuple(v.numpy() for v in out)


class OneVsOneFit(NamedTuple):
    """Every pair's solution: ``dual_coef`` (n x P, pair ``p``'s coefficients in column ``p``, zero outside its
    rows), ``intercept`` (P), per pair its primal and dual objectives, gap, relative gap, iterations (SMO steps
    for a pair of the batch, the engine's iterations otherwise) and status, and whether the batch solved it."""
    dual_coef: np.ndarray
    intercept: np.ndarray
    primal: np.ndarray
    dual: np.ndarray
    gap: np.ndarray
    rel_gap: np.ndarray
    n_iter: np.ndarray
    statuses: List[str]
    batched: np.ndarray

    @property
    def status(self) -> str:
        """'converged' when every pair converged, else the first other status."""
        return next((s for s in self.statuses if s != "converged"), "converged")


def fit_one_vs_one(plan, X: np.ndarray, y_idx: np.ndarray, k: int, *, fit_pair: Callable, batch: bool = True
                   ) -> OneVsOneFit:
    """Solve every pair of classes of the fit plan ``plan`` (:class:`joker_ext.plan.FitPlan`: kernel, loss, costs
    ``c``, intercept, tolerance) on the inputs ``X`` (n x d) with class indices ``y_idx``: the compiled batch where
    it applies (``batch`` and :func:`batch_applies`), certified pair by pair, and ``fit_pair(rows, y, start)`` (a
    fitted binary estimator on those rows with targets +1 / -1, from ``start``: the batch's ``(alpha, b)`` where it
    tried the pair, else None) for the rest."""
    rows, y, offsets = pair_rows(y_idx, k)
    P = offsets.size - 1
    which = np.repeat(np.arange(P), np.diff(offsets))
    dual_coef, intercept = np.zeros((X.shape[0], P)), np.zeros(P)
    primal, dual, gap, rel = np.zeros(P), np.zeros(P), np.zeros(P), np.zeros(P)
    n_iter, statuses, done = np.zeros(P, dtype=np.int64), ["converged"] * P, np.zeros(P, dtype=bool)
    c = plan.c.detach().to(torch.float64).cpu()
    sol = None
    threads = torch.get_num_threads()
    # the batch holds a pair's kernel block (m^2 numbers, touched only where the steps form rows) on each thread
    budget = PAIR_BLOCK_BYTES if plan.memory_budget is None else min(PAIR_BLOCK_BYTES, plan.memory_budget / threads)
    todo = 8.0 * np.diff(offsets).astype(np.float64) ** 2 <= budget
    if batch and todo.any() and plan.feature_map is None and batch_applies(plan.kernel, plan.loss, plan.device, c):
        sol = solve_pairs_batch(plan.kernel, plan.loss, torch.from_numpy(np.asarray(X, dtype=np.float64)), y_idx, c,
                                k, intercept=plan.intercept != "none", threads=threads, todo=todo)
        primal, dual, gap, rel = pair_gaps(plan.loss, sol, c)
        # certified: to the tolerance, or, polished (solved exactly up to rounding), to the rounding floor
        done = todo & ((rel <= plan.options.tol) | (sol.solved & (rel <= ROUNDING_GAP[torch.float64])))
        kept = done[which]
        dual_coef[rows[kept], which[kept]] = sol.alpha[kept]
        intercept = np.where(done, sol.b, 0.0)
        n_iter = sol.steps.copy()
    for p in np.flatnonzero(~done):
        span = slice(offsets[p], offsets[p + 1])
        # a pair the batch left uncertified starts from its point (at large C its gap was within the rounding noise
        # of f = K alpha but above the floor: satimage, C = 1000)
        start = (sol.alpha[span], float(sol.b[p])) if todo[p] and sol is not None else None
        est = fit_pair(rows[span], y[span], start)
        dual_coef[rows[span], p] = est.dual_coef_[:, 0]
        intercept[p] = float(np.ravel(est.intercept_)[0])
        primal[p], dual[p], gap[p], rel[p] = (est.primal_objective_, est.dual_objective_, est.duality_gap_,
                                              est.relative_gap_)
        n_iter[p], statuses[p] = est.n_iter_, est.status_
    return OneVsOneFit(dual_coef, intercept, primal, dual, gap, rel, n_iter, statuses, done)


def vote(F: np.ndarray, k: int) -> np.ndarray:
    """Votes (n x k) of the pairs' decision values ``F`` (n x P, :func:`class_pairs`' order): pair ``(i, j)`` votes
    for ``i`` where its value is positive, for ``j`` otherwise."""
    votes = np.zeros((F.shape[0], k))
    for p, (i, j) in enumerate(class_pairs(k)):
        votes[:, i] += F[:, p] > 0
        votes[:, j] += F[:, p] <= 0
    return votes


def ovr_scores(F: np.ndarray, k: int) -> np.ndarray:
    """One score per class from the pairs' decision values (SVC's ``decision_function_shape='ovr'``): its votes
    plus ``s / (3 (|s| + 1))``, ``s`` the sum of its pairs' values (signed towards it), a term within ``(-1/3,
    1/3)`` that orders classes with as many votes and never overturns a vote."""
    s = np.zeros((F.shape[0], k))
    for p, (i, j) in enumerate(class_pairs(k)):
        s[:, i] += F[:, p]
        s[:, j] -= F[:, p]
    return vote(F, k) + s / (3.0 * (np.abs(s) + 1.0))


def coupled_probabilities(F: np.ndarray, k: int) -> np.ndarray:
    """Class probabilities (n x k) from the pairs' logistic decision values ``F`` (n x P): pair ``(i, j)`` says
    ``r_ij = sigmoid(f_ij)`` for ``P(i | i or j)``, and the classes' probabilities are coupled from them as Price,
    Kner, Personnaz and Dreyfus (1995) do, ``p_i proportional to 1 / (sum_{j != i} 1 / r_ij - (k - 2))`` (exact when
    the ``r_ij`` are ``p_i / (p_i + p_j)`` of some distribution), normalised to sum to one."""
    inverse = np.zeros((F.shape[0], k))
    for p, (i, j) in enumerate(class_pairs(k)):
        # 1 / sigmoid(t) = 1 + exp(-t), with exp's overflow clipped (a probability of 0 then)
        inverse[:, i] += 1.0 + np.exp(np.minimum(-F[:, p], 700.0))
        inverse[:, j] += 1.0 + np.exp(np.minimum(F[:, p], 700.0))
    P = 1.0 / np.maximum(inverse - (k - 2), 1.0)
    return P / P.sum(axis=1, keepdims=True)
