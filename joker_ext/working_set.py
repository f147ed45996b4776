"""Working-set decomposition (``solver='working_set'``) for exact kernels and losses whose conjugate is linear
on its box (hinge, epsilon-insensitive, absolute, pinball: the support-vector losses).

Problem, per target column (the notation of :mod:`joker_ext.active_set`)::

    min_alpha  1/2 alpha^T K alpha + sum_i [-alpha_i (y_i - p0_i) + h_i alpha_i^2 / 2 + kink |alpha_i|]
    s.t.       lo_i <= alpha_i <= hi_i            (and sum_i alpha_i = 0 with an intercept)

Its solutions are sparse: most ``alpha_i`` sit at a bound or at the kink, and only the *free* ones (on the
margin) take values that a linear system decides. The engine never forms ``K``. Every outer iteration:

1. **KKT check** from ``f = K alpha`` (kept up to date): each coordinate's optimality condition holds for
   the intercepts ``b`` in an interval ``[l_i, u_i]`` (:meth:`_Column.intercept_bounds`); ``alpha`` is
   optimal iff ``max_i l_i <= min_i u_i`` (without intercept: ``l_i <= 0 <= u_i``). The duality gap at
   ``(K alpha + b, alpha)`` with the best ``b`` is the stopping certificate.
2. **Working set** ``B``: the free coordinates and the worst violators, ``max(q, 2 |free|)`` in all
   (with an intercept, half with the largest ``l_i`` and half with the smallest ``u_i``: the maximal
   violating pairs of LIBSVM's WSS1). A subproblem that cannot hold every free coordinate makes the
   decomposition crawl, so the set grows with the free set.
3. **Subproblem** on ``B`` with the others fixed: the same problem on ``K_BB`` with the linear term
   shifted by ``K_BN alpha_N`` and ``sum alpha_B`` kept; solved by the proximal active-set rounds of
   :mod:`joker_ext.active_set` (each round decreases the whole objective, since its proximal term is
   centred at the current point).
4. ``f += K_{:B} (alpha_B^new - alpha_B)`` with the kernel columns of ``B``, kept in an LRU cache of
   ``cache_columns`` columns (LIBSVM keeps a kernel cache for the same reason).

Cost per outer iteration: ``n |B| d`` for the columns not cached, ``n |B|`` for the update, and a few
Cholesky factorisations of the free part of ``K_BB`` (``|B|^3 / 3``). Memory: the cache (``n x
cache_columns``) and ``K_BB``; never ``n x n``. Near the solution ``B`` holds every free coordinate and
the last violators, and its subproblem is the whole problem restricted to the support vectors.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .active_set import (SIGMA_FLOOR, SIGMA_START, _Column, _certify, box_qp_inputs, next_sigma,
                         supports_active_set)
from .engines import WORKING_SET_SIZE, Monitor, register_solver, sigint_as_flag
from .losses import Loss
from .memory import is_out_of_memory
from .solver import SolverOptions, SolverResult

__all__ = ["working_set", "supports_working_set"]

#: Settled proximal rounds per subproblem.
SUB_ROUNDS = 3
#: Tenfold increases of the proximal weight a subproblem may make when its active sets cycle.
MAX_ESCALATIONS = 6
#: Proximal weight (times the kernel's diagonal) at which a cycling subproblem falls back to projected Newton.
SIGMA_CEILING = 10.0


def supports_working_set(loss: Loss) -> bool:
    """A conjugate that is linear or quadratic on its box (``loss.quadratic``)."""
    return supports_active_set(loss)


class _ColumnCache:
    """Columns ``K(X, x_j)`` of the kernel matrix, computed on demand and kept for the ``capacity`` most
    recently used ``j``."""

    def __init__(self, operator, capacity: int, dtype, device):
        n = operator.n
        self.operator, self.capacity = operator, max(1, min(int(capacity), n))
        self.buffer = torch.empty(n, self.capacity, dtype=dtype, device=device)
        self.slot = torch.full((n,), -1, dtype=torch.long, device=device)
        self.owner = torch.full((self.capacity,), -1, dtype=torch.long, device=device)
        self.last_used = torch.full((self.capacity,), -1, dtype=torch.long, device=device)
        self.clock = 0
        self.X = operator.data.all().to(dtype=dtype, device=device)

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        """``K[:, idx]`` (n x |idx|) for unique ``idx`` (computed afresh, uncached, beyond ``capacity``)."""
        if idx.numel() > self.capacity:
            return self.operator.kernel(self.X, self.X[idx])
        self.clock += 1
        missing = idx[self.slot[idx] < 0]
        if missing.numel():
            in_use = torch.zeros(self.capacity, dtype=torch.bool, device=idx.device)
            have = self.slot[idx]
            in_use[have[have >= 0]] = True
            age = torch.where(in_use, torch.full_like(self.last_used, self.clock), self.last_used)
            slots = torch.argsort(age)[: missing.numel()]
            old = self.owner[slots]
            self.slot[old[old >= 0]] = -1
            self.buffer[:, slots] = self.operator.kernel(self.X, self.X[missing])
            self.owner[slots] = missing
            self.slot[missing] = slots
        slots = self.slot[idx]
        self.last_used[slots] = self.clock
        return self.buffer[:, slots]


def _select(col: _Column, a, bounds, q: int, intercept: bool) -> torch.Tensor:
    """The working set: every free coordinate (``lo < a_i < hi``, ``a_i != 0``) and the worst violators of
    the optimality conditions, at least as many as free ones (so the set grows to ``2 |free|`` when the
    free coordinates outnumber ``q / 2``: a decomposition whose subproblems cannot hold the free set
    crawls). ``bounds``: :meth:`_Column.intercept_bounds` at ``a``."""
    lower, upper = bounds
    n = a.numel()
    free = torch.nonzero((a > col.lo) & (a < col.hi) & (a != 0)).reshape(-1)
    budget = min(n, max(q, 2 * free.numel())) - free.numel()
    if intercept:
        half = max(1, budget // 2)
        up = torch.topk(lower, min(half, n)).indices
        down = torch.topk(-upper, min(half, n)).indices
        chosen = torch.cat([up, down])
    else:
        violation = torch.maximum(lower, -upper).clamp_min(0)
        chosen = torch.topk(violation, min(max(1, budget), n)).indices
    return torch.unique(torch.cat([free, chosen]))


def _best_intercept(bounds, b_sub: float) -> float:
    """An intercept for the certificate from ``bounds = (l, u)`` (:meth:`_Column.intercept_bounds`): the
    middle of ``[max l, min u]`` when it is not empty, else the subproblem's multiplier clipped into the
    spread of the bounds."""
    lower, upper = bounds
    lo = float(lower.max()) if torch.isfinite(lower).any() else -math.inf
    hi = float(upper.min()) if torch.isfinite(upper).any() else math.inf
    if lo <= hi:
        if math.isinf(lo) and math.isinf(hi):
            return b_sub
        return hi if math.isinf(lo) else lo if math.isinf(hi) else 0.5 * (lo + hi)
    return min(max(b_sub, hi), lo)


def _subproblem(col: _Column, K_B, B, a, f, b: float, sigma: float, floor: float):
    """Proximal active-set rounds on the block ``B``; returns the new ``a_B``, the subproblem's intercept
    and the next proximal weight."""
    K_BB = K_B[B]
    aB = a[B]
    fB = K_BB @ aB
    sub = _Column(K_BB, K_BB.diagonal().clone(), col.loss, col.y[B], col.c[B], col.intercept,
                  offset=f[B] - fB,
                  total=float(aB.sum()))
    sets, settled = None, 0
    for _ in range(SUB_ROUNDS + MAX_ESCALATIONS):
        out = sub.round(aB, fB, b, aB.clone(), sigma / sub.c, *(sets or (None, None, None)))
        if out is None:  # the sets cycle: a more diagonal round, same centre (cheap next to a fallback)
            if sigma >= SIGMA_CEILING * col.scale:  # diagonal enough and still cycling: monotone fallback
                aB, fB, b = sub.newton_round(aB.clone(), fB.clone(), sigma / sub.c, aB.clone())
                break
            sigma, sets = sigma * 10.0, None
            floor = sigma  # within this subproblem, no smaller weight than one that settled after a cycle
            continue
        aB, fB, b, steps, sets = out
        settled += 1
        sigma = next_sigma(sigma, steps, floor)
        if steps <= 1 or settled == SUB_ROUNDS:
            break
    return aB, b, max(sigma, floor / 10.0)  # the next subproblem starts near what settled here


def working_set(operator, Y: torch.Tensor, loss: Loss, c: torch.Tensor, options: Optional[SolverOptions] = None,
                *, alpha0: Optional[torch.Tensor] = None, state0=None, start_iter: int = 0, callback=None,
                validation=None, snapshot=None, snapshot_every=None, intercept: bool = False,
                working_set_size: int = WORKING_SET_SIZE, cache_columns: Optional[int] = None, **_resume) -> SolverResult:
    """Minimise the dual by working-set decomposition (see the module docstring).

    Parameters
    ----------
    operator : ExactOperator
        Gives the kernel (``operator.kernel``) and the rows (``operator.data``).
    Y : Tensor (n, T)
    loss : Loss
        With ``loss.quadratic``.
    c : Tensor (n,)
        ``c_i = C w_i > 0``.
    options : SolverOptions
        ``max_iter`` outer iterations, ``tol`` on the relative duality gap, ``max_time``.
    alpha0 : Tensor (n, T), optional
        Warm start (projected on the box; with an intercept it must sum to zero per column to be used).
    intercept : bool
        Fit an unregularized intercept per column (``state['intercept']``).
    working_set_size : int
        ``q``, coordinates per subproblem.
    cache_columns : int, optional
        Kernel columns kept (default ``min(n, 4 q)``).
    """
    opts, c_col, alpha = box_qp_inputs("working_set", operator, Y, loss, c, options, alpha0)
    n, T = Y.shape
    dtype, device = Y.dtype, Y.device
    if intercept:  # a start off the hyperplane sum a = 0 is not feasible: those columns start from zero
        alpha[:, alpha.sum(0).abs() > 1e-12 * alpha.abs().sum(0).clamp_min(1.0)] = 0.0
    q = max(2, min(int(working_set_size), n))
    cache = _ColumnCache(operator, cache_columns or min(n, 4 * q), dtype, device)
    mon = Monitor(opts, callback=callback, validation=validation, snapshot=snapshot, snapshot_every=snapshot_every,
                  dtype=dtype)
    b_all = torch.zeros(T, dtype=dtype, device=device)
    state = {"f": torch.zeros_like(alpha)}
    if intercept:
        state["intercept"] = b_all
    status, it, rec = "max_iter", start_iter, None
    with sigint_as_flag(opts.handle_sigint) as sig:
        try:
            F = operator.init_state(alpha)["f"] if bool((alpha != 0).any()) else torch.zeros_like(alpha)
            diagK = operator.kernel.diag(cache.X)
            columns = [_Column(None, diagK, loss.column(t), Y[:, t], c_col, intercept) for t in range(T)]
            scale = columns[0].scale
            sigma = [SIGMA_START * scale] * T
            b_sub = [0.0] * T
            # each column's intercept intervals at its current point (the next working set and b come from them)
            bounds = [col.intercept_bounds(alpha[:, t], F[:, t] + col.h * alpha[:, t] - col.lin)
                      for t, col in enumerate(columns)]
            if intercept:
                b_all = torch.tensor([_best_intercept(bounds[t], 0.0) for t in range(T)], dtype=dtype,
                                     device=device)
            rec = _certify(mon, loss, Y, F, alpha, b_all, c_col, it, state, sigma)
            reason = "converged" if rec["rel_gap"] <= opts.tol else None
            while reason is None and it < opts.max_iter:
                for t, col in enumerate(columns):
                    if rec["column_rel_gap"][t] <= opts.tol:
                        continue
                    a = alpha[:, t]
                    B = _select(col, a, bounds[t], q, intercept)
                    K_B = cache(B)
                    aB, b_sub[t], sigma[t] = _subproblem(col, K_B, B, a, F[:, t], b_sub[t], sigma[t],
                                                         SIGMA_FLOOR * scale)
                    delta = aB - a[B]
                    moved = delta != 0
                    if bool(moved.any()):
                        F[:, t] += K_B[:, moved] @ delta[moved]
                        a[B] = aB
                    bounds[t] = col.intercept_bounds(a, F[:, t] + col.h * a - col.lin)
                    if intercept:
                        b_all[t] = _best_intercept(bounds[t], b_sub[t])
                it += 1
                rec = _certify(mon, loss, Y, F, alpha, b_all, c_col, it, state, sigma)
                reason = mon.stop_reason(rec, state, alpha, sig.flag)
            status = reason or "max_iter"
        except (RuntimeError, MemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            status = "out_of_memory"
    return mon.result(alpha, state, it, status, rec)


register_solver("working_set", "exact", working_set, intercept=True)
