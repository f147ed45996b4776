"""Kernel operators: what the solver needs from the kernel matrix, block by block.

Two implementations share one interface:

* :class:`ExactOperator` keeps ``f = K alpha`` (n x T) up to date. A block step costs one
  ``K(X, X_B) s`` product, evaluated in row chunks (or by KeOps) so that at most
  ``chunk_rows x b`` kernel values exist at a time.
* :class:`FeatureOperator` keeps ``beta = Phi^T alpha`` (M x T). A block computes ``Phi_B`` once and
  uses it for ``f_B = Phi_B beta``, for the Hessian products ``Phi_B (Phi_B^T v)`` of the trust-region
  subproblem, and for the update ``beta += Phi_B^T s``.

State is a small dict of tensors so that it can be checkpointed.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

from .data import BlockData
from .features import FeatureMap
from .kernels import Kernel

__all__ = ["ExactOperator", "FeatureOperator", "BlockOps", "apply_delta"]


def apply_delta(state: Dict[str, torch.Tensor], delta: Dict[str, torch.Tensor]) -> None:
    """Add a state change in place (no allocation, so it cannot fail half-way for lack of memory)."""
    for k, v in delta.items():
        state[k] += v


class BlockOps:
    """What one block iteration needs: ``f_B`` and the product with the block's kernel matrix."""

    def __init__(self, f: torch.Tensor, matvec: Callable[[torch.Tensor], torch.Tensor], payload=None,
                 matrix: Optional[torch.Tensor] = None):
        self.f = f
        self.matvec = matvec
        self.payload = payload
        self.matrix = matrix  # the block's kernel matrix when it is formed (exact mode)


class ExactOperator:
    """Exact kernel matrix, accessed by blocks.

    Parameters
    ----------
    kernel : Kernel
    data : BlockData
    chunk_rows : int
        Rows of X per chunk in the ``K(X, X_B) s`` update.
    backend : {'torch', 'keops'}
    """

    mode = "exact"

    def __init__(self, kernel: Kernel, data: BlockData, *, chunk_rows: int = 4096, backend: str = "torch"):
        self.kernel = kernel
        self.data = data
        self.chunk_rows = max(1, int(chunk_rows))
        self.backend = backend
        self._X_dev: Optional[torch.Tensor] = None

    @property
    def n(self) -> int:
        return self.data.n

    def _mmv_all(self, XB: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
        """``K(X, X_B) V`` for all rows of X."""
        if self.backend == "keops":
            return self.kernel.mmv(self.data.all(), XB, V, backend="keops")
        out = torch.empty(self.n, V.shape[1], dtype=V.dtype, device=V.device)
        for start, stop, Xc in self.data.chunks(self.chunk_rows):
            out[start:stop] = self.kernel(Xc, XB) @ V
        return out

    def init_state(self, alpha: torch.Tensor) -> Dict[str, torch.Tensor]:
        """``f = K alpha`` (zero when alpha is zero)."""
        f = torch.zeros_like(alpha)
        nz = torch.nonzero(alpha.abs().sum(1) > 0).reshape(-1)
        for s in range(0, nz.numel(), self.chunk_rows):
            idx = nz[s : s + self.chunk_rows]
            f += self._mmv_all(self.data.take(idx), alpha[idx])
        return {"f": f}

    def block(self, idx: torch.Tensor, state) -> BlockOps:
        XB = self.data.take(idx)
        KBB = self.kernel(XB, XB)
        return BlockOps(state["f"][idx], lambda V: KBB @ V, payload=XB, matrix=KBB)

    def state_delta(self, ops: BlockOps, s: torch.Tensor) -> Dict[str, torch.Tensor]:
        """The change of the state for a step ``s`` on the block (computed, not applied)."""
        return {"f": self._mmv_all(ops.payload, s)}

    def update(self, state, idx: torch.Tensor, ops: BlockOps, s: torch.Tensor) -> None:
        apply_delta(state, self.state_delta(ops, s))

    def predictions(self, state, alpha: torch.Tensor, refresh: bool = False) -> torch.Tensor:
        return state["f"]

    def quad(self, state, alpha: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """``alpha^T K alpha`` per target."""
        return (alpha * f).sum(0)

    def predict_new(self, state, alpha: torch.Tensor, Xnew: BlockData, chunk_rows: int = 2048) -> torch.Tensor:
        """``K(Xnew, X) alpha`` in chunks of both sets."""
        out = torch.zeros(Xnew.n, alpha.shape[1], dtype=alpha.dtype, device=alpha.device)
        for start, stop, Xc in Xnew.chunks(chunk_rows):
            for s0, s1, Xt in self.data.chunks(self.chunk_rows):
                out[start:stop] += self.kernel(Xc, Xt) @ alpha[s0:s1]
        return out


class FeatureOperator:
    """Random-feature (or Nystrom-feature) kernel ``K = Phi Phi^T``, accessed by blocks."""

    mode = "features"

    def __init__(self, feature_map: FeatureMap, data: BlockData, *, chunk_rows: int = 4096, gram_max: int = 1024):
        self.feature_map = feature_map
        self.data = data
        self.chunk_rows = max(1, int(chunk_rows))
        self.gram_max = int(gram_max)

    @property
    def n(self) -> int:
        return self.data.n

    def init_state(self, alpha: torch.Tensor) -> Dict[str, torch.Tensor]:
        """``beta = Phi^T alpha``."""
        M = self.feature_map.n_features
        beta = torch.zeros(M, alpha.shape[1], dtype=alpha.dtype, device=alpha.device)
        if torch.any(alpha != 0):
            for start, stop, Xc in self.data.chunks(self.chunk_rows):
                beta += self.feature_map(Xc).T @ alpha[start:stop]
        return {"beta": beta}

    def block(self, idx: torch.Tensor, state) -> BlockOps:
        Phi = self.feature_map(self.data.take(idx))
        b = Phi.shape[0]
        if b <= self.gram_max:
            # Small blocks: form Phi_B Phi_B^T once (b^2 M) so that the trust-region step can be solved
            # exactly and its products cost b^2 instead of 2 b M.
            G = Phi @ Phi.T
            return BlockOps(Phi @ state["beta"], lambda V: G @ V, payload=Phi, matrix=G)
        return BlockOps(Phi @ state["beta"], lambda V: Phi @ (Phi.T @ V), payload=Phi)

    def state_delta(self, ops: BlockOps, s: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"beta": ops.payload.T @ s}

    def update(self, state, idx, ops: BlockOps, s: torch.Tensor) -> None:
        apply_delta(state, self.state_delta(ops, s))

    def predictions(self, state, alpha: torch.Tensor, refresh: bool = False) -> torch.Tensor:
        """``f = Phi beta`` over all rows; with ``refresh`` also recompute ``beta = Phi^T alpha`` in the
        same pass (removes the drift of many small updates)."""
        beta = state["beta"]
        f = torch.empty(self.n, beta.shape[1], dtype=beta.dtype, device=beta.device)
        fresh = torch.zeros_like(beta) if refresh else None
        for start, stop, Xc in self.data.chunks(self.chunk_rows):
            Phi = self.feature_map(Xc)
            if refresh:
                fresh += Phi.T @ alpha[start:stop]
            else:
                f[start:stop] = Phi @ beta
        if refresh:
            state["beta"] = fresh
            for start, stop, Xc in self.data.chunks(self.chunk_rows):
                f[start:stop] = self.feature_map(Xc) @ fresh
        return f

    def quad(self, state, alpha: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        return (state["beta"] ** 2).sum(0)

    def predict_new(self, state, alpha, Xnew: BlockData, chunk_rows: int = 4096) -> torch.Tensor:
        beta = state["beta"]
        out = torch.empty(Xnew.n, beta.shape[1], dtype=beta.dtype, device=beta.device)
        for start, stop, Xc in Xnew.chunks(chunk_rows):
            out[start:stop] = self.feature_map(Xc) @ beta
        return out
