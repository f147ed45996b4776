"""The unregularized intercept around any engine: :func:`fit_intercept_search`.

One job: fit ``f(x) = sum_i alpha_i k(x_i, x) + b`` (exact kernel) or ``f(x) = phi(x)^T beta + b`` (features) with an
unregularized ``b`` per target column, for the engines that do not fit ``b`` themselves (DBCD-TR, the Newton
engines; those registered with ``intercept=True`` in :mod:`joker_ext.engines` keep the dual constraint
``sum_i alpha_i = 0`` inside). :func:`joker_ext.model.fit_dual` calls it for ``intercept=True`` with such an
engine, so every face (the scikit-learn estimators, JokerFalkon / JokerLogisticFalkon, JokerGP) gets the same
search; :attr:`joker_ext.plan.FitPlan.intercept` is ``'search'`` then.

Conventions (those of :mod:`joker_ext.losses` and :mod:`joker_ext.plan`). For each target column the problem is

    min_{f, b}  1/2 ||f||_H^2 + sum_i c_i l(y_i, f(x_i) + b),          c_i = C w_i,

with the same ``c_i`` (LIBSVM's C times the sample weights; ``C = 1 / (n * penalty)`` for Falkon's penalty,
``c_i = 1 / noise`` for a GP likelihood): no lambda of its own. Its dual (minimisation form) is

    min_alpha  1/2 alpha^T K alpha + sum_i g_i(alpha_i)    subject to    sum_i alpha_i = 0,

and the intercept ``b`` is the Lagrange multiplier of the constraint with this sign: for a fixed ``b`` the loss
``l_b(y, f) = l(y, f + b)`` (:class:`OffsetLoss`) has conjugate term ``g_i(a) + a b``, so the dual of the problem
with the offset is the original dual plus ``b sum_i alpha_i``. ``s(b) = sum_i alpha_i(b)`` is nonincreasing in
``b`` and the intercept is its root. The sign of ``alpha`` is that of the engines (``alpha_i = c_i (y_i - f_i - b)``
at the optimum of the squared loss), so at the optimum ``K alpha + b 1 = y - alpha / c`` for the squared loss:
the bordered system ``[[K + diag(1/c), 1], [1^T, 0]] [alpha; b] = [y; 0]``.

Nothing here imports the estimators or :mod:`joker_ext.model`: the engine run is passed in as ``solve``.
"""
from __future__ import annotations

import dataclasses
import math
import time
import warnings
from typing import Callable, Optional

import numpy as np
import torch

from .distributed import SingleProcess
from .engines import at_rounding_floor, target_level
from .features import ConcatFeatureMap, FeatureMap
from .kernels import Kernel, SumKernel
from .losses import Loss
from .operators import ExactOperator, FeatureOperator
from .results import SolverResult
from .solver import SolverOptions

__all__ = ["fit_intercept_search", "OffsetLoss", "ConstantKernel", "ConstantFeature", "RootSearch", "feasible_dual",
           "MAX_INTERCEPT_ROUNDS"]

#: Largest number of (warm-started) dual solves of the intercept search.
MAX_INTERCEPT_ROUNDS = 60
#: Rounds at the rounding floor (:func:`~joker_ext.engines.at_rounding_floor`) without the joint gap halving before the
#: search stops as converged.
FLOOR_ROUNDS = 3


class OffsetLoss(Loss):
    """``l_b(y, f) = l(y, f + b_t)`` for target column t: the loss of a model with a fixed intercept.

    Its conjugate term is ``g_b(a) = g(a) + a b`` (``l_b*(s) = l*(s) - s b``), so the dual of the problem
    with the offset is the original dual plus the linear term ``b sum_i alpha_i`` per column: ``b`` is the
    Lagrange multiplier of the constraint ``sum_i alpha_i = 0`` that an unregularized intercept adds.
    """

    def __init__(self, base: Loss, offset: torch.Tensor):
        self.base = base
        self.offset = offset
        self.name = base.name
        self.margin = base.margin
        self.quadratic = base.quadratic
        self.kink = base.kink

    def _b(self, a: torch.Tensor) -> torch.Tensor:
        return self.offset.to(dtype=a.dtype, device=a.device)

    def value(self, y, f):
        return self.base.value(y, f + self._b(f))

    def psi(self, a, y, c):
        return self.base.psi(a, y, c) + a * self._b(a)

    def psi_grad(self, a, y, c):
        return self.base.psi_grad(a, y, c) + self._b(a)

    def psi_hess(self, a, y, c):
        return self.base.psi_hess(a, y, c)

    def psi_diff(self, a, s, y, c):
        return self.base.psi_diff(a, s, y, c) + s * self._b(a)

    def box(self, y, c):
        return self.base.box(y, c)

    def conj(self, a, y, c):
        return self.base.conj(a, y, c) + a * self._b(a)

    def conj_grad(self, a, y, c):
        return self.base.conj_grad(a, y, c) + self._b(a)

    def conj_diff(self, a, s, y, c):
        return self.base.conj_diff(a, s, y, c) + s * self._b(a)

    def fenchel_young(self, y, f, a, c):
        return self.base.fenchel_young(y, f + self._b(f), a, c)

    def smoothed_dual(self, f, y, c, smoothing=0.0):
        return self.base.smoothed_dual(f + self._b(f), y, c, smoothing)

    def column(self, t):
        return OffsetLoss(self.base, self.offset.reshape(-1)[t : t + 1])

    def check_targets(self, y):
        self.base.check_targets(y)

    def params(self):
        return self.base.params()


class ConstantKernel(Kernel):
    """``k(x, y) = rho``: the augmentation ``rho/2 (sum_i alpha_i)^2`` of the intercept search."""

    supports_random_features = False

    def __init__(self, rho: float):
        self.rho = float(rho)

    def __call__(self, X1, X2):
        return torch.full((X1.shape[0], X2.shape[0]), self.rho, dtype=X1.dtype, device=X1.device)

    def diag(self, X):
        return torch.full((X.shape[0],), self.rho, dtype=X.dtype, device=X.device)

    def describe(self) -> dict:
        return {"type": "constant", "value": self.rho}

    def __repr__(self) -> str:
        return f"ConstantKernel({self.rho:g})"


class ConstantFeature(FeatureMap):
    """The one feature ``sqrt(rho)`` of :class:`ConstantKernel` (random-feature mode)."""

    def __init__(self, rho: float):
        self.rho = float(rho)
        self.n_features = 1

    def __call__(self, X):
        return torch.full((X.shape[0], 1), math.sqrt(self.rho), dtype=X.dtype, device=X.device)


def feasible_dual(alpha: torch.Tensor, shards: Optional[SingleProcess] = None) -> torch.Tensor:
    """Shrink the side (positive or negative entries) carrying the excess so that every column of
    ``alpha`` sums to zero. Every loss box contains 0 and is an interval, so shrinking towards 0 stays
    inside it; the result is feasible for the dual of the problem with an intercept. (``shards``: the
    sums run over the rows of every process.)"""
    pos, neg = alpha.clamp_min(0), (-alpha).clamp_min(0)
    scale_pos, scale_neg = feasible_scales(*(shards or SingleProcess()).sum_many(pos.sum(0), neg.sum(0)))
    return pos * scale_pos - neg * scale_neg


def feasible_scales(pos_sum: torch.Tensor, neg_sum: torch.Tensor):
    """The factors ``(scale_pos, scale_neg)`` of :func:`feasible_dual` for columns whose positive entries sum to
    ``pos_sum`` and whose negative ones to ``-neg_sum``: the larger side shrinks to the smaller one's size."""
    tiny = torch.finfo(pos_sum.dtype).tiny
    scale_pos = torch.where(pos_sum > neg_sum, neg_sum / pos_sum.clamp_min(tiny), torch.ones_like(pos_sum))
    scale_neg = torch.where(neg_sum > pos_sum, pos_sum / neg_sum.clamp_min(tiny), torch.ones_like(neg_sum))
    return scale_pos, scale_neg


class RootSearch:
    """Safeguarded search, per column, for the root of the nonincreasing function ``s(b)``.

    First moves take the proximal step ``b + rho s(b)`` (the intercept of the augmented problem, which
    never overshoots the root: ``b + rho s(b)`` is the proximal map of the concave dual function of
    ``b``, so its slope lies in [0, 1]) or a secant step stretched by 1.5 when that is longer, or twice the
    last step where ``s`` did not change over it (flat where every alpha sits at a bound: hinge at C = 0.01 took
    proximal steps of 0.012 towards a root at about -1 and ran out of rounds), so that a bracket forms quickly;
    inside a bracket it uses the Illinois variant of regula falsi, falling back to bisection when a step would
    leave the bracket. No step is shorter than the proximal step; a
    bracket end that a step passes (its sign of ``s`` was spoiled by rounding in the inner solve) is
    dropped.
    """

    def __init__(self, b0: np.ndarray, rho: float):
        self.b = np.array(b0, dtype=np.float64)
        self.rho = rho
        T = self.b.shape[0]
        self.lo = np.full(T, -np.inf)
        self.hi = np.full(T, np.inf)
        self.s_lo = np.zeros(T)
        self.s_hi = np.zeros(T)
        self.side = np.zeros(T, dtype=np.int64)  # side retained twice in a row (Illinois)
        self.prev_b: Optional[np.ndarray] = None
        self.prev_s: Optional[np.ndarray] = None

    def update(self, s: np.ndarray) -> np.ndarray:
        b = self.b
        new = b.copy()
        for t in range(b.shape[0]):
            st = s[t]
            if st > 0:
                if b[t] >= self.lo[t]:
                    self.lo[t], self.s_lo[t] = b[t], st
                    if self.side[t] == -1 and np.isfinite(self.hi[t]):
                        self.s_hi[t] *= 0.5
                    self.side[t] = -1
            elif st < 0:
                if b[t] <= self.hi[t]:
                    self.hi[t], self.s_hi[t] = b[t], st
                    if self.side[t] == 1 and np.isfinite(self.lo[t]):
                        self.s_lo[t] *= 0.5
                    self.side[t] = 1
            else:
                continue
            if np.isfinite(self.lo[t]) and np.isfinite(self.hi[t]):
                # Illinois regula falsi on the bracket [lo, hi] where s(lo) > 0 > s(hi).
                w_lo, w_hi = abs(self.s_hi[t]), abs(self.s_lo[t])
                cand = (self.lo[t] * w_lo + self.hi[t] * w_hi) / (w_lo + w_hi)
                if not (self.lo[t] < cand < self.hi[t]):
                    cand = 0.5 * (self.lo[t] + self.hi[t])
                new[t] = cand
            else:
                step = self.rho * st
                if self.prev_b is not None and self.prev_s[t] != st and self.prev_b[t] != b[t]:
                    sec = -st * (b[t] - self.prev_b[t]) / (st - self.prev_s[t])
                    if np.isfinite(sec) and sec * st > 0 and abs(1.5 * sec) > abs(step):
                        step = 1.5 * sec
                elif self.prev_b is not None and self.prev_s[t] == st and (b[t] - self.prev_b[t]) * st > 0:
                    # s did not change over the last step (every alpha at a bound of its box: s is flat there):
                    # twice that step, so that a far root is bracketed in a few rounds
                    step = 2.0 * (b[t] - self.prev_b[t])
                new[t] = b[t] + step
            # Never less than the proximal step b + rho s (it cannot pass the root in exact arithmetic); a
            # bracket end that the step crosses came from a value of s spoiled by rounding: drop it.
            prox = b[t] + self.rho * st
            if (new[t] - b[t]) * np.sign(st) < abs(prox - b[t]):
                new[t] = prox
            if new[t] >= self.hi[t]:
                self.hi[t], self.s_hi[t], self.side[t] = np.inf, 0.0, 0
            if new[t] <= self.lo[t]:
                self.lo[t], self.s_lo[t], self.side[t] = -np.inf, 0.0, 0
        self.prev_b, self.prev_s = b.copy(), np.array(s, dtype=np.float64)
        self.b = new
        return new

    _ARRAYS = ("b", "lo", "hi", "s_lo", "s_hi", "side", "prev_b", "prev_s")

    def state_dict(self) -> dict:
        """The search's state as tensors (for a checkpoint; ``prev_b`` and ``prev_s`` absent before the first
        update)."""
        return {k: torch.from_numpy(getattr(self, k).copy()) for k in self._ARRAYS if getattr(self, k) is not None}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s output."""
        for k in self._ARRAYS:
            setattr(self, k, state[k].cpu().numpy().copy() if k in state else None)


def _augmentation_scale(kernel: Kernel, data, shards: SingleProcess) -> float:
    """``rho``: the kernel's scale (its mean diagonal on the first 256 rows), so that ``K`` and the constant part
    are balanced; rank 0's value on every rank."""
    probe = data.take(torch.arange(min(data.n, 256)))
    rho = float(kernel.diag(probe).mean()) if data.n else 1.0
    if not math.isfinite(rho) or rho <= 0:
        rho = 1.0
    return float(shards.broadcast_(torch.tensor([rho], dtype=torch.float64)))


def fit_intercept_search(data, Y: torch.Tensor, *, loss: Loss, c: torch.Tensor, kernel: Kernel,
                         feature_map: Optional[FeatureMap], options: SolverOptions, dtype: torch.dtype,
                         device: torch.device, solve: Callable[..., SolverResult],
                         alpha0: Optional[torch.Tensor] = None, intercept0=None,
                         shards: Optional[SingleProcess] = None, callback: Optional[Callable] = None,
                         snapshot: Optional[Callable] = None, resume: Optional[dict] = None) -> SolverResult:
    """Fit ``f(x) = sum_i alpha_i k(x_i, x) + b`` with an unregularized ``b`` per target around an engine.

    The dual gains the constraint ``sum_i alpha_i = 0``, whose multiplier is ``b`` (module docstring for the
    signs). For a given ``b`` the engine solves the dual of the problem with the loss ``l(y, f + b)``
    (:class:`OffsetLoss`: linear term ``b sum alpha``) and the kernel ``K + rho`` (:class:`ConstantKernel`, or
    the extra feature ``sqrt(rho)`` of :class:`ConstantFeature` with a feature map: the augmentation
    ``rho/2 (sum alpha)^2``, which makes ``s(b) = sum_i alpha_i(b)`` single-valued, continuous and
    nonincreasing); the model of that problem has intercept ``b + rho s(b)``. A safeguarded root search
    (:class:`RootSearch`) drives ``s(b)`` to zero, each solve warm-started from the last. The stopping test is
    the relative duality gap of the joint problem: primal ``P(f, b_eff)`` against the dual at ``alpha`` made
    feasible by :func:`feasible_dual`, with ``b_eff = b + rho s`` (exact kernels) or, with a feature map, that or the
    engine's primal intercept ``b + sqrt(rho) beta_c``, whichever gives the smaller primal
    (:func:`_primal_intercept`). With rows spread over processes every sum over rows is all-reduced
    (``shards``), so each rank takes the same steps.

    Parameters
    ----------
    data : BlockData
        The training rows (this process's, with ``shards``), in ``dtype`` on ``device``.
    Y : Tensor (n, T)
        Targets (-1/+1 for margin losses).
    loss, c, kernel, feature_map, options, dtype, device
        As :func:`joker_ext.model.fit_dual` (``c = C w``; ``options.max_iter`` is the budget of all solves
        together, ``options.tol`` the relative gap of the joint problem).
    solve : callable
        ``solve(loss=, kernel=, feature_map=, options=, alpha0=) -> SolverResult``: one run of the engine without
        intercept on ``data`` and ``Y`` (:func:`joker_ext.model.fit_dual` passes itself with ``intercept=False``).
    alpha0 : Tensor (n, T), optional
        Warm start of the dual variables.
    intercept0 : array (T,), optional
        Warm start of the intercepts (default zeros).
    shards : SingleProcess or RowShards, optional
    callback : callable, optional
        Called after each round with ``{'round', 'iteration', 'time', 'alpha', 'state', 'primal', 'dual', 'gap',
        'rel_gap'}`` of the joint problem (``state`` as in the result); returning True stops the search
        (status 'callback').
    snapshot : SolverCheckpointer, optional
        Writes the search's state (:meth:`SolverCheckpointer.save <joker_ext.checkpoint.SolverCheckpointer.save>`)
        after each round in which the engine iterations of all solves together pass a multiple of
        ``snapshot.every``: the dual variables, the intercepts, :meth:`RootSearch.state_dict`, the best round so
        far and the history, under the key ``'search'``.
    resume : dict, optional
        Such a checkpoint (:func:`joker_ext.checkpoint.load_solver_state`): the search goes on from the round after
        it, with the same solves an uninterrupted search would have made (the same result, bitwise, on the CPU).
        A checkpoint of another problem (other loss, kernel, ``C`` or targets: :func:`_signature`) only warm-starts
        the dual variables and the intercept, with a RuntimeWarning.

    Returns
    -------
    SolverResult
        Of the round with the smallest joint relative gap: ``alpha``; ``state['intercept']`` the intercepts
        (float64, shape (T,)), ``state['beta']`` the feature weights (feature map) or ``state['f']`` the
        predictions ``K alpha`` without intercept (exact kernel), ``state['intercept_rounds']`` the number of
        engine solves; ``n_iter`` the engine iterations of all solves together; ``primal``, ``dual``, ``gap``,
        ``rel_gap`` of the joint problem; ``history`` one record per round (``round``, ``iteration``, ``time``,
        ``primal``, ``dual``, ``gap``, ``rel_gap``, ``intercept``, ``sum_alpha``, ``inner_rel_gap``).
    """
    shards = shards or SingleProcess()
    T = Y.shape[1]
    opts = options
    tol = opts.tol
    rho = _augmentation_scale(kernel, data, shards)
    if feature_map is None:
        kern, fmap = SumKernel([kernel, ConstantKernel(rho)]), None
        base_op = ExactOperator(kernel, data)
    else:
        kern, fmap = kernel, ConcatFeatureMap([feature_map, ConstantFeature(rho)])
        base_op = FeatureOperator(feature_map, data)
    Yd = Y.to(device=device, dtype=dtype)
    cd = c.to(device=device, dtype=dtype).reshape(-1, 1)
    b0 = None if intercept0 is None else np.asarray(
        intercept0.detach().cpu() if torch.is_tensor(intercept0) else intercept0, dtype=np.float64).reshape(T)
    # (losses of y - f: from the targets' mean, not 0; from 0, targets around 1e4 took five times the iterations)
    first = target_level(loss, Yd, True, shards).double().cpu().numpy() if b0 is None else b0
    search = RootSearch(first, rho)
    alpha = alpha0
    total, rounds = 0, 0
    history = []
    best = None
    eps = torch.finfo(dtype).eps
    t0 = time.perf_counter()
    # Inexact early solves: each to a hundredth of the joint gap of the previous round (an inexact
    # augmented Lagrangian); the floor 64 eps is where float rounding makes the gap stall.
    floor = 64 * torch.finfo(dtype).eps
    tol_eff = max(tol, floor)
    inner_tol = max(tol_eff, 1e-6)
    halved_at, stale = math.inf, 0  # the joint gap when it last halved, and the rounds since
    # (only a checkpoint needs the problem's signature)
    problem = None if snapshot is None and resume is None else _signature(loss, kernel, feature_map, Yd, cd)
    if resume is not None and resume["search"].get("problem") != problem:
        # another problem's search (other C, loss or kernel): its brackets on b would mislead this one's, so its
        # dual point and intercept are only a warm start
        warnings.warn("resume holds the intercept search of another problem (loss, kernel, costs or targets "
                      "differ): its dual variables and intercept are used as a warm start", RuntimeWarning,
                      stacklevel=3)
        alpha = resume["alpha"].to(device=device, dtype=dtype)
        search = RootSearch(resume["search"]["root"]["b"].cpu().numpy(), rho)
        resume = None
    if resume is not None:
        alpha = resume["alpha"].to(device=device, dtype=dtype)
        saved = resume["search"]
        search.load_state_dict(saved["root"])
        total, rounds, inner_tol = int(resume["iteration"]), int(saved["rounds"]), float(saved["inner_tol"])
        halved_at, stale = float(saved["halved_at"]), int(saved["stale"])
        history = [_record_from_plain(r) for r in saved["history"]]
        best = _best_from_checkpoint(saved["best"], device, dtype)
        t0 -= float(saved["time"])
    while True:
        b = torch.as_tensor(search.b, dtype=torch.float64)
        elapsed = time.perf_counter() - t0
        # Half of the remaining budget per solve, so that a solve stalled at the rounding floor
        # leaves room for the search to go on.
        inner = dataclasses.replace(opts, max_iter=max(1, -(-(opts.max_iter - total) // 2)), tol=inner_tol,
                                    max_time=None if opts.max_time is None else max(1e-3, opts.max_time - elapsed))
        res = solve(loss=OffsetLoss(loss, b), kernel=kern, feature_map=fmap, options=inner, alpha0=alpha)
        total += res.n_iter
        rounds += 1
        alpha = res.alpha
        (s,) = shards.sum_many(alpha.sum(0))
        s = s.double().cpu().numpy()
        b_eff = search.b + rho * s
        # Joint duality gap (base kernel, intercept b_eff).
        if fmap is None:
            F = res.state["f"] - torch.as_tensor(rho * s, dtype=dtype, device=device)  # K alpha
            beta = None
            (loss_terms,) = shards.sum_many((cd * loss.value(Yd, F + _device(b_eff, F))).sum(0))
        else:
            beta = res.state["beta"][:-1]
            F = base_op.predictions({"beta": beta}, alpha)
            b_primal = search.b + math.sqrt(rho) * res.state["beta"][-1].double().cpu().numpy()
            b_eff, loss_terms = _primal_intercept(loss, Yd, cd, F, shards, b_eff, b_primal)
        # ||f||^2 of the model itself: alpha^T K alpha (F = K alpha), or ||beta||^2 (beta is the model; the engine's
        # alpha is its dual point, with Phi^T alpha = beta only at the optimum)
        (quad,) = shards.sum_many((alpha * F).sum(0)) if fmap is None else ((beta * beta).sum(0),)
        primal = 0.5 * quad + loss_terms
        alpha_f = feasible_dual(alpha, shards)
        delta = alpha_f - alpha
        if fmap is None:
            Ff = F + base_op.init_state(delta)["f"]
            quad_f = (alpha_f * Ff).sum(0)
        else:
            beta_f = shards.sum_(base_op.init_state(alpha_f)["beta"])
            quad_f = (beta_f * beta_f).sum(0)
        (conj_terms,) = shards.sum_many(loss.conj(alpha_f, Yd, cd).sum(0))
        dual = 0.5 * quad_f + conj_terms
        P, D = float(primal.sum()), float(dual.sum())
        gap = P + D
        rel = gap / max(abs(P), abs(D), torch.finfo(dtype).tiny)
        rec = {"round": rounds, "iteration": total, "time": time.perf_counter() - t0, "primal": P, "dual": D,
               "gap": gap, "rel_gap": rel, "intercept": b_eff.copy(), "sum_alpha": s.copy(),
               "inner_rel_gap": res.rel_gap}
        history.append(rec)
        if best is None or rel <= best["rel_gap"]:
            best = dict(rec, result=res, beta=beta, f=F if fmap is None else None)
        if rel <= tol_eff:
            status = "converged"
            break
        halved_at, stale = (rel, 0) if rel <= 0.5 * halved_at else (halved_at, stale + 1)
        if stale >= FLOOR_ROUNDS and at_rounding_floor(best["rel_gap"], tol, dtype):
            status = "converged"  # at the rounding floor, and no longer falling (the engines' own rule)
            break
        if callback is not None and callback({"round": rounds, "iteration": total, "time": rec["time"],
                                              "alpha": alpha, "state": _state(b_eff, beta, F, fmap, device),
                                              "primal": P, "dual": D, "gap": gap, "rel_gap": rel}):
            status = "callback"
            break
        inner_tol = max(tol_eff, min(inner_tol, 1e-2 * rel, rel * rel))
        # s at the rounding level of a sum of the alphas: the search cannot resolve b any better.
        (abs_sum,) = shards.sum_many(alpha.abs().sum(0))
        stagnant = bool(np.all(np.abs(s) <= 16 * eps * abs_sum.double().cpu().numpy()))
        out_of_time = opts.max_time is not None and time.perf_counter() - t0 >= opts.max_time
        if stagnant:
            status = "converged" if at_rounding_floor(best["rel_gap"], tol, dtype) else "stalled"
            break
        if res.status in ("max_time", "interrupted", "callback") or total >= opts.max_iter or out_of_time \
                or rounds >= MAX_INTERCEPT_ROUNDS:
            # (a search out of rounds while its engine had iterations left stalled: more max_iter would not help)
            status = res.status if res.status not in ("converged", "max_iter") else (
                "max_time" if out_of_time else "max_iter" if total >= opts.max_iter else "stalled")
            break
        search.update(s)
        if snapshot is not None and total // snapshot.every > (total - res.n_iter) // snapshot.every:
            snapshot.save(_checkpoint(alpha, search, total, rounds, inner_tol, halved_at, stale, history, best,
                                      time.perf_counter() - t0, problem))
    state = _state(best["intercept"], best["beta"], best["f"], fmap, device)
    state["intercept_rounds"] = torch.tensor(rounds, dtype=torch.int64)
    inner_res = best["result"]
    return SolverResult(alpha=inner_res.alpha, state=state, n_iter=total, status=status, primal=best["primal"],
                        dual=best["dual"], gap=best["gap"], rel_gap=best["rel_gap"], radius=inner_res.radius,
                        history=history)


def _signature(loss: Loss, kernel: Kernel, feature_map: Optional[FeatureMap], Y: torch.Tensor, c: torch.Tensor) -> str:
    """What a search checkpoint must match to be resumed: the loss and its parameters, the kernel and feature map, the
    shapes and sums of the targets and costs (a checkpoint of the same rows at another ``C`` does not match)."""
    return (f"{loss.name} {loss.params()} | {kernel!r} | {feature_map!r} | {tuple(Y.shape)} "
            f"{float(Y.double().sum()):.17g} {float(c.double().sum()):.17g} {float(c.double().square().sum()):.17g}")


def _checkpoint(alpha, search: RootSearch, total: int, rounds: int, inner_tol: float, halved_at: float, stale: int,
                history: list, best: dict, elapsed: float, problem: str) -> dict:
    """The search's state after a round, as the ``info`` of :meth:`joker_ext.checkpoint.SolverCheckpointer.save`
    (tensors and plain numbers only; ``problem`` the :func:`_signature` it belongs to)."""
    res = best["result"]
    kept = {"alpha": res.alpha, "radius": res.radius, "beta": best["beta"], "f": best["f"]}
    best_plain = {**_record_to_plain({k: v for k, v in best.items() if k not in ("result", "beta", "f")}),
                  **{k: v for k, v in kept.items() if v is not None}}
    return {"alpha": alpha, "state": {"intercept": torch.from_numpy(search.b.copy())}, "radius": None,
            "iteration": total, "rng_state": None,
            "search": {"root": search.state_dict(), "rounds": rounds, "inner_tol": inner_tol, "halved_at": halved_at,
                       "stale": stale, "time": elapsed, "history": [_record_to_plain(r) for r in history],
                       "best": best_plain, "problem": problem}}


def _record_to_plain(rec: dict) -> dict:
    """A round's record with its arrays as lists (a checkpoint holds no numpy objects)."""
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in rec.items()}


def _record_from_plain(rec: dict) -> dict:
    return {k: (np.asarray(v, dtype=np.float64) if k in ("intercept", "sum_alpha") else v) for k, v in rec.items()}


def _best_from_checkpoint(saved: dict, device, dtype) -> dict:
    """The best round's record, its engine result (what the search returns of it) and its ``beta`` / ``f``."""
    move = lambda k: None if saved.get(k) is None else saved[k].to(device=device, dtype=dtype)
    best = _record_from_plain({k: v for k, v in saved.items() if k not in ("alpha", "radius", "beta", "f")})
    best["result"] = SolverResult(alpha=move("alpha"), state={}, n_iter=0, status="resumed", primal=best["primal"],
                                  dual=best["dual"], gap=best["gap"], rel_gap=best["rel_gap"],
                                  radius=saved.get("radius"), history=[])
    best["beta"], best["f"] = move("beta"), move("f")
    return best


def _device(b: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(b, dtype=like.dtype, device=like.device)


def _primal_intercept(loss: Loss, Y, c, F, shards: SingleProcess, b_dual: np.ndarray, b_primal: np.ndarray):
    """Per column, the intercept of the two candidates with the smaller loss term ``sum_i c_i l(y_i, F_i + b)``, and
    those terms: ``b_dual = b + rho s`` (the multiplier the dual's ``sum alpha`` gives) or ``b_primal = b + sqrt(rho)
    beta_c`` (the intercept of the engine's primal iterate, whose constant feature's weight is ``beta_c``). They agree
    at the engine's optimum; an inexact solve's primal iterate pairs its weights with its own intercept (Huber at
    C = 1000, random features: solves stopped at a relative gap of 6e-10 had ``beta_c`` off by 0.013 from
    ``sqrt(rho) s``, and the joint gap at ``b_dual`` stayed at 4e-4 while the search's ``s`` was at rounding level).
    Either pairing with the weights is a point of the joint primal, so the gap stays a certificate."""
    cand = [_device(b_dual, F), _device(b_primal, F)]
    (terms,) = shards.sum_many(torch.stack([(c * loss.value(Y, F + b)).sum(0) for b in cand]))
    pick = terms[1] < terms[0]
    return (np.where(pick.cpu().numpy(), b_primal, b_dual), torch.where(pick, terms[1], terms[0]))


def _state(b_eff: np.ndarray, beta, F, fmap, device) -> dict:
    """The state of the joint problem: the intercepts (float64), and ``beta`` (feature map) or ``f = K alpha``."""
    state = {"intercept": torch.as_tensor(np.array(b_eff, dtype=np.float64), device=device)}
    if fmap is None:
        state["f"] = F
    else:
        state["beta"] = beta
    return state
