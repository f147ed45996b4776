"""Shared glue for the seed-paper solvers of :mod:`joker_ext.comparisons.solvers` (EigenPro 2/3, ASkotch, DSG,
ADMM SVM).

Those solvers are estimators built on a joker_ext kernel: ``Solver(kernel, ...)``, ``fit(X, y)``,
``decision_function(X)``, and a ``notes`` list of what they do not reproduce. A backend subclass only
says how to build the solver from the spec (:meth:`SolverBackend.make_solver`) and which targets it wants.

Convergence traces: when the solver's ``fit`` accepts a ``callback`` argument, it is given a function
``callback(info)``; ``info`` is a dict with ``iteration`` (or ``epoch``) and, when the solver can
evaluate its current iterate, ``predict`` (a function ``X -> scores``); other numbers (residual,
objective) are recorded as they are, and functions without arguments (a lazily computed objective) are
called off the clock. Otherwise only the final point is recorded.

A solver that calls back at every iteration (the ADMM SVM: thousands of them) is thinned: the first 30
callbacks are recorded, later ones on a geometric grid about 15% apart (~70 points for 5,000 iterations),
so that the trace's off-the-clock evaluations do not dominate the run's wall time; the last call is always
recorded (at the fit time it was made).
"""
from __future__ import annotations

import importlib
import inspect
import math
from typing import Any, Dict

import numpy as np

from .base import Backend, Skip, pm_targets

__all__ = ["SolverBackend", "TRACE_GROWTH"]

#: Every one of the first TRACE_ALL_FIRST callbacks is recorded, then callbacks about TRACE_GROWTH times
#: apart (see the module docstring).
TRACE_ALL_FIRST = 30
TRACE_GROWTH = 1.15


class SolverBackend(Backend):
    """Base of the backends that wrap :mod:`joker_ext.comparisons.solvers`."""

    module: str = ""  # e.g. "joker_ext.comparisons.solvers.eigenpro"
    cls_name: str = ""
    margin_targets = True  # -1/+1 targets for classification (all of these solvers)

    def solver_class(self):
        try:
            mod = importlib.import_module(self.module)
        except ImportError as exc:
            raise Skip(f"{self.module} is not available ({exc})") from None
        cls = getattr(mod, self.cls_name, None)
        if cls is None:
            raise Skip(f"{self.module} has no {self.cls_name} yet")
        return cls

    def check(self) -> None:
        super().check()
        self.solver_class()

    def make_solver(self, cls, X: np.ndarray):  # pragma: no cover - abstract
        raise NotImplementedError

    def targets(self, y: np.ndarray) -> np.ndarray:
        return pm_targets(y, self.problem.task, self.problem.n_classes)

    def fit(self, X: np.ndarray, y: np.ndarray, trace) -> None:
        import torch

        cls = self.solver_class()
        X = np.ascontiguousarray(X, dtype=np.float64)
        Xt = torch.as_tensor(X, dtype=self.torch_dtype)
        self.solver_ = self.make_solver(cls, Xt)
        Y = torch.as_tensor(self.targets(y), dtype=self.torch_dtype)
        kwargs: Dict[str, Any] = {}
        try:
            accepts_cb = "callback" in inspect.signature(self.solver_.fit).parameters
        except (TypeError, ValueError):
            accepts_cb = False
        pending: Dict[str, Any] = {}
        if accepts_cb:
            calls = [0, 1]  # callbacks so far, next one to record

            def record(info: Dict[str, Any], time_s=None) -> None:
                it = info.get("iteration", info.get("epoch"))
                extra = {k: v for k, v in info.items() if k not in ("iteration", "epoch", "predict")
                         and (isinstance(v, (int, float)) or callable(v))}
                trace.record(iteration=it, predict=info.get("predict"), time_s=time_s, **extra)

            def callback(info: Dict[str, Any]):
                if not isinstance(info, dict):
                    return None
                calls[0] += 1
                k = calls[0]
                if k >= calls[1]:
                    record(info)
                    calls[1] = k + 1 if k < TRACE_ALL_FIRST else max(k + 1, math.ceil(k * TRACE_GROWTH))
                    pending.clear()
                else:
                    pending.update(info=info, time=trace.clock())
                return None

            kwargs["callback"] = callback
        self.solver_.fit(Xt, Y, **kwargs)
        if pending:  # the last iteration, skipped by the grid: recorded at the time it was reached
            record(pending["info"], time_s=pending["time"])
        for text in getattr(self.solver_, "notes", []) or []:
            self.note(str(text))
        self.note_stop()

    def progress(self) -> str:
        """How far the solver got, for the stopping note (e.g. '7.3 of 10 epochs')."""
        return ""

    def note_stop(self) -> None:
        """Record which budget stopped the solver (``stop_reason_``) in params, and in the notes when it was
        the time budget (the row is then an unfinished fit)."""
        reason = getattr(self.solver_, "stop_reason_", None)
        if reason is None:
            return
        self._params["stop_reason"] = reason
        done = self.progress()
        if done:
            self._params["progress"] = done
        if reason == "max_time" and not any(n.startswith("stopped by max_time") for n in self.notes):
            self.note(f"stopped by max_time={self.spec.soft_seconds:g} s" + (f" after {done}" if done else ""))

    def predict(self, X: np.ndarray) -> np.ndarray:
        import torch

        F = self.solver_.decision_function(torch.as_tensor(np.ascontiguousarray(X), dtype=self.torch_dtype))
        return self.squeeze_scores(self.to_numpy(F), self.problem.task)
