"""The Newton engine for exact kernels whose n x n matrix fits in memory: projected Newton on the whole dual, Newton
steps on the primal for logistic regression, and the semismooth Newton method of :mod:`joker_ext.active_set` for
duals that are quadratic or linear on their box (see the end of this docstring).

Problem (per target column, ``K`` the n x n kernel matrix, ``g_i(a) = -a y_i + psi(a) + kink |a|``)::

    min_alpha  D_s(alpha) = 1/2 alpha^T K alpha + sum_i [g_i(alpha_i) + s alpha_i^2 / (2 c_i)],
               lo_i <= alpha_i <= hi_i

with the smoothing ``s`` of :mod:`joker_ext.smoothing` (``s = 0`` for losses whose ``psi'' > 0``). The term
``s a^2 / (2c)`` makes the dual strongly convex where ``psi'' = 0`` (a conjugate linear on part of its box, as
the support-vector losses', which this engine hands to the active-set method, but a user loss may not declare),
whose free block ``K_FF`` is otherwise numerically singular; ``s`` is divided by 10 whenever the smoothed dual is
solved well enough that the smoothing, not the solve, keeps the gap of the original problem open. Every iterate is
feasible, so the gap of the original problem at it is the certificate, and the loop ends when its relative value is
at most ``tol``.

One iteration (Bertsekas' projected Newton method, 1982, with the kink handled on orthants):

1. gradient ``grad = K alpha - y + psi'(alpha) + s alpha / c + kink * sign``, where a coordinate at zero
   takes the sign its gradient points to (and stays at zero when ``|grad| <= kink``), so that
   ``kink |a|`` is linear on the orthant of the step;
2. the epsilon-active set: coordinates within ``eps = min(eps0, ||alpha - P(alpha - grad)||)`` of a bound
   whose gradient points outwards; they take a diagonally scaled gradient step (projected, they land on
   the bound);
3. the free coordinates ``F`` take the Newton step ``(K_FF + diag(psi''_F + s / c_F)) d_F = -grad_F`` by one
   Cholesky factorisation;
4. a projected Armijo search on ``alpha(t) = P(alpha + t d)``, the decrease measured exactly from ``K s``
   and :meth:`~joker_ext.losses.Loss.conj_diff`.

**Smooth losses whose conjugate is not quadratic (logistic)** take Newton steps on the primal instead,
``P(w) = 1/2 w^T K w + sum_i c_i l(y_i, (K w)_i)`` over the representer coefficients ``w`` (iteratively
reweighted least squares; Rasmussen and Williams, Gaussian Processes for Machine Learning, Algorithm 3.1):
with ``a = a(f)`` and ``W = diag(c l''(f))`` from :meth:`~joker_ext.losses.Loss.smoothed_dual` at ``f = K w``,
``b = W f + a`` and ``B = I + W^(1/2) K W^(1/2)`` (eigenvalues >= 1, so one Cholesky is always stable),

    w_new = b - W^(1/2) B^{-1} W^(1/2) K b,

then an exact line search on ``P`` along ``w_new - w`` (safeguarded Newton steps on its derivative, every trial
O(n), ``K w`` being linear; :func:`_line_minimum`), checked by Armijo's rule. From
``COARSE_MIN_ROWS`` rows on, the steps start from the solution on a random quarter of the rows
(:meth:`_Column._coarse_start`). The certificate is
the gap at the dual point ``a(K w)``, which is feasible and tends to ``w``: the smaller of its gap with the primal
at ``K a`` and ``P(w) + D(a)`` (the iterate itself against it; the model is then ``w``; at large ``C`` the loss
weighs ``K (a - w)`` enough that only the latter reached float64's floor). With an unregularized intercept ``b``
(``P(w, b)`` with the loss at ``K w + b``) the step also solves for ``b``: the weighted least-squares problem's
solution ``w = (I + W K)^{-1} W (z - b 1)`` must satisfy ``1^T w = 0`` (the condition ``dP/db = 0``), so with
``T = (I + W K)^{-1} = I - W^(1/2) B^{-1} W^(1/2) K`` and ``t = W z``, ``w_new = T t - b_new T W 1`` and
``b_new = 1^T T t / 1^T T W 1`` (two right-hand sides, one factor); the certificate's dual point is shrunk onto
``sum a = 0`` (:func:`joker_ext.intercept.feasible_dual`). On the dual, whose entropy-like
conjugate has an infinite gradient at the box's ends, projected Newton steps crawl while the coordinates of
well-classified points approach zero (12-20 iterations where this takes 6-8; logistic, n = 4000, C = 10,
one thread: 20.3 s for the dual from ``a = 0``, 12.5 s from the middle of its box, 6.2 s here; n = 10,000:
234 s, 156 s, 93 s, each iteration one Cholesky factorisation of ``n x n``).

The squared loss (no box) converges in one iteration: one Cholesky of ``K + diag(1/c)``, like kernel ridge
regression. Logistic regression converges quadratically near the optimum.

**Duals that are quadratic or linear on their box** (squared, Huber, squared hinge, hinge, absolute, pinball,
epsilon-insensitive: ``loss.quadratic``) are solved by their semismooth Newton method, the primal-dual active-set
method of :mod:`joker_ext.active_set` (:func:`exact_newton` hands them to it). The projected Newton steps above,
which this engine took for them before, stalled far from the optimum at large ``C`` (absolute and
epsilon-insensitive at C = 100, pinball and hinge at C = 1000, n = 60: relative gaps 0.16-0.98 after 100
iterations; Huber at C = 1000 with sample weights: 0.93); they remain for losses whose conjugate is neither
(user-registered ones, smoothed where they have a kink). Memory: ``K`` and one factor of the
free block, at most ``2 n^2`` numbers.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .active_set import active_set
from .dense import (MIXED_CONTRACTION, MIXED_PRECISION_MIN, cholesky_ex, cholesky_pcg, cholesky_shifted,
                    cholesky_solve, flush_small_, rows_product, submatrix)
from .engines import Monitor, at_rounding_floor, exact_compute_dtype, register_solver, sigint_as_flag, start_intercept
from .intercept import feasible_dual
from .losses import Loss
from .memory import is_out_of_memory
from .projected_newton import newton_direction
from .smoothing import Continuation, needs_smoothing, smooth_for_any_targets
from .solver import SolverOptions, SolverResult, duality_gap, orthant_box

__all__ = ["exact_newton", "cholesky_solve"]

ARMIJO = 1e-4
MAX_HALVINGS = 40
#: The primal Newton steps' exact line search (:func:`_line_minimum`): the longest step, the largest number of its
#: Newton iterations, and its tolerance on the directional derivative relative to the slope at zero. Against Armijo's
#: halvings from the full step, whose steps of 0.5 and 0.25 made the intercept swing between 0.9 and 3.4: logistic
#: with the intercept, survey cases 2018 (n = 4000, C = 596) 22 -> 10 iterations, 2019 (C = 698) 6 -> 4, 2005
#: (n = 10,000, C = 106) 9 -> 7, the same primal objectives to 12 digits.
LINE_MAX = 4.0
LINE_ITERATIONS = 30
LINE_TOL = 1e-3
#: Relative size of a primal Newton step's predicted decrease (and of the rise of P it may cause) below which it is
#: rounding: the full step is taken.
NOISE = 1e-10
#: Conjugate-gradient iterations per solve through a float32 factor of the system
#: (:func:`~joker_ext.dense.cholesky_pcg`; 3 reach ``CG_TOL`` on the logistic systems measured), the residual
#: (relative to the right-hand side) they aim at, and the residual below which the solve is taken (else a float64
#: factor solves it).
CG_ITERATIONS = 6
CG_TOL = 1e-15
REFINED = 1e-12
#: A primal Newton step of a column of at least ``STALE_MIN_ROWS`` rows whose predecessor moved the predictions by at
#: most ``STALE_MOVE`` of their magnitude solves its system by conjugate gradients through the predecessor's float32
#: factor (:meth:`_Column._solve_system`), at most one iteration per ``STALE_ROWS`` rows (a factorisation costs
#: ``n^3 / 3`` multiply-adds, an iteration about ``4 n^2`` memory-bound ones) and at least ``STALE_MIN_ITERATIONS``
#: (the settling step, at any size); it is taken where it reaches ``STALE_TOL``, else the system is factored afresh.
#: Such a solve needs 4-15 iterations, which pays at n = 10,000 (16.1-16.3 s against 16.6-17.0 s, make_hastie_10_2,
#: C = 106) and not at n = 4,000, where a failed try costs (3.2-3.3 s against 3.1 s).
STALE_MOVE = 0.05
STALE_MIN_ROWS = 8000
STALE_ROWS = 800
STALE_MIN_ITERATIONS = 4
STALE_TOL = 1e-14
#: The primal Newton steps of a column of at least ``COARSE_MIN_ROWS`` rows start from the solution on a random
#: ``1 / COARSE_SHARE`` of them (:meth:`_Column._coarse_start`), taking at most ``COARSE_STEPS`` steps, until one
#: decreases its primal by at most ``COARSE_TOL`` of its value.
COARSE_MIN_ROWS = 2000
COARSE_SHARE = 4
COARSE_STEPS = 20
COARSE_TOL = 1e-6
#: A primal column whose gap meets the tolerance takes one more Newton step unless its last one moved its predictions
#: by at most this share of their largest magnitude (:meth:`_Column.settled`). The gap is second order in the
#: iterate's error: float64's floor on it (1e-16 relative) leaves predictions good to about 1e-8, where one more step
#: (quadratic convergence) reaches 1e-15. Measured on scikit-learn's sample-weight check (15 points, three classes,
#: weights against repeated rows, one thread): decision values 1.2e-8 apart before, 1e-15 after.
SETTLED_MOVE = 1e-8


def _line_minimum(derivatives, slope: float) -> float:
    """The step ``t`` in ``(0, LINE_MAX]`` that minimises a convex ``phi`` along a descent direction (``phi'(0) =
    slope < 0``), to :data:`LINE_TOL` of ``|slope|`` in ``phi'``: safeguarded Newton steps on ``phi'`` inside a
    bracket, bisecting where a Newton step leaves it. ``derivatives(t)`` gives ``(phi'(t), phi''(t))``; each costs
    ``O(n)``, nothing beside the ``n^3`` of the Newton system. ``LINE_MAX`` when ``phi`` still falls there."""
    lo, hi = 0.0, 1.0
    g, h = derivatives(hi)
    while g < 0 and hi < LINE_MAX:
        lo, hi = hi, min(2.0 * hi, LINE_MAX)
        g, h = derivatives(hi)
    if g <= 0:
        return hi
    t = hi
    for _ in range(LINE_ITERATIONS):
        if abs(g) <= LINE_TOL * -slope:
            break
        if g > 0:
            hi = t
        else:
            lo = t
        newton = t - g / h if h > 0 else math.nan
        t = newton if lo < newton < hi else 0.5 * (lo + hi)
        g, h = derivatives(t)
    return t


def _scaled_system(K: torch.Tensor, root: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``I + diag(root) K diag(root)`` in ``dtype`` (a copy of ``K`` scaled in place: three passes over ``n^2``
    numbers, no temporary of that size); in float32 without its entries below ``eps_32^2`` of its diagonal
    (:func:`~joker_ext.dense.flush_small_`: subnormal numbers in the factor made logistic regression on flights,
    n = 4000, take 1.7-1.9 s against 0.9-1.0 s)."""
    B = K.to(dtype=dtype, copy=True)
    r = root.to(dtype)
    B.mul_(r.unsqueeze(1)).mul_(r.unsqueeze(0)).diagonal().add_(1.0)
    return flush_small_(B) if dtype == torch.float32 else B


class _Column:
    """One target column: its iterate, ``f = K alpha``, and its smoothing."""

    def __init__(self, K, diagK, loss: Loss, a, f, y, c, lo, hi, smoothing: float, eps0: float, warm: bool = False,
                 intercept: bool = False, b0: float = 0.0):
        self.K, self.diagK, self.loss = K, diagK, loss
        self.a, self.f, self.y, self.c, self.lo, self.hi = a, f, y, c, lo, hi
        self.smoothing = Continuation(smoothing)
        self.eps0 = eps0
        self.stalled = False
        # smooth losses whose conjugate is not quadratic (logistic): Newton on the primal, from w = a when ``a`` is
        # a warm start, else from w = 0 (f = 0, whose dual point the default start ``a`` is)
        self.primal = not loss.quadratic and not smoothing
        self.intercept = intercept
        self.b = float(b0) if intercept else 0.0  # the intercept (primal steps with ``intercept``)
        self.rounding_step = False  # whether the last primal step was taken at the rounding of P
        self.moved = math.inf  # the last primal step's largest change of the predictions, relative to them
        self.w, self.fw = None, None
        self.K_inf: Optional[float] = None  # |K|_inf, for the primal Newton system's conditioning
        self._factor32: Optional[torch.Tensor] = None  # the last primal step's float32 factor (_solve_system)
        self.restartable = False  # whether a failed step may restart the primal steps from w = 0 (see step)
        if self.primal:
            self.w, self.fw = (a.clone(), f.clone()) if warm else (torch.zeros_like(a), torch.zeros_like(f))
            if warm and float(self.primal_value(self.w, self.fw, self.b)) > float(self.primal_value(None, None, 0.0)):
                self._cold()  # a warm start worse than w = 0 (another C's solution, clipped to this box)
            elif not warm and y.numel() >= COARSE_MIN_ROWS:
                warm = self._coarse_start()
            self.restartable = warm and bool(self.w.any())
            if intercept or warm:
                self._certified_point()

    def _coarse_start(self) -> bool:
        """Start the primal steps from the solution on a random ``1 / COARSE_SHARE`` of the rows with the same ``c``
        (its own start coarse in turn), solved until a step decreases its primal by at most ``COARSE_TOL`` of it:
        ``w`` is its coefficients on those rows and zero elsewhere, ``b`` its intercept. Kept when its primal value
        is below that of ``w = 0`` (True). Each iteration factors ``n x n``; the coarse solve costs
        ``1 / COARSE_SHARE^3`` of that per step. The same ``c`` regularizes the smaller problem more, so its
        predictions lie between 0 and the solution's; with ``c`` scaled up to stand for every row the start overshot
        at large C. Logistic with the intercept, n = 4000 (``sin(x_0)`` thresholded, d = 8, gamma 0.05): C = 0.1,
        1, 10, 100: 5 -> 4, 6 -> 4, 8 -> 4, 9 -> 6 iterations (0.53-0.87x the time); C = 1000: 11 -> 11 (1.04-1.13x).
        (C scaled: 3, 4, 5, 9 and 15 iterations.) Those were Armijo's halvings; with the exact line search
        (:func:`_line_minimum`), six logistic survey cases (n = 4000-10,000, C = 3-700) took 0.71-0.89x the time of
        the cold start on three and 1.05-1.43x on the other three."""
        n = self.y.numel()
        m = n // COARSE_SHARE
        idx = torch.sort(torch.randperm(n, generator=torch.Generator().manual_seed(0))[:m].to(self.y.device)).values
        K_S = submatrix(self.K, idx)
        y_S, c_S = self.y[idx], self.c[idx]
        a_S = self.loss.smoothed_dual(torch.zeros_like(y_S), y_S, c_S)[0]
        sub = _Column(K_S, K_S.diagonal().clone(), self.loss, a_S, K_S @ a_S, y_S, c_S, self.lo[idx], self.hi[idx],
                      0.0, self.eps0, intercept=self.intercept)
        value = float(sub.primal_value(sub.w, sub.fw, sub.b))
        for _ in range(COARSE_STEPS):
            if not sub.primal_step():
                break
            before, value = value, float(sub.primal_value(sub.w, sub.fw, sub.b))
            if before - value <= COARSE_TOL * abs(value):
                break
        w = torch.zeros_like(self.y)
        w[idx] = sub.w
        fw = rows_product(self.K, idx, sub.w.unsqueeze(1)).reshape(-1)  # K[:, idx] w_S (K symmetric), no copy
        if not float(self.primal_value(w, fw, sub.b)) < float(self.primal_value(None, None, 0.0)):
            return False
        self.w, self.fw, self.b = w, fw, sub.b if self.intercept else 0.0
        return True

    def primal_value(self, w: Optional[torch.Tensor], fw: Optional[torch.Tensor], b: float) -> torch.Tensor:
        """``P(w, b) = 1/2 w^T K w + sum_i c_i l(y_i, (K w)_i + b)`` as a 0-d tensor (``fw = K w``; None: ``w = 0``)."""
        if fw is None:
            return (self.c * self.loss.value(self.y, self.y.new_full(self.y.shape, b))).sum()
        return 0.5 * (w @ fw) + (self.c * self.loss.value(self.y, fw + b)).sum()

    def _cold(self) -> None:
        """Primal steps from ``w = 0``, ``b = 0`` (the cold start, from which every measured fit converged)."""
        self.w, self.fw, self.b = torch.zeros_like(self.y), torch.zeros_like(self.y), 0.0
        self.rounding_step = False

    def change(self, s: torch.Tensor, Ks: torch.Tensor) -> float:
        """``D_s(a + s) - D_s(a)`` computed from differences (no cancellation of large terms)."""
        a, sm = self.a, self.smoothing.value
        out = (self.f * s).sum() + 0.5 * (s * Ks).sum() + self.loss.conj_diff(a, s, self.y, self.c).sum()
        if sm:
            out = out + (sm * s * (a + 0.5 * s) / self.c).sum()
        return float(out)

    def primal_step(self, settling: bool = False) -> bool:
        """One damped Newton step on the primal over ``w`` (and the intercept ``b``; see the module docstring), then
        the dual point and ``K a`` for the certificate; False when no decrease of ``P`` could be found. ``settling``:
        the step that settles a column whose gap meets the tolerance (:meth:`settled`), its system solved through the
        last step's float32 factor where there is one (:meth:`_solve_system`)."""
        w, fw, K, b0 = self.w, self.fw, self.K, self.b
        a, W = self.loss.smoothed_dual(fw + b0, self.y, self.c)
        t = W * (fw + b0) + a  # W z, z the working response at the current predictions
        root = W.sqrt()
        if self.intercept:  # w = T t - b T W1 with 1^T w = 0, T = (I + W K)^{-1} = I - W^(1/2) B^{-1} W^(1/2) K
            S = self._solve_system(root, torch.stack([root * (K @ t), root * (K @ W)], 1), settling)
            u, v = t - root * S[:, 0], W - root * S[:, 1]
            total = float(v.sum())
            b_new = float(u.sum()) / total if total > 0 else b0
            w_new = u - b_new * v
        else:
            w_new = t - root * self._solve_system(root, (root * (K @ t)).unsqueeze(1), settling).squeeze(1)
            b_new = 0.0
        d, fd, db = w_new - w, K @ w_new - fw, b_new - b0
        # d^T grad_w P + db dP/db, grad_w P = K (w - a), dP/db = sum_i c_i l'(y_i, f_i + b) = -sum_i a_i
        slope = float(fd @ (w - a)) - db * float(a.sum())
        if not slope < 0:
            return False
        wf, df, dd = float(w @ fw), float(d @ fw), float(d @ fd)

        def value(step: float) -> float:
            pred = fw + step * fd + (b0 + step * db)
            return 0.5 * (wf + 2 * step * df + step * step * dd) + float((self.c * self.loss.value(self.y, pred)).sum())

        move = fd + db  # the predictions' change along the step

        def derivatives(step: float) -> Tuple[float, float]:
            pred = fw + step * fd + (b0 + step * db)
            a_t, W_t = self.loss.smoothed_dual(pred, self.y, self.c)
            return df + step * dd - float(a_t @ move), dd + float(W_t @ (move * move))

        p0, step = value(0.0), 1.0
        # a full step whose predicted decrease is below the rounding of P is taken when P does not rise beyond that
        # rounding either: neither the slope nor P's values resolve it (logistic with the intercept at C = 10^4: the
        # last step, which brings sum a from 1e-8 of |a| to zero, failed Armijo at -9e-6 out of P = 2e6 and left a
        # certified gap of 6e-7); not twice in a row (the next ones are rounding only: the column stalls)
        noise = NOISE * abs(p0)
        rounding_step = not self.rounding_step and -slope <= noise and value(1.0) <= p0 + noise
        self.rounding_step = rounding_step
        if rounding_step:
            step = 1.0
        else:
            step = _line_minimum(derivatives, slope)
            for _ in range(MAX_HALVINGS):
                if p0 - value(step) >= -ARMIJO * step * slope:
                    break
                step *= 0.5
            else:
                return False
        self.w, self.fw, self.b = w + step * d, fw + step * fd, b0 + step * db
        scale = max(1.0, float((self.fw + self.b).abs().max()))
        self.moved = float((step * fd + step * db).abs().max()) / scale
        self._certified_point()
        return True

    def settled(self) -> bool:
        """Whether the column's iterate is final once its gap meets the tolerance: always on the dual (its steps end
        on the gap alone); on the primal, once its last step moved the predictions by at most ``SETTLED_MOVE`` of
        them."""
        return not self.primal or self.moved <= SETTLED_MOVE

    def _certified_point(self) -> None:
        """The dual point ``a(K w + b)`` of the primal iterate and ``f = K a``, at which the gap is certified; with the
        intercept, shrunk onto ``sum a = 0`` (:func:`~joker_ext.intercept.feasible_dual`; the dual of the problem
        with an intercept needs it, and at the optimum ``a`` sums to zero anyway)."""
        a = self.loss.smoothed_dual(self.fw + self.b, self.y, self.c)[0]
        if self.intercept:
            a = feasible_dual(a.unsqueeze(1)).squeeze(1)
        self.a = a
        self.f = self.K @ a

    def _solve_system(self, root: torch.Tensor, V: torch.Tensor, reuse: bool = False) -> torch.Tensor:
        """``B^{-1} V`` with ``B = I + diag(root) K diag(root)``: by conjugate gradients in float64 through a float32
        factor when ``K`` is float64, of order at least :data:`~joker_ext.dense.MIXED_PRECISION_MIN`, and the bound
        ``cond(B) <= 1 + max(root)^2 |K|_inf`` times float32's epsilon is at most
        :data:`~joker_ext.dense.MIXED_CONTRACTION`; else (or when the iterations stop short of :data:`REFINED`)
        through a float64 factor. The solves go to :data:`CG_TOL`, float64's floor: refined only to 1e-12, the Newton
        steps (``w_new = t - ...``, a difference of large terms near the optimum) lost accuracy and fits took 1.7-6x
        the iterations at C = 100-776. Logistic loss with the intercept (then fitted by the intercept search), two
        cores, float32 factors refined against float64 factors (``make_classification`` d = 5, and ``make_moons``,
        gamma 0.2): n = 4000, C = 10, 7.2 -> 5.1 s; n = 6000, C = 0.06 and 0.23, 12.0 -> 8.3 s and 13.9 -> 9.7 s;
        C = 776, 47.4 -> 32.6 s; the same iteration counts and primal objectives to 14 digits.

        The last float32 factor is kept (by one column at a time: :func:`exact_newton` drops the others' before a
        step, so that several target columns hold no more than one). Near the optimum the weights ``W`` change
        little from step to step, and that factor of the last step's ``B`` preconditions this one's well: where the
        last step moved the predictions by at most :data:`STALE_MOVE` of them (and for the settling step, ``reuse``),
        conjugate gradients through it come first (:meth:`_stale_iterations` at most), and a factorisation only where
        they stop short of :data:`STALE_TOL`. Logistic with the intercept, n = 10,000 (make_hastie_10_2, C = 106),
        iterations to 1e-13 through the last factor after moves of 0.11, 0.017, 3.6e-3 and 1.3e-4: 15, 9, 6 and 4,
        each 0.11 s where a step with a fresh factor took 2.2 s."""
        K = self.K
        if self._factor32 is not None and (reuse or (self.moved <= STALE_MOVE and K.shape[0] >= STALE_MIN_ROWS)):
            X, residual = self._conjugate(self._factor32, root, V, self._stale_iterations(), STALE_TOL)
            if residual <= STALE_TOL:
                return X
        self._factor32 = None  # (freed before the next factor is formed)
        if K.dtype == torch.float64 and K.shape[0] >= MIXED_PRECISION_MIN:
            if self.K_inf is None:
                self.K_inf = float(torch.linalg.matrix_norm(K, ord=math.inf))
            if (1.0 + float(root.max()) ** 2 * self.K_inf) * torch.finfo(torch.float32).eps <= MIXED_CONTRACTION:
                L, info = cholesky_ex(_scaled_system(K, root, torch.float32))
                if int(info) == 0:
                    self._factor32 = L
                    X, residual = self._conjugate(L, root, V, CG_ITERATIONS, CG_TOL)
                    if residual <= REFINED:
                        return X
        L = cholesky_shifted(_scaled_system(K, root, K.dtype))
        return cholesky_solve(V, L)

    def _stale_iterations(self) -> int:
        """The most conjugate-gradient iterations a solve through the last step's factor may take
        (:data:`STALE_ROWS`, :data:`STALE_MIN_ITERATIONS`)."""
        return max(STALE_MIN_ITERATIONS, self.y.numel() // STALE_ROWS)

    def _conjugate(self, L32: torch.Tensor, root: torch.Tensor, V: torch.Tensor, iterations: int, tol: float):
        """``(X, residual)``: ``B^{-1} V`` (``B`` at ``root``) by conjugate gradients in float64 preconditioned by the
        float32 factor ``L32`` (of ``B`` or of an earlier step's), at most ``iterations`` of them, to a relative
        residual ``tol``, and the residual reached (:func:`~joker_ext.dense.cholesky_pcg`)."""
        K, scale = self.K, root.unsqueeze(1)
        return cholesky_pcg(L32, lambda X: X + scale * (K @ (scale * X)), V, tol=tol, max_iter=iterations)

    def step(self) -> bool:
        """One iteration: the primal Newton step for smooth non-quadratic conjugates, else a projected Newton step
        on the dual; False when no decrease could be found. A warm-started primal column whose step fails starts
        again, once, from ``w = 0``: from a warm start the intercept's Newton step can carry every prediction into
        the loss's flat tail, where the weights ``W`` vanish and no step decreases ``P`` (logistic with the
        intercept, warm-started at C = 10 from the solution at C = 1000: 'stalled' at a relative gap of 1.0)."""
        if self.primal:
            if self.primal_step():
                return True
            if not self.restartable:
                return False
            self.restartable = False
            self._cold()
            self._certified_point()
            return True
        a, sm = self.a, self.smoothing.value
        grad = self.f + self.loss.conj_grad(a, self.y, self.c) + sm * a / self.c
        grad, lo, hi = orthant_box(self.loss.kink, a, grad, self.lo, self.hi)
        hess = self.loss.psi_hess(a, self.y, self.c) + sm / self.c
        d = newton_direction(self.K, self.diagK, grad, hess, a, lo, hi, self.eps0)
        t = 1.0
        for _ in range(MAX_HALVINGS):
            s = torch.minimum(torch.maximum(a + t * d, lo), hi) - a
            moved = torch.nonzero(s).reshape(-1)
            if moved.numel() == 0:
                return False
            Ks = self.K.index_select(0, moved).T @ s[moved]
            change = self.change(s, Ks)
            if math.isfinite(change) and change < 0 and change <= ARMIJO * float((grad * s).sum()):
                self.a = torch.minimum(torch.maximum(a + s, self.lo), self.hi)
                self.f = self.f + Ks
                return True
            t *= 0.5
        return False

    def smoothed_gap(self) -> float:
        """Duality gap of the smoothed problem at ``(K a, a)``: its own optimality error."""
        sm = self.smoothing.value
        a_f, _ = self.loss.smoothed_dual(self.f, self.y, self.c, sm)
        primal_loss = self.loss.smoothed_value(self.f, self.y, self.c, a_f, sm)
        conj = self.loss.conj(self.a, self.y, self.c) + sm * self.a * self.a / (2 * self.c)
        return float((primal_loss + conj + self.a * self.f).sum())


def exact_newton(operator, Y: torch.Tensor, loss: Loss, c: torch.Tensor, options: Optional[SolverOptions] = None,
                 *, alpha0: Optional[torch.Tensor] = None, state0=None, start_iter: int = 0, callback=None,
                 validation=None, snapshot=None, snapshot_every=None, intercept: bool = False,
                 max_memory: Optional[int] = None, **_resume) -> SolverResult:
    """Minimise the dual by projected Newton with smoothing continuation, by Newton steps on the primal (logistic),
    or, for duals quadratic or linear on their box, by :func:`joker_ext.active_set.active_set` (see the module
    docstring).

    Parameters
    ----------
    operator : ExactOperator
        Gives the kernel matrix (:meth:`~joker_ext.operators.ExactOperator.gram`).
    Y : Tensor (n, T)
    loss : Loss
    c : Tensor (n,)
        ``c_i = C w_i > 0``.
    options : SolverOptions
        ``max_iter`` Newton iterations, ``tol`` on the relative duality gap, ``max_time``.
    alpha0 : Tensor (n, T), optional
        Warm start (projected on the box; ``K alpha`` is recomputed exactly). The primal Newton steps (logistic)
        start from ``w = 0`` instead when that has the smaller primal objective (the projection of another ``C``'s
        solution onto a smaller box can be a poor start).
    state0 : dict, optional
        ``state0['intercept']`` (T,): the starting intercept of the primal Newton steps (a warm start or a
        checkpoint's); its other entries are not needed.
    callback, validation, snapshot, snapshot_every :
        As in :func:`joker_ext.solver.dbcd_tr`, once per Newton iteration.
    intercept : bool
        Fit an unregularized intercept per column (``state['intercept']``): inside the active-set method for duals
        quadratic or linear on their box, jointly with ``w`` in the primal Newton steps (:func:`fits_intercept`);
        other losses get it from the intercept search around this engine.
    max_memory : int, optional
        Bytes for ``K`` and its factor: float32 inputs are computed in float64 when ``2 n^2`` float64 numbers fit
        (:func:`~joker_ext.engines.exact_compute_dtype`); results come back in the inputs' dtype.
    """
    if operator.mode != "exact":
        raise ValueError(f"exact_newton needs an exact kernel operator, got mode {operator.mode!r}")
    if loss.quadratic:  # a dual that is quadratic or linear on its box: its semismooth Newton method
        return active_set(operator, Y, loss, c, options, alpha0=alpha0, state0=state0, start_iter=start_iter,
                          callback=callback, validation=validation, snapshot=snapshot, snapshot_every=snapshot_every,
                          intercept=intercept, max_memory=max_memory)
    opts = options or SolverOptions()
    report_dtype = Y.dtype
    Y = Y.to(exact_compute_dtype(Y.shape[0], Y.dtype, max_memory))
    n, T = Y.shape
    dtype, device = Y.dtype, Y.device
    c_col = c.reshape(n, 1).to(dtype=dtype, device=device)
    loss.check_targets(Y)
    lo_all, hi_all = loss.box(Y, c_col)
    if alpha0 is not None:
        alpha = alpha0.to(dtype=dtype, device=device).reshape(n, T)
    else:
        # the dual point of the primal f = 0, where the primal Newton steps of smooth losses start (logistic: c y / 2,
        # the middle of the box; on the dual, a = 0 lies at the end of the box, where the entropy's gradient is
        # infinite and projected Newton steps crawl off it: n = 3000, C = 10, 19 iterations from zero, 12 from here)
        alpha = loss.smoothed_dual(torch.zeros(n, T, dtype=dtype, device=device), Y, c_col)[0]
    alpha = torch.minimum(torch.maximum(alpha, lo_all), hi_all)
    mon = Monitor(opts, callback=callback, validation=validation, snapshot=snapshot, snapshot_every=snapshot_every,
                  dtype=dtype, report_dtype=report_dtype)
    state = {"f": torch.zeros_like(alpha)}
    status, it, rec, columns = "max_iter", start_iter, None, []
    finite = torch.isfinite(hi_all - lo_all)
    eps0 = 1e-3 * float((hi_all - lo_all)[finite].abs().max()) if bool(finite.any()) else 1e-3

    def certify(iteration: int) -> dict:
        nonlocal alpha, state
        alpha = torch.stack([col.a for col in columns], dim=1)
        F = torch.stack([col.f for col in columns], dim=1)
        state = {"f": F}
        b = torch.tensor([col.b for col in columns], dtype=dtype, device=device)
        if intercept:  # the gap of the problem with the intercept at (K a + b, a), sum a = 0 (up to rounding)
            state["intercept"] = b
        primal, dual, gap = duality_gap(loss, Y, F + b, alpha, c_col, (alpha * F).sum(0))
        gap = gap - b * alpha.sum(0)
        for t, col in enumerate(columns):
            # the primal iterate (w, b) itself against the dual point: at large C, K (a - w) weighs on the loss
            # enough that the primal at (K a + b) stayed above the iterate's (logistic with the intercept, C = 6090:
            # certified gap 2.7e-7 where P(w, b) + D(a) is 1e-14); the model is then w. A difference of two sums,
            # so in float64 only, only where it is not negative beyond their rounding (float32: -7e-5 relative), and
            # a negative value within it counts as 0 (the gap is not negative)
            if col.primal and dtype == torch.float64:
                primal_w = col.primal_value(col.w, col.fw, col.b)
                gap_w = primal_w + dual[t]
                rounding = n * torch.finfo(dtype).eps * (primal_w.abs() + dual[t].abs())
                if -rounding <= gap_w < gap[t]:
                    alpha[:, t], F[:, t], primal[t], gap[t] = col.w, col.fw, primal_w, gap_w.clamp_min(0.0)
        rel = gap / torch.maximum(primal.abs(), dual.abs()).clamp_min(torch.finfo(dtype).tiny)
        for t, col in enumerate(columns):
            # the smoothing goes down once the smoothed problem's own gap is a small part of the true one
            if col.smoothing.active and col.smoothing.update(col.smoothed_gap(), float(gap[t])):
                col.stalled = False
        return mon.record(iteration, float(primal.sum()), float(dual.sum()), float(gap.sum()), state, alpha,
                          column_rel_gap=rel.tolist(), smoothing=max(col.smoothing.value for col in columns))

    with sigint_as_flag(opts.handle_sigint) as sig:
        try:
            K = operator.gram(dtype)
            diagK = K.diagonal().clone()
            F = K @ alpha
            s0 = float(c_col.mean()) * float(diagK.mean()) if needs_smoothing(loss, Y, c_col) else 0.0
            if intercept and s0:
                raise ValueError(f"exact_newton fits the intercept itself only for losses whose conjugate is smooth "
                                 f"inside its box (primal Newton steps) or quadratic on it; loss {loss.name!r} on "
                                 f"these targets needs smoothing: fit it with the intercept search "
                                 f"(joker_ext.intercept)")
            b0 = start_intercept(state0, T, torch.float64, "cpu").tolist()
            columns = [_Column(K, diagK, loss.column(t), alpha[:, t].clone(), F[:, t].clone(), Y[:, t], c_col[:, 0],
                               lo_all[:, t], hi_all[:, t], s0, eps0, warm=alpha0 is not None, intercept=intercept,
                               b0=b0[t])
                       for t in range(T)]
            rec = certify(it)
            reason = "converged" if rec["rel_gap"] <= opts.tol else None
            while reason is None and it < opts.max_iter:
                for t, col in enumerate(columns):
                    if col.stalled or rec["column_rel_gap"][t] <= opts.tol:
                        continue
                    # one column's float32 factor is kept at a time (the last to step; 4 n^2 bytes each)
                    for other in columns:
                        if other is not col:
                            other._factor32 = None
                    # a failed step with smoothing left: smooth less and go on
                    col.stalled = not col.step() and not col.smoothing.update(0.0, 1.0)
                it += 1
                rec = certify(it)
                # a gap at the tolerance from a step that still moved the predictions: one more step settles them
                unsettled = [col for t, col in enumerate(columns)
                             if not col.stalled and rec["column_rel_gap"][t] <= opts.tol and not col.settled()]
                if unsettled and rec["rel_gap"] <= opts.tol:
                    for col in unsettled:
                        col.primal_step(settling=True)
                    rec = certify(it)
                reason = mon.stop_reason(rec, state, alpha, sig.flag)
                if reason is None and all(col.stalled for col in columns):
                    reason = "stalled"
            status = reason or "max_iter"
        except (RuntimeError, MemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            status = "out_of_memory"
    if status == "stalled" and rec is not None and at_rounding_floor(rec["rel_gap"], opts.tol, dtype):
        status = "converged"  # no representable decrease is left: the gap is at the rounding floor
    return mon.result(alpha, state, it, status, rec)


def fits_intercept(loss: Loss) -> bool:
    """Whether :func:`exact_newton` fits the intercept itself for ``loss``: duals quadratic or linear on their box
    (the active-set method keeps ``sum a = 0``) and losses whose conjugate is smooth inside its box (the primal Newton
    steps take ``b`` as one more unknown), probed at ``y = 1``, ``c = 1``."""
    return bool(loss.quadratic) or smooth_for_any_targets(loss)


register_solver("newton", "exact", exact_newton, intercept=fits_intercept)
