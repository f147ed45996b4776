"""The fit plan: what every front end hands the engine.

A front end (the scikit-learn estimators, JokerFalkon / JokerLogisticFalkon, JokerGP, the harness's joker
backends) translates its own parameters into joker_ext terms and calls :func:`make_fit_plan` once; the
:class:`FitPlan` it returns holds everything :func:`joker_ext.model.fit_dual` needs besides the data: the
kernel and its feature map, the loss and the per-sample costs, the engine chosen, the solver options
(tolerance, block size, iteration budget) and the precision, device and memory budget. The policies live
here and the numbers in :mod:`joker_ext.defaults`, so that the same settings give the same fit whatever the
face.

Conventions. The problem solved is, for each target column,

    min_f 1/2 ||f||_H^2 + sum_i c_i l(y_i, f(x_i) [+ b]),      c_i = C w_i,

with ``w_i`` the sample weights (class weights, likelihood precisions, ... folded in by the front end).
``features`` selects the model class: ``'exact'`` (``f = sum_i alpha_i k(x_i, .)``), random Fourier features
``'cossin'`` (cos/sin pairs), ``'cos'`` (random-phase cosines) or ``'orf'`` (orthogonal cos/sin pairs), or
``'nystrom'`` (``phi(x) = K(x, Z) R^{-1}`` on given centres ``Z``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from .defaults import BLOCK_SIZE, CHUNK_ROWS, default_block_size, default_max_iter, precision_tol
from .engines import default_max_iter as engine_max_iter
from .engines import resolve_solver, supports_intercept
from .features import FeatureMap, NystromFeatureMap, feature_mode_options, make_feature_map
from .kernels import Kernel
from .losses import Loss
from .memory import parse_memory
from .model import KernelModel, fit_dual
from .solver import SolverOptions
from .validation import (check_bool, check_choice, check_device, check_dtype, check_positive,
                         check_positive_int, invalid)

__all__ = ["FitPlan", "make_fit_plan", "feature_map_for", "FEATURE_MODES",
           "RANDOM_FEATURE_MODES", "INTERCEPT_MODES", "ITERATION_BUDGETS"]

#: Random-feature forms: cos/sin pairs, random-phase cosines, orthogonal cos/sin pairs.
RANDOM_FEATURE_MODES = ("cossin", "cos", "orf")
#: Every model class a plan can hold.
FEATURE_MODES = ("exact",) + RANDOM_FEATURE_MODES + ("nystrom",)
#: ``'none'``: no intercept; ``'engine'``: the engine fits it (the dual constraint ``sum_i alpha_i = 0``);
#: ``'search'``: the intercept search of :mod:`joker_ext.intercept` around the engine (run by
#: :func:`joker_ext.model.fit_dual`, so every face gets it).
INTERCEPT_MODES = ("none", "engine", "search")
#: Default iteration budgets: ``'engine'``, the resolved engine's own (:func:`joker_ext.engines.default_max_iter`);
#: ``'blocks'``, DBCD-TR's block-iteration budget whatever the engine (:func:`joker_ext.defaults.default_max_iter`).
ITERATION_BUDGETS = ("engine", "blocks")


def feature_map_for(kernel: Kernel, features: str, n_features: Optional[int] = None, *, seed: int = 0,
                    centers: Optional[torch.Tensor] = None, random_features: Optional[Callable] = None,
                    compute_dtype: Optional[torch.dtype] = None) -> Optional[FeatureMap]:
    """The feature map of ``kernel`` for the model class ``features`` (None for ``'exact'``).

    Parameters
    ----------
    kernel : Kernel
    features : {'exact', 'cossin', 'cos', 'orf', 'nystrom'}
    n_features : int, optional
        Number of random features (random modes only).
    seed : int
        Seed of the random frequencies.
    centers : Tensor (M, d), optional
        The Nystrom centres (``'nystrom'`` only).
    random_features : callable, optional
        ``random_features(kernel, n_features, form=, orthogonal=, seed=[, compute_dtype=])``, the factory of
        random-feature maps; default :func:`joker_ext.features.make_feature_map`. An adapter whose kernels the
        default does not know passes its own.
    compute_dtype : torch.dtype, optional
        Evaluate random features in this dtype (passed on only when given).
    """
    check_choice("features", features, FEATURE_MODES)
    if features == "exact":
        return None
    if features == "nystrom":
        if centers is None:
            raise invalid("centers", "a tensor of Nystrom centres (M, d) with features='nystrom'", None)
        return NystromFeatureMap(kernel, centers)
    if n_features is None:
        raise invalid("n_features", f"a positive integer with features={features!r}", None)
    n_features = check_positive_int("n_features", n_features)
    factory = make_feature_map if random_features is None else random_features
    extra = {} if compute_dtype is None else {"compute_dtype": compute_dtype}
    return factory(kernel, n_features, **feature_mode_options(features), seed=seed, **extra)


def _plain(value: Any) -> Any:
    """A value as plain data for :meth:`FitPlan.describe` (tensors and arrays as lists)."""
    if torch.is_tensor(value):
        return value.detach().cpu().tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    return value


def _describe_kernel(kernel: Kernel) -> Any:
    try:
        return _plain(kernel.describe())
    except (TypeError, NotImplementedError, AttributeError):  # a kernel that is code: its repr
        return repr(kernel)


@dataclasses.dataclass(frozen=True, eq=False)
class FitPlan:
    """Everything a fit needs besides the data; built by :func:`make_fit_plan`.

    Attributes
    ----------
    kernel : Kernel
        The joker_ext kernel (translated by the front end).
    features : str
        The model class, one of :data:`FEATURE_MODES`.
    feature_map : FeatureMap or None
        The random or Nystrom features (None for the exact kernel).
    seed : int
        Seed of the random features, the block partition and the block order.
    loss : Loss
    C : float
        The loss weight; the costs are ``c = C w``.
    c : Tensor (n,)
        Per-sample costs ``C w_i`` (float64, CPU) of this process's rows.
    solver : str
        The engine, resolved (never 'auto').
    requested_solver : str
        What the front end asked for ('auto' or a name).
    intercept : str
        One of :data:`INTERCEPT_MODES`.
    options : SolverOptions
        Tolerance, block size, iteration budget, time budget, seed, verbosity.
    dtype, device : torch.dtype, torch.device
        Precision and device of the fit.
    max_memory : int, str or None
        The memory budget as given (bytes or '2GB'); :attr:`memory_budget` in bytes.
    chunk_rows : int
        Rows per streamed chunk.
    backend : str
        Exact-mode kernel products: 'torch' or 'keops'.
    distributed : bool
        Rows sharded over the processes of a ``torch.distributed`` group.
    n : int
        Training rows (over all processes).
    """

    kernel: Kernel
    features: str
    feature_map: Optional[FeatureMap]
    seed: int
    loss: Loss
    C: float
    c: torch.Tensor
    solver: str
    requested_solver: str
    intercept: str
    options: SolverOptions
    dtype: torch.dtype
    device: torch.device
    max_memory: Union[int, float, str, None]
    chunk_rows: int
    backend: str
    distributed: bool
    n: int

    @property
    def mode(self) -> str:
        """'exact' or 'features': the operator the engine works on."""
        return "exact" if self.feature_map is None else "features"

    @property
    def n_features(self) -> Optional[int]:
        """Width of the feature map (None for the exact kernel)."""
        return None if self.feature_map is None else int(self.feature_map.n_features)

    @property
    def memory_budget(self) -> Optional[int]:
        """The memory budget in bytes (None: none)."""
        return parse_memory(self.max_memory)

    @property
    def n_blocks(self) -> int:
        """Blocks of ``options.block_size`` rows in the ``n`` training rows."""
        return math.ceil(self.n / self.options.block_size)

    def replace(self, **changes) -> "FitPlan":
        """A copy with some fields changed (``options`` may be given as a dict of SolverOptions fields)."""
        if isinstance(changes.get("options"), dict):
            changes["options"] = dataclasses.replace(self.options, **changes["options"])
        return dataclasses.replace(self, **changes)

    def fit(self, X, Y: torch.Tensor, *, shards=None, **run) -> KernelModel:
        """Run the plan on ``X`` (n, d) and ``Y`` (n, T) with :func:`joker_ext.model.fit_dual`.

        ``shards`` is the :class:`~joker_ext.distributed.RowShards` of a distributed fit (default: the plan's
        ``distributed`` flag); ``run`` holds what belongs to one run, not to the plan: ``alpha0``,
        ``callback``, ``validation``, ``resume``, ``checkpoint_path``, ``checkpoint_every``, ``intercept0``. With
        ``intercept='engine'`` the engine fits the intercept; with ``intercept='search'`` the intercept search of
        :func:`joker_ext.intercept.fit_intercept_search` runs around the engine (no ``validation`` then; its
        checkpoints are written between its solves); either way the intercepts are
        ``model.result.state['intercept']``.
        """
        return fit_dual(X, Y, loss=self.loss, c=self.c, kernel=self.kernel, feature_map=self.feature_map,
                        options=self.options, dtype=self.dtype, device=self.device, chunk_rows=self.chunk_rows,
                        backend=self.backend, max_memory=self.max_memory, solver=self.solver,
                        intercept=self.intercept != "none",
                        distributed=self.distributed if shards is None else shards, **run)

    def describe(self) -> dict:
        """The plan as plain data (kernel description, loss name and parameters, options, ...), for display and
        comparisons; the costs appear as their count, sum and extremes."""
        c = self.c.detach().to(torch.float64)
        return {
            "kernel": _describe_kernel(self.kernel),
            "features": self.features,
            "n_features": self.n_features,
            "feature_map": None if self.feature_map is None else type(self.feature_map).__name__,
            "seed": self.seed,
            "loss": {"name": self.loss.name, **_plain(self.loss.params())},
            "C": self.C,
            "c": {"n": int(c.numel()), "sum": float(c.sum()), "min": float(c.min()) if c.numel() else None,
                  "max": float(c.max()) if c.numel() else None},
            "solver": self.solver,
            "requested_solver": self.requested_solver,
            "intercept": self.intercept,
            "options": _plain(dataclasses.asdict(self.options)),
            "dtype": str(self.dtype),
            "device": str(self.device),
            "max_memory": self.max_memory,
            "chunk_rows": self.chunk_rows,
            "backend": self.backend,
            "distributed": self.distributed,
            "n": self.n,
        }

    def __eq__(self, other) -> bool:
        """Equal settings: equal :meth:`describe` (kernel description, loss, options, ...) and equal costs."""
        if not isinstance(other, FitPlan):
            return NotImplemented
        return self.describe() == other.describe() and self.c.shape == other.c.shape and \
            bool(torch.equal(self.c.detach().cpu().double(), other.c.detach().cpu().double()))

    __hash__ = None


def _resolve_engine(solver: str, mode: str, n: int, dtype: torch.dtype, loss: Loss, budget: Optional[int],
                    intercept: bool, distributed: bool) -> str:
    """The engine ``solver`` stands for (:func:`joker_ext.engines.resolve_solver`). An intercept with random
    features and a kinked loss used to keep DBCD-TR under 'auto' (the Newton engine's epsilon-insensitive intercept
    moved 4e-6 between weighted and repeated data in scikit-learn's sample-weight check); since the Newton engine
    takes the exact Hessian at small M it passes that check, and DBCD-TR crawled there: hinge, n = 20,000,
    M = 256, C = 1, with intercept: 90.6 s and 'max_iter' at a gap of 5.5e-4, against 28.1 s converged at 8e-12."""
    return resolve_solver(solver, mode, n, torch.finfo(dtype).bits // 8, loss, budget, distributed=distributed)


def _resolve_tol(tol: Optional[float], default_tol: Optional[float], second_order_tol: Optional[float],
                 engine: str, dtype: torch.dtype) -> float:
    """``tol`` when given; else ``second_order_tol`` for an engine other than DBCD-TR (when given), else
    ``default_tol``, else the working precision's (:func:`joker_ext.defaults.precision_tol`)."""
    if tol is not None:
        return float(check_positive("tol", tol, allow_zero=True))
    if engine != "dbcd_tr" and second_order_tol is not None:
        return float(second_order_tol)
    return float(default_tol) if default_tol is not None else precision_tol(dtype)


def _block_size(block_size: Optional[int], n: int, loss: Loss, exact: bool, single_exact_block: bool):
    """Rows per block and the SolverOptions it implies (see :func:`make_fit_plan`)."""
    if block_size is not None:
        return max(1, min(check_positive_int("block_size", block_size), n)), {}
    if exact and single_exact_block and n <= BLOCK_SIZE:
        return max(1, n), {"subproblem": "direct", "direct_max": max(1, n)}
    return default_block_size(n, loss), {}


def make_fit_plan(
    kernel: Kernel,
    loss: Loss,
    *,
    n: int,
    C: float = 1.0,
    sample_weight=None,
    features: str = "exact",
    n_features: Optional[int] = None,
    centers: Optional[torch.Tensor] = None,
    feature_map: Optional[FeatureMap] = None,
    random_features: Optional[Callable] = None,
    compute_dtype: Optional[torch.dtype] = None,
    seed: int = 0,
    tol: Optional[float] = None,
    default_tol: Optional[float] = None,
    second_order_tol: Optional[float] = None,
    block_size: Optional[int] = None,
    single_exact_block: bool = False,
    max_iter: Optional[int] = None,
    epochs: Optional[float] = None,
    iteration_budget: str = "engine",
    max_time: Optional[float] = None,
    verbose: bool = False,
    max_memory: Union[int, float, str, None] = None,
    dtype: Union[torch.dtype, str, None] = torch.float64,
    device: Union[torch.device, str, None] = "cpu",
    solver: str = "auto",
    intercept: bool = False,
    distributed: bool = False,
    chunk_rows: int = CHUNK_ROWS,
    backend: str = "torch",
    **solver_options,
) -> FitPlan:
    """Turn a front end's settings, already in joker_ext terms, into a :class:`FitPlan`.

    Parameters
    ----------
    kernel : Kernel
        A joker_ext kernel (front ends translate theirs first).
    loss : Loss
    n : int
        Training rows, over all processes when ``distributed``: the engine choice, the default block size and
        the default iteration budget are functions of it.
    C : float
        Loss weight: ``c = C w``.
    sample_weight : array or tensor (n_local,), optional
        Per-sample weights ``w_i >= 0`` of this process's rows (default: ones of length ``n``).
    features : {'exact', 'cossin', 'cos', 'orf', 'nystrom'}
        The model class (:func:`feature_map_for`).
    n_features : int, optional
        Number of random features (random modes).
    centers : Tensor (M, d), optional
        Nystrom centres (``features='nystrom'``).
    feature_map : FeatureMap, optional
        A feature map built already (it then replaces ``n_features`` / ``centers``; ``features`` names its kind).
    random_features : callable, optional
        Factory of random-feature maps (default :func:`joker_ext.features.make_feature_map`).
    compute_dtype : torch.dtype, optional
        Evaluate random features in this dtype.
    seed : int
        Seeds the random features, the block partition and the block order.
    tol, default_tol, second_order_tol : float, optional
        The tolerance policy on the relative duality gap: ``tol`` when given; otherwise ``second_order_tol``
        when given and the engine is not DBCD-TR (a second-order engine stops at the gap, not at a budget);
        otherwise ``default_tol``; otherwise the working precision's (1e-14 in float64, 1e-7 in float32,
        :data:`joker_ext.defaults.PRECISION_TOL`).
    block_size : int, optional
        Rows per block (never more than ``n``). Default: the seed paper's sizes
        (:func:`joker_ext.defaults.default_block_size`); with ``single_exact_block`` and the exact kernel on at
        most 2048 rows, one block of all rows with the exact (eigendecomposition) trust-region subproblem.
    max_iter : int, optional
        The engine's outer iterations. Default: ``epochs`` passes over the blocks when ``epochs`` is given
        (``ceil(epochs * n_blocks)``, at least 1), else by ``iteration_budget``: ``'engine'``, the engine's own
        (:func:`joker_ext.engines.default_max_iter`; :data:`joker_ext.engines.SEARCH_BUDGETS` times that when the
        intercept search runs around the engine, whose solves share it), or ``'blocks'``, DBCD-TR's budget of 50
        passes over the blocks, at least 200 iterations, whatever the engine.
    max_time : float, optional
        Time budget in seconds.
    verbose : bool
    max_memory : int, float or str, optional
        Memory budget ('2GB' or bytes): the engine choice and the block plan of DBCD-TR respect it.
    dtype, device
        Precision and device of the fit.
    solver : str
        'auto' or a registered engine (:func:`joker_ext.engines.resolve_solver`).
    intercept : bool
        Fit an unregularized intercept: by the engine when it can (``plan.intercept == 'engine'``), else by
        the intercept search of :mod:`joker_ext.intercept` around it (``'search'``); both run in
        :meth:`FitPlan.fit`.
    distributed : bool
        Rows sharded over processes (feature engines registered ``distributed=True``).
    chunk_rows : int
        Rows per streamed chunk (default :data:`joker_ext.defaults.CHUNK_ROWS`).
    backend : {'torch', 'keops'}
        Exact-mode kernel products.
    **solver_options
        Further :class:`~joker_ext.solver.SolverOptions` fields (``check_every``, ``callback_every``,
        ``handle_sigint``, ``subproblem``, ...).

    Raises
    ------
    ValueError or TypeError
        Naming the argument, what was expected and what came in.
    """
    if not isinstance(kernel, Kernel):
        raise invalid("kernel", "a joker_ext Kernel (translate other libraries' kernels first)", kernel,
                      type_error=True)
    if not isinstance(loss, Loss):
        raise invalid("loss", "a joker_ext Loss (joker_ext.losses.get_loss)", loss, type_error=True)
    n = check_positive_int("n", n)
    C = float(check_positive("C", C))
    check_choice("features", features, FEATURE_MODES)
    check_choice("iteration_budget", iteration_budget, ITERATION_BUDGETS)
    check_choice("backend", backend, ("torch", "keops"))
    if not isinstance(solver, str):
        raise invalid("solver", "'auto' or the name of a registered engine", solver, type_error=True)
    seed = check_positive_int("seed", seed, low=0)
    intercept = check_bool("intercept", intercept)
    dtype = check_dtype(dtype)
    device = check_device(torch.device("cpu") if device is None else device, require_available=False)
    check_positive("max_time", max_time, allow_none=True)
    budget = parse_memory(max_memory)
    chunk_rows = check_positive_int("chunk_rows", chunk_rows)
    if sample_weight is None:
        w = torch.ones(n, dtype=torch.float64)
    else:
        w = torch.as_tensor(sample_weight).detach().to(device="cpu", dtype=torch.float64).reshape(-1)
        if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
            raise invalid("sample_weight", "finite and non-negative", w[~torch.isfinite(w) | (w < 0)][:3].tolist())
    c = C * w

    if feature_map is None:
        feature_map = feature_map_for(kernel, features, n_features, seed=seed, centers=centers,
                                      random_features=random_features, compute_dtype=compute_dtype)
    elif features == "exact":
        raise invalid("features", "the kind of the feature map given ('cossin', 'cos', 'orf' or 'nystrom')",
                      features)
    mode = "exact" if feature_map is None else "features"
    engine = _resolve_engine(solver, mode, n, dtype, loss, budget, intercept, bool(distributed))
    intercept_mode = "none" if not intercept else ("engine" if supports_intercept(engine, mode, loss) else "search")

    b, implied = _block_size(block_size, n, loss, mode == "exact", single_exact_block)
    if max_iter is not None:
        iters = check_positive_int("max_iter", max_iter)
    elif epochs is not None:
        iters = max(1, int(math.ceil(check_positive("epochs", epochs) * math.ceil(n / b))))
    elif iteration_budget == "engine":
        iters = engine_max_iter(engine, n, b, search=intercept_mode == "search", loss=loss)
    else:
        iters = default_max_iter(n, b)
    known = {f.name for f in dataclasses.fields(SolverOptions)}
    unknown = sorted(set(solver_options) - known)
    if unknown:
        raise invalid("solver_options", f"SolverOptions fields ({sorted(known)})", unknown)
    options = SolverOptions(**{**implied, **solver_options, "block_size": b, "max_iter": iters,
                               "tol": _resolve_tol(tol, default_tol, second_order_tol, engine, dtype),
                               "max_time": max_time, "seed": seed, "verbose": bool(verbose)})
    return FitPlan(kernel=kernel, features=features, feature_map=feature_map, seed=seed, loss=loss, C=C, c=c,
                   solver=engine, requested_solver=solver, intercept=intercept_mode, options=options, dtype=dtype,
                   device=device, max_memory=max_memory, chunk_rows=chunk_rows, backend=backend,
                   distributed=bool(distributed), n=n)
