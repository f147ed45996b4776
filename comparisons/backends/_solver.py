"""Shared glue for the seed-paper solvers of :mod:`comparisons.solvers` (EigenPro 2/3, ASkotch, DSG, ADMM SVM).

Those solvers are estimators built on a joker_ext kernel: ``Solver(kernel, ...)``, ``fit(X, y)``,
``decision_function(X)``, and a ``notes`` list of what they do not reproduce. A backend subclass only
says how to build the solver from the spec (:meth:`SolverBackend.make_solver`) and which targets it wants.

Convergence traces: when the solver's ``fit`` accepts a ``callback`` argument, it is given a function
``callback(info)``; ``info`` is a dict with ``iteration`` (or ``epoch``) and, when the solver can
evaluate its current iterate, ``predict`` (a function ``X -> scores``); other numbers (residual,
objective) are recorded as they are. Otherwise only the final point is recorded.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Dict

import numpy as np

from .base import Backend, Skip, pm_targets

__all__ = ["SolverBackend"]


class SolverBackend(Backend):
    """Base of the backends that wrap :mod:`comparisons.solvers`."""

    module: str = ""  # e.g. "comparisons.solvers.eigenpro"
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
        if accepts_cb:
            def callback(info: Dict[str, Any]):
                if not isinstance(info, dict):
                    return None
                it = info.get("iteration", info.get("epoch"))
                extra = {k: v for k, v in info.items() if k not in ("iteration", "epoch", "predict")
                         and isinstance(v, (int, float))}
                trace.record(iteration=it, predict=info.get("predict"), **extra)
                return None

            kwargs["callback"] = callback
        self.solver_.fit(Xt, Y, **kwargs)
        for text in getattr(self.solver_, "notes", []) or []:
            self.note(str(text))

    def predict(self, X: np.ndarray) -> np.ndarray:
        import torch

        F = self.solver_.decision_function(torch.as_tensor(np.ascontiguousarray(X), dtype=self.torch_dtype))
        return self.squeeze_scores(self.to_numpy(F), self.problem.task)
