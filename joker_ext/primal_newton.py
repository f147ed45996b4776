"""Newton-PCG on the primal feature weights, for random (or Nystrom) features at large n.

Problem, per target column, with ``Phi`` the n x M feature matrix (never formed: rows are computed chunk
by chunk on every pass, unless the Hessian products' chunks are kept, ``SolverOptions.newton_cache``) and the
loss smoothed by ``s`` (:mod:`joker_ext.smoothing`; ``s = 0`` for squared, Huber, squared hinge and logistic
losses)::

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
3. a line search on ``P_s(beta + t d)``: with ``Phi d`` known, every trial is O(n), no pass. The whole step
   where Armijo's condition holds, else the minimiser of the convex ``P_s`` along ``d`` on ``(0, 1)`` by regula
   falsi on its derivative (:func:`_line_search`).

Kinked losses (hinge, absolute, pinball, epsilon-insensitive) are smoothed by ``s (a - a_k)^2 / (2 c)`` in
the conjugate: a proximal-point step on the dual, centred at the dual solution ``a_k`` of the last smoothed
problem (``a_k = 0`` at first). In the primal this is the loss's Moreau envelope evaluated at
``f - s a_k / c``, so :meth:`~joker_ext.losses.Loss.smoothed_dual` serves unchanged. Each time a smoothed
problem is solved (:meth:`joker_ext.smoothing.Continuation.solved`) the centre moves to its solution and
``s`` is halved (:data:`SMOOTHING_FACTOR`). The centring is what makes the continuation converge: the
proximal point iteration converges for any fixed ``s``, so ``s`` need not reach zero before the gap
closes, and the smoothed problems stay well conditioned for longer. The gap is always that of the
original problem at ``(beta, a)``: ``a`` is feasible for it whatever ``s`` and ``a_k``.

**Finishing step** (kinked losses with ``loss.quadratic``, the Hessian formed, one process): each time a smoothed
problem is solved, its dual solution's sets (coordinates at a bound, at the kink, free) are tried as the solution's
own. With at most M free coordinates, their rows' optimality conditions are one ``|F| x |F|`` system
(:func:`_active_set_point`, ``|F|^2 M`` flops and one pass for ``Phi^T a`` of the fixed ones); the point replaces the
iterate, and the dual point becomes the centre, when its duality gap (one more pass) is no larger. With the right
sets it is the exact solution, where the continuation only approached it: random features, n = 3000, M = 300,
C = 1-100, gaps of 1e-12 -> 1e-15 and 0.70-0.93x the Newton iterations without an intercept; with the intercept
search, whose warm-started rounds try their start's sets first, 0.34-0.70x the iterations (0.44-0.81x the time).

**Interior-point start** (the finishing step's conditions, the features kept, a cold start, zero in the middle of
every box: epsilon-insensitive, absolute, pinball): the dual of each column is first solved by an interior point whose
matrix ``Phi Phi^T`` is read through the kept features (:mod:`joker_ext.feature_interior`); its iterates are the fit's
first records, and from a relative gap of 1e-2 on the finishing step tries each one's active sets. The continuation
goes on from the last iterates' sets when that does not end the fit. JokerFalkon, n = 5000, M = 500, penalties 1e-6
and 1e-8: 15-17 iterations instead of 82-137 (``comparisons/benchmarks/kinked_start.py``; docs/math.rst).

When the primal is a quadratic (the squared loss: ``w`` does not depend on ``f``) the first Newton step
is the whole solve: its conjugate gradients run until the duality gap at the iterate, which a quadratic
gives in O(n + M) from the CG residual (:func:`_gap_test`), reaches ``tol``; a second gradient pass
certifies it. A fit is then ``k + 2`` passes for ``k`` CG iterations, where restarting CG at every
inexact Newton step would pay a gradient pass and a fresh Krylov space each time. With
``SolverOptions.callback_cg_every`` the callback also sees the run's iterates (their certificate is the same
O(n + M) computation; each report waits for the device), as Falkon's ``error_fn`` sees its CG iterations.

Preconditioner: a randomized Nystrom approximation ``U diag(lam) U^T`` of rank ``r`` of ``Phi^T W Phi``
(Frangella, Tropp and Udell, 2023), sketched on ``n_s`` sampled rows (scaled by ``n / n_s``), applied as
``P^{-1} v = U diag((lam_r + 1) / (lam + 1)) U^T v + (v - U U^T v)``. It is recomputed when ``W`` changes.
Where the features are kept (``SolverOptions.newton_cache``) and the rank would cover all ``M`` features, or no
``newton_rank`` is given and ``M <=`` :data:`~joker_ext.defaults.EXACT_HESSIAN_MAX_FEATURES`, the Hessian
``I + Phi^T W Phi`` itself is formed from all rows in one pass (``2 n M^2`` flops, a matrix product) and factored
(:class:`ExactHessian`): the conjugate gradients then take one step, and the kinked losses' smoothed problems,
ill-conditioned as the smoothing shrinks, are solved by exact Newton steps. A ``newton_rank`` below ``M`` keeps
the sketch. The kinked losses' Hessian is formed whenever no ``newton_rank`` is given and ``M <=``
:data:`~joker_ext.defaults.KINKED_HESSIAN_MAX_FEATURES`, features kept or not: only the rows of the smoothing's band
have curvature, so it costs ``2 |band| M^2`` flops (and the band's features alone once the band is narrow), where
the sketch on sampled rows sees few of them.

With Nystrom features ``Phi = K(X, Z) R^{-1}`` the preconditioner is Falkon's instead
(:class:`CentersPreconditioner`: ``I + (n / M) wbar R R^T``, full rank, one ``M x M`` factor), and
``R^{-1}`` is applied to the M-vectors of a pass (two triangular solves per pass) rather than to every
chunk of rows (:class:`_Basis`). For the kinked losses, whose smoothed curvature (``c / s`` on a band of rows, 0
elsewhere) is far from the mean ``wbar`` it assumes, the Hessian is formed instead under the same conditions as
above (``R^{-T} G^T W G R^{-1}``): JokerFalkon, n = 3000, M = 500, penalty 1e-6 / 1e-8, to a gap of 1e-6,
180-400 Newton iterations / more than 1,000 (7-14 s / over 30 s) -> 55-130 / 98-176 (1.4-4.3 s); n = 20,000,
M = 2000, hinge at penalty 1e-6: a gap of 0.5 after 190 s (50 products per Newton step) -> converged in 54 s.
For the other losses the Hessian is formed, where the features are kept and ``M <=``
:data:`~joker_ext.defaults.EXACT_HESSIAN_MAX_FEATURES` or else (from a pass; losses that are not quadratic) ``M <=``
:data:`~joker_ext.defaults.KINKED_HESSIAN_MAX_FEATURES` without a ``newton_rank``, once a Newton step's conjugate
gradients needed more than :data:`~joker_ext.defaults.FORM_HESSIAN_AFTER_PRODUCTS` products, or once the Newton steps
crawl (whole steps that leave the relative gap above :data:`CRAWL_RATIO` times the last one: one below
:data:`CRAWL_FROM`, :data:`CRAWL_STEPS` in a row above it): logistic at small penalties or large C, whose curvature
spans 1e-10 to 1/4 by row. Random features, logistic with the intercept, n = 30,000, M = 2000, C = 100: 11 Newton
iterations in 47 s with the sketch alone, 10 in 25 s with the Hessian formed after the crawl at the seventh.

Cost per pass ``O(n M d)`` (the features) plus ``4 n M`` (two products); the sketch ``O(n_s M (d + r))``
plus ``O(M r^2)``. Memory: ``M r`` for ``U`` (two ``M x r`` buffers while sketching, when the passes'
feature chunks are freed), ``chunk_rows x M`` for a feature chunk, a few n-vectors and a copy of ``X`` on the
device; never ``M x M`` for random features (Falkon's preconditioner) unless ``r = M``.

On a GPU (measured on an H100, ``comparisons/benchmarks/falkon_gpu.py``):

* random features are evaluated as (cos, sin) pairs by one complex exponential per frequency
  (:meth:`~joker_ext.features.RandomFeatureMap.pass_features`), unscaled (the scale goes onto the
  M-vectors), in the map's ``compute_dtype`` (float32 for float32 data): the solver works in that column
  order and permutes ``beta`` on the way in and out;
* the Hessian products run in float32 and are accumulated over the chunks in float64; the gradient pass,
  whose accuracy decides how far the Newton iterations converge, converts each chunk to float64; the
  sketch is taken in float64 (a float32 sketch was measured to cost CG iterations);
* the inner conjugate gradients never wait for the GPU: convergence flags come back through pinned
  memory one iteration late (:class:`_Flags`) and a product queued after the last useful iteration is
  abandoned; the training inputs are copied to the device once (:data:`RESIDENT_BYTES`).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np
import torch

from .defaults import (CONVERT_SPLIT, EXACT_HESSIAN_MAX_FEATURES, FORM_HESSIAN_AFTER_PRODUCTS, GPU_NEWTON_WORKSPACE,
                       IN_PLACE_BLOCK, KINKED_HESSIAN_MAX_FEATURES, QUADRATIC_CG_RUNS, REFRESH_DROP, STREAM_BYTES,
                       TEST_MATRIX_BLOCK)
from .data import BlockData
from .dense import cholesky_ex, cholesky_shifted, cholesky_solve
from .distributed import SingleProcess, local_positions
from .intercept import feasible_scales
from .engines import Monitor, at_rounding_floor, register_solver, sigint_as_flag, start_intercept, target_level
from .engines import default_max_iter as engine_max_iter
from .feature_interior import (ABANDON_GAP, ABANDON_PATIENCE, ABANDON_RISE, DIVERGED, FINISH_FROM, ColumnSolve,
                               FeatureGram, worth_starting, zero_inside)
from .features import NystromFeatureMap, RandomFeatureMap
from .kernels import CallableKernel
from .losses import Loss
from .memory import estimate_fit_memory, is_out_of_memory, keeps_features, plan_newton
from .operators import ExactOperator
from .smoothing import Continuation, needs_smoothing, smooth_for_any_targets
from .solver import SolverOptions, SolverResult
from .working_set import working_set

__all__ = ["feature_newton", "NystromPreconditioner", "default_rank", "default_sketch_rows", "pass_dtype",
           "plan_memory", "default_budget"]

ARMIJO = 1e-4
MAX_HALVINGS = 40
#: The line search's regula falsi: at most this many trials, until the bracket is this narrow (relative) or the
#: slope this small (relative to the slope at 0).
LINE_SEARCH_STEPS = 12
LINE_SEARCH_WIDTH = 1e-2
#: A change of the primal within this fraction of its value is rounding (the whole step is taken).
LINE_SEARCH_NOISE = 1e-13
#: Largest copy of the training inputs (bytes) kept on the solver's device for the passes.
RESIDENT_BYTES = 2 * 2**30
#: Rows per block of the duality gap's O(n) sums: their temporaries are blocks, not n-vectors (at n = 1M, each
#: n-vector of float64 is 8 MB of a GPU budget).
GAP_ROWS = 1 << 16
#: Chunks between two polls of the lagged convergence flag while a product is being queued.
POLL_EVERY = 4
#: Tightest relative residual asked of the conjugate gradients when the products run in float32.
LOW_PRECISION_CG_TOL = 1e-4
#: Division of the smoothing each time a smoothed problem is solved (kinked losses). With the smoothing
#: centred at the last dual solution, 2 took 49-70 Newton iterations to a gap of 1e-8 on the hinge,
#: absolute, pinball and epsilon-insensitive losses (n = 3000, M = 300, C = 10), 3 took 56-86, 10 (and no
#: centring) did not get below 3e-2 in 100.
SMOOTHING_FACTOR = 2.0
#: Rounds of the finishing step (:func:`_active_set_point`): solves of the free rows, each after fixing the
#: coordinates that the last one took out of their box.
FINISH_ROUNDS = 8
#: :meth:`_Passes.exact_hessian` computes the features of its band's rows alone (rather than a whole pass) when the
#: band holds at most this share of the rows and the features are not kept.
BAND_ROWS_SHARE = 0.5
#: The continuation's smoothing after the interior-point start (times its usual start): centred at a point near the
#: solution, the proximal steps need little of it.
INTERIOR_SMOOTHING = 1e-3
#: A warm start of a kinked loss whose relative gap, after the finishing step from its own active sets, is above this
#: goes to the interior-point start instead (the cold path): from another problem's solution (``warm_start`` along a
#: path of C: 0.04-2.0 there) the continuation took longer than the interior point from scratch; from the intercept
#: search's previous round the gap there is 1e-15 to 4.5e-4, and the round keeps its warm start.
WARM_START_FAR_GAP = 2e-2
#: Doubling steps that bracket the intercept's minimiser, and bisections of the bracket (:func:`_intercept_minimiser`).
INTERCEPT_BRACKET = 200
INTERCEPT_BISECTIONS = 200
#: Records at the rounding floor without the best gap halving before the fit stops as converged
#: (:class:`_BestCertificate`).
FLOOR_PATIENCE = 3
#: The feature Newton steps crawl after a whole step that left the relative gap above ``CRAWL_RATIO`` times the last
#: one, below ``CRAWL_FROM``, or after ``CRAWL_STEPS`` such steps in a row above it (where a damped Newton method's
#: first steps may leave the gap near 1: 3 in a row at C = 1, n = 30,000, M = 2000): the Hessian is formed from then
#: on, where it can be.
CRAWL_FROM = 0.1
CRAWL_RATIO = 0.5
CRAWL_STEPS = 5


def default_rank(n_features: int, device=None) -> int:
    """Rank of the Nystrom preconditioner: ``min(M, 512)`` on the CPU; on a GPU, where the sketch is cheap
    next to a pass, ``min(M, max(512, M // 20), 2048)`` (its ``M x r`` factor is the largest buffer of a fit)."""
    if device is not None and torch.device(device).type == "cuda":
        return min(n_features, max(512, n_features // 20), 2048)
    return min(n_features, 512)


def default_sketch_rows(n: int, rank: int) -> int:
    """Rows the preconditioner is sketched on: ``min(n, max(8 r, 8192))``."""
    return min(n, max(8 * rank, 8192))


def _evaluates_map(feature_map, dtype: torch.dtype, device) -> bool:
    """Whether the passes evaluate a random feature map themselves (:class:`_Basis`'s 'random' kind): on a GPU, or
    in a ``compute_dtype`` other than the solver's ``dtype`` (on the CPU in the solver's own dtype the map's own
    evaluation is as fast)."""
    if not isinstance(feature_map, RandomFeatureMap):
        return False
    cd = getattr(feature_map, "compute_dtype", None)
    return torch.device(device).type == "cuda" or (cd is not None and cd != dtype)


def pass_dtype(feature_map, dtype: torch.dtype, device) -> torch.dtype:
    """The dtype of a pass's features (:class:`_Basis`): a random feature map's ``compute_dtype`` (float32 for
    float32 data) where the pass evaluates the map itself, else the solver's ``dtype``."""
    if _evaluates_map(feature_map, dtype, device):
        return getattr(feature_map, "compute_dtype", None) or dtype
    return dtype


def plan_memory(feature_map, n: int, d: int, rank: Optional[int] = None, *, T: int = 1,
                dtype: torch.dtype = torch.float64, device="cpu", max_memory, chunk_rows: int,
                sketch_rows: Optional[int] = None):
    """``(rank, chunk_rows, resident)`` of a fit of ``n`` rows of dimension ``d`` and ``T`` targets with
    ``feature_map`` within ``max_memory`` (:func:`joker_ext.memory.plan_newton`), from ``rank`` (default
    :func:`default_rank`) and ``chunk_rows``; ``resident``: whether the inputs' copy on the device stays.
    Raises ValueError when even the smallest do not fit."""
    M = feature_map.n_features
    rank = min(M, rank or default_rank(M, device))
    rows = sketch_rows or default_sketch_rows(n, rank)
    itemsize = torch.finfo(dtype).bits // 8
    p = torch.finfo(pass_dtype(feature_map, dtype, device)).bits // 8  # also the inputs' copy (_Passes._resident)
    k, r, resident, _ = plan_newton(max_memory, n, d, T, n_features=M, rank=rank, sketch_rows=rows,
                                    chunk_rows=chunk_rows, itemsize=itemsize, device=device, pass_itemsize=p,
                                    resident=n * d * p <= RESIDENT_BYTES)
    return k, r, resident


def default_budget(feature_map, n: int, d: int, *, T: int = 1, dtype: torch.dtype = torch.float64, device="cpu",
                   chunk_rows: int, sketch_rows: Optional[int] = None) -> Optional[int]:
    """The memory budget (bytes) of a fit given none: on a GPU, the fit's O(n) state and model plus
    :data:`~joker_ext.defaults.GPU_NEWTON_WORKSPACE`, where the default rank, ``chunk_rows`` and the resident
    inputs and kept features of :func:`feature_newton` (:func:`joker_ext.memory.estimate_fit_memory`) need
    more; else None (no plan: the defaults as they are). Always None on the CPU, up to
    :data:`~joker_ext.defaults.KINKED_HESSIAN_MAX_FEATURES` features (where the engine may form its ``M x M``
    Hessian instead of the sketch, and keep its features for the kinked losses' interior-point start: a planned
    rank would switch both off), and where even the smallest rank and chunks would not fit that budget."""
    M = feature_map.n_features
    if torch.device(device).type == "cpu" or M <= KINKED_HESSIAN_MAX_FEATURES:
        return None
    rank = min(M, default_rank(M, device))
    p = torch.finfo(pass_dtype(feature_map, dtype, device)).bits // 8
    common = dict(n_features=M, chunk_rows=chunk_rows, itemsize=torch.finfo(dtype).bits // 8, solver="newton",
                  newton_rank=rank, newton_sketch_rows=sketch_rows or default_sketch_rows(n, rank),
                  pass_itemsize=p, device=device)
    state = estimate_fit_memory(n, d, T, resident=False, newton_cache=False, **common)
    budget = state.per_row + state.model + GPU_NEWTON_WORKSPACE
    unplanned = estimate_fit_memory(n, d, T, resident=n * d * p <= RESIDENT_BYTES, **common)
    if unplanned.total <= budget:
        return None
    try:
        plan_memory(feature_map, n, d, T=T, dtype=dtype, device=device, max_memory=budget, chunk_rows=chunk_rows,
                    sketch_rows=sketch_rows)
    except ValueError:
        return None
    return budget


class NystromPreconditioner:
    """``P ~ I + Phi^T W Phi`` from a randomized Nystrom sketch of rank ``r`` (see the module docstring).

    ``U`` may be stored in a lower precision than the vectors it is applied to (float32 passes): the
    correction ``U diag(ratio - 1) U^T v`` is then computed in ``U``'s dtype and added in ``v``'s.
    """

    def __init__(self, U: torch.Tensor, lam: torch.Tensor):
        self.U, self.lam = U, lam
        self.ratio = (lam[-1] + 1.0) / (lam + 1.0) if lam.numel() else lam
        self._coef = (self.ratio - 1.0).to(U.dtype).unsqueeze(1) if lam.numel() else None

    @classmethod
    def sketch(cls, feature_rows, w: torch.Tensor, n_features: int, rank: int, scale: float,
               generator: torch.Generator, *, right=None, left=None, store_dtype=None,
               svd: Optional[bool] = None, reduce=None, two_pass: Optional[bool] = None) -> "NystromPreconditioner":
        """``feature_rows()`` yields ``(rows, G_rows)`` over the sample, ``w`` the sample's curvatures.

        ``reduce(acc)`` (in place), when given, sums the sketch ``Phi_S^T W_S Phi_S Omega`` over the
        processes that each hold part of the sample (:mod:`joker_ext.distributed`).

        The feature matrix is ``Phi = G T`` with ``T V = right(V)`` and ``T^T U = left(U)`` (identity by
        default); the products with ``G`` run in ``G``'s dtype and are accumulated in ``w``'s. The test
        matrix is Gaussian, orthonormalised only when ``4 r > M``: the Nystrom approximation
        ``Y (Omega^T Y)^{-1} Y^T`` does not depend on it, and with ``r <= M / 4`` the columns scaled by
        ``1 / sqrt(M)`` are nearly orthonormal already (condition number about ``(1 + sqrt(r/M)) /
        (1 - sqrt(r/M))``, at most 3), which is all the shift ``nu`` needs; skipping the QR of a large
        sketch saves two ``M x r`` buffers. The thin SVD of the sketch is
        taken through the eigen-decomposition of its ``r x r`` Gram matrix (cheap on a GPU, where an SVD
        of an ``M x r`` matrix is not); every eigenvalue kept is above the shift ``nu``, far above that
        route's rounding error (``svd=None``: on a GPU; on the CPU the SVD of the ``M x r`` matrix).

        Memory: two ``M x r`` buffers at the peak (the test matrix and the sketch; the triangular solve and
        the factor overwrite the sketch row block by row block), plus the SVD's on the CPU. ``two_pass``
        (default: on a GPU, where the sample's second pass is cheap, when the sample has fewer rows than
        ``M``, the test matrix is not orthonormalised and ``T = I``) holds one: the test matrix, drawn in
        row blocks, gives ``P = Phi_S Omega`` (``n_s x r``) and goes; a second pass over the sample sums
        ``Phi_S^T W_S P``; the blocks are drawn again, from the generator's saved state, where the shift
        and ``Omega^T Y`` need them.
        """
        dtype, device = w.dtype, w.device
        gdev = generator.device if isinstance(generator, torch.Generator) else torch.device("cpu")
        orthonormal = 4 * rank > n_features  # not r << M: a Gaussian matrix is then ill-conditioned (QR, cheap)
        if two_pass is None:
            two_pass = device.type != "cpu" and w.numel() < n_features
        two_pass = two_pass and not orthonormal and right is None
        if two_pass:
            Ysk, omega_blocks, work = cls._two_pass_sketch(feature_rows, w, n_features, rank, generator, gdev)
        else:
            omega = torch.randn(n_features, rank, generator=generator, dtype=torch.float64, device=gdev)
            if orthonormal:
                omega = torch.linalg.qr(omega.to(device=device, dtype=dtype)).Q
            else:
                omega = omega.to(device=device, dtype=dtype).mul_(1.0 / math.sqrt(n_features))
            Ysk, work = cls._one_pass_sketch(feature_rows, w, omega, right)
        if reduce is not None:
            reduce(Ysk)
        if left is not None:
            Ysk = left(Ysk)
        Ysk.mul_(scale)
        eps = torch.finfo(work if work is not None else dtype).eps
        nu = math.sqrt(n_features) * eps * float(Ysk.norm().clamp_min(torch.finfo(dtype).tiny))
        if two_pass:
            core = torch.zeros(rank, rank, dtype=dtype, device=device)
            for lo, hi, block in omega_blocks():
                Ysk[lo:hi].add_(block, alpha=nu)
                core.addmm_(block.T, Ysk[lo:hi])
        else:
            Ysk.add_(omega, alpha=nu)
            core = omega.T @ Ysk
            del omega
        L, info = cholesky_ex(0.5 * (core + core.T))
        store = store_dtype or dtype
        if int(info) != 0:  # numerically rank-deficient sketch: fall back to the identity preconditioner
            return cls(torch.zeros(n_features, 0, dtype=store, device=device), torch.zeros(0, dtype=dtype, device=device))
        B = _rows_in_place(Ysk, lambda rows: torch.linalg.solve_triangular(L, rows.T, upper=False).T)
        del Ysk  # B = Ysk L^{-T}, in the sketch's buffer: the sketch is B B^T
        if svd is None:
            svd = device.type == "cpu"
        if svd:
            U, S, _ = torch.linalg.svd(B, full_matrices=False)
            del B
            S2 = S * S
        else:
            S2, V = torch.linalg.eigh(B.T @ B)  # B = U S V^T
            S2, V = S2.flip(0), V.flip(1)
            S = S2.clamp_min(torch.finfo(dtype).tiny).sqrt()
            factor = V / S
            U = _rows_in_place(B, lambda rows: rows @ factor)  # U = B V S^{-1}, in the same buffer
        lam = (S2 - nu).clamp_min(0)
        return cls(U.to(store), lam)

    @staticmethod
    def _one_pass_sketch(feature_rows, w: torch.Tensor, omega: torch.Tensor, right):
        """``(Phi_S^T W_S Phi_S Omega, dtype of the features)`` in one pass over the sample (``T = right``)."""
        Om = omega if right is None else right(omega)
        acc = torch.zeros_like(omega)
        work = None
        for rows, G in feature_rows():
            if work is None:
                work = G.dtype
                Om = Om.to(work)  # no copy when the rows come in the solver dtype
            P = G @ Om
            P.mul_(w[rows].to(work).unsqueeze(1))
            if G.dtype == acc.dtype:
                acc.addmm_(G.T, P)
            else:
                acc.add_(G.T @ P)
            del P, G  # (the loop variable would hold this chunk while the next one is evaluated)
        return acc, work

    @staticmethod
    def _two_pass_sketch(feature_rows, w: torch.Tensor, n_features: int, rank: int, generator, gdev):
        """``(Phi_S^T W_S Phi_S Omega, omega_blocks, dtype of the features)`` with one ``M x r`` buffer at a time
        (:meth:`sketch`'s ``two_pass``); ``omega_blocks()`` yields ``(lo, hi, Omega[lo:hi])`` again, the same
        numbers, from the generator's state before the first draw."""
        dtype, device = w.dtype, w.device
        start = generator.get_state()
        step = max(1, TEST_MATRIX_BLOCK // rank)

        def omega_blocks():
            generator.set_state(start)
            for lo in range(0, n_features, step):
                hi = min(lo + step, n_features)
                block = torch.randn(hi - lo, rank, generator=generator, dtype=torch.float64, device=gdev)
                yield lo, hi, block.to(device=device, dtype=dtype).mul_(1.0 / math.sqrt(n_features))

        omega = torch.empty(n_features, rank, dtype=dtype, device=device)
        for lo, hi, block in omega_blocks():
            omega[lo:hi] = block
        P = torch.empty(w.numel(), rank, dtype=dtype, device=device)
        work = None
        for rows, G in feature_rows():
            work = G.dtype
            P[rows] = G.to(dtype) @ omega  # (the chunk, not the test matrix, goes to the solver dtype)
            del G
        del omega
        P.mul_(w.unsqueeze(1))
        acc = torch.zeros(n_features, rank, dtype=dtype, device=device)
        for rows, G in feature_rows():
            acc.addmm_(G.T.to(dtype), P[rows])
            del G
        return acc, omega_blocks, work

    def apply(self, R: torch.Tensor) -> torch.Tensor:
        """``P^{-1} R`` for one column ``R`` (M,)."""
        if not self.lam.numel():
            return R
        UR = self.U.T @ R.to(self.U.dtype)
        return R + (self.U @ (self._coef[:, 0] * UR)).to(R.dtype)


def _rows_in_place(A: torch.Tensor, fn) -> torch.Tensor:
    """``A[rows] = fn(A[rows])`` for consecutive blocks of rows (``fn`` keeps a block's shape): a row-wise map of
    an ``M x r`` matrix with one block as temporary instead of a second ``M x r`` buffer. Returns ``A``."""
    rows = max(1, IN_PLACE_BLOCK // max(1, A.shape[1]))
    for start in range(0, A.shape[0], rows):
        block = A[start:start + rows]
        block.copy_(fn(block))
    return A


class _FactoredPreconditioner:
    """``P^{-1} v`` by the Cholesky factor ``L`` of an ``M x M`` matrix (none when the factorisation failed: then
    the identity)."""

    L: Optional[torch.Tensor] = None

    def _factor(self, A: torch.Tensor) -> None:
        L, info = cholesky_ex(A)
        self.L = L if int(info) == 0 else None

    def apply(self, v: torch.Tensor) -> torch.Tensor:
        if self.L is None:
            return v
        return cholesky_solve(v.unsqueeze(1), self.L).squeeze(1)


def _column_preconditioners(W: torch.Tensor, shards, build) -> list:
    """One preconditioner per target column of the curvatures ``W`` (``build(t)``), shared by the columns whose
    ``W`` equals an earlier column's on every process (the squared loss: all of them), each a pass and a
    factorisation saved. Squared loss, n = 20,000, M = 1024, 8 targets, exact Hessian: 4.53 -> 1.04 s."""
    out = []
    for t in range(W.shape[1]):
        same = next((u for u in range(t) if not shards.any(not torch.equal(W[:, t], W[:, u]))), None)
        out.append(build(t) if same is None else out[same])
    return out


class ExactHessian(_FactoredPreconditioner):
    """The Newton system's matrix itself, ``P = I + Phi^T W Phi = I + s^2 G^T W G`` (``Phi = G s``), formed from
    all rows and factored: used where the features are kept and the preconditioner's rank would cover all ``M``
    features, or no rank is given and ``M <=`` :data:`~joker_ext.defaults.EXACT_HESSIAN_MAX_FEATURES`
    (:meth:`_Passes.exact_hessian`). Its conjugate gradients then take one step. Measured against the
    rank-M sketch on a sample of rows (CPU, 2 threads, random features, C = 1): hinge n = 20,000, M = 256
    21.8 s and 'max_iter' at a gap of 7e-11 -> 3.9 s, converged at 4e-14; absolute 24.9 s ('max_iter', 4.5e-6)
    -> 5.7 s; epsilon-insensitive n = 50,000, M = 500, 116 s ('max_iter', 4e-7) -> 36 s; logistic 0.69 -> 0.49 s;
    Huber 1.63 -> 1.75 s. Memory: two ``M x M`` matrices, no more than the sketch's buffers at its default rank
    (``SKETCH_BUFFERS M r`` with ``r >= M / 2`` up to that many features). For the kinked losses also up to
    ``M <=`` :data:`~joker_ext.defaults.KINKED_HESSIAN_MAX_FEATURES` without a ``newton_rank``, features kept or
    not (then more than the sketch's buffers: a memory budget plans a rank, which keeps the sketch).

    Parameters
    ----------
    gram : Tensor (M, M)
        ``G^T W G`` (overwritten).
    scale : float
        ``s``.
    shift : bool
        Where the plain factorisation fails, factor with a growing diagonal shift
        (:func:`~joker_ext.dense.cholesky_shifted`): a preconditioner, which need not be exact. Without, :attr:`L`
        is then None.
    """

    def __init__(self, gram: torch.Tensor, scale: float, shift: bool = False):
        A = gram.mul_(scale * scale)
        A.diagonal().add_(1.0)
        self._factor(A)
        if self.L is None and shift:
            try:
                self.L = cholesky_shifted(A)
            except torch.linalg.LinAlgError:
                self.L = None

    def solve(self, V: torch.Tensor) -> torch.Tensor:
        """``P^{-1} V`` (``M x k``) through the factor (which must exist)."""
        return cholesky_solve(V, self.L)


class CentersPreconditioner(_FactoredPreconditioner):
    """Falkon's preconditioner in the Nystrom basis ``Phi = K(X, Z) R^{-1}``: with centres drawn from the
    data, ``K_XZ^T W K_XZ ~ (n / M) wbar K_ZZ^2``, so ``Phi^T W Phi ~ (n / M) wbar R R^T`` and
    ``P = I + (n / M) wbar R R^T`` (``wbar`` the mean curvature) is factored once: full rank, where a
    rank-``r`` sketch leaves the flat spectrum of Nystrom features mostly unpreconditioned. Memory: one
    ``M x M`` factor (the map itself holds ``R``, ``M x M``)."""

    def __init__(self, R: torch.Tensor, wbar: float, n: int):
        M = R.shape[0]
        A = torch.mm(R, R.mT)
        A.mul_(n / M * wbar)
        A.diagonal().add_(1.0)
        self._factor(A)


class _Basis:
    """The feature matrix as ``Phi = G T``: ``G`` evaluated chunk by chunk in the pass dtype, ``T`` a
    small linear map applied to M-vectors (never per row).

    * random features: ``G`` the unscaled (cos, sin) pairs of :meth:`RandomFeatureMap.pass_features`
      (float32 when the map computes in float32), ``T = scale``; the solver works in that column order
      (``to_internal`` / ``to_external`` permute the weights);
    * Nystrom features ``K(X, Z) R^{-1}``: ``G = K(X, Z)``, ``T = R^{-1}`` (two triangular solves per pass
      instead of one per chunk);
    * any other map: ``G = phi(X)``, ``T = I``.
    """

    def __init__(self, fmap, dtype: torch.dtype, device: torch.device):
        self.fmap, self.dtype, self.device = fmap, dtype, device
        self.order = None
        self.scale = 1.0
        self.R = None
        if _evaluates_map(fmap, dtype, device):
            self.kind = "random"
            self.pass_dtype = pass_dtype(fmap, dtype, device)
            self.scale, order = fmap.pass_layout(device)
            self.order = order
        elif isinstance(fmap, NystromFeatureMap):
            self.kind = "nystrom"
            self.pass_dtype = dtype
            self.R = fmap.R.to(device=device, dtype=dtype)
            self.centers = fmap.centers.to(device=device, dtype=dtype)
        else:
            self.kind = "generic"
            self.pass_dtype = dtype
        # dtype the rows are given in
        self.input_dtype = self.pass_dtype if self.kind == "random" else dtype

    def raw(self, Xc: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``G`` of the rows ``Xc`` (into ``out``, ``rows x M`` in the pass dtype, where the map can)."""
        if self.kind == "random":
            return self.fmap.pass_features(Xc, out=out)
        if self.kind == "nystrom":
            return self.fmap.kernel(Xc, self.centers)
        return self.fmap(Xc)

    def features(self, G: torch.Tensor) -> torch.Tensor:
        """``Phi = G T`` for rows ``G`` (a new tensor unless ``T = I``; Nystrom features: ``G R^{-1}``, a triangular
        solve)."""
        if self.kind == "random":
            return G * self.scale
        if self.kind == "nystrom":
            return torch.linalg.solve_triangular(self.R, G, upper=True, left=False)
        return G

    def right(self, V: torch.Tensor) -> torch.Tensor:
        """``T V``."""
        if self.kind == "random":
            return V * self.scale
        if self.kind == "nystrom":
            return torch.linalg.solve_triangular(self.R, V, upper=True)
        return V

    def left(self, U: torch.Tensor) -> torch.Tensor:
        """``T^T U``."""
        if self.kind == "random":
            return U.mul_(self.scale)
        if self.kind == "nystrom":
            return torch.linalg.solve_triangular(self.R.mT, U, upper=False)
        return U

    def to_internal(self, beta: torch.Tensor) -> torch.Tensor:
        return beta if self.order is None else beta[self.order]

    def to_external(self, beta: torch.Tensor) -> torch.Tensor:
        if self.order is None:
            return beta
        out = torch.empty_like(beta)
        out[self.order] = beta
        return out


class _Flags:
    """Per-iteration convergence flags of the conjugate gradients, read back without stalling a GPU: each
    flag is copied to pinned host memory behind its iteration's work and read once its event has passed,
    while the next iteration is already queued."""

    def __init__(self, device: torch.device, size: int):
        self.cuda = device.type == "cuda"
        self.values: dict = {}
        if self.cuda:
            self.host = torch.zeros(size, dtype=torch.bool, pin_memory=True)
            self.events: dict = {}

    def post(self, k: int, active: torch.Tensor) -> None:
        flag = active.any()
        if self.cuda:
            self.host[k].copy_(flag, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self.events[k] = ev
        else:
            self.values[k] = bool(flag)

    def ready(self, k: int) -> Optional[bool]:
        """Flag ``k`` when it is known (never waits), else None."""
        if k in self.values:
            return self.values[k]
        if self.cuda and k in self.events and self.events[k].query():
            self.values[k] = bool(self.host[k])
            return self.values[k]
        return None

    def wait(self, k: int) -> bool:
        """Flag ``k`` (waits for its event)."""
        if k not in self.values:
            self.events[k].synchronize()
            self.values[k] = bool(self.host[k])
        return self.values[k]


def _row_sums(terms, n: int, rows: int = GAP_ROWS) -> tuple:
    """``sum_k terms(lo_k, hi_k)`` over blocks of ``rows`` rows, ``terms`` returning a tuple of per-column sums
    (one empty block when ``n = 0``: a process's shard may hold no rows)."""
    total = None
    for lo in range(0, max(n, 1), rows):
        part = terms(lo, min(lo + rows, n))
        total = part if total is None else tuple(t + p for t, p in zip(total, part))
    return total


class _Passes:
    """Passes over the data through the feature map, chunk by chunk.

    With a float32 feature map (``compute_dtype``) and a float64 solver, the Hessian products run in
    float32 (features, both products) and are accumulated over the chunks in float64; the gradient pass,
    whose accuracy sets how far the Newton iterations converge, converts each chunk of features to
    float64 first. The training inputs are copied once to the solver's device (in the dtype the
    features are computed in) when they fit :data:`RESIDENT_BYTES`.
    """

    def __init__(self, operator, Y, loss: Loss, c_col, shards: SingleProcess, resident: Optional[bool] = None,
                 cache: Optional[bool] = None):
        self.fmap, self.data = operator.feature_map, operator.data
        self.shards = shards
        self.Y, self.loss, self.c = Y, loss, c_col
        self.dtype, self.device = Y.dtype, Y.device
        self.basis = _Basis(self.fmap, self.dtype, self.device)
        self.pass_dtype = self.basis.pass_dtype
        self.low = self.pass_dtype != self.dtype
        self.n, self.M = self.data.n, self.fmap.n_features  # n: this process's rows
        self.n_total = shards.n_total if shards.n_total is not None else shards.plan(self.n, self.data.d)
        # the operator plans chunks of `chunk_rows` rows of solver-dtype features: float32 chunks keep their
        # bytes (twice the rows: fewer launches per pass); the gradient pass, which also holds its chunk in
        # the solver dtype, keeps the planned rows
        base = max(1, int(operator.chunk_rows))
        self.rows = max(1, base * torch.finfo(self.dtype).bits // torch.finfo(self.pass_dtype).bits)
        self.grad_rows = base
        # the gradient pass's copy of its features in the solver dtype, a quarter of its chunk at a time; on a GPU
        # the loss's row-wise steps take the whole chunk (a pass of small blocks is bound by launching kernels)
        self.convert_rows = max(1, base // CONVERT_SPLIT)
        self.whole_chunk_duals = self.device.type != "cpu"
        self.X = None if resident is False else self._resident()
        self.passes = 0
        self._buffers = {}
        if cache is None:
            cache = keeps_features(self.n, self.M, torch.finfo(self.pass_dtype).bits // 8)
        self._cached = [] if cache else None  # the Hessian products' feature chunks, filled by the first one
        self._cache_full = False
        self._mapped = None  # Nystrom features: the kept chunks as G R^{-1} while the interior-point start runs
        self.accurate_hessian = False  # exact_hessian always from the features G R^{-1} (set after a failed step)

    def buffer(self, rows: int, dtype: torch.dtype) -> torch.Tensor:
        """A ``rows x M`` workspace reused by every chunk of every pass (a fresh allocation per chunk costs
        page faults comparable to the features themselves on the CPU)."""
        buf = self._buffers.get(dtype)
        if buf is None or buf.shape[0] < rows:
            self._buffers[dtype] = buf = torch.empty(rows, self.M, dtype=dtype, device=self.device)
        return buf[:rows]

    def _resident(self) -> Optional[torch.Tensor]:
        data, dt = self.data, self.basis.input_dtype
        if data.kind not in ("tensor", "numpy"):
            return None
        if data.n * data.d * torch.finfo(dt).bits // 8 > RESIDENT_BYTES:
            return None
        return self._span(0, data.n)

    def chunks(self, rows: int):
        """Yields ``(start, stop, Xc)`` over the rows in chunks of ``rows``, ``Xc`` on the device in the input
        dtype: slices of the resident copy, or of spans of whole chunks copied :data:`STREAM_BYTES` at a time."""
        if self.X is not None:
            spans = [(0, self.n, self.X)]
        else:
            itemsize = torch.finfo(self.basis.input_dtype).bits // 8
            span = rows * max(1, STREAM_BYTES // (rows * self.data.d * itemsize))
            spans = ((s0, s1, self._span(s0, s1)) for s0, s1 in
                     ((s0, min(s0 + span, self.n)) for s0 in range(0, self.n, span)))
        for s0, s1, Xs in spans:
            for start in range(s0, s1, rows):
                stop = min(start + rows, s1)
                yield start, stop, Xs[start - s0:stop - s0]

    def _span(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of the inputs on the device in the input dtype, converted once (not through the
        solver dtype, as :meth:`BlockData.slice` would)."""
        data, dt = self.data, self.basis.input_dtype
        if data.kind not in ("tensor", "numpy"):
            return data.slice(start, stop).to(dt)
        block = data.source[start:stop]
        if not torch.is_tensor(block):
            block = torch.from_numpy(np.ascontiguousarray(block))
        return block.to(device=self.device, dtype=dt)

    def take(self, idx: torch.Tensor) -> torch.Tensor:
        if self.X is not None:
            return self.X.index_select(0, idx.to(self.X.device))
        return self.data.take(idx).to(self.basis.input_dtype)

    def gradient(self, beta: torch.Tensor, smoothing: float, shift: Optional[torch.Tensor] = None,
                 intercept: Optional[torch.Tensor] = None) -> dict:
        """``f = Phi beta``, ``a* = a(f)``, ``w``, ``Phi^T a*`` and the pieces of the duality gap (``beta`` in
        the internal basis). With an ``intercept`` ``b`` (T,), the predictions are ``f + b`` and the same pass
        also gives ``v = Phi^T w`` (the Newton system's coupling of ``b`` to ``beta``), ``sum w``, ``sum a*``, and
        the gap is certified at ``a*`` shrunk onto ``sum a = 0`` (:func:`~joker_ext.intercept.feasible_dual`, whose
        ``Phi^T`` comes from the sums of its positive and negative parts): the returned ``A``."""
        n, T = self.Y.shape
        F = torch.empty(n, T, dtype=beta.dtype, device=beta.device)
        A, W = torch.empty_like(F), torch.empty_like(F)
        acc = torch.zeros_like(beta)
        # with an intercept: Phi^T a*_+ and Phi^T w
        acc_pos, acc_w = (None, None) if intercept is None else (torch.zeros_like(beta), torch.zeros_like(beta))
        bt = self.basis.right(beta)
        def dual_rows(lo, hi):  # a*, w of rows lo:hi from F
            Fs = F[lo:hi] if shift is None else F[lo:hi] - shift[lo:hi]
            if intercept is not None:
                Fs = Fs + intercept
            A[lo:hi], W[lo:hi] = self.loss.smoothed_dual(Fs, self.Y[lo:hi], self.c[lo:hi], smoothing)

        def accumulate(Gs, lo, hi):
            acc.addmm_(Gs.T, A[lo:hi])
            if intercept is not None:
                acc_pos.addmm_(Gs.T, A[lo:hi].clamp_min(0))
                acc_w.addmm_(Gs.T, W[lo:hi])

        for start, stop, Xc in self.chunks(self.grad_rows):
            G = self.basis.raw(Xc, out=self.buffer(stop - start, self.pass_dtype))
            if G.dtype == beta.dtype or not self.whole_chunk_duals:
                # each block of convert_rows rows (features in another dtype) goes through all the steps
                step = G.shape[0] if G.dtype == beta.dtype else self.convert_rows
                for s0, Gs in self._in_solver_dtype(G, step):
                    lo, hi = start + s0, start + s0 + Gs.shape[0]
                    F[lo:hi] = Gs @ bt
                    dual_rows(lo, hi)
                    accumulate(Gs, lo, hi)
            else:  # the two products each convert the chunk, a block at a time
                for s0, Gs in self._in_solver_dtype(G, self.convert_rows):
                    F[start + s0:start + s0 + Gs.shape[0]] = Gs @ bt
                dual_rows(start, stop)
                for s0, Gs in self._in_solver_dtype(G, self.convert_rows):
                    accumulate(Gs, start + s0, start + s0 + Gs.shape[0])
            del G, Gs
        if self.low:  # the copy in the solver dtype goes: the Hessian passes, most of a fit, do without it
            self._buffers.pop(beta.dtype, None)
        self.passes += 1

        def terms(lo, hi):
            Yb, Fb, Ab, cb = self.Y[lo:hi], F[lo:hi], A[lo:hi], self.c[lo:hi]
            if intercept is not None:
                return ((cb * self.loss.value(Yb, Fb + intercept)).sum(0), Ab.clamp_min(0).sum(0),
                        (-Ab).clamp_min(0).sum(0), W[lo:hi].sum(0))
            return ((cb * self.loss.value(Yb, Fb)).sum(0), self.loss.conj(Ab, Yb, cb).sum(0),
                    self.loss.fenchel_young(Yb, Fb, Ab, cb).sum(0))
        if intercept is not None:
            return self._certify_with_intercept(beta, F, A, W, acc, acc_pos, acc_w, _row_sums(terms, n))
        loss_terms, conj_terms, share = _row_sums(terms, n)
        acc, loss_terms, conj_terms, share = self.shards.sum_many(acc, loss_terms, conj_terms, share)
        PhiTA = self.basis.left(acc)
        primal = 0.5 * (beta * beta).sum(0) + loss_terms
        dual = 0.5 * (PhiTA * PhiTA).sum(0) + conj_terms
        return {"F": F, "A": A, "W": W, "grad": beta - PhiTA, "primal": primal, "dual": dual, "share": share}

    def residual(self, beta: torch.Tensor, smoothing: float, F_out: torch.Tensor) -> torch.Tensor:
        """``Phi^T a(f) - beta``, the negative gradient at ``beta`` (the internal basis, no intercept, no shift), with
        ``f = Phi beta`` written into ``F_out``: one pass with the gradient pass's accuracy (features in the solver
        dtype) that holds no n-vector besides ``F_out``. Refreshes the residual of :func:`_pcg`'s recurrence."""
        acc = torch.zeros_like(beta)
        bt = self.basis.right(beta)
        for start, stop, Xc in self.chunks(self.grad_rows):
            G = self.basis.raw(Xc, out=self.buffer(stop - start, self.pass_dtype))
            for s0, Gs in self._in_solver_dtype(G, G.shape[0] if G.dtype == beta.dtype else self.convert_rows):
                lo, hi = start + s0, start + s0 + Gs.shape[0]
                F_out[lo:hi] = Gs @ bt
                acc.addmm_(Gs.T, self.loss.smoothed_dual(F_out[lo:hi], self.Y[lo:hi], self.c[lo:hi], smoothing)[0])
            del G, Gs
        if self.low:
            self._buffers.pop(beta.dtype, None)
        self.passes += 1
        (acc,) = self.shards.sum_many(acc)
        return self.basis.left(acc) - beta

    def _certify_with_intercept(self, beta, F, A, W, acc, acc_pos, acc_w, sums) -> dict:
        """:meth:`gradient`'s result with an intercept, from its pass's products and row sums: the dual point
        ``a*`` shrunk onto ``sum a = 0`` and its objective (``Phi^T`` of it from ``Phi^T a*`` and ``Phi^T a*_+``)."""
        acc, acc_pos, acc_w, loss_terms, pos_sum, neg_sum, w_sum = self.shards.sum_many(acc, acc_pos, acc_w, *sums)
        scale_pos, scale_neg = feasible_scales(pos_sum, neg_sum)
        feasible = A.clamp_min(0) * scale_pos - (-A).clamp_min(0) * scale_neg
        PhiTA, PhiT_pos = self.basis.left(acc), self.basis.left(acc_pos)
        PhiT_feasible = PhiT_pos * scale_pos - (PhiT_pos - PhiTA) * scale_neg
        (conj_terms,) = self.shards.sum_many(_row_sums(
            lambda lo, hi: (self.loss.conj(feasible[lo:hi], self.Y[lo:hi], self.c[lo:hi]).sum(0),), self.Y.shape[0])[0])
        primal = 0.5 * (beta * beta).sum(0) + loss_terms
        dual = 0.5 * (PhiT_feasible * PhiT_feasible).sum(0) + conj_terms
        return {"F": F, "A": feasible, "W": W, "grad": beta - PhiTA, "primal": primal, "dual": dual,
                "grad_b": neg_sum - pos_sum, "v": self.basis.left(acc_w), "w_sum": w_sum}

    def _in_solver_dtype(self, G: torch.Tensor, step: int):
        """Yields ``(s0, G[s0:s0 + step])`` in the solver dtype (copied into a reused workspace when ``G`` is in
        another)."""
        for s0 in range(0, G.shape[0], step):
            Gs = G[s0:s0 + step]
            yield s0, Gs if Gs.dtype == self.dtype else self.buffer(Gs.shape[0], self.dtype).copy_(Gs)

    def transpose_product(self, A: torch.Tensor) -> torch.Tensor:
        """``Phi^T A`` in the internal basis and the solver dtype, summed over the processes (one pass: over the kept
        features once they are all kept in the solver dtype, the same chunks and numbers, else computing them)."""
        acc = torch.zeros(self.M, A.shape[1], dtype=self.dtype, device=self.device)
        if self._cache_full and not self.low:
            chunks = self._cached
        else:
            chunks = ((start, stop, self.basis.raw(Xc, out=self.buffer(stop - start, self.pass_dtype)).to(self.dtype))
                      for start, stop, Xc in self.chunks(self.grad_rows))
        for start, stop, G in chunks:
            acc.addmm_(G.T, A[start:stop])
        self.passes += 1
        return self.basis.left(self.shards.sum_(acc))

    def weights(self, W: torch.Tensor) -> torch.Tensor:
        """The curvatures in the dtype of the Hessian products."""
        return W.to(self.pass_dtype)

    def hessian_product(self, V: torch.Tensor, Wp: torch.Tensor, abort=None):
        """``(I + Phi^T W Phi) V`` and ``Phi V`` (``Wp`` from :meth:`weights`); None when ``abort()``
        turned true while the pass was being queued."""
        pd = self.pass_dtype
        Vt = self.basis.right(V).to(pd)
        # T = I, one dtype, one process: accumulate onto V directly
        plain = self.basis.kind == "generic" and not self.shards.distributed
        acc = V.clone() if plain else torch.zeros_like(V)
        PhiV = torch.empty(self.n, V.shape[1], dtype=V.dtype, device=V.device)
        for k, (start, stop, G) in enumerate(self._product_features()):
            if abort is not None and k % POLL_EVERY == 0 and abort():
                return None
            U = G @ Vt
            PhiV[start:stop] = U
            if plain:
                acc.addmm_(G.T, Wp[start:stop] * U)
            else:
                U.mul_(Wp[start:stop])
                acc.add_(G.T @ U)
            del G
        self.passes += 1
        if plain:
            return acc, PhiV
        self.shards.sum_(acc)
        return V + self.basis.left(acc), PhiV

    def _product_features(self):
        """Yields ``(start, stop, G)`` over the chunks of a Hessian product: computed into the shared workspace, or
        (``newton_cache``) kept from the first product, whose chunks are the same ones (the same numbers)."""
        if self._cache_full:
            yield from self._cached
            return
        pd = self.pass_dtype
        fill = self._cached is not None
        if fill:
            self._cached = []  # (a product abandoned half-way left a partial list)
        for start, stop, Xc in self.chunks(self.rows):
            G = self.basis.raw(Xc, out=None if fill else self.buffer(stop - start, pd))
            if fill:
                self._cached.append((start, stop, G))
            yield start, stop, G
        self._cache_full = fill

    def _mapped_features(self):
        """Yields ``(start, stop, G T)`` (the solver dtype) over the kept features, mapped on the first call and kept
        until :meth:`release_mapped`: ``n M`` numbers more than the kept features (at most
        :data:`~joker_ext.defaults.FEATURE_CACHE_BYTES` again, which :func:`joker_ext.memory.estimate_fit_memory`
        does not count; no memory budget plans a fit that takes this path), while the interior point forms
        ``Phi^T E Phi`` at every iterate, and for the rest of the fit once :attr:`accurate_hessian` is set."""
        if self._mapped is None:
            self._mapped = list(self._kept_rows())
        yield from self._mapped

    def release_mapped(self) -> None:
        """Frees the chunks of :meth:`_mapped_features` (kept while :attr:`accurate_hessian` asks for them)."""
        if not self.accurate_hessian:
            self._mapped = None

    @property
    def keeps_features(self) -> bool:
        """Whether the Hessian products' features are kept (``newton_cache``): then one pass forms
        :class:`ExactHessian`."""
        return self._cached is not None

    def kept_product(self, V: torch.Tensor) -> torch.Tensor:
        """``Phi V`` (``V`` in the internal basis, M x k) from the kept features (:attr:`keeps_features`)."""
        Vt = self.basis.right(V).to(self.pass_dtype)
        out = torch.empty(self.n, V.shape[1], dtype=self.dtype, device=self.device)
        for start, stop, G in self._product_features():
            out[start:stop] = G @ Vt
        self.passes += 1
        return out

    def _kept_rows(self):
        """Yields ``(start, stop, Phi[start:stop])`` (the internal basis, the solver dtype) over the kept features:
        ``G T`` (:meth:`_Basis.features`)."""
        for start, stop, G in self._product_features():
            yield start, stop, self.basis.features(G.to(self.dtype))

    def kept_matrix(self) -> torch.Tensor:
        """``Phi`` (``n x M``, the internal basis, the solver dtype) assembled from the kept features."""
        out = torch.empty(self.n, self.M, dtype=self.dtype, device=self.device)
        for start, stop, rows in self._kept_rows():
            out[start:stop] = rows
        return out

    def feature_norms(self) -> torch.Tensor:
        """``|phi_i|^2`` for every row (the diagonal of ``Phi Phi^T``), from the kept features."""
        out = torch.empty(self.n, dtype=self.dtype, device=self.device)
        for start, stop, rows in self._kept_rows():
            out[start:stop] = (rows * rows).sum(1)
        self.passes += 1
        return out

    def gram_factor(self, w: torch.Tensor) -> Optional[ExactHessian]:
        """``I + Phi^T diag(w) Phi``, factored (:class:`ExactHessian`; None when it cannot be factored)."""
        factored = self.exact_hessian(w.unsqueeze(1), 0, shift=False, accurate=True)
        return factored if factored.L is not None else None

    def exact_hessian(self, W: torch.Tensor, t: int, shift: bool = True, accurate: bool = False) -> ExactHessian:
        """:class:`ExactHessian` for column ``t`` of the curvatures ``W`` from :meth:`_weighted_gram`. Nystrom
        features ``Phi = G R^{-1}``: ``R^{-T} (G^T W G) R^{-1}``, two triangular solves of ``M x M``; where that
        cannot be factored, or where the solves must be ``accurate`` (the interior point's Woodbury solves),
        ``Phi^T W Phi`` from the features themselves (``G R^{-1}`` row by row, ``|band| M^2`` flops more). The first
        multiplies the rounding of ``G^T W G`` by ``|R^{-1}|^2``, which is large where ``K_ZZ`` is near singular (a
        wide kernel: eigenvalues down to 1e-10): the sum was then no longer positive definite and the Newton steps
        went unpreconditioned (JokerFalkon, absolute and epsilon-insensitive losses, n = 2600-5400, M = 340-980,
        penalties 1e-8 to 2e-7: gaps of 0.13-1.7 after the default 20 iterations), and the interior point's
        directions drifted (epsilon-insensitive, n = 20,000, M = 1000, penalty 1e-8: a gap of 5.6e-4 after 20
        iterations against 5.3e-6). As a preconditioner it mostly serves (one conjugate-gradient step per Newton
        step there) at two thirds of the cost; after a Newton step whose line search failed the engine sets
        :attr:`accurate_hessian` (Huber, n = 1500, M = 300, penalty 5e-9, a wide kernel: 'stalled' at a gap of 8e-6
        without). ``shift``: as :class:`ExactHessian`'s."""
        w = W[:, t]
        if self.basis.kind != "nystrom":
            return ExactHessian(self._weighted_gram(w), self.basis.scale if self.basis.kind == "random" else 1.0,
                                shift=shift)
        if not (accurate or self.accurate_hessian):
            gram = self.basis.left(self.basis.left(self._weighted_gram(w)).mT)  # T^T (G^T W G) T, T = R^{-1}
            hessian = ExactHessian(0.5 * (gram + gram.mT), 1.0)
            if hessian.L is not None:
                return hessian
        return ExactHessian(self._weighted_gram(w, mapped=True), 1.0, shift=shift)

    def _weighted_gram(self, w: torch.Tensor, mapped: bool = False) -> torch.Tensor:
        """``G^T diag(w) G`` (``mapped``: ``(G T)^T diag(w) (G T)``, :meth:`_Basis.features`) summed in the solver
        dtype over the rows with ``w_i != 0`` and the processes (``2 |band| M^2`` flops; the kinked losses' band
        shrinks with the smoothing), from the kept features, else from a pass, or, for a band of at most
        :data:`BAND_ROWS_SHARE` of the rows, from the band's features alone."""
        gram = torch.zeros(self.M, self.M, dtype=self.dtype, device=self.device)
        band = torch.nonzero(w).reshape(-1)  # the rows with curvature (kinked losses: the smoothing's band)
        # the kept chunks, mapped once (_mapped_features), where the rows with curvature are many
        premapped = mapped and self._cache_full and band.numel() > BAND_ROWS_SHARE * self.n

        def add(Gd, weights):
            Gd = Gd.to(self.dtype)
            if mapped and not premapped:
                Gd = self.basis.features(Gd)
            gram.addmm_(Gd.T, Gd * weights.unsqueeze(1))

        if self._cache_full or band.numel() > BAND_ROWS_SHARE * self.n:
            for start, stop, G in (self._mapped_features() if premapped else self._product_features()):
                rows = torch.nonzero(w[start:stop]).reshape(-1)
                if rows.numel():
                    add(G if rows.numel() == stop - start else G.index_select(0, rows), w[start + rows])
        else:  # the band's features alone
            for s0 in range(0, band.numel(), self.grad_rows):
                rows = band[s0:s0 + self.grad_rows]
                add(self.basis.raw(self.take(rows)), w[rows])
        self.passes += 1
        self.shards.sum_(gram)
        return gram

    def sample_features(self, sample: torch.Tensor):
        """Yields ``(positions in sample, G of those rows)`` over the sampled rows, in the solver dtype."""
        rows = max(1, self.grad_rows // 2)  # (its features and their copy in the solver dtype live at once)

        def gen():
            for s0 in range(0, sample.numel(), rows):
                pos = torch.arange(s0, min(s0 + rows, sample.numel()), device=sample.device)
                yield pos, self.basis.raw(self.take(sample[pos])).to(self.dtype)
        return gen

    def preconditioner(self, sample: torch.Tensor, w_sample: torch.Tensor, n_sample: int, rank: int, gen):
        """Nystrom features: :class:`CentersPreconditioner`. Otherwise the randomized Nystrom sketch, in the
        solver dtype: a float32 sketch (its rounding and its larger shift) was measured to cost CG
        iterations, while the sketch's rows are few. So is its factor ``U``: stored in float32 it cost 21 -> 25
        CG products on flights at M = 20,000 on an H200 and 21 -> 27 on the CPU at M = 5000 (``I - U U^T`` must
        damp the top directions, eigenvalues up to ``1e6``, to about their inverse, below float32's rounding).
        ``sample`` holds this process's rows of a global sample of ``n_sample`` rows."""
        if self.basis.kind == "nystrom":
            (w_sum,) = self.shards.sum_many(w_sample.sum().reshape(1))
            return CentersPreconditioner(self.basis.R, float(w_sum) / n_sample, self.n_total)
        self._buffers.clear()  # the passes' workspaces, free while the sketch's M x r buffers live
        scale, right, left = self.n_total / n_sample, self.basis.right, self.basis.left
        if self.basis.kind == "random":  # T = s I: fold s^2 into the scale instead of scaling M x r matrices
            scale, right, left = scale * self.basis.scale ** 2, None, None
        elif self.basis.kind == "generic":
            right = left = None
        return NystromPreconditioner.sketch(self.sample_features(sample), w_sample, self.M, rank, scale, gen,
                                            right=right, left=left,
                                            reduce=self.shards.sum_ if self.shards.distributed else None)


def _apply(precond, R: torch.Tensor) -> torch.Tensor:
    if len(precond) == 1:
        return precond[0].apply(R[:, 0]).unsqueeze(1)
    return torch.stack([precond[t].apply(R[:, t]) for t in range(R.shape[1])], dim=1)


def _pcg(passes: _Passes, grad, W, precond, eta, max_cg: int, still_open=None, refresh=None, out_of_time=None):
    """Solve ``(I + Phi^T W Phi) D = -grad`` column by column in lockstep; returns ``(D, Phi D)``.

    No host synchronisation inside the loop: a column stops moving (zero step) once its residual is below
    ``eta ||grad||`` (``eta`` a number, or a tensor with one per column) or ``still_open(D, Phi D, R)`` (a boolean
    per column, computed on the device; see :func:`_gap_test`) turns false; whether any column still moves is read
    back one iteration late (:class:`_Flags`), and a product queued after the last useful iteration is abandoned as
    soon as that is known. The loop also ends once ``out_of_time()`` is true (read at the same points).

    ``refresh(D, Z)``, when given, returns the true residual at the iterate and writes ``Phi D`` into ``Z`` (one
    pass in the solver dtype). It replaces the recurrence's residual ``R`` (the search direction stays: van der
    Vorst and Ye's residual replacement) once ``R`` has fallen below :data:`REFRESH_DROP` times its norm at the
    last fresh one, that fall read back one iteration late like the flags. Hessian products in float32 leave in
    ``R`` an error of about float32's rounding times the norm of the first residual, which a quadratic's gap
    test (:func:`_gap_test`) would otherwise read as a gap that never falls below about 1e-6, or as one that
    has closed where the true gap is 1e-5.
    """
    T = grad.shape[1]
    D = torch.zeros_like(grad)
    Z = torch.zeros(passes.n, T, dtype=grad.dtype, device=grad.device)
    R = -grad
    Zr = _apply(precond, R)
    P = Zr.clone()
    rz = (R * Zr).sum(0)
    gnorm = grad.norm(dim=0)
    target = eta * gnorm
    active = gnorm > 0
    Wp = passes.weights(W)
    steps = max(1, max_cg)
    flags = _Flags(grad.device, steps + 1)
    flags.post(0, active)
    if not flags.wait(0):
        return D, Z
    # fallen[k]: the residual after k products is below REFRESH_DROP times the last fresh one's
    fallen, fresh_norm, refreshed = (_Flags(grad.device, steps + 1), gnorm, 0) if refresh is not None else (None,) * 3
    for j in range(steps):
        # flag j-1 (is anything still moving after j-1 products?): on a GPU, iteration j-1 is queued behind it
        if j >= 2 and (not flags.wait(j - 1) or (out_of_time is not None and out_of_time())):
            break
        # (a fall posted before the last refresh measured against the residual it replaced)
        if fallen is not None and j - 1 > refreshed and fallen.wait(j - 1):
            R = refresh(D, Z)
            Zr = _apply(precond, R)
            rz = (R * Zr).sum(0)
            fresh_norm, refreshed = R.norm(dim=0), j
        # (with several processes every product is finished: a product is also an all-reduce)
        abort = (lambda j=j: flags.ready(j) is False) if j >= 1 and not passes.shards.distributed else None
        out = passes.hessian_product(P, Wp, abort=abort)
        if out is None:
            break
        HP, PhiP = out
        pHp = (P * HP).sum(0)
        step = torch.where(active & (pHp > 0), rz / torch.where(pHp > 0, pHp, torch.ones_like(pHp)),
                           torch.zeros_like(pHp))
        D.add_(step * P)
        Z.addcmul_(PhiP, step)  # (no n-vector temporary)
        out = PhiP = None
        R.sub_(step * HP)
        r_norm = R.norm(dim=0)
        active = active & (r_norm > target)
        if still_open is not None:
            active = active & still_open(D, Z, R)
        flags.post(j + 1, active)
        if fallen is not None:
            fallen.post(j + 1, active & (r_norm < REFRESH_DROP * fresh_norm))
        Zr = _apply(precond, R)
        rz_new = (R * Zr).sum(0)
        P = Zr + torch.where(rz > 0, rz_new / torch.where(rz > 0, rz, torch.ones_like(rz)), torch.zeros_like(rz)) * P
        rz = rz_new
    return D, Z


def _bordered_step(passes: _Passes, g: dict, precond, eta: float, max_cg: int, floor: float):
    """The Newton step ``(D, Phi D, db)`` on ``(beta, b)`` from :meth:`_Passes.gradient`'s result ``g`` (with an
    intercept): ``[[H, v], [v^T, sum w]] [D; db] = -[grad; dP/db]`` by its Schur complement,
    ``D = X_1 - X_2 db``, ``db = (-dP/db - v^T X_1) / (sum w - v^T X_2)``, with ``X_1 = -H^{-1} grad`` and
    ``X_2 = H^{-1} v`` from one conjugate-gradient run on both (each column keeps its preconditioner), ``X_1`` to
    the relative residual ``eta`` and ``X_2`` to ``eta^2``, but not below ``floor`` (the tightest the run resolves)
    unless ``eta`` is."""
    T = g["grad"].shape[1]
    # the Schur complement sum w - v^T H^{-1} v is a difference of nearly equal terms (the features nearly hold the
    # constant), so the column of v is solved to eta^2: at eta its error swung db from step to step (random
    # features, logistic, n = 30,000, M = 2000, C = 100, the sketch alone: 93 Newton iterations, 336 s -> 11, 47 s)
    dtype, device = g["grad"].dtype, g["grad"].device
    etas = torch.cat([torch.full((T,), eta, dtype=dtype, device=device),
                      torch.full((T,), min(eta, max(eta * eta, floor)), dtype=dtype, device=device)])
    X, Z = _pcg(passes, torch.cat([g["grad"], -g["v"]], 1), torch.cat([g["W"], g["W"]], 1), precond + precond,
                etas, max_cg)
    v = g["v"]
    schur = g["w_sum"] - (v * X[:, T:]).sum(0)
    curved = schur > 0  # (else no row has curvature: the caller moves b alone, _intercept_minimiser)
    db = torch.where(curved, (-g["grad_b"] - (v * X[:, :T]).sum(0)) / torch.where(curved, schur, 1.0), 0.0)
    return X[:, :T] - X[:, T:] * db, Z[:, :T] - Z[:, T:] * db, db, ~curved


def _intercept_minimiser(loss: Loss, Y, c_col, F, b: torch.Tensor, shards: SingleProcess) -> torch.Tensor:
    """``argmin_b sum_i c_i l(y_i, f_i + b)`` per column (``beta`` fixed: ``F = Phi beta``), from ``b``: the root of
    the nondecreasing ``dP/db = -sum_i a_i(f_i + b)``, bracketed by doubling steps, then bisected to float's
    resolution (O(n) per trial)."""
    out = b.clone()
    for t in range(Y.shape[1]):
        def slope(value: float) -> float:
            a, _ = loss.smoothed_dual(F[:, t:t + 1] + value, Y[:, t:t + 1], c_col[:, t:t + 1], 0.0)
            (total,) = shards.sum_many(a.sum().reshape(1))
            return -float(total)

        b0, s0 = float(b[t]), slope(float(b[t]))
        if s0 == 0.0:
            continue
        direction, step = (-1.0 if s0 > 0 else 1.0), max(1.0, abs(b0))
        near, far = b0, b0 + direction * step
        for _ in range(INTERCEPT_BRACKET):  # until dP/db changes sign between near and far
            s_far = slope(far)
            if (s_far > 0) != (s0 > 0) or s_far == 0.0:
                break
            near, step = far, 2.0 * step
            far = b0 + direction * step
        lo, hi = min(near, far), max(near, far)
        for _ in range(INTERCEPT_BISECTIONS):
            mid = 0.5 * (lo + hi)
            if not lo < mid < hi:
                break
            if slope(mid) > 0:
                hi = mid
            else:
                lo = mid
        out[t] = 0.5 * (lo + hi)
    return out


#: The keys of the engine's state that only checkpoints keep (for a resume; not the result's): the continuation's
#: smoothing and centre, and the interior start's marker.
CHECKPOINT_ONLY = ("continuation", "center", "interior_start")


def _newton_state(basis, beta: torch.Tensor, b: Optional[torch.Tensor], level: torch.Tensor,
                  continuation=None) -> dict:
    """The engine's state: the weights in the external basis, the intercept ``b + level`` when one is fitted (``b``
    that of the targets less ``level``), and with ``continuation = (smoothing, s0, centre, warm_finish)`` the kinked
    losses' continuation (checkpoints resume it: :func:`_resumed_continuation`)."""
    state = {"beta": basis.to_external(beta)}
    if b is not None:
        state["intercept"] = b + level
    if continuation is not None:
        smoothing, s0, center, warm_finish = continuation
        state["continuation"] = torch.tensor([smoothing.value, s0, float(warm_finish)], dtype=beta.dtype,
                                             device=beta.device)
        state["center"] = center
    return state


def _resumed_continuation(state0: Optional[dict], s0: float, shape) -> Optional[tuple]:
    """``(smoothing, centre, warm_finish)`` of a checkpoint's continuation (:func:`_newton_state`), when it holds one
    of this problem: the same starting smoothing ``s0 = sum c / n`` (so the same ``C`` and weights) and a centre of
    this process's ``shape``; None otherwise (a checkpoint of another problem, or of a fit whose continuation had
    not started: the continuation then starts over, centred at the checkpoint's dual point)."""
    if not state0 or "continuation" not in state0 or "center" not in state0:
        return None
    value, saved_s0, warm_finish = (float(v) for v in state0["continuation"])
    center = state0["center"]
    if tuple(center.shape) != tuple(shape) or not math.isclose(saved_s0, s0, rel_tol=1e-12) or value <= 0:
        return None
    return value, center, bool(warm_finish)


def fits_intercept(loss: Loss) -> bool:
    """Whether :func:`feature_newton` fits the intercept itself for ``loss``: losses that need no smoothing
    (:func:`~joker_ext.smoothing.smooth_for_any_targets`); the kinked ones get it from the intercept search."""
    return smooth_for_any_targets(loss)


def constant_curvature(loss: Loss, Y: torch.Tensor, c_col: torch.Tensor) -> bool:
    """True when the primal is a quadratic of ``beta`` (the squared loss and its rescalings): ``psi``
    quadratic with ``psi'' > 0``, no kink and an unbounded box, so that ``w`` does not depend on ``f``."""
    if not loss.quadratic or loss.kink:
        return False
    lo, hi = loss.box(Y, c_col)
    return bool(torch.isinf(lo).all() and torch.isinf(hi).all() and (loss.psi_hess(torch.zeros_like(Y), Y, c_col)
                                                                    > 0).all())


def _residual_refresh(passes: _Passes, beta, F, smoothing: float):
    """``refresh(D, Z)`` for :func:`_pcg` from the Newton iterate ``beta`` and its predictions ``F``: the residual at
    ``beta + D`` from :meth:`_Passes.residual`, ``Z`` overwritten by ``Phi D``."""
    def refresh(D, Z):
        R = passes.residual(beta + D, smoothing, Z)
        Z.sub_(F)
        return R
    return refresh


def _gap_test(loss: Loss, Y, c_col, beta, F, tol: float, shards: SingleProcess, observe=None):
    """``still_open(D, Z, R)`` for :func:`_pcg` on a quadratic primal: the relative duality gap at
    ``beta + D`` is above ``tol``, computed in O(n + M) without a pass.

    On a quadratic the CG residual is the negative gradient at the iterate, ``R = Phi^T a(f) - (beta + D)``
    with ``f = F + Z``, so ``Phi^T a(f) = beta + D + R`` and the certificate ``P(beta + D) + D(a(f))`` needs
    no product with ``Phi``. (The residual is the recurrence's: the next Newton iteration's gradient pass
    certifies the gap from scratch.)

    ``observe(b, primal, dual, dual_point)``, when given, sees every iterate's certificate (:class:`_InnerReports`;
    ``dual_point()`` evaluates ``a(f)``); when it returns True every column closes.
    """
    def still_open(D, Z, R):
        b = beta + D
        primal, dual = _quadratic_certificate(loss, Y, c_col, b, F, Z, R, shards)
        is_open = primal + dual > tol * torch.maximum(primal.abs(), dual.abs())
        if observe is not None and observe(b, primal, dual, lambda: loss.smoothed_dual(F + Z, Y, c_col)[0]):
            is_open = torch.zeros_like(is_open)
        return is_open
    return still_open


def _quadratic_certificate(loss: Loss, Y, c_col, b, F, Z, R, shards: SingleProcess):
    """``(primal, dual)`` per column at the weights ``b`` with ``f = Phi b = F + Z`` and the dual point ``a = a(f)``
    of a quadratic primal, where the CG residual gives ``Phi^T a = b + R`` (see :func:`_gap_test`): O(n + M), its
    temporaries blocks of :data:`GAP_ROWS` rows."""
    def terms(lo, hi):
        Yb, cb = Y[lo:hi], c_col[lo:hi]
        f = F[lo:hi] + Z[lo:hi]
        a, _ = loss.smoothed_dual(f, Yb, cb)
        return (cb * loss.value(Yb, f)).sum(0), loss.conj(a, Yb, cb).sum(0)
    loss_terms, conj_terms = shards.sum_many(*_row_sums(terms, Y.shape[0]))
    primal = 0.5 * (b * b).sum(0) + loss_terms
    phi_a = b + R
    dual = 0.5 * (phi_a * phi_a).sum(0) + conj_terms
    return primal, dual


class _InnerReports:
    """Hands the callback the iterate of the quadratic path's conjugate gradients every ``every`` CG iterations
    (``SolverOptions.callback_cg_every``), as the ``observe`` of :func:`_gap_test`, which :func:`_pcg` calls after
    each of them with the certificate it computes anyway. Each report synchronises with the device (the callback
    reads the iterate). Once a report asks to stop, every column closes, and :attr:`stop` holds the reason (agreed
    by all processes) for the engine to act on after the next certificate. The engine sets :attr:`iteration`, the
    Newton iteration the run belongs to."""

    def __init__(self, every: int, mon: Monitor, basis, shards: SingleProcess, passes):
        self.every, self.mon, self.basis, self.shards, self.passes = every, mon, basis, shards, passes
        self.iteration = 0
        self.total = 0  # CG iterations of the fit so far
        self.stop: Optional[str] = None
        self.last = -1  # ``total`` at the last report

    def __call__(self, b, primal, dual, dual_point) -> bool:
        self.total += 1
        if self.stop is None and self.total % self.every == 0:
            self.last = self.total
            p, d = float(primal.sum()), float(dual.sum())
            self.stop = self.shards.agree(self.mon.report_inner(
                self.iteration, p, d, p + d, {"beta": self.basis.to_external(b)}, dual_point(),
                passes=self.passes.passes, cg_iterations=self.total))
        return self.stop is not None


def _line_search(loss: Loss, Y, c_col, beta, D, F, Z, grad, smoothing: float,
                 shards: SingleProcess, shift: Optional[torch.Tensor] = None, slope_b: float = 0.0) -> Optional[float]:
    """Step length on ``phi(t) = P_s(beta + t D)`` (every trial O(n): ``Phi (beta + t D) = F + t Z``): the whole
    step where it meets Armijo's condition, else the minimiser of the convex ``phi`` on ``(0, 1)``, found by
    regula falsi on ``phi'(t) = beta^T D + t D^T D - a(F + t Z)^T Z`` (``a`` the smoothed dual point: the
    primal's gradient in ``f`` is ``-a``), else Armijo's halving. With an intercept step ``db``, ``F`` and ``Z``
    hold ``b`` and ``db`` and ``slope_b = (dP/db) db`` completes the slope (``b`` is not penalised).

    The minimiser replaced the halving as the first fallback: on a piecewise-quadratic primal (Huber, the squared
    hinge, the smoothed kinked losses) whose curvature changes on many rows along the step, halving took steps of
    1/4 to 1/8 for a dozen iterations (JokerFalkon, Huber, n = 1500, M = 300, penalty 5e-9, a wide kernel: 14 of
    its 17 iterations at a relative gap of 1.0)."""
    slope = float((grad * D).sum()) + slope_b
    if not slope < 0:
        return None
    bb, bd, dd = float((beta * beta).sum()), float((beta * D).sum()), float((D * D).sum())

    def at(t):
        """``(phi(t), phi'(t))``."""
        def terms(lo, hi):
            f = F[lo:hi] + t * Z[lo:hi]
            if shift is not None:
                f = f - shift[lo:hi]
            Yb, cb = Y[lo:hi], c_col[lo:hi]
            a, _ = loss.smoothed_dual(f, Yb, cb, smoothing)
            return (loss.smoothed_value(f, Yb, cb, a, smoothing).sum().reshape(1), (a * Z[lo:hi]).sum().reshape(1))
        total, aZ = shards.sum_many(*_row_sums(terms, Y.shape[0]))
        return 0.5 * (bb + 2 * t * bd + t * t * dd) + float(total), bd + t * dd - float(aZ)

    def armijo(t, value):
        return math.isfinite(value) and value - p0 <= ARMIJO * t * slope

    p0, _ = at(0.0)
    p1, d1 = at(1.0)
    # the whole step: Armijo's decrease, or phi' still <= 0 at 1 (phi convex: it falls all the way), or a change of
    # phi within its rounding (near the optimum the values no longer resolve the decrease; a Newton step is then
    # taken whole: trials of 1e-7 to 0.4 left Huber's gap bouncing between 1e-6 and 1e-4)
    if armijo(1.0, p1) or (math.isfinite(d1) and d1 <= 0) or abs(p1 - p0) <= LINE_SEARCH_NOISE * abs(p0):
        return 1.0
    if math.isfinite(d1) and d1 > 0:
        # regula falsi (Illinois) on phi' over [0, 1], where it goes from slope < 0 to d1 > 0
        lo, d_lo, hi, d_hi, side = 0.0, slope, 1.0, d1, 0
        best = None
        for _ in range(LINE_SEARCH_STEPS):
            t = (lo * d_hi - hi * d_lo) / (d_hi - d_lo)
            if not lo < t < hi:
                t = 0.5 * (lo + hi)
            value, deriv = at(t)
            if armijo(t, value) and (best is None or value < best[1]):
                best = (t, value)
            if deriv <= 0:
                lo, d_lo = t, deriv
                if side == -1:
                    d_hi *= 0.5
                side = -1
            else:
                hi, d_hi = t, deriv
                if side == 1:
                    d_lo *= 0.5
                side = 1
            if hi - lo <= LINE_SEARCH_WIDTH * hi or abs(deriv) <= LINE_SEARCH_WIDTH * abs(slope):
                break
        if best is not None:  # the lowest trial that meets Armijo's condition
            return best[0]
        if lo > 0:  # phi' <= 0 on [0, lo]: phi fell all the way there
            return lo
    t = 0.5
    for _ in range(MAX_HALVINGS):
        value, _ = at(t)
        if armijo(t, value):
            return t
        t *= 0.5
    return None


class _BestCertificate:
    """The iterate with the smallest relative gap so far, and whether the fit should stop: its gap is at the
    rounding floor (:func:`~joker_ext.engines.at_rounding_floor`) and has not halved for ``FLOOR_PATIENCE`` records.

    Kinked losses reach the floor while the smoothing is still shrinking; going on, the dual point ``a*`` of ever
    less smoothed problems jumps between the subgradients at the kinks and its certificate degrades (absolute loss,
    C = 1000, n = 80, M = 40: 1.2e-12 at iteration 37, back to 1.09 by iteration 83)."""

    def __init__(self, tol: float, dtype: torch.dtype):
        self.tol, self.dtype = tol, dtype
        self.rec = self.alpha = self.state = None
        self.halved_at = math.inf  # the best gap when it last halved
        self.stalls = 0

    def update(self, rec: dict, alpha: torch.Tensor, state: dict) -> bool:
        rel = rec["rel_gap"]
        if self.rec is None or rel < self.rec["rel_gap"]:
            self.rec, self.alpha, self.state = rec, alpha, state
        # a gap of zero (or below, by rounding: a finishing step's exact solution) does not halve again
        if max(rel, 0.0) < 0.5 * self.halved_at:
            self.halved_at, self.stalls = max(rel, 0.0), 0
            return False
        if not at_rounding_floor(self.rec["rel_gap"], self.tol, self.dtype):
            return False
        self.stalls += 1
        return self.stalls >= FLOOR_PATIENCE


def _prefer_best(best: _BestCertificate, last: dict, status: str, tol: float, dtype: torch.dtype) -> bool:
    """Whether the fit returns its best certificate instead of its last iterate: the best gap is smaller, and either
    it is at the rounding floor (the iterations went on below the floor, where the smoothed problems' dual points
    can only lose their certificate) or its primal objective is no larger (the model is as good). Far from the
    optimum the relative gap is about 1 and says little: a budget stop inside the squared loss's single CG run has a
    far better model than the start at a slightly larger relative gap (1 + 1e-5 against 1 + 1e-6), and returned
    the start. A stop the user asked for (callback, interrupt) keeps the iterate it was asked at."""
    if best.rec is None or status in ("callback", "interrupted") or not best.rec["rel_gap"] < last["rel_gap"]:
        return False
    return at_rounding_floor(best.rec["rel_gap"], tol, dtype) or best.rec["primal"] <= last["primal"]


def _active_set_point(passes: "_Passes", a, free, box, beta_fixed, kink: float):
    """The exact solution of one column's problem for the active sets that its dual point ``a`` shows, or None (see
    :func:`_finish`; ``free``: its free coordinates, ``box = (lo, hi, target, h)`` with ``target = y - p0``,
    ``beta_fixed = Phi^T a_N``).

    With the fixed coordinates ``a_N`` of ``a`` (at a bound, or at the kink), the free ones solve the optimality
    conditions of the free rows, ``phi_i^T beta = y_i - psi'(a_i) - kink sign_i`` (``psi'(a) = p0 + h a``: the losses
    with ``loss.quadratic``), where ``beta = Phi^T a_N + Phi_F^T a_F``::

        (Phi_F Phi_F^T + diag(h_F)) a_F = y_F - p0_F - kink sign_F - Phi_F Phi^T a_N

    (``|F| x |F|``, one Cholesky factorisation). Free coordinates whose solution leaves the box (or crosses the kink)
    are fixed where they left it and the others solved again, up to :data:`FINISH_ROUNDS` times. None when a
    factorisation fails or the rounds run out."""
    lo, hi, target, h = box
    F = torch.nonzero(free).reshape(-1)
    m = F.numel()
    P = passes.basis.left(passes.basis.raw(passes.take(F)).to(passes.dtype).mT.contiguous())  # Phi_F^T, M x m
    H = P.mT @ P
    H.diagonal().add_(h[F])
    sgn = torch.sign(a[F]) if kink else torch.ones_like(a[F])
    rhs = target[F] - kink * sgn - P.mT @ beta_fixed
    lo_F, hi_F = lo[F], hi[F]
    a_F = torch.zeros_like(rhs)  # the coordinates fixed on the way hold their value; the open ones are solved for
    open_ = torch.ones(m, dtype=torch.bool, device=a.device)
    for _ in range(FINISH_ROUNDS):
        k = torch.nonzero(open_).reshape(-1)
        L, info = cholesky_ex(H.index_select(0, k).index_select(1, k))
        if int(info) != 0:
            return None
        x = cholesky_solve((rhs[k] - H.index_select(0, k) @ a_F).unsqueeze(1), L)[:, 0]
        below, above = x < lo_F[k], x > hi_F[k]
        crossed = (x * sgn[k] < 0) & ~below & ~above if kink else torch.zeros_like(below)
        if not bool((below | above | crossed).any()):
            a_F[k] = x
            out = torch.where(free, torch.zeros_like(a), a)
            out[F] = a_F
            return beta_fixed + P @ a_F, out
        a_F[k[below]] = lo_F[k[below]]
        a_F[k[above]] = hi_F[k[above]]
        open_[k[below | above | crossed]] = False  # a crossed coordinate rests at the kink (its a_F stays 0)
    return None


def _finish(passes: "_Passes", loss: Loss, Y, c_col, beta, center, g: dict, smoothing: float):
    """The continuation's finishing step, tried each time a smoothed problem is solved: every column's
    :func:`_active_set_point` for the sets of its dual solution ``center``, for the columns with 1 to M free
    coordinates (more make ``Phi_F Phi_F^T`` singular); one pass gives every column's ``Phi^T a_N``. A column takes it
    where the duality gap of the original problem there (one gradient pass, with the smoothing centred at the new
    dual point) is no larger than at the smoothed solution (``g``). Returns ``(beta, center, g)``, ``g`` the pass
    at the new point or None when some columns kept theirs; None when no column took it."""
    zeros = torch.zeros_like(Y)
    lo, hi = loss.box(Y, c_col)
    target, h = Y - loss.psi_grad(zeros, Y, c_col), loss.psi_hess(zeros, Y, c_col)
    kink = float(loss.kink)
    free = _free_coordinates(center, lo, hi, kink)
    sizes = free.sum(0)
    tried = (sizes > 0) & (sizes <= passes.M)
    if not bool(tried.any()):
        return None
    beta_fixed = passes.transpose_product(torch.where(free, zeros, center))
    beta_new, center_new = beta.clone(), center.clone()
    for t in torch.nonzero(tried).reshape(-1).tolist():
        point = _active_set_point(passes, center[:, t], free[:, t], (lo[:, t], hi[:, t], target[:, t], h[:, t]),
                                  beta_fixed[:, t], kink)
        if point is None:
            tried[t] = False
        else:
            beta_new[:, t], center_new[:, t] = point
    if not bool(tried.any()):
        return None
    g_new = passes.gradient(beta_new, smoothing, smoothing * center_new / c_col)
    better = tried & ((g_new["primal"] + g_new["dual"]) <= (g["primal"] + g["dual"]))
    if bool(better.all()):
        return beta_new, center_new, g_new
    if not bool(better.any()):
        return None
    return torch.where(better, beta_new, beta), torch.where(better, center_new, center), None


def _free_coordinates(a, lo, hi, kink: float) -> torch.Tensor:
    """Which coordinates of the dual point ``a`` are free: strictly inside their box and, with a kink, off it."""
    free = (a > lo) & (a < hi)
    return free & (a != 0) if kink else free


def _fix_excess(a, lo, hi, kink: float, most: int):
    """``a`` with at most ``most`` free coordinates: beyond, those nearest (relative to their box's width) to a bound or
    to the kink inside the box are fixed there (an interior-point iterate near the solution holds a few degenerate
    coordinates, at a bound and on the margin, among its free ones; the finishing step's system has room for ``M``)."""
    free = _free_coordinates(a, lo, hi, kink)
    excess = int(free.sum()) - most
    if excess <= 0:
        return a
    width = (hi - lo).clamp_min(torch.finfo(a.dtype).tiny)
    targets = [lo, hi] + ([torch.where((lo < 0) & (hi > 0), torch.zeros_like(a), lo)] if kink else [])
    distance = torch.stack([(a - v).abs() / width for v in targets])
    nearest, which = distance.min(0)
    idx = torch.nonzero(free).reshape(-1)
    fix = idx[torch.topk(nearest[idx], excess, largest=False).indices]
    out = a.clone()
    out[fix] = torch.stack(targets)[which[fix], fix]
    return out


class _Abandoned(NamedTuple):
    """What :func:`_interior_start` returns when it gives up: the iterations it recorded."""
    iterations: int


def _interior_start(passes: "_Passes", loss: Loss, Y, c_col, tol: float, record):
    """The kinked losses' start (:mod:`joker_ext.feature_interior`): each column's dual by the interior point, finished
    on its active sets (:func:`_active_set_point`) as soon as that point's duality gap meets ``tol``.

    Every open column advances by one iterate per iteration, after which ``record(iterations, alpha, beta, primal,
    dual)`` is called (the certificate of the original problem at ``(beta = Phi^T alpha, alpha)``, per column) and
    returns a stop reason or None.
    Returns ``(alpha, beta, iterations, reason)``: ``alpha`` the finished dual points or the active sets of the last
    (interior) ones, ``beta`` their weights in the internal basis; None where the interior point is no good start
    (:func:`~joker_ext.feature_interior.worth_starting`); :class:`_Abandoned` where a column's iterates went back up
    far from the solution, or stalled far from it (:data:`~joker_ext.feature_interior.ABANDON_RISE`)."""
    n, T = Y.shape
    zeros = torch.zeros_like(Y)
    lo, hi = loss.box(Y, c_col)
    if not zero_inside(lo, hi):  # (the hinge loss: ruled out before the pass that diag(Phi Phi^T) costs)
        return None
    diag = passes.feature_norms()
    if not worth_starting(lo, hi, diag):
        return None
    lin, h = Y - loss.psi_grad(zeros, Y, c_col), loss.psi_hess(zeros, Y, c_col)
    kink = float(loss.kink)
    alpha, beta = zeros.clone(), torch.zeros(passes.M, T, dtype=Y.dtype, device=Y.device)
    primal, dual = (c_col * loss.value(Y, zeros)).sum(0), torch.zeros(T, dtype=Y.dtype, device=Y.device)
    count, reason = 0, None

    columns = [loss.column(t) for t in range(T)]

    def certificate(t: int, a, b, f):
        """The column's primal and dual objectives at ``(b, a)`` with ``f = Phi b``."""
        half = 0.5 * float(b @ b)
        return (half + float((c_col[:, t] * columns[t].value(Y[:, t], f)).sum()),
                half + float(columns[t].conj(a, Y[:, t], c_col[:, t]).sum()))

    def finish(t: int, snapped) -> bool:
        """The finishing step on the sets of ``snapped``; True (and the column set to its point) when its duality gap
        meets ``tol``."""
        snapped = _fix_excess(snapped, lo[:, t], hi[:, t], kink, passes.M)
        free = _free_coordinates(snapped, lo[:, t], hi[:, t], kink)
        if not 0 < int(free.sum()) <= passes.M:
            return False
        fixed = passes.transpose_product(torch.where(free, torch.zeros_like(snapped), snapped).unsqueeze(1))[:, 0]
        point = _active_set_point(passes, snapped, free, (lo[:, t], hi[:, t], lin[:, t], h[:, t]), fixed, kink)
        if point is None:
            return False
        b, a = point
        p, d = certificate(t, a, b, passes.kept_product(b.unsqueeze(1))[:, 0])
        if not p + d <= tol * max(abs(p), abs(d)):
            return False
        alpha[:, t], beta[:, t], primal[t], dual[t] = a, b, p, d
        return True

    # every open column advances by one iterate per iteration of the fit
    runs = [ColumnSolve(FeatureGram(passes.kept_product, passes.transpose_product, passes.gram_factor, h[:, t], diag),
                        lin[:, t], kink, lo[:, t], hi[:, t], diag) for t in range(T)]
    open_, finished = list(range(T)), set()
    best = [(math.inf, None)] * T  # each column's smallest relative gap and its iterate
    abandoned, stalled = False, [0] * T  # (iterates since each column's smallest gap)
    while open_ and reason is None:
        moved = False
        for t in list(open_):
            run = runs[t]
            if not run.advance():
                open_.remove(t)
                continue
            moved = True
            alpha[:, t], beta[:, t] = run.a, run.gram.beta[:, 0]
            primal[t], dual[t] = p, d = certificate(t, run.a, run.gram.beta[:, 0], run.gram.f)
            gap = (p + d) / max(abs(p), abs(d), torch.finfo(Y.dtype).tiny)
            stalled[t] = 0 if gap < best[t][0] else stalled[t] + 1
            if gap < best[t][0]:
                best[t] = (gap, (run.a.clone(), beta[:, t].clone(), p, d))
            elif gap > ABANDON_GAP and (gap > ABANDON_RISE * best[t][0] or stalled[t] >= ABANDON_PATIENCE):
                abandoned = True
                break
            elif gap > DIVERGED * best[t][0]:  # inexact directions took it away: its best iterate is kept
                run.a, beta[:, t], primal[t], dual[t] = best[t][1]
                alpha[:, t] = run.a
                open_.remove(t)
                continue
            if gap <= FINISH_FROM and finish(t, run.snapped()):
                open_.remove(t)
                finished.add(t)
        if not moved or abandoned:
            break
        count += 1
        reason = record(count, alpha, beta, primal, dual)
    passes.release_mapped()
    if abandoned:
        for run in runs:
            run.close()
        return _Abandoned(count)
    for t, run in enumerate(runs):
        if t not in finished:  # the continuation is centred at the last iterate's active sets
            alpha[:, t] = run.snapped()
        run.close()
    return alpha, beta, count, reason


def _linear(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return A @ B.T


def _working_set_start(passes: "_Passes", loss: Loss, Y, c, opts: SolverOptions, record, spent: int = 0):
    """The kinked losses that the interior point does not start (the hinge loss): the dual, the same box QP with
    ``Q = Phi Phi^T``, solved by the exact kernels' working-set engine (:mod:`joker_ext.working_set`) on the linear
    kernel of the kept features, to ``opts.tol`` within its own iteration budget and ``opts.max_time``.

    Measured (JokerFalkon, hinge, Nystrom features, to its ``tol``, against the continuation alone): n = 3000,
    M = 300, penalty 1e-8: 0.6 s converged (gap 2e-12) against 'max_iter' after 1000 Newton iterations and 30 s
    (gap 2e-3); n = 4000, M = 1000, penalty 1e-7: 1.0 s against 822 iterations and 178 s; n = 5000, M = 500,
    penalty 1e-6 / 1e-8: 0.8 / 3.7 s against 1.2 / 2.3 s. Its cost grows faster with n than the continuation's:
    M = 500, penalty 1e-6, n = 20,000 / 40,000: 6.0 / 16.4 s against 58 / 47 Newton iterations and 4.6 / 11.6 s
    (which Falkon's default ``maxiter = 20`` stops at a gap of 2e-3).

    ``record(spent + 1, alpha, beta, primal, dual)`` is called once with the certificate of the original problem at
    ``(beta = Phi^T alpha, alpha)``, per column (``spent``: the iterations an abandoned interior start recorded).
    Returns ``(alpha, beta, spent + 1, reason)``."""
    Phi = passes.kept_matrix()
    op = ExactOperator(CallableKernel(_linear, "linear on the features"), BlockData(Phi, Y.dtype, Y.device))
    n = Y.shape[0]
    res = working_set(op, Y, loss, c, SolverOptions(tol=opts.tol, max_time=opts.max_time, handle_sigint=False,
                                                    max_iter=engine_max_iter("working_set", n, n)))
    alpha = res.alpha.to(Y.dtype)
    beta = Phi.T @ alpha
    F = Phi @ beta
    del Phi
    c_col = c.reshape(n, 1).to(Y.dtype).expand_as(Y)
    half = 0.5 * (beta * beta).sum(0)
    primal = half + (c_col * loss.value(Y, F)).sum(0)
    dual = half + loss.conj(alpha, Y, c_col).sum(0)
    return alpha, beta, spent + 1, record(spent + 1, alpha, beta, primal, dual)


def feature_newton(operator, Y: torch.Tensor, loss: Loss, c: torch.Tensor, options: Optional[SolverOptions] = None,
                   *, alpha0: Optional[torch.Tensor] = None, state0=None, start_iter: int = 0, callback=None,
                   validation=None, snapshot=None, snapshot_every=None, shards: Optional[SingleProcess] = None,
                   intercept: bool = False, **_resume) -> SolverResult:
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
    shards : RowShards, optional
        The rows of ``operator`` and ``Y`` are this process's shard of a data set spread over a
        ``torch.distributed`` group (:mod:`joker_ext.distributed`): every sum over rows is all-reduced,
        ``beta`` is the same on every rank and ``alpha`` holds this shard's dual variables.
    intercept : bool
        Fit an unregularized intercept ``b`` per column (``state['intercept']``) jointly with ``beta`` in the
        Newton steps: losses that need no smoothing (:func:`fits_intercept`); the kinked ones get it from the
        intercept search around this engine. Each step solves the bordered system
        ``[[H, v], [v^T, sum w]] [d; db] = -[grad; dP/db]`` (``H = I + Phi^T W Phi``, ``v = Phi^T w``) through the
        Schur complement: one conjugate-gradient run for the two right-hand sides ``grad`` and ``v`` in lockstep
        (their products share each pass's features). The gap is certified at the dual point shrunk onto
        ``sum a = 0``.
    """
    if operator.mode != "features":
        raise ValueError(f"feature_newton needs a feature operator, got mode {operator.mode!r}")
    opts = options or SolverOptions()
    n, T = Y.shape
    dtype, device = Y.dtype, Y.device
    c_col = c.reshape(n, 1).to(dtype=dtype, device=device).expand(n, T)
    loss.check_targets(Y)
    M = operator.feature_map.n_features
    shards = shards or SingleProcess()
    level = target_level(loss, Y, intercept, shards)  # (solved for Y - level; the intercept reported is b + level)
    Y = Y - level
    passes = _Passes(operator, Y, loss, c_col, shards, resident=opts.newton_resident, cache=opts.newton_cache)
    basis = passes.basis
    if state0 is not None and "beta" in state0:
        beta = basis.to_internal(state0["beta"].to(dtype=dtype, device=device).clone())
    elif alpha0 is not None:
        beta = passes.transpose_product(alpha0.to(dtype=dtype, device=device).reshape(n, T))
    else:
        beta = torch.zeros(M, T, dtype=dtype, device=device)
    if shards.any(needs_smoothing(loss, Y, c_col)):  # (decided from every shard's rows alike)
        if intercept:
            raise ValueError(f"feature_newton fits the intercept itself only for losses that need no smoothing; "
                             f"loss {loss.name!r} on these targets does: fit it with the intercept search "
                             f"(joker_ext.intercept)")
        (c_sum,) = shards.sum_many(c.sum().to(dtype).reshape(1))
        s0 = float(c_sum) / passes.n_total
    else:
        s0 = 0.0
    b = start_intercept(state0, T, dtype, device, level) if intercept else None  # (a warm start's or checkpoint's)
    # a quadratic primal is solved by one conjugate-gradient run that stops at the duality gap itself
    quadratic = not shards.any(not constant_curvature(loss, Y, c_col))
    smoothing = Continuation(s0, factor=SMOOTHING_FACTOR)
    # the smoothing term s (a - a_k)^2 / (2 c) is centred at the last smoothed problem's dual solution a_k (a
    # proximal point step on the dual): the primal loss is then evaluated at f - shift, shift = s a_k / c
    center, shift = None, None
    # a checkpoint of this problem's continuation resumes it: its smoothing and centre (one process: the checkpoint
    # holds rank 0's rows)
    resumed = None if shards.distributed else _resumed_continuation(state0, s0, (n, T))
    if resumed is not None:
        smoothing.value, center = resumed[0], resumed[1].to(dtype=dtype, device=device)
        shift = smoothing.value * center / c_col
    elif alpha0 is not None and smoothing.active:
        # a warm start's dual point is the first centre: where it is the solution (a solve repeated at a nearby
        # problem, e.g. the intercept search's next round) the proximal steps stay there
        center = alpha0.to(dtype=dtype, device=device).reshape(n, T)
        shift = smoothing.value * center / c_col
    rank = min(M, opts.newton_rank or default_rank(M, device))
    gen = torch.Generator().manual_seed(int(opts.seed))
    # the sketch's test matrix is drawn where it is used
    gen_sketch = gen if device.type == "cpu" else torch.Generator(device=device).manual_seed(int(opts.seed))
    # float32 products: the conjugate gradients cannot resolve a residual much below float32's precision;
    # the float64 gradient of the next Newton iteration refines the step instead
    cg_floor = max(opts.newton_cg_tol, LOW_PRECISION_CG_TOL if passes.low else 0.0)
    n_all = passes.n_total
    # kept features and a rank covering all M features, or no rank asked for and at most
    # EXACT_HESSIAN_MAX_FEATURES: the Hessian itself (every process alike). Nystrom features keep Falkon's
    # preconditioner, exact where the curvature is uniform (the squared loss) and close where it varies
    # smoothly (logistic), except where it is c on some rows and 0 on the others: the kinked losses' smoothed
    # curvature (c / s on a band of rows), Huber's and the squared hinge's (JokerFalkon, Huber and squared hinge,
    # n = 4200-5800, M = 420-990, penalties 2e-9 to 8e-9: relative gaps of 1.0 after the default 20 iterations)
    piecewise = bool(getattr(loss, "quadratic", False)) and not quadratic
    formable = (rank >= M or (opts.newton_rank is None and M <= EXACT_HESSIAN_MAX_FEATURES)) \
        and not shards.any(not passes.keeps_features)
    exact = formable and (passes.basis.kind != "nystrom" or piecewise)
    # kinked losses: neither a sketch on sampled rows nor Falkon's preconditioner sees a curvature that is c / s on
    # the band of rows near the kinks and 0 elsewhere (Nystrom features, n = 20,000, M = 2000, hinge: 50 products
    # per Newton step, a gap of 0.5 after 190 s). The Hessian of the band's rows is formed instead, features kept
    # or not (a memory budget plans a rank, and keeps the sketch)
    exact = exact or (smoothing.active and opts.newton_rank is None and M <= KINKED_HESSIAN_MAX_FEATURES)
    # where the Newton steps crawl on the sketch or on Falkon's preconditioner (logistic at large C or small
    # penalties: curvature from 1e-10 to 1/4 by row), the Hessian is formed from then on: features kept and at most
    # EXACT_HESSIAN_MAX_FEATURES of them, or else from a pass up to KINKED_HESSIAN_MAX_FEATURES for losses that are
    # not quadratic, and for a quadratic whose first CG run on the sketch ended short of the gap (on Nystrom
    # features Falkon's preconditioner is the squared loss's own)
    crawl_check = not quadratic and not smoothing.active
    sketched_quadratic = quadratic and passes.basis.kind != "nystrom"
    switchable = formable or ((crawl_check or sketched_quadratic) and opts.newton_rank is None
                              and M <= KINKED_HESSIAN_MAX_FEATURES)
    last_whole, last_rel, crawls = False, math.inf, 0
    # the finishing step of the continuation (one process: its free rows would be spread over the processes)
    finishes = exact and smoothing.active and bool(getattr(loss, "quadratic", False)) and not shards.distributed
    n_s = min(n_all, opts.newton_sketch_rows or default_sketch_rows(n_all, rank))
    # the global sample; this process sketches on the sampled rows it holds
    sample = local_positions(torch.sort(torch.randperm(n_all, generator=gen)[:n_s]).values, shards.offset, n)
    sample = sample.to(device)
    mon = Monitor(opts, callback=callback, validation=validation, snapshot=snapshot, snapshot_every=snapshot_every,
                  dtype=dtype)
    # the time budget inside a CG run (each process's own clock: with several, a process leaving a run alone would
    # leave the others waiting in its products' all-reduce)
    out_of_time = None if shards.distributed else mon.out_of_time
    status, it, rec, alpha = "max_iter", start_iter, None, torch.zeros(n, T, dtype=dtype, device=device)
    state = _newton_state(basis, beta, b, level)
    precond, precond_w = None, None
    # the quadratic path's CG iterates go to the callback too, when asked (and counted in every record)
    inner = _InnerReports(opts.callback_cg_every, mon, basis, shards, passes) \
        if quadratic and not intercept and callback is not None and opts.callback_cg_every else None
    reported = False  # the iterate was just handed to the callback by an inner report
    pending = None  # the gradient pass at the point the finishing step moved to
    warm_finish = finishes and (resumed[2] if resumed is not None else center is not None)
    best = _BestCertificate(opts.tol, dtype)
    unreported = False
    # the kinked losses from a cold start: the dual's interior point first (it ends at, or near, the solution in 10-20
    # iterations where the continuation takes 30-150; features not kept, each of its products is a pass), or, where
    # it does not start (the hinge loss, float32 features) or gave up, with the features kept, the working-set engine
    # on the features' linear kernel; the continuation goes on from there
    if finishes and state0 is not None and "interior_start" in state0 and bool((c_col > 0).all()):
        # a checkpoint written during the interior start: the start runs again from scratch. It is deterministic, so
        # the resumed fit ends bitwise where the uninterrupted one does (continuing the smoothing from the checkpoint
        # instead took 23 more iterations where the uninterrupted fit took 8)
        state0, start_iter, center, shift, warm_finish = None, 0, None, None, False
        beta = torch.zeros_like(beta)
    can_interior = finishes and state0 is None and bool((c_col > 0).all()) and opts.max_iter > start_iter
    start_reason = None
    with sigint_as_flag(opts.handle_sigint) as sig:
        try:
            if can_interior and center is not None:
                # a warm start: its own sets first (the finishing step); kept where that lands near the solution
                # (the intercept search's next round), else the cold path (another problem's solution)
                pending = passes.gradient(beta, smoothing.value, shift, b)
                finished = _finish(passes, loss, Y, c_col, beta, center, pending, smoothing.value)
                if finished is not None:
                    beta, center, pending = finished
                    shift = smoothing.value * center / c_col
                    if pending is None:  # (the finishing step may leave its point's pass to the caller)
                        pending = passes.gradient(beta, smoothing.value, shift, b)
                warm_finish = False
                gap0 = pending["primal"] + pending["dual"]
                far = gap0 > WARM_START_FAR_GAP * torch.maximum(pending["primal"].abs(), pending["dual"].abs())
                if shards.any(bool(far.any())):
                    pending, center, shift = None, None, None
                    beta = torch.zeros_like(beta)
            interior = can_interior and center is None
            if interior:
                def record(count, A, B, primal, dual):
                    nonlocal rec, alpha, state
                    # (the marker tells a checkpoint's resume to run the start again; the result drops it)
                    alpha, state = A.clone(), {"beta": basis.to_external(B.clone()), "interior_start": torch.ones(())}
                    rec = mon.record(start_iter + count - 1, float(primal.sum()), float(dual.sum()),
                                     float((primal + dual).sum()), state, alpha, smoothing=0.0, passes=passes.passes)
                    reason = mon.stop_reason(rec, state, alpha, sig.flag)
                    return reason or ("max_iter" if start_iter + count >= opts.max_iter else None)

                # (the interior point's Woodbury solves need the features in the solver dtype; the working set
                # converts them)
                started = None if passes.low else _interior_start(passes, loss, Y, c_col, opts.tol, record)
                spent = 0
                if isinstance(started, _Abandoned):
                    spent, started = started.iterations, None
                if started is None and passes.keeps_features:
                    started = _working_set_start(passes, loss, Y, c, opts, record, spent)
                it = start_iter + spent  # (an abandoned interior start's records, when nothing replaced it)
                if started is not None:
                    center, beta, count, start_reason = started
                    it = start_iter + count
                    status = start_reason or status
                    smoothing.value = s0 * INTERIOR_SMOOTHING
                    shift = smoothing.value * center / c_col
                    warm_finish = True
            while start_reason is None:
                g = D = Z = None  # the last iterate's n-vectors go before the pass allocates the next ones
                g = pending if pending is not None else passes.gradient(beta, smoothing.value, shift, b)
                pending = None
                # (checkpoints of one process also keep the continuation's smoothing and centre: _resumed_continuation)
                continuation = (smoothing, s0, center, warm_finish) \
                    if snapshot is not None and smoothing.active and center is not None and not shards.distributed \
                    else None
                alpha, state = g["A"], _newton_state(basis, beta, b, level, continuation)
                gap = g["primal"] + g["dual"]
                rel = gap / torch.maximum(g["primal"].abs(), g["dual"].abs()).clamp_min(torch.finfo(dtype).tiny)
                extra = {} if inner is None else {"cg_iterations": inner.total}
                rec = mon.record(it, float(g["primal"].sum()), float(g["dual"].sum()), float(gap.sum()), state, alpha,
                                 smoothing=smoothing.value, passes=passes.passes, **extra)
                if inner is not None and inner.stop is not None:
                    status = inner.stop  # a report inside the CG run asked to stop: this certificate ends the fit
                    break
                if best.update(rec, alpha, state):
                    status = "converged"  # at the rounding floor, and no longer falling
                    unreported = True  # (this record has not been through stop_reason: the callback has not seen it)
                    break
                if smoothing.active:
                    solve_error = 0.5 * float((g["grad"] * g["grad"]).sum())
                    solved = smoothing.solved(solve_error, float(g["share"].sum()))
                    if solved:
                        # the subproblem is solved: a smaller smoothing, centred at its dual solution
                        center = g["A"]
                        shift = smoothing.value * center / c_col
                    finished = None
                    if finishes and (solved or warm_finish):
                        # (a warm start's own sets first: a solve repeated at a nearby problem, e.g. the intercept
                        # search's next round, often has the same ones)
                        finished = _finish(passes, loss, Y, c_col, beta, center, g, smoothing.value)
                        if finished is not None:
                            beta, center, pending = finished
                            shift = smoothing.value * center / c_col
                    warm_finish = False
                    if solved or finished is not None:
                        continue  # re-evaluate at the new centre before stepping
                reason = shards.agree(mon.stop_reason(rec, state, alpha, sig.flag, report=not reported))
                if reason is not None or it >= opts.max_iter:
                    status = reason or "max_iter"
                    break
                w_sample = g["W"] if exact else g["W"][sample]
                if shards.any(precond is None or not torch.equal(w_sample, precond_w)):
                    precond = None  # free the old factor first
                    precond = _column_preconditioners(
                        w_sample, shards, lambda t: passes.exact_hessian(w_sample, t) if exact else
                        passes.preconditioner(sample, w_sample[:, t], n_s, rank, gen_sketch))
                    precond_w = w_sample
                if quadratic and intercept:
                    eta, still_open = opts.newton_cg_tol, None
                elif quadratic:
                    # the gap test decides; no float32 floor (the float32 products' recurrence is refreshed from
                    # passes in the solver dtype, and the next gradient pass certifies the gap afresh)
                    if inner is not None:
                        inner.iteration = it
                    eta = opts.newton_cg_tol
                    still_open = _gap_test(loss, Y, c_col, beta, g["F"], opts.tol, shards, observe=inner)
                else:
                    eta, still_open = min(0.1, max(cg_floor, math.sqrt(max(float(rel.max()), 0.0)))), None
                products = passes.passes
                if intercept:
                    D, Z, db, flat = _bordered_step(passes, g, precond, eta, opts.max_cg, cg_floor)
                    if bool(flat.any()):
                        # no row has curvature (Huber with every residual beyond its threshold: an intercept far
                        # from 0): the Newton step cannot move b; b alone goes to its minimiser at this beta
                        db = torch.where(flat, _intercept_minimiser(loss, Y, c_col, g["F"], b, shards) - b, db)
                        D[:, flat], Z[:, flat] = 0.0, 0.0
                elif still_open is not None:
                    # a quadratic's Newton step is the whole solve: one CG run may take the products of several
                    # Newton iterations (a restart would lose its Krylov space), its residual refreshed where the
                    # products run in float32
                    refresh = _residual_refresh(passes, beta, g["F"], smoothing.value) \
                        if passes.low and shift is None else None
                    # (one run of max_cg where the Hessian can be formed instead)
                    runs = 1 if switchable and not exact else max(1, min(opts.max_iter - it, QUADRATIC_CG_RUNS))
                    D, Z = _pcg(passes, g["grad"], g["W"], precond, eta, opts.max_cg * runs, still_open, refresh,
                                out_of_time)
                else:
                    D, Z = _pcg(passes, g["grad"], g["W"], precond, eta, opts.max_cg, out_of_time=out_of_time)
                # Newton steps that crawl: whole steps after which the gap did not fall by CRAWL_RATIO, one below
                # CRAWL_FROM or CRAWL_STEPS in a row above it (steps from conjugate gradients stopped short)
                rel_now = float(rel.max())
                crawls = crawls + 1 if crawl_check and last_whole and rel_now > CRAWL_RATIO * last_rel else 0
                crawled = crawls >= (1 if rel_now < CRAWL_FROM else CRAWL_STEPS)
                if switchable and not exact and (passes.passes - products > FORM_HESSIAN_AFTER_PRODUCTS or crawled):
                    # Falkon's preconditioner assumes a uniform curvature, the sketch sees only its sampled rows'; where
                    # the Newton steps crawl on them, the Hessian is formed from now on
                    exact, precond = True, None
                # (with an intercept the predictions along the step hold b + t db)
                F_line, Z_line, slope_b = (g["F"] + b, Z + db, float((g["grad_b"] * db).sum())) if intercept \
                    else (g["F"], Z, 0.0)
                t = _line_search(loss, Y, c_col, beta, D, F_line, Z_line, g["grad"], smoothing.value, shards, shift,
                                 slope_b=slope_b)
                F_line = Z_line = None
                # the next record's iterate is the last one reported when the step was whole and CG ended there
                reported = inner is not None and inner.last == inner.total and t == 1.0
                last_whole, last_rel = t == 1.0, rel_now
                it += 1
                if t is None:
                    if exact and passes.basis.kind == "nystrom" and not passes.accurate_hessian:
                        # the step came from R^{-T} G^T W G R^{-1}, whose rounding may have misled it: again from
                        # the Hessian formed from the features themselves
                        passes.accurate_hessian, precond = True, None
                        continue
                    if smoothing.active and smoothing.update(0.0, 1.0):
                        shift = None if center is None else smoothing.value * center / c_col
                        continue
                    status = "converged" if at_rounding_floor(float(rel.max()), opts.tol, dtype) else "stalled"
                    break
                beta = shards.broadcast_(beta + t * D)  # every rank keeps rank 0's weights
                if intercept:
                    b = shards.broadcast_(b + t * db)
        except (RuntimeError, MemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            status = "out_of_memory"
    if rec is None:
        rec = {"primal": math.nan, "dual": math.nan, "gap": math.nan, "rel_gap": math.inf}
    elif _prefer_best(best, rec, status, opts.tol, dtype):
        rec, alpha, state = best.rec, best.alpha, best.state
        if status in ("max_iter", "stalled") and at_rounding_floor(rec["rel_gap"], opts.tol, dtype):
            status = "converged"
        unreported = True
    if unreported:  # the callback's last iterate is the one returned (a Falkon error_fn reports the final model)
        mon.report_inner(rec["iteration"], rec["primal"], rec["dual"], rec["gap"], state, alpha)
    state = {k: v for k, v in state.items() if k not in CHECKPOINT_ONLY}
    res = SolverResult(alpha=alpha, state=state, n_iter=it, status=status, primal=rec["primal"], dual=rec["dual"],
                       gap=rec["gap"], rel_gap=rec["rel_gap"], radius=torch.ones(T, dtype=dtype, device=device),
                       history=mon.history, rng_state=None)
    return res


register_solver("newton", "features", feature_newton, distributed=True, intercept=fits_intercept)
