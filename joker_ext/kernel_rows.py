"""Rows of a stationary kernel matrix, one at a time, inside compiled loops (the SMO phase, :mod:`joker_ext.smo`).

A step of the SMO phase needs the rows ``K(x_i, X)`` of the two coordinates it moves. Through torch, a row costs a
call of the kernel (tens of microseconds of overhead), so the phase formed them in blocks of rows guessed ahead,
and most of those were never read (banana, n = 4000: 3,994 formed, 1,057 read). :func:`form_row` forms exactly
the row a step needs, from the compiled loop itself:

* the distances from the scaled points (``x / sigma``, per dimension with ARD bandwidths), stored by dimension
  (``d x n``) so that the loop over the points vectorizes: ``r_2^2 = sum_c (p_ic - p_kc)^2`` from the differences
  (no cancellation, unlike the Gram form ``|a|^2 + |b|^2 - 2 a.b`` of the blocks), or ``r_1 = sum_c |p_ic - p_kc|``;
* the family's profile (:mod:`joker_ext.kernels`' table) times the output scale, with :func:`exp_nonpositive`:
  an exponential of a non-positive argument that vectorizes (libm's ``exp`` does not: 4.3 ns an element
  against 1 ns), within 1 unit in the last place of the true value (as torch's own ``exp``).

The rows agree with :class:`joker_ext.kernels.StationaryKernel`'s blocks to rounding; the kernels it cannot form
(:func:`row_former` returns None) go on through the blocks.

numba's cache of the compiled loops that call :func:`form_row` does not follow the call into this module: after
editing it, touch :mod:`joker_ext.smo` (or clear its ``__pycache__``).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np
import torch

from .kernels import StationaryKernel

try:  # optional: without numba the SMO phase, the only caller, is skipped
    import numba
except ImportError:  # pragma: no cover - numba is a dependency
    numba = None

__all__ = ["RowFormer", "forms_rows", "row_former", "no_row_former", "form_row", "exp_nonpositive"]

# family codes of the compiled profile
GAUSSIAN, LAPLACIAN, LAPLACIAN_L1, MATERN_15, MATERN_25, NONE = 0, 1, 2, 3, 4, -1

# exp(x) = 2^k exp(r), k = round(x / ln 2), r = x - k ln 2 in two parts (Cody and Waite); |r| <= ln(2) / 2, where
# the degree-13 Taylor polynomial's truncation error is below 4e-18 relative
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
# adding 1.5 * 2^52 rounds x / ln 2 to an integer k, which is then held in the low bits of the sum's pattern
_SHIFTER = 6755399441055744.0
_SHIFTER_BITS = int(np.float64(_SHIFTER).view(np.int64))
#: Below this argument ``exp`` would be subnormal (under 2.2e-308); it returns 0 there.
EXP_FLOOR = -708.0


class RowFormer(NamedTuple):
    """What the compiled loop needs to form rows of ``K(X, X)``: ``points`` (``d x n``, the scaled inputs by
    dimension), the family's code, the output scale, scratch space (``4 x n``: three rows for :func:`form_row`, one
    for the row it forms), and ``left[0]``, the rows it may still form (the loop counts it down; at 0 it forms no
    more)."""
    points: np.ndarray
    family: int
    scale: float
    scratch: np.ndarray
    left: np.ndarray


def no_row_former() -> RowFormer:
    """The former of a kernel whose rows the loop cannot form (family ``NONE``)."""
    return RowFormer(np.zeros((0, 0)), NONE, 1.0, np.zeros((4, 0)), np.zeros(1, dtype=np.int64))


def forms_rows(kernel) -> bool:
    """Whether the compiled loop can form ``kernel``'s rows (a :class:`joker_ext.kernels.StationaryKernel`, numba at
    hand)."""
    return numba is not None and type(kernel) is StationaryKernel


def row_former(kernel, X: torch.Tensor, max_rows: Optional[int] = None) -> Optional[RowFormer]:
    """The :class:`RowFormer` of ``kernel`` on the rows ``X`` (float64, CPU), or None when its rows cannot be
    formed in the loop (kernels other than :class:`joker_ext.kernels.StationaryKernel`). ``max_rows``: the most
    rows it forms (default: no limit)."""
    if not forms_rows(kernel):
        return None
    if kernel.family == "gaussian":
        family = GAUSSIAN
    elif kernel.family == "laplacian_l1":
        family = LAPLACIAN_L1
    else:  # 'laplacian' is the Matern of nu = 1/2
        family = {0.5: LAPLACIAN, 1.5: MATERN_15, 2.5: MATERN_25}[float(kernel.nu)]
    points = _scaled_by_dimension(kernel, X)
    left = np.array([np.iinfo(np.int64).max if max_rows is None else max(0, int(max_rows))], dtype=np.int64)
    return RowFormer(points, family, float(kernel.outputscale), np.empty((4, X.shape[0])), left)


def _njit(fn):
    return numba.njit(cache=True, nogil=True, fastmath={"contract"})(fn) if numba is not None else fn


def _scaled_by_dimension(kernel, X: torch.Tensor) -> np.ndarray:
    """The scaled points ``x / sigma`` by dimension (``d x n``, float64), the numbers of ``kernel.scale_inputs(X).T``
    (a quotient is correctly rounded either way), in one transposing pass over tiles of points
    (:func:`_transpose_divided`): the scaled copy and then its transposed copy cost 1.0-1.4 ms at 4,496 x 64 inside a
    fit (fresh memory each), the one pass 0.2-0.5 ms."""
    X = X.to(torch.float64).contiguous()
    sigma = kernel.bandwidths(X.shape[1], torch.float64, X.device).reshape(-1).expand(X.shape[1]).contiguous()
    out = np.empty((X.shape[1], X.shape[0]))
    _transpose_divided(X.numpy(), sigma.numpy(), out)
    return out


@_njit
def _transpose_divided(X, sigma, out):  # pragma: no cover - compiled
    """``out[c, i] = X[i, c] / sigma[c]``, over tiles of 64 points (the reads of a tile stay in the cache while each
    of its dimensions is written)."""
    n, d = X.shape
    for start in range(0, n, 64):
        stop = min(n, start + 64)
        for c in range(d):
            s = sigma[c]
            for i in range(start, stop):
                out[c, i] = X[i, c] / s


@_njit
def exp_nonpositive(x, out, scratch):  # pragma: no cover - compiled
    """``out = exp(x)`` elementwise for ``x <= 0`` (0 below :data:`EXP_FLOOR`), within 1 ulp; ``scratch``: as
    ``x``. The three vectors must not overlap (``out = x`` does not vectorize: 4x slower)."""
    n = x.shape[0]
    for k in range(n):
        xk = max(x[k], EXP_FLOOR)
        t = xk * _LOG2E + _SHIFTER
        kf = t - _SHIFTER
        r = (xk - kf * _LN2_HI) - kf * _LN2_LO
        p = 1.0 / 6227020800.0
        p = p * r + 1.0 / 479001600.0
        p = p * r + 1.0 / 39916800.0
        p = p * r + 1.0 / 3628800.0
        p = p * r + 1.0 / 362880.0
        p = p * r + 1.0 / 40320.0
        p = p * r + 1.0 / 5040.0
        p = p * r + 1.0 / 720.0
        p = p * r + 1.0 / 120.0
        p = p * r + 1.0 / 24.0
        p = p * r + 1.0 / 6.0
        p = p * r + 0.5
        p = p * r + 1.0
        p = p * r + 1.0
        scratch[k] = t
        out[k] = p if x[k] >= EXP_FLOOR else 0.0
    bits = scratch.view(np.int64)
    for k in range(n):  # 2^k from k's bits: the exponent field k + 1023
        bits[k] = (bits[k] - _SHIFTER_BITS + 1023) << 52
    for k in range(n):
        out[k] *= scratch[k]


@_njit
def _distances(points, i, row, l1):  # pragma: no cover - compiled
    """``row[k] = sum_c |p_ci - p_ck|`` (``l1``) or ``sum_c (p_ci - p_ck)^2`` over the dimensions ``c`` of
    ``points`` (``d x n``), eight dimensions per pass over ``row`` (a pass per dimension is bound by the loads and
    stores of ``row``: 1.5-1.7x slower at d = 8-98, n = 4000)."""
    d, n = points.shape
    for k in range(n):
        row[k] = 0.0
    c = 0
    while c + 8 <= d:
        q0, q1, q2, q3 = points[c, i], points[c + 1, i], points[c + 2, i], points[c + 3, i]
        q4, q5, q6, q7 = points[c + 4, i], points[c + 5, i], points[c + 6, i], points[c + 7, i]
        r0, r1, r2, r3 = points[c], points[c + 1], points[c + 2], points[c + 3]
        r4, r5, r6, r7 = points[c + 4], points[c + 5], points[c + 6], points[c + 7]
        if l1:
            for k in range(n):
                row[k] += (((abs(q0 - r0[k]) + abs(q1 - r1[k])) + (abs(q2 - r2[k]) + abs(q3 - r3[k])))
                           + ((abs(q4 - r4[k]) + abs(q5 - r5[k])) + (abs(q6 - r6[k]) + abs(q7 - r7[k]))))
        else:
            for k in range(n):
                e0, e1, e2, e3 = q0 - r0[k], q1 - r1[k], q2 - r2[k], q3 - r3[k]
                e4, e5, e6, e7 = q4 - r4[k], q5 - r5[k], q6 - r6[k], q7 - r7[k]
                row[k] += (((e0 * e0 + e1 * e1) + (e2 * e2 + e3 * e3))
                           + ((e4 * e4 + e5 * e5) + (e6 * e6 + e7 * e7)))
        c += 8
    while c < d:
        qc, rc = points[c, i], points[c]
        if l1:
            for k in range(n):
                row[k] += abs(qc - rc[k])
        else:
            for k in range(n):
                e = qc - rc[k]
                row[k] += e * e
        c += 1


@_njit
def form_row(points, family, scale, i, row, scratch):  # pragma: no cover - compiled
    """``row[k] = k(x_i, x_k)`` for every ``k``, from the scaled points ``points`` (``d x n``) of a kernel of
    ``family`` (a code of this module) and output ``scale``; ``scratch``: ``3 x n``."""
    n = points.shape[1]
    _distances(points, i, row, family == LAPLACIAN_L1)
    arg = scratch[1]  # the exponential's argument
    if family == GAUSSIAN:
        for k in range(n):
            arg[k] = -0.5 * row[k]
        exp_nonpositive(arg, row, scratch[0])
    elif family == LAPLACIAN_L1:
        for k in range(n):
            arg[k] = -row[k]
        exp_nonpositive(arg, row, scratch[0])
    elif family == LAPLACIAN:
        for k in range(n):
            arg[k] = -math.sqrt(row[k])
        exp_nonpositive(arg, row, scratch[0])
    else:  # Matern 3/2, 5/2: t = sqrt(2 nu) r, exp(-t) times (1 + t) or (1 + t + t^2 / 3)
        root = math.sqrt(3.0) if family == MATERN_15 else math.sqrt(5.0)
        cubic = 0.0 if family == MATERN_15 else 1.0 / 3.0
        for k in range(n):
            t = root * math.sqrt(row[k])
            arg[k] = -t
            row[k] = 1.0 + t + cubic * t * t
        exponential = scratch[2]
        exp_nonpositive(arg, exponential, scratch[0])
        for k in range(n):
            row[k] *= exponential[k]
    if scale != 1.0:
        for k in range(n):
            row[k] *= scale
