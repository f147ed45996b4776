"""Newton-PCG on the primal feature weights, for random (or Nystrom) features at large n.

Problem, per target column, with ``Phi`` the n x M feature matrix (never formed: rows are computed chunk
by chunk on every pass) and the loss smoothed by ``s`` (:mod:`joker_ext.smoothing`; ``s = 0`` for
squared, Huber, squared hinge and logistic losses)::

    P_s(beta) = 1/2 ||beta||^2 + sum_i c_i l_s(y_i, phi(x_i)^T beta)
    grad      = beta - Phi^T a*,          Hess = I + Phi^T W Phi

with ``a* = a(f)``, ``W = diag(w)`` from :meth:`joker_ext.losses.Loss.smoothed_dual` at ``f = Phi beta``.

One Newton iteration:

1. one pass: ``f = Phi beta``, ``a*``, ``w``, ``Phi^T a*`` (the gradient) and the duality gap of the
   *original* problem at the pair ``(beta, a*)``: ``P(beta) + D(a*)``, with
   ``D(a) = 1/2 ||Phi^T a||^2 + sum_i g_i(a_i)`` (``a*`` is dual feasible, so this is a certificate);
2. the direction ``d`` by preconditioned conjugate gradients on ``(I + Phi^T W Phi) d = -grad``, stopped at
   a relative residual ``eta = clip(sqrt(rel_gap), newton_cg_tol, 0.1)`` (inexact Newton) or after
   ``max_cg`` products; each product is one pass, which also accumulates ``Phi d`` for free;
3. an Armijo search on ``P_s(beta + t d)``: with ``Phi d`` known, every trial is O(n), no pass.

Preconditioner: a randomized Nystrom approximation ``U diag(lam) U^T`` of rank ``r`` of ``Phi^T W Phi``
(Frangella, Tropp and Udell, 2023), sketched on ``n_s`` sampled rows (scaled by ``n / n_s``), applied as
``P^{-1} v = U diag((lam_r + 1) / (lam + 1)) U^T v + (v - U U^T v)``. It is recomputed when ``W`` changes.

Cost per pass ``O(n M d)`` (the features) plus ``4 n M`` (two products); the sketch ``O(n_s M (d + r))``
plus ``O(M r^2)``. Memory: ``M r`` for ``U``, ``chunk_rows x M`` for a feature chunk, a few n-vectors;
never ``M x M`` (Falkon's preconditioner) unless ``r = M``.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .engines import Monitor, register_solver, sigint_as_flag
from .losses import Loss
from .memory import is_out_of_memory
from .smoothing import Continuation, needs_smoothing
from .solver import SolverOptions, SolverResult

__all__ = ["feature_newton", "NystromPreconditioner", "default_rank", "default_sketch_rows"]

ARMIJO = 1e-4
MAX_HALVINGS = 40


def default_rank(n_features: int) -> int:
    """Rank of the Nystrom preconditioner: ``min(M, 512)``."""
    return min(n_features, 512)


def default_sketch_rows(n: int, rank: int) -> int:
    """Rows the preconditioner is sketched on: ``min(n, max(8 r, 8192))``."""
    return min(n, max(8 * rank, 8192))


class NystromPreconditioner:
    """``P ~ I + Phi^T W Phi`` from a randomized Nystrom sketch of rank ``r`` (see the module docstring)."""

    def __init__(self, U: torch.Tensor, lam: torch.Tensor):
        self.U, self.lam = U, lam
        self.ratio = (lam[-1] + 1.0) / (lam + 1.0) if lam.numel() else lam

    @classmethod
    def sketch(cls, feature_rows, w: torch.Tensor, n_features: int, rank: int, scale: float,
               generator: torch.Generator) -> "NystromPreconditioner":
        """``feature_rows()`` yields ``(rows, Phi_rows)`` over the sample; ``w`` the sample's curvatures."""
        dtype, device = w.dtype, w.device
        omega = torch.randn(n_features, rank, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)
        omega = torch.linalg.qr(omega).Q
        Ysk = torch.zeros(n_features, rank, dtype=dtype, device=device)
        for rows, Phi in feature_rows():
            Ysk.addmm_(Phi.T, w[rows].unsqueeze(1) * (Phi @ omega))
        Ysk.mul_(scale)
        nu = math.sqrt(n_features) * torch.finfo(dtype).eps * float(Ysk.norm().clamp_min(torch.finfo(dtype).tiny))
        Ysk.add_(omega, alpha=nu)
        core = omega.T @ Ysk
        L, info = torch.linalg.cholesky_ex(0.5 * (core + core.T))
        if int(info) != 0:  # numerically rank-deficient sketch: fall back to the identity preconditioner
            return cls(torch.zeros(n_features, 0, dtype=dtype, device=device), torch.zeros(0, dtype=dtype, device=device))
        B = torch.linalg.solve_triangular(L, Ysk.T, upper=False).T
        U, S, _ = torch.linalg.svd(B, full_matrices=False)
        lam = (S * S - nu).clamp_min(0)
        return cls(U, lam)

    def apply(self, R: torch.Tensor) -> torch.Tensor:
        """``P^{-1} R`` for one column ``R`` (M,)."""
        if not self.lam.numel():
            return R
        UR = self.U.T @ R
        return R + self.U @ ((self.ratio - 1.0) * UR)


class _Passes:
    """Passes over the data through the feature map, chunk by chunk."""

    def __init__(self, operator, Y, loss: Loss, c_col):
        self.fmap, self.data, self.rows = operator.feature_map, operator.data, operator.chunk_rows
        self.Y, self.loss, self.c = Y, loss, c_col
        self.passes = 0

    def gradient(self, beta: torch.Tensor, smoothing: float) -> dict:
        """``f = Phi beta``, ``a* = a(f)``, ``w``, ``Phi^T a*`` and the pieces of the duality gap."""
        n, T = self.Y.shape
        F = torch.empty(n, T, dtype=beta.dtype, device=beta.device)
        A, W = torch.empty_like(F), torch.empty_like(F)
        PhiTA = torch.zeros_like(beta)
        for start, stop, Xc in self.data.chunks(self.rows):
            Phi = self.fmap(Xc)
            F[start:stop] = Phi @ beta
            A[start:stop], W[start:stop] = self.loss.smoothed_dual(F[start:stop], self.Y[start:stop],
                                                                   self.c[start:stop], smoothing)
            PhiTA.addmm_(Phi.T, A[start:stop])
        self.passes += 1
        loss_terms = (self.c * self.loss.value(self.Y, F)).sum(0)
        conj_terms = self.loss.conj(A, self.Y, self.c).sum(0)
        primal = 0.5 * (beta * beta).sum(0) + loss_terms
        dual = 0.5 * (PhiTA * PhiTA).sum(0) + conj_terms
        return {"F": F, "A": A, "W": W, "grad": beta - PhiTA, "primal": primal, "dual": dual,
                "share": self.loss.fenchel_young(self.Y, F, A, self.c).sum(0)}

    def hessian_product(self, V: torch.Tensor, W: torch.Tensor):
        """``(I + Phi^T W Phi) V`` and ``Phi V``."""
        out = V.clone()
        PhiV = torch.empty(self.data.n, V.shape[1], dtype=V.dtype, device=V.device)
        for start, stop, Xc in self.data.chunks(self.rows):
            Phi = self.fmap(Xc)
            U = Phi @ V
            PhiV[start:stop] = U
            out.addmm_(Phi.T, W[start:stop] * U)
        self.passes += 1
        return out, PhiV

    def sample_features(self, sample: torch.Tensor):
        """Yields ``(positions in sample, Phi of those rows)`` over the sampled rows."""
        def gen():
            for s0 in range(0, sample.numel(), self.rows):
                pos = torch.arange(s0, min(s0 + self.rows, sample.numel()), device=sample.device)
                yield pos, self.fmap(self.data.take(sample[pos]))
        return gen


def _pcg(passes: _Passes, grad, W, precond, eta: float, max_cg: int):
    """Solve ``(I + Phi^T W Phi) D = -grad`` column by column in lockstep; returns ``(D, Phi D)``."""
    T = grad.shape[1]
    D = torch.zeros_like(grad)
    Z = torch.zeros(passes.data.n, T, dtype=grad.dtype, device=grad.device)
    R = -grad
    Zr = torch.stack([precond[t].apply(R[:, t]) for t in range(T)], dim=1)
    P = Zr.clone()
    rz = (R * Zr).sum(0)
    target = eta * grad.norm(dim=0)
    active = grad.norm(dim=0) > 0
    for _ in range(max(1, max_cg)):
        if not bool(active.any()):
            break
        HP, PhiP = passes.hessian_product(P, W)
        pHp = (P * HP).sum(0)
        step = torch.where(active & (pHp > 0), rz / torch.where(pHp > 0, pHp, torch.ones_like(pHp)),
                           torch.zeros_like(pHp))
        D += step * P
        Z += step * PhiP
        R -= step * HP
        active = active & (R.norm(dim=0) > target)
        Zr = torch.stack([precond[t].apply(R[:, t]) for t in range(T)], dim=1)
        rz_new = (R * Zr).sum(0)
        P = Zr + torch.where(rz > 0, rz_new / torch.where(rz > 0, rz, torch.ones_like(rz)), torch.zeros_like(rz)) * P
        rz = rz_new
    return D, Z


def _line_search(loss: Loss, Y, c_col, beta, D, F, Z, grad, smoothing: float) -> Optional[float]:
    """Armijo step length on ``P_s(beta + t D)`` (every trial O(n): ``Phi (beta + t D) = F + t Z``)."""
    slope = float((grad * D).sum())
    if not slope < 0:
        return None
    bb, bd, dd = float((beta * beta).sum()), float((beta * D).sum()), float((D * D).sum())

    def value(t):
        f = F + t * Z
        a, _ = loss.smoothed_dual(f, Y, c_col, smoothing)
        return 0.5 * (bb + 2 * t * bd + t * t * dd) + float(loss.smoothed_value(f, Y, c_col, a, smoothing).sum())

    p0, t = value(0.0), 1.0
    for _ in range(MAX_HALVINGS):
        pt = value(t)
        if math.isfinite(pt) and pt - p0 <= ARMIJO * t * slope:
            return t
        t *= 0.5
    return None


def feature_newton(operator, Y: torch.Tensor, loss: Loss, c: torch.Tensor, options: Optional[SolverOptions] = None,
                   *, alpha0: Optional[torch.Tensor] = None, state0=None, start_iter: int = 0, callback=None,
                   validation=None, snapshot=None, snapshot_every=None, **_resume) -> SolverResult:
    """Minimise the (smoothed) primal over the feature weights by Newton-PCG (see the module docstring).

    Parameters
    ----------
    operator : FeatureOperator
    Y : Tensor (n, T)
    loss : Loss
    c : Tensor (n,)
        ``c_i = C w_i > 0``.
    options : SolverOptions
        ``max_iter`` Newton iterations, ``max_cg`` products per Newton step, ``tol`` on the relative
        duality gap, ``max_time``, ``newton_rank`` / ``newton_sketch_rows`` (preconditioner),
        ``newton_cg_tol`` (the tightest inner tolerance), ``seed``.
    alpha0 : Tensor (n, T), optional
        Warm start as dual coefficients (``beta = Phi^T alpha0``, one pass); ``state0['beta']`` when given
        takes precedence (a checkpoint).
    callback, validation, snapshot, snapshot_every :
        As in :func:`joker_ext.solver.dbcd_tr`, once per Newton iteration.
    """
    if operator.mode != "features":
        raise ValueError(f"feature_newton needs a feature operator, got mode {operator.mode!r}")
    opts = options or SolverOptions()
    n, T = Y.shape
    dtype, device = Y.dtype, Y.device
    c_col = c.reshape(n, 1).to(dtype=dtype, device=device).expand(n, T)
    loss.check_targets(Y)
    M = operator.feature_map.n_features
    if state0 is not None and "beta" in state0:
        beta = state0["beta"].to(dtype=dtype, device=device).clone()
    elif alpha0 is not None:
        beta = operator.init_state(alpha0.to(dtype=dtype, device=device).reshape(n, T))["beta"]
    else:
        beta = torch.zeros(M, T, dtype=dtype, device=device)
    passes = _Passes(operator, Y, loss, c_col)
    s0 = float(c_col.mean()) if needs_smoothing(loss, Y, c_col) else 0.0
    smoothing = Continuation(s0)
    rank = min(M, opts.newton_rank or default_rank(M))
    gen = torch.Generator().manual_seed(int(opts.seed))
    n_s = min(n, opts.newton_sketch_rows or default_sketch_rows(n, rank))
    sample = torch.sort(torch.randperm(n, generator=gen)[:n_s]).values.to(device)
    mon = Monitor(opts, callback=callback, validation=validation, snapshot=snapshot, snapshot_every=snapshot_every,
                  dtype=dtype)
    status, it, rec, alpha = "max_iter", start_iter, None, torch.zeros(n, T, dtype=dtype, device=device)
    state = {"beta": beta}
    precond, precond_w = None, None
    with sigint_as_flag(opts.handle_sigint) as sig:
        try:
            while True:
                g = passes.gradient(beta, smoothing.value)
                alpha, state = g["A"], {"beta": beta}
                gap = g["primal"] + g["dual"]
                rel = gap / torch.maximum(g["primal"].abs(), g["dual"].abs()).clamp_min(torch.finfo(dtype).tiny)
                rec = mon.record(it, float(g["primal"].sum()), float(g["dual"].sum()), float(gap.sum()), state, alpha,
                                 smoothing=smoothing.value, passes=passes.passes)
                if smoothing.active:
                    solve_error = 0.5 * float((g["grad"] * g["grad"]).sum())
                    if smoothing.update(solve_error, float(g["share"].sum())):
                        continue  # re-evaluate at the smaller smoothing before stepping
                reason = mon.stop_reason(rec, state, alpha, sig.flag)
                if reason is not None or it >= opts.max_iter:
                    status = reason or "max_iter"
                    break
                w_sample = g["W"][sample]
                if precond is None or not torch.equal(w_sample, precond_w):
                    precond = [NystromPreconditioner.sketch(passes.sample_features(sample), w_sample[:, t], M, rank,
                                                            n / n_s, gen) for t in range(T)]
                    precond_w = w_sample
                eta = min(0.1, max(opts.newton_cg_tol, math.sqrt(max(float(rel.max()), 0.0))))
                D, Z = _pcg(passes, g["grad"], g["W"], precond, eta, opts.max_cg)
                t = _line_search(loss, Y, c_col, beta, D, g["F"], Z, g["grad"], smoothing.value)
                it += 1
                if t is None:
                    if smoothing.active and smoothing.update(0.0, 1.0):
                        continue
                    status = "converged" if float(rel.max()) <= max(opts.tol, 1e3 * torch.finfo(dtype).eps) \
                        else "stalled"
                    break
                beta = beta + t * D
        except (RuntimeError, MemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            status = "out_of_memory"
    if rec is None:
        rec = {"primal": math.nan, "dual": math.nan, "gap": math.nan, "rel_gap": math.inf}
    res = SolverResult(alpha=alpha, state=state, n_iter=it, status=status, primal=rec["primal"], dual=rec["dual"],
                       gap=rec["gap"], rel_gap=rec["rel_gap"], radius=torch.ones(T, dtype=dtype, device=device),
                       history=mon.history, rng_state=None)
    return res


register_solver("newton", "features", feature_newton)
