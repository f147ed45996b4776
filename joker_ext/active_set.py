"""Primal-dual active-set engine (``solver='active_set'``) for exact kernels and losses whose conjugate is
quadratic or linear on its box: squared, Huber, epsilon-insensitive, absolute, pinball, hinge, squared hinge
(and their scaled versions and infimal convolutions).

Problem, per target column (``K`` the n x n kernel matrix, ``psi'(a) = p0 + h a`` with constant ``h >= 0``)::

    min_alpha  1/2 alpha^T K alpha + sum_i [-alpha_i y_i + p0_i alpha_i + h_i alpha_i^2 / 2 + kink |alpha_i|]
    s.t.       lo_i <= alpha_i <= hi_i            (and sum_i alpha_i = 0 with an intercept)

The intercept ``b`` of ``f(x) = sum_i alpha_i k(x_i, x) + b`` is the multiplier of the equality constraint.

**Proximal point outer loop.** Round ``k`` solves the problem plus ``sum_i s_i / 2 (alpha_i - abar_i)^2`` with
``s_i = sigma_k / c_i`` and the centre ``abar`` the previous round's solution (Rockafellar's proximal point
method; with the equality constraint, the proximal method of multipliers). The term keeps the free block
``K_II + diag(h_I + s_I)`` positive definite where ``h = 0`` (hinge, absolute, pinball, epsilon-insensitive:
``K_II`` alone is numerically singular), and, being centred on the last solution, it does not move the
fixed point: every round's solution is feasible, its duality gap on the *original* problem is the
certificate, and ``sigma`` shrinks 100-fold per round, so a few rounds reach the rounding floor.

**Active-set inner loop** (Hintermueller, Ito and Kunisch's primal-dual active set method, a semismooth
Newton method on the prox-gradient fixed point). From the gradient ``g = K a + (h + s) a - r + b``
(``r = y - p0 + s abar``) and the prox-gradient point ``z = a - g / (diag K + h + s)`` each coordinate is
predicted to sit at ``lo``, at ``hi``, at the kink 0, or free on one side of it; the free set ``I`` then solves

    (K_II + diag(h_I + s_I)) a_I + b 1 = r_I - kink sign_I - K_IA a_A,     1^T a_I = -1^T a_A

(one Cholesky factorisation of the free block, the border for the intercept). A coordinate that a prediction
would carry across its box stops on the way: from one bound to the other it stops free (at the kink when the kink
lies inside the box), and free on one side of the kink it stops at the kink; it goes on at a later step if it must
(jumping straight across made the sets swing). When a prediction repeats the previous one the round's problem is
solved exactly. Should the sets cycle, ``sigma`` grows (a more diagonal problem, on which the method converges)
and the round restarts from its centre with the sets it started from. Should they still be settling when its
``MAX_INNER`` steps run out (its damped steps move a few coordinates at a time), the next round goes on from the
sets its last step reached, at the same weight the first time and at a larger one the second time in a row
(restarting from the first sets at a larger weight threw that work away: squared hinge with an intercept, n = 5000,
gamma 0.01-0.1, C = 100-1000, three of four problems took 11-19 s in 8-14 rounds, 1.8-2.8 s in 2 now; the fourth
2.3 s in one round before, 2.7 s in 2 now).

**Start.** Large problems start from the solution on a random quarter of the rows (with ``C`` scaled by 4,
recursively down to ``BASE_ROWS`` rows): its predictions on all rows give the first active sets, so the
first factorisation is of the few points near the loss's kinks rather than of every row. Every loss with a bound
to find does, squared hinge's half-line ``y a >= 0`` too (its first step from zero factored all ``n`` rows: n =
10,000, C = 1: 11.1 s -> 5.5 s; ten problems at n = 5000: 0.87x the time, geometric mean).

Cost: the kernel matrix (``n^2`` numbers, computed once), a product with the columns of the coordinates
that moved per step, and a Cholesky factorisation of the free block (``|I|^3 / 3``); typically a handful of
steps per round and three to five rounds. Memory: ``K`` plus the free block.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .box_sets import FREE, LOWER, UPPER, ZERO
from .defaults import CONVERGENCE_WARN_GAP
from .dense import cholesky_shifted, rows_product, scipy_blas_on_one_thread, submatrix
from .engines import (Monitor, at_rounding_floor, exact_compute_dtype, register_solver, sigint_as_flag, start_intercept,
                      target_level)
from .free_factor import UPDATE_RATIO, FreeFactor
from .losses import Loss
from .memory import is_out_of_memory
from .projected_newton import newton_direction
from .solver import SolverOptions, SolverResult, orthant_box

__all__ = ["merge_duplicate_rows", "active_set", "supports_active_set"]

#: Active-set steps per proximal round before sigma grows.
MAX_INNER = 15
#: From this step of a round on, fewer coordinates may change their set at each step (halving).
DAMP_AFTER = 4
#: A round asked to abandon sets that ``stall`` does so at this step at the earliest (:meth:`_Column.round`).
STALL_STEP = 5
#: The fewest coordinates a damped step may move (the limit halves per step from the step's own changes down to this).
#: 16 instead of 8: the working set's rounds on sets of mostly violators moved 8 coordinates a step while 50-100 had
#: to move, ran out of steps and restarted at a larger weight (hinge and epsilon-insensitive, five problems, two data
#: seeds, n = 4000: 0.91x the time, 0.67-1.04x; n = 10,000: 1.00x, 0.91-1.10x; absolute and pinball at C = 1,
#: n = 4000: 0.91x and 0.88x; Huber and squared hinge unchanged).
DAMP_FLOOR = 16
#: ... and at least this share of the step's free coordinates: at thousands of free coordinates 16 a step made the
#: rounds run out of steps while 100-200 were still to move (squared hinge, n = 5000, ten problems: 0.90x the time,
#: geometric mean; n = 10,000, three problems: 0.94x; the working set's subproblems, seven problems at n = 4000,
#: unchanged: their free sets are small).
DAMP_SHARE = 1 / 32
#: A round asked to ``shrink`` its changes is not stopped for a step that changes at most this many coordinates.
FEW_CHANGES = 8
#: A round asked to ``shrink`` its changes is also stopped where they fall too slowly for its steps to become updates
#: of the free-block factor before its step limit, on free blocks of at least ``QUICK_PROJECTED_MIN`` coordinates
#: (:meth:`_Column._refactoring_to_the_end`): a fresh factorisation of 2,048 costs about 40 ms on two cores. On
#: smaller blocks the interior point it sends the subproblem to costs more than the steps saved (hinge on phoneme,
#: n = 4000: 1.14x the time).
QUICK_PROJECTED = True
QUICK_PROJECTED_MIN = 2048
#: Largest relative KKT residual ``|r_F|_max / (|rhs_F|_max + |f_F|_max + |H_FF|_inf |a_F|_max)`` that a settled
#: step's refinement accepts (:meth:`_Column._polish`; the scale of a fresh factorisation's rounding).
RESIDUAL_TOL = 1e-13
#: Refinement steps of a settled step solved through an updated factor: the first is always taken (a residual below
#: ``RESIDUAL_TOL`` at once still left solutions whose duality gap stalled at 1e-10, above the rounding floor, once
#: the working set carried a factor from one subproblem to the next, so that the last solves of a fit were updated
#: ones), the second when the residual asks for it.
REFINEMENTS = 2
#: Below this many rows the first active sets come from a plain start (every coordinate free).
BASE_ROWS = 1024
#: Inputs that agree to this many units in the last place of each column's largest magnitude are duplicates
#: (:func:`merge_duplicate_rows`): a perturbation of the kernel of about ``1e-14 max|x| / sigma``.
NEAR_DUPLICATE_ULPS = 64
#: First proximal weight (times ``mean(diag K) c_i``), its smallest value, and the adaptive rule.
SIGMA_START = 1e-1
SIGMA_FLOOR = 1e-13


#: Outer iterations in a row at the rounding floor (subproblems or rounds solved exactly, a gap that no longer halves)
#: before a fit stops as converged (:class:`GapStall`).
STALL_PATIENCE = 3
#: The same, for a gap above that floor but within the rounding noise of ``f = K alpha``, before a fit stops as
#: 'stalled' (working set: fits that reach the floor later had such runs of up to 7 iterations, every second one
#: repeating the subproblem it had just solved: absolute and pinball, n = 300-1500, C = 1000).
NOISE_PATIENCE = 10
#: Iterations in a row without the gap halving after which a fit whose gap is below the warning level
#: (:data:`~joker_ext.defaults.CONVERGENCE_WARN_GAP`) stops, whether or not its subproblems were solved exactly
#: ('converged' at the rounding floor, else 'stalled'): inputs the kernel can hardly tell apart (rows 1e-12 apart
#: with the same target; a linear kernel) left the working set repeating one subproblem at a gap of 2e-13 to 2e-8
#: until ``max_iter`` (240 iterations, 3-50 s).
FLAT_PATIENCE = 30
#: A gap within this many times the estimated rounding noise is rounding noise (the errors are not independent: the
#: gaps at which fits stopped improving were 0.06x to 1.1x the estimate, absolute, pinball and epsilon-insensitive
#: at n = 300-3000, C = 1000-10^5).
NOISE_MARGIN = 10.0


class GapStall:
    """The box-QP engines' stop for a gap that no longer falls (halves) while every round or subproblem is solved
    exactly: 'converged' at the rounding floor (:func:`~joker_ext.engines.at_rounding_floor`) after
    ``STALL_PATIENCE`` such iterations; 'stalled' after ``NOISE_PATIENCE`` when the gap is within ``NOISE_MARGIN``
    times the noise that rounding ``f = K alpha`` leaves in it.

    At large ``C`` that noise lies above the floor: ``|alpha|`` reaches ``C`` while ``f`` stays of the order of the
    targets, a sum that cancels. ``f_i`` carries a rounding error of about ``eps (K |alpha|)_i``; the gap's term ``i``
    moves by at most ``c_i + |alpha_i|`` per unit of ``f_i``; the errors, taken as independent, add in the 2-norm:
    ``eps |(c + |alpha|) * (K |alpha|)|_2 / max(|primal|, |dual|)``. Measured against the gaps at which working-set
    fits stopped improving (absolute, pinball, epsilon-insensitive, n = 300-3000, C = 1000-10^5: they ran to
    ``max_iter``, e.g. absolute at n = 3000, C = 1000: 120 iterations and 5.5 s; epsilon-insensitive at n = 10,000:
    400): 0.9x to 16x of them; 20x to 50x above the gaps of fits that converge (C = 10; hinge at C = 1000).

    Parameters
    ----------
    tol : float
        The fit's relative-gap tolerance.
    dtype : torch.dtype
    c : Tensor (n,)
        ``c_i = C w_i``.
    """

    def __init__(self, tol: float, dtype: torch.dtype, c: torch.Tensor):
        self.tol, self.dtype, self.c = tol, dtype, c.reshape(-1, 1)
        self.best = math.inf  # the smallest gap so far
        self.count = 0
        self.flat = 0  # iterations since the gap last halved

    def __call__(self, rec: dict, exact: bool, alpha: torch.Tensor, product) -> Optional[str]:
        """'converged', 'stalled' or None after the record ``rec`` of ``alpha`` (``exact``: every open column's last
        round or subproblem was solved exactly; ``product(A)``: ``K A``)."""
        rel = rec["rel_gap"]
        falling = rel <= 0.5 * self.best
        self.best = min(self.best, rel)
        self.flat = 0 if falling else self.flat + 1
        if rel <= CONVERGENCE_WARN_GAP and self.flat >= FLAT_PATIENCE:
            return "converged" if at_rounding_floor(rel, self.tol, self.dtype) else "stalled"
        if falling or not exact or rel > CONVERGENCE_WARN_GAP:
            self.count = 0
            return None
        self.count += 1
        if at_rounding_floor(rel, self.tol, self.dtype):
            return "converged" if self.count >= STALL_PATIENCE else None
        if self.count < NOISE_PATIENCE:
            return None
        if rel <= NOISE_MARGIN * self._noise(alpha, product, max(abs(rec["primal"]), abs(rec["dual"]))):
            return "stalled"
        self.count = 0
        return None

    def _noise(self, alpha: torch.Tensor, product, scale: float) -> float:
        A = alpha.abs()
        finfo = torch.finfo(alpha.dtype)
        return finfo.eps * float(torch.linalg.vector_norm((self.c + A) * product(A))) / max(scale, finfo.tiny)


def next_sigma(sigma: float, steps: Optional[int], floor: float) -> float:
    """The proximal weight of the next round: much smaller after a round whose sets settled at once,
    smaller after one that settled, larger (10x) after one that did not settle."""
    if steps is None:
        return sigma * 10.0
    if steps <= 3:
        return max(floor, sigma / 100.0)
    if steps <= MAX_INNER // 2:
        return max(floor, sigma / 10.0)
    return sigma

#: ``sum a`` meets its target when within this many units of rounding of ``sum |a|`` (or 1e-10 of it, the larger).
BALANCE_ROUNDING = 1000.0


def supports_active_set(loss: Loss) -> bool:
    """True when the loss's conjugate is quadratic or linear on its box (``loss.quadratic``)."""
    return bool(getattr(loss, "quadratic", False))


def box_qp(loss: Loss, y, c):
    """The data of one column's box QP (the module's problem): ``(lin, h, lo, hi)`` with ``lin = y - psi'(0)``,
    ``h = psi''(0)`` and ``[lo, hi]`` the box of each coordinate."""
    zero = torch.zeros_like(y)
    lo, hi = loss.box(y, c)
    return y - loss.psi_grad(zero, y, c), loss.psi_hess(zero, y, c), lo, hi


def certificate(loss: Loss, Y, F, alpha, c, b, *, b_rows=None, total=None):
    """``(primal, dual, gap, rel_gap)`` of ``(K alpha + b, alpha)`` (alpha feasible), the engines' certificate:
    ``primal = 1/2 total(alpha F) + total(c l(Y, F + b))``, ``dual = 1/2 total(alpha F) + total(psi*(alpha))``,
    ``gap = total(FY(Y, F + b, alpha)) - b total(alpha)`` (Fenchel-Young terms), ``rel_gap = gap / max(|primal|,
    |dual|)``. ``total`` reduces the rows (default: each column's sum); ``b_rows``, ``b`` as added to each row of
    ``F`` (default ``b``, one per column)."""
    total = (lambda v: v.sum(0)) if total is None else total
    pred = F + (b if b_rows is None else b_rows)
    quad = total(alpha * F)
    primal = 0.5 * quad + total(c * loss.value(Y, pred))
    dual = 0.5 * quad + total(loss.conj(alpha, Y, c))
    gap = total(loss.fenchel_young(Y, pred, alpha, c)) - b * total(alpha)
    return primal, dual, gap, gap / torch.maximum(primal.abs(), dual.abs()).clamp_min(torch.finfo(F.dtype).tiny)


class _Column:
    """One target column: the box QP's data and the active-set iteration on it."""

    def __init__(self, K, diagK, loss: Loss, y, c, intercept: bool, *, offset=None, total: float = 0.0,
                 factor: Optional[FreeFactor] = None):
        self.K, self.diagK, self.loss, self.y, self.c = K, diagK, loss, y, c
        self.kink = float(loss.kink)
        lin, self.h, self.lo, self.hi = box_qp(loss, y, c)
        self.kink_inside = (self.lo < 0) & (self.hi > 0)  # where a coordinate can rest at the kink
        # for :meth:`intercept_bounds`: the coordinates whose box is a point, and the kink's subgradient at each bound
        # (signs in the bounds' dtype: ``torch.where`` of two Python numbers is float32, 0.1 * float32(1) 0.1 to 1.5e-9)
        self._fixed = self.lo >= self.hi
        self._kink_at_lo = self._kink_at_hi = None
        if self.kink:
            ones = torch.ones_like(self.lo)
            self._kink_at_lo = self.kink * torch.where(self.lo < 0, -ones, ones)
            self._kink_at_hi = self.kink * torch.where(self.hi > 0, ones, -ones)
        # the linear term of the objective is -lin^T a; ``offset`` (a subproblem's fixed part, K_BN a_N) is
        # subtracted from it; with an intercept the constraint is sum a = total
        self.lin = lin if offset is None else lin - offset
        self.total = float(total)
        self.intercept = intercept
        self.scale = float(diagK.mean()) if diagK.numel() else 1.0
        self.factor = FreeFactor(cholesky_shifted, mixed=self.unboxed) if factor is None else factor
        self.unrefined = False  # whether the last solve went through an (unrefined) factor update
        # the sets of the last step of the last round, when it ran out of steps without settling or cycling
        self.unsettled_sets = None

    @property
    def unboxed(self) -> bool:
        """Whether the dual has neither a box nor a kink (the squared loss): one step solves it, and its block may
        factor in float32. Read where a column makes its own factor, not for every working-set subproblem (the
        test is two reductions and, on a GPU, a synchronisation)."""
        return not self.kink and bool(torch.isinf(self.lo).all() and torch.isinf(self.hi).all())

    # ------------------------------------------------------------------ one active-set step
    def predict(self, a, f, b: float, s, abar):
        """Sets and fixed values predicted from the prox-gradient point at ``(a, b)``."""
        g = f + (self.h + s) * a - (self.lin + s * abar) + b
        d = self.diagK + self.h + s
        z = a - g / d
        t = self.kink / d
        if self.kink:
            sgn = torch.where(z > t, torch.ones_like(z), torch.where(z < -t, -torch.ones_like(z), torch.zeros_like(z)))
        else:  # no kink: the side of zero does not matter
            sgn = torch.ones_like(z)
        return self._sets(torch.minimum(torch.maximum(z - t * sgn, self.lo), self.hi), sgn)

    def _sets(self, target, sgn):
        """``(code, sgn, value)``: each coordinate at ``lo`` or ``hi`` where ``target`` reaches it, at the kink
        where ``sgn == 0`` (losses with a kink), free otherwise; ``value`` holds the fixed coordinates' values."""
        code = torch.full_like(target, FREE, dtype=torch.int8)
        code = torch.where(target <= self.lo, torch.full_like(code, LOWER), code)
        code = torch.where(target >= self.hi, torch.full_like(code, UPPER), code)
        if self.kink:
            code = torch.where(sgn == 0, torch.full_like(code, ZERO), code)
        value = torch.where(code == LOWER, self.lo, torch.where(code == UPPER, self.hi, torch.zeros_like(target)))
        return code, sgn, value

    def status(self, a):
        """``(code, sgn, value)`` of the point ``a`` itself: at ``lo``, at ``hi``, at the kink or free (on the
        side of its sign)."""
        return self._sets(a, torch.sign(a) if self.kink else torch.ones_like(a))

    def near_sets(self, a, share: float):
        """``(code, sgn, value)`` with every coordinate within ``share`` of its box's width (its ``c`` where the box
        is not finite) from a bound at that bound, one as near the kink at the kink (losses with a kink, where the
        kink lies inside the box), the others free: the sets of an interior point's iterate, whose coordinates stay
        off their bounds by about its complementarity (or its square root, where the optimum is degenerate)."""
        width = self.hi - self.lo
        reach = share * torch.where(torch.isfinite(width), width, self.c)
        target = torch.where(self.hi - a <= reach, self.hi, torch.where(a - self.lo <= reach, self.lo, a))
        if not self.kink:
            return self._sets(target, torch.ones_like(a))
        at_kink = (a.abs() <= reach) & self.kink_inside
        return self._sets(target, torch.where(at_kink, torch.zeros_like(a), torch.sign(a)))

    def solve(self, code, sgn, value, s, abar, fresh: bool = False) -> Tuple[torch.Tensor, float]:
        """The point with the fixed coordinates at ``value`` and the free ones (and b) solving the KKT system
        (through :attr:`factor`, which updates the last step's Cholesky factor when the sets changed little; its
        updated solves are unrefined: :meth:`_polish` refines the step that settles, the only one whose accuracy
        counts; ``fresh`` factors the free block afresh)."""
        free = torch.nonzero(code == FREE).reshape(-1)
        a = torch.where(code == FREE, torch.zeros_like(value), value)
        fixed_sum = float(a.sum())
        self.unrefined = False
        if free.numel() == 0:
            return a, self._intercept_without_free(a, s, abar) if self.intercept else 0.0
        rhs = (self.lin + s * abar)[free] - self.kink * sgn[free] - self.product(a)[free]
        a[free], b = self._bordered_solve(free, self.h + s, rhs, self.total - fixed_sum, fresh=fresh)
        self.unrefined = self.factor.updated
        return a, b

    def _bordered_solve(self, free, d, rhs, total_free: float, fresh: bool = False):
        """``(x_F, b)`` with ``(K_FF + diag(d_F)) x_F + b 1 = rhs`` and, with an intercept, ``sum x_F = total_free``
        (``b = 0`` without): two solves through :attr:`factor`, ``x = u - b w`` with ``H u = rhs``, ``H w = 1``."""
        V = torch.stack([rhs, torch.ones_like(rhs)], dim=1) if self.intercept else rhs.unsqueeze(1)
        sol = self.factor.solve(self.K, free, d, V, fresh=fresh)
        if not self.intercept:
            return sol.squeeze(1), 0.0
        b = float((sol[:, 0].sum() - total_free) / sol[:, 1].sum())
        return sol[:, 0] - b * sol[:, 1], b

    def _polish(self, a, f, b: float, code, sgn, value, s, abar):
        """``(a, f, b)`` of a settled step whose solve went through an unrefined factor update, refined to a fresh
        factorisation's accuracy: iterative refinement on the KKT system of :meth:`solve` with the residual
        ``(y - p0 + s abar)_F - kink sign_F - f_F - (h + s)_F a_F - b`` (and ``total - sum a``) read off ``f = K a``,
        which the step has formed anyway. The first correction is always taken (an updated solve whose residual was
        already at the rounding floor still left duality gaps that stalled at 1e-10), a second when the residual
        is still above ``RESIDUAL_TOL`` times ``|r_F| + |f_F| + |H_FF|_inf |a_F|``; beyond, the step is solved
        through a fresh factorisation."""
        free = torch.nonzero(code == FREE).reshape(-1)
        d = self.h + s
        target = (self.lin + s * abar)[free] - self.kink * sgn[free]
        norm_H = self.factor.residual_scale(self.K, free, d)
        for step in range(1 + REFINEMENTS):
            aF, fF = a[free], f[free]
            r = target - fF - d[free] * aF - b
            e = self.total - float(a.sum()) if self.intercept else 0.0
            scale = float(target.abs().max() + fF.abs().max()) + norm_H * float(aF.abs().max())
            if step and float(r.abs().max()) <= RESIDUAL_TOL * scale and abs(e) <= RESIDUAL_TOL * float(a.abs().sum()):
                return a, f, b
            if step == REFINEMENTS:
                break
            delta = torch.zeros_like(a)
            delta[free], db = self._bordered_solve(free, d, r, e)
            a, f, b = a + delta, f + self.product(delta), b + db
        a_new, b = self.solve(code, sgn, value, s, abar, fresh=True)
        return a_new, f + self.product(a_new - a), b

    def _intercept_without_free(self, a, s, abar) -> float:
        """With every coordinate fixed, ``b`` is any value keeping each fixed coordinate's multiplier of the
        right sign (:meth:`intercept_bounds`): the middle of that interval (clipped when the prediction is
        not yet consistent)."""
        g0 = self.K @ a + (self.h + s) * a - (self.lin + s * abar)
        lower, upper = self.intercept_bounds(a, g0)
        lo_b, hi_b = float(lower.max()), float(upper.min())
        if math.isinf(lo_b) and math.isinf(hi_b):
            return 0.0
        if math.isinf(lo_b) or math.isinf(hi_b):
            return hi_b if math.isinf(lo_b) else lo_b
        return 0.5 * (lo_b + hi_b)

    def intercept_bounds(self, a, grad) -> Tuple[torch.Tensor, torch.Tensor]:
        """Per coordinate, the interval ``[lower, upper]`` of intercepts ``b`` at which ``a_i`` satisfies its
        optimality condition ``0 in grad_i + b + kink d|a_i| + N_box(a_i)`` (``grad`` the gradient of the
        smooth part, without ``b``); ``a`` is optimal (given ``sum a``) iff ``max lower <= min upper``."""
        at_lo, at_hi = a <= self.lo, a >= self.hi
        neg = grad.neg()
        if self.kink:
            k = self.kink
            mid = neg - k * torch.sign(a)
            # at a bound, the subgradient of the kink that is kindest to the condition (the bound at zero)
            lower = torch.where(at_lo, neg - self._kink_at_lo, mid)
            upper = torch.where(at_hi, neg - self._kink_at_hi, mid)
            # at the kink strictly inside the box: the whole subdifferential
            kink = (a == 0) & ~at_lo & ~at_hi
            lower = torch.where(kink, neg - k, lower)
            upper = torch.where(kink, neg + k, upper)
        else:
            lower, upper = neg, neg.clone()
        # at the upper bound the interval is unbounded below, at the lower bound above; an empty box takes every b
        return lower.masked_fill_(at_hi | self._fixed, -math.inf), upper.masked_fill_(at_lo | self._fixed, math.inf)

    def round(self, a, f, b: float, abar, s, code=None, sgn=None, value=None, max_steps: int = MAX_INNER,
              shrink: Optional[float] = None, stall: Optional[float] = None):
        """Solve one proximal round exactly. Returns ``(a, f, b, steps, sets)`` or None when the sets do not
        settle within ``max_steps`` active-set steps, or, with ``shrink``, as soon as a step changes the sets of
        more than ``shrink`` times as many coordinates as the step before (the changes of a round that settles
        shrink fast; of one that does not, they do not shrink). A round with ``shrink`` is not damped: damping
        holds back changes, so they shrink slowly whether the round settles or not (hinge, n = 4000, gamma = 0.5:
        rounds abandoned at 33, 25, 22 changes settled undamped in three more steps). With ``stall``, a round is
        abandoned (None) at step :data:`STALL_STEP` or later when that step still changes the sets of more than
        ``stall`` times as many coordinates as its first step (and more than :data:`FEW_CHANGES`): rounds that
        settle shed their changes (37, 34, 26, 21, 16, 11, 5, 1, 0), those that do not keep them (99, 89, 89, 83,
        85, 88, 104, ... to the step limit). A round with ``shrink`` is also abandoned where its changes fall too
        slowly for its steps to become factor updates before the step limit (:meth:`_refactoring_to_the_end`)."""
        seen = []
        last_changes = first_changes = None
        self.unsettled_sets = None
        for step in range(1, max_steps + 1):
            if code is None:
                code, sgn, value = self.predict(a, f, b, s, abar)
            a_new, b = self.solve(code, sgn, value, s, abar)
            f = f + self.product(a_new - a)
            a = a_new
            new_code, new_sgn, new_value = self.predict(a, f, b, s, abar)
            changed = (new_code != code) | (new_sgn != sgn)
            if self.unrefined and not bool(changed.any()):  # settled: its solve to full accuracy
                a, f, b = self._polish(a, f, b, code, sgn, value, s, abar)
                new_code, new_sgn, new_value = self.predict(a, f, b, s, abar)
                changed = (new_code != code) | (new_sgn != sgn)
            new_code, new_sgn, new_value = self._stop_on_the_way(code, sgn, new_code, new_sgn, new_value)
            changes = int(changed.sum())
            if not changes:
                if self.intercept and not self._balanced(a):
                    return None  # settled with every coordinate fixed off the hyperplane: not a solution
                return a, f, b, step, (code, sgn, value)
            if shrink is not None and last_changes is not None and changes > max(shrink * last_changes, FEW_CHANGES):
                return None
            if shrink is not None and last_changes is not None and QUICK_PROJECTED and \
                    self._refactoring_to_the_end(changes, last_changes, max_steps - step, new_code):
                return None
            last_changes = changes
            first_changes = changes if first_changes is None else first_changes
            if stall is not None and step >= STALL_STEP and changes > max(stall * first_changes, FEW_CHANGES):
                return None
            if step >= DAMP_AFTER and shrink is None:  # damped: only the largest violations change sets
                floor = max(DAMP_FLOOR, int(DAMP_SHARE * int((code == FREE).sum())))
                new_code, new_sgn, new_value = self._damped(changed, code, sgn, value, new_code, new_sgn, new_value,
                                                            a, keep=max(floor, changes >> (step - DAMP_AFTER + 1)))
            seen.append((code, sgn))
            if any(torch.equal(new_code, c) and torch.equal(new_sgn, g) for c, g in seen[:-1]):
                return None  # the sets cycle
            code, sgn, value = new_code, new_sgn, new_value
        self.unsettled_sets = (code, sgn, value)  # still settling when the steps ran out: a start for the next round
        return None

    @staticmethod
    def _refactoring_to_the_end(changes: int, last_changes: int, steps_left: int, new_code) -> bool:
        """Whether a round whose changes fell from ``last_changes`` to ``changes`` in its last step would, falling at
        that rate, still change the sets of more than ``1 / UPDATE_RATIO`` of the next free set (of at least
        :data:`QUICK_PROJECTED_MIN` coordinates) at its step limit, ``steps_left`` steps on: each of its steps factors
        the free block afresh (an update takes at most that many changes, :data:`~joker_ext.free_factor.UPDATE_RATIO`),
        and it would end unsettled. Epsilon-insensitive on flights (n = 10,000, C = 710): the first subproblem's quick
        steps changed 5,377, 4,837, 4,153, ... 1,398 coordinates of a free block of 5,700-7,900, one fresh factorisation
        of 1.5-1.9 s each, 25 s for 15 steps that did not settle. Rounds that settle shed their changes faster (249, 52,
        45, 28, 26, 23, 11, 6, 1, 0 on the same problem, where steps of under 1,000 changes are updates)."""
        free = int((new_code == FREE).sum())
        return free >= QUICK_PROJECTED_MIN and UPDATE_RATIO * changes * (changes / last_changes) ** steps_left > free

    def _stop_on_the_way(self, code, sgn, new_code, new_sgn, new_value):
        """The next sets, except that a coordinate the prediction carries across its box stops on the way: it gets
        there first, and goes on at a later step if it must.

        * A free coordinate predicted free on the other side of the kink stops at the kink (where the box holds
          it). Flipping sides at once made free coordinates of the epsilon-insensitive, absolute and pinball losses
          swing across zero step after step (n = 4000, C = 10: 100-180 sign flips per step for 15 steps, rounds that
          never settled); stopping them cut those fits from 0.27-0.28 s to 0.18-0.19 s.
        * A coordinate predicted to jump from one bound of its box to the other stops in between: free, or at the
          kink where the kink lies inside the box. At small ``C`` the prox-gradient point of many coordinates lies
          beyond the whole box, and jumping straight across made the sets swing: hinge at C = 1, n = 10,000, 100-250
          coordinates went from one bound to the other at each step, rounds ran to their step limit and
          subproblems went to the interior point (hinge at C = 0.1-1, n = 10,000, three data seeds: 0.51-0.86x the
          time; absolute and pinball at C = 1, n = 4000: 0.73x and 0.65x; hinge and epsilon-insensitive on five
          grid problems: 0.99x at n = 4000, 0.85-1.10x, and 0.94x at n = 10,000)."""
        jump = (code * new_code) == LOWER * UPPER  # one bound to the other (the codes FREE = 0 and ZERO = 3 never)
        if self.kink:
            flip = (code == FREE) & (new_code == FREE) & (new_sgn == -sgn)
            to_kink = (flip | jump) & self.kink_inside
        else:
            to_kink = torch.zeros_like(jump)
        moved = jump | to_kink
        if not bool(moved.any()):
            return new_code, new_sgn, new_value
        stop = torch.where(to_kink, ZERO, FREE).to(new_code.dtype)
        return (torch.where(moved, stop, new_code), torch.where(to_kink, 0.0, new_sgn),
                torch.where(moved, 0.0, new_value))

    def _balanced(self, a) -> bool:
        """``sum a == total`` up to the rounding of ``a``'s dtype (1e-10 relative in float64; in float32 a sum of
        a few hundred terms is good to 1e-5 at best: a fixed 1e-10 rejected every float32 round with an intercept, and
        the fit never moved from its start)."""
        tol = max(1e-10, BALANCE_ROUNDING * torch.finfo(a.dtype).eps)
        return abs(float(a.sum()) - self.total) <= tol * max(1.0, float(a.abs().sum()))

    @staticmethod
    def _damped(changed, code, sgn, value, new_code, new_sgn, new_value, a, keep: int):
        """The new sets, except that only the ``keep`` changed coordinates with the largest predicted moves
        ``|new_value - a|`` (free coordinates: the change of class) change; the others keep their class."""
        idx = torch.nonzero(changed).reshape(-1)
        if idx.numel() <= keep:
            return new_code, new_sgn, new_value
        move = (new_value - a).abs()[idx] + (new_code[idx] == FREE).to(a.dtype) * a.abs()[idx]
        stay = idx[torch.argsort(move, descending=True)[keep:]]
        new_code, new_sgn, new_value = new_code.clone(), new_sgn.clone(), new_value.clone()
        new_code[stay], new_sgn[stay], new_value[stay] = code[stay], sgn[stay], value[stay]
        return new_code, new_sgn, new_value

    def product(self, delta: torch.Tensor) -> torch.Tensor:
        """``K delta``: through the rows of the nonzero entries when they are few (``K`` is symmetric), else one
        product."""
        moved = torch.nonzero(delta).reshape(-1)
        if moved.numel() * 4 >= delta.numel():
            return self.K @ delta
        return rows_product(self.K, moved, delta[moved].unsqueeze(1)).reshape(-1)

    # ------------------------------------------------------------------ monotone fallback
    def objective(self, a, f, s, abar) -> float:
        """The round's objective ``1/2 a^T K a + sum g(a) + sum s/2 (a - abar)^2`` (up to a constant)."""
        smooth = (-self.lin + 0.5 * self.h * a) * a
        return float((0.5 * a * f + smooth + self.kink * a.abs() + 0.5 * s * (a - abar) ** 2).sum())

    def project(self, v, lo, hi):
        """Projection on the box ``[lo, hi]`` and, with an intercept, the hyperplane ``sum a = 0``:
        ``clip(v - mu)`` with the shift ``mu`` found by bisection (the sum is monotone in ``mu``)."""
        if not self.intercept:
            return torch.minimum(torch.maximum(v, lo), hi)
        left, right = float((v - hi).min()), float((v - lo).max())
        for _ in range(64):
            mu = 0.5 * (left + right)
            if float(torch.minimum(torch.maximum(v - mu, lo), hi).sum()) > self.total:
                left = mu
            else:
                right = mu
        return torch.minimum(torch.maximum(v - 0.5 * (left + right), lo), hi)

    def newton_round(self, a, f, s, abar, steps: int = 30):
        """Projected Newton (Bertsekas) on the round's problem: a monotone descent that always makes progress,
        for rounds whose active sets cycle. Returns ``(a, f, b)`` after ``steps`` steps or at a stationary
        point."""
        def gradient(a, f):
            grad = f + (self.h + s) * a - (self.lin + s * abar)
            grad, lo, hi = orthant_box(self.kink, a, grad, self.lo, self.hi)
            b = 0.0
            inside = (a > lo) & (a < hi)
            if self.intercept and bool(inside.any()):  # the multiplier fitting the free coordinates best
                b = -float((grad / d_all)[inside].sum() / (1.0 / d_all)[inside].sum())
            return grad, lo, hi, b

        d_all = self.diagK + self.h + s
        for _ in range(steps):
            grad, lo, hi, b = gradient(a, f)
            g = grad + b
            residual = float((a - self.project(a - g / d_all, lo, hi)).abs().max())
            if residual <= 1e-15 * max(1.0, float(a.abs().max())):
                break
            d = newton_direction(self.K, self.diagK, g, self.h + s, a, lo, hi, 1e-3 * self.scale,
                                 residual=residual, bordered=self.intercept)
            phi0, t = self.objective(a, f, s, abar), 1.0
            for _ in range(30):
                a_t = self.project(a + t * d, lo, hi)
                f_t = f + self.product(a_t - a)
                if self.objective(a_t, f_t, s, abar) < phi0:
                    a, f = a_t, f_t
                    break
                t *= 0.5
            else:
                break
        return a, f, gradient(a, f)[3]

    def initial_sets(self, F):
        """Sets read off predictions ``F`` (intercept included): the minimiser of ``a F + g(a)`` with a little
        smoothing, so the points near a kink start free."""
        band = 0.05 * max(float(self.y.abs().mean()), 1e-12)
        a, _ = self.loss.smoothed_dual(F, self.y, self.c, band)
        sgn = torch.sign(a) if self.kink else torch.ones_like(a)
        return self._sets(a, sgn)


def _coarse_start(K, diagK, loss: Loss, y, c, intercept: bool, generator: torch.Generator):
    """Predictions ``F`` on every row from the solution on a random quarter of them (C scaled by 4)."""
    n = y.numel()
    m = max(BASE_ROWS, n // 4)
    idx = torch.randperm(n, generator=generator)[:m].to(K.device)
    Ks = submatrix(K, idx)
    y_s, c_s = y[idx], c[idx] * (n / m)
    F0 = _coarse_start(Ks, diagK[idx], loss, y_s, c_s, intercept, generator) if m > BASE_ROWS else None
    a, b = _rough_solve(_Column(Ks, diagK[idx], loss, y_s, c_s, intercept), F0, rounds=2)
    return K.index_select(1, idx) @ a + b


def _rough_solve(col: _Column, F0: Optional[torch.Tensor], *, rounds: int):
    """``rounds`` settled proximal rounds from zero (or from the sets predicted by ``F0``): ``(a, b)``, for a
    start only (sigma grows 10x per round whose sets cycle; at most ``4 rounds + 8`` tries)."""
    a = torch.zeros_like(col.y)
    f = torch.zeros_like(col.y)
    b, sigma = 0.0, SIGMA_START * col.scale
    sets = None if F0 is None else col.initial_sets(F0)
    done = 0
    for _ in range(4 * rounds + 8):
        if done == rounds:
            break
        out = col.round(a, f, b, a, sigma / col.c, *(sets or (None, None, None)))
        sigma = next_sigma(sigma, None if out is None else out[3], SIGMA_FLOOR * col.scale)
        if out is not None:
            a, f, b, _, sets = out
            done += 1
    return a, b


def box_qp_inputs(engine: str, operator, Y: torch.Tensor, loss: Loss, c: torch.Tensor,
                  options: Optional[SolverOptions], alpha0: Optional[torch.Tensor]):
    """Checks shared by the box-QP engines (an exact operator, a loss with a quadratic or linear conjugate,
    valid targets); returns ``(options, c as a vector of Y's dtype, start)`` with the start ``alpha0``
    projected on the box (zeros without one)."""
    if operator.mode != "exact":
        raise ValueError(f"{engine} needs an exact kernel operator, got mode {operator.mode!r}")
    if not supports_active_set(loss):
        raise ValueError(f"solver {engine!r} needs a loss with a quadratic or linear conjugate; {loss!r} has "
                         "none: use solver='newton'")
    n = Y.shape[0]
    c_col = c.reshape(n).to(dtype=Y.dtype, device=Y.device)
    # a zero c_i makes the box a point and the proximal weight s_i = sigma / c_i infinite
    if not bool((c_col > 0).all()):
        bad = c_col[~(c_col > 0)][:3].tolist()
        raise ValueError(f"{engine} needs c > 0 (c_i = C w_i; leave rows of zero weight out), got values such as {bad}")
    loss.check_targets(Y)
    lo, hi = loss.box(Y, c_col.reshape(n, 1))
    alpha = torch.zeros_like(Y) if alpha0 is None else \
        torch.minimum(torch.maximum(alpha0.to(dtype=Y.dtype, device=Y.device).reshape(Y.shape), lo), hi)
    return options or SolverOptions(), c_col, alpha


def _duplicate_groups(X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """Each row's group (``0 .. m-1``): rows with equal targets whose inputs agree to
    :data:`NEAR_DUPLICATE_ULPS` units in the last place of each column's largest magnitude (exact duplicates, and
    copies that rounding made differ in their last bits). Rows are ordered by a fixed random projection ``v`` of their
    targets, then by one ``u`` of their inputs (in units of that tolerance); a row joins the group of the row before
    it when its targets equal that row's and every coordinate of its inputs is within one unit of it. Near-duplicates
    sort next to each other unless a third row with the same target projection lies between them, within ``|u|_1``
    units, about 1e-13 of the projections' spread (then they stay apart, as before this merge; rows of other targets
    with the same target projection, a set of measure zero, may separate them too). One ``n d`` product, ``T``
    passes over the targets and two sorts of ``n`` keys: 0.35 ms at n = 4000, d = 16 (``torch.unique`` of whole rows
    took 16 ms at n = 10,000, d = 9; labelling the targets column by column with ``torch.unique``, 0.16 ms a
    column)."""
    n = X.shape[0]
    Xf = X.to(torch.float64).reshape(n, -1)
    Yf = Y.to(torch.float64).reshape(n, -1)
    # (each column's largest magnitude as max(max, -min): ``abs().amax(0)`` reduced across rows six times slower)
    unit = torch.maximum(Xf.amax(0), -Xf.amin(0)).clamp_min(torch.finfo(torch.float64).tiny) * (
        NEAR_DUPLICATE_ULPS * torch.finfo(torch.float64).eps)
    draws = torch.randn(Xf.shape[1] + Yf.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    u = draws[:Xf.shape[1]].to(Xf.device)
    proj = Xf @ (u / unit)  # the projection of the inputs in units of the tolerance
    # the targets' projection, elementwise in one fixed order (equal targets, equal projections: a product's
    # summation order may differ between rows)
    target = torch.zeros(n, dtype=torch.float64, device=Xf.device)
    for column, weight in zip(Yf.unbind(1), draws[Xf.shape[1]:].tolist()):
        target = target + weight * column
    order = torch.argsort(proj)
    order = order[torch.argsort(target[order], stable=True)]
    # neighbours within one unit in every coordinate project within |u|_1 units: only those pairs are compared
    ps, ts = proj[order], target[order]
    candidate = torch.nonzero((ts[1:] == ts[:-1]) & ((ps[1:] - ps[:-1]).abs() <= float(u.abs().sum()))).reshape(-1)
    linked = torch.zeros(n - 1, dtype=torch.bool, device=Xf.device)
    if candidate.numel():
        a, b = order[candidate], order[candidate + 1]
        linked[candidate] = ((Xf[a] - Xf[b]).abs() <= unit).all(1) & (Yf[a] == Yf[b]).all(1)
    labels = torch.cat([torch.zeros(1, dtype=torch.long, device=Xf.device), (~linked).long().cumsum(0)])
    group = torch.empty_like(labels)
    group[order] = labels
    return group


def merge_duplicate_rows(operator, Y: torch.Tensor, c: torch.Tensor, alpha0: Optional[torch.Tensor]):
    """The problem with the rows of identical ``(x_i, y_i)`` merged into one (as given when there are none); inputs
    identical up to :data:`NEAR_DUPLICATE_ULPS` units in the last place count as identical (:func:`_duplicate_groups`;
    the group keeps its first row's ``x``).

    Identical rows have identical kernel rows, so ``K alpha`` depends on them through their sum alone, and their
    primal terms add: ``sum_{i in G} c_i l(y, f(x)) = c_G l(y, f(x))`` with ``c_G = sum_{i in G} c_i``, for every
    loss. The merged problem (one row per group, weight ``c_G``) has the same optimal value, and its dual solution
    ``a_G`` gives the original one as ``a_i = a_G c_i / c_G`` (each ``a_i / c_i`` the same point of ``dl``), with
    the same primal, dual and gap at every iterate. Kept apart, such rows make the free block ``K_FF`` singular
    (zero curvature for the losses with a linear conjugate): magic's 68 duplicate pairs (hinge, 15,216 rows, gamma
    0.5) cost the working-set engine five interior-point subproblems whose sets would not snap, 38.9 s against 7.7 s
    without them. Copies whose last bits differ are as singular in float64: 500 of 3000 rows copied with a relative
    change of 1e-15 took epsilon-insensitive (C = 10) 56 s to 240 iterations at a gap of 2e-13, against 0.15 s for
    exact copies.

    Returns ``(operator, Y, c, alpha0, expand)`` of the merged problem (``alpha0`` summed per group), ``expand``
    the :class:`~joker_ext.engines.Monitor`'s map of a merged iterate ``(state, alpha)`` back to the rows (state
    tensors with one row per data row are indexed, the others kept); the arguments and ``expand=None`` when no row
    repeats, the operator is not an exact one or a weight is not positive (:func:`box_qp_inputs` then refuses the
    rows as given)."""
    from .data import BlockData
    from .operators import ExactOperator

    unchanged = operator, Y, c, alpha0, None
    if operator.mode != "exact":
        return unchanged
    X = operator.data.all()
    n = X.shape[0]
    c_col = c.reshape(n).to(Y.dtype)
    if n < 2 or not bool((c_col > 0).all()):
        return unchanged
    group = _duplicate_groups(X, Y)
    m = int(group.max()) + 1
    if m == n:
        return unchanged
    first = torch.full((m,), n, dtype=torch.long, device=group.device).scatter_reduce_(
        0, group, torch.arange(n, device=group.device), reduce="amin")
    keep, order = torch.sort(first)  # one row per group, in the data's order
    rank = torch.empty_like(order)
    rank[order] = torch.arange(m, device=order.device)
    group = rank[group]  # each row's group, numbered as keep
    c_m = torch.zeros(m, dtype=c_col.dtype, device=c_col.device).index_add_(0, group, c_col)
    share = (c_col / c_m[group]).unsqueeze(1)
    alpha0_m = None if alpha0 is None else torch.zeros(
        m, Y.shape[1], dtype=alpha0.dtype, device=alpha0.device).index_add_(0, group, alpha0.reshape(n, -1))
    merged = ExactOperator(operator.kernel, BlockData(X.index_select(0, keep), X.dtype, X.device),
                           chunk_rows=operator.chunk_rows, backend=operator.backend)

    def expand(state: dict, alpha: torch.Tensor):
        out = {k: v.index_select(0, group) if torch.is_tensor(v) and v.dim() == 2 and v.shape[0] == m else v
               for k, v in state.items()}  # the (m, T) per-row state (K alpha); the intercept is (T,)
        return out, alpha.index_select(0, group) * share.to(alpha.dtype)

    return merged, Y.index_select(0, keep), c_m, alpha0_m, expand


def active_set(operator, Y: torch.Tensor, loss: Loss, c: torch.Tensor, options: Optional[SolverOptions] = None,
               *, alpha0: Optional[torch.Tensor] = None, state0=None, start_iter: int = 0, callback=None,
               validation=None, snapshot=None, snapshot_every=None, intercept: bool = False,
               max_memory: Optional[int] = None, **_resume) -> SolverResult:
    """Minimise the dual by proximal rounds of primal-dual active-set steps (see the module docstring).

    Parameters
    ----------
    operator, Y, c :
        As in :func:`~joker_ext.newton_exact.exact_newton`.
    loss : Loss
        With ``loss.quadratic`` (a conjugate that is quadratic or linear on its box).
    options : SolverOptions
        ``max_iter`` proximal rounds, ``tol`` on the relative duality gap, ``max_time``, ``seed`` (the
        row sample of the start).
    alpha0 : Tensor (n, T), optional
        Warm start (projected on the box); ``state0`` may carry the intercept of an earlier fit.
    intercept : bool
        Fit an unregularized intercept per column (the constraint ``sum_i alpha_i = 0``); the result's
        ``state['intercept']`` holds it.
    callback, validation, snapshot, snapshot_every :
        As in :func:`joker_ext.solver.dbcd_tr`, once per proximal round.
    max_memory : int, optional
        Bytes for ``K`` and its factor: float32 inputs are computed in float64 when ``2 n^2`` float64 numbers fit
        (:func:`~joker_ext.engines.exact_compute_dtype`); results come back in the inputs' dtype.
    """
    report_dtype = Y.dtype
    Y = Y.to(exact_compute_dtype(Y.shape[0], Y.dtype, max_memory))
    # identical rows make K_FF singular: one row per group, the same problem
    operator, Y, c, alpha0, expand = merge_duplicate_rows(operator, Y, c, alpha0)
    opts, c_col, alpha = box_qp_inputs("active_set", operator, Y, loss, c, options, alpha0)
    n, T = Y.shape
    dtype, device = Y.dtype, Y.device
    level = target_level(loss, Y, intercept)  # (solved for Y - level; the intercept reported is b + level)
    Y = Y - level
    b_all = start_intercept(state0 if intercept else None, T, dtype, device, level)
    mon = Monitor(opts, callback=callback, validation=validation, snapshot=snapshot, snapshot_every=snapshot_every,
                  dtype=dtype, report_dtype=report_dtype, expand=expand)
    generator = torch.Generator().manual_seed(int(opts.seed) if opts.seed is not None else 0)
    state = {"f": torch.zeros_like(alpha)}
    if intercept:
        state["intercept"] = b_all + level
    status, it, rec = "max_iter", start_iter, None
    # inference mode: no autograd bookkeeping on the many small tensor operations of the active-set steps
    # (4-10 % of a hinge or epsilon-insensitive fit at n = 4000); the Monitor hands out ordinary tensors
    with sigint_as_flag(opts.handle_sigint) as sig, scipy_blas_on_one_thread(), torch.inference_mode():
        try:
            K = operator.gram(dtype)
            diagK = K.diagonal().clone()
            columns = [_Column(K, diagK, loss.column(t), Y[:, t], c_col, intercept) for t in range(T)]
            if all(col.unboxed for col in columns):  # one step each on the same K + diag(1 / c): one factor for all
                for col in columns[1:]:
                    col.factor = columns[0].factor
            F = K @ alpha
            # no proximal term where the conjugate is strongly convex already (squared, Huber, squared hinge)
            sigma = [0.0 if bool((col.h > 0).all()) else SIGMA_START * col.scale for col in columns]
            sets = [None] * T  # each column's last settled sets (first: from the coarse start)
            failed = [False] * T  # whether the column's last round cycled
            ran_out = [False] * T  # whether it ran out of steps (its sets still settling)
            if alpha0 is None:
                for t, col in enumerate(columns):
                    if n > BASE_ROWS and bool((torch.isfinite(col.lo) | torch.isfinite(col.hi)).any()):  # sets to find
                        F0 = _coarse_start(K, diagK, loss.column(t), Y[:, t], c_col, intercept, generator)
                        sets[t] = col.initial_sets(F0)

            def solve_column(t: int, col: _Column) -> None:
                a, f = alpha[:, t], F[:, t]
                s = sigma[t] / c_col
                out = col.round(a, f, float(b_all[t]), a.clone(), s, *(sets[t] or (None, None, None)))
                if out is None and col.unsettled_sets is not None:
                    # it ran out of steps while its sets were still settling (its damped steps' last changes): the
                    # next round goes on from those sets, not from the start's again, at the same weight the first
                    # time (a larger one needed rounds to come down again)
                    sets[t] = col.unsettled_sets
                    if not ran_out[t]:
                        ran_out[t] = True
                        return  # alpha did not move
                ran_out[t] = False
                if out is None and not failed[t]:  # the sets cycle: a more diagonal round, same centre
                    # (10x the weight that cycled; from zero, where the conjugate is strongly convex: the first weight)
                    sigma[t], failed[t] = sigma[t] * 10.0 if sigma[t] > 0 else SIGMA_START * col.scale, True
                    return  # alpha did not move
                if out is None:  # cycling twice: a monotone projected-Newton solve of the round instead
                    a_n, f_n, b_n = col.newton_round(a.clone(), f.clone(), s, a.clone())
                    alpha[:, t], F[:, t], b_all[t] = a_n, f_n, b_n
                    sets[t] = col.predict(a_n, f_n, b_n, s, a_n)
                    failed[t] = False
                else:
                    failed[t] = False
                    sigma[t] = next_sigma(sigma[t], out[3], SIGMA_FLOOR * col.scale)
                    alpha[:, t], F[:, t], b_all[t], _, sets[t] = out
                # f = K alpha afresh: the rounds update it step by step, and at large C (|alpha| up to C) the
                # accumulated rounding put the certificate off the model (hinge, C = 10^4, n = 50: the reported
                # primal 2.4e-8 above the model's, a gap stuck there for 100 rounds)
                F[:, t] = K @ alpha[:, t]

            stall = GapStall(opts.tol, dtype, c_col)

            def at_floor(rec: dict) -> Optional[str]:  # rounds at the smallest proximal weight are exact
                exact = all(s <= SIGMA_FLOOR * col.scale for s, col in zip(sigma, columns))
                if exact and at_rounding_floor(rec["rel_gap"], opts.tol, dtype):
                    return "converged"
                return stall(rec, exact, alpha, lambda A: K @ A)

            reason, it, rec = outer_loop(mon, opts, loss, Y, F, alpha, b_all, c_col, it, state, sigma, columns,
                                         solve_column, lambda: sig.flag, at_floor, level=level)
            status = reason or "max_iter"
        except (RuntimeError, MemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            status = "out_of_memory"
    return mon.result(alpha, state, it, status, rec)


def outer_loop(mon: Monitor, opts: SolverOptions, loss: Loss, Y, F, alpha, b, c, it: int, state: dict, sigma,
               columns, solve_column, interrupted=lambda: False, stop=lambda rec: None, level=None):
    """The outer loop shared by the box-QP engines: certify ``(alpha, F = K alpha, b)``; then, until a stop,
    ``solve_column(t, columns[t])`` (which updates ``alpha``, ``F``, ``b`` and ``sigma`` in place) for every
    column whose relative gap is above ``opts.tol``, and certify again. ``stop(rec)``: an engine's own stopping
    test after the monitor's (a reason such as 'converged' or 'stalled', else None); ``level``: the targets' level
    (:func:`~joker_ext.engines.target_level`; ``Y`` is less it, the intercepts recorded are ``b + level``). Returns
    ``(reason, it, rec)``."""
    box = _BoxCheck(columns)
    rec = _certify(mon, loss, Y, F, alpha, b, c, it, state, sigma, level, box)
    best = _BestIterate(rec, alpha, F, b, opts.tol)
    reason = "converged" if rec["rel_gap"] <= opts.tol else None
    while reason is None and it < opts.max_iter:
        for t, col in enumerate(columns):
            if rec["column_rel_gap"][t] > opts.tol:
                solve_column(t, col)
        it += 1
        rec = _certify(mon, loss, Y, F, alpha, b, c, it, state, sigma, level, box)
        best.update(rec, alpha, F, b)
        reason = mon.stop_reason(rec, state, alpha, interrupted())
        if reason is None:
            reason = stop(rec)
        if reason is None and best.wandered >= STALL_PATIENCE:
            reason = "stalled"  # (its best iterate, at the rounding floor, is restored: 'converged')
    if reason in RESTORED_ON and best.restore(rec, alpha, F, b):
        mon.history.pop()  # the record of the last iterate gives way to the restored one's (same iteration count)
        rec = _certify(mon, loss, Y, F, alpha, b, c, it, state, sigma, level, box)
        if reason == "stalled" and at_rounding_floor(rec["rel_gap"], opts.tol, F.dtype):
            reason = "converged"
    return reason, it, rec


#: The ends of a fit (None: ``max_iter``) at which the box-QP engines return each column's best certified iterate
#: instead of its last one. Not after a callback's stop or an interruption: the caller saw the last iterate.
RESTORED_ON = (None, "stalled", "max_time")
#: A gap this many times its best, once that best is at the rounding floor, is a fit that wanders away from its
#: solution (:class:`_BestIterate`): after ``STALL_PATIENCE`` such iterations in a row the fit stops.
WANDER_RATIO = 100.0


class _BestIterate:
    """Each column's iterate ``(alpha[:, t], F[:, t], b[t])`` at its smallest relative gap so far.

    A fit whose gap stops falling can wander away from its best iterate: with a kernel of low rank (scikit-learn's
    'linear', n = 2000, d = 8; hinge, epsilon-insensitive, absolute and pinball at C = 100-10^4) the working set
    reached gaps of 1e-11 to 1e-14 and then, its subproblems moving ``alpha`` along the kernel's null space while
    the rounding of ``f`` grew, ended 'stalled' at 3e-8 to 3e-5 (30 iterations after their best, the
    ``FLAT_PATIENCE`` of :class:`GapStall`). :attr:`wandered` counts the iterations in a row at which every open
    column's gap is ``WANDER_RATIO`` times its best and that best at the rounding floor. The copies cost ``2 n T``
    numbers."""

    def __init__(self, rec: dict, alpha: torch.Tensor, F: torch.Tensor, b: torch.Tensor, tol: float):
        self.tol = tol
        self.gaps = list(rec["column_rel_gap"])
        self.alpha, self.F, self.b = alpha.clone(), F.clone(), b.clone()
        self.wandered = 0

    def update(self, rec: dict, alpha: torch.Tensor, F: torch.Tensor, b: torch.Tensor) -> None:
        gaps = rec["column_rel_gap"]
        open_columns = [t for t, gap in enumerate(gaps) if gap > self.tol]
        away = bool(open_columns) and all(
            at_rounding_floor(self.gaps[t], self.tol, F.dtype) and gaps[t] >= WANDER_RATIO * self.gaps[t]
            for t in open_columns)
        self.wandered = self.wandered + 1 if away else 0
        for t, gap in enumerate(gaps):
            if gap < self.gaps[t]:
                self.gaps[t] = gap
                self.alpha[:, t], self.F[:, t], self.b[t] = alpha[:, t], F[:, t], b[t]

    def restore(self, rec: dict, alpha: torch.Tensor, F: torch.Tensor, b: torch.Tensor) -> bool:
        """Put back, in place, every column whose best gap is below its gap in ``rec``; whether any was."""
        worse = [t for t, gap in enumerate(rec["column_rel_gap"]) if self.gaps[t] < gap]
        for t in worse:
            alpha[:, t], F[:, t], b[t] = self.alpha[:, t], self.F[:, t], self.b[t]
        return bool(worse)


#: Largest excursion of an iterate beyond its box that a certificate accepts, relative to the largest finite bound of
#: its column (rounding leaves a solved coordinate a few units in the last place beyond a bound at most), or
#: ``BOX_SLACK_ULPS`` units of rounding of the iterate's dtype where that is more (float32: 1.2e-4).
BOX_SLACK = 1e-9
BOX_SLACK_ULPS = 1000


class _BoxCheck:
    """The columns' boxes (``n x T``) and the excursion each column tolerates (:data:`BOX_SLACK`, or
    :data:`BOX_SLACK_ULPS` units of rounding, times its largest finite bound); calling it with ``alpha`` raises
    RuntimeError when a coordinate lies beyond: the gap certifies only a feasible ``alpha`` (a cycling round once ended
    at a point 0.12 above ``C`` and the fit reported 'converged' at a gap of -1.9e-10: session 53 in docs/math.rst).
    Formed once per fit: a check is two comparisons."""

    def __init__(self, columns):
        self.lo = torch.stack([col.lo for col in columns], dim=1)
        self.hi = torch.stack([col.hi for col in columns], dim=1)
        finite = torch.maximum(self.lo.abs().nan_to_num(posinf=0.0), self.hi.abs().nan_to_num(posinf=0.0))
        share = max(BOX_SLACK, BOX_SLACK_ULPS * torch.finfo(self.lo.dtype).eps)
        self.slack = share * finite.amax(0, keepdim=True) if finite.numel() else finite

    def __call__(self, alpha: torch.Tensor) -> None:
        outside = (alpha < self.lo - self.slack) | (alpha > self.hi + self.slack)
        if bool(outside.any()):
            i, t = divmod(int(torch.nonzero(outside.reshape(-1))[0]), alpha.shape[1])
            raise RuntimeError(f"internal error: a dual coefficient left its box (row {i}, column {t}: alpha = "
                               f"{float(alpha[i, t]):.6g} outside [{float(self.lo[i, t]):.6g}, "
                               f"{float(self.hi[i, t]):.6g}]), where its duality gap certifies nothing; please report "
                               f"it with the data")


def _certify(mon: Monitor, loss: Loss, Y, F, alpha, b, c, iteration: int, state: dict, sigma, level,
             box: _BoxCheck) -> dict:
    """Record the duality gap of the original problem at ``(K alpha + b, alpha)`` (alpha is feasible, which ``box``
    checks first; with the targets ``Y`` less ``level`` (None: not shifted), the intercept recorded is ``b + level``:
    the same gap)."""
    box(alpha)
    primal, dual, gap, rel = certificate(loss, Y, F, alpha, c.reshape(-1, 1), b)
    state["f"] = F
    if "intercept" in state:
        state["intercept"] = b if level is None else b + level
    return mon.record(iteration, float(primal.sum()), float(dual.sum()), float(gap.sum()), state, alpha,
                      column_rel_gap=rel.tolist(), proximal_weight=max(sigma))


register_solver("active_set", "exact", active_set, intercept=True)
