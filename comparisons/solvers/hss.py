"""Hierarchically semi-separable (HSS) compression of a kernel matrix, with a fast direct solver.

The ADMM SVM of seed 002 (Cipolla & Gondzio) uses STRUMPACK's HSS-ANN approximation of K and a ULV
factorisation of ``K + beta I``. This module is the project's own, simpler construction of the same kind of
object (no STRUMPACK code is used or called).

Construction (:meth:`HSSMatrix.from_kernel`)
--------------------------------------------
1. **Cluster tree.** The points are split recursively at the median of their projection on the principal
   direction (a few power iterations on the centred points of the node) until a node has at most
   ``leaf_size`` points; the points are permuted so that every node is a contiguous range.
2. **Neighbours.** ``n_neighbors`` nearest neighbours of every point (in the kernel's scaled coordinates):
   exact, by chunked distance computations, for n <= 20000; otherwise approximate, by merging the exact
   neighbours found inside the leaves of a few random-projection trees.
3. **Nested interpolative decompositions, bottom-up.** For a node tau with candidate rows C (all its points
   for a leaf, the union of its children's skeletons otherwise) the off-diagonal block row
   ``K(C, complement of tau)`` is *sampled* at the columns S = the neighbours of C that lie outside tau
   (at most ``max_samples``, the closest interactions dominate a decaying kernel) plus ``n_random`` uniformly
   drawn outside columns (the far field). A column-pivoted QR of ``K(C, S)^T`` picks k <= ``max_rank``
   skeleton rows (``|R_kk| > rel_tol |R_11|``) and the interpolation matrix U_tau with
   ``K(C, .) ~ U_tau K(skel_tau, .)`` (``U_tau`` holds the identity on the skeleton rows).
4. **Stored form.** Leaves: the dense diagonal blocks ``D_tau = K(I_tau, I_tau)`` and ``U_tau`` (``|I_tau| x k``);
   internal nodes: ``U_tau`` (k_left + k_right) x k; every pair of siblings: ``B = K(skel_left, skel_right)``.
   With ``leaf_size = O(r)`` this is O(n r) numbers (:meth:`HSSMatrix.memory_numbers` counts them).

The approximation is ``K(I_a, I_b) ~ U_a^big K(skel_a, skel_b) U_b^big^T`` for siblings a, b, with the
nested bases ``U^big``. By symmetry the row and column bases are the same.

Operations
----------
* :meth:`HSSMatrix.matvec`: the classical upward / sibling / downward sweep, O(n r) work and memory.
* :meth:`HSSMatrix.factorize` (shift beta) returns an :class:`HSSFactorization` whose ``solve`` applies
  ``(K_hss + beta I)^{-1}`` exactly (up to rounding) by a recursive Sherman-Morrison-Woodbury
  ("telescoping") factorisation [derived; Ho & Greengard 2012 style]: at each level, with
  ``A = D + U Kt U^T`` (D block diagonal, U block diagonal), ``Lambda = (U^T D^{-1} U)^{-1}`` and
  ``A^{-1} b = t + D^{-1} U (Lambda s - bh)``, ``t = D^{-1} b``, ``bh = Lambda U^T t``,
  ``s = (Lambda + Kt)^{-1} bh``; ``Lambda + Kt`` has the same HSS form one level up (its diagonal blocks are
  ``[[Lambda_a, B], [B^T, Lambda_b]]``) down to a dense root system. O(n r^2 + n leaf^2) to factorise, O(n r)
  memory, O(n r) per solve. Unlike STRUMPACK's ULV it is not orthogonal-transform based; for the well
  conditioned shifted systems of ADMM it is accurate to rounding; for small shifts (condition numbers
  ~1e6) it loses a few digits, which one step of iterative refinement (the default) restores.

Not reproduced: STRUMPACK's adaptive randomised sampling with tolerance-driven rank growth, its
hss_abs_tol / hss_rel_tol semantics and its parallelism.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import scipy.linalg as sla
import torch
from threadpoolctl import threadpool_limits

from joker_ext.kernels import Kernel, StationaryKernel

from ._common import (
    _desc,
    as_matrix,
    check_choice,
    check_device,
    check_dtype,
    check_number,
    check_positive_int,
    check_kernel,
)

__all__ = ["HSSMatrix", "HSSFactorization", "nearest_neighbors"]


@dataclass
class _Node:
    start: int
    end: int
    parent: int = -1
    left: int = -1
    right: int = -1
    level: int = 0
    skel: Optional[np.ndarray] = None  # skeleton positions (permuted order)
    U: Optional[torch.Tensor] = None  # interpolation matrix
    D: Optional[torch.Tensor] = None  # dense diagonal block (leaves)
    B: Optional[torch.Tensor] = None  # K(skel_left, skel_right) (internal nodes)

    @property
    def is_leaf(self) -> bool:
        return self.left < 0

    @property
    def size(self) -> int:
        return self.end - self.start


# ---------------------------------------------------------------------------- tree and neighbours
def _principal_direction(P: np.ndarray, rng: np.random.Generator, iters: int = 4) -> np.ndarray:
    C = P - P.mean(0, keepdims=True)
    v = rng.standard_normal(P.shape[1])
    for _ in range(iters):
        v = C.T @ (C @ v)
        nrm = np.linalg.norm(v)
        if nrm == 0:
            v = np.zeros(P.shape[1])
            v[int(np.argmax(C.var(0)))] = 1.0
            break
        v /= nrm
    return v


def _build_tree(Z: np.ndarray, leaf_size: int, rng: np.random.Generator) -> Tuple[List[_Node], np.ndarray]:
    """Median splits along the principal direction; returns the nodes (root first) and the permutation."""
    n = Z.shape[0]
    perm = np.arange(n)
    nodes: List[_Node] = [_Node(0, n)]
    stack = [0]
    while stack:
        i = stack.pop()
        nd = nodes[i]
        if nd.size <= leaf_size:
            continue
        idx = perm[nd.start:nd.end]
        v = _principal_direction(Z[idx], rng)
        order = np.argsort(Z[idx] @ v, kind="stable")
        perm[nd.start:nd.end] = idx[order]
        mid = nd.start + nd.size // 2
        for lo, hi in ((nd.start, mid), (mid, nd.end)):
            nodes.append(_Node(lo, hi, parent=i, level=nd.level + 1))
        nd.left, nd.right = len(nodes) - 2, len(nodes) - 1
        stack.extend([nd.left, nd.right])
    return nodes, perm


def nearest_neighbors(Z: torch.Tensor, k: int, *, method: str = "auto", seed: int = 0,
                      n_trees: int = 4) -> torch.Tensor:
    """Indices (n, k) of the k nearest neighbours (Euclidean, self excluded) of each row of Z.

    ``method='exact'``: chunked distance computations, O(n^2 d) time and O(n k) memory.
    ``method='approximate'``: union of exact neighbours inside the leaves of ``n_trees`` random-projection
    trees (leaves of about ``max(4 k, 64)`` points), O(n_trees n leaf d). 'auto' is exact for n <= 20000.
    """
    n = Z.shape[0]
    k = min(k, n - 1)
    if k <= 0:
        return torch.zeros(n, 0, dtype=torch.long)
    if method == "auto":
        method = "exact" if n <= 20000 else "approximate"
    Zc = Z.to(dtype=torch.float64, device="cpu")
    if method == "exact":
        out = torch.empty(n, k, dtype=torch.long)
        chunk = max(1, (1 << 22) // max(n, 1))
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            D = torch.cdist(Zc[s:e], Zc)
            D[torch.arange(e - s), torch.arange(s, e)] = math.inf
            out[s:e] = D.topk(k, dim=1, largest=False).indices
        return out
    rng = np.random.default_rng(seed)
    Zn = Zc.numpy()
    best_d = np.full((n, k), np.inf)
    best_i = np.full((n, k), -1, dtype=np.int64)
    leaf = max(4 * k, 64)
    for _ in range(n_trees):
        perm = np.arange(n)
        stack = [(0, n)]
        leaves = []
        while stack:
            lo, hi = stack.pop()
            if hi - lo <= leaf:
                leaves.append((lo, hi))
                continue
            idx = perm[lo:hi]
            v = rng.standard_normal(Zn.shape[1])
            order = np.argsort(Zn[idx] @ v, kind="stable")
            perm[lo:hi] = idx[order]
            mid = (lo + hi) // 2
            stack.extend([(lo, mid), (mid, hi)])
        for lo, hi in leaves:
            idx = perm[lo:hi]
            P = Zn[idx]
            D = ((P[:, None, :] - P[None, :, :]) ** 2).sum(-1)
            np.fill_diagonal(D, np.inf)
            kk = min(k, len(idx) - 1)
            if kk <= 0:
                continue
            part = np.argpartition(D, kk - 1, axis=1)[:, :kk]
            cand_i = np.concatenate([best_i[idx], idx[part]], axis=1)
            cand_d = np.concatenate([best_d[idx], np.take_along_axis(D, part, 1)], axis=1)
            # drop duplicates, keep the k closest
            order = np.argsort(cand_i, axis=1, kind="stable")
            ci = np.take_along_axis(cand_i, order, 1)
            cd = np.take_along_axis(cand_d, order, 1)
            dup = np.zeros_like(ci, dtype=bool)
            dup[:, 1:] = ci[:, 1:] == ci[:, :-1]
            cd[dup | (ci < 0)] = np.inf
            sel = np.argsort(cd, axis=1, kind="stable")[:, :k]
            best_i[idx] = np.take_along_axis(ci, sel, 1)
            best_d[idx] = np.take_along_axis(cd, sel, 1)
    best_i[best_i < 0] = 0
    return torch.as_tensor(best_i)


def _interpolative(M: np.ndarray, max_rank: int, rel_tol: float) -> Tuple[np.ndarray, np.ndarray]:
    """Row interpolative decomposition ``M ~ U M[skel]`` by column-pivoted QR of ``M^T``.

    Returns the skeleton row indices (k,) and U (rows, k) with ``U[skel] = I``.
    """
    rows = M.shape[0]
    if M.shape[1] == 0 or not np.any(M):
        return np.array([0]), np.eye(rows, 1)
    with threadpool_limits(1):  # small matrices: threads only add contention
        _, R, piv = sla.qr(M.T, mode="economic", pivoting=True)
    diag = np.abs(np.diag(R))
    k = int(np.sum(diag > rel_tol * diag[0])) if diag[0] > 0 else 1
    k = max(1, min(k, max_rank, rows))
    U = np.zeros((rows, k))
    U[piv[:k]] = np.eye(k)
    if k < rows:
        with threadpool_limits(1):
            U[piv[k:]] = sla.solve_triangular(R[:k, :k], R[:k, k:], lower=False).T
    return piv[:k].copy(), U


# ---------------------------------------------------------------------------- the HSS matrix
class HSSMatrix:
    """HSS approximation of the symmetric kernel matrix ``K(X, X)`` (see the module docstring).

    Build with :meth:`from_kernel`. Vectors passed to :meth:`matvec` and to a factorisation's ``solve`` are
    in the original order of X.

    Attributes
    ----------
    n : int
    perm : Tensor (n,)
        Tree order: position p holds the original point ``perm[p]``.
    max_rank_used : int
        Largest skeleton size.
    """

    def __init__(self, nodes: List[_Node], perm: np.ndarray, dtype: torch.dtype, device: torch.device,
                 params: Dict[str, Any]):
        self.nodes = nodes
        self.n = int(perm.shape[0])
        self.perm = torch.as_tensor(perm, dtype=torch.long, device=device)
        self.inv_perm = torch.empty_like(self.perm)
        self.inv_perm[self.perm] = torch.arange(self.n, device=device)
        self.dtype = dtype
        self.device = device
        self.params = params
        self._postorder = self._order(post=True)
        self._preorder = self._order(post=False)
        ranks = [nd.U.shape[1] for nd in nodes if nd.U is not None]
        self.max_rank_used = max(ranks) if ranks else 0

    def _order(self, post: bool) -> List[int]:
        out: List[int] = []
        stack = [(0, False)]
        while stack:
            i, seen = stack.pop()
            nd = self.nodes[i]
            if nd.is_leaf or (seen and post):
                out.append(i)
                continue
            if post:
                stack.append((i, True))
                stack.extend([(nd.right, False), (nd.left, False)])
            else:
                out.append(i)
                stack.extend([(nd.right, False), (nd.left, False)])
        return out

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_kernel(cls, kernel: Kernel, X: Any, *, max_rank: int = 64, rel_tol: float = 1e-10,
                    leaf_size: Optional[int] = None, n_neighbors: Optional[int] = None,
                    n_random: Optional[int] = None, max_samples: Optional[int] = None,
                    neighbors: str = "auto", seed: int = 0, device: Union[str, torch.device] = "cpu",
                    dtype: torch.dtype = torch.float64) -> "HSSMatrix":
        """Compress ``K(X, X)`` to HSS form.

        Parameters
        ----------
        kernel : joker_ext Kernel (symmetric)
        X : array (n, d)
        max_rank : int, default 64
            Cap r on every skeleton size (the HSS rank).
        rel_tol : float, default 1e-10
            Relative truncation of the pivoted QR: keep ``|R_kk| > rel_tol |R_11|``.
        leaf_size : int, optional
            Largest leaf; default ``max(2 * max_rank, 32)`` (O(r), so that the dense leaf blocks are O(n r)).
        n_neighbors : int, optional
            Neighbours per point for the column sampling; default ``min(32, n - 1)``.
        n_random : int, optional
            Uniform far-field sample columns per node; default ``max_rank``.
        max_samples : int, optional
            Cap on the neighbour sample columns per node; default ``3 * max_rank``.
        neighbors : {'auto', 'exact', 'approximate'}
        seed : int
        device, dtype : where the compressed form lives.
        """
        kernel = check_kernel(kernel)
        device = check_device(device)
        dtype = check_dtype(dtype)
        Xt = as_matrix(X, "X", dtype=torch.float64, device=torch.device("cpu"))
        n = Xt.shape[0]
        max_rank = check_positive_int("max_rank", max_rank, low=1)
        rel_tol = check_number("rel_tol", rel_tol, low=0.0)
        leaf_size = max(2 * max_rank, 32) if leaf_size is None else check_positive_int("leaf_size", leaf_size, low=1)
        n_neighbors = min(32, n - 1) if n_neighbors is None else check_positive_int("n_neighbors", n_neighbors, low=0)
        n_random = max_rank if n_random is None else check_positive_int("n_random", n_random, low=0)
        max_samples = 3 * max_rank if max_samples is None else check_positive_int("max_samples", max_samples, low=1)
        check_choice("neighbors", neighbors, ("auto", "exact", "approximate"))
        seed = check_positive_int("seed", seed, low=0)
        rng = np.random.default_rng(seed)

        Zs = kernel.scale_inputs(Xt) if isinstance(kernel, StationaryKernel) else Xt
        nodes, perm = _build_tree(Zs.numpy(), leaf_size, rng)
        Xp = Xt[torch.as_tensor(perm)]
        NN = nearest_neighbors(Zs[torch.as_tensor(perm)], n_neighbors, method=neighbors, seed=seed).numpy()

        def kblock(a: np.ndarray, b: np.ndarray) -> torch.Tensor:
            return kernel(Xp[torch.as_tensor(a)], Xp[torch.as_tensor(b)])

        # bottom-up: children before parents (reverse creation order works: children are created later)
        for i in range(len(nodes) - 1, -1, -1):
            nd = nodes[i]
            if nd.is_leaf:
                rows = np.arange(nd.start, nd.end)
                nd.D = kernel(Xp[nd.start:nd.end], Xp[nd.start:nd.end]).to(device=device, dtype=dtype)
            else:
                L, R = nodes[nd.left], nodes[nd.right]
                rows = np.concatenate([L.skel, R.skel])
                nd.B = kblock(L.skel, R.skel).to(device=device, dtype=dtype)
            if i == 0:
                continue  # the root has no off-diagonal block
            near = np.unique(NN[rows].reshape(-1)) if NN.shape[1] > 0 else np.zeros(0, dtype=np.int64)
            near = near[(near < nd.start) | (near >= nd.end)]
            if near.shape[0] > max_samples:
                near = rng.choice(near, max_samples, replace=False)
            outside = n - nd.size
            n_far = min(n_random, outside)
            far = rng.choice(outside, n_far, replace=False) if n_far > 0 else np.zeros(0, dtype=np.int64)
            far = np.where(far < nd.start, far, far + nd.size)
            cols = np.unique(np.concatenate([near, far]).astype(np.int64))
            M = kblock(rows, cols).numpy() if cols.shape[0] > 0 else np.zeros((rows.shape[0], 0))
            sk, U = _interpolative(M, max_rank, rel_tol)
            nd.skel = rows[sk]
            nd.U = torch.as_tensor(U).to(device=device, dtype=dtype)
        params = dict(max_rank=max_rank, rel_tol=rel_tol, leaf_size=leaf_size, n_neighbors=n_neighbors,
                      n_random=n_random, max_samples=max_samples, neighbors=neighbors, seed=seed)
        return cls(nodes, perm, dtype, device, params)

    # ------------------------------------------------------------------ memory
    def memory_numbers(self) -> int:
        """Number of floating-point values stored (leaf blocks D, bases U, sibling blocks B)."""
        total = 0
        for nd in self.nodes:
            for T in (nd.D, nd.U, nd.B):
                if T is not None:
                    total += T.numel()
        return total

    def memory_report(self) -> Dict[str, int]:
        """Stored numbers by kind, plus the integer skeleton indices."""
        rep = {"D": 0, "U": 0, "B": 0, "skeleton_indices": 0}
        for nd in self.nodes:
            rep["D"] += 0 if nd.D is None else nd.D.numel()
            rep["U"] += 0 if nd.U is None else nd.U.numel()
            rep["B"] += 0 if nd.B is None else nd.B.numel()
            rep["skeleton_indices"] += 0 if nd.skel is None else int(nd.skel.shape[0])
        return rep

    # ------------------------------------------------------------------ products
    def _to_perm(self, v: Any, name: str) -> Tuple[torch.Tensor, bool, Any]:
        if isinstance(v, torch.Tensor):
            V = v.detach()
        elif isinstance(v, (np.ndarray, list, tuple)):
            V = torch.as_tensor(np.asarray(v, dtype=np.float64))
        else:
            raise TypeError(f"{name} must be a numpy array or torch tensor of shape (n,) or (n, t), got {_desc(v)}")
        if V.dim() not in (1, 2) or V.shape[0] != self.n:
            raise ValueError(f"{name} must have shape ({self.n},) or ({self.n}, t), got {tuple(V.shape)}")
        one_d = V.dim() == 1
        V = V.to(device=self.device, dtype=self.dtype)
        if one_d:
            V = V.unsqueeze(1)
        return V[self.perm], one_d, v

    def _from_perm(self, Yp: torch.Tensor, one_d: bool, like: Any):
        Y = Yp[self.inv_perm]
        if one_d:
            Y = Y[:, 0]
        return Y if isinstance(like, torch.Tensor) else Y.cpu().numpy()

    def _matvec_perm(self, V: torch.Tensor) -> torch.Tensor:
        nodes = self.nodes
        xh: Dict[int, torch.Tensor] = {}
        for i in self._postorder:
            if i == 0:
                continue
            nd = nodes[i]
            loc = V[nd.start:nd.end] if nd.is_leaf else torch.cat([xh[nd.left], xh[nd.right]])
            xh[i] = nd.U.T @ loc
        yh: Dict[int, torch.Tensor] = {}
        out = torch.empty_like(V)
        if nodes[0].is_leaf:
            return nodes[0].D @ V
        for i in self._preorder:
            nd = nodes[i]
            if nd.is_leaf:
                out[nd.start:nd.end] = nd.D @ V[nd.start:nd.end] + nd.U @ yh[i]
                continue
            a, b = nd.left, nd.right
            ya = nd.B @ xh[b]
            yb = nd.B.T @ xh[a]
            if i != 0:
                down = nd.U @ yh[i]
                ka = nodes[a].U.shape[1]
                ya = ya + down[:ka]
                yb = yb + down[ka:]
            yh[a], yh[b] = ya, yb
        return out

    def matvec(self, v: Any) -> Union[np.ndarray, torch.Tensor]:
        """``K_hss @ v`` for v of shape (n,) or (n, t) in the original order (numpy in, numpy out)."""
        V, one_d, like = self._to_perm(v, "v")
        return self._from_perm(self._matvec_perm(V), one_d, like)

    __matmul__ = matvec

    def to_dense(self) -> torch.Tensor:
        """The dense n x n matrix represented (original order); for checks on small n."""
        I = torch.eye(self.n, dtype=self.dtype, device=self.device)
        return self.matvec(I)

    def factorize(self, shift: float = 0.0, refine: int = 1) -> "HSSFactorization":
        """Factorise ``K_hss + shift I`` for fast solves (recursive Sherman-Morrison-Woodbury).

        ``refine`` steps of iterative refinement (one HSS matvec and one solve each) are applied by
        ``solve``; they recover full accuracy when the shift is small compared with the kernel's scale.
        """
        shift = check_number("shift", shift)
        return HSSFactorization(self, shift, refine)

    def solve(self, b: Any, shift: float = 0.0) -> Union[np.ndarray, torch.Tensor]:
        """``(K_hss + shift I)^{-1} b`` (factorises on every call: keep :meth:`factorize`'s result instead)."""
        return self.factorize(shift).solve(b)


class HSSFactorization:
    """Factorisation of ``K_hss + shift I`` (see the module docstring for the recursion).

    Per non-root node tau it stores the LU factors of its local diagonal block ``Dt_tau`` (``D_tau + shift I``
    for a leaf, ``[[Lambda_a, B_tau], [B_tau^T, Lambda_b]]`` above), ``W_tau = Dt_tau^{-1} U_tau`` and
    ``Lambda_tau = (U_tau^T W_tau)^{-1}``; the root keeps the LU factors of its dense reduced system.
    """

    def __init__(self, hss: HSSMatrix, shift: float, refine: int = 1):
        self.hss = hss
        self.shift = float(shift)
        self.refine = check_positive_int("refine", refine, low=0)
        nodes = hss.nodes
        self._lu: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        self._W: Dict[int, torch.Tensor] = {}
        self._Lam: Dict[int, torch.Tensor] = {}
        for i in hss._postorder:
            nd = nodes[i]
            if nd.is_leaf:
                Dt = nd.D + self.shift * torch.eye(nd.size, dtype=hss.dtype, device=hss.device)
            else:
                La, Lb = self._Lam[nd.left], self._Lam[nd.right]
                Dt = torch.cat([torch.cat([La, nd.B], 1), torch.cat([nd.B.T, Lb], 1)], 0)
            lu = torch.linalg.lu_factor(Dt)
            self._lu[i] = lu
            if i == 0:
                continue
            W = torch.linalg.lu_solve(*lu, nd.U)
            self._W[i] = W
            self._Lam[i] = torch.linalg.inv(nd.U.T @ W)

    def memory_numbers(self) -> int:
        """Floating-point values stored by the factorisation."""
        return sum(lu[0].numel() for lu in self._lu.values()) + sum(W.numel() for W in self._W.values()) + \
            sum(L.numel() for L in self._Lam.values())

    def _solve_perm(self, Bp: torch.Tensor) -> torch.Tensor:
        """Solve in tree order, with ``refine`` steps of iterative refinement on the HSS residual."""
        X = self._solve_once(Bp)
        for _ in range(self.refine):
            R = Bp - self.hss._matvec_perm(X) - self.shift * X
            X = X + self._solve_once(R)
        return X

    def _solve_once(self, Bp: torch.Tensor) -> torch.Tensor:
        hss, nodes = self.hss, self.hss.nodes
        t: Dict[int, torch.Tensor] = {}
        bh: Dict[int, torch.Tensor] = {}
        for i in hss._postorder:
            nd = nodes[i]
            rhs = Bp[nd.start:nd.end] if nd.is_leaf else torch.cat([bh[nd.left], bh[nd.right]])
            t[i] = torch.linalg.lu_solve(*self._lu[i], rhs)
            if i != 0:
                bh[i] = self._Lam[i] @ (nd.U.T @ t[i])
        out = torch.empty_like(Bp)
        s: Dict[int, torch.Tensor] = {}
        for i in hss._preorder:
            nd = nodes[i]
            x = t[i] if i == 0 else t[i] + self._W[i] @ (self._Lam[i] @ s[i] - bh[i])
            if nd.is_leaf:
                out[nd.start:nd.end] = x
            else:
                ka = nodes[nd.left].U.shape[1]
                s[nd.left], s[nd.right] = x[:ka], x[ka:]
        return out

    def solve(self, b: Any) -> Union[np.ndarray, torch.Tensor]:
        """``(K_hss + shift I)^{-1} b`` for b of shape (n,) or (n, t), original order."""
        Bp, one_d, like = self.hss._to_perm(b, "b")
        return self.hss._from_perm(self._solve_perm(Bp), one_d, like)
