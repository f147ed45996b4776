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

from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

from .data import BlockData
from .defaults import DIRECT_MAX, GRAM_MAX, SINGULAR_DIRECT_MAX
from .features import FeatureMap, NystromFeatureMap
from .kernels import Kernel

__all__ = ["ExactOperator", "FeatureOperator", "BlockOps", "BlockModel", "block_model", "apply_delta"]

BLOCK_MODELS = ("auto", "exact", "gram", "kernel", "products")
SUBPROBLEMS = ("auto", "cg", "direct")


@dataclass(frozen=True)
class BlockModel:
    """How one DBCD-TR block is modelled and solved (the answer of :func:`block_model`).

    Attributes
    ----------
    matrix : {'gram', 'kernel', 'products'}
        The matrix of the block's quadratic model: ``'gram'`` the block's true matrix ``H_B``, formed
        (``K_BB`` for an exact kernel, ``Phi_B Phi_B^T`` for features); ``'kernel'`` the kernel's ``K_BB``
        standing in for ``Phi_B Phi_B^T`` (formed, inexact; products with ``H_B`` on demand);
        ``'products'`` ``Phi_B (Phi_B^T v)`` on demand (exact, never formed).
    newton : bool
        The block step is an inexact Newton step by CG on ``H_B + diag(psi'')``, preconditioned with the
        formed model matrix (the trust-region step is the fallback when it fails).
    direct : bool
        The trust-region subproblem on the free variables is solved exactly by an eigendecomposition of
        the formed block Hessian; otherwise by truncated CG-Steihaug.
    """

    matrix: str
    newton: bool = False
    direct: bool = False


def block_model(b: int, *, requested: str = "auto", matrix: Optional[str] = None, newton_steps: bool = False,
                wide: bool = False, kernel_ok: bool = False, positive_curvature: bool = False,
                subproblem: str = "auto", direct_max: int = DIRECT_MAX, gram_max: int = GRAM_MAX) -> BlockModel:
    """The block-model policy of DBCD-TR, in one place.

    For a block of ``b`` rows with Hessian ``H = H_B + diag(h)``, ``h = psi''(alpha_B) >= 0``:

    * the model matrix (``matrix`` when the block is already built, else chosen from ``requested``):
      ``'auto'`` takes ``'kernel'`` when the loss's steps are Newton steps (``newton_steps``: an
      unconstrained, quadratic dual without kink, i.e. the squared loss), the features are ``wide``
      (``M >= 2 b``; with ``b`` near ``M``, ``Phi_B Phi_B^T`` is far from the full-rank ``K_BB``) and the
      kernel's block is an unbiased stand-in (``kernel_ok``); ``'exact'`` otherwise. ``'exact'`` forms
      ``'gram'`` for ``b <= gram_max`` and takes ``'products'`` above (``2 b^2 M`` flops once against
      ``4 b M`` per product). Exact kernels always form their ``K_BB``: ``'gram'``.
    * ``newton``: ``newton_steps`` and a ``'kernel'`` model and ``h > 0`` (the quadratic is strictly convex).
    * ``direct``: ``subproblem == 'direct'``, or ``'auto'`` with a formed matrix, ``b <= direct_max`` and
      either ``b <= SINGULAR_DIRECT_MAX`` or ``h > 0`` (without a positive diagonal, linear conjugates such
      as the hinge loss, ``H`` is singular, Cholesky fails and every round needs an eigendecomposition:
      only for small blocks).

    Parameters
    ----------
    b : int
        Rows of the block.
    requested : {'auto', 'exact', 'gram', 'kernel', 'products'}
        The feature operator's ``block_model`` option (ignored when ``matrix`` is given).
    matrix : {'gram', 'kernel', 'products'}, optional
        The model matrix the block was built with (:attr:`BlockOps.kind`).
    newton_steps, wide, kernel_ok, positive_curvature : bool
        See above (``positive_curvature``: ``h > 0`` on the whole block).
    subproblem : {'auto', 'cg', 'direct'}
    direct_max, gram_max : int

    Returns
    -------
    BlockModel
    """
    if matrix is None:
        if requested not in BLOCK_MODELS:
            raise ValueError(f"block_model must be one of {BLOCK_MODELS}, got {requested!r}")
        matrix = requested
        if matrix == "auto":
            matrix = "kernel" if newton_steps and wide and kernel_ok else "exact"
        if matrix == "exact":
            matrix = "gram" if b <= gram_max else "products"
    formed = matrix != "products"
    newton = bool(newton_steps and matrix == "kernel" and positive_curvature)
    direct = subproblem == "direct" or (subproblem == "auto" and formed and b <= direct_max
                                        and (b <= SINGULAR_DIRECT_MAX or positive_curvature))
    return BlockModel(matrix, newton, direct)


def apply_delta(state: Dict[str, torch.Tensor], delta: Dict[str, torch.Tensor]) -> None:
    """Add a state change in place (no allocation, so it cannot fail half-way for lack of memory)."""
    for k, v in delta.items():
        state[k] += v


class BlockOps:
    """What one block iteration needs: ``f_B`` and the product with the block's (model) kernel matrix.

    ``matvec`` and ``matrix`` describe the matrix the trust-region *model* uses. When it is the block's
    true matrix ``H_B`` (``exact_model``), the model of the dual is exact up to the conjugate's curvature.
    Otherwise ``quad(S)`` returns the true ``diag(S^T H_B S)`` (per column), from which the solver
    measures the actual decrease of the dual: the trust region then absorbs the model's error.
    """

    def __init__(self, f: torch.Tensor, matvec: Callable[[torch.Tensor], torch.Tensor], payload=None,
                 matrix: Optional[torch.Tensor] = None,
                 quad: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 true_matvec: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        self.f = f
        self.matvec = matvec
        self.payload = payload
        self.matrix = matrix  # the block's (model) kernel matrix when it is formed
        self.quad = quad
        self.true_matvec = true_matvec  # products with the true H_B when the model's matrix is not it

    @property
    def exact_model(self) -> bool:
        return self.quad is None

    @property
    def kind(self) -> str:
        """The model matrix (see :class:`BlockModel`): 'products' (not formed), 'gram' (the true block
        matrix, formed) or 'kernel' (a formed stand-in, the true products on demand)."""
        if self.matrix is None:
            return "products"
        return "gram" if self.exact_model else "kernel"


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

    def gram(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The whole kernel matrix ``K`` (n x n), for the full-dual engines; in ``dtype`` when given (computed
        from the rows in that dtype), else in the rows' own."""
        X = self.data.all() if dtype is None else self.data.all().to(dtype)
        return self.kernel(X, X)  # one block: the kernels fill their output in place, no chunk copies

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
    """Random-feature (or Nystrom-feature) kernel ``K = Phi Phi^T``, accessed by blocks.

    Parameters
    ----------
    feature_map : FeatureMap
    data : BlockData
    chunk_rows : int
        Rows per chunk in full passes over the data.
    gram_max : int
        Largest block for which ``block_model='exact'`` (and 'auto') forms the Gram matrix
        (default :data:`joker_ext.defaults.GRAM_MAX`).
    block_model : {'auto', 'exact', 'gram', 'kernel', 'products'}
        The matrix of the trust-region model of a block (chosen by :func:`block_model`):

        * ``'gram'``: ``Phi_B Phi_B^T``, formed (``2 b^2 M`` flops), the exact model;
        * ``'products'``: ``Phi_B (Phi_B^T v)`` on demand (``4 b M`` flops per product), exact;
        * ``'kernel'``: the kernel's own ``K_BB``, of which ``Phi_B Phi_B^T`` is an unbiased estimate,
          formed in ``O(b^2 d)`` flops instead of ``O(b^2 M)``. The model is then inexact by the
          random-feature error; the step is still measured on the true dual (one product
          ``Phi_B^T s``, needed for the update anyway), so the trust region keeps every accepted step
          a decrease of the random-feature dual, whose minimiser is unchanged.
        * ``'exact'``: ``'gram'`` for blocks of at most ``gram_max`` rows, else ``'products'``;
        * ``'auto'``: ``'kernel'`` for losses whose block step is a Newton step (unconstrained quadratic
          duals such as the squared loss: the step is computed by CG on the true matrix, preconditioned
          with ``K_BB``, see :func:`joker_ext.solver.dbcd_tr`) when the map is unbiased for an evaluable
          kernel, ``M > 8 d`` and ``M >= 2 b`` (with ``b`` near or above ``M``, ``Phi_B Phi_B^T`` is far
          from the full-rank ``K_BB`` and the preconditioner stops helping); ``'exact'`` otherwise. (For
          the trust-region steps of the other losses a model off by the random-feature error slows
          convergence when ``C`` is large, measured.)

        With ``'kernel'`` the product ``Phi_B^T s`` that measures a trust-region step is computed again
        for the update (one extra ``2 b M`` product per accepted trust-region step).
    """

    mode = "features"

    def __init__(self, feature_map: FeatureMap, data: BlockData, *, chunk_rows: int = 4096, gram_max: int = GRAM_MAX,
                 block_model: str = "auto"):
        if block_model not in BLOCK_MODELS:
            raise ValueError(f"block_model must be one of {BLOCK_MODELS}, got {block_model!r}")
        self.feature_map = feature_map
        self.data = data
        self.chunk_rows = max(1, int(chunk_rows))
        self.gram_max = int(gram_max)
        if block_model == "kernel" and isinstance(feature_map, NystromFeatureMap):
            raise ValueError("block_model='kernel' needs random features of an evaluable kernel, got "
                             "NystromFeatureMap (its Gram matrix is not an unbiased estimate of K_BB)")
        self.block_model = block_model
        # Set by the solver (prepare): whether the loss's block steps are Newton steps. False until then,
        # so that a block taken outside the solver always gets an exact model.
        self.newton_steps = False
        self._kernel_ok: dict = {}  # (d, dtype, device) -> whether the kernel block can stand in for Phi_B Phi_B^T

    def prepare(self, *, newton_steps: bool) -> None:
        """Called by :func:`joker_ext.solver.dbcd_tr` before the first block with what the loss needs."""
        self.newton_steps = bool(newton_steps)

    def _kernel_model_available(self, XB: torch.Tensor) -> bool:
        key = (XB.shape[1], XB.dtype, str(XB.device))
        cache = self._kernel_ok
        if key not in cache:
            M, d = self.feature_map.n_features, XB.shape[1]
            expected = getattr(self.feature_map, "expected_gram", None)
            cache[key] = M > 8 * d and expected is not None and expected(XB[:1], XB[:1]) is not None
        return cache[key]

    def _model_for(self, XB: torch.Tensor) -> str:
        """The model matrix of a block with inputs ``XB`` (:func:`block_model`)."""
        b = XB.shape[0]
        wide = self.feature_map.n_features >= 2 * b
        kernel_ok = self.block_model == "auto" and self.newton_steps and wide and self._kernel_model_available(XB)
        return block_model(b, requested=self.block_model, newton_steps=self.newton_steps, wide=wide,
                           kernel_ok=kernel_ok, gram_max=self.gram_max).matrix

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
        XB = self.data.take(idx)
        Phi = self.feature_map(XB)
        f = Phi @ state["beta"]
        kind = self._model_for(XB)
        if kind == "kernel":
            expected = getattr(self.feature_map, "expected_gram", None)
            KBB = None if expected is None else expected(XB, XB)
            if KBB is None:
                raise ValueError(f"block_model='kernel' needs random features of an evaluable kernel, got "
                                 f"{type(self.feature_map).__name__}")

            def quad(S):
                U = Phi.T @ S
                return (U * U).sum(0)

            return BlockOps(f, lambda V: KBB @ V, payload=Phi, matrix=KBB, quad=quad,
                            true_matvec=lambda V: Phi @ (Phi.T @ V))
        if kind == "gram":
            # Form Phi_B Phi_B^T once (b^2 M) so that the trust-region step can be solved exactly and its
            # products cost b^2 instead of 2 b M.
            G = Phi @ Phi.T
            return BlockOps(f, lambda V: G @ V, payload=Phi, matrix=G)
        return BlockOps(f, lambda V: Phi @ (Phi.T @ V), payload=Phi)

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
