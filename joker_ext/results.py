"""What an engine returns: :class:`SolverResult` (a leaf module, imported by the engine registry
:mod:`joker_ext.engines` and by every engine, and importing neither)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

__all__ = ["SolverResult"]


@dataclass
class SolverResult:
    """What every engine (:func:`joker_ext.solver.dbcd_tr` and the engines of :mod:`joker_ext.engines`) returns.

    ``status`` is one of 'converged', 'max_iter', 'max_time', 'callback', 'interrupted',
    'out_of_memory' (a block did not fit; alpha and state are those before that block), 'stalled' (the gap
    stopped falling short of ``tol``: rounding, or the engine's own limit).
    ``history`` holds one dict per gap evaluation with keys iteration, time, primal, dual, gap,
    rel_gap (and 'validation' when a validation function was given).
    """

    alpha: torch.Tensor
    state: Dict[str, torch.Tensor]
    n_iter: int
    status: str
    primal: float
    dual: float
    gap: float
    rel_gap: float
    radius: torch.Tensor
    history: List[dict] = field(default_factory=list)
    rng_state: Optional[torch.Tensor] = None

    @property
    def converged(self) -> bool:
        return self.status == "converged"
