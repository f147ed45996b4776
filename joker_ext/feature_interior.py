"""An interior-point start for the feature Newton engine's kinked losses (:mod:`joker_ext.primal_newton`).

The kinked losses with a linear conjugate (hinge, absolute, pinball, epsilon-insensitive) have, per target column,
the dual box QP of :mod:`joker_ext.interior_point` with ``Q = Phi Phi^T + diag(h)`` (``Phi`` the n x M feature
matrix, ``h = psi''(0)``)::

    min_a  1/2 a^T Q a - (y - p0)^T a + kink sum_i |a_i|     s.t.  lo <= a <= hi

Mehrotra's predictor-corrector (:func:`~joker_ext.interior_point.box_qp_iterates`) solves it in 10 to 20
iterations, while the smoothing continuation takes 30 to 150 Newton iterations. Its first iterate is the middle of
each box; where that does not lie near zero (the hinge loss's ``[0, C]``, :func:`worth_starting`) the engine does
without it. Each iteration needs ``Q a`` (two products with the kept features) and two solves with ``Q + D``
(``D`` the barrier's diagonal), by the Woodbury identity through the ``M x M`` factor of
``I + Phi^T (D + h)^{-1} Phi``::

    (Q + D)^{-1} r = E r - E Phi (I + Phi^T E Phi)^{-1} Phi^T E r,      E = (D + h)^{-1}

(one ``2 n M^2`` Gram product and one factorisation per iteration: the cost of a Newton iteration with the Hessian
formed, :meth:`joker_ext.primal_newton._Passes.exact_hessian`). ``E`` is capped at ``1 / (WOODBURY_FLOOR s)``
(``s`` the mean of ``diag(Q)``): the free coordinates' barrier curvature tends to zero, and ``I + Phi^T E Phi``
would lose its positive definiteness to rounding; the capped system gives an inexact Newton direction, which the
next iteration's residuals (recomputed from ``Q a``) correct.

The engine advances every target column by one iterate per iteration (:class:`ColumnSolve`), certifies each
iterate, and, from a relative gap of :data:`FINISH_FROM` on, reads its active sets (:func:`snap`) and solves for the
free coordinates exactly (the continuation's finishing step, :func:`joker_ext.primal_newton._active_set_point`);
where that point meets the tolerance the column is done, else its interior point goes on. The continuation starts
from the result, centred at its active sets.
"""
from __future__ import annotations

from typing import Optional

import torch

from .interior_point import box_qp_iterates

__all__ = ["FeatureGram", "ColumnSolve", "snap", "worth_starting", "zero_inside", "FINISH_FROM", "DIVERGED",
           "ABANDON_RISE", "ABANDON_PATIENCE", "ABANDON_GAP"]

#: Smallest ``D + h`` (times the mean of ``diag(Q)``) the Woodbury factor sees. JokerFalkon, n = 5000, M = 500, the
#: epsilon-insensitive, absolute and pinball losses at penalties 1e-6 to 1e-8 (Newton iterations to ``tol`` 1e-6):
#: 1e-7 took 17-101 (gaps that stalled near 1e-5 for 20 iterations), 1e-9 15-19, 1e-10 17-142 (at penalty 1e-8 the
#: iterates of two losses drifted away, :data:`DIVERGED`, and the continuation took over).
WOODBURY_FLOOR = 1e-9
#: Times the floor is raised 100x when ``I + Phi^T E Phi`` cannot be factored before the interior point gives up.
FLOOR_RAISES = 3
#: Relative complementarity at which the interior point stops when no finishing step succeeded before.
INTERIOR_TOL = 1e-9
#: Where in each box the interior point starts (:func:`~joker_ext.interior_point.solve_box_qp`): the middle.
START = 0.5
#: The start is used only where the middle of every box, times the mean of ``diag(Q)``, is at most this
#: (:func:`worth_starting`).
MIDDLE_MAX = 2000.0
#: Relative duality gap below which each iterate's active sets are tried by the engine's finishing step.
FINISH_FROM = 1e-2
#: A column whose relative gap grows to this many times its smallest ends its interior point there, at the iterate of
#: the smallest (the capped Woodbury directions can grow too inexact: with a floor of 1e-10, an epsilon-insensitive
#: fit's gap went from 6e-4 to 0.99 over 45 iterations).
DIVERGED = 10.0
#: A column whose relative gap, above :data:`ABANDON_GAP`, grows to ``ABANDON_RISE`` times its smallest, or has not
#: improved on it for ``ABANDON_PATIENCE`` iterates, ends the whole start: its iterates went back up, or stalled, far
#: from the solution, and the engine takes the working-set start (:func:`joker_ext.primal_newton._working_set_start`)
#: instead. Seen with wide kernels at small penalties (JokerFalkon, absolute, epsilon-insensitive and pinball losses,
#: n = 1000-1500, M = 200-300, Gaussian sigma 3-6 on standardised data in d = 3-6, penalties 5e-9 to 1e-8): gaps of
#: 0.3-0.7 that went back to 1.0 and stayed there for the 60 iterates, after which the continuation had not converged
#: by 300 iterations; the working-set start converged in under a second. Where the interior point converges its gap
#: falls below 0.1 by the fifth iterate and, above 0.03, at every iterate; its rises were 3x at most, at gaps of 1e-3
#: (27 problems, n = 2000-4000, M = 300-1000, penalties 1e-5 to 1e-8).
ABANDON_RISE = 2.0
ABANDON_PATIENCE = 3
ABANDON_GAP = 0.03


class FeatureGram:
    """``Q = Phi Phi^T + diag(h)`` of one target column, for :func:`~joker_ext.interior_point.solve_box_qp`.

    Parameters
    ----------
    product : callable
        ``V -> Phi V`` (M x k -> n x k).
    transpose_product : callable
        ``A -> Phi^T A`` (n x k -> M x k).
    gram_factor : callable
        ``w -> P``, an object whose ``solve(V)`` gives ``(I + Phi^T diag(w) Phi)^{-1} V`` (None when that matrix
        cannot be factored).
    h : Tensor (n,)
    diag : Tensor (n,)
        ``diag(Phi Phi^T)``.
    """

    def __init__(self, product, transpose_product, gram_factor, h: torch.Tensor, diag: torch.Tensor):
        self.product, self.transpose_product, self.gram_factor = product, transpose_product, gram_factor
        self.h = h
        self.floor = WOODBURY_FLOOR * max(float((diag + h).mean()), torch.finfo(h.dtype).tiny)
        self.a = self.beta = self.f = None  # the last product's a, Phi^T a and Phi Phi^T a

    def __matmul__(self, a: torch.Tensor) -> torch.Tensor:
        self.a = a
        self.beta = self.transpose_product(a.unsqueeze(1))
        self.f = self.product(self.beta)[:, 0]
        return self.f + self.h * a

    def factor(self, D: torch.Tensor) -> Optional["_Woodbury"]:
        """A solver of ``(Q + diag(D)) x = r``, or None when ``I + Phi^T E Phi`` cannot be factored even with ``E``
        capped :data:`FLOOR_RAISES` times 100x lower."""
        floor = self.floor
        for _ in range(FLOOR_RAISES + 1):
            inverse = 1.0 / (D + self.h).clamp_min(floor)
            factored = self.gram_factor(inverse)
            if factored is not None:
                return _Woodbury(self, factored, inverse)
            floor *= 100.0
        return None


class _Woodbury:
    """``(Q + D)^{-1} R`` by the Woodbury identity (module docstring)."""

    def __init__(self, gram: "FeatureGram", factored, inverse: torch.Tensor):
        self.gram, self.factored, self.inverse = gram, factored, inverse.unsqueeze(1)

    def solve(self, R: torch.Tensor) -> torch.Tensor:
        ER = self.inverse * R
        w = self.factored.solve(self.gram.transpose_product(ER))
        return ER - self.inverse * self.gram.product(w)


def worth_starting(lo, hi, diag) -> bool:
    """Whether the interior point is a good start: its first iterate, the middle of the boxes, lies near zero, in the
    middle half of every box (epsilon-insensitive and absolute, pinball at quantiles 0.25 to 0.75), and at most
    :data:`MIDDLE_MAX` from zero on the scale of ``Q``.

    Measured with the hinge loss, whose boxes ``[0, C]`` start it at ``C / 2`` (JokerFalkon, ``tol`` 1e-6, Newton
    iterations to it): n = 5000, M = 500, penalty 1e-6: 18 against 49; n = 2000, M = 400 / n = 4000, M = 1000,
    penalty 1e-5: 11 / 14 against 27 / 25; but n = 3000, M = 300, penalty 1e-5: 174 against 53, and n = 4000,
    M = 1000, penalty 1e-7: 807 against 219, with poorer models at 20 iterations (test error 0.082 against 0.063,
    0.083 against 0.059); n = 5000 at penalty 1e-8 (``C / 2 = 10,000``): 0.16 against 0.07 at 20 iterations. So
    the hinge loss takes the working-set start (:func:`joker_ext.primal_newton._working_set_start`) instead."""
    middle = 0.5 * (lo + hi)
    return zero_inside(lo, hi) and float(middle.abs().max()) * float(diag.mean()) <= MIDDLE_MAX


def zero_inside(lo, hi) -> bool:
    """Whether zero lies in the middle half of every box ``[lo, hi]``."""
    width = hi - lo
    return bool(((lo + 0.25 * width <= 0) & (0 <= hi - 0.25 * width)).all())


def snap(a, grad, diag, lo, hi, kink: float) -> torch.Tensor:
    """The point with the active sets that the proximal-gradient step ``a - grad / diag`` predicts from ``a``
    (``grad`` the gradient of the smooth part, ``diag`` the diagonal of ``Q``): coordinates it takes to a bound
    sit at that bound, those it takes to the kink at zero, the others (free) keep their value. At an optimum the
    prediction is its own active sets whatever the step; near one, those of every coordinate not degenerate."""
    diag = diag.clamp_min(torch.finfo(diag.dtype).tiny)  # (a row whose features all vanish: its step is a bound)
    step = a - grad / diag
    if kink:
        step = torch.sign(step) * (step.abs() - kink / diag).clamp_min(0.0)
    fixed = torch.minimum(torch.maximum(step, lo), hi)
    at_bound = (step <= lo) | (step >= hi)
    at_kink = (step == 0) if kink else torch.zeros_like(at_bound)
    return torch.where(at_bound, fixed, torch.where(at_kink, torch.zeros_like(a), a))


class ColumnSolve:
    """One target column's interior-point solve, advanced one iterate at a time (:meth:`advance`), so that the engine
    moves every column in step (an iteration of the fit is an iterate of each open column) and certifies each iterate
    (:attr:`a`, with ``Phi^T a`` and ``Phi Phi^T a`` in :attr:`gram`)."""

    def __init__(self, gram: FeatureGram, lin, kink: float, lo, hi, diag):
        self.gram, self.lin, self.kink, self.lo, self.hi, self.diag = gram, lin, kink, lo, hi, diag
        self.steps = box_qp_iterates(gram, lin, kink, lo, hi, None, tol=INTERIOR_TOL, start=START)
        self.a = None

    def advance(self) -> bool:
        """Move to the next iterate; False when the solver has ended (converged, or it could not go on)."""
        try:
            _, self.a, _, _ = next(self.steps)
            return True
        except StopIteration as done:
            self.a = done.value[0]
            return False

    def snapped(self) -> torch.Tensor:
        """The current iterate's active sets (:func:`snap`)."""
        if self.gram.a is None or not torch.equal(self.gram.a, self.a):
            self.gram @ self.a  # (the solver's last point, when it stopped after a step)
        return snap(self.a, self.gram.f + self.gram.h * self.a - self.lin, self.diag, self.lo, self.hi, self.kink)

    def close(self) -> None:
        self.steps.close()
