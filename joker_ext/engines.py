"""Solvers as interchangeable engines behind one protocol.

Every engine minimises the same problem (see :mod:`joker_ext.losses`), for each target column::

    primal  min_theta 1/2 ||theta||^2 + sum_i c_i l(y_i, <theta, phi(x_i)>)
    dual    min_alpha 1/2 alpha^T K alpha + sum_i g_i(alpha_i),   alpha_i in box_i

and is called the same way::

    engine(operator, Y, loss, c, options, *, alpha0=None, state0=None, start_iter=0, callback=None,
           validation=None, snapshot=None, snapshot_every=None, radius0=None, rng_state=None) -> SolverResult

``operator`` is an :class:`~joker_ext.operators.ExactOperator` (``operator.mode == 'exact'``) or a
:class:`~joker_ext.operators.FeatureOperator` (``'features'``). The result carries the dual variables
``alpha``, the operator state (``{'f': K alpha}`` or ``{'beta': Phi^T alpha}``-like primal weights), the
duality gap and a history; every engine stops on the relative duality gap ``options.tol``.

This module is the registry only: it imports no engine. The engines register themselves when their modules are
imported, and :mod:`joker_ext.builtin_engines` imports the built-in ones (``import joker_ext`` imports it, so
the registry is complete for any code that uses the package). The built-in engines:

========== ========== ==========================================================================
name       mode       engine
========== ========== ==========================================================================
dbcd_tr    both       the seed paper's dual block coordinate descent with a trust region
active_set exact      proximal primal-dual active-set method for conjugates that are quadratic or
                      linear on their box; fits the intercept itself (:mod:`joker_ext.active_set`)
newton     exact      projected Newton on the whole dual (:mod:`joker_ext.newton_exact`)
newton     features   Newton-PCG on the primal feature weights with a randomized Nystrom
                      preconditioner and smoothing continuation (:mod:`joker_ext.primal_newton`);
                      also on rows sharded over processes (:mod:`joker_ext.distributed`)
========== ========== ==========================================================================

``solver='auto'`` (:func:`resolve_solver`) takes a second-order engine, except for exact kernels whose
``n x n`` matrix does not fit the memory budget, which go to ``'dbcd_tr'`` (it needs only ``O(n b)``).
"""
from __future__ import annotations

import math
import signal
import threading
import time
import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple, Union

import torch

from .defaults import BLOCK_EPOCHS, ROUNDING_GAP
from .defaults import default_max_iter as block_iterations
from .results import SolverResult

if TYPE_CHECKING:  # pragma: no cover
    from .losses import Loss

__all__ = ["at_rounding_floor", "register_solver", "get_solver", "available_solvers", "resolve_solver",
           "supports_intercept", "supports_distributed", "Monitor",
           "DEFAULT_EXACT_MEMORY", "exact_compute_dtype", "default_max_iter", "KINKED_NEWTON_MAX_ITER",
           "working_set_size", "start_intercept"]

#: Memory the full-dual Newton engine may give the ``n x n`` kernel matrix and its factor when the user
#: sets no ``max_memory`` (bytes).
DEFAULT_EXACT_MEMORY = 6 * 2**30

#: Default iteration budgets (outer iterations of each engine).
NEWTON_MAX_ITER = 100
#: The Newton engine's default budget for losses with a kink (hinge, absolute, pinball, epsilon-insensitive), whose
#: smoothing continuation takes more Newton iterations as ``C`` grows. Random features, n = 5,000, M = 500,
#: d = 6 and 12, to the estimators' default tol: 33-80 iterations at C = 1-10, 60-117 at C = 100, 88-162 at
#: C = 1,000-10,000 (so a budget of 100 stopped such fits at gaps of 1e-10 to 1e-7 with a ConvergenceWarning).
KINKED_NEWTON_MAX_ITER = 250
#: Coordinates per subproblem of the working-set engine (:mod:`joker_ext.working_set`).
WORKING_SET_SIZE = 512
#: Its subproblem size for losses whose dual has a kink inside the box (epsilon-insensitive with epsilon > 0: the
#: rows inside the tube rest at alpha = 0). Measured against 512 (best of 2 alternating fits, default tol, 2-core
#: CPU, make_friedman1, epsilon 0.01-0.5, C = 0.5-1000, gamma 0.05-1): time / SVR's 1.40 -> 0.96, 1.61 -> 0.95,
#: 1.64 -> 1.34, 2.21 -> 1.73, 1.90 -> 1.27 at n = 4,000, 1.02 -> 0.79 at 6,000, 0.91 -> 0.69 and 0.86 -> 0.72 at
#: 10,000 (one of 13 slower: 0.42 -> 0.53). Absolute and pinball (no kink inside) gained nothing (0.665 -> 0.703
#: geometric mean), hinge neither (1.95 -> 1.81 at 256 over eight problems, with three of them slower).
KINKED_WORKING_SET_SIZE = 256
#: Outer iterations of the working-set engine per ``n / WORKING_SET_SIZE`` (at least ``NEWTON_MAX_ITER``).
WORKING_SET_ITER_PER_BLOCK = 20
#: DBCD-TR's passes over the blocks (:data:`joker_ext.defaults.BLOCK_EPOCHS`).
DBCD_EPOCHS = BLOCK_EPOCHS
#: The intercept search's default budget, in default budgets of its engine: its solves share one (the Newton engine
#: on random features with a kinked loss took 25-70 iterations per solve and 8 rounds, and ran out of a single
#: budget of 100 at gaps of 1e-6 to 2e-2; with 300-1000 it reaches 1e-11).
SEARCH_BUDGETS = 5

_SOLVERS: Dict[Tuple[str, str], Callable] = {}
_WITH_INTERCEPT: Dict[Tuple[str, str], Callable] = {}
_DISTRIBUTED = set()


def register_solver(name: str, mode: str, engine: Callable, *, overwrite: bool = False,
                    intercept: Union[bool, Callable[[Loss], bool]] = False, distributed: bool = False) -> None:
    """Register ``engine`` as solver ``name`` for operators of ``mode`` ('exact' or 'features').

    ``intercept=True`` declares that the engine takes ``intercept=True`` and then fits an unregularized
    intercept itself (the dual constraint ``sum_i alpha_i = 0``), returned as ``state['intercept']``; a callable
    ``intercept(loss) -> bool`` declares it for the losses it accepts. Around the other engines (and losses)
    :func:`joker_ext.model.fit_dual` runs the intercept search of :mod:`joker_ext.intercept`.
    ``distributed=True`` declares that
    it takes ``shards=`` (:class:`joker_ext.distributed.RowShards`) and then fits on rows spread over
    the processes of a ``torch.distributed`` group."""
    if not isinstance(name, str) or not name or name == "auto":
        raise ValueError(f"name must be a non-empty string other than 'auto', got {name!r}")
    if mode not in ("exact", "features"):
        raise ValueError(f"mode must be 'exact' or 'features', got {mode!r}")
    if not callable(engine):
        raise TypeError(f"engine must be callable, got {type(engine).__name__}")
    if (name, mode) in _SOLVERS and not overwrite:
        raise ValueError(f"a solver {name!r} for mode {mode!r} is registered already; pass overwrite=True")
    _SOLVERS[(name, mode)] = engine
    _WITH_INTERCEPT.pop((name, mode), None)
    if intercept:
        _WITH_INTERCEPT[(name, mode)] = intercept if callable(intercept) else (lambda loss: True)
    if distributed:
        _DISTRIBUTED.add((name, mode))
    else:
        _DISTRIBUTED.discard((name, mode))


def supports_intercept(name: str, mode: str, loss: Optional[Loss] = None) -> bool:
    """True when engine ``name`` fits the intercept itself (see :func:`register_solver`) for ``loss`` (without
    ``loss``: for some losses at least)."""
    accepts = _WITH_INTERCEPT.get((name, mode))
    if accepts is None:
        return False
    return True if loss is None else bool(accepts(loss))


def supports_distributed(name: str, mode: str) -> bool:
    """True when engine ``name`` fits rows sharded over processes (see :func:`register_solver`)."""
    return (name, mode) in _DISTRIBUTED


def available_solvers(mode: Optional[str] = None) -> Tuple[str, ...]:
    """Names of the registered solvers (for ``mode`` when given), plus 'auto'."""
    names = sorted({n for (n, m) in _SOLVERS if mode is None or m == mode})
    return ("auto",) + tuple(names)


def get_solver(name: str, mode: str) -> Callable:
    """The engine registered as ``name`` for ``mode``; ValueError naming the choices otherwise."""
    if (name, mode) not in _SOLVERS:
        raise ValueError(f"solver must be one of {available_solvers(mode)} for {mode} mode, got {name!r}")
    return _SOLVERS[(name, mode)]


def resolve_solver(name: str, mode: str, n: int, itemsize: int, loss=None, max_memory: Optional[int] = None,
                   distributed: bool = False) -> str:
    """The engine ``'auto'`` stands for; other names are returned after checking they are registered.

    ``'auto'`` takes a second-order engine where it was measured to converge fast, ``'dbcd_tr'`` elsewhere:

    * exact kernels, losses whose conjugate is linear on its box (hinge, epsilon-insensitive, absolute,
      pinball): ``'working_set'``, which reads ``K`` by rows (all of it, lazily, when ``n^2`` numbers fit
      half the budget; else an LRU cache of rows), so any ``n`` fits (measured at n = 4000 with intercept:
      0.5-0.8 s where ``'active_set'`` took 3-47 s, docs/math.rst);
    * exact kernels, when the ``n x n`` matrix and a factor (``2 n^2`` numbers) fit ``max_memory``
      (default :data:`DEFAULT_EXACT_MEMORY`): ``'active_set'`` for the other losses whose conjugate is
      quadratic on its box (squared, Huber, squared hinge), ``'newton'`` for the other smooth ones
      (logistic);
    * features: ``'newton'`` for every loss. For the kinked ones (hinge, absolute, pinball,
      epsilon-insensitive) its smoothing is centred at the last dual solution (a proximal point step):
      measured at n = 20,000, M = 1,000, C = 1 after 120 s, relative gap 6.7e-5 (hinge) and 1.6e-3
      (epsilon-insensitive) where ``'dbcd_tr'`` had 1.8e-3 and 0.22 (docs/math.rst).

    ``distributed=True`` (rows sharded over processes): the registered engine that supports it,
    ``'newton'`` in feature mode for every loss; other names raise ValueError naming those that do.
    """
    if distributed:
        able = sorted(s for (s, m) in _DISTRIBUTED if m == mode)
        choice = able[0] if name == "auto" and able else name
        if (choice, mode) not in _DISTRIBUTED:
            hint = "" if able else " (exact kernels need every row on one process: use random or Nystrom features)"
            raise ValueError(f"distributed=True needs an engine that runs on sharded rows; solver {choice!r} in "
                             f"{mode} mode does not (those that do in {mode} mode: {able}){hint}")
        return choice
    if name != "auto":
        get_solver(name, mode)
        return name
    if mode == "exact":
        if loss is not None and _linear_conjugate(loss):
            return "working_set"  # never forms K: any n
        budget = DEFAULT_EXACT_MEMORY if max_memory is None else int(max_memory)
        if 2 * n * n * itemsize > budget:
            return "dbcd_tr"
        if loss is None or getattr(loss, "quadratic", False):
            return "active_set"
        return "dbcd_tr" if needs_smoothing_loss(loss) else "newton"
    return "newton"


def exact_compute_dtype(n: int, dtype: torch.dtype, max_memory: Optional[int] = None) -> torch.dtype:
    """The dtype the full-dual engines ('active_set', exact 'newton') compute in: float64 when ``dtype`` is narrower
    and their ``n x n`` matrix and a factor in float64 (``2 n^2`` numbers of 8 bytes) fit ``max_memory`` (default
    :data:`DEFAULT_EXACT_MEMORY`), else ``dtype``. In float32 the active-set rounds cycled on the ill-conditioned
    free block (squared hinge, n = 1500, C = 10^4: 100 rounds, 4.6 s, relative gap 4e-3; in float64 one round,
    0.13 s), as the working set's did, which computes in float64 always
    (:data:`~joker_ext.defaults.WORKING_SET_DTYPE`), and logistic regression's Newton steps stalled at C = 100-10^4
    (n = 2000: relative gaps 3e-4 to 1.0)."""
    budget = DEFAULT_EXACT_MEMORY if max_memory is None else int(max_memory)
    if torch.finfo(dtype).bits >= 64 or 2 * n * n * 8 > budget:
        return dtype
    return torch.float64


def _linear_conjugate(loss) -> bool:
    """``psi`` linear on the box (``psi'' = 0``: hinge, absolute, pinball, epsilon-insensitive): the
    support-vector losses, whose solutions sit mostly at the box's bounds or at the kink."""
    if not getattr(loss, "quadratic", False):
        return False
    y = torch.ones(1, 1, dtype=torch.float64)
    return bool((loss.psi_hess(torch.zeros_like(y), y, torch.ones_like(y)) == 0).all())


def needs_smoothing_loss(loss) -> bool:
    """True for losses with a kink (hinge, absolute, pinball, epsilon-insensitive: the Newton engines smooth them)."""
    from .smoothing import needs_smoothing

    y = torch.ones(1, 1, dtype=torch.float64)
    return needs_smoothing(loss, y, torch.ones(1, dtype=torch.float64))


def start_intercept(state0: Optional[dict], T: int, dtype: torch.dtype, device,
                    level: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The intercepts (T,) an engine that fits them starts from: ``state0['intercept']`` (a warm start's or a
    checkpoint's) where given, else zeros; for targets less ``level`` (:func:`target_level`), a given intercept less
    ``level``."""
    if state0 is None or "intercept" not in state0:
        return torch.zeros(T, dtype=dtype, device=device)
    b = torch.as_tensor(state0["intercept"], dtype=dtype, device=device).reshape(T).clone()
    return b if level is None else b - level


def target_level(loss, Y: torch.Tensor, intercept: bool, shards=None) -> torch.Tensor:
    """Per target column, the level ``m`` (T,) that an engine fitting the intercept takes off the targets: their mean
    over every process's rows (``shards.sum_many``) where the loss depends on ``y - f`` alone (``loss.residual``),
    else zeros. The engine solves for ``y - m`` and reports the intercept ``b + m``: the same model, with an intercept
    of the spread of the targets rather than of their level (targets around 1e4-1e5 left the exact engines' gaps in
    rounding noise above the default tolerance until ``max_iter``; constant targets left feature Newton with a
    relative gap of 0/0 for 100 iterations; the intercept search took 2-6x the iterations)."""
    T = Y.shape[1]
    if not intercept or not getattr(loss, "residual", False):
        return torch.zeros(T, dtype=Y.dtype, device=Y.device)
    total, count = Y.sum(0), torch.full((1,), float(Y.shape[0]), dtype=Y.dtype, device=Y.device)
    if shards is not None:
        total, count = shards.sum_many(total, count)
    return total / count.clamp_min(1.0)


def working_set_size(loss) -> int:
    """The working-set engine's default subproblem size for ``loss``: :data:`KINKED_WORKING_SET_SIZE` when its dual has
    a kink (``loss.kink > 0``), else :data:`WORKING_SET_SIZE`."""
    return KINKED_WORKING_SET_SIZE if float(getattr(loss, "kink", 0.0)) > 0 else WORKING_SET_SIZE


def default_max_iter(solver: str, n: int, block_size: int, *, search: bool = False, loss=None) -> int:
    """Default budget of outer iterations: Newton steps for 'newton' and 'active_set' (``KINKED_NEWTON_MAX_ITER`` for
    'newton' when ``loss`` has a kink, else ``NEWTON_MAX_ITER``), ``WORKING_SET_ITER_PER_BLOCK`` per
    ``n / q`` for 'working_set' (``q`` of :func:`working_set_size`), ``DBCD_EPOCHS`` passes over the blocks (at least 200 block
    iterations) for 'dbcd_tr'; ``SEARCH_BUDGETS`` times that with ``search`` (the intercept search around the
    engine, whose solves share one budget)."""
    if solver == "newton" and loss is not None and needs_smoothing_loss(loss):
        budget = KINKED_NEWTON_MAX_ITER
    elif solver in ("newton", "active_set"):
        budget = NEWTON_MAX_ITER
    elif solver == "working_set":
        size = WORKING_SET_SIZE if loss is None else working_set_size(loss)
        budget = max(NEWTON_MAX_ITER, WORKING_SET_ITER_PER_BLOCK * math.ceil(n / size))
    else:
        budget = block_iterations(n, max(1, block_size), DBCD_EPOCHS)
    return SEARCH_BUDGETS * budget if search else budget


class _Interrupt:
    """Turns SIGINT into a flag checked between iterations, so the iterate stays consistent."""

    def __init__(self):
        self.flag = False

    def __call__(self, signum, frame):
        self.flag = True


@contextmanager
def sigint_as_flag(enabled: bool):
    """While active (main thread only), Ctrl-C sets ``handler.flag`` instead of raising."""
    handler = _Interrupt()
    old = None
    if enabled and threading.current_thread() is threading.main_thread():
        try:
            old = signal.signal(signal.SIGINT, handler)
        except (ValueError, OSError):  # pragma: no cover - embedded interpreters
            old = None
    try:
        yield handler
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)


def at_rounding_floor(rel_gap: float, tol: float, dtype: torch.dtype) -> bool:
    """Whether an engine that can make no further progress may report 'converged': its relative gap is at most
    ``tol`` or the rounding floor :data:`~joker_ext.defaults.ROUNDING_GAP` of ``dtype`` (float32's for other
    dtypes)."""
    return rel_gap <= max(tol, ROUNDING_GAP.get(dtype, ROUNDING_GAP[torch.float32]))


def _ordinary(value):
    """``value``, or a copy of it when it is a tensor made under ``torch.inference_mode`` (called outside that mode,
    the copy is an ordinary tensor)."""
    return value.clone() if torch.is_tensor(value) and value.is_inference() else value


class Monitor:
    """Bookkeeping shared by the Newton engines: history, tolerance, callback, time budget, snapshots.

    Parameters
    ----------
    options : SolverOptions
    callback, validation, snapshot, snapshot_every :
        As in :func:`joker_ext.solver.dbcd_tr`.
    dtype : torch.dtype
        Working dtype (for the relative gap's floor).
    report_dtype : torch.dtype, optional
        The dtype of the iterates handed to the callback, the validation and snapshots, and returned: the
        caller's, when an engine works in a wider one (default: as they are).
    expand : callable, optional
        ``expand(state, alpha) -> (state, alpha)``, applied to those iterates first: an engine that solves a reduced
        problem (e.g. duplicate rows merged, :func:`joker_ext.active_set.merge_duplicate_rows`) reports the
        caller's.
    """

    def __init__(self, options, *, callback=None, validation=None, snapshot=None, snapshot_every=None,
                 dtype=torch.float64, report_dtype: Optional[torch.dtype] = None, expand=None):
        self.options = options
        self.report_dtype = report_dtype
        self.expand = expand
        self.callback = callback
        self.validation = validation
        self.snapshot = snapshot
        self.snapshot_every = snapshot_every
        self.tiny = torch.finfo(dtype).tiny
        self.history: List[dict] = []
        self.t0 = time.perf_counter()

    def _make_record(self, iteration: int, primal: float, dual: float, gap: float, extra: dict) -> dict:
        scale = max(abs(primal), abs(dual), self.tiny)
        rec = {"iteration": iteration, "time": time.perf_counter() - self.t0, "primal": primal, "dual": dual,
               "gap": gap, "rel_gap": gap / scale if math.isfinite(gap) else math.inf}
        rec.update(extra)
        return rec

    def record(self, iteration: int, primal: float, dual: float, gap: float, state, alpha, **extra) -> dict:
        """Append a history record (relative gap ``gap / max(|primal|, |dual|)``) and return it."""
        rec = self._make_record(iteration, primal, dual, gap, extra)
        if self.validation is not None:
            with torch.inference_mode(False):  # the user's code runs as it would outside the engine
                rec["validation"] = float(self.validation(*self._reported(state, alpha)))
        self.history.append(rec)
        return rec

    def report_inner(self, iteration: int, primal: float, dual: float, gap: float, state, alpha,
                     **extra) -> Optional[str]:
        """Hand the callback an iterate between two records (e.g. inside a conjugate-gradient run; not kept in
        the history): 'callback' or 'interrupted' when the fit should stop, else None."""
        if self.callback is None:
            return None
        reason = self._call(self._make_record(iteration, primal, dual, gap, extra), state, alpha)
        return self._interrupted(iteration) if reason == "interrupted" else reason

    def _call(self, rec: dict, state, alpha) -> Optional[str]:
        """The callback on ``rec`` and the iterate: 'callback' when it asks to stop, 'interrupted' on a
        KeyboardInterrupt inside it, else None."""
        info = dict(rec)
        state_out, alpha_out = self._reported(state, alpha)
        info.update(alpha=alpha_out, state=state_out, radius=None, rng_state=None)
        try:
            with torch.inference_mode(False):  # the user's code runs as it would outside the engine
                return "callback" if self.callback(info) else None
        except KeyboardInterrupt:
            return "interrupted"

    def stop_reason(self, rec: dict, state, alpha, interrupted: bool, report: bool = True) -> Optional[str]:
        """'converged', 'callback', 'max_time' or 'interrupted' when the loop should end, else None.

        The callback is called every ``options.callback_every`` iterations (every iteration when None) and at the
        converged iterate (the model the fit returns; a Falkon ``error_fn`` reports it, as Falkon's last
        iteration), where 'converged' stands whatever it returns; not when ``report`` is False (the caller
        has just handed it this iterate through :meth:`report_inner`)."""
        it = rec["iteration"]
        if self.snapshot is not None and self.snapshot_every and it % self.snapshot_every == 0:
            state_out, alpha_out = self._reported(state, alpha)
            self.snapshot({"alpha": alpha_out, "state": state_out, "radius": None, "iteration": it, "rng_state": None})
        converged = rec["rel_gap"] <= self.options.tol
        every = self.options.callback_every
        if self.callback is not None and report and (converged or not every or it % every == 0):
            reason = self._call(rec, state, alpha)
            if reason is not None and not converged:
                return self._interrupted(it) if reason == "interrupted" else reason
        if converged:
            return "converged"
        if self.out_of_time():
            return "max_time"
        if interrupted:
            return self._interrupted(it)
        return None

    def out_of_time(self) -> bool:
        """Whether ``options.max_time`` has passed (for checks inside an iteration)."""
        return self.options.max_time is not None and time.perf_counter() - self.t0 >= self.options.max_time

    def result(self, alpha, state, n_iter: int, status: str, rec: Optional[dict]):
        """The engine's :class:`~joker_ext.results.SolverResult` from its last record (NaN gap when there is
        none, e.g. out of memory before the first certificate)."""
        if rec is None:
            rec = {"primal": math.nan, "dual": math.nan, "gap": math.nan, "rel_gap": math.inf}
        state, alpha = self._reported(state, alpha)
        T = alpha.shape[1]
        return SolverResult(alpha=alpha, state=state, n_iter=n_iter, status=status, primal=rec["primal"],
                            dual=rec["dual"], gap=rec["gap"], rel_gap=rec["rel_gap"],
                            radius=torch.ones(T, dtype=alpha.dtype, device=alpha.device), history=self.history,
                            rng_state=None)

    def _reported(self, state: dict, alpha: torch.Tensor):
        """``(state, alpha)`` expanded (:attr:`expand`) and with their floating tensors in :attr:`report_dtype`;
        tensors an engine made under ``torch.inference_mode`` come out as ordinary ones (copies), which their
        receivers may update in place or use in autograd."""
        with torch.inference_mode(False):  # (the expansion and the cast below make ordinary tensors too)
            state = {k: _ordinary(v) for k, v in state.items()}
            alpha = _ordinary(alpha)
            if self.expand is not None:
                state, alpha = self.expand(state, alpha)
            if self.report_dtype is None or alpha.dtype == self.report_dtype:
                return state, alpha
            cast = {k: v.to(self.report_dtype) if torch.is_tensor(v) and v.is_floating_point() else v
                    for k, v in state.items()}
            return cast, alpha.to(self.report_dtype)

    @staticmethod
    def _interrupted(it: int) -> str:
        warnings.warn(f"fit interrupted after {it} iterations; the model keeps the last consistent iterate",
                      RuntimeWarning, stacklevel=3)
        return "interrupted"
