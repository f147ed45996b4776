"""Sequential minimal optimisation: the working-set engine's first phase on the CPU.

The box QP of one target column (the notation of :mod:`joker_ext.active_set`)::

    min_a  1/2 a^T K a + sum_i [-lin_i a_i + h_i a_i^2 / 2 + kink |a_i|]
    s.t.   lo_i <= a_i <= hi_i            (and sum_i a_i = total with an intercept)

is solved, to a loose tolerance, by steps on one coordinate (no intercept) or on a pair that keeps the sum (with an
intercept), each solved exactly along its direction: the method of LIBSVM (Platt's sequential minimal
optimisation; the pair chosen by the second-order rule of Fan, Chen and Lin, 2005, JMLR 6). With ``g = K a + h a -
lin`` the smooth part's gradient, moving ``a_i`` up costs ``dp_i = g_i + kink sign+(a_i)`` per unit (``sign+`` is
+1 at or above zero) and moving it down saves ``dm_i = g_i + kink sign-(a_i)`` (+1 strictly above zero). With an
intercept, ``a`` is optimal iff ``min dp`` over the coordinates below ``hi`` is at least ``max dm`` over those above
``lo``; the phase stops when the difference (the maximal violation) is below ``tol``:

* ``i`` has the smallest ``dp``; ``j`` the largest ``(dm_j - dp_i)^2 / (Q_ii + Q_jj - 2 K_ij)`` (``Q = K +
  diag(h)``) among those with ``dm_j > dp_i``: the pair whose exact step decreases the objective most, given ``i``;
* the step ``t`` moves ``a_i`` up and ``a_j`` down by ``(dm_j - dp_i) / (Q_ii + Q_jj - 2 K_ij)``, cut where either
  reaches its bound or the kink at zero (past the kink the costs change: the next step goes on from there);
* ``g`` gains ``t (K_i - K_j)`` (and the ``h`` terms): two kernel rows per step.

Without an intercept, a step moves the one coordinate whose exact step gains most (``dp_i^2 / Q_ii`` up, ``dm_i^2 /
Q_ii`` down), or the pair above when its step gains more: one-coordinate steps alone zigzag along the kernel's top
eigenvector (nearly constant for a smooth kernel), which the pairs' directions ``e_i - e_j`` leave alone (hinge without
an intercept, n = 1,000-4,000, 29 problems: 0.64x the fit's time, geometric mean; at C = 100, 0.11-0.34x where the
one-coordinate steps left a free set four times the solution's after ``5 n`` steps).

A step costs ``O(n)`` (the choice and the update) plus the kernel rows it needs, read from the working-set engine's
cache of ``K`` (formed lazily, all ``n`` rows kept). A row not yet formed is formed by the
compiled loop itself for the stationary kernels (:mod:`joker_ext.kernel_rows`: ``O(n d)``, only the rows the steps
read), on inputs of more than ``FORM_MAX_DIM`` dimensions only until ``FORM_SHARE n`` rows are held, on more
than ``FORM_SHARE_MAX_DIM`` until a share falling as ``1 / d`` is, and until a small share where the points do not fit
a core's own cache (each row reads them all). Otherwise it stops the loop, and the driver
forms it together with the rows of the worst violators still without one (the coordinates the next steps are likely
to choose) in one kernel evaluation: matrix products are cheaper per row, but many of the guessed rows are never read
(banana, n = 4000, in blocks of 256: 3,994 rows formed where the steps read 1,057), so the blocks grow while their
rows are used and shrink while they are not (``PREFETCH``).

Coordinates at a bound (or at the kink) whose costs lie beyond the current extremes are left out of the choice
after ``SHRINK_FIRST`` steps and then every ``SHRINK_EVERY`` steps (LIBSVM's shrinking; ``g`` stays exact for all
of them, so they return at no cost when the rest is optimal). Where a shrinking keeps at most ``COMPACT_SHARE`` of
the coordinates, the steps go on in a copy of the problem on those alone (:class:`_Compact`), reading rows of their
number, and the left-out coordinates' gradient is brought up to date when the copy is optimal. The phase ends at
the tolerance, after ``max_steps``, or once its sets (at ``lo``, at ``hi``, at the kink, free) have settled: a round
of ``n / 4`` steps that changed the sets of fewer than ``settled`` times as many coordinates, with at least
``SETTLE_MIN_FREE`` times as many free. What is left then is mostly the linear system on the free set, which one
factorisation solves and thousands of further steps only approach.

Why this phase: the working-set engine's subproblems cost factorisations, 10-20 of them when the sets are far from
the solution's; the decomposition pays them while the free set and the bounds settle. Cheap steps find those sets
first (the same sets LIBSVM finds), and the working-set engine then certifies and finishes to the relative gap's
rounding floor from them, in 1-5 outer iterations where it took 9-46 from zero (hinge against SVC on five KEEL sets
at n = 4000: 1.5-6.7x SVC's time without the phase, 0.8-2.5x with it; the synthetic grid at n = 10,000: 0.45-0.99x
SVC's and SVR's).

Several columns (one-vs-rest classes, several targets) take their phases at once, on threads, each forming every
row it reads in the loop (:func:`smo_columns`; on inputs of at most ``CONCURRENT_MAX_DIM`` dimensions: one-vs-rest at
n = 4,000 on two threads, 0.58-0.97x the fit's time on six KEEL sets and scikit-learn's problems).

The loop is compiled by numba (``cache=True``: once per installation); without numba the phase is skipped.
"""
from __future__ import annotations

import functools
import math
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence

import numpy as np
import torch

try:  # optional: the phase is skipped without it
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; this keeps the engine usable without it
    numba = None

from .box_sets import FREE
from .kernel_rows import NONE as NO_FORMER, RowFormer, form_row, forms_rows, no_row_former, row_former

__all__ = ["smo_available", "smo_phase", "smo_columns"]

#: Rows formed per kernel evaluation when a step needs a row that is missing: that row and the rows of the worst
#: violators without one, at most ``PREFETCH``. The count starts at ``PREFETCH_START`` and doubles while at least
#: half of the rows formed so far were used (their coordinates moved since), halves (down to ``PREFETCH_MIN``) while
#: fewer than a quarter were: on an easy problem the steps read a few hundred rows, and blocks of 256 guesses formed
#: 2,048 rows where they read 315 (optdigits, n = 4000: 0.081 s against 0.043 s with blocks of 16); where nearly every
#: row is read, small blocks cost more per row (epsilon-insensitive, d = 64: 1.14x with blocks of 16).
PREFETCH = 256
PREFETCH_START = 32
PREFETCH_MIN = 16
#: Where the blocks guess badly (at ``PREFETCH_MIN`` rows, fewer than ``1 / PREFETCH_WASTE`` of the at least
#: ``PREFETCH_WASTE_ROWS`` rows formed in them used so far), a step that needs a row the loop may not form gets leave
#: to form ``LOOP_GRANT`` more rows there instead of a block, while the points take at most
#: ``LOOP_GRANT_POINTS_SHARE`` of a core's level 2 cache (:func:`_core_cache_bytes`; beyond, each row formed in the
#: loop reads them from the shared cache: 107 us a row against ~23 us a row of a block at n = 4000, d = 98). At small
#: ``C`` every coordinate starts with the same violation and the steps' second choice (through the first one's row)
#: is not the blocks' guess: optdigits (d = 64) at C = 0.03 formed 1,341 rows in 78 blocks of 16 for ~800 read, each
#: block's call costing as much as its kernel evaluation. Measured against no leave (hinge and epsilon-insensitive,
#: best of three alternating fits): n = 4000, optdigits (2.0 MB of points) at C = 0.03 and 1 0.70-0.71x and
#: 0.96-1.0x, spambase and make_classification (d = 30, 50) at C = 0.03 0.86-0.94x, epsilon-insensitive on flights
#: (d = 25) 0.85-0.86x, satimage and texture at C = 0.03 within the noise; n = 10,000, make_classification d = 30
#: (2.4 MB) within the noise. With leave on larger points: mushroom (n = 4000, d = 98, 3.1 MB) 1.03-1.18x,
#: make_classification at n = 10,000, d = 40 and 50 (3.2 and 4.0 MB) 1.06x and 1.17x. With ``PREFETCH_WASTE = 4``,
#: optdigits at C = 0.03 0.86x.
PREFETCH_WASTE = 2
PREFETCH_WASTE_ROWS = 64
LOOP_GRANT = 64
LOOP_GRANT_POINTS_SHARE = 1.25
#: Rows are formed one at a time inside the loop (:mod:`joker_ext.kernel_rows`), as many as the steps read, for inputs
#: of at most this many dimensions (beyond: ``FORM_SHARE``, ``FORM_SHARE_MAX_DIM``; the rest in blocks through the
#: cache). A formed row costs about ``n (0.11 d + 1.4)`` ns there (one
#: thread) against ``n (3 to 5)`` ns a row in blocks (two threads), which form 2-4x the rows the steps read.
#: Measured against blocks alone (hinge and epsilon-insensitive, n = 4000, two alternating fits, best of each):
#: d = 2-12, 0.51-0.86x the fit's time (banana 0.51x, syn8 0.73x, phoneme 0.77x); d = 16-32, 0.95-1.5x; the KEEL
#: sets of d = 57 and 98 within 10%. With the rows' distances eight dimensions a pass (session 37): d = 12-16,
#: 0.72-0.86x; d = 25, 1.0-1.07x; d = 32, 1.19-1.27x where the steps read nearly every row (most points free);
#: d = 50-57, 0.89-0.90x where they read 30% of them (scikit-learn's make_classification, spambase); d = 98 1.08x.
FORM_MAX_DIM = 20
#: Beyond ``FORM_MAX_DIM`` dimensions the loop still forms rows itself, up to this share of the ``n`` rows (those
#: the cache holds already count); the rest come in blocks. Where the steps read few rows (the support vectors of a
#: smooth kernel: 30% of them on the sets below) the loop's rows are the cheaper; where they read nearly all of them
#: (most points free) the blocks are, and half of the rows in the loop costs little there. Measured against blocks
#: alone (two alternating fits, best of each, n = 4000, hinge unless said): make_classification d = 50, C = 1 and 10,
#: 0.63x and 0.81x; spambase 0.77x; mushroom (d = 98) 0.94-1.04x; most points free (d = 25-32, gamma 0.125,
#: hinge and epsilon-insensitive) 1.00-1.08x, at n = 10,000 (d = 32, gamma 0.05) 1.10-1.13x in one run and
#: 0.92-0.97x in another. All rows in the loop: the same on the first three, 1.06-1.22x on the last.
FORM_SHARE = 0.5
#: ... up to this many dimensions; beyond, a row formed in the loop costs 2.5-3x a row of a block (more as ``d``
#: grows), and where most points are free the share's rows cost 15-50% of the fit (epsilon-insensitive on
#: make_regression, d = 64-100, n = 4000 and 10,000), so the share falls to ``FORM_SHARE_HIGH_DIM FORM_SHARE_MAX_DIM /
#: d``: enough for the problems whose steps read few rows, whose blocks of guessed rows cost more than the rows they
#: use (optdigits, d = 64: 331 rows in 22 blocks for 286 steps, the blocks' copies into fresh memory alone a sixth of
#: the phase). Measured against no rows in the loop beyond 60 dimensions (three or six alternating fits, best of
#: each, n = 4000): optdigits at C = 1 and 10 0.69x and 0.83x; mushroom (d = 98) 0.90-0.97x; make_classification
#: d = 64 and 100 0.91x and 1.08x (noise: 0.83x in another run); epsilon-insensitive on make_regression (most points
#: free), d = 64, 1.00x, d = 100, 1.05x, d = 64 at n = 10,000, 0.98x. With the share at FORM_SHARE (0.5) whatever
#: ``d``: the last three 1.04x, 1.20x and 1.11x; scaled by ``(60 / d)^2``: 1.13x, 1.14x, 1.11x.
FORM_SHARE_MAX_DIM = 60
FORM_SHARE_HIGH_DIM = 0.15
#: A row formed in the loop reads all of the scaled points (``8 n d`` bytes): at ~80 GB/s while they stay in the
#: core's own (level 2) cache, at ~30 GB/s from the shared one beyond it (one core, n = 4000: d = 48, 24 us a row;
#: d = 64 (2 MB), 49 us; d = 98, 107 us, where a row of a block costs ~23 us). Where the points take more than
#: ``FORM_POINTS_SHARE`` of that cache (its size from the system, :func:`_core_cache_bytes`), the loop forms at most
#: ``FORM_SHARE_BEYOND n`` rows: enough for a phase that reads few (optdigits at n = 4000, 2 MB of points, reads 330
#: rows: the same time as before, 1.2x with none in the loop). Measured against the shares above (best of two to four
#: alternating fits): n = 10,000, make_classification d = 32, 50, 100 0.76x, 0.63x, 0.90x, epsilon-insensitive on
#: make_regression d = 50 0.67x, flights (d = 25, 2.0 MB) 0.82x; n = 4000, make_regression d = 64 0.86x, mushroom
#: (d = 98) 0.94x, at n = 4515 0.94x and 1.00x; below the share (spambase, satimage, texture, chess: 1.4-1.7 MB)
#: unchanged, where no rows in the loop would cost them 1.05-1.9x.
FORM_POINTS_SHARE = 0.875
FORM_SHARE_BEYOND = 0.02
#: Several columns take their phases at once (:func:`smo_columns`) on inputs of at most this many dimensions, each
#: phase forming every row it reads in the loop: on two threads, against the columns one after another with the rows
#: as above (one-vs-rest, hinge, n = 4,000, best of three alternating fits): d = 16, penbased and letter 0.75x and
#: 0.72x; optdigits (d = 64) 0.58-0.63x, satimage (36) 0.78x, texture (40) 0.74x; scikit-learn's
#: ``make_classification`` d = 50, 100 and 150 0.79x, 0.88-0.91x and 0.97x, d = 200 1.01x, d = 300 1.24x. Beyond 20
#: dimensions with the rows through the cache (under a lock) instead, optdigits was no faster (0.99x).
CONCURRENT_MAX_DIM = 128
#: A phase of at most this many steps (times n) gives the driver ``K a`` from its gradient, ``g + lin - h a``, in
#: place of a product with the kernel rows of every nonzero coordinate: the rounding of ``g``'s updates grows with
#: the steps (hinge, n = 4000: 1.8e-15 of max |K a| after 309 steps, 1.0e-14 after 4,212, 4.4e-13 after 7,000,
#: 8.0e-12 after 19,975), below n steps within the product's own rounding. The product cost 0.7 ms of a 17 ms fit
#: (penbased) and 4 ms of 74 ms with ten one-vs-rest columns.
PRODUCT_FROM_GRADIENT_STEPS = 1.0
#: Steps per call of the compiled loop (between calls the driver checks the time budget and an interrupt).
CHUNK_STEPS = 20_000
#: Steps per round of the settling test (times n, at least ``SETTLE_MIN_STEPS``).
SETTLE_ROUND = 0.25
SETTLE_MIN_STEPS = 1000
#: The sets count as settled only while at least this share of a round's steps is free coordinates (100 at
#: n = 4000): what the settling rule leaves to the decomposition is the linear system on the free set, worth a
#: factorisation when it is large; a free set of a few dozen the steps solve at once, and the bounds still violated
#: there cost the decomposition outer iterations of mostly violators, each moving little more than the free set
#: (make_moons, noise 0.3, C = 100, gamma 0.3 and 1 x 'scale', 20 and 63 free at the settling: 8 and 9 outer
#: iterations). Measured against no such rule (hinge and epsilon-insensitive, best of two alternating fits, 48
#: problems at n = 4000 and 10,000): those two 0.45x and 0.81x, make_circles at C = 100 0.91x, the others within the
#: noise (the rule applies to none of them, or the phase reached its tolerance or its step limit first).
SETTLE_MIN_FREE = 0.1
#: Steps between shrinkings of the set the steps choose from (at most ``n``).
SHRINK_EVERY = 1000
#: Steps before the phase's first shrinking (at most ``n``): an easy problem's whole phase is a few hundred steps
#: (penbased, optdigits, letter at n = 4000: 350-920), which LIBSVM's 1,000 never shrank. Measured against 1,000
#: (alternating fits, hinge, with ``SHRINK_KEEP_MAX``): letter 0.71x at C = 10 (its phase 14.6 -> 8.3 ms) and 0.87x
#: at C = 1, penbased 0.92x, optdigits 0.90x, one-vs-rest on 3 / 5 classes 1.02x / 0.98x, mushroom the same; 17
#: other problems (hinge, epsilon-insensitive, squared hinge, Huber; n = 4000 and 10,000) within 0.98-1.04x. 100 did
#: as well on the easy sets and took mushroom at 4x 'scale' to 1.07x.
SHRINK_FIRST = 200
#: A shrinking that keeps more than this share of the coordinates is undone: the scans read the coordinates in
#: order when none is left out, through ``act`` otherwise (0.85x the time per coordinate in order). Without it the
#: first shrinking made one-vs-rest on 3 / 5 classes 1.07x / 1.03x slower (5% more per step, the same steps).
SHRINK_KEEP_MAX = 0.75
#: A shrinking that leaves at most this share of the ``n`` coordinates (on problems of at least ``COMPACT_MIN_N``)
#: hands the steps to a copy of the problem on those coordinates alone (:class:`_Compact`), whose kernel rows are
#: ``m`` numbers long.
COMPACT_SHARE = 0.5
COMPACT_MIN_N = 1000
#: A step direction whose curvature is below ``-NEGATIVE_CURVATURE`` times its diagonal terms proves the kernel
#: matrix indefinite (``(e_i - e_j)^T K (e_i - e_j) < 0``; for a positive semidefinite kernel rounding leaves it at
#: most a few units in the last place below zero).
NEGATIVE_CURVATURE = 1e-8
#: Smallest curvature of a step's direction (as a share of the kernel's mean diagonal); LIBSVM's ``tau``.
TAU = 1e-12

# status codes of the compiled loop
_CONVERGED, _STEPS, _NEEDS_ROW, _INDEFINITE, _SHRUNK = 0, 1, 2, 3, 4


def smo_available() -> bool:
    """Whether the compiled loop can run (numba is importable)."""
    return numba is not None


def _njit(fn):
    return numba.njit(cache=True, nogil=True)(fn) if numba is not None else fn


def _njit_vectorized(fn):
    """:func:`_njit` for loops free of NaN (their ``np.maximum`` then vectorizes)."""
    return numba.njit(cache=True, nogil=True, fastmath={"nnan", "nsz"})(fn) if numba is not None else fn


@_njit
def _set_offsets(k, a, lo, hi, kink, up_off, down_off):  # pragma: no cover - compiled
    """Coordinate ``k``'s costs less its gradient: moving up costs ``g_k + up_off[k]`` (+inf where ``a_k`` is at
    ``hi``), moving down saves ``g_k + down_off[k]`` (-inf at ``lo``)."""
    ak = a[k]
    up_off[k] = (kink if ak >= 0.0 else -kink) if ak < hi[k] else math.inf
    down_off[k] = (kink if ak > 0.0 else -kink) if ak > lo[k] else -math.inf


@_njit
def _offsets(a, lo, hi, kink):  # pragma: no cover - compiled
    """``(up_off, down_off)`` of every coordinate (:func:`_set_offsets`)."""
    n = a.shape[0]
    up_off, down_off = np.empty(n), np.empty(n)
    for k in range(n):
        _set_offsets(k, a, lo, hi, kink, up_off, down_off)
    return up_off, down_off


@_njit
def _formed(R, have, rows, k):  # pragma: no cover - compiled
    """Whether row ``k`` of ``R`` holds ``K(x_k, X)``: formed before, or now by ``rows`` (a
    :class:`~joker_ext.kernel_rows.RowFormer`); False when it is missing and ``rows`` cannot form it."""
    if have[k]:
        return True
    if rows.family == NO_FORMER or rows.left[0] <= 0:
        return False
    # formed aside and copied whole: a phase running beside this one may be reading the same row, which it formed
    # itself (the same numbers: a store of equal values is harmless, a row half-way through forming is not)
    formed = rows.scratch[3]
    form_row(rows.points, rows.family, rows.scale, k, formed, rows.scratch)
    R[k, :] = formed
    rows.left[0] -= 1
    have[k] = True
    return True


@_njit
def _row_at_hand(R, have, rows, parent, k):  # pragma: no cover - compiled
    """:func:`_formed`, or in a :class:`_Compact` block (``parent = (R_full, have_full, A, short)``, ``A`` empty
    outside one), row ``k`` of the block, ``R_full[A[k], A]``: copied from the full row, formed first by ``rows``
    where missing (full rows serve the phases of other columns, the block's gradient update when it ends and the
    engine after the phase), or, once ``rows`` can form no more, formed at the block's length by ``short`` (a
    :class:`~joker_ext.kernel_rows.RowFormer` on the block's points)."""
    if have[k]:
        return True
    A = parent[2]
    if A.shape[0] == 0:
        return _formed(R, have, rows, k)
    if _formed(parent[0], parent[1], rows, A[k]):
        full = parent[0][A[k]]
        for q in range(A.shape[0]):
            R[k, q] = full[A[q]]
        have[k] = True
        return True
    return _formed(R, have, parent[3], k)


@_njit
def _unshrink(act):  # pragma: no cover - compiled
    """Every coordinate back in ``act``; returns their number."""
    for k in range(act.shape[0]):
        act[k] = k
    return act.shape[0]


@_njit
def _shrink(act, n_act, a, g, kink, up_off, down_off, low, high):  # pragma: no cover - compiled
    """Keep in ``act[:n_act]`` the coordinates that may still be chosen: the free ones, and those at a bound or at
    the kink whose cost of moving off it is within ``[low, high]`` (up: ``dp <= high``; down: ``dm >= low``). Returns
    the new count; every coordinate, in order, when more than ``SHRINK_KEEP_MAX`` of them would stay (scans in order
    over all of them are the cheaper)."""
    kept = 0
    for p in range(n_act):
        k = act[p]
        free = up_off[k] < math.inf and down_off[k] > -math.inf and (kink == 0.0 or a[k] != 0.0)
        if free or g[k] + up_off[k] <= high or g[k] + down_off[k] >= low:
            act[kept] = k
            kept += 1
    if kept > SHRINK_KEEP_MAX * act.shape[0]:
        return _unshrink(act)
    return kept


@_njit
def _cheapest_up(g, up_off, down_off, act, n_act):  # pragma: no cover - compiled
    """Over ``act[:n_act]`` (a shrunk set; in order over all: :func:`_cheapest_up_in_order`): the coordinate ``i``
    that costs least to move up, that cost, and the largest saving of a move down (``(i, dp_i, dm_max)``)."""
    i = -1
    dp_i = math.inf
    dm_max = -math.inf
    for p in range(n_act):
        k = act[p]
        up = g[k] + up_off[k]
        if up < dp_i:
            dp_i = up
            i = k
        dm_max = max(dm_max, g[k] + down_off[k])
    return i, dp_i, dm_max


@_njit
def _best_partner(g, down_off, diag, h, Ri, qi, dp_i, tau, act, n_act):  # pragma: no cover - compiled
    """Over ``act[:n_act]``: the partner ``j`` of ``i`` (its row ``Ri``, ``qi = K_ii + h_i``) whose move down gains most
    at second order, ``(g_j + down_off_j - dp_i)^2 / curvature``; -1 when none gains."""
    j = -1
    best = 0.0
    for p in range(n_act):
        k = act[p]
        diff = max(g[k] + down_off[k] - dp_i, 0.0)
        gain = diff * diff / max(qi + diag[k] + h[k] - 2.0 * Ri[k], tau)
        if gain > best:
            best = gain
            j = k
    return j


@_njit_vectorized
def _partner_gains(g, down_off, diag, h, Ri, qi, dp_i, inv_scale, n, gains):  # pragma: no cover - compiled
    """``gains[k]``, for the first ``n`` coordinates: :func:`_best_partner`'s gains over the mean diagonal
    (``inv_scale`` its inverse; the floor of the curvature, ``TAU``, then a constant: with the floor a variable,
    numba's loop was not vectorized, 2.7x slower at n = 4000)."""
    for k in range(n):
        diff = np.maximum(g[k] + down_off[k] - dp_i, 0.0)
        gains[k] = diff * diff / np.maximum((qi + diag[k] + h[k] - 2.0 * Ri[k]) * inv_scale, TAU)


@_njit
def _partner(g, down_off, diag, h, Ri, qi, dp_i, tau, act, n_act, gains):  # pragma: no cover - compiled
    """:func:`_best_partner` over ``act[:n_act]``; when nothing is shrunk, over all coordinates in order, from their
    gains in ``gains`` (scratch of ``n`` numbers), computed in one vectorized loop, their largest in another, then
    the first coordinate holding it (an argmax inside the loop that divides kept it scalar: 3.0 against 6.6 us a scan
    at n = 4000; see :func:`_pair_steps`)."""
    if n_act < act.shape[0]:
        return _best_partner(g, down_off, diag, h, Ri, qi, dp_i, tau, act, n_act)
    _partner_gains(g, down_off, diag, h, Ri, qi, dp_i, TAU / tau, n_act, gains)
    best = _largest(gains, n_act)
    if best > 0.0:
        for k in range(n_act):
            if gains[k] == best:
                return k
    return -1


@_njit_vectorized
def _largest(x, n):  # pragma: no cover - compiled
    """``max(0, x[:n])``, in eight independent running maxima (one chain of maxima runs at its latency: 1.8x the time
    at n = 4000)."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = 0.0
    k = 0
    while k + 8 <= n:
        m0 = np.maximum(m0, x[k])
        m1 = np.maximum(m1, x[k + 1])
        m2 = np.maximum(m2, x[k + 2])
        m3 = np.maximum(m3, x[k + 3])
        m4 = np.maximum(m4, x[k + 4])
        m5 = np.maximum(m5, x[k + 5])
        m6 = np.maximum(m6, x[k + 6])
        m7 = np.maximum(m7, x[k + 7])
        k += 8
    while k < n:
        m0 = np.maximum(m0, x[k])
        k += 1
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))


@_njit
def _cheapest_up_in_order(g, up_off, down_off, n):  # pragma: no cover - compiled
    """:func:`_cheapest_up` over the first ``n`` coordinates in two passes: the two extremes in four independent
    chains each, then the first coordinate at the minimum (where there is one). The one-pass scan keeps the index of
    its running minimum, a chain of dependent compares that runs at their latency; at n = 4000 the two passes took
    2.0 us against 5.2 us. (Through ``act`` the gathered reads dominate and the one pass is as fast: 2.2 against 2.4
    us over 1,500 coordinates.)"""
    u0 = u1 = u2 = u3 = math.inf
    d0 = d1 = d2 = d3 = -math.inf
    k = 0
    while k + 4 <= n:
        u0 = min(u0, g[k] + up_off[k])
        u1 = min(u1, g[k + 1] + up_off[k + 1])
        u2 = min(u2, g[k + 2] + up_off[k + 2])
        u3 = min(u3, g[k + 3] + up_off[k + 3])
        d0 = max(d0, g[k] + down_off[k])
        d1 = max(d1, g[k + 1] + down_off[k + 1])
        d2 = max(d2, g[k + 2] + down_off[k + 2])
        d3 = max(d3, g[k + 3] + down_off[k + 3])
        k += 4
    while k < n:
        u0 = min(u0, g[k] + up_off[k])
        d0 = max(d0, g[k] + down_off[k])
        k += 1
    dp_i = min(min(u0, u1), min(u2, u3))
    dm_max = max(max(d0, d1), max(d2, d3))
    if dp_i < math.inf:
        for k in range(n):
            if g[k] + up_off[k] == dp_i:
                return k, dp_i, dm_max
    return -1, dp_i, dm_max


@_njit
def _worst_single_and_cheapest_up(g, up_off, down_off, diag, h, tau, act, n_act):  # pragma: no cover - compiled
    """Over ``act[:n_act]`` (a shrunk set; in order over all: :func:`_worst_single_and_cheapest_up_in_order`), in
    one scan: the coordinate ``s`` whose one-coordinate step gains most at second order (-1 when none violates its
    condition), the largest violation, and :func:`_cheapest_up`'s ``(i, dp_i, dm_max)``; returns ``(s, violation, i,
    dp_i, dm_max)``."""
    s = -1
    best = 0.0
    violation = 0.0
    i = -1
    dp_i = math.inf
    dm_max = -math.inf
    for p in range(n_act):
        k = act[p]
        up_cost = g[k] + up_off[k]
        down_cost = g[k] + down_off[k]
        worst = max(-min(up_cost, 0.0), max(down_cost, 0.0))
        violation = max(violation, worst)
        gain = worst * worst / max(diag[k] + h[k], tau)
        if gain > best:
            best = gain
            s = k
        if up_cost < dp_i:
            dp_i = up_cost
            i = k
        dm_max = max(dm_max, down_cost)
    return s, violation, i, dp_i, dm_max


@_njit_vectorized
def _single_gains(g, up_off, down_off, diag, h, inv_scale, n, gains):  # pragma: no cover - compiled
    """``gains[k]``, for the first ``n`` coordinates: :func:`_worst_single_and_cheapest_up`'s gains of the
    one-coordinate steps over the mean diagonal (``inv_scale`` its inverse; the floor ``TAU`` a constant, as in
    :func:`_partner_gains`)."""
    for k in range(n):
        worst = np.maximum(-np.minimum(g[k] + up_off[k], 0.0), np.maximum(g[k] + down_off[k], 0.0))
        gains[k] = worst * worst / np.maximum((diag[k] + h[k]) * inv_scale, TAU)


@_njit
def _worst_single_and_cheapest_up_in_order(g, up_off, down_off, diag, h, tau, n, gains):  # pragma: no cover
    """:func:`_worst_single_and_cheapest_up` over the first ``n`` coordinates in passes that vectorize
    (:func:`_cheapest_up_in_order`, the gains into ``gains``, scratch of ``n`` numbers, their largest, then the first
    coordinate holding it; the largest violation is ``max(-min(dp_i, 0), max(dm_max, 0))``): 5.0 against 7.1 us at
    n = 4000."""
    i, dp_i, dm_max = _cheapest_up_in_order(g, up_off, down_off, n)
    violation = max(-min(dp_i, 0.0), max(dm_max, 0.0))
    _single_gains(g, up_off, down_off, diag, h, TAU / tau, n, gains)
    best = _largest(gains, n)
    if best > 0.0:
        for k in range(n):
            if gains[k] == best:
                return k, violation, i, dp_i, dm_max
    return -1, violation, i, dp_i, dm_max


@_njit
def _pair_move(a, g, h, lo, hi, kink, up_off, down_off, i, j, Ri, Rj, dp_i, curvature, tau):  # pragma: no cover
    """The exact step along ``e_i - e_j`` (``a_i`` up, ``a_j`` down; ``Ri``, ``Rj`` their kernel rows), cut at the
    bounds and at the kink (the costs change there), applied to ``a``, ``g`` and the offsets; False when a bound
    blocks it (no move)."""
    t = (g[j] + down_off[j] - dp_i) / max(curvature, tau)
    ai_end, up_room = hi[i], hi[i] - a[i]
    if kink > 0.0 and a[i] < 0.0 and -a[i] < up_room:
        ai_end, up_room = 0.0, -a[i]
    aj_end, down_room = lo[j], a[j] - lo[j]
    if kink > 0.0 and a[j] > 0.0 and a[j] < down_room:
        aj_end, down_room = 0.0, a[j]
    if up_room < t:
        t = up_room
    if down_room < t:
        t = down_room
    if t <= 0.0:
        return False
    a[i] = ai_end if t == up_room else a[i] + t
    a[j] = aj_end if t == down_room else a[j] - t
    _set_offsets(i, a, lo, hi, kink, up_off, down_off)
    _set_offsets(j, a, lo, hi, kink, up_off, down_off)
    for k in range(a.shape[0]):
        g[k] += t * (Ri[k] - Rj[k])
    g[i] += h[i] * t
    g[j] -= h[j] * t
    return True


@_njit
def _pair_steps(R, have, rows, parent, diag, h, kink, lo, hi, a, g, tol, tau, max_steps, act, n_act, countdown,
                compact_below):  # pragma: no cover - compiled
    """Pair steps (with an intercept) until the maximal violation is below ``tol``, ``max_steps`` are taken, or a
    step needs a row ``have`` lacks and ``rows`` (a :class:`~joker_ext.kernel_rows.RowFormer`) cannot form it;
    returns ``(steps, status, row, n_act, countdown)``. The pair is chosen among ``act[:n_act]``, shrunk every
    ``SHRINK_EVERY`` steps (``countdown`` steps from now; it carries over from call to call) to the coordinates whose
    costs lie within the current extremes (LIBSVM's shrinking; ``g`` stays exact for all, so nothing needs
    reconstructing): when those are optimal, all coordinates are checked again. A shrinking that leaves at most
    ``compact_below`` coordinates ends the call (status ``_SHRUNK``): the driver goes on with them alone
    (:class:`_Compact`). The loops over coordinates avoid data-dependent branches (blocked directions cost infinity):
    mispredicted branches made a step 3-5x slower."""
    n = a.shape[0]
    up_off, down_off = _offsets(a, lo, hi, kink)
    gains = np.empty(n)  # the partner scan's scratch
    for step in range(max_steps):
        # (unshrunk, the coordinates are read in order, not through ``act``: the steps before the first shrink took
        # 0.85x the time, a fit on letter 0.8x; and in two passes that vectorize, see _cheapest_up_in_order)
        if n_act == n:
            i, dp_i, dm_max = _cheapest_up_in_order(g, up_off, down_off, n)
        else:
            i, dp_i, dm_max = _cheapest_up(g, up_off, down_off, act, n_act)
        if i < 0 or dm_max - dp_i < tol:
            if n_act < n:  # optimal on the shrunk set: check them all
                n_act, countdown = _unshrink(act), min(n, SHRINK_EVERY)
                continue
            return step, _CONVERGED, -1, n_act, countdown
        countdown -= 1
        if countdown == 0:
            n_act = _shrink(act, n_act, a, g, kink, up_off, down_off, dp_i, dm_max)
            countdown = min(n, SHRINK_EVERY)
            if n_act <= compact_below:
                return step, _SHRUNK, -1, n_act, countdown
        if not _row_at_hand(R, have, rows, parent, i):
            return step, _NEEDS_ROW, i, n_act, countdown
        Ri = R[i]
        qi = diag[i] + h[i]
        j = _partner(g, down_off, diag, h, Ri, qi, dp_i, tau, act, n_act, gains)
        if j < 0:
            return step, _CONVERGED, -1, n_act, countdown
        if not _row_at_hand(R, have, rows, parent, j):
            return step, _NEEDS_ROW, j, n_act, countdown
        Rj = R[j]
        curvature = qi + diag[j] + h[j] - 2.0 * Ri[j]
        if curvature < -NEGATIVE_CURVATURE * (abs(qi) + abs(diag[j] + h[j])):
            return step, _INDEFINITE, i * n + j, n_act, countdown
        if not _pair_move(a, g, h, lo, hi, kink, up_off, down_off, i, j, Ri, Rj, dp_i, curvature, tau):
            return step, _CONVERGED, -1, n_act, countdown
    return max_steps, _STEPS, -1, n_act, countdown


@_njit
def _free_sum_steps(R, have, rows, parent, diag, h, kink, lo, hi, a, g, tol, tau, max_steps, act, n_act, countdown,
                    compact_below):  # pragma: no cover - compiled
    """Steps without an intercept, as :func:`_pair_steps` (the same returns, shrinking and stop at ``tol``): each step
    the better, at second order, of the best one-coordinate step and the best pair step. The one-coordinate steps
    move ``sum a``; the pairs move along ``e_i - e_j``, which a one-coordinate step reaches only by zigzagging. A
    coordinate at a bound is kept while its costs lie within the current maximal violation or the pairs' extremes."""
    n = a.shape[0]
    up_off, down_off = _offsets(a, lo, hi, kink)
    gains = np.empty(n)  # the partner scan's scratch
    for step in range(max_steps):
        if n_act == n:  # (in order, see _pair_steps)
            s, violation, i, dp_i, dm_max = _worst_single_and_cheapest_up_in_order(g, up_off, down_off, diag, h, tau,
                                                                                   n, gains)
        else:
            s, violation, i, dp_i, dm_max = _worst_single_and_cheapest_up(g, up_off, down_off, diag, h, tau, act,
                                                                          n_act)
        if s < 0 or violation < tol:
            if n_act < n:
                n_act, countdown = _unshrink(act), min(n, SHRINK_EVERY)
                continue
            return step, _CONVERGED, -1, n_act, countdown
        countdown -= 1
        if countdown == 0:
            n_act = _shrink(act, n_act, a, g, kink, up_off, down_off, min(-violation, dp_i), max(violation, dm_max))
            countdown = min(n, SHRINK_EVERY)
            if n_act <= compact_below:
                return step, _SHRUNK, -1, n_act, countdown
        if not _row_at_hand(R, have, rows, parent, s):
            return step, _NEEDS_ROW, s, n_act, countdown
        if diag[s] + h[s] < -NEGATIVE_CURVATURE * abs(diag[s] + h[s]):
            return step, _INDEFINITE, s * n + s, n_act, countdown
        qs = max(diag[s] + h[s], tau)
        if dm_max > dp_i:  # a pair step gains too: the better of the two
            if not _row_at_hand(R, have, rows, parent, i):
                return step, _NEEDS_ROW, i, n_act, countdown
            Ri = R[i]
            qi = diag[i] + h[i]
            j = _partner(g, down_off, diag, h, Ri, qi, dp_i, tau, act, n_act, gains)
            if j >= 0:
                curvature = qi + diag[j] + h[j] - 2.0 * Ri[j]
                diff = g[j] + down_off[j] - dp_i
                if diff * diff / max(curvature, tau) > violation * violation / qs:
                    if not _row_at_hand(R, have, rows, parent, j):
                        return step, _NEEDS_ROW, j, n_act, countdown
                    if curvature < -NEGATIVE_CURVATURE * (abs(qi) + abs(diag[j] + h[j])):
                        return step, _INDEFINITE, i * n + j, n_act, countdown
                    if _pair_move(a, g, h, lo, hi, kink, up_off, down_off, i, j, Ri, R[j], dp_i, curvature, tau):
                        continue
        # the one-coordinate step on s (the two directions cannot both gain: down_off <= up_off)
        ai = a[s]
        if g[s] + up_off[s] < 0.0:
            t = -(g[s] + up_off[s]) / qs
            room, end = hi[s] - ai, hi[s]
            if kink > 0.0 and ai < 0.0 and -ai < room:
                room, end = -ai, 0.0
            ai_new = end if t >= room else ai + t
        else:
            t = -(g[s] + down_off[s]) / qs
            room, end = ai - lo[s], lo[s]
            if kink > 0.0 and ai > 0.0 and ai < room:
                room, end = ai, 0.0
            ai_new = end if -t >= room else ai + t
        t = ai_new - ai
        if t == 0.0:
            return step, _CONVERGED, -1, n_act, countdown
        a[s] = ai_new
        _set_offsets(s, a, lo, hi, kink, up_off, down_off)
        Rs = R[s]
        for k in range(n):
            g[k] += t * Rs[k]
        g[s] += h[s] * t
    return max_steps, _STEPS, -1, n_act, countdown


@_njit
def _add_rows(R, idx, coef, g):  # pragma: no cover - compiled
    """``g += sum_p coef[p] R[idx[p]]``, each row read once in place."""
    for p in range(idx.shape[0]):
        Rk = R[idx[p]]
        t = coef[p]
        for q in range(g.shape[0]):
            g[q] += t * Rk[q]


class _Compact:
    """The phase restricted to the coordinates ``A`` that a shrinking kept, with their own copies of the data and
    of their kernel block ``K_AA`` (``m x m``, its rows copied from the cache's full rows as the steps read them, or
    formed at length ``m`` where the full ones are not formed in the loop: :func:`_row_at_hand`; memory is touched
    only for the rows read): a step then reads rows of ``m`` numbers, not ``n``, and the block stays in the
    processor's caches where the full rows of the same coordinates do not (LIBSVM reads rows of its shrunk length
    too). Measured against the full rows (best of two to four alternating fits): n = 10,000, epsilon-insensitive
    0.66-0.86x the fit's time, hinge 0.93-0.95x; n = 4000, letter 0.84-0.94x, spambase 0.89-0.94x, one-vs-rest on
    letter and satimage 0.87-0.93x, the rest (mushroom, penbased, banana, magic, optdigits) within the noise. The
    other coordinates' gradient is brought up to date when the phase leaves the block (:meth:`expand`), through the
    full rows of the coordinates that moved."""

    def __init__(self, A: np.ndarray, R: np.ndarray, have: np.ndarray, rows: RowFormer, kernel, X: torch.Tensor, diag,
                 h, lo, hi, a, g):
        self.A, m = A, A.size
        self.diag, self.h, self.lo, self.hi = diag[A], h[A], lo[A], hi[A]
        self.a, self.g = a[A], g[A]
        self.start = self.a.copy()
        self.R = np.empty((m, m))
        self.have = np.zeros(m, dtype=bool)
        # its rows are copied from the cache's, or formed at length m once the phase's former (``rows``) has formed
        # its share of full rows (:func:`_row_at_hand`; none needed where that former can form every row)
        short = no_row_former() if rows.left[0] >= R.shape[1] else row_former(kernel, X[torch.from_numpy(A)])
        self.parent = (R, have, A, short or no_row_former())
        self.act, self.n_act, self.countdown = np.arange(m, dtype=np.int64), m, min(m, SHRINK_EVERY)

    def sync(self, a: np.ndarray) -> None:
        """Write the block's coordinates into the full ``a``."""
        a[self.A] = self.a

    def expand(self, cache, R: np.ndarray, have: np.ndarray, a: np.ndarray, g: np.ndarray) -> None:
        """Leave the block: ``a`` takes its coordinates, ``g`` the block's gradient on them and, on the others, the
        moves of the block's coordinates, through their full rows."""
        self.sync(a)
        moved = np.flatnonzero(self.a != self.start)
        idx = self.A[moved]
        if not have[idx].all():  # rows formed short (never on threads: their former forms every full row)
            cache(torch.from_numpy(idx))
        _add_rows(R, idx, self.a[moved] - self.start[moved], g)
        g[self.A] = self.g


def _worst_without_row(a, g, kink, lo, hi, have, intercept: bool, count: int) -> np.ndarray:
    """The ``count`` coordinates without a formed row that violate their optimality condition most (those the next
    steps are likely to choose)."""
    up_off, down_off = _offsets(a, lo, hi, kink)
    up_cost, down_cost = g + up_off, g + down_off
    if intercept:  # distance past the middle of the violated interval
        middle = 0.5 * (np.min(up_cost) + np.max(down_cost))
        score = np.maximum(middle - up_cost, down_cost - middle)
    else:
        score = np.maximum(-up_cost, down_cost)
    score = np.where(have, -np.inf, score)
    count = min(count, int(np.isfinite(score).sum()))
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    top = np.argpartition(-score, count - 1)[:count]
    return top[score[top] > 0]


class _Prefetch:
    """How many rows the next kernel evaluation forms (see :data:`PREFETCH`), from the share of the rows formed so far
    whose coordinates moved since: a row is formed for a step that reads it, and a step moves the coordinates whose
    rows it read."""

    def __init__(self, n: int):
        self.size = PREFETCH_START
        self.at_fill = np.full(n, np.nan)  # each block-formed row's coordinate when it was formed (nan: none)
        self.idx = np.zeros(0, dtype=np.int64)

    def formed(self, idx: np.ndarray, a: np.ndarray) -> None:
        self.at_fill[idx] = a[idx]
        self.idx = np.concatenate([self.idx, idx])

    def used(self, a: np.ndarray) -> int:
        """How many of the block-formed rows were used: their coordinates moved since."""
        return int(np.count_nonzero(a[self.idx] != self.at_fill[self.idx]))

    def count(self, a: np.ndarray) -> int:
        if self.idx.size:
            used = self.used(a)
            if 2 * used >= self.idx.size:
                self.size = min(PREFETCH, 2 * self.size)
            elif 4 * used < self.idx.size:
                self.size = max(PREFETCH_MIN, self.size // 2)
        return self.size

    def wasteful(self, a: np.ndarray) -> bool:
        """Whether the blocks guess badly: at their smallest size, fewer than ``1 / PREFETCH_WASTE`` of at least
        ``PREFETCH_WASTE_ROWS`` rows formed in them were used."""
        if self.size > PREFETCH_MIN or self.idx.size < PREFETCH_WASTE_ROWS:
            return False
        return PREFETCH_WASTE * self.used(a) < self.idx.size


#: Each cache's row former (its scaled points), made once: one-vs-rest columns' phases share it.
_formers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _row_former(cache, every_row: bool = False) -> RowFormer:
    """The former of the cache's kernel rows inside the loop, where it has one: without a limit on inputs of at most
    ``FORM_MAX_DIM`` dimensions (of any number with ``every_row``), up to ``FORM_SHARE n`` rows held on up to
    ``FORM_SHARE_MAX_DIM``, up to ``FORM_SHARE_HIGH_DIM FORM_SHARE_MAX_DIM n / d`` beyond, and up to
    ``FORM_SHARE_BEYOND n`` where the points outgrow ``FORM_POINTS_SHARE`` of a core's cache; else (and beyond its
    budget) the rows come through the cache, in blocks."""
    n, d = cache.X.shape
    budget = np.iinfo(np.int64).max
    if d > FORM_MAX_DIM and not every_row:
        share = FORM_SHARE if d <= FORM_SHARE_MAX_DIM else FORM_SHARE_HIGH_DIM * FORM_SHARE_MAX_DIM / d
        if n * d * 8 > FORM_POINTS_SHARE * _core_cache_bytes():
            share = min(share, FORM_SHARE_BEYOND)
        budget = max(0, int(share * n) - int(cache.have.sum()))
    former = _shared_former(cache)
    # its own scratch and count: phases on threads share the points only
    return former._replace(scratch=np.empty_like(former.scratch), left=np.array([budget], dtype=np.int64))


@functools.lru_cache(maxsize=None)
def _core_cache_bytes() -> int:
    """The size of a core's level 2 cache in bytes, as Linux reports it for the first processor; 2 MiB where the
    system does not say (the size of this field's server cores, between 1 and 2 MiB)."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size") as f:
            text = f.read().strip().upper()
        units = {"K": 2 ** 10, "M": 2 ** 20}
        return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)
    except (OSError, ValueError):
        return 2 ** 21


def _shared_former(cache) -> RowFormer:
    """The cache's row former (:func:`~joker_ext.kernel_rows.row_former` on its points), made on the first call: the
    scaled points by dimension are a transposed copy of the inputs (0.2-0.5 ms at 4,496 x 64 inside a fit), which
    every phase on the cache reads."""
    former = _formers.get(cache)
    if former is None:
        former = _formers[cache] = row_former(cache.operator.kernel, cache.X) or no_row_former()
    return former


def smo_phase(cache, diag: torch.Tensor, column, a: torch.Tensor, *, tol: float, deadline: float,
              interrupted=lambda: False, max_steps: Optional[int] = None, settled: float = 0.0,
              have: Optional[np.ndarray] = None, every_row: bool = False,
              product: Optional[torch.Tensor] = None) -> int:
    """Take SMO steps on one column of the box QP, in place, until its maximal violation is below ``tol``.

    Parameters
    ----------
    cache : joker_ext.working_set._ColumnCache
        Holding every row (``cache.full``), on the CPU; rows are formed on demand through it.
    diag : Tensor (n,)
        The kernel's diagonal.
    column : joker_ext.active_set._Column
        The column's data: ``lin``, ``h``, ``kink``, ``lo``, ``hi`` (and ``intercept``: pair steps keep ``sum a``).
    a : Tensor (n,)
        The start (feasible), overwritten by the result.
    tol : float
        Stop when the maximal violation of the optimality conditions (in units of the gradient) is below it.
    deadline : float
        ``time.perf_counter()`` value after which the phase stops.
    interrupted : callable
        Polled between chunks of steps.
    max_steps : int, optional
        Total steps allowed (default ``50 n``).
    settled : float
        Stop as well once a round of ``max(SETTLE_MIN_STEPS, SETTLE_ROUND n)`` steps changed the sets (at a bound, at
        the kink, free) of fewer than ``settled`` times as many coordinates as it took steps, while at least
        ``SETTLE_MIN_FREE`` times as many are free (0: never).
    have : ndarray of bool (n,), optional
        Which rows of the cache's buffer hold their kernel row, read and set by the loop: the cache's own flags by
        default; a phase running beside others keeps its own (:func:`smo_columns`).
    every_row : bool
        Form every missing row in the loop (where the kernel's rows can be formed there), whatever the inputs'
        dimension: the phase then never calls back into the cache.
    product : Tensor (n,), optional
        Receives ``K a`` at the end, read off the phase's gradient (``g + lin - h a``), whose updates' rounding
        grows with the steps taken (see :data:`PRODUCT_FROM_GRADIENT_STEPS`).

    Returns
    -------
    int
        Steps taken.

    Raises
    ------
    torch.linalg.LinAlgError
        When a step's direction has negative curvature: the kernel is not positive semidefinite (the dual is then not
        convex, and no certificate would hold).
    """
    n = a.numel()
    R = cache.buffer.numpy()
    have = cache.have.numpy() if have is None else have
    a_np = a.numpy()
    lin = column.lin.numpy()
    h = torch.as_tensor(column.h, dtype=a.dtype).expand(n).contiguous().numpy()
    lo, hi = column.lo.numpy(), column.hi.numpy()
    diag_np = diag.numpy()
    kink = float(column.kink)
    tau = TAU * max(float(diag_np.mean()), 1e-300)
    # g = K a + h a - lin, through the rows of the nonzero coordinates
    nonzero = np.flatnonzero(a_np)
    g = h * a_np - lin
    if nonzero.size:
        cache(torch.from_numpy(nonzero))  # forms the rows it lacks
        _add_rows(R, nonzero, a_np[nonzero], g)
    steps_fn = _pair_steps if column.intercept else _free_sum_steps
    rows = _row_former(cache, every_row)
    budget = 50 * n if max_steps is None else int(max_steps)
    taken = 0
    act, n_act, countdown = np.arange(n, dtype=np.int64), n, min(n, SHRINK_FIRST)
    block = None  # the _Compact the steps run on, if any
    outside = (R, have, np.zeros(0, dtype=np.int64), no_row_former())  # (:func:`_row_at_hand`'s outside a block)
    # the sets are checked every ``round_steps`` steps: the phase ends once they have settled
    round_steps = max(SETTLE_MIN_STEPS, int(SETTLE_ROUND * n))
    round_end, sets = round_steps, column.status(a)[0]
    prefetch = _Prefetch(n)
    grant = cache.X.numel() * cache.X.element_size() <= LOOP_GRANT_POINTS_SHARE * _core_cache_bytes()
    while taken < budget and time.perf_counter() < deadline and not interrupted():
        chunk = min(CHUNK_STEPS, budget - taken, round_end - taken)
        if block is None:
            done, status, row, n_act, countdown = steps_fn(R, have, rows, outside, diag_np, h, kink, lo, hi, a_np, g,
                                                           tol, tau, chunk, act, n_act, countdown, _compact_below(n))
        else:
            done, status, row, block.n_act, block.countdown = steps_fn(
                block.R, block.have, rows, block.parent, block.diag, block.h, kink, block.lo, block.hi, block.a,
                block.g, tol, tau, chunk, block.act, block.n_act, block.countdown, _compact_below(block.A.size))
        taken += done
        if status == _SHRUNK:
            if block is None:
                kept = np.sort(act[:n_act])
            else:  # the block shrank in turn: a smaller one, from the full problem brought up to date
                kept = block.A[np.sort(block.act[:block.n_act])]
                block.expand(cache, R, have, a_np, g)
            block = _Compact(kept, R, have, rows, cache.operator.kernel, cache.X, diag_np, h, lo, hi, a_np, g)
            continue
        if status == _CONVERGED:
            if block is None:
                break
            # optimal on the block: back to every coordinate, which the next call checks
            block.expand(cache, R, have, a_np, g)
            block, n_act, countdown = None, _unshrink(act), min(n, SHRINK_EVERY)
            continue
        if status == _INDEFINITE:
            on = (R, diag_np, h) if block is None else (block.R, block.diag, block.h)
            raise _indefinite(*on, *divmod(int(row), on[0].shape[1]))
        if block is not None:
            block.sync(a_np)
        if status == _NEEDS_ROW:
            if rows.family != NO_FORMER and grant and prefetch.wasteful(a_np):
                rows.left[0] += LOOP_GRANT
                continue
            if block is None:
                extra = _worst_without_row(a_np, g, kink, lo, hi, have, column.intercept, prefetch.count(a_np) - 1)
                idx = np.unique(np.concatenate([[row], extra]).astype(np.int64))
                cache(torch.from_numpy(idx))
            else:
                extra = _worst_without_row(block.a, block.g, kink, block.lo, block.hi, have[block.A],
                                           column.intercept, prefetch.count(a_np) - 1)
                local = np.unique(np.concatenate([[row], extra]).astype(np.int64))
                idx = block.A[local]
                cache(torch.from_numpy(idx))  # (the loop copies the block's rows from them)
            prefetch.formed(idx, a_np)
        elif taken >= round_end:
            now = column.status(a)[0]
            if int((now != sets).sum()) < settled * round_steps and \
                    int((now == FREE).sum()) >= SETTLE_MIN_FREE * round_steps:
                break
            round_end, sets = taken + round_steps, now
    if block is not None:
        block.expand(cache, R, have, a_np, g)
    if product is not None:
        product.copy_(torch.from_numpy(g + lin - h * a_np))
    return taken


def _compact_below(m: int) -> int:
    """The most coordinates a shrinking of ``m`` may keep for the steps to go on in a :class:`_Compact` block of
    them (0: none)."""
    return int(COMPACT_SHARE * m) if m >= COMPACT_MIN_N else 0


def _indefinite(R, diag, h, i: int, j: int) -> torch.linalg.LinAlgError:
    """The error of a step direction of negative curvature, on coordinates ``i`` and ``j`` (``i == j``: one)."""
    curvature = diag[i] + h[i] + diag[j] + h[j] - 2.0 * R[i, j] if i != j else diag[i] + h[i]
    what = ("k(x, x) + h", "a training point x") if i == j else \
        ("k(x, x) + k(x', x') - 2 k(x, x') + h + h'", "training points x, x'")
    return torch.linalg.LinAlgError(
        f"the kernel matrix is not positive semidefinite: {what[0]} = {curvature:.3e} < 0 for {what[1]}; is "
        f"the kernel positive semidefinite? (e.g. scikit-learn's 'sigmoid' kernel is not)")


def _concurrent(cache) -> bool:
    """Whether phases may run at once on the cache: its kernel's rows can be formed in the loop, on inputs of at most
    ``CONCURRENT_MAX_DIM`` dimensions."""
    return cache.X.shape[1] <= CONCURRENT_MAX_DIM and forms_rows(cache.operator.kernel)


def smo_columns(cache, diag: torch.Tensor, columns: Sequence, alpha: torch.Tensor, *, tols: Sequence[float],
                deadline: float, interrupted=lambda: False, max_steps: Optional[int] = None, settled: float = 0.0,
                workers: int = 1, products: Optional[torch.Tensor] = None) -> List[bool]:
    """:func:`smo_phase` on each column of ``alpha`` (n x T, in place), ``columns[t]`` and ``tols[t]`` its data and
    tolerance; up to ``workers`` columns at once, on threads (the compiled loop releases the GIL), where the loop can
    form the kernel's rows, on inputs of at most ``CONCURRENT_MAX_DIM`` dimensions: each phase then forms every row
    it reads itself (the one-vs-rest columns of a multiclass fit share the kernel's rows). Returns, per column,
    whether ``products`` (n x T, optional) holds its ``K a``, read off its phase's gradient (:func:`smo_phase`'s
    ``product``) after at most ``PRODUCT_FROM_GRADIENT_STEPS n`` steps.

    The phases share the cache's buffer but not its flags: each starts from a copy of the flags (the rows of the
    phases done by then, under a lock) and forms the rows it lacks, perhaps a row another running phase formed or is
    forming too: the compiled former writes a row whole and the same numbers whoever forms it, so each phase reads
    the numbers it would read alone with every row formed in the loop, and the columns end where they end one after
    another (exactly so on inputs of at most ``FORM_MAX_DIM`` dimensions, whose rows the loop forms in either case).
    The flags are merged as each phase ends. The rows of a warm start's nonzero coordinates (of every column) are
    formed first, through the cache, whose bits the compiled former need not reproduce."""
    T = alpha.shape[1]
    workers = max(1, min(int(workers), T))
    _shared_former(cache)  # (made here, before any thread asks for it)
    nonzero = torch.nonzero(alpha.ne(0).any(dim=1)).reshape(-1)
    if nonzero.numel():  # (on one thread or several, the same rows come from the same former)
        cache(nonzero)

    n = alpha.shape[0]
    formed = [False] * T

    def phase(t: int, **rows) -> torch.Tensor:  # column t's phase, from its start (``rows``: have, every_row)
        a = alpha[:, t].clone()
        product = None if products is None else products[:, t]
        steps = smo_phase(cache, diag, columns[t], a, tol=tols[t], deadline=deadline, max_steps=max_steps,
                          settled=settled, product=product, **rows)
        formed[t] = product is not None and steps <= PRODUCT_FROM_GRADIENT_STEPS * n
        return a

    if workers == 1 or not _concurrent(cache):
        for t in range(T):
            alpha[:, t] = phase(t, interrupted=interrupted)
        return formed
    lock = threading.Lock()
    shared = cache.have.numpy()
    inference = torch.is_inference_mode_enabled()  # (a thread's own mode starts off)
    failed = threading.Event()  # a phase raised: the others stop at their next chunk of steps

    def run(t: int) -> torch.Tensor:
        if failed.is_set():
            return alpha[:, t].clone()
        with lock:
            have = shared.copy()
        try:
            with torch.inference_mode(inference):
                a = phase(t, interrupted=lambda: failed.is_set() or interrupted(), have=have, every_row=True)
        except BaseException:
            failed.set()
            raise
        with lock:
            np.logical_or(shared, have, out=shared)
        return a

    with ThreadPoolExecutor(max_workers=workers) as pool:
        done: List[torch.Tensor] = list(pool.map(run, range(T)))
    for t, a in enumerate(done):
        alpha[:, t] = a
    return formed
