"""The conjugate-loss registry.

Primal problem (``c_i = C * w_i``)::

    min_theta  1/2 ||theta||^2 + sum_i c_i l(y_i, <theta, phi(x_i)>)

Dual (minimisation form), ``theta = sum_i alpha_i phi(x_i)``::

    min_alpha  1/2 alpha^T K alpha + sum_i g_i(alpha_i),   g_i(a) = c_i l*(-a / c_i),  alpha_i in box_i

Every loss here writes its conjugate term as ``g(a) = -a y + psi(a; y, c) + kink * |a|`` where ``psi`` is
smooth inside the box and ``kink * |a|`` is the only non-smooth part (epsilon-insensitive: kink =
epsilon). The solver needs ``psi``, its first and second derivative in ``a``, the box and the kink::

    ========================== ============================== =================================== ===================
    loss                       l(y, f)                        g(a)                                box for a
    ========================== ============================== =================================== ===================
    squared                    (y - f)^2 / 2                  a^2 / (2c) - a y                    R
    huber(delta)               r^2/2 or delta(|r| - delta/2)  a^2 / (2c) - a y                    [-c delta, c delta]
    epsilon_insensitive(eps)   max(0, |y - f| - eps)          eps |a| - a y                       [-c, c]
    absolute                   |y - f|                        -a y                                [-c, c]
    pinball(quantile = tau)    max(tau r, (tau - 1) r)        -a y                                [c(tau - 1), c tau]
    hinge (y = +-1)            max(0, 1 - y f)                -a y                                0 <= y a <= c
    squared_hinge (y = +-1)    max(0, 1 - y f)^2 / 2          a^2 / (2c) - a y                    y a >= 0
    logistic (y = +-1)         log(1 + exp(-y f))             u log u + (c-u) log(c-u) - c log c  0 < u = y a < c
    ========================== ============================== =================================== ===================

(r = y - f.) Infimal convolution adds conjugates: ``(l1 [] l2)* = l1* + l2*``, so
:class:`InfimalConvolution` sums ``psi`` and kinks and intersects boxes; :func:`scaled` multiplies a
loss by a constant, which is the same as multiplying ``c``. Huber is
``infimal_convolution(get_loss('squared'), scaled(get_loss('absolute'), delta))``.

Each loss also gives the Fenchel-Young gap of one sample, ``c l(y, f) + g(a) + a f >= 0``, in a form
that is a sum of non-negative terms where that is possible; the duality gap is their sum.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Tuple

import torch

__all__ = [
    "Loss",
    "SquaredLoss",
    "HuberLoss",
    "EpsilonInsensitiveLoss",
    "AbsoluteLoss",
    "PinballLoss",
    "HingeLoss",
    "SquaredHingeLoss",
    "LogisticLoss",
    "InfimalConvolution",
    "ScaledLoss",
    "scaled",
    "infimal_convolution",
    "register_loss",
    "get_loss",
    "available_losses",
]

Tensor = torch.Tensor


def _check_param(name: str, value, *, low: float, low_open: bool, high: float = math.inf, high_open: bool = True):
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a number, got {value!r}") from exc
    ok = math.isfinite(v) and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    if not ok:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise ValueError(f"{name} must be in {lo}{low}, {high}{hi}, got {value!r}")
    return v


class Loss:
    """A convex loss described by its conjugate (see the module docstring).

    Subclasses set ``name``, ``margin`` (True when labels must be -1/+1 and the loss depends on
    ``y f``), ``residual`` (True when the loss depends on ``y - f`` alone: ``psi`` and the box do not depend on
    ``y``, so that shifting the targets by ``m`` shifts an unregularized intercept by ``m`` and changes nothing
    else), ``quadratic`` (True when ``psi`` is a quadratic or linear function, so that the solver's
    quadratic model is exact), ``kink``, and implement :meth:`value`, :meth:`psi`, :meth:`psi_grad`,
    :meth:`psi_hess` and :meth:`box`.
    """

    name: str = "loss"
    margin: bool = False
    residual: bool = False
    quadratic: bool = True
    kink: float = 0.0

    # -------------------------------------------------------------- to implement
    def value(self, y: Tensor, f: Tensor) -> Tensor:
        """Primal loss ``l(y, f)`` element-wise (default: numerical biconjugate of ``g``)."""
        return _biconjugate_value(self, y, f)

    def psi(self, a: Tensor, y: Tensor, c: Tensor) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def psi_grad(self, a: Tensor, y: Tensor, c: Tensor) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def psi_hess(self, a: Tensor, y: Tensor, c: Tensor) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def box(self, y: Tensor, c: Tensor) -> Tuple[Tensor, Tensor]:  # pragma: no cover
        """Lower and upper bounds of ``a`` (tensors shaped like ``y``; may be -inf / +inf)."""
        raise NotImplementedError

    # -------------------------------------------------------------- derived
    def conj(self, a: Tensor, y: Tensor, c: Tensor) -> Tensor:
        """``g(a) = -a y + psi(a) + kink |a|`` (inside the box)."""
        out = self.psi(a, y, c) - a * y
        if self.kink:
            out = out + self.kink * a.abs()
        return out

    def conj_grad(self, a: Tensor, y: Tensor, c: Tensor) -> Tensor:
        """Derivative of the smooth part ``-a y + psi(a)`` (the kink is handled by the solver)."""
        return self.psi_grad(a, y, c) - y

    def conj_diff(self, a: Tensor, s: Tensor, y: Tensor, c: Tensor) -> Tensor:
        """``g(a + s) - g(a)``, computed without cancelling large terms where possible."""
        out = self.psi_diff(a, s, y, c) - s * y
        if self.kink:
            out = out + self.kink * ((a + s).abs() - a.abs())
        return out

    def psi_diff(self, a: Tensor, s: Tensor, y: Tensor, c: Tensor) -> Tensor:
        return self.psi(a + s, y, c) - self.psi(a, y, c)

    def fenchel_young(self, y: Tensor, f: Tensor, a: Tensor, c: Tensor) -> Tensor:
        """``c l(y, f) + g(a) + a f``: non-negative, zero exactly when ``a`` is optimal for ``f``."""
        return c * self.value(y, f) + self.conj(a, y, c) + a * f

    def smoothed_dual(self, f: Tensor, y: Tensor, c: Tensor, smoothing: float = 0.0) -> Tuple[Tensor, Tensor]:
        """The dual variable of a prediction and the curvature of the (smoothed) loss there.

        ``a(f) = argmin_{a in box} a f + g(a) + smoothing a^2 / (2 c)``, so that
        ``c l_s(y, f) = -min_a [...]`` is the loss smoothed by adding ``smoothing / (2 c) a^2`` to its
        conjugate (its Moreau envelope of width ``smoothing / c``; ``smoothing = 0`` is the loss itself).
        Then ``d/df [c l_s(y, f)] = -a(f)`` and ``w = d^2/df^2 [c l_s] = -da/df``: ``1 / (psi''(a) +
        smoothing / c)`` where ``a`` is strictly inside the box (and off the kink), 0 elsewhere.

        The primal Newton engine (:mod:`joker_ext.primal_newton`) needs only this; it is derived here
        from the conjugate (closed form when ``psi`` is quadratic, bisection otherwise), so every
        registered loss gets it. Returns ``(a, w)``, shaped like ``f``.
        """
        smoothing = float(smoothing)
        c = c.expand_as(f) if c.dim() == f.dim() else c.reshape(-1, 1).expand_as(f)
        lo, hi = self.box(y, c)
        zero = torch.zeros_like(f)
        k = self.kink
        if self.quadratic:
            # psi is quadratic: psi'(a) = p0 + h a with constant h, so the minimiser is closed-form.
            p0 = self.psi_grad(zero, y, c)
            denom = self.psi_hess(zero, y, c) + smoothing / c
            r = y - f - p0
            safe = torch.where(denom > 0, denom, torch.ones_like(denom))
            pos, neg = (r - k) / safe, (r + k) / safe
            flat = torch.where(r - k > 0, hi, torch.where(r + k < 0, lo, zero))  # linear model: a bound
            a = torch.where(denom > 0, torch.where(pos > 0, pos, torch.where(neg < 0, neg, zero)), flat)
            a = torch.minimum(torch.maximum(a, lo), hi)
            curv = denom
        else:
            a = _smoothed_dual_bisection(self, f, y, c, lo, hi, smoothing)
            curv = self.psi_hess(a, y, c) + smoothing / c
        inside = (a > lo) & (a < hi) & (curv > 0)
        if k:
            inside = inside & (a != 0)
        w = torch.where(inside, 1.0 / torch.where(curv > 0, curv, torch.ones_like(curv)), zero)
        return a, w

    def smoothed_value(self, f: Tensor, y: Tensor, c: Tensor, a: Tensor, smoothing: float = 0.0) -> Tensor:
        """``c l_s(y, f) = -(a f + g(a) + smoothing a^2 / (2 c))`` at ``a = a(f)`` of :meth:`smoothed_dual`."""
        c = c.expand_as(f) if c.dim() == f.dim() else c.reshape(-1, 1).expand_as(f)
        out = -(a * f + self.conj(a, y, c))
        if smoothing:
            out = out - smoothing * a * a / (2.0 * c)
        return out

    def column(self, t: int) -> "Loss":
        """The loss of target column ``t`` alone (itself, unless it carries per-column parameters)."""
        return self

    def check_targets(self, y: Tensor) -> None:
        """Raise ValueError when targets do not suit the loss (margin losses need -1/+1)."""
        if self.margin and not torch.all((y == 1) | (y == -1)):
            raise ValueError(f"loss {self.name!r} needs targets in {{-1, +1}}")

    def params(self) -> dict:
        """Parameters of the loss (plain numbers), used in reports and checkpoints."""
        return {}

    def __repr__(self) -> str:
        p = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({p})"


# ---------------------------------------------------------------------------- regression losses
class SquaredLoss(Loss):
    """``l = (y - f)^2 / 2``; ``g(a) = a^2/(2c) - a y``; kernel ridge regression."""

    name = "squared"
    residual = True

    def value(self, y, f):
        return 0.5 * (y - f) ** 2

    def psi(self, a, y, c):
        return 0.5 * a * a / c

    def psi_grad(self, a, y, c):
        return a / c

    def psi_hess(self, a, y, c):
        return (1.0 / c).expand_as(a)

    def psi_diff(self, a, s, y, c):
        return s * (a + 0.5 * s) / c

    def box(self, y, c):
        inf = torch.full_like(y, math.inf)
        return -inf, inf

    def fenchel_young(self, y, f, a, c):
        return (a - c * (y - f)) ** 2 / (2.0 * c)


class HuberLoss(SquaredLoss):
    """Huber loss with threshold ``delta``; ``g(a) = a^2/(2c) - a y`` on ``[-c delta, c delta]``."""

    name = "huber"

    def __init__(self, delta: float = 1.0):
        self.delta = _check_param("delta", delta, low=0.0, low_open=True)

    def value(self, y, f):
        r = (y - f).abs()
        return torch.where(r <= self.delta, 0.5 * r * r, self.delta * (r - 0.5 * self.delta))

    def box(self, y, c):
        b = (c * self.delta).expand_as(y)
        return -b, b

    def fenchel_young(self, y, f, a, c):
        r = y - f
        inside = r.abs() <= self.delta
        sq = (a - c * r) ** 2 / (2.0 * c)
        s = torch.sign(r)
        outside = (a - c * self.delta * s) ** 2 / (2.0 * c) + (c * self.delta - a * s) * (r.abs() - self.delta)
        return torch.where(inside, sq, outside)

    def params(self):
        return {"delta": self.delta}


class _LinearConjugate(Loss):
    """Losses whose conjugate is ``-a y`` (plus an optional kink) on a box: psi = 0."""

    def psi(self, a, y, c):
        return torch.zeros_like(a)

    def psi_grad(self, a, y, c):
        return torch.zeros_like(a)

    def psi_hess(self, a, y, c):
        return torch.zeros_like(a)

    def psi_diff(self, a, s, y, c):
        return torch.zeros_like(a)


class AbsoluteLoss(_LinearConjugate):
    """``l = |y - f|`` (least absolute deviations); ``g(a) = -a y`` on ``[-c, c]``."""

    name = "absolute"
    residual = True

    def value(self, y, f):
        return (y - f).abs()

    def box(self, y, c):
        b = c.expand_as(y)
        return -b, b

    def fenchel_young(self, y, f, a, c):
        r = y - f
        return (c - a) * r.clamp_min(0) + (c + a) * (-r).clamp_min(0)


class EpsilonInsensitiveLoss(AbsoluteLoss):
    """``l = max(0, |y - f| - epsilon)`` (SVR); ``g(a) = epsilon |a| - a y`` on ``[-c, c]``."""

    name = "epsilon_insensitive"

    def __init__(self, epsilon: float = 0.1):
        self.epsilon = _check_param("epsilon", epsilon, low=0.0, low_open=False)
        self.kink = self.epsilon

    def value(self, y, f):
        return ((y - f).abs() - self.epsilon).clamp_min(0)

    def fenchel_young(self, y, f, a, c):
        r = y - f
        A, R = a.abs(), r.abs()
        return (c - A) * (R - self.epsilon).clamp_min(0) + A * (self.epsilon - R).clamp_min(0) + (A * R - a * r)

    def params(self):
        return {"epsilon": self.epsilon}


class PinballLoss(_LinearConjugate):
    """Quantile loss ``max(tau r, (tau - 1) r)``, r = y - f; ``g(a) = -a y`` on ``[c(tau-1), c tau]``."""

    name = "pinball"
    residual = True

    def __init__(self, quantile: float = 0.5):
        self.quantile = _check_param("quantile", quantile, low=0.0, low_open=True, high=1.0, high_open=True)

    def value(self, y, f):
        r = y - f
        return torch.maximum(self.quantile * r, (self.quantile - 1.0) * r)

    def box(self, y, c):
        return (c * (self.quantile - 1.0)).expand_as(y), (c * self.quantile).expand_as(y)

    def fenchel_young(self, y, f, a, c):
        r = y - f
        tau = self.quantile
        return (c * tau - a) * r.clamp_min(0) + (a - c * (tau - 1.0)) * (-r).clamp_min(0)

    def params(self):
        return {"quantile": self.quantile}


# ---------------------------------------------------------------------------- classification losses
class HingeLoss(_LinearConjugate):
    """``l = max(0, 1 - y f)`` (l1-SVM); ``g(a) = -a y`` with ``0 <= y a <= c``."""

    name = "hinge"
    margin = True

    def value(self, y, f):
        return (1.0 - y * f).clamp_min(0)

    def box(self, y, c):
        c = c.expand_as(y)
        zero = torch.zeros_like(y)
        return torch.where(y > 0, zero, -c), torch.where(y > 0, c, zero)

    def fenchel_young(self, y, f, a, c):
        u = y * a
        h = 1.0 - y * f
        return (c - u) * h.clamp_min(0) + u * (-h).clamp_min(0)


class SquaredHingeLoss(Loss):
    """``l = max(0, 1 - y f)^2 / 2`` (l2-SVM); ``g(a) = a^2/(2c) - a y`` with ``y a >= 0``."""

    name = "squared_hinge"
    margin = True

    def value(self, y, f):
        return 0.5 * (1.0 - y * f).clamp_min(0) ** 2

    psi = SquaredLoss.psi
    psi_grad = SquaredLoss.psi_grad
    psi_hess = SquaredLoss.psi_hess
    psi_diff = SquaredLoss.psi_diff

    def box(self, y, c):
        inf = torch.full_like(y, math.inf)
        zero = torch.zeros_like(y)
        return torch.where(y > 0, zero, -inf), torch.where(y > 0, inf, zero)

    def fenchel_young(self, y, f, a, c):
        u = y * a
        h = 1.0 - y * f
        return torch.where(h >= 0, (u - c * h) ** 2 / (2.0 * c), u * u / (2.0 * c) + u * (-h))


def _xlogx(x: Tensor) -> Tensor:
    return torch.special.xlogy(x, x)


class LogisticLoss(Loss):
    """``l = log(1 + exp(-y f))`` (kernel logistic regression).

    With ``u = y a``: ``g(a) = u log u + (c - u) log(c - u) - c log c`` on ``0 < u < c``. The box is
    closed to ``[eps_c, c - eps_c]`` where ``eps_c`` is the gap from ``c`` to the next smaller float of
    the working dtype, so that ``c - u`` is never rounded to zero, and the second derivative
    ``c / (u (c - u))`` is capped at ``hess_cap / c`` to keep the trust-region model well conditioned
    (seed paper, section 3.2).
    """

    name = "logistic"
    margin = True
    quadratic = False

    def __init__(self, hess_cap: float = 1e8):
        self.hess_cap = _check_param("hess_cap", hess_cap, low=0.0, low_open=True)

    def value(self, y, f):
        return torch.nn.functional.softplus(-y * f)

    def _u(self, a, y, c):
        return (y * a).clamp(min=0), c

    def psi(self, a, y, c):
        u, c = self._u(a, y, c)
        return _xlogx(u) + _xlogx(c - u) - _xlogx(c.expand_as(u)) + u

    def psi_grad(self, a, y, c):
        u, c = self._u(a, y, c)
        return y * (torch.log(u) - torch.log(c - u) + 1.0)

    def psi_diff(self, a, s, y, c):
        # (x + d) log(x + d) - x log x = d log(x + d) + x log1p(d / x), applied to u and c - u: no
        # cancellation between large terms when the step is small.
        u, c = self._u(a, y, c)
        d = y * s
        v = c - u
        left = d * torch.log(u + d) + torch.where(u > 0, u * torch.log1p(d / u.clamp_min(torch.finfo(u.dtype).tiny)), torch.zeros_like(u))
        right = -d * torch.log(v - d) + torch.where(v > 0, v * torch.log1p(-d / v.clamp_min(torch.finfo(v.dtype).tiny)), torch.zeros_like(v))
        return left + right + d

    def psi_hess(self, a, y, c):
        u, c = self._u(a, y, c)
        h = c / (u * (c - u))
        return torch.minimum(h, (self.hess_cap / c).expand_as(h))

    def box(self, y, c):
        c = c.expand_as(y)
        eps_c = c - torch.nextafter(c, torch.zeros_like(c))
        lo_u, hi_u = eps_c, c - eps_c
        return torch.where(y > 0, lo_u, -hi_u), torch.where(y > 0, hi_u, -lo_u)

    def smoothed_dual(self, f, y, c, smoothing=0.0):
        """Closed form without smoothing: ``y a = c sigmoid(-y f)``, ``w = c sigmoid(y f) sigmoid(-y f)``
        (inside the box of :meth:`box`); the generic bisection otherwise."""
        if smoothing:
            return super().smoothed_dual(f, y, c, smoothing)
        c = c.expand_as(f) if c.dim() == f.dim() else c.reshape(-1, 1).expand_as(f)
        m = y * f
        lo, hi = self.box(y, c)
        a = torch.minimum(torch.maximum(y * c * torch.sigmoid(-m), lo), hi)
        w = c * torch.sigmoid(m) * torch.sigmoid(-m)
        return a, w

    def fenchel_young(self, y, f, a, c):
        # c * KL(Bernoulli(s) || Bernoulli(p)) with s = u / c and p = sigmoid(-y f).
        s = (y * a / c).clamp(0, 1)
        m = y * f
        logp = torch.nn.functional.logsigmoid(-m)
        log1mp = torch.nn.functional.logsigmoid(m)
        kl = _xlogx(s) + _xlogx(1 - s) - s * logp - (1 - s) * log1mp
        return c * kl.clamp_min(0)

    def params(self):
        return {"hess_cap": self.hess_cap}


# ---------------------------------------------------------------------------- composition
class ScaledLoss(Loss):
    """``scale * loss``: its conjugate term is the base loss's with ``c`` multiplied by ``scale``."""

    def __init__(self, base: Loss, scale: float):
        if not isinstance(base, Loss):
            raise TypeError(f"base must be a Loss, got {type(base).__name__}")
        self.base = base
        self.scale = _check_param("scale", scale, low=0.0, low_open=True)
        self.name = f"{self.scale:g}*{base.name}"
        self.margin = base.margin
        self.residual = base.residual
        self.quadratic = base.quadratic
        self.kink = base.kink

    def value(self, y, f):
        return self.scale * self.base.value(y, f)

    def psi(self, a, y, c):
        return self.base.psi(a, y, c * self.scale)

    def psi_grad(self, a, y, c):
        return self.base.psi_grad(a, y, c * self.scale)

    def psi_hess(self, a, y, c):
        return self.base.psi_hess(a, y, c * self.scale)

    def psi_diff(self, a, s, y, c):
        return self.base.psi_diff(a, s, y, c * self.scale)

    def box(self, y, c):
        return self.base.box(y, c * self.scale)

    def fenchel_young(self, y, f, a, c):
        return self.base.fenchel_young(y, f, a, c * self.scale)

    def params(self):
        return {"base": self.base.name, "scale": self.scale}


def scaled(loss: Loss, scale: float) -> ScaledLoss:
    """Return ``scale * loss``."""
    return ScaledLoss(loss, scale)


class InfimalConvolution(Loss):
    """Infimal convolution of residual losses: ``(l1 [] l2)(r) = inf_z l1(z) + l2(r - z)``.

    Its conjugate is the sum of the conjugates (seed paper, Proposition 2): ``psi = psi_1 + psi_2``,
    ``kink = kink_1 + kink_2``, box = intersection of the boxes. The primal value is computed from the
    conjugate by a vectorised bisection (the biconjugate), so any two registered losses compose.
    """

    def __init__(self, first: Loss, second: Loss):
        for nm, l in (("first", first), ("second", second)):
            if not isinstance(l, Loss):
                raise TypeError(f"{nm} must be a Loss, got {type(l).__name__}")
        if first.margin != second.margin:
            raise ValueError("infimal convolution needs two regression losses or two margin losses")
        self.parts = (first, second)
        self.name = f"({first.name} [] {second.name})"
        self.margin = first.margin
        self.residual = first.residual and second.residual
        self.quadratic = first.quadratic and second.quadratic
        self.kink = first.kink + second.kink

    def psi(self, a, y, c):
        return self.parts[0].psi(a, y, c) + self.parts[1].psi(a, y, c)

    def psi_grad(self, a, y, c):
        return self.parts[0].psi_grad(a, y, c) + self.parts[1].psi_grad(a, y, c)

    def psi_hess(self, a, y, c):
        return self.parts[0].psi_hess(a, y, c) + self.parts[1].psi_hess(a, y, c)

    def psi_diff(self, a, s, y, c):
        return self.parts[0].psi_diff(a, s, y, c) + self.parts[1].psi_diff(a, s, y, c)

    def box(self, y, c):
        lo1, hi1 = self.parts[0].box(y, c)
        lo2, hi2 = self.parts[1].box(y, c)
        return torch.maximum(lo1, lo2), torch.minimum(hi1, hi2)

    def params(self):
        return {"first": repr(self.parts[0]), "second": repr(self.parts[1])}


def infimal_convolution(first: Loss, second: Loss) -> InfimalConvolution:
    """Return ``first [] second`` (see :class:`InfimalConvolution`)."""
    return InfimalConvolution(first, second)


def _bisect_nondecreasing(slope, lo: Tensor, hi: Tensor, scale: Tensor, iters: int):
    """Bracket and bisect the root of a nondecreasing ``slope`` on the box ``[lo, hi]`` (sides may be infinite).

    An infinite side starts at ``-scale`` / ``scale`` and doubles (at most 200 times) until ``slope`` has the
    sign there that brackets the root. Returns ``(a_lo, a_hi, a)``: the finite bracket ends and the midpoint
    after ``iters`` halvings.
    """
    a_lo = torch.where(torch.isinf(lo), -scale, lo)
    a_hi = torch.where(torch.isinf(hi), scale, hi)
    for _ in range(200):  # widen unbounded sides until they bracket the root
        grow_lo = torch.isinf(lo) & (slope(a_lo) > 0)
        grow_hi = torch.isinf(hi) & (slope(a_hi) < 0)
        if not bool(grow_lo.any() or grow_hi.any()):
            break
        a_lo = torch.where(grow_lo, 2.0 * a_lo, a_lo)
        a_hi = torch.where(grow_hi, 2.0 * a_hi, a_hi)
    left, right = a_lo.clone(), a_hi.clone()
    for _ in range(iters):
        mid = 0.5 * (left + right)
        up = slope(mid) < 0
        left = torch.where(up, mid, left)
        right = torch.where(up, right, mid)
    return a_lo, a_hi, 0.5 * (left + right)


def _smoothed_dual_bisection(loss: Loss, f: Tensor, y: Tensor, c: Tensor, lo: Tensor, hi: Tensor,
                             smoothing: float, iters: int = 100) -> Tensor:
    """``argmin_{lo <= a <= hi} a f + g(a) + smoothing a^2 / (2c)`` by bisection on its (sub)derivative
    ``f - y + psi'(a) + kink sign(a) + smoothing a / c``, which is nondecreasing in ``a``."""
    k = loss.kink

    def slope(a):
        d = f - y + loss.psi_grad(a, y, c) + smoothing * a / c
        if k:
            d = d + k * torch.sign(a)
        return d

    a_lo, a_hi, a = _bisect_nondecreasing(slope, lo, hi, 1.0 + (y - f).abs() + c, iters)
    a = torch.where(slope(a_lo) >= 0, a_lo, torch.where(slope(a_hi) <= 0, a_hi, a))
    if k:
        # the kink: a = 0 exactly when 0 lies in the subdifferential there
        zero = torch.zeros_like(a)
        base = f - y + loss.psi_grad(zero, y, c)
        at_kink = (base - k <= 0) & (base + k >= 0) & (lo <= 0) & (hi >= 0)
        a = torch.where(at_kink, zero, a)
    return torch.minimum(torch.maximum(a, lo), hi)


def _biconjugate_value(loss: Loss, y: Tensor, f: Tensor, iters: int = 200) -> Tensor:
    """``l(y, f) = sup_{a in box(c=1)} [a (y - f) - psi(a) - kink |a|]`` by bisection on the derivative."""
    y = y.to(torch.float64)
    f = f.to(y)
    one = torch.ones_like(y)
    r = y - f

    def slope(a):  # minus the derivative of the concave objective: nondecreasing
        d = loss.psi_grad(a, y, one) - r
        if loss.kink:
            d = d + loss.kink * torch.sign(a)
        return d

    lo, hi, a = _bisect_nondecreasing(slope, *loss.box(y, one), 1.0 + r.abs(), iters)
    cands = torch.stack([lo, hi, a])
    vals = cands * r - loss.psi(cands, y, one)
    if loss.kink:
        vals = vals - loss.kink * cands.abs()
    return vals.max(dim=0).values


# ---------------------------------------------------------------------------- registry
_REGISTRY: Dict[str, Callable[..., Loss]] = {}


def register_loss(name: str, factory: Callable[..., Loss], *, overwrite: bool = False) -> None:
    """Register a loss factory under ``name`` (``factory(**params) -> Loss``).

    Raises ValueError when the name is taken (unless ``overwrite``) and TypeError when ``factory`` is not
    callable.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory must be callable, got {type(factory).__name__}")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"a loss named {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = factory


def available_losses() -> Tuple[str, ...]:
    """Names of the registered losses."""
    return tuple(_REGISTRY)


#: Parameters each built-in loss takes, by estimator-parameter name.
LOSS_PARAMETERS = {
    "squared": (),
    "huber": ("delta",),
    "epsilon_insensitive": ("epsilon",),
    "absolute": (),
    "pinball": ("quantile",),
    "hinge": (),
    "squared_hinge": (),
    "logistic": (),
}


def get_loss(loss, **params) -> Loss:
    """Return a :class:`Loss` from a registered name (extra ``params`` go to its factory) or a Loss.

    Parameters that the named loss does not take are ignored when they are None.
    """
    if isinstance(loss, Loss):
        return loss
    if not isinstance(loss, str):
        raise TypeError(f"loss must be a registered loss name or a Loss object, got {type(loss).__name__}")
    if loss not in _REGISTRY:
        raise ValueError(f"unknown loss {loss!r}; registered losses are {available_losses()}")
    wanted = LOSS_PARAMETERS.get(loss)
    if wanted is not None:
        params = {k: v for k, v in params.items() if k in wanted}
    else:
        params = {k: v for k, v in params.items() if v is not None}
    return _REGISTRY[loss](**params)


for _name, _factory in (
    ("squared", SquaredLoss),
    ("huber", HuberLoss),
    ("epsilon_insensitive", EpsilonInsensitiveLoss),
    ("absolute", AbsoluteLoss),
    ("pinball", PinballLoss),
    ("hinge", HingeLoss),
    ("squared_hinge", SquaredHingeLoss),
    ("logistic", LogisticLoss),
):
    register_loss(_name, _factory)
