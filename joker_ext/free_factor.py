"""A Cholesky factor of the free block of the active-set iterations, kept from one step to the next.

The active-set engines solve, at every step, ``H_FF x = v`` with ``H = K + diag(d)`` and ``F`` the step's free
set. Consecutive steps (of one proximal round, or of every round when ``d`` does not change: squared hinge,
Huber) differ in a few coordinates of ``F``, so the factor of the last step serves the next one (the
updates of the Schur-complement method of QP active-set solvers; Gill, Murray, Saunders and Wright, 1990):

* **Added coordinates** ``A = F \\ U`` (``U`` the coordinates the factor ``L L^T = H_UU`` holds) extend it
  by a block row: ``S = L^{-1} H_UA``, ``L_A L_A^T = H_AA - S^T S``, the new factor ``[[L, 0], [S^T, L_A]]``
  (``|U|^2 |A|`` for the triangular solve, ``|A|^3 / 3`` for ``L_A``).
* **Removed coordinates** ``R = U \\ F`` stay in the factor and are pinned to zero: ``x = H_UU^{-1} (v - E mu)``
  with ``E`` the columns of the identity at ``R`` and ``mu`` solving ``(E^T H_UU^{-1} E) mu = E^T H_UU^{-1} v``,
  so that ``x_R = 0`` and ``(H_UU x)_F = v_F``, i.e. ``H_FF x_F = v_F``. The columns ``W = H_UU^{-1} E`` are kept
  while the factor lives (a coordinate pinned at one step is mostly pinned at the next ones): a new pin costs
  ``2 |U|^2``, an extension borders the kept columns (:meth:`FreeFactor._pins`).

A step factors ``H_FF`` afresh (``|F|^3 / 3``) when ``d`` changed on ``U``, when the update would cost more than
about half of that (``UPDATE_RATIO (|A| + |new pins|) > |F|``), when the factor holds many more coordinates than
``F``, or when ``F`` is small (:data:`MIN_UPDATE_SIZE`: the update's bookkeeping then costs as much as the
factorisation). An updated solve is not refined here (:attr:`FreeFactor.updated` says the last solve was one):
the active-set rounds need full accuracy only at the step at which their sets settle, and refine that one from the
residual that their predictions ``K a`` give anyway, factoring afresh when the pinned system lost accuracy
(:meth:`joker_ext.active_set._Column._polish`; refining every updated solve here cost a fifth of a hard working-set
fit). :meth:`FreeFactor.residual_scale` gives the scale of a fresh factorisation's rounding for that test.
The exception is a factor made in float32 (free blocks of :data:`FLOAT32_FREE_MIN` coordinates or more): every
solve through it, fresh or updated, is finished in float64 by conjugate gradients (:meth:`FreeFactor._finished`).

The factor may serve another matrix holding the same entries at other indices (:meth:`FreeFactor.relabel`): the
working-set engine carries it from one subproblem's ``K_BB`` to the next.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch

from .dense import (MIXED_CONTRACTION, MIXED_PRECISION_MIN, RefinedCholesky, cholesky_ex, cholesky_preconditioner,
                    cholesky_solve, float32_flushed, flush_small_, pcg, prefault_, submatrix)

__all__ = ["FreeFactor"]

#: An update is used when ``UPDATE_RATIO * (|A| + |new pins|) <= |F|``: its triangular solves cost ``~ 2 |U|^2`` per
#: column, a fresh factorisation ``|F|^3 / 3``.
UPDATE_RATIO = 8
#: Largest ``|U| / |F|`` an update may leave (beyond: a fresh factor of ``F`` alone), plus :data:`SLACK`.
MAX_GROWTH = 1.25
SLACK = 32
#: Free sets smaller than this are always factored afresh (a factorisation of a hundred coordinates costs about as
#: much as the update's bookkeeping). Measured against 1024 (median of 3 alternating fits, n = 4000): the
#: epsilon-insensitive working set with its 400-750-coordinate subproblems 0.73x the time at C = 10; hinge,
#: Huber and squared hinge within 4%.
MIN_UPDATE_SIZE = 256
#: Extensions kept as separate block rows before the next step factors afresh.
MAX_BLOCKS = 16


#: Refinements of a solve through a float32 factor (it stops earlier when one does not shrink the residual), and the
#: backward error ``|v - H x| / (|v| + |H|_inf |x|)`` (max norms) below which it is taken (else the block is factored
#: in float64).
MIXED_REFINEMENTS = 6
MIXED_ACCEPTED = 1e-13

#: Free blocks of at least this many coordinates (of a float64 ``K``) are factored in float32 and every solve through
#: that factor (fresh or updated) is finished by conjugate gradients in float64 (:meth:`FreeFactor._float32_solve`).
FLOAT32_FREE_MIN = 4096
#: A float32 factor is also worth it only when ``|F|^3 >= FLOAT32_WORTH |K|^2``: each conjugate-gradient iteration
#: reads all of ``K`` (its product ``K_FF x``: 37 ms at ``|K|`` = 9,700 on two cores, memory-bound), a solve takes
#: about three and a factor serves one to three solves, while the float32 factorisation saves about 0.42 of the
#: float64 one's time (about ``|F|^3 / 3`` operations at 118 GFLOP/s: 1.1 s at ``|F|`` = 9,680).
FLOAT32_WORTH = 4096
#: Conjugate-gradient iterations, and the relative residual ``||V - H X|| / ||V||`` that a solve through a float32
#: factor must reach within them (else a fresh factor's block is factored in float64, and float32 factors are not
#: tried again; an updated solve is solved afresh).
FLOAT32_CG_ITERATIONS = 25
FLOAT32_CG_TOL = 1e-14


def _cholesky(H: torch.Tensor, overwrite: bool = False) -> Optional[torch.Tensor]:
    L, info = cholesky_ex(H, overwrite=overwrite)
    return L if int(info) == 0 else None


def _whole_residual(K: torch.Tensor, d: torch.Tensor):
    """``(R, X) -> R - (K + diag(d)) X`` (float64, without forming ``K + diag(d)``)."""
    return lambda R, X: R - K @ X - d.unsqueeze(1) * X


def _gathered(K: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``K[rows][:, cols]`` in ``dtype``: gathered straight into fresh memory of that dtype where it is not ``K``'s (no
    copy in ``K``'s dtype first)."""
    if dtype == K.dtype:
        return submatrix(K, rows, cols)
    return submatrix(K, rows, cols, out=prefault_(torch.empty(rows.numel(), cols.numel(), dtype=dtype,
                                                              device=K.device)))


def _lower(L: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch.linalg.solve_triangular(L, B, upper=False)


def _upper(L: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch.linalg.solve_triangular(L.mT, B, upper=True)


class FreeFactor:
    """``(K_FF + diag(d_F))^{-1} V`` for successive free sets ``F`` of one matrix ``K`` (see the module docstring).

    The factor of ``H_UU`` is kept in blocks: the fresh factor ``L_0`` and, per extension ``j``, the block row
    ``[S_j^T, L_j]`` (never copied into one matrix: a copy of ``|U|^2`` numbers costs as much as the update).

    Parameters
    ----------
    fallback : callable
        ``H -> L``, a Cholesky factorisation for a matrix that is not numerically positive definite (e.g.
        one that shifts the diagonal); a factor it returns is used once and not kept.
    mixed : bool
        Solve large, well-conditioned fresh systems over all of ``K`` through a float32 factor refined in float64
        (:meth:`_mixed_solve`), which is not kept for updates: for problems solved by one step (a dual without a box
        or a kink, the squared loss), where no update follows. Huber and the squared hinge, whose later steps
        update the factor, took 1.1-1.3x their time at n = 4000 when every step factored afresh in float32. The
        factor serves the same system's next solves (another target column's right-hand side, the same ``d``)
        without factoring again.
    float32 : bool
        Factor large free blocks of a float64 ``K`` in float32, each solve finished in float64
        (:meth:`_float32_solve`); False where an earlier factor of the same problem found its blocks too
        ill-conditioned for float32 (:attr:`float32_failed`).
    """

    def __init__(self, fallback: Callable[[torch.Tensor], torch.Tensor], mixed: bool = False, float32: bool = True):
        self.fallback = fallback
        self.mixed = mixed
        self.L0: Optional[torch.Tensor] = None
        self.rows: List[Tuple[torch.Tensor, torch.Tensor]] = []  # (S_j^T, L_j) per extension
        self.U: Optional[torch.Tensor] = None
        self.d_U: Optional[torch.Tensor] = None  # the diagonal shift the factor holds, at the positions of U
        self.fresh = 0  # factorisations of a whole free block
        self.updates = 0  # solves through an updated factor
        self.updated = False  # whether the last solve went through an updated factor (unrefined)
        self._row_norms: Optional[torch.Tensor] = None  # |K_i:|_1, for the residual test
        self._norms_of: Optional[torch.Tensor] = None  # the matrix K whose row norms those are
        self._pin_W: Optional[torch.Tensor] = None  # H_UU^{-1} E for the factor positions _pin_pos (u x k)
        self._pin_pos: Optional[torch.Tensor] = None
        # (L, d): the float32 factor of K + diag(d) over all of K from the last mixed solve, for the same system's
        # next right-hand sides (the other target columns of a squared loss)
        self._whole32: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        self.float32_failed = not float32  # a solve through a float32 factor did not converge: float64 from then on
        self.finished_by_cg = 0  # solves through a float32 factor (fresh or updated), finished in float64

    def solve(self, K: torch.Tensor, free: torch.Tensor, d: torch.Tensor, V: torch.Tensor, *,
              fresh: bool = False) -> torch.Tensor:
        """``(K_FF + diag(d_F))^{-1} V`` for the sorted, unique indices ``free`` (a fresh factorisation gathers
        ``H_FF`` from ``K``: :func:`~joker_ext.dense.submatrix`). An updated solve is returned unrefined
        (:attr:`updated` then says so), except through a float32 factor, whose solves are all finished in float64;
        ``fresh`` factors ``H_FF`` afresh whatever the factor holds."""
        if not fresh and self._whole32 is not None and free.numel() == K.shape[0] \
                and torch.equal(d, self._whole32[1]):  # the system it factored last: refined through that factor
            X = self._refined(self._whole32[0], _whole_residual(K, d), V, self.residual_scale(K, free, d))
            if X is not None:
                self.updated = False
                return X
        if (not fresh and self.L0 is not None and free.numel() >= MIN_UPDATE_SIZE
                and torch.equal(d[self.U], self.d_U)):
            X = self._updated_solve(K, free, d, V)
            if X is not None:
                self.updated = self.L0.dtype == V.dtype  # (a float32 factor's solves are finished in float64)
                self.updates += 1
                return X
        self.updated = False
        return self._fresh_solve(K, free, d, V)

    def residual_scale(self, K: torch.Tensor, free: torch.Tensor, d: torch.Tensor) -> float:
        """``max_i (|K_i:|_1 + |d_i|)`` over ``i`` in ``free``: bounds ``|H_FF|_inf``, the scale of a fresh
        factorisation's residual ``|v - H_FF x| ~ eps |H_FF|_inf |x|``."""
        if self._row_norms is None or self._norms_of is not K:  # (a factor may serve several matrices in turn)
            self._row_norms, self._norms_of = torch.linalg.vector_norm(K, ord=1, dim=1), K
        return float(self._row_norms[free].max() + d[free].abs().max())

    def _fresh_solve(self, K, free, d, V):
        self.L0, self.rows = None, []  # the old factor goes before the new block is formed (peak: K, H = L)
        self._pin_W = self._pin_pos = self._whole32 = None
        whole = free.numel() == K.shape[0]
        X = self._mixed_solve(K, free, d, V) if self.mixed and whole else None
        if X is not None:  # the float32 factor is not kept for updates: updated solves through it would need refining
            self.L0 = self.U = self.d_U = None
            self.fresh += 1
            return X
        X = self._float32_solve(K, free, d, V) if self._float32_worth(K, free) else None
        if X is not None:
            self.fresh += 1
            return X
        # factored in its own memory (one fresh matrix of |F|^2 numbers, not two); rebuilt for the fallback
        L = _cholesky(self._shifted_block(K, free, d), overwrite=True)
        self.rows = []
        if L is None:
            self.L0 = self.U = self.d_U = None
            L = self.fallback(self._shifted_block(K, free, d))
        else:
            self.L0, self.U, self.d_U = L, free.clone(), d[free].clone()
        self.fresh += 1
        return cholesky_solve(V, L)

    @staticmethod
    def _shifted_block(K, free, d) -> torch.Tensor:
        """``H_FF = K_FF + diag(d_F)``, a fresh matrix."""
        H = K.clone() if free.numel() == K.shape[0] else submatrix(K, free)
        H.diagonal().add_(d[free])
        return H

    def _float32_worth(self, K, free) -> bool:
        """Whether a fresh factor of ``H_FF`` is made in float32 (:meth:`_float32_solve`)."""
        m = free.numel()
        return (K.dtype == torch.float64 and not self.float32_failed and m >= FLOAT32_FREE_MIN
                and m ** 3 >= FLOAT32_WORTH * K.shape[0] ** 2)

    def _float32_solve(self, K, free, d, V) -> Optional[torch.Tensor]:
        """``H_FF^{-1} V`` through a fresh float32 factor of ``H_FF``, finished by conjugate gradients in float64
        (:meth:`_finished`); the factor is kept for the next steps' updates, whose solves are finished alike. About
        half the time of a float64 factorisation (hinge, a 9,680-coordinate free block on two cores: 1.3 s against
        2.6 s) plus a few products; None (and :attr:`float32_failed`) when the float32 factorisation fails or the
        conjugate gradients do not converge, the block being then too ill-conditioned for float32."""
        H32 = _gathered(K, free, free, torch.float32)
        H32.diagonal().add_(d[free].to(torch.float32))
        L32, info = cholesky_ex(flush_small_(H32), overwrite=True)
        del H32
        X = self._finished(K, free, d, V, cholesky_preconditioner(L32)) if int(info) == 0 else None
        if X is None:
            self.float32_failed = True
            return None
        self.L0, self.U, self.d_U = L32, free.clone(), d[free].clone()
        return X

    def _finished(self, K, free, d, V, precondition) -> Optional[torch.Tensor]:
        """``H_FF^{-1} V`` in float64 by conjugate gradients (:func:`~joker_ext.dense.pcg`) preconditioned by a solve
        through a float32 factor of ``H_FF`` (or of a nearby block); the products ``K_FF X`` read all of ``K``
        (``(X_full^T K)^T`` with ``X_full`` zero outside ``F``: one pass over ``K`` in its memory order, 4x faster
        than reading the rows of ``F`` for each column). None when the run does not reach :data:`FLOAT32_CG_TOL`
        within :data:`FLOAT32_CG_ITERATIONS`."""
        d_F = d[free].unsqueeze(1)

        def product(X):
            full = X.new_zeros(K.shape[0], X.shape[1]).index_copy_(0, free, X)
            return (full.mT @ K).mT.index_select(0, free) + d_F * X

        X, residual = pcg(precondition, product, V, tol=FLOAT32_CG_TOL, max_iter=FLOAT32_CG_ITERATIONS)
        if not residual <= FLOAT32_CG_TOL:
            return None
        self.finished_by_cg += 1
        return X

    def _mixed_solve(self, K, free, d, V) -> Optional[torch.Tensor]:
        """``(K + diag(d))^{-1} V`` over all of ``K`` (``free`` holds every index) through a float32 factor refined in
        float64 (:class:`~joker_ext.dense.RefinedCholesky`: half the time of a float64 factorisation; the float32
        matrix is formed from ``K`` directly, so the float64 ``H`` is never made), for systems of at least
        :data:`~joker_ext.dense.MIXED_PRECISION_MIN` rows whose condition number is bounded well enough:
        ``|H|_inf / min(d)`` (``K`` is positive semidefinite, so ``lambda_min(H) >= min(d)``) times float32's epsilon
        at most :data:`~joker_ext.dense.MIXED_CONTRACTION`. None otherwise, or when the refinements leave a backward
        error above :data:`MIXED_ACCEPTED`. The factor is kept for the same system's next solves."""
        if K.dtype != torch.float64 or K.shape[0] < MIXED_PRECISION_MIN:
            return None
        smallest, norm_H = float(d.min()), self.residual_scale(K, free, d)
        if not smallest > 0 or norm_H / smallest * torch.finfo(torch.float32).eps > MIXED_CONTRACTION:
            return None
        H32 = float32_flushed(K)
        H32.diagonal().add_(d.to(torch.float32))
        L32, info = cholesky_ex(H32)
        del H32
        if int(info) != 0:
            return None
        X = self._refined(L32, _whole_residual(K, d), V, norm_H)
        if X is not None:
            self._whole32 = (L32, d.clone())
        return X

    @staticmethod
    def _refined(L32: torch.Tensor, residual, V: torch.Tensor, norm_H: float) -> Optional[torch.Tensor]:
        """``H^{-1} V`` through the float32 factor ``L32`` of ``H``, refined in float64 while a refinement shrinks the
        residual (``residual(R, X) = R - H X``); None unless it ends at a float64 factorisation's backward error,
        ``|V - H X| <= MIXED_ACCEPTED (|V| + |H|_inf |X|)`` (max norms; ``norm_H`` bounds ``|H|_inf``)."""
        solver = RefinedCholesky(L32, residual, MIXED_REFINEMENTS, 0.0)
        X = solver.solve(V)
        scale = float(V.abs().max())
        return X if solver.residual * scale <= MIXED_ACCEPTED * (scale + norm_H * float(X.abs().max())) else None

    def held(self) -> Optional[torch.Tensor]:
        """The indices ``U`` whose block ``H_UU`` the factor holds (None without a factor)."""
        return None if self.L0 is None else self.U

    def relabel(self, U: torch.Tensor) -> None:
        """Carry the factor over to another matrix that holds the same entries ``H_UU`` at the indices ``U``
        (same order as :meth:`held`): a working set's next subproblem, whose block ``K_BB`` numbers the points
        anew."""
        if self.L0 is None or U.numel() != self.U.numel():
            raise ValueError(f"relabel: expected {0 if self.U is None else self.U.numel()} indices, got {U.numel()}")
        self.U, self._row_norms, self._norms_of = U, None, None

    # ------------------------------------------------------------------ the blocked factor
    def _forward(self, V: torch.Tensor) -> torch.Tensor:
        """``L^{-1} V`` for the first ``V.shape[0]`` coordinates of ``U`` (a whole number of blocks)."""
        u0 = self.L0.shape[0]
        Y = V.clone()
        Y[:u0] = _lower(self.L0, V[:u0])
        start = u0
        for St, Lj in self.rows:
            if start >= V.shape[0]:
                break
            stop = start + Lj.shape[0]
            Y[start:stop] = _lower(Lj, V[start:stop] - St @ Y[:start])
            start = stop
        return Y

    def _backward(self, Y: torch.Tensor) -> torch.Tensor:
        """``L^{-T} Y``."""
        X = Y.clone()
        stop = X.shape[0]
        for St, Lj in reversed(self.rows):
            start = stop - Lj.shape[0]
            X[start:stop] = _upper(Lj, X[start:stop])
            X[:start] -= St.mT @ X[start:stop]
            stop = start
        X[:stop] = _upper(self.L0, X[:stop])
        return X

    # ------------------------------------------------------------------ updates
    def _updated_solve(self, K, free, d, V):
        n, m = d.numel(), free.numel()
        pos = torch.full((n,), -1, dtype=torch.long, device=d.device)
        pos[self.U] = torch.arange(self.U.numel(), device=d.device)
        added = free[pos[free] < 0]
        # the factor's positions outside F (pinned); an extension appends positions, all of them in F
        held = torch.zeros(self.U.numel(), dtype=torch.bool, device=d.device)
        held[pos[free][pos[free] >= 0]] = True
        removed = torch.nonzero(~held).reshape(-1)
        new_pins = removed.numel() - int(self._pinned_columns(removed).ge(0).sum())
        if (UPDATE_RATIO * (added.numel() + new_pins) > m or len(self.rows) >= MAX_BLOCKS
                or self.U.numel() + added.numel() > MAX_GROWTH * m + SLACK):
            return None
        if added.numel():
            if not self._extend(K, added, d):
                return None
            pos[added] = torch.arange(self.U.numel() - added.numel(), self.U.numel(), device=d.device)
        p = pos[free]
        pins = self._pins(removed)
        if pins is None:
            return None
        if self.L0.dtype == V.dtype:
            return self._pinned_apply(pins, removed, p, V)
        # a float32 factor: its pinned solve preconditions float64 conjugate gradients
        return self._finished(K, free, d, V, lambda R: self._pinned_apply(pins, removed, p, R))

    def _block(self, K, rows, cols=None) -> torch.Tensor:
        """``K[rows][:, cols]`` (``cols = rows`` by default) in the factor's dtype."""
        return _gathered(K, rows, rows if cols is None else cols, self.L0.dtype)

    def _extend(self, K, added, d) -> bool:
        """Add the block row of ``added`` (False when its Schur complement is not numerically positive
        definite: the caller then factors afresh)."""
        S = self._forward(self._block(K, self.U, added))
        C = self._block(K, added) - S.mT @ S
        C.diagonal().add_(d[added].to(C.dtype))
        L_A = _cholesky(C)
        if L_A is None:
            return False
        if self._pin_W is not None:  # the cached columns of the inverse, bordered (see _pinned_columns)
            Y = self._backward(S)  # H_UU^{-1} H_UA
            X_A = -cholesky_solve(Y.index_select(0, self._pin_pos).mT, L_A)
            self._pin_W = torch.cat([self._pin_W - Y @ X_A, X_A])
        self.rows.append((S.mT.contiguous(), L_A))
        self.U = torch.cat([self.U, added])
        self.d_U = torch.cat([self.d_U, d[added]])
        return True

    def _pinned_columns(self, removed: torch.Tensor) -> torch.Tensor:
        """For the factor positions ``removed``, the column of the cached ``W = H_UU^{-1} E`` holding each (-1 where
        none does)."""
        where = torch.full((self.U.numel(),), -1, dtype=torch.long, device=removed.device)
        if self._pin_W is not None:
            where[self._pin_pos] = torch.arange(self._pin_pos.numel(), device=removed.device)
        return where[removed]

    def _pins(self, removed: torch.Tensor):
        """``(W, S)`` for :meth:`_pinned_apply`, which solves through the factor of ``H_UU`` with the coordinates at
        the factor positions ``removed`` pinned to zero: ``W = H_UU^{-1} E`` for those positions and the Cholesky
        factor ``S`` of ``E^T W`` (``(None, None)`` without pins; None when ``E^T W``, and so the pinned system, is
        not numerically positive definite).

        The columns ``H_UU^{-1} e_j`` of the pinned positions are kept from one solve to the next (a coordinate
        pinned at one step is pinned at the next ones too, while the factor lives): a new pin costs two triangular
        solves (``2 |U|^2``), an extension by ``A`` coordinates borders the kept columns,
        ``H_new^{-1} [e_j; 0] = [w_j - Y x_j; x_j]`` with ``Y = H_UU^{-1} H_UA`` and ``x_j = -(H_AA - H_AU Y)^{-1}
        Y^T e_j``. Recomputing them at every step cost as much as a fresh factorisation once ~90 coordinates were
        pinned (hinge, |U| = 1240: 12-16 ms against 19 ms)."""
        if not removed.numel():
            return None, None
        u = self.U.numel()
        cols = self._pinned_columns(removed)
        missing = removed[cols < 0]
        if missing.numel():
            E = torch.zeros(u, missing.numel(), dtype=self.L0.dtype, device=self.L0.device)
            E[missing, torch.arange(missing.numel(), device=E.device)] = 1.0
            fresh = self._backward(self._forward(E))
            # one column per position of U at most (positions are distinct): no more than the factor's size
            if self._pin_W is None:
                self._pin_W, self._pin_pos = fresh, missing
            else:
                self._pin_W = torch.cat([self._pin_W, fresh], dim=1)
                self._pin_pos = torch.cat([self._pin_pos, missing])
            cols = self._pinned_columns(removed)
        W = self._pin_W.index_select(1, cols)
        S = _cholesky(W.index_select(0, removed))
        return None if S is None else (W, S)

    def _pinned_apply(self, pins, removed: torch.Tensor, p: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
        """``x = H_UU^{-1} (v - E mu)`` at the positions ``p`` (see the module docstring), solved in the factor's
        dtype and returned in ``V``'s."""
        W, S = pins
        Y = torch.zeros(self.U.numel(), V.shape[1], dtype=self.L0.dtype, device=V.device)
        Y[p] = V.to(Y.dtype)
        Y = self._backward(self._forward(Y))
        if W is not None:
            Y = Y - W @ cholesky_solve(Y.index_select(0, removed), S)
        return Y[p].to(V.dtype)
