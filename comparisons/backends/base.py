"""What every harness backend implements, and the helpers they share.

A backend is one small class: it receives the :class:`~joker_ext.comparisons.spec.ExperimentSpec` (with ``sigma``
already resolved to a number) and a :class:`Problem` (sizes and task), translates the spec into its own
library's parameters through :mod:`joker_ext.conversions`, and implements

* ``check()``: raise :class:`Skip` (with the reason) when it cannot solve this problem at all (loss not
  supported, package missing, too large for an exact method), *before* any expensive work;
* ``fit(X, y, trace)``: train; call ``trace.record(...)`` along the way when the solver allows it;
* ``predict(X)``: scores, i.e. predictions (regression), decision values (binary, > 0 means class 1)
  or an (n, K) matrix of one-vs-rest scores (multi-class);
* ``params()``: the translated parameters actually used (recorded in results.csv);
* ``notes``: a list of sentences saying what of the spec it could not honour, or how it interpreted it.

Targets: ``fit`` receives the harness's targets: float (regression, z-scored when the spec says so),
or class indices 0..K-1; :func:`pm_targets` turns them into the -1/+1 coding of Joker's margin losses.
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import numpy as np

__all__ = ["Skip", "Problem", "Backend", "pm_targets", "package_available", "resolve_budget_epochs"]


class Skip(Exception):
    """Raised by a backend that cannot run the given spec; the message is the reason shown in the table."""


@dataclass
class Problem:
    """Facts about the data a backend may need before seeing it."""

    task: str
    n_train: int
    n_test: int
    n_features: int
    n_classes: Optional[int] = None
    dataset: str = ""

    @property
    def n_outputs(self) -> int:
        """Columns of the target matrix: 1 for regression and binary, K for multi-class (one-vs-rest)."""
        return 1 if self.task in ("regression", "binary") else int(self.n_classes or 1)


def package_available(name: str) -> bool:
    """True when ``import name`` would find the package (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def pm_targets(y: np.ndarray, task: str, n_classes: Optional[int] = None) -> np.ndarray:
    """Targets of a margin loss: (n,) -1/+1 for binary (class 1 is +1), (n, K) -1/+1 one-vs-rest for
    multi-class; regression targets are returned as float64 unchanged."""
    y = np.asarray(y)
    if task == "regression":
        return y.astype(np.float64)
    if task == "binary":
        return np.where(y == 1, 1.0, -1.0)
    K = int(n_classes if n_classes is not None else y.max() + 1)
    return np.where(y[:, None] == np.arange(K)[None, :], 1.0, -1.0)


def resolve_budget_epochs(spec, default: float) -> float:
    """Passes over the data for a stochastic solver: ``spec.epochs``, else ``default``."""
    return float(spec.epochs) if spec.epochs is not None else float(default)


class Backend:
    """Base class of harness backends (see the module docstring for the contract).

    Attributes
    ----------
    name : str
        The backend's name in the table.
    uses_M : bool
        Whether the model size M changes what the backend does (exact methods ignore it, and the harness
        runs them once per sweep).
    losses : tuple of str
        Losses it can solve (empty: any).
    requires : tuple of str
        Packages it imports (a missing one makes it skip with a note).
    """

    name: str = "backend"
    uses_M: bool = True
    losses: tuple = ()
    tasks: tuple = ("regression", "binary", "multiclass")
    requires: tuple = ()

    def __init__(self, spec, problem: Problem):
        self.spec = spec
        self.problem = problem
        self.notes: List[str] = []
        self.options: Dict[str, Any] = spec.backend_options(self.name)
        self._params: Dict[str, Any] = {}

    # -------------------------------------------------------------- contract
    def check(self) -> None:
        """Raise :class:`Skip` when this backend cannot solve the spec's problem."""
        for pkg in self.requires:
            if not package_available(pkg):
                raise Skip(f"{pkg} is not installed")
        loss = self.spec.effective_loss
        if self.losses and loss not in self.losses:
            raise Skip(f"{self.name} has no {loss!r} loss (supports {', '.join(self.losses)})")
        if self.problem.task not in self.tasks:
            raise Skip(f"{self.name} does not handle task {self.problem.task!r}")

    def fit(self, X: np.ndarray, y: np.ndarray, trace) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def predict(self, X: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def params(self) -> Dict[str, Any]:
        """The backend's own parameters, as translated from the spec."""
        return dict(self._params)

    # -------------------------------------------------------------- helpers
    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def option(self, key: str, default: Any = None) -> Any:
        """A backend-specific option from the spec (``--option name.key=value``)."""
        return self.options.get(key, default)

    def unused_options(self, known) -> None:
        """Raise ValueError for options this backend does not know (a typo must not pass silently)."""
        bad = sorted(set(self.options) - set(known))
        if bad:
            raise ValueError(f"options for backend {self.name!r} must be among {sorted(known)}, got {bad}")

    @property
    def n(self) -> int:
        return self.problem.n_train

    @property
    def C(self) -> float:
        """Joker's C = 1 / (n lambda) for the spec's Falkon penalty."""
        from joker_ext.conversions import penalty_to_C

        return penalty_to_C(self.spec.penalty, self.n)

    @property
    def sigma(self) -> float:
        s = self.spec.sigma
        if isinstance(s, str):  # the harness resolves 'median' before building backends
            raise ValueError("sigma must be resolved to a number before a backend is built, got 'median'")
        return float(s)

    @property
    def torch_dtype(self):
        import torch

        return torch.float64 if self.spec.dtype == "float64" else torch.float32

    def joker_kernel(self):
        """The spec's kernel as a joker_ext kernel object (the reference definition of the function)."""
        from joker_ext.kernels import make_kernel

        return make_kernel(self.spec.kernel, self.sigma, nu=self.spec.nu if self.spec.kernel == "matern" else None)

    def model_size(self, default: Optional[int] = None) -> int:
        """M, capped at n (with a note), or ``default`` (None: n) when the spec has none."""
        M = self.spec.M
        if M is None:
            return self.n if default is None else min(default, self.n)
        if M > self.n:
            self.note(f"M={M} > n={self.n}: using M=n")
            return self.n
        return int(M)

    @staticmethod
    def to_numpy(a) -> np.ndarray:
        if hasattr(a, "detach"):
            a = a.detach().cpu().numpy()
        return np.asarray(a, dtype=np.float64)

    @staticmethod
    def squeeze_scores(F: np.ndarray, task: str) -> np.ndarray:
        """(n, 1) -> (n,) for regression and binary; (n, K) kept for multi-class."""
        F = np.asarray(F, dtype=np.float64)
        if task in ("regression", "binary") and F.ndim == 2:
            return F[:, 0]
        return F


def check_every_for(n_points: int, budget: int) -> int:
    """How often (in iterations) to record a trace point so that about ``n_points`` are recorded."""
    return max(1, int(math.ceil(budget / max(1, n_points))))
