"""DBCD-TR: dual block coordinate descent with a trust region (seed paper, Algorithms 1-3).

The dual problem (see :mod:`joker_ext.losses`), for each target column t::

    min_alpha  D(alpha) = 1/2 alpha^T K alpha + sum_i g_i(alpha_i),   alpha_i in box_i

One iteration picks a block B of a fixed random partition of the rows and improves ``alpha_B`` with
the other rows fixed. With ``f_B = (K alpha)_B``, the block's gradient and Hessian are::

    grad = f_B - y_B + psi'(alpha_B) (+ kink * sign),      H = K_BB + diag(psi''(alpha_B))

The step minimises the quadratic model ``grad^T s + 1/2 s^T H s`` inside ``||s|| <= radius`` and the box,
by a truncated CG-Steihaug (Algorithm 2) on the free variables (variables at a bound whose gradient
pushes outwards are held fixed), which stops at the trust-region boundary or when it leaves the box;
the better of the projected point and the point where it hit the box is taken. The step is accepted
when ``rho = (D(alpha) - D(alpha + s)) / model decrease >= eta`` (0.125); the radius is multiplied by 0.25
after a rejected step, by 0.5 when rho < 0.25, and by 2 when rho > 0.75 and the step reached the
boundary. Each target column has its own radius.

Non-smooth conjugates ``kink * |a|`` (epsilon-insensitive) are handled on orthants (seed paper, B.2):
inside one step every coordinate keeps the sign it has (a coordinate at zero picks the side its
gradient points to, or stays at zero), so the model is exact on the part ``kink * |a|``.

One iteration in code: :func:`_gather` builds the block's :class:`BlockProblem` (its slices, the operator's
products, gradient, curvature, and the block model that :func:`joker_ext.operators.block_model` picks, the
one place of that policy); :func:`_block_step` runs the phases on it: a Newton step where the model says so
(:func:`_newton_step`), the orthant and free variables (:func:`_orient`), the first radius
(:func:`_initial_radius`), the Cauchy point (:func:`_cauchy_point`), CG-Steihaug or the direct solve with
the projected search (:func:`_subspace_steps`), the ratio test and radius update (:func:`_accept_and_resize`)
and the write-back (:func:`_write_back`).

The duality gap is the sum over samples of the Fenchel-Young gaps
``c_i l(y_i, f_i) + g_i(alpha_i) + alpha_i f_i >= 0``; the relative gap is ``gap / max(primal, |dual|)``.
"""
from __future__ import annotations

import math
import signal
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from .dense import cholesky_ex, cholesky_solve
from .losses import Loss
from .memory import is_out_of_memory
from .engines import sigint_as_flag
from .defaults import CAUCHY_FACTORS, DIRECT_MAX, SEARCH_CANDIDATES, SEARCH_FACTORS
from .operators import BlockModel, BlockOps, apply_delta, block_model
from .results import SolverResult  # noqa: F401  (defined in a leaf module; re-exported here)

__all__ = ["SolverOptions", "SolverResult", "dbcd_tr", "cg_steihaug", "duality_gap", "make_blocks"]


@dataclass
class SolverOptions:
    """Options of :func:`dbcd_tr`.

    Attributes
    ----------
    block_size : int
        Rows per block (the last blocks of the partition may be one row shorter).
    max_iter : int, optional
        Maximum number of outer iterations (block iterations for DBCD-TR, Newton iterations for the
        Newton engines); None: the engine's default (:func:`joker_ext.engines.default_max_iter`).
    tol : float
        Stop when the relative duality gap ``gap / max(primal, |dual|)`` is at most ``tol``.
    max_time : float, optional
        Stop after this many seconds (checked after every iteration).
    block_selection : {'random', 'cyclic'}
        Uniformly random block at every iteration (the paper's choice) or blocks in order.
    eta : float
        Acceptance threshold on rho.
    max_cg : int
        Maximum CG iterations per trust-region subproblem (and per preconditioned Newton step).
    subproblem : {'auto', 'cg', 'direct'}
        How the trust-region subproblem on the free variables is solved: truncated CG-Steihaug, or
        exactly through an eigendecomposition of the block Hessian (robust on the ill-conditioned,
        degenerate duals of the absolute, pinball and epsilon-insensitive losses). 'auto' uses the direct
        solve in exact mode for blocks of at most ``direct_max`` rows.
    direct_max : int
        Largest block for which 'auto' picks the direct solve.
    max_subspace : int
        Maximum rounds of (CG on the free variables, projected search) per iteration.
    cg_tol : float
        CG stops when the free residual norm falls below ``cg_tol`` times its initial norm.
    newton_tol : float
        Relative residual at which the preconditioned CG of an unconstrained quadratic block (squared
        loss with an approximate block matrix, see :class:`joker_ext.operators.FeatureOperator`) stops.
    check_every : int, optional
        Iterations between duality-gap evaluations (default: every iteration for exact kernels, where
        the gap is O(n); once per epoch for features, where it needs a pass over the data).
    callback_every : int, optional
        Iterations between callback calls (default: ``check_every``).
    callback_cg_every : int, optional
        Feature Newton engine on a quadratic primal (the squared loss), whose fit is one conjugate-gradient
        run: also hand the callback the iterate every this many CG iterations of that run (its weights, its
        dual point and the duality gap from the CG residual; ``info['cg_iterations']`` counts them). None:
        callbacks at Newton iterations only.
    seed : int
        Seed of the partition and the block choice.
    verbose : bool
        tqdm progress bar.
    handle_sigint : bool
        Turn Ctrl-C into a clean stop between iterations (main thread only).
    final_gap : bool
        Evaluate the duality gap when the loop ends (a pass over the data in feature mode).
    newton_rank : int, optional
        Newton engine, feature mode: rank of the Nystrom preconditioner (default
        :func:`joker_ext.primal_newton.default_rank`). Not given, with the features kept (``newton_cache``) and
        at most :data:`~joker_ext.defaults.EXACT_HESSIAN_MAX_FEATURES` of them, the Hessian itself is factored
        instead (:class:`~joker_ext.primal_newton.ExactHessian`); for the kinked losses, from their band's rows,
        whenever ``M <=`` :data:`~joker_ext.defaults.KINKED_HESSIAN_MAX_FEATURES`, features kept or not. A rank below
        ``M`` keeps the sketch.
    newton_sketch_rows : int, optional
        Newton engine, feature mode: rows the preconditioner is sketched on (default
        :func:`joker_ext.primal_newton.default_sketch_rows`).
    newton_resident : bool, optional
        Newton engine, feature mode: keep a copy of the training inputs on the solver's device for the passes
        (default: when it fits :data:`joker_ext.primal_newton.RESIDENT_BYTES`); False streams them from where
        they are at every pass (what :func:`joker_ext.memory.plan_newton` chooses first for a tight budget).
    newton_cache : bool, optional
        Newton engine, feature mode: keep the features of the Hessian products (``n x M`` in the pass dtype)
        instead of computing them at every product (default: when they take at most
        :data:`joker_ext.defaults.FEATURE_CACHE_BYTES`; off when a ``max_memory`` budget is planned).
    newton_cg_tol : float
        Newton engine, feature mode: the tightest relative residual asked of the inner conjugate gradients
        (the inexact-Newton tolerance is ``clip(sqrt(rel_gap), newton_cg_tol, 0.1)``).

    ``max_iter`` counts the outer iterations of the engine: block iterations for DBCD-TR, Newton
    iterations for the Newton engines (:mod:`joker_ext.engines`).
    """

    block_size: int = 1024
    max_iter: Optional[int] = 1000
    tol: float = 1e-6
    max_time: Optional[float] = None
    block_selection: str = "random"
    eta: float = 0.125
    max_cg: int = 50
    max_subspace: int = 20
    subproblem: str = "auto"
    direct_max: int = DIRECT_MAX
    cg_tol: float = 1e-10
    newton_tol: float = 1e-2
    check_every: Optional[int] = None
    callback_every: Optional[int] = None
    callback_cg_every: Optional[int] = None
    seed: int = 0
    verbose: bool = False
    handle_sigint: bool = True
    final_gap: bool = True
    newton_rank: Optional[int] = None
    newton_sketch_rows: Optional[int] = None
    newton_resident: Optional[bool] = None
    newton_cache: Optional[bool] = None
    newton_cg_tol: float = 1e-10


def make_blocks(n: int, block_size: int, generator: torch.Generator) -> List[torch.Tensor]:
    """A fixed random partition of ``range(n)`` into ``ceil(n / block_size)`` blocks of near-equal size,
    each sorted (sorted rows read fastest from memory-mapped data)."""
    perm = torch.randperm(n, generator=generator)
    n_blocks = max(1, math.ceil(n / block_size))
    return [torch.sort(b).values for b in torch.tensor_split(perm, n_blocks)]


def cg_steihaug(
    hvp: Callable[[torch.Tensor], torch.Tensor],
    g: torch.Tensor,
    radius: torch.Tensor,
    free: torch.Tensor,
    p0: Optional[torch.Tensor] = None,
    *,
    max_iter: int = 50,
    tol: float = 1e-10,
):
    """Truncated CG-Steihaug for ``min_p g^T p + 1/2 p^T H p`` s.t. ``||p|| <= radius``, per column.

    Starts from ``p0`` (default 0) and moves only the free coordinates (``free`` mask); the residual is
    ``-(g + H p)`` on them. A column stops at the trust-region boundary, on non-positive curvature (then
    it goes to the boundary), or when its residual norm is below ``tol`` times the initial one.
    Returns ``(p, on_boundary)``.
    """
    freef = free.to(g.dtype)
    T = g.shape[1]
    p = torch.zeros_like(g) if p0 is None else p0.clone()
    r = -(g + (hvp(p) if p0 is not None else 0.0)) * freef
    d = r.clone()
    rr = (r * r).sum(0)
    r0 = rr.sqrt()
    active = r0 > 0
    boundary = torch.zeros(T, dtype=torch.bool, device=g.device)
    tiny = torch.finfo(g.dtype).tiny
    for _ in range(max_iter):
        if not bool(active.any()):
            break
        Hd = hvp(d) * freef
        dHd = (d * Hd).sum(0)
        step = rr / torch.where(dHd > 0, dHd, torch.ones_like(dHd))
        p_new = p + step * d
        # Distance to the trust-region boundary along d: ||p + tau d|| = radius.
        pd, dd, pp = (p * d).sum(0), (d * d).sum(0), (p * p).sum(0)
        disc = (pd * pd + dd * (radius * radius - pp)).clamp_min(0)
        tau = (-pd + disc.sqrt()) / dd.clamp_min(tiny)
        out_tr = active & ((dHd <= 0) | (p_new.norm(dim=0) >= radius))
        cand = torch.where(out_tr.unsqueeze(0), p + tau * d, p_new)
        upd = active.unsqueeze(0)
        p = torch.where(upd, cand, p)
        boundary = boundary | out_tr
        r_new = r - step * Hd
        rr_new = (r_new * r_new).sum(0)
        done = out_tr | (rr_new.sqrt() <= tol * r0)
        beta = rr_new / rr.clamp_min(tiny)
        d = torch.where(upd, r_new + beta * d, d)
        r = torch.where(upd, r_new, r)
        rr = torch.where(active, rr_new, rr)
        active = active & ~done
    return p, boundary


def duality_gap(loss: Loss, Y: torch.Tensor, F: torch.Tensor, alpha: torch.Tensor, c: torch.Tensor,
                quad: torch.Tensor):
    """Primal, dual and gap per target column.

    ``primal = 1/2 q + sum_i c_i l(y_i, f_i)``, ``dual = 1/2 q + sum_i g_i(alpha_i)`` with
    ``q = alpha^T K alpha`` and ``gap = sum_i FY_i`` (the Fenchel-Young terms, each >= 0).
    """
    primal = 0.5 * quad + (c * loss.value(Y, F)).sum(0)
    dual = 0.5 * quad + loss.conj(alpha, Y, c).sum(0)
    gap = loss.fenchel_young(Y, F, alpha, c).sum(0)
    return primal, dual, gap


_sigint_as_flag = sigint_as_flag


def dbcd_tr(
    operator,
    Y: torch.Tensor,
    loss: Loss,
    c: torch.Tensor,
    options: Optional[SolverOptions] = None,
    *,
    alpha0: Optional[torch.Tensor] = None,
    state0: Optional[Dict[str, torch.Tensor]] = None,
    radius0: Optional[torch.Tensor] = None,
    start_iter: int = 0,
    callback: Optional[Callable[[dict], Optional[bool]]] = None,
    validation: Optional[Callable[[Dict[str, torch.Tensor], torch.Tensor], float]] = None,
    rng_state: Optional[torch.Tensor] = None,
    snapshot: Optional[Callable[[dict], None]] = None,
    snapshot_every: Optional[int] = None,
) -> SolverResult:
    """Minimise the dual by DBCD-TR.

    Parameters
    ----------
    operator : ExactOperator or FeatureOperator
    Y : Tensor (n, T)
        Targets (-1/+1 for margin losses), on the solver's device and dtype.
    loss : Loss
    c : Tensor (n,)
        Per-sample weights ``c_i = C w_i > 0``.
    options : SolverOptions
    alpha0 : Tensor (n, T), optional
        Warm start (projected on the box).
    state0, radius0, start_iter, rng_state :
        Resume exactly from a checkpoint (the operator state that matches ``alpha0``, the radii, the
        iteration count and the block generator's state).
    callback : callable, optional
        Called with a dict (iteration, time, primal, dual, gap, rel_gap, validation, alpha, state) every
        ``callback_every`` iterations; returning True stops the fit. A KeyboardInterrupt raised inside it
        stops the fit like Ctrl-C does.
    validation : callable, optional
        ``validation(state, alpha) -> float``, recorded in the history at each gap evaluation.
    snapshot, snapshot_every : optional
        ``snapshot(info)`` is called every ``snapshot_every`` iterations with alpha, state, radius,
        iteration and rng_state (no gap evaluation): the hook checkpoints use.
    """
    opts = options or SolverOptions()
    if opts.block_selection not in ("random", "cyclic"):
        raise ValueError(f"block_selection must be 'random' or 'cyclic', got {opts.block_selection!r}")
    n, T = Y.shape
    dtype, device = Y.dtype, Y.device
    c_col = c.reshape(n, 1).to(dtype=dtype, device=device)
    loss.check_targets(Y)
    lo_all, hi_all = loss.box(Y, c_col)
    unboxed = bool(torch.isinf(lo_all).all() and torch.isinf(hi_all).all())
    # unconstrained quadratic duals (squared loss) take Newton steps by CG on the true block matrix
    newton_steps = unboxed and loss.quadratic and not loss.kink
    prepare = getattr(operator, "prepare", None)
    if prepare is not None:
        prepare(newton_steps=newton_steps)

    gen = torch.Generator().manual_seed(int(opts.seed))
    blocks = make_blocks(n, max(1, int(opts.block_size)), gen)
    if rng_state is not None:
        gen.set_state(rng_state)
    n_blocks = len(blocks)
    blocks_dev = [b.to(device) for b in blocks]

    if alpha0 is None:
        alpha = torch.zeros(n, T, dtype=dtype, device=device)
        alpha = torch.minimum(torch.maximum(alpha, lo_all), hi_all)
    else:
        alpha = torch.minimum(torch.maximum(alpha0.to(dtype=dtype, device=device).reshape(n, T), lo_all), hi_all)
        alpha = alpha.clone()
    state = state0 if state0 is not None else operator.init_state(alpha)
    radius = None if radius0 is None else radius0.to(dtype=dtype, device=device).clone()

    check_every = opts.check_every or (1 if operator.mode == "exact" else n_blocks)
    callback_every = opts.callback_every or check_every
    history: List[dict] = []
    t0 = time.perf_counter()
    status = "max_iter"
    last = {"primal": math.nan, "dual": math.nan, "gap": math.nan, "rel_gap": math.inf}

    def evaluate(it: int, refresh: bool = False) -> dict:
        F = operator.predictions(state, alpha, refresh=refresh)
        q = operator.quad(state, alpha, F)
        primal, dual, gap = duality_gap(loss, Y, F, alpha, c_col, q)
        P, D, G = float(primal.sum()), float(dual.sum()), float(gap.sum())
        scale = max(abs(P), abs(D), torch.finfo(dtype).tiny)
        rec = {"iteration": it, "time": time.perf_counter() - t0, "primal": P, "dual": D, "gap": G,
               "rel_gap": G / scale}
        if validation is not None:
            rec["validation"] = float(validation(state, alpha))
        history.append(rec)
        return rec

    bar = None
    if opts.verbose:
        from tqdm.auto import tqdm

        bar = tqdm(total=opts.max_iter, initial=start_iter, desc="DBCD-TR", unit="it")

    it = start_iter
    cyc = start_iter % n_blocks
    with _sigint_as_flag(opts.handle_sigint) as sig:
        try:
            while it < opts.max_iter:
                if opts.block_selection == "random":
                    k = int(torch.randint(n_blocks, (1,), generator=gen))
                else:
                    k = cyc
                    cyc = (cyc + 1) % n_blocks
                problem = _gather(operator, state, loss, Y, c_col, alpha, blocks_dev[k], lo_all, hi_all,
                                  newton_steps=newton_steps, opts=opts)
                radius = _block_step(problem, operator, state, alpha, loss, radius, opts)
                it += 1
                if bar is not None:
                    bar.update(1)
                stop_now = False
                if snapshot is not None and snapshot_every and it % snapshot_every == 0:
                    snapshot({"alpha": alpha, "state": state, "radius": radius, "iteration": it,
                              "rng_state": gen.get_state()})
                if it % check_every == 0 or (it == opts.max_iter and opts.final_gap):
                    last = evaluate(it)
                    if bar is not None:
                        bar.set_postfix(rel_gap=f"{last['rel_gap']:.2e}")
                    if last["rel_gap"] <= opts.tol:
                        status = "converged"
                        stop_now = True
                if callback is not None and it % callback_every == 0:
                    info = dict(history[-1]) if history and history[-1]["iteration"] == it else evaluate(it)
                    info.update(alpha=alpha, state=state, radius=radius, rng_state=gen.get_state())
                    if callback(info):
                        status = "callback"
                        stop_now = True
                if stop_now:
                    break
                if opts.max_time is not None and time.perf_counter() - t0 >= opts.max_time:
                    status = "max_time"
                    break
                if sig.flag:
                    raise KeyboardInterrupt
        except (RuntimeError, MemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            status = "out_of_memory"
        except KeyboardInterrupt:
            status = "interrupted"
            warnings.warn(
                f"fit interrupted after {it} block iterations; the model keeps the last consistent iterate",
                RuntimeWarning,
                stacklevel=2,
            )
    if bar is not None:
        bar.close()
    if history and history[-1]["iteration"] == it:
        last = history[-1]
    elif opts.final_gap:
        last = evaluate(it)
    if radius is None:
        radius = torch.ones(T, dtype=dtype, device=device)
    return SolverResult(alpha=alpha, state=state, n_iter=it, status=status, primal=last["primal"],
                        dual=last["dual"], gap=last["gap"], rel_gap=last["rel_gap"], radius=radius,
                        history=history, rng_state=gen.get_state())


def trust_region_eigh(H: torch.Tensor, g: torch.Tensor, radius: float) -> "tuple[torch.Tensor, bool]":
    """Exact solution of ``min_w g^T w + 1/2 w^T H w`` s.t. ``||w|| <= radius`` for a PSD ``H``.

    Uses ``H = Q diag(lam) Q^T``: ``w(mu) = -Q (Q^T g) / (lam + mu)`` with ``mu = 0`` (pseudo-inverse on
    the numerically zero eigenvalues) when that step is inside the region, otherwise ``mu > 0`` from
    the secular equation ``||w(mu)|| = radius`` by bisection in log scale. Returns ``(w, on_boundary)``.
    """
    # Fast path: when H is safely positive definite, one Cholesky gives the Newton step; it is the
    # answer whenever it lies inside the region (the common case once the radius has grown).
    L, info = cholesky_ex(H)
    if int(info) == 0:
        w = -cholesky_solve(g.unsqueeze(1), L).squeeze(1)
        diag = torch.diagonal(L)
        well_conditioned = float(diag.min()) ** 2 > float(diag.max()) ** 2 * H.shape[0] * 1e3 * torch.finfo(H.dtype).eps
        if well_conditioned and torch.all(torch.isfinite(w)) and float(w.norm()) <= radius:
            return w, False
    lam, Q = torch.linalg.eigh(0.5 * (H + H.T))
    lam = lam.clamp_min(0)
    gq = Q.T @ g
    cut = lam.max().clamp_min(torch.finfo(H.dtype).tiny) * (H.shape[0] * torch.finfo(H.dtype).eps)
    pos = lam > cut
    w_q = torch.where(pos, -gq / torch.where(pos, lam, torch.ones_like(lam)), torch.zeros_like(gq))
    null_grad = bool((gq[~pos].abs() > 1e-12 * gq.abs().max().clamp_min(torch.finfo(H.dtype).tiny)).any())
    if not null_grad and float(w_q.norm()) <= radius:
        return Q @ w_q, False
    g_norm = float(gq.norm())
    lo_mu, hi_mu = max(float(cut), 1e-300), max(g_norm / radius, float(cut)) * 2.0
    for _ in range(100):
        mid = math.sqrt(lo_mu * hi_mu)
        if float((gq / (lam + mid)).norm()) > radius:
            lo_mu = mid
        else:
            hi_mu = mid
        if hi_mu / lo_mu < 1 + 1e-12:
            break
    w_q = -gq / (lam + hi_mu)
    return Q @ w_q, True


def _model(grad, hdiag, matvec, S, k):
    """Values of the quadratic model ``grad^T s + 1/2 s^T (K_BB + diag(h)) s`` for ``k`` stacked candidates."""
    G = grad.repeat(1, k)
    KS = matvec(S)
    vals = (G * S).sum(0) + 0.5 * (S * (KS + hdiag.repeat(1, k) * S)).sum(0)
    return vals, KS


def _direct_subspace(KBB, hdiag, grad, s, free, radius):
    """Exact trust-region step on the free variables of each column, from ``s`` (see trust_region_eigh)."""
    p = s.clone()
    T = s.shape[1]
    boundary = torch.zeros(T, dtype=torch.bool, device=s.device)
    g_at_s = grad + KBB @ s + hdiag * s
    for t in range(T):
        F = torch.nonzero(free[:, t]).reshape(-1)
        if F.numel() == 0:
            continue
        H = KBB.index_select(0, F).index_select(1, F) + torch.diag(hdiag[F, t])
        w, hit = trust_region_eigh(H, g_at_s[F, t], float(radius[t]))
        p[F, t] += w
        boundary[t] = hit
    return p, boundary


def _newton_pcg(ops, grad, hdiag, max_iter: int, tol: float):
    """Inexact Newton step ``s ~ -(H_B + diag(h))^{-1} grad`` by conjugate gradients on the true block
    matrix, preconditioned by the model's matrix: ``P = ops.matrix + diag(h)`` (the kernel's ``K_BB``
    for random features, of which ``H_B = Phi_B Phi_B^T`` is an unbiased estimate), factored once.

    CG stops at a relative residual ``tol`` or after ``max_iter`` products. Each iteration costs one true
    product (``4 b M`` flops for features) and two triangular solves; with ``M`` well above ``b`` the
    preconditioned matrix is the identity up to the random-feature error and a few iterations suffice.
    ``P`` only preconditions: when its Cholesky factorisation fails (float32, large ``C``, duplicated
    rows) it is shifted by a growing multiple of its diagonal until it succeeds. When the diagonals of
    all targets are equal (the squared loss: ``h = 1 / c`` per sample), one factor serves them all.

    Returns ``(s, decrease)`` with ``decrease = 1/2 s^T (r - grad)`` per target, the exact decrease of
    the quadratic along ``s`` given the final residual ``r = -grad - (H + diag(h)) s``; None when ``P``
    could not be factored at all.
    """
    same = bool((hdiag == hdiag[:, :1]).all())
    diags = hdiag[:, :1].T if same else hdiag.T
    P = ops.matrix.unsqueeze(0) + torch.diag_embed(diags)  # (1 or T, b, b)
    L, info = torch.linalg.cholesky_ex(P)
    if bool((info != 0).any()):
        scale = P.diagonal(dim1=1, dim2=2).abs().amax().clamp_min(torch.finfo(P.dtype).tiny)
        shift = P.shape[-1] * torch.finfo(P.dtype).eps * scale
        eye = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device)
        for _ in range(8):
            L, info = torch.linalg.cholesky_ex(P + shift * eye)
            if not bool((info != 0).any()):
                break
            shift = shift * 10.0
        else:
            return None
    Lt = L.transpose(1, 2)

    def precond(R):
        # two triangular solves (faster than cholesky_solve for a few columns); one factor broadcasts
        Rb = R.T.unsqueeze(2)
        Z = torch.linalg.solve_triangular(Lt, torch.linalg.solve_triangular(L, Rb, upper=False), upper=True)
        return Z.squeeze(2).T

    s = torch.zeros_like(grad)
    r = -grad
    z = precond(r)
    p = z
    rz = (r * z).sum(0)
    r0 = r.norm(dim=0)
    for _ in range(max(1, max_iter)):
        Ap = ops.true_matvec(p) + hdiag * p
        pAp = (p * Ap).sum(0)
        a = torch.where(pAp > 0, rz / torch.where(pAp > 0, pAp, torch.ones_like(pAp)), torch.zeros_like(pAp))
        s = s + a * p
        r = r - a * Ap
        if bool((r.norm(dim=0) <= tol * r0).all()):
            break
        z = precond(r)
        rz_new = (r * z).sum(0)
        p = z + torch.where(rz > 0, rz_new / torch.where(rz > 0, rz, torch.ones_like(rz)), torch.zeros_like(rz)) * p
        rz = rz_new
    return s, 0.5 * (s * (r - grad)).sum(0)


def orthant_box(kink: float, a, grad, lo, hi):
    """For a kink ``kink * |a|``: restrict the box to the orthant of the step and add ``kink * sign`` to the
    gradient (seed paper, B.2). A coordinate at zero takes the side its gradient points to, or stays at
    zero when ``|grad| <= kink``. Returns ``(grad, lo, hi)`` unchanged when there is no kink."""
    if not kink:
        return grad, lo, hi
    sgn = torch.sign(a)
    at0 = sgn == 0
    sgn = torch.where(at0 & (grad + kink < 0), torch.ones_like(sgn), sgn)
    sgn = torch.where(at0 & (grad - kink > 0), -torch.ones_like(sgn), sgn)
    zero = torch.zeros_like(lo)
    lo = torch.where(sgn > 0, torch.maximum(lo, zero), torch.where(sgn < 0, lo, zero))
    hi = torch.where(sgn < 0, torch.minimum(hi, zero), torch.where(sgn > 0, hi, zero))
    return grad + kink * sgn, lo, hi


@dataclass
class BlockProblem:
    """The subproblem of one DBCD-TR iteration on block ``B`` (built once per iteration by :func:`_gather`).

    In ``s`` (the change of ``alpha_B``), with the other rows fixed::

        min_s  grad^T s + 1/2 s^T (H_B + diag(hdiag)) s    s.t.  lo <= alpha_B + s <= hi,  ||s|| <= radius

    with ``grad = f_B - y_B + psi'(alpha_B)`` (plus ``kink * sign`` on the orthant, see :func:`orthant_box`),
    ``hdiag = psi''(alpha_B)`` and ``H_B`` the block's kernel matrix (or the model's stand-in for it).

    Attributes
    ----------
    idx : Tensor (b,)
        The block's rows.
    ops : BlockOps
        The operator's products for the block (``f_B``, the model matrix, the true quadratic form).
    a, y, c : Tensor (b, T), (b, T), (b, 1)
        ``alpha_B``, the targets and the weights of the block.
    box_lo, box_hi : Tensor (b, T)
        The dual box of the block.
    lo, hi : Tensor (b, T)
        The box the step keeps to: the dual box, restricted to the orthant of ``alpha_B`` for a kink.
    grad, hdiag : Tensor (b, T)
        Gradient (with the kink's sign once oriented) and the conjugate's curvature ``psi''(alpha_B)``.
    model : BlockModel
        Model matrix and solve of the block (:func:`joker_ext.operators.block_model`).
    free : Tensor (b, T), bool
        Variables not held at a bound by a gradient pointing outwards (set by :func:`_orient`).
    """

    idx: torch.Tensor
    ops: BlockOps
    a: torch.Tensor
    y: torch.Tensor
    c: torch.Tensor
    box_lo: torch.Tensor
    box_hi: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    grad: torch.Tensor
    hdiag: torch.Tensor
    model: BlockModel
    free: Optional[torch.Tensor] = None

    @property
    def T(self) -> int:
        return self.a.shape[1]

    def hvp(self, V: torch.Tensor) -> torch.Tensor:
        """``(H_B + diag(hdiag)) V`` for ``k`` candidates stacked as columns (``V``: b x kT)."""
        return self.ops.matvec(V) + self.hdiag.repeat(1, V.shape[1] // self.T) * V

    def proj(self, S: torch.Tensor) -> torch.Tensor:
        """Steps ``S`` (b x kT) projected so that ``alpha_B + s`` stays in ``[lo, hi]``."""
        k = S.shape[1] // self.T
        X0 = self.a.repeat(1, k)
        return torch.minimum(torch.maximum(X0 + S, self.lo.repeat(1, k)), self.hi.repeat(1, k)) - X0

    def model_values(self, S: torch.Tensor, k: int):
        """Model values of ``k`` stacked candidates and their products with the model matrix."""
        return _model(self.grad, self.hdiag, self.ops.matvec, S, k)


def _gather(operator, state, loss: Loss, Y, c_col, alpha, idx, lo_all, hi_all, *, newton_steps: bool,
            opts: SolverOptions) -> BlockProblem:
    """Phase 1, gather the block: its slices, ``f_B`` and products, gradient, curvature and block model."""
    ops = operator.block(idx, state)
    aB, yB, cB = alpha[idx], Y[idx], c_col[idx]
    lo, hi = lo_all[idx], hi_all[idx]
    grad = ops.f + loss.conj_grad(aB, yB, cB)
    hdiag = loss.psi_hess(aB, yB, cB)
    model = block_model(aB.shape[0], matrix=ops.kind, newton_steps=newton_steps and ops.true_matvec is not None,
                        positive_curvature=bool((hdiag > 0).all()), subproblem=opts.subproblem,
                        direct_max=opts.direct_max)
    return BlockProblem(idx, ops, aB, yB, cB, lo, hi, lo, hi, grad, hdiag, model)


def _newton_step(p: BlockProblem, opts: SolverOptions) -> Optional[torch.Tensor]:
    """Phase 2 (unconstrained, strictly convex quadratic duals with an approximate block matrix: the squared
    loss with ``block_model='kernel'``): a Newton step by conjugate gradients preconditioned with the model
    matrix (:func:`_newton_pcg`). Returned when the quadratic's exact decrease along it is positive and
    finite for every target; None otherwise (rounding, a factorisation that failed): the trust-region step
    is taken instead."""
    step = _newton_pcg(p.ops, p.grad, p.hdiag, opts.max_cg, opts.newton_tol)
    if step is not None and bool((torch.isfinite(step[1]) & ((step[1] > 0) | (step[0] == 0).all(0))).all()):
        return step[0]
    return None


def _orient(p: BlockProblem, loss: Loss) -> None:
    """Phase 3: restrict the box to the orthant of the step for a kink (seed paper, B.2) and mark the free
    variables (those not at a bound whose gradient pushes outwards)."""
    p.grad, p.lo, p.hi = orthant_box(loss.kink, p.a, p.grad, p.lo, p.hi)
    p.free = ~(((p.a <= p.lo) & (p.grad >= 0)) | ((p.a >= p.hi) & (p.grad <= 0)))


def _initial_radius(p: BlockProblem, loss: Loss, gF: torch.Tensor, gg: torch.Tensor) -> torch.Tensor:
    """The first radius of each target: unbounded when the quadratic model is exact and strictly convex (a
    trust region would only slow the first steps; linear conjugates such as hinge keep one: with a singular
    ``K_BB`` it bounds the step; an inexact block matrix keeps one too: the region absorbs the model's
    error); else the length of the Cauchy step ``||g||^3 / g^T H g`` on the free gradient ``g``."""
    if loss.quadratic and p.ops.exact_model and bool((p.hdiag > 0).all()):
        return torch.full_like(gg, math.inf)
    gHg = (gF * p.hvp(gF)).sum(0)
    return torch.where(gg > 0, gg.sqrt() * gg / torch.where(gHg > 0, gHg, torch.ones_like(gHg)), torch.ones_like(gg))


def _cauchy_point(p: BlockProblem, gF: torch.Tensor, gg: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """Phase 4, the Cauchy point: the best (by the model) of projected gradient steps of the lengths
    ``CAUCHY_FACTORS`` times the unconstrained minimiser ``g^T g / g^T H g``, each capped by the radius."""
    T = p.T
    tiny = torch.finfo(p.a.dtype).tiny
    g_norm = gg.sqrt().clamp_min(tiny)
    gHg = (gF * p.hvp(gF)).sum(0)
    t_star = gg / torch.where(gHg > 0, gHg, torch.full_like(gHg, tiny))
    t_cap = radius / g_norm
    ts = torch.stack([torch.minimum(t_star * f, t_cap) for f in CAUCHY_FACTORS])  # (J, T)
    J = ts.shape[0]
    SC = p.proj(-(gF.repeat(1, J)) * ts.reshape(1, J * T))
    mC, _ = p.model_values(SC, J)
    best = mC.reshape(J, T).argmin(0)
    return SC[:, best * T + torch.arange(T, device=best.device)]


def _subspace_steps(p: BlockProblem, s: torch.Tensor, radius: torch.Tensor, opts: SolverOptions):
    """Phase 5 (TRON), from the Cauchy point ``s``: CG-Steihaug (or the exact eigendecomposition solve) on
    the variables free at the current point, then a projected search between the current point and that
    step (``SEARCH_FACTORS`` and the longest feasible fraction); repeated while the search stops at new
    bounds. Returns ``(s, K s, pred)`` with ``pred`` the model decrease."""
    T = p.T
    aB, lo, hi = p.a, p.lo, p.hi
    if p.model.direct and p.ops.matrix is None:
        raise ValueError("subproblem='direct' needs the block's kernel matrix (exact kernels)")
    L = SEARCH_CANDIDATES
    ar = torch.arange(T, device=aB.device)
    for _ in range(max(1, opts.max_subspace)):
        at_bound = ((aB + s) <= lo) | ((aB + s) >= hi)
        free_c = p.free & ~at_bound
        if p.model.direct:
            p_cg, _ = _direct_subspace(p.ops.matrix, p.hdiag, p.grad, s, free_c, radius)
        else:
            p_cg, _ = cg_steihaug(p.hvp, p.grad, radius, free_c, s, max_iter=opts.max_cg, tol=opts.cg_tol)
        w = p_cg - s
        # Ratio test: the longest feasible step along w (the active-set candidate, no projection).
        x_s = aB + s
        up = torch.where(w > 0, (hi - x_s) / w, torch.full_like(w, math.inf))
        dn = torch.where(w < 0, (lo - x_s) / w, torch.full_like(w, math.inf))
        b_max = torch.minimum(up, dn).masked_fill(~free_c, math.inf).amin(0).clamp(0, 1)
        cands = [s + f * w for f in SEARCH_FACTORS] + [s + b_max.unsqueeze(0) * w]
        SW = p.proj(torch.cat(cands, dim=1))
        mW, KW = p.model_values(SW, L)
        pick = mW.reshape(L, T).argmin(0)
        cols = pick * T + ar
        s_next = SW[:, cols]
        new_bounds = ((((aB + s_next) <= lo) | ((aB + s_next) >= hi)) & ~at_bound).any(0)
        s, Ks, pred = s_next, KW[:, cols], -mW[cols]
        if not bool((new_bounds & (w != 0).any(0)).any()):
            break
    return s, Ks, pred


def _accept_and_resize(p: BlockProblem, loss: Loss, s, Ks, pred, radius, radius_in, opts: SolverOptions):
    """Phase 6: ``rho = actual / predicted`` decrease of the dual restricted to the block (the actual one
    with the true block matrix when the model's is a stand-in); accept when ``rho >= eta``; the radius is
    multiplied by 0.25 after a rejected step, by 0.5 when rho < 0.25, by 2 when rho > 0.75 and the step
    reached the boundary, and never falls below what the iterate can resolve. Returns ``(accept, radius)``."""
    aB, ops = p.a, p.ops
    tiny = torch.finfo(aB.dtype).tiny
    sKs = (s * Ks).sum(0) if ops.exact_model else ops.quad(s)
    conj = loss.conj_diff(aB, s, p.y, p.c)
    actual = -((ops.f * s).sum(0) + 0.5 * sKs + conj.sum(0))
    # Model decreases at the level of rounding errors carry no information: neither step nor resize.
    eps = torch.finfo(aB.dtype).eps
    size = (ops.f * s).abs().sum(0) + 0.5 * ((s * Ks).abs().sum(0) if ops.exact_model else sKs) + conj.abs().sum(0)
    informative = pred > 64 * eps * size
    moved = (s != 0).any(0) & (pred > 0) & informative
    rho = actual / torch.where(moved, pred, torch.ones_like(pred))
    accept = moved & (actual > 0) & (rho >= opts.eta)
    s_norm = s.norm(dim=0)
    shrink = moved & ~accept
    new_radius = torch.where(shrink, 0.25 * torch.minimum(radius, s_norm.clamp_min(tiny)), radius_in)
    new_radius = torch.where(accept & (rho < 0.25), 0.5 * radius, new_radius)
    grow = accept & (rho > 0.75) & (s_norm >= 0.99 * radius)
    new_radius = torch.where(grow, 2.0 * radius, new_radius)
    # Never shrink below what the iterate can resolve (a radius under its last bit cannot move it).
    floor = 16 * eps * aB.abs().amax(0) * aB.shape[0] ** 0.5
    return accept, torch.maximum(new_radius, floor)


def _write_back(p: BlockProblem, operator, state, alpha, new_aB: torch.Tensor, change: torch.Tensor) -> None:
    """Phase 7: ``alpha_B <- new_aB`` and the operator state by the step ``change`` (``new_aB - alpha_B``
    as the caller computed it). Everything that allocates happens before anything is changed: a failure
    (out of memory, interrupt) leaves alpha and the operator state consistent."""
    delta = operator.state_delta(p.ops, change)
    alpha[p.idx] = new_aB
    apply_delta(state, delta)


def _block_step(p: BlockProblem, operator, state, alpha, loss: Loss, radius: Optional[torch.Tensor],
                opts: SolverOptions) -> torch.Tensor:
    """One DBCD-TR iteration on the gathered block ``p``; updates ``alpha`` and ``state`` in place; returns
    the radii.

    The box-constrained trust-region subproblem is solved in the manner of TRON (Lin and More, 1999): a
    projected-gradient Cauchy point (the best of a few step lengths, all capped by the radius), then
    truncated CG-Steihaug on the variables that are free at the Cauchy point, then a projected search
    between the two. Every candidate is evaluated by the model in one batched product.
    """
    if p.model.newton:
        s = _newton_step(p, opts)
        if s is not None:
            _write_back(p, operator, state, alpha, p.a + s, s)
            return torch.full((p.T,), math.inf, dtype=p.a.dtype, device=p.a.device)
    _orient(p, loss)
    gF = p.grad * p.free
    gg = (gF * gF).sum(0)
    if radius is None:
        radius = _initial_radius(p, loss, gF, gg)
    if not bool((gg > 0).any()):
        return radius
    radius_in = radius
    if bool(torch.isinf(radius).any()):
        # An unbounded region meets directions of zero curvature (linear conjugates): use a finite
        # radius far beyond any useful step; the box and the projected search do the rest.
        big = 1e12 * (1.0 + p.a.abs().sum(0) + gF.abs().sum(0))
        radius = torch.where(torch.isinf(radius), big, radius)
    s_c = _cauchy_point(p, gF, gg, radius)
    s, Ks, pred = _subspace_steps(p, s_c, radius, opts)
    accept, new_radius = _accept_and_resize(p, loss, s, Ks, pred, radius, radius_in, opts)
    if bool(accept.any()):
        step = s * accept.to(s.dtype).unsqueeze(0)
        new_aB = torch.minimum(torch.maximum(p.a + step, p.box_lo), p.box_hi)
        _write_back(p, operator, state, alpha, new_aB, new_aB - p.a)
    return new_radius


def _register() -> None:
    from .engines import register_solver

    register_solver("dbcd_tr", "exact", dbcd_tr)
    register_solver("dbcd_tr", "features", dbcd_tr)


_register()
