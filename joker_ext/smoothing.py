"""Smoothing continuation shared by the Newton engines.

Losses whose conjugate is linear somewhere (hinge, absolute, pinball, epsilon-insensitive: ``psi'' = 0``)
have a primal loss with kinks, where Newton's method has no second derivative to use. The engines solve
instead the problem whose conjugate terms carry ``smoothing / (2 c_i) a^2`` (the loss's Moreau envelope,
see :meth:`joker_ext.losses.Loss.smoothed_dual`), whose dual variables stay feasible for the original
problem, and drive ``smoothing`` to zero: every smoothed solution gives a certificate (the duality gap of
the original problem at ``alpha = a(f)``), and the loop ends when that gap meets the tolerance. The
feature Newton engine also centres the smoothing at the last smoothed problem's dual solution,
``smoothing / (2 c_i) (a - a_k)^2`` (a proximal point step on the dual, :mod:`joker_ext.primal_newton`).

Smooth losses (squared, Huber, squared hinge, logistic) take ``smoothing = 0`` from the start: their
primal is once differentiable with a semismooth derivative, and Newton's method with a line search
converges on it directly.
"""
from __future__ import annotations

import torch

from .losses import Loss

__all__ = ["needs_smoothing", "smooth_for_any_targets", "Continuation"]


def needs_smoothing(loss: Loss, Y: torch.Tensor, c: torch.Tensor) -> bool:
    """True when the conjugate's curvature ``psi''`` vanishes inside the box (a kinked primal loss)."""
    if loss.kink:
        return True
    probe_y = Y[:1]
    probe_c = c.reshape(-1, 1)[:1].expand_as(probe_y)
    lo, hi = loss.box(probe_y, probe_c)
    lo = torch.where(torch.isinf(lo), -probe_c, lo)
    hi = torch.where(torch.isinf(hi), probe_c, hi)
    mid = 0.5 * (lo + hi)
    return bool((loss.psi_hess(mid, probe_y, probe_c) <= 0).any())


def smooth_for_any_targets(loss: Loss) -> bool:
    """:func:`needs_smoothing`'s answer without targets, probed at ``y = 1``, ``c = 1``: True when ``loss`` needs no
    smoothing (the engines' registries decide from the loss alone whether they fit an intercept for it)."""
    probe = torch.ones(1, 1, dtype=torch.float64)
    return not needs_smoothing(loss, probe, probe.reshape(-1))


class Continuation:
    """The smoothing parameter and when to decrease it.

    ``value`` starts at ``start`` (0 for smooth losses) and is divided by ``factor`` whenever the smoothed
    problem is solved well enough that its own optimality error is below ``ratio`` times the part of the
    original problem's gap that the smoothing causes, that is, when the smoothing, not the solve, is what
    keeps the gap open. It never goes below ``floor`` (a stalled Newton step calls ``update(0, 1)``).
    """

    def __init__(self, start: float, *, factor: float = 10.0, ratio: float = 0.1, floor: float = 1e-14):
        self.value = float(start)
        self.factor = float(factor)
        self.ratio = float(ratio)
        self.floor = float(floor)

    @property
    def active(self) -> bool:
        return self.value > 0

    def solved(self, solve_error: float, smoothing_share: float) -> bool:
        """True when the smoothed problem counts as solved (``solve_error <= ratio * smoothing_share``);
        the smoothing is then divided by ``factor`` (not below ``floor``) and the caller moves the centre of
        the smoothing to the solution (a proximal point step, see :mod:`joker_ext.primal_newton`)."""
        if self.value <= self.floor or solve_error > self.ratio * smoothing_share:
            return False  # (at the floor the smoothing is below rounding: no more centre moves, no loop)
        self.value = max(self.floor, self.value / self.factor)
        return True

    def update(self, solve_error: float, smoothing_share: float) -> bool:
        """Decrease the smoothing when ``solve_error <= ratio * smoothing_share``; return whether it changed."""
        if self.value <= self.floor or solve_error > self.ratio * smoothing_share:
            return False
        self.value = max(self.floor, self.value / self.factor)
        return True
