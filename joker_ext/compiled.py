"""joker_ext's compiled loops, loaded when joker_ext is imported.

The hot loops of the exact engines (the SMO phase's steps, :mod:`joker_ext.smo`; the kernel rows they form,
:mod:`joker_ext.kernel_rows`; the pairs of a one-vs-one fit, :mod:`joker_ext.one_vs_one`; the block gathers and the
float32 flush of :mod:`joker_ext.dense`) are compiled by numba and kept in numba's on-disk cache (``cache=True``). A
process pays for them once, on their first call: numba's own set-up (0.1-0.2 s, on the first compiled call of the
process) and each loop's machine code read from the cache (3-5 ms each). Left to the first fit, that made the first fit
of a process 0.14-0.25 s slower than the next (optdigits, n = 4000, hinge with an intercept: 161 against 20 ms, where
scikit-learn's SVC takes 17 ms; flights, squared loss: 486 against 238 ms). :func:`load` calls each loop once, on a few
numbers of the types the fits pass, when joker_ext is imported (0.14 s more for an import of 1.1 s after torch's), so
that every fit runs at its own speed.

Only loops already in numba's cache are loaded: after installing joker_ext (or where the cache does not persist
from one process to the next) the first fit compiles the loops it calls, once (the first hinge fit with an intercept
6.6 s on two cores; every loop, about 20 s), and later imports load them; ``python -m joker_ext.precompile``
compiles every loop at once (:func:`compile_all`), for instance right after installing. Set the environment variable
``JOKER_EXT_LAZY_LOAD=1`` to leave every loop to its first call instead (the import is then 0.14 s shorter and the
first fit 0.14-0.25 s longer).
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Callable, List, Tuple

import numpy as np
import torch

from . import dense, kernel_rows, one_vs_one, smo
from .kernels import StationaryKernel

__all__ = ["load", "compile_all", "LAZY_LOAD_VARIABLE"]

#: The environment variable that, set to ``1``, leaves the compiled loops to their first call.
LAZY_LOAD_VARIABLE = "JOKER_EXT_LAZY_LOAD"


def load() -> None:
    """Call each of joker_ext's compiled loops whose machine code numba's cache holds once, on arguments of the types
    the fits pass them (float64 and float32 blocks, int64 indices, C-ordered arrays), so that numba reads it now
    rather than inside the first fit. A loop the cache lacks (a fresh installation, a cache that does not persist) is
    left to its first call, which compiles it: the import never waits for a compilation of a loop that the process
    may not call. Nothing without numba."""
    if not smo.smo_available():
        return
    for dispatcher, call in _calls():
        if _cached(dispatcher):
            call()


def _cached(dispatcher) -> bool:
    """Whether numba's on-disk cache holds an index for ``dispatcher`` (its machine code for some signatures; a stale
    index, after an edit of the module, is recompiled on the call, once). False where numba keeps it elsewhere than
    its version 0.5x-0.6x does."""
    index = getattr(getattr(getattr(dispatcher, "_cache", None), "_cache_file", None), "_index_path", None)
    return isinstance(index, str) and os.path.exists(index)


def _calls() -> List[Tuple[object, Callable[[], None]]]:
    """``(dispatcher, call)`` for each compiled loop a fit calls from Python: ``call`` calls it on a box QP of four
    coordinates (one chunk of SMO steps with and without an intercept, on rows formed in the loop) or on small
    blocks."""
    n = 4
    X = torch.linspace(0.0, 1.0, 2 * n, dtype=torch.float64).reshape(n, 2)
    # the steps' former made here, not by row_former: that would call _transpose_divided, which may not be cached
    points = np.ascontiguousarray(X.numpy().T)
    former = kernel_rows.RowFormer(points, kernel_rows.GAUSSIAN, 1.0, np.empty((4, n)),
                                   np.array([np.iinfo(np.int64).max], dtype=np.int64))
    R, have = np.zeros((n, n)), np.zeros(n, dtype=bool)
    outside = (R, have, np.zeros(0, dtype=np.int64), kernel_rows.no_row_former())
    diag, h, lo, hi = np.ones(n), np.zeros(n), -np.ones(n), np.ones(n)
    a, g, act = np.zeros(n), np.linspace(-1.0, 1.0, n), np.arange(n, dtype=np.int64)

    def pairs():  # no pair: the range is empty, the call only loads the loop
        empty, none = np.zeros(0), np.zeros(0, dtype=np.int64)
        one_vs_one._solve_range(points, former.family, former.scale, none, empty, np.zeros(1, dtype=np.int64), *[g] * 8,
                                0.0, True, 1e-3, 1e-9, 0, 0, np.zeros(0, dtype=np.bool_), empty, empty, empty,
                                np.zeros(0, dtype=np.bool_), none)

    def steps(fn):
        return lambda: fn(R, have, former, outside, diag, h, 0.0, lo, hi, a.copy(), g.copy(), 1e-3, 1e-12, 2,
                          act.copy(), n, n, 0)

    return [
        (kernel_rows._transpose_divided, lambda: kernel_rows.row_former(StationaryKernel("gaussian", 1.0), X)),
        (smo._pair_steps, steps(smo._pair_steps)),
        (smo._free_sum_steps, steps(smo._free_sum_steps)),
        (smo._unshrink, lambda: smo._unshrink(act.copy())),
        (smo._add_rows, lambda: smo._add_rows(R, np.zeros(1, dtype=np.int64), np.ones(1), g.copy())),
        (smo._offsets, lambda: smo._offsets(a, lo, hi, 0.0)),
        (dense._gather_compiled, lambda: [dense.submatrix(torch.eye(n, dtype=dtype), torch.arange(2))
                                          for dtype in (torch.float64, torch.float32)]),
        (dense._flush_compiled, lambda: dense.flush_small_(torch.eye(n, dtype=torch.float32))),
        (one_vs_one._solve_range, pairs),
    ]


def compile_all(report: Callable[[str], None] = print) -> None:
    """Call every compiled loop once, as :func:`load` does, whether numba's cache holds it or not: a loop the cache
    lacks is compiled now (about 20 s for all of them on one core, once per installation) and cached for every
    later process. ``report`` receives a line per loop with its time. ``python -m joker_ext.precompile`` runs it
    (after installing, so that no fit pays for a compilation)."""
    if not smo.smo_available():
        report("numba is not installed: nothing to compile (the engines run without the compiled loops)")
        return
    for dispatcher, call in _calls():
        start = time.perf_counter()
        call()
        report(f"{getattr(dispatcher, '__name__', dispatcher)}: {time.perf_counter() - start:.2f} s")


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
