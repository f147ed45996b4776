"""joker_ext's compiled loops, loaded when joker_ext is imported.

The hot loops of the exact engines (the SMO phase's steps, :mod:`joker_ext.smo`; the kernel rows they form,
:mod:`joker_ext.kernel_rows`; the block gathers and the float32 flush of :mod:`joker_ext.dense`) are compiled by numba
and kept in numba's on-disk cache (``cache=True``). A process pays for them once, on their first call: numba's own
set-up (0.1-0.2 s, on the first compiled call of the process) and each loop's machine code read from the cache (3-5 ms
each). Left to the first fit, that made the first fit of a process 0.14-0.25 s slower than the next (optdigits, n =
4000, hinge with an intercept: 161 against 20 ms, where scikit-learn's SVC takes 17 ms; flights, squared loss: 486
against 238 ms). :func:`load` calls each loop once, on a few numbers of the types the fits pass, when joker_ext is
imported (0.14 s more for an import of 1.1 s after torch's), so that every fit runs at its own speed.

The first import after installing joker_ext (or after numba's cache was cleared, or a new numba) compiles the
loops instead of reading them: about 10 s on two cores, once. Set the environment variable ``JOKER_EXT_LAZY_LOAD=1``
to leave the loops to their first call instead (the import is then 0.14 s shorter and the first fit 0.14-0.25 s
longer).
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import torch

from . import dense, kernel_rows, smo
from .kernels import StationaryKernel

__all__ = ["load", "LAZY_LOAD_VARIABLE"]

#: The environment variable that, set to ``1``, leaves the compiled loops to their first call.
LAZY_LOAD_VARIABLE = "JOKER_EXT_LAZY_LOAD"


def load() -> None:
    """Call each of joker_ext's compiled loops once, on arguments of the types the fits pass them (float64 and
    float32 blocks, int64 indices, C-ordered arrays), so that numba compiles or reads their machine code now rather
    than inside the first fit. Nothing without numba."""
    if not smo.smo_available():
        return
    n = 4
    X = torch.linspace(0.0, 1.0, 2 * n, dtype=torch.float64).reshape(n, 2)
    former = kernel_rows.row_former(StationaryKernel("gaussian", 1.0), X)  # (the points' transposing pass)
    _steps(former)
    for dtype in (torch.float64, torch.float32):
        dense.submatrix(torch.eye(n, dtype=dtype), torch.arange(2))
    dense.flush_small_(torch.eye(n, dtype=torch.float32))


def _steps(former: kernel_rows.RowFormer) -> None:
    """One chunk of SMO steps with and without an intercept (:func:`joker_ext.smo._pair_steps`,
    :func:`~joker_ext.smo._free_sum_steps`), on a box QP over the points whose rows ``former`` forms, and the
    phase's other compiled calls."""
    n = former.points.shape[1]
    R = np.zeros((n, n))
    have = np.zeros(n, dtype=bool)
    outside = (R, have, np.zeros(0, dtype=np.int64), kernel_rows.no_row_former())
    diag, h, lo, hi = np.ones(n), np.zeros(n), -np.ones(n), np.ones(n)
    for steps in (smo._pair_steps, smo._free_sum_steps):
        a, g = np.zeros(n), np.linspace(-1.0, 1.0, n)
        act = np.arange(n, dtype=np.int64)
        steps(R, have, former, outside, diag, h, 0.0, lo, hi, a, g, 1e-3, 1e-12, 2, act, n, n, 0)
        smo._unshrink(act)
        smo._add_rows(R, np.zeros(1, dtype=np.int64), np.ones(1), g)
        smo._offsets(a, lo, hi, 0.0)


def load_unless_lazy() -> None:
    """:func:`load`, unless the environment variable :data:`LAZY_LOAD_VARIABLE` is ``1``. Should numba fail to
    compile or read a loop, the import goes on with a warning that says why (the estimators that do not call the
    loops still work; those that do raise the error again when they call it)."""
    if os.environ.get(LAZY_LOAD_VARIABLE, "") == "1":
        return
    try:
        load()
    except Exception as error:  # (numba's errors have no common base class)
        warnings.warn(f"joker_ext could not load its compiled loops ({type(error).__name__}: {error}); the exact "
                      f"engines will try again when they call them", RuntimeWarning, stacklevel=2)
