"""The projected-Newton direction (Bertsekas, 1982) on a box-constrained dual: Newton on the free coordinates, a
scaled gradient step on the epsilon-active ones. Shared by :mod:`joker_ext.newton_exact` (its iterations for
conjugates that are not quadratic on their box) and :mod:`joker_ext.active_set` (the monotone fallback of a round
whose sets cycle)."""
from __future__ import annotations

from typing import Optional

import torch

from .dense import cholesky_shifted, cholesky_solve

__all__ = ["newton_direction"]


def newton_direction(K, diagK, grad, hess, a, lo, hi, eps0: float, *, residual: Optional[float] = None,
                     bordered: bool = False):
    """Projected-Newton direction: Newton on the free set, scaled gradient on the epsilon-active set.

    The active set's width is ``eps = min(eps0, residual)``, ``residual`` by default the norm of the
    projected-gradient step ``a - P(a - grad)``. ``bordered=True`` keeps the free coordinates' step on
    ``sum_F d_F = 0`` (the Newton system bordered by the constraint ``sum_i a_i = 0`` of an intercept)."""
    if residual is None:
        residual = float((a - torch.minimum(torch.maximum(a - grad, lo), hi)).norm())
    eps = min(eps0, residual)
    fixed = ((a <= lo + eps) & (grad > 0)) | ((a >= hi - eps) & (grad < 0)) | (lo == hi)
    d = torch.where(fixed, -grad / (diagK + hess).clamp_min(torch.finfo(a.dtype).tiny), torch.zeros_like(a))
    free = torch.nonzero(~fixed).reshape(-1)
    if free.numel():
        H = K.clone() if free.numel() == a.numel() else K.index_select(0, free).index_select(1, free)
        H.diagonal().add_(hess[free])
        L = cholesky_shifted(H)
        del H
        if bordered:
            sol = cholesky_solve(torch.stack([-grad[free], torch.ones_like(grad[free])], 1), L)
            d[free] = sol[:, 0] - (sol[:, 0].sum() / sol[:, 1].sum()) * sol[:, 1]
        else:
            d[free] = -cholesky_solve(grad[free].unsqueeze(1), L).squeeze(1)
    return d
