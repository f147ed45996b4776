"""Memory: what a fit will need, before it starts, and block sizes that fit a budget.

The estimate adds up the largest tensors each engine allocates, read from the constants and sizes the
engines themselves use (block size, the feature operator's ``GRAM_MAX`` and the direct solve's
``DIRECT_MAX`` of :mod:`joker_ext.defaults`, the numbers of trust-region candidates, the working-set size
and its kernel-row cache, the Newton engine's sketch rank and rows). Sizes in elements times the dtype's
bytes, in four parts:

* ``per_row``: the n-vectors (dual variables, box bounds, the operator state ``f = K alpha``, the
  duality gap's temporaries) and the block partition (int64);
* ``per_block``: what one iteration holds beyond them: the block's inputs, its kernel or feature
  matrix, the dense factorisations of the block Hessian, the stacked candidate steps (DBCD-TR); the
  working set's kernel block and the free part's factor plus its row cache (working set; with every row cached, on
  the CPU, also the SMO phase's blocks of up to ``(n / 2)^2`` numbers, one per column running at once); the sketch
  of the preconditioner (feature Newton);
* ``per_chunk``: a chunk of ``r`` rows streamed over the data (``r b`` kernel values for the exact update,
  ``r M`` features for a pass; the working set's block of kernel rows while its cache fills, at most
  ``FILL_ELEMENTS`` values: on a GPU it is allocated in full, on the CPU only its touched pages count);
* ``model``: the primal weights ``M T`` and the feature map's ``d M`` frequencies.

The data themselves are not counted (they stay where the user keeps them). The estimate is checked
against measured peaks (the process's resident-set high-water mark on the CPU,
``torch.cuda.max_memory_allocated`` on a GPU) in ``tests/core/test_memory.py``: it is an upper bound, within
a small factor.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional, Union

import torch

from .defaults import (CAUCHY_CANDIDATES, CHUNK_ROWS, CONVERT_SPLIT, DIRECT_MAX, EXACT_HESSIAN_MAX_FEATURES,
                       FEATURE_CACHE_BYTES, FILL_ELEMENTS, GRAM_MAX, IN_PLACE_BLOCK, KINKED_HESSIAN_MAX_FEATURES,
                       SEARCH_CANDIDATES, STREAM_BYTES, TEST_MATRIX_BLOCK, WORKING_SET_DTYPE)
from .engines import DEFAULT_EXACT_MEMORY, WORKING_SET_SIZE, needs_smoothing_loss
from .smo import COMPACT_SHARE
from .operators import block_model

__all__ = ["MemoryEstimate", "estimate_fit_memory", "keeps_features", "plan_blocks", "plan_newton", "parse_memory",
           "is_out_of_memory"]

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3,
          "t": 1024**4, "tb": 1024**4}


def parse_memory(value: Union[int, float, str, None]) -> Optional[int]:
    """Bytes from an int/float or a string like '512MB', '2 GB', '1.5g' (None stays None)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"max_memory must be a number of bytes or a string like '2GB', got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"max_memory must be positive, got {value!r}")
        return int(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            out = float(m.group(1)) * _UNITS[m.group(2).lower()]
            if out > 0:
                return int(out)
    raise ValueError(f"max_memory must be a number of bytes or a string like '2GB', got {value!r}")


@dataclass
class MemoryEstimate:
    """Bytes by component; ``total`` is their sum."""

    per_row: int
    per_block: int
    per_chunk: int
    model: int

    @property
    def total(self) -> int:
        return self.per_row + self.per_block + self.per_chunk + self.model

    def __str__(self) -> str:
        mb = lambda x: f"{x / 2**20:.1f} MB"
        return (f"{mb(self.total)} (rows {mb(self.per_row)}, block {mb(self.per_block)}, "
                f"chunks {mb(self.per_chunk)}, model {mb(self.model)})")


#: n-vectors (n x T) a DBCD-TR fit holds at once: alpha, the box (lo, hi), the state ``f`` (exact) or the
#: predictions of a gap evaluation (features), the exact update ``K(X, X_B) s`` and four temporaries of the
#: duality gap (loss values, conjugates, Fenchel-Young terms).
DBCD_ROW_VECTORS = 9
#: b x b matrices the direct trust-region solve holds on top of the block matrix: the free block ``H``,
#: its Cholesky factor, the symmetrised copy, the eigenvectors and LAPACK's workspace of the same size.
DIRECT_MATRICES = 5
#: b x b matrices of the preconditioned Newton step of the feature 'kernel' model: ``P``, its factor and the
#: shifted copy when the factorisation fails.
NEWTON_PCG_MATRICES = 3
#: b x (k T) buffers per stacked candidate of a trust-region round: the steps, their projection (four
#: temporaries), the model's products and the repeated gradient and curvature.
CANDIDATE_BUFFERS = 8
#: n-vectors (n x T) of the feature Newton engine: f, a*, w (the gradient pass), Phi d, Phi p (the CG),
#: alpha and the gap's temporaries, and the copies of the targets and of ``c`` on the solver's device
#: (measured on a GPU with host inputs: 10 left the estimate 3 MiB short at n = 200,000).
NEWTON_ROW_VECTORS = 12
#: M x r buffers of the Newton engine's Nystrom sketch at its peak (the test matrix and the sketch, which its
#: triangular solve overwrites), plus the SVD's factor and workspace on the CPU.
SKETCH_BUFFERS = 4
#: n-vectors of the working-set engine (alpha, f, the box, the KKT bounds and the column's temporaries).
WORKING_SET_ROW_VECTORS = 10
#: |B| x |B| matrices of a working-set subproblem: ``K_BB`` and, at most, three more: the interior-point
#: method's ``Q = K_BB + diag(h)``, its Newton matrix and factor; or the free part's block, factor and update.
WORKING_SET_MATRICES = 4
#: |B| x |B| matrices kept per target column between subproblems: the free part's factor that carries over and its
#: pinned columns (:mod:`joker_ext.free_factor`).
WORKING_SET_CARRIED = 2


def working_set_cache_rows(n: int, itemsize: int, working_set_size: int = WORKING_SET_SIZE) -> int:
    """Rows of the working-set engine's kernel cache (:func:`joker_ext.working_set.working_set`'s default):
    all ``n`` when ``n^2`` numbers fit half of :data:`joker_ext.engines.DEFAULT_EXACT_MEMORY`, else ``4 q``."""
    q = max(2, min(int(working_set_size), n))
    return n if n * n * itemsize <= DEFAULT_EXACT_MEMORY // 2 else min(n, 4 * q)


def estimate_fit_memory(n: int, d: int, T: int = 1, *, n_features: Optional[int] = None, block_size: int = 1024,
                        chunk_rows: int = CHUNK_ROWS, itemsize: int = 8, direct_max: int = DIRECT_MAX,
                        gram_max: int = GRAM_MAX, solver: str = "dbcd_tr", newton_rank: Optional[int] = None,
                        newton_sketch_rows: Optional[int] = None, working_set_size: int = WORKING_SET_SIZE,
                        cache_columns: Optional[int] = None, loss=None, pass_itemsize: Optional[int] = None,
                        device=None, resident: bool = True,
                        newton_cache: Optional[bool] = None) -> MemoryEstimate:
    """Estimate the memory a fit needs (see the module docstring for what is counted).

    Parameters
    ----------
    n, d, T : int
        Rows, input dimension, targets.
    n_features : int, optional
        ``M`` random or Nystrom features; None for the exact kernel.
    block_size, chunk_rows : int
        DBCD-TR's block rows ``b`` and the operator's chunk rows ``r`` (feature Newton: ``r`` rows per pass chunk).
    itemsize : int
        Bytes per number (8 for float64).
    direct_max, gram_max : int
        DBCD-TR's block-model limits (:func:`joker_ext.operators.block_model`).
    solver : {'dbcd_tr', 'newton', 'working_set'}
        The engine: DBCD-TR (exact or features), the feature Newton engine (:mod:`joker_ext.primal_newton`,
        features; needs ``newton_rank`` and ``newton_sketch_rows``, e.g. its ``default_rank(M)`` and
        ``default_sketch_rows(n, rank)``) or the working-set engine (exact).
    working_set_size, cache_columns : int, optional
        The working-set engine's ``q`` and kernel-row cache (default :func:`working_set_cache_rows`).
    loss : Loss, optional
        DBCD-TR: whether the conjugate has curvature (``psi'' > 0``) decides, through the block-model policy,
        whether blocks above ``SINGULAR_DIRECT_MAX`` rows take the direct solve; None counts it.
    pass_itemsize : int, optional
        Feature Newton: bytes per number of its passes' features (4 when a float64 fit evaluates float32
        features, as JokerFalkon does for float32 data; default ``itemsize``).
    device : str or torch.device, optional
        Feature Newton: the sketch's buffers differ on the CPU (an SVD) and on a GPU (default: CPU).
    resident : bool
        Feature Newton: a copy of the inputs stays on the device (``SolverOptions.newton_resident``).
    newton_cache : bool, optional
        Feature Newton: the Hessian products' features are kept (``SolverOptions.newton_cache``; default: when
        ``n M p`` is at most :data:`~joker_ext.defaults.FEATURE_CACHE_BYTES`). :func:`plan_newton` plans without.

    Returns
    -------
    MemoryEstimate
        With ``b = min(block_size, n)``, ``r = min(chunk_rows, n)``, ``k = CAUCHY_CANDIDATES``, in numbers
        (times ``itemsize``), DBCD-TR exact::

            per_row   = n (9 T + 1) + 2 n (int64)
            per_block = b d + b^2 + [5 b^2 if direct] + 8 k b T
            per_chunk = r b

        DBCD-TR features (``'gram'`` formed for ``b <= gram_max``)::

            per_block = b d + 2 b M + [b^2 + 5 b^2 if formed and direct] + 3 b^2 + 8 k b T

        with ``formed`` and ``direct`` as :func:`joker_ext.operators.block_model` decides them.
            per_chunk = 2 r M,      model = M T + d M

        Feature Newton (bytes; ``s = itemsize``, ``p = pass_itemsize``, ``k`` the rank, ``n_s`` the sketch rows):
        the sketch and the passes never hold their buffers at once (the passes' workspaces are freed while
        the sketch is formed), so the total is ``per_row + model + max(sketch, passes + U)``::

            per_row  = n (12 T + 1) s + n d p [+ n M p]  (n-vectors; the inputs' copy when resident, else a
                                                         span of STREAM_BYTES, at most n d p; the feature
                                                         cache, newton_cache)
            passes   = r M s + max(r M s / 2, [r M s / c if p != s] + r M p / 2)   (the pass chunk of r s / p
                       rows and X W of a Hessian pass; the gradient pass's copy in the solver dtype, c =
                       CONVERT_SPLIT, and its X W)
            sketch   = B M k s + q M (s + 1.5 p) + q k s (B = 4 on the CPU (SVD), 2 on a GPU, 1 + max(n_s + b, b') / M
                       on a GPU where the n_s sketch rows are fewer than M and 4 k <= M, b = TEST_MATRIX_BLOCK / k,
                       b' = IN_PLACE_BLOCK / k;
                       q = r / 2)
            U        = M k s,        model = (M T + d M + 8 M T) s
    """
    b = max(1, min(block_size, n))
    r = max(1, min(chunk_rows, n))
    exact = n_features is None
    partition = 2 * n * 8  # the permutation and the sorted blocks, int64
    work = CANDIDATE_BUFFERS * max(CAUCHY_CANDIDATES, SEARCH_CANDIDATES) * b * T
    if solver == "working_set":
        if not exact:
            raise ValueError("the working-set engine runs on exact kernels (n_features=None)")
        q = max(2, min(int(working_set_size), n))
        itemsize = torch.finfo(WORKING_SET_DTYPE).bits // 8  # it computes in that dtype whatever the inputs'
        rows = working_set_cache_rows(n, itemsize, q) if cache_columns is None else max(1, min(int(cache_columns), n))
        B = min(n, 2 * q)
        # the row vectors, and the points as the kernel prepared them for the cache's rows (Kernel.against)
        per_row = n * (WORKING_SET_ROW_VECTORS * T + 1 + d + 1) * itemsize
        per_block = (rows * n + (WORKING_SET_MATRICES + WORKING_SET_CARRIED * T) * B * B + B * d) * itemsize
        if rows == n and (device is None or torch.device(device).type == "cpu"):
            # the SMO phase's compact blocks of shrunk coordinates (joker_ext.smo._Compact), one per column running
            # at once
            per_block += min(T, torch.get_num_threads()) * int(COMPACT_SHARE * n) ** 2 * itemsize
        per_chunk = min(max(1, FILL_ELEMENTS // n), B) * n * itemsize  # the kernel rows of a cache fill
        return MemoryEstimate(per_row, per_block, per_chunk, 0)
    if solver == "newton":
        if exact:
            raise ValueError("the feature Newton engine needs n_features")
        if newton_rank is None or newton_sketch_rows is None:
            raise ValueError("solver='newton' needs newton_rank and newton_sketch_rows (see "
                             "joker_ext.primal_newton.default_rank and default_sketch_rows)")
        M, rank = n_features, min(int(newton_rank), n_features)
        p = itemsize if pass_itemsize is None else int(pass_itemsize)
        gpu = device is not None and torch.device(device).type == "cuda"
        # the inputs' copy on the device: all of it when resident, else a span of whole chunks (STREAM_BYTES)
        span = n * d * p if resident else min(n * d * p, max(r * d * p, STREAM_BYTES))
        cache = n * M * p if (keeps_features(n, M, p) if newton_cache is None else newton_cache) else 0
        per_row = n * (NEWTON_ROW_VECTORS * T + 1) * itemsize + span + cache
        # a pass: its feature chunk (r s / p rows of p bytes, kept between passes) and the product X W of its rows;
        # the gradient pass's chunk of r rows also has its copy in the solver dtype (a CONVERT_SPLIT-th of it at a
        # time), freed at the pass's end
        copy = 0 if p == itemsize else max(1, r // CONVERT_SPLIT) * M * itemsize
        passes = r * M * itemsize + max(r * M * itemsize // 2, copy + r * M * p // 2)
        q = max(1, r // 2)  # the sketch's sample chunk
        # while the sketch accumulates: the test matrix and the sketch (the SVD's factor and workspace too on the
        # CPU; on a GPU the row-wise maps' block comes after the test matrix is freed, or, where the sample has
        # fewer rows than M, one of the two, the sample's products with the test matrix and a block of it), and
        # a sample chunk: its features in the pass dtype, the product X W and their copy in the solver dtype,
        # times the test matrix
        n_s = min(int(newton_sketch_rows), n)
        if gpu and n_s < M and 4 * rank <= M:  # the one-buffer sketch (NystromPreconditioner.sketch's two_pass)
            buffers = M * rank + max(n_s * rank + TEST_MATRIX_BLOCK, IN_PLACE_BLOCK)
        elif gpu:
            buffers = max(2 * M * rank, M * rank + IN_PLACE_BLOCK)
        else:
            buffers = SKETCH_BUFFERS * M * rank
        sketch = buffers * itemsize + q * M * (itemsize + p + p // 2) + q * rank * itemsize + n_s * 8
        factor = M * rank * itemsize
        # the formed Hessian (primal_newton.ExactHessian) instead of the sketch, where the engine may form it: its
        # M x M sum and factor, and a chunk of weighted features (counted where it may, whatever newton_rank asked)
        kinked = loss is not None and needs_smoothing_loss(loss)
        formed = (rank >= M or (cache and M <= EXACT_HESSIAN_MAX_FEATURES)
                  or (kinked and M <= KINKED_HESSIAN_MAX_FEATURES))
        hessian = (2 * M * M + r * M) * itemsize if formed else 0
        model = (M * T + d * M + 8 * M * T) * itemsize  # beta, frequencies, the CG's M-vectors
        return MemoryEstimate(per_row, max(sketch - passes, factor, hessian), passes, model)
    if solver != "dbcd_tr":
        raise ValueError(f"solver must be 'dbcd_tr', 'newton' or 'working_set', got {solver!r}")
    per_row = n * (DBCD_ROW_VECTORS * T + 1) * itemsize + partition
    curved = loss is None or _positive_curvature(loss)
    matrix = "gram" if exact else block_model(b, requested="exact", gram_max=gram_max).matrix
    solve_direct = block_model(b, matrix=matrix, positive_curvature=curved, direct_max=direct_max).direct
    if exact:
        # K_BB (the kernels fill their distance block in place); the direct solve's matrices
        direct = DIRECT_MATRICES * b * b if solve_direct else 0
        per_block = (b * d + b * b + direct + work) * itemsize
        per_chunk = r * b * itemsize  # the chunk's kernel block K(X_c, X_B), evaluated in place
        model = 0
    else:
        M = n_features
        direct = (b * b + DIRECT_MATRICES * b * b) if solve_direct else 0
        # the block's features and their (cos, sin) intermediate; the formed block matrix and its direct solve,
        # or the Newton step's factors (at most one of the two at a time, both counted)
        per_block = (b * d + 2 * b * M + direct + NEWTON_PCG_MATRICES * b * b + work) * itemsize
        per_chunk = 2 * r * M * itemsize
        model = (M * T + d * M) * itemsize
    return MemoryEstimate(per_row, per_block, per_chunk, model)


def _positive_curvature(loss) -> bool:
    """Whether the conjugate's curvature ``psi''`` is positive (at the middle of the box for ``y = 1``, ``c = 1``)."""
    one = torch.ones(1, 1, dtype=torch.float64)
    lo, hi = loss.box(one, one)
    mid = torch.where(torch.isfinite(lo) & torch.isfinite(hi), 0.5 * (lo + hi),
                      torch.where(torch.isfinite(lo), lo + 0.5, torch.where(torch.isfinite(hi), hi - 0.5, 0 * lo)))
    return bool((loss.psi_hess(mid, one, one) > 0).all())


def plan_blocks(max_memory: Union[int, str], n: int, d: int, T: int = 1, *, n_features: Optional[int] = None,
                block_size: int = 1024, chunk_rows: int = 4096, itemsize: int = 8):
    """The largest ``(block_size, chunk_rows)`` not above the requested ones whose estimate fits.

    Chunks shrink first (they only cost time), then the block. Raises ValueError naming ``max_memory``
    when even one-row blocks do not fit.
    """
    budget = parse_memory(max_memory)
    b, r = min(block_size, n), min(chunk_rows, n)
    while True:
        est = estimate_fit_memory(n, d, T, n_features=n_features, block_size=b, chunk_rows=r, itemsize=itemsize)
        if est.total <= budget:
            return b, r, est
        if r > max(64, b):
            r = max(64, b, r // 2)
        elif b > 1:
            b = max(1, b // 2)
            r = min(r, max(64, b))
        else:
            raise ValueError(
                f"max_memory={max_memory!r} is too small: even one-row blocks need {est}; "
                f"the rows alone need {est.per_row / 2**20:.1f} MB"
            )


#: The feature Newton engine's planned rank halves down to this before its chunks do (measured on an H200,
#: flights 200k, M = 20,000: rank 1000 -> 256 cost 21 -> 25 products, chunks a quarter the size 4x the time) ...
SOFT_NEWTON_RANK = 256
#: ... and down to this after them (rank 64 took 119 products there).
MIN_NEWTON_RANK = 64
#: Its smallest planned chunk (rows of a pass): below it a pass is launch-bound on a GPU.
MIN_NEWTON_CHUNK = 64


def keeps_features(n: int, n_features: int, pass_itemsize: int) -> bool:
    """The feature Newton engine's default ``newton_cache``: whether its Hessian products' features, ``n x M`` in
    the pass dtype, take at most :data:`~joker_ext.defaults.FEATURE_CACHE_BYTES`."""
    return n * n_features * pass_itemsize <= FEATURE_CACHE_BYTES


def plan_newton(max_memory: Union[int, str], n: int, d: int, T: int = 1, *, n_features: int, rank: int,
                sketch_rows: int, chunk_rows: int = CHUNK_ROWS, itemsize: int = 8,
                pass_itemsize: Optional[int] = None, device=None, resident: bool = True):
    """The feature Newton engine's rank, chunk rows and input residency for a budget: the requested ones when
    their estimate (:func:`estimate_fit_memory`, ``solver='newton'``) fits. Else, in this order, each while
    the estimate does not fit: the rank halves down to :data:`SOFT_NEWTON_RANK` (cheap: measured on an H200,
    flights 200k, M = 20,000, rank 1000 -> 256 cost 21 -> 25 passes), the chunks halve down to
    :data:`MIN_NEWTON_CHUNK` rows (chunks a quarter the size cost 4x the time there: a pass of small chunks is
    launch-bound), the rank halves down to :data:`MIN_NEWTON_RANK` (rank 64: 119 passes). At the chunks it ends
    with, the largest rank tried on the way that fits is taken. ``sketch_rows`` is
    the sketch's sample size at the requested rank (it shrinks with the
    rank, as :func:`joker_ext.primal_newton.default_sketch_rows` does, never below 8192 rows). Before either, a
    ``resident`` copy of the inputs is dropped (the passes then stream them: ``n d`` numbers copied per pass,
    little next to computing ``n M`` features). Returns ``(rank, chunk_rows, resident, estimate)``; raises
    ValueError naming ``max_memory`` when even the smallest do not fit.
    """
    budget = parse_memory(max_memory)
    M = int(n_features)
    k, r = max(1, min(int(rank), M)), max(1, min(int(chunk_rows), n))

    def estimate(k, r):
        return estimate_fit_memory(n, d, T, n_features=M, chunk_rows=r, itemsize=itemsize, solver="newton",
                                   newton_rank=k, newton_sketch_rows=min(int(sketch_rows), max(8 * k, 8192)),
                                   pass_itemsize=pass_itemsize, device=device, resident=resident,
                                   newton_cache=False)

    ranks = [k]  # the ranks tried, largest first
    while True:
        est = estimate(k, r)
        if est.total <= budget:
            # the rank was halved before the chunks were: at the chunks it ends with, a larger one may fit again
            # (GPU default budget, 1M rows, M = 20,000: rank 256 -> 500 at the same 419-row chunks)
            for larger in ranks[:-1]:  # (k is the last)
                est_larger = estimate(larger, r)
                if est_larger.total <= budget:
                    return larger, r, resident, est_larger
            return k, r, resident, est
        if resident:
            resident = False
            continue
        if k > SOFT_NEWTON_RANK:
            k = max(SOFT_NEWTON_RANK, k // 2)
            ranks.append(k)
        elif r > MIN_NEWTON_CHUNK:
            r = max(MIN_NEWTON_CHUNK, r // 2)
        elif k > MIN_NEWTON_RANK:
            k = max(MIN_NEWTON_RANK, k // 2)
            ranks.append(k)
        else:
            raise ValueError(f"max_memory={max_memory!r} is too small for the feature Newton engine with n={n}, "
                             f"M={M}: even rank {k} and chunks of {r} rows need {est}")


def is_out_of_memory(exc: BaseException) -> bool:
    """True for torch's out-of-memory errors on any device (and MemoryError)."""
    if isinstance(exc, MemoryError):
        return True
    oom = getattr(torch, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "not enough memory" in msg
                                             or "can't allocate memory" in msg)
