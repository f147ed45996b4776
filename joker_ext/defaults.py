"""The defaults of a fit, in one place: tolerances, block sizes, iteration budgets, chunk sizes.

Every front end (the scikit-learn estimators, JokerFalkon, JokerGP, the comparison harness) reaches these
through :func:`joker_ext.plan.make_fit_plan`; none restates a number. The engine registry's own budgets (the
Newton engines' :data:`joker_ext.engines.NEWTON_MAX_ITER`, the working-set sizes) and the memory the exact
Newton engines may take (:data:`~joker_ext.engines.DEFAULT_EXACT_MEMORY`) live with the engines, which read
DBCD-TR's budget from here (:func:`joker_ext.engines.default_max_iter`).

Tolerances are on the relative duality gap ``(P + D) / max(|P|, |D|)`` (see :mod:`joker_ext.solver`).
"""
from __future__ import annotations

import math

import torch

__all__ = ["PRECISION_TOL", "ROUNDING_GAP", "WORKING_SET_DTYPE", "FILL_ELEMENTS", "IN_PLACE_BLOCK", "TEST_MATRIX_BLOCK",
           "PRACTICAL_TOL", "CONVERGENCE_WARN_GAP", "FLOAT32_INTERCEPT_MAX_COST", "CONVERT_SPLIT", "STREAM_BYTES",
           "FEATURE_CACHE_BYTES",
           "EXACT_HESSIAN_MAX_FEATURES", "KINKED_HESSIAN_MAX_FEATURES", "FORM_HESSIAN_AFTER_PRODUCTS",
           "REFRESH_DROP", "QUADRATIC_CG_RUNS",
           "CHUNK_ROWS", "GPU_NEWTON_WORKSPACE",
           "BLOCK_SIZE", "LARGE_N_BLOCK_SIZE", "LARGE_N", "LOGISTIC_BLOCK_SIZE", "MIN_BLOCK_ITERATIONS", "BLOCK_EPOCHS",
           "GRAM_MAX", "DIRECT_MAX", "SINGULAR_DIRECT_MAX", "CAUCHY_FACTORS", "SEARCH_FACTORS",
           "CAUCHY_CANDIDATES", "SEARCH_CANDIDATES", "precision_tol", "default_block_size",
           "default_max_iter"]

#: Relative gap that asks for a solution correct to the working precision, by dtype: the default ``tol`` of the
#: scikit-learn estimators and of JokerGP. (The prediction error is of order the square root of the gap.)
PRECISION_TOL = {torch.float64: 1e-14, torch.float32: 1e-7}

#: Largest relative gap that an engine which can make no further progress (its last step solved the problem
#: exactly, up to rounding) reports as 'converged' when ``tol`` asks for less: the rounding floor of the gap, which
#: grows with the conditioning of the kernel block the engine solves with (measured: 3e-13 to 5e-13 for
#: epsilon-insensitive SVR at n = 4000, C = 10, where ``tol`` defaults to 1e-14). Above it the status is
#: 'stalled'.
ROUNDING_GAP = {torch.float64: 1e-11, torch.float32: 1e-4}

#: The dtype in which the working-set engine computes, whatever its inputs' (it returns theirs): its subproblems are
#: the kernel matrix restricted to the support vectors, as ill-conditioned as the problem, and in float32 its
#: active sets never settled (measured: epsilon-insensitive, n = 1500, C = 10, gap 0.22 after 100 iterations).
WORKING_SET_DTYPE = torch.float64

#: Kernel values the working-set engine's row cache computes at a time (bounds the temporary block of a fill; counted
#: by :func:`joker_ext.memory.estimate_fit_memory`).
FILL_ELEMENTS = 2**21

#: Elements of the temporary block of the feature Newton engine's row-wise maps of its ``M x r`` sketch
#: (:func:`joker_ext.primal_newton._rows_in_place`; 32 MB in float64; counted by
#: :func:`joker_ext.memory.estimate_fit_memory`).
IN_PLACE_BLOCK = 2**22

#: Elements of each block in which the feature Newton engine's one-buffer sketch draws its Gaussian test matrix,
#: and draws it again (:meth:`joker_ext.primal_newton.NystromPreconditioner.sketch`, ``two_pass``; 8 MB in float64).
TEST_MATRIX_BLOCK = 2**20

#: The feature Newton engine's gradient pass converts its float32 features to a float64 solver's dtype in this many
#: blocks per chunk, and its sketch reads the sample in chunks of half the gradient pass's rows (measured on the CPU,
#: float32 features of a float64 fit, n = 100,000, M = 5000: peak 450 -> 311 MB from the sketch's chunks, -> 209 MB
#: from the conversion's blocks, at the same fit time and result). On a GPU, where a pass of small blocks is bound
#: by launching its kernels, only the two products go block by block (each converting the block again); the
#: loss's row-wise steps take the whole chunk.
CONVERT_SPLIT = 4

#: The feature Newton engine copies inputs that are not resident on its device in spans of about this many bytes,
#: each cut into the pass's chunks there: a copy from pageable host memory waits for the device's queue, and one per
#: chunk left a GPU pass of small chunks waiting on the host (synthetic 1M x 28, chunks of 209 rows: 4785 waits
#: per pass).
STREAM_BYTES = 4 * 2**20

#: The feature Newton engine keeps the features of its Hessian products (``n x M`` in the pass dtype) when they take
#: at most this many bytes and no memory budget is planned (``SolverOptions.newton_cache``), instead of computing
#: them again at every product: 20,000 rows, 64 random features, absolute loss, 2084 products in 54 Newton
#: iterations spent 4.4 of 6.9 s in the cosines and sines.
FEATURE_CACHE_BYTES = 256 * 2**20

#: With its features kept and no ``newton_rank`` given, the feature Newton engine forms and factors the Hessian
#: ``I + Phi^T W Phi`` itself (:class:`~joker_ext.primal_newton.ExactHessian`, ``2 n M^2`` flops per Newton step)
#: up to this many features, where the rank-512 sketch would leave the kinked losses' conjugate gradients at
#: ``max_cg``. Measured on 2 CPU threads, random features, C = 1 (sketch -> exact Hessian): M = 1024, n = 20,000:
#: hinge 87.2 s ('max_iter', gap 5e-8) -> 27.6 s converged, epsilon-insensitive 94.2 s ('max_iter', 2e-6) -> 47.4 s,
#: Huber 3.13 -> 2.63 s, squared 1.16 -> 0.81 s, logistic 3.05 -> 3.53 s; n = 15,000 hinge 31.6 -> 19.6 s. At
#: M = 2048 (n = 15,000) the sketch was faster: hinge 47.3 against 68.7 s, logistic 4.9 against 8.9 s.
EXACT_HESSIAN_MAX_FEATURES = 1024

#: The feature Newton engine's conjugate gradients on a quadratic loss (float32 Hessian products) replace their
#: recurrence's residual by one from a pass in the solver dtype once it has fallen below this fraction of the last
#: fresh one (:func:`joker_ext.primal_newton._pcg`). Unrefreshed, its error (float32's rounding times the first
#: residual's norm) held the gap test at 1.4e-6 where the true gap was 3.8e-7 (158 products in one run), or let the
#: recurrence reach its target at a true gap of 2e-5. JokerFalkon, synthetic regression, random features, 2 CPU
#: threads, n = 100,000, M = 5000: penalty 1e-7 137 products (restarts every 50) -> 126, 75.3 -> 67.0 s; penalty 1e-6
#: 48 -> 49 products, 27.2 -> 26.7 s (1e-3: 29.4 s).
REFRESH_DROP = 1e-4

#: On a quadratic loss without intercept the feature Newton step is the whole solve: where the Hessian cannot be
#: formed instead (more than :data:`KINKED_HESSIAN_MAX_FEATURES` features, or a rank asked for), its conjugate
#: gradients may take this many times ``max_cg`` products in one run (a restart every ``max_cg`` products lost its
#: Krylov space). Where it can, one run of ``max_cg`` that ends short of the gap forms it: n = 50,000, M = 4000,
#: penalty 1e-8: 260 products, 53.7 s -> 56 passes, 23.9 s; M = 2000, penalty 1e-7: 10.6 -> 10.4 s; JokerRegressor,
#: float32, n = 20,000, 2000 random features, C = 1000: 'max_time' at 60 s with a gap of 1.0 -> converged in 2.1 s.
QUADRATIC_CG_RUNS = 10

#: Largest M at which the feature Newton engine forms the Hessian of a kinked loss (hinge, absolute, pinball,
#: epsilon-insensitive: curvature c / s on the band of rows near the kinks, 0 elsewhere) from its band's rows, features
#: kept or not, where no ``newton_rank`` is given (two M x M matrices; Nystrom features hold an M x M factor anyway).
#: CPU, 2 threads: Nystrom n = 20,000, M = 2000, hinge, penalty 1e-6: a gap of 0.5 after 190 s -> converged at 5e-14
#: in 54 s; random features n = 15,000, hinge, C = 1: M = 2048 57.3 -> 17.2 s, M = 4096 epsilon-insensitive more
#: than 300 s -> 157 s.
KINKED_HESSIAN_MAX_FEATURES = 4096

#: With Nystrom features the feature Newton engine preconditions by Falkon's ``I + (n / M) wbar R R^T``, which assumes
#: the same curvature on every row. Where a Newton step's conjugate gradients needed more than this many products
#: (a pass each), and the Hessian could be formed (as under ``EXACT_HESSIAN_MAX_FEATURES``), it is formed from then on:
#: forming it costs about 12 / 20 passes' time at M = 500 / 1000 (n = 20,000, 2 threads). Logistic at penalty 1e-8
#: (curvature 1e-10 to 1/4 by row), JokerFalkon, n = 20,000: M = 500 10.3 s ('max_iter', gap 0.099) -> 2.7 s
#: converged; M = 1000 19.2 s ('max_iter', gap 6.5e-3) -> 10.0 s converged; at penalty 1e-6 no step needs as many.
FORM_HESSIAN_AFTER_PRODUCTS = 25

#: On a GPU, where no memory budget is given, the feature Newton engine with more than
#: ``KINKED_HESSIAN_MAX_FEATURES`` features keeps its working memory (the preconditioner's sketch and factor, the
#: passes' chunks, the inputs' copy) within this many bytes beyond its O(n) state and model, when its default rank
#: and chunks would take more (:func:`joker_ext.primal_newton.default_budget`). Measured on an H100 (JokerFalkon,
#: flights 200k at M = 20,000 and 50,000, synthetic 1M x 28 at M = 20,000): peaks 154-217 MiB, 0.19-0.24x of
#: Falkon's at its calibrated ``max_gpu_mem``, and Falkon's test RMSE in 0.011-0.14x of its fit time.
GPU_NEWTON_WORKSPACE = 224 * 2**20

#: Relative gap at which front ends that stop at a practical accuracy stop: the harness's joker backends and
#: JokerFalkon's Newton engines at Falkon's default ``cg_tolerance``. For the squared loss a gap ``g`` puts the
#: training predictions within about ``sqrt(g)`` (0.1 %) of the residuals' size from the optimum (see
#: :func:`joker_ext.adapters.falkon.translate_options`).
PRACTICAL_TOL = 1e-6

#: An unconverged fit warns (ConvergenceWarning) when its relative gap is above ``max(tol, CONVERGENCE_WARN_GAP)``.
CONVERGENCE_WARN_GAP = 1e-6

#: A float32 random-feature fit with an intercept whose ``sum_i c_i`` (``C`` times the total sample weight: a bound on
#: the condition number of its Newton systems ``I + Phi^T W Phi``, the intercept's Schur complement a difference of
#: numbers of that size) exceeds this evaluates its features in float32 and solves in float64. In float32 throughout,
#: five losses at n = 5000, M = 500 converged at ``sum c = 10^7`` and four of five stopped at relative gaps of 1e-3 to
#: 1.0 at ``5 10^7`` (hinge after 53 s); the mixed passes cost 1-2.7x the float32 time on the CPU (n = 50,000,
#: M = 1000), so they are kept to the fits that need them, with a factor of 10 to spare.
FLOAT32_INTERCEPT_MAX_COST = 1e6

#: Rows per chunk when streaming products and predictions.
CHUNK_ROWS = 4096

#: The seed paper's block sizes: ``BLOCK_SIZE`` rows up to ``LARGE_N`` rows, ``LARGE_N_BLOCK_SIZE`` above;
#: ``LOGISTIC_BLOCK_SIZE`` for the logistic loss.
BLOCK_SIZE = 2048
LARGE_N = 500_000
LARGE_N_BLOCK_SIZE = 512
LOGISTIC_BLOCK_SIZE = 1024

#: DBCD-TR's block-iteration budget: ``BLOCK_EPOCHS`` passes over the blocks, at least ``MIN_BLOCK_ITERATIONS``.
BLOCK_EPOCHS = 50
MIN_BLOCK_ITERATIONS = 200

#: DBCD-TR's block-model policy (:func:`joker_ext.operators.block_model`): in feature mode the exact block
#: model forms ``Phi_B Phi_B^T`` for blocks of at most ``GRAM_MAX`` rows (products ``Phi_B (Phi_B^T v)`` above);
#: the trust-region subproblem is solved exactly (eigendecomposition) for formed block matrices of at most
#: ``DIRECT_MAX`` rows, and, when the block Hessian has no positive diagonal (linear conjugates: a singular
#: ``K_BB``, every round an eigendecomposition), only up to ``SINGULAR_DIRECT_MAX`` rows.
GRAM_MAX = 1024
DIRECT_MAX = 2048
SINGULAR_DIRECT_MAX = 512

#: DBCD-TR's trust-region candidates, all evaluated by the model in one batched product: the Cauchy point's
#: step lengths (multiples of the unconstrained minimiser along the projected gradient) and the projected
#: search's fractions of the subspace step (plus the longest feasible one). Their numbers size the stacked
#: ``b x (k T)`` buffers of an iteration (:func:`joker_ext.memory.estimate_fit_memory`).
CAUCHY_FACTORS = (4.0, 2.0, 1.0, 0.5, 0.25, 0.125, 0.0625, 1.0 / 64, 1.0 / 256, 1.0 / 1024)
SEARCH_FACTORS = (1.0, 0.5, 0.25, 0.125, 1.0 / 16, 0.0)
CAUCHY_CANDIDATES = len(CAUCHY_FACTORS)
SEARCH_CANDIDATES = len(SEARCH_FACTORS) + 1


def precision_tol(dtype: torch.dtype) -> float:
    """The working-precision tolerance of ``dtype`` (:data:`PRECISION_TOL`; float32's for any other dtype)."""
    return PRECISION_TOL.get(dtype, PRECISION_TOL[torch.float32])


def default_block_size(n: int, loss) -> int:
    """The seed paper's block sizes: 2048 for n <= 5e5, else 512; 1024 for logistic; never above n."""
    if getattr(loss, "name", None) == "logistic":
        b = LOGISTIC_BLOCK_SIZE
    else:
        b = BLOCK_SIZE if n <= LARGE_N else LARGE_N_BLOCK_SIZE
    return max(1, min(n, b))


def default_max_iter(n: int, block_size: int, epochs: int = BLOCK_EPOCHS) -> int:
    """``epochs`` passes over the blocks of ``block_size`` rows, at least :data:`MIN_BLOCK_ITERATIONS` iterations."""
    return max(MIN_BLOCK_ITERATIONS, epochs * math.ceil(n / block_size))
