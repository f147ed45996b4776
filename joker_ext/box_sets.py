"""Where a dual coordinate stands in its box: the status codes shared by the active-set engines
(:mod:`joker_ext.active_set`, :mod:`joker_ext.working_set`) and the SMO phase (:mod:`joker_ext.smo`).

A coordinate ``lo_i <= a_i <= hi_i`` of a loss with a kink at zero (hinge, epsilon-insensitive, absolute, pinball)
is ``LOWER`` at ``lo_i``, ``UPPER`` at ``hi_i``, ``ZERO`` at the kink strictly inside its box, and ``FREE`` strictly
inside its box and off the kink (without a kink: strictly inside its box). Kept apart from the engines so that the
SMO phase reads them without importing :mod:`joker_ext.active_set` (which imports :mod:`joker_ext.memory`, which
imports :mod:`joker_ext.smo`).
"""

FREE, LOWER, UPPER, ZERO = 0, 1, 2, 3

__all__ = ["FREE", "LOWER", "UPPER", "ZERO"]
