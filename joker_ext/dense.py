"""Dense Cholesky factorisation and solves on any device, through the fastest LAPACK at hand.

Every engine factors dense symmetric positive (semi)definite matrices: the free blocks of the exact engines
(``K_FF + diag(d)``, tens to thousands of rows, hundreds of times per fit), the Nystrom centres' ``K_ZZ`` and the
Newton preconditioners' cores. :func:`cholesky_ex` is ``torch.linalg.cholesky_ex`` with one difference: when
torch runs on one thread, a CPU tensor in float32 or float64 that needs no gradient is factored by SciPy's LAPACK
(``?potrf``), on the transposed (column-major) view of its buffer, so that no copy is made going in and the
factor comes back row-major. Measured on one thread (x86-64, torch 2.13 with MKL, SciPy with OpenBLAS; ``m`` the
order), torch's own CPU factorisation took

====== ======== =========== ======
m      torch    SciPy potrf ratio
====== ======== =========== ======
128    0.104 ms 0.030 ms    3.5
256    0.570 ms 0.164 ms    3.5
512    3.38 ms  1.11 ms     3.1
1024   16.7 ms  7.6 ms      2.2
4000   479 ms   375 ms      1.3
====== ======== =========== ======

Both compute the same factor up to rounding (largest difference 1.4e-14 at m = 1024 for an ``A A^T + m I``).
Every other tensor (CUDA, other dtypes, batches, tensors that require grad) goes to torch unchanged.

**Threads.** SciPy's BLAS has its own thread pool beside torch's. On a 2-core machine the two pools' waiting
threads fought over the cores (OpenBLAS's threads keep spinning after a call): with torch on 2 threads and
SciPy's OpenBLAS on its default 2, the working set's hundreds of small factorisations made a hinge fit at
n = 4000 10x slower. With SciPy held to one thread and torch on two, torch's own two-thread factorisation was
still the faster in whole fits (absolute loss at n = 4000: 1.26 s against 1.54 s; epsilon-insensitive 0.25 s
against 0.26 s). So SciPy's factorisation is used only when torch itself runs on one thread
(``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``: parallel jobs, the benchmarks' one-thread rows), on the
calling thread alone (its BLAS limited to one thread for the call through threadpoolctl, about 9 us); otherwise
torch's, in torch's pool.
"""
from __future__ import annotations

import contextlib
import threading
from functools import lru_cache
from typing import Optional, Tuple

import numpy
import torch

try:  # optional: the compiled gather of :func:`submatrix` (torch's two index_selects without it)
    import numba
except ImportError:  # pragma: no cover - numba is a dependency
    numba = None

__all__ = ["MIXED_CONTRACTION", "MIXED_PRECISION_MIN", "RefinedCholesky", "cholesky_ex", "cholesky_pcg",
           "cholesky_preconditioner", "cholesky_shifted", "cholesky_solve", "pcg", "prefault_", "rows_product",
           "scipy_blas_on_one_thread", "submatrix"]


def _scipy_potrf(dtype: torch.dtype):
    from scipy.linalg import lapack

    return lapack.dpotrf if dtype == torch.float64 else lapack.spotrf


@lru_cache(maxsize=1)
def _scipy_blas():
    """threadpoolctl's handle on the BLAS libraries loaded (SciPy's among them, once ``scipy.linalg`` is imported)."""
    import scipy.linalg  # noqa: F401  (loads SciPy's BLAS before the libraries are listed)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas")


class _OneBlasThread:
    """Context manager: the BLAS libraries on one thread while any thread of the process is inside it. The limit is
    process-wide, so it is counted: the first thread in sets it, the last one out restores the previous setting
    (two overlapping plain limits would restore in the wrong order and leave the user's BLAS on one thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._inside = 0
        self._limiter = None

    def __enter__(self):
        with self._lock:
            if self._inside == 0:
                self._limiter = _scipy_blas().limit(limits=1)
            self._inside += 1

    def __exit__(self, *exc):
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                self._limiter.restore_original_limits()
                self._limiter = None
        return False


_ONE_BLAS_THREAD = _OneBlasThread()


def scipy_blas_on_one_thread():
    """A context in which :func:`cholesky_ex`'s SciPy path keeps SciPy's BLAS on one thread from entry to exit
    instead of limiting it at each call (the limit is counted, so the calls inside only count themselves in):
    for an engine's whole fit, whose hundreds of small factorisations each paid the limit's 10-30 us. Does
    nothing when torch runs on more than one thread (SciPy's path is then not taken)."""
    return _ONE_BLAS_THREAD if torch.get_num_threads() == 1 else contextlib.nullcontext()


#: Entries of ``K`` gathered at a time by :func:`submatrix` without numba (bounds its temporary rows).
GATHER_ELEMENTS = 2**21


#: Fresh CPU outputs of at least this many entries are touched by :func:`prefault_` before a compiled loop fills them.
PREFAULT_ELEMENTS = 2**17


def prefault_(t: torch.Tensor) -> torch.Tensor:
    """``t`` (fresh memory) zeroed in place by torch's threads when it is a CPU tensor of at least
    :data:`PREFAULT_ELEMENTS` entries: its pages are then mapped by every thread at once instead of one by one inside
    the single-threaded compiled loop that fills it (47 MB, a 2,421 x 2,421 block: 9 ms of zeroing on two threads and
    a 7.7 ms gather, against 27.6 ms for the gather into untouched memory). Returns ``t``."""
    if t.device.type == "cpu" and t.numel() >= PREFAULT_ELEMENTS:
        t.zero_()
    return t


def _gather_loop(K, rows, cols, out):  # pragma: no cover - compiled
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(cols.shape[0]):
            out[i, j] = K[r, cols[j]]


_gather_compiled = numba.njit(cache=True, nogil=True)(_gather_loop) if numba is not None else None


def submatrix(K: torch.Tensor, rows: torch.Tensor, cols: Optional[torch.Tensor] = None,
              out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``K[rows][:, cols]`` (``cols = rows`` by default), into ``out`` when given (in ``out``'s dtype, which may be
    float32 for a float64 ``K``: the block rounded as it is read). On the CPU a compiled loop reads
    each entry once: 4-8x faster than ``index_select`` twice, which copies whole rows first and then gathers along
    them (into memory already touched: 7.4 ms against 1.3 ms for a 1000 x 1000 block of a 2148 x 2148 matrix, 20
    ms against 5 ms for 2000 of 4000; a fresh output adds its page faults to either), itself about twice as fast as
    advanced indexing. Elsewhere, or without numba, the two index_selects, a few rows at a time
    (:data:`GATHER_ELEMENTS` bounds the temporary rows ``K[rows_chunk, :]``)."""
    cols = rows if cols is None else cols
    fresh = out is None
    if fresh:
        out = torch.empty(rows.numel(), cols.numel(), dtype=K.dtype, device=K.device)
    if _gather_compiled is not None and K.device.type == "cpu" and K.dim() == 2 and not K.requires_grad \
            and K.dtype in (torch.float64, torch.float32):
        if fresh:
            prefault_(out)
        _gather_compiled(K.contiguous().numpy(), rows.contiguous().numpy(), cols.contiguous().numpy(), out.numpy())
        return out
    step = max(1, GATHER_ELEMENTS // max(1, K.shape[1]))
    for s in range(0, rows.numel(), step):
        if out.dtype == K.dtype:
            torch.index_select(K.index_select(0, rows[s:s + step]), 1, cols, out=out[s:s + step])
        else:  # (index_select writes only its input's dtype)
            out[s:s + step] = K.index_select(0, rows[s:s + step]).index_select(1, cols)
    return out


#: :func:`rows_product` with at most this many columns reads the rows in place (a sparse product); with more, it
#: gathers them in chunks of :data:`PRODUCT_CHUNK_ELEMENTS` entries for dense products.
SPARSE_PRODUCT_COLUMNS = 2
#: Entries of the chunk of rows that :func:`rows_product` gathers at a time for its dense products (float64: 2 MB, one
#: buffer that stays in the processor's cache from one chunk to the next). In one-vs-rest fits (hinge, n = 4,000;
#: ``K A`` after the SMO phase, 10-26 columns, 1,000-3,200 rows): 3.6-29 ms against 7-28 ms with chunks of 2^21
#: entries in one buffer and 8-56 ms with a fresh block of 2^21 per chunk.
PRODUCT_CHUNK_ELEMENTS = 2**18


def rows_product(R: torch.Tensor, rows: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """``R[rows]^T V`` (``R.shape[1] x T`` for ``V`` of ``len(rows) x T``). For ``T <= SPARSE_PRODUCT_COLUMNS``
    without copying the rows: a sparse ``(T x len(R))`` times dense product, which reads each chosen row once per
    column (``index_select`` first copied them: 4.6 ms against 2.0 ms for 1,000 rows of 4,000, 26 ms against 6 ms
    for 2,000). For more columns, which the sparse product reads the rows for again, the rows are gathered a chunk
    at a time into one small buffer (a fresh block per chunk cost its page faults each time) for dense products
    ``V_chunk^T R_chunk``, which read the rows in their own order (``R_chunk^T V_chunk`` was 1.3-1.7x slower).
    One-vs-rest fits (hinge, n = 4,000, alternating fits against fresh blocks of 2^21 entries): texture 0.84x the
    fit's time, letter 0.91x, penbased, satimage 0.95x, optdigits 0.98x."""
    k, T = V.shape
    if T > SPARSE_PRODUCT_COLUMNS:
        out = torch.zeros(T, R.shape[1], dtype=torch.result_type(R, V), device=R.device)
        step = max(1, min(k, PRODUCT_CHUNK_ELEMENTS // R.shape[1]))
        chunk = prefault_(torch.empty(step, R.shape[1], dtype=R.dtype, device=R.device))
        Vt = V.mT
        for s in range(0, k, step):
            rows_s = rows[s:s + step]
            block = chunk[:rows_s.numel()]
            torch.index_select(R, 0, rows_s, out=block)
            out.addmm_(Vt[:, s:s + step], block)
        return out.mT
    ii = torch.stack([torch.arange(T, device=V.device).repeat_interleave(k), rows.repeat(T)])
    S = torch.sparse_coo_tensor(ii, V.T.reshape(-1), (T, R.shape[0]), check_invariants=False)
    return torch.sparse.mm(S, R).T


def cholesky_ex(H: torch.Tensor, *, upper: bool = False, overwrite: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Cholesky factor of the symmetric positive definite ``H``: ``(L, info)`` with ``H = L L^T`` (``upper=False``,
    ``L`` lower triangular) or ``(U, info)`` with ``H = U^T U`` (``upper=True``); ``info`` is 0 on success, else the
    order of the leading minor that is not positive definite (LAPACK's convention, as ``torch.linalg.cholesky_ex``).
    ``H`` is taken to be symmetric (SciPy's path reads its lower triangle, or its upper one for ``upper=True``; torch's
    path reads what torch reads) and is not modified unless ``overwrite``.

    Parameters
    ----------
    H : Tensor (m, m), or (..., m, m) for a batch (a batch goes to torch)
    upper : bool
        Return the upper factor ``U = L^T``.
    overwrite : bool
        Factor a contiguous ``(m, m)`` ``H`` in its own memory (the factor returned is ``H``; where ``info`` is not 0,
        ``H`` holds a partial factor). A fresh matrix of the size costs its page faults, about a sixth of the
        factorisation's time at ``m = 3,500`` on two cores, and doubles the peak.
    """
    overwrite = overwrite and H.dim() == 2 and H.is_contiguous() and not H.requires_grad
    if H.device.type != "cpu" or H.dtype not in (torch.float32, torch.float64) or H.dim() != 2 \
            or H.requires_grad or H.shape[0] == 0 or H.shape[0] != H.shape[1] or torch.get_num_threads() > 1:
        if overwrite:  # H's row-major memory is H^T = H column-major, where LAPACK works without a copy
            info = torch.empty((), dtype=torch.int32, device=H.device)
            torch.linalg.cholesky_ex(H.mT, upper=not upper, out=(H.mT, info))
            return H, info
        return torch.linalg.cholesky_ex(H, upper=upper)
    # the row-major lower triangle of H is the column-major upper triangle of its transpose: LAPACK's upper factor
    # U of H^T (column-major, U^T U = H since H is symmetric) read row-major is U^T = L, and the other way round
    potrf = _scipy_potrf(H.dtype)
    with _ONE_BLAS_THREAD:
        factor, info = potrf(H.detach().numpy().T, lower=int(upper), clean=1, overwrite_a=int(overwrite))
    out = torch.from_numpy(factor.T)
    if info < 0:  # pragma: no cover - an argument error, which the call above cannot make
        raise RuntimeError(f"LAPACK potrf: illegal argument {-info}")
    return out, torch.tensor(int(info), dtype=torch.int32)


def cholesky_solve(B: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """``(L L^T)^{-1} B`` for the lower factor ``L`` of :func:`cholesky_ex`, by two triangular solves, which read
    ``L`` in place whatever its layout (``torch.cholesky_solve`` copies a factor that is not column-major first: at
    n = 10,000 that copy took 0.9 s of kernel ridge regression's 13 s; for one right-hand side at n = 8000 on one
    thread it took 0.89 s against 0.086 s, a memory-bound solve that ADMM repeats every iteration)."""
    return torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, B, upper=False), upper=True)


def cholesky_shifted(H: torch.Tensor) -> torch.Tensor:
    """Cholesky factor of the symmetric PSD ``H``, shifted by a growing multiple of its largest diagonal
    entry when the plain factorisation fails (``H`` may be overwritten)."""
    scale = float(H.diagonal().abs().max().clamp_min(torch.finfo(H.dtype).tiny))
    step, shift = H.shape[0] * torch.finfo(H.dtype).eps * scale, 0.0
    for _ in range(12):
        L, info = cholesky_ex(H)
        if int(info) == 0:
            return L
        tried = shift
        H.diagonal().add_(step - shift)
        shift, step = step, step * 10.0
    raise torch.linalg.LinAlgError(
        f"the Newton system could not be factored: it is not positive definite even with its diagonal raised by "
        f"{tried:.1e} ({tried / scale:.0e} of its largest entry); is the kernel positive semidefinite? (e.g. "
        f"scikit-learn's 'sigmoid' kernel is not)")


#: Order from which the engines factor float64 systems in float32 and refine the solves (:class:`RefinedCholesky`;
#: below it a factorisation is too cheap for the refinements' products to pay off).
MIXED_PRECISION_MIN = 1024
#: A float64 system is factored in float32 only when a bound on its condition number times float32's epsilon is at
#: most this (the bounds used are loose: at 0.035 the refinements still reached residuals of 4e-15).
MIXED_CONTRACTION = 1.0


#: Entries :func:`float32_flushed` clears at a time without numba (a chunk stays in the processor's cache between its
#: passes).
FLUSH_ELEMENTS = 2**18


def _flush_loop(x, floor):  # pragma: no cover - compiled
    zero = numpy.float32(0.0)
    for i in range(x.shape[0]):
        v = x[i]
        x[i] = v if abs(v) >= floor else zero


_flush_compiled = numba.njit(cache=True, nogil=True)(_flush_loop) if numba is not None else None


def float32_flushed(H: torch.Tensor) -> torch.Tensor:
    """The square matrix ``H`` (float64) rounded to float32, with the entries below ``eps_32^2 max_i |H_ii|`` in
    magnitude set to zero (``eps_32 = 1.2e-7``): together they move a row by at most ``n eps_32^2`` times the largest
    diagonal entry, below float32's own rounding of it for ``n < 1 / eps_32``, and the product of two of the entries
    left stays far above float32's subnormal range. A float32 factorisation of the shifted kernel matrix is a
    preconditioner for float64 refinements (:class:`RefinedCholesky`); on the CPU each operation on a subnormal
    number (below ``1.2e-38``) takes a slow path, and kernel entries down to 1e-48 (Gaussian kernel on flights, n =
    4000, gamma 1x 'scale') left 7,689 of them in the factor: 350 ms for the float32 factorisation against 102 ms
    with the small entries cleared (float64: 176 ms). The clearing is a compiled pass over the float32 copy on the
    CPU (5 ms at n = 4000, where the conversion takes 17 ms); elsewhere, or without numba, a pass over chunks of about
    :data:`FLUSH_ELEMENTS` entries."""
    return flush_small_(H.to(torch.float32))


def flush_small_(H32: torch.Tensor) -> torch.Tensor:
    """The square float32 matrix ``H32`` with its entries below ``eps_32^2 max_i |H_ii|`` set to zero, in place
    (:func:`float32_flushed`); returns it."""
    floor = torch.finfo(torch.float32).eps ** 2 * float(H32.diagonal().abs().max()) if H32.numel() else 0.0
    if _flush_compiled is not None and H32.device.type == "cpu" and H32.is_contiguous() and not H32.requires_grad:
        _flush_compiled(H32.view(-1).numpy(), numpy.float32(floor))
        return H32
    step = max(1, FLUSH_ELEMENTS // max(1, H32.shape[1]))
    for s in range(0, H32.shape[0], step):
        rows = H32[s:s + step]
        rows.masked_fill_(rows.abs() < floor, 0.0)
    return H32


class RefinedCholesky:
    """``H^{-1} R`` in the precision of ``R`` (float64) through a float32 Cholesky factor of ``H``: mixed-precision
    iterative refinement, ``X += (L L^T)^{-1} (R - H X)``, the residual formed in float64 by ``residual(R, X)``.

    A float32 factorisation costs half a float64 one on the CPU (0.17 s against 0.33 s at m = 4000 on two cores).
    Each refinement divides the error by about ``cond(H) eps_32`` (so it converges when that is below 1) and costs
    two triangular solves and one ``residual``. A refinement that does not shrink the residual is dropped (the factor
    is then too inexact for ``H``); :attr:`residual` says how far the last solve got, so that a caller that needs
    float64's accuracy can factor in float64 instead.

    Parameters
    ----------
    L : Tensor (m, m), float32
        The lower Cholesky factor of ``H`` rounded to float32.
    residual : callable
        ``(R, X) -> R - H X`` in the caller's precision, for ``R`` and ``X`` of shape (m, k).
    refinements : int
        Largest number of refinement steps per solve.
    refined : float
        A solve stops refining once ``max |R - H X|`` is at most this times ``max |R|``.
    """

    def __init__(self, L: torch.Tensor, residual, refinements: int, refined: float):
        self.L, self._residual = L, residual
        self.refinements, self.refined = refinements, refined
        self.residual = 0.0  # max |R - H X| / max |R| of the last solve

    def solve(self, R: torch.Tensor) -> torch.Tensor:
        """``H^{-1} R`` for ``R`` of shape (m, k)."""
        X = self._solve32(R)
        residual = self._residual(R, X)
        scale = float(R.abs().max())
        size = float(residual.abs().max())
        for _ in range(self.refinements):
            if size <= self.refined * scale:
                break
            refined = X + self._solve32(residual)
            new_residual = self._residual(R, refined)
            new_size = float(new_residual.abs().max())
            if not new_size <= size:  # the factor is too inexact to refine
                break
            X, residual, size = refined, new_residual, new_size
        self.residual = size / scale if scale > 0 else 0.0
        return X

    def _solve32(self, R: torch.Tensor) -> torch.Tensor:
        return cholesky_solve(R.to(torch.float32), self.L).to(R.dtype)


def cholesky_pcg(L: torch.Tensor, product, V: torch.Tensor, *, tol: float, max_iter: int) -> Tuple[torch.Tensor, float]:
    r"""``H^{-1} V`` in ``V``'s precision by conjugate gradients on ``H``, preconditioned by the Cholesky factor ``L``
    of a matrix near ``H``: ``H`` itself rounded to float32, or ``H`` at an earlier Newton iterate
    (:func:`pcg` with the preconditioner ``R -> (L L^T)^{-1} R``, solved in ``L``'s dtype).

    Against refinement (:class:`RefinedCholesky`, whose error falls by ``cond(H) eps_32`` per step) it needs fewer
    steps through a float32 factor of ``H`` (3 against 6 for the logistic Newton systems at n = 10,000) and still
    converges through a factor of a nearby matrix, where refinement diverges.

    Parameters
    ----------
    L : Tensor (m, m)
        Lower Cholesky factor of the preconditioner (any floating dtype; the solves are done in its dtype).
    product, V, tol, max_iter
        As :func:`pcg`.

    Returns
    -------
    X : Tensor (m, k)
    residual : float
        As :func:`pcg`.
    """
    return pcg(cholesky_preconditioner(L), product, V, tol=tol, max_iter=max_iter)


def cholesky_preconditioner(L: torch.Tensor):
    """The preconditioner ``R -> (L L^T)^{-1} R`` of :func:`pcg`, solved in ``L``'s dtype (float32 for a float32
    factor) and returned in ``R``'s."""
    return lambda R: cholesky_solve(R.to(L.dtype), L).to(R.dtype)


def pcg(precondition, product, V: torch.Tensor, *, tol: float, max_iter: int) -> Tuple[torch.Tensor, float]:
    r"""``H^{-1} V`` in ``V``'s precision by preconditioned conjugate gradients on the symmetric positive definite
    ``H``, for a preconditioner that is itself an inexact solve (a float32 Cholesky factor, or an earlier matrix's).

    Each column of ``V`` runs its own conjugate gradients, all in lockstep; one iteration costs one ``product`` and
    one ``precondition``. On the CPU the run stops once every column has reached ``tol``; elsewhere it runs
    ``max_iter`` iterations, a finished column's steps being zero, so that it never waits for the device before
    the residual it returns. The preconditioner's rounding makes it slightly inexact, so the directions are
    conjugated by the flexible (Polak-Ribiere) rule ``beta = z_new^T (r_new - r_old) / z_old^T r_old``, which
    tolerates that; the residual is updated in ``V``'s precision from the exact products, so it tracks ``V - H X``
    to that precision's rounding.

    Parameters
    ----------
    precondition : callable
        ``R -> P^{-1} R`` for ``R`` of shape (m, k), returned in ``R``'s dtype (``P`` near ``H``, symmetric positive
        definite).
    product : callable
        ``X -> H X`` for ``X`` of shape (m, k), in ``V``'s precision.
    V : Tensor (m, k)
    tol : float
        A column stops once ``||V - H X||_2 <= tol ||V||_2``.
    max_iter : int
        Largest number of iterations (products).

    Returns
    -------
    X : Tensor (m, k)
    residual : float
        The largest ``||V - H X|| / ||V||`` over the columns (0 for zero columns).
    """
    X = torch.zeros_like(V)
    R = V.clone()
    norms = V.norm(dim=0)
    target = tol * norms
    Z = precondition(R)
    P = Z.clone()
    rz = (R * Z).sum(0)
    residual = R.norm(dim=0)
    on_host = V.device.type == "cpu"
    for _ in range(max(1, max_iter)):
        active = residual > target
        if on_host and not bool(active.any()):  # (on a GPU the finished columns' steps are zero: no wait)
            break
        HP = product(P)
        curvature = (P * HP).sum(0)
        ok = active & (curvature > 0)
        step = torch.where(ok, rz / torch.where(ok, curvature, torch.ones_like(curvature)), torch.zeros_like(rz))
        X.add_(step * P)
        R_old = R
        R = R - step * HP
        residual = torch.where(ok, R.norm(dim=0), residual)
        Z = precondition(R)
        beta = (Z * (R - R_old)).sum(0) / torch.where(rz != 0, rz, torch.ones_like(rz))
        P = Z + beta.clamp_min(0.0) * P
        rz = (R * Z).sum(0)
    relative = residual / torch.where(norms > 0, norms, torch.ones_like(norms))
    return X, float(relative.max()) if relative.numel() else 0.0
