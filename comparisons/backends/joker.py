"""Joker (seed 000) as harness backends: DBCD-TR on the dual, any registry loss.

Three model classes from the one spec, all trained by :func:`joker_ext.model.fit_dual`:

``joker``
    the exact kernel (``f = sum_i alpha_i k(x_i, .)`` over all n training points); M is not used.
``joker_rf``
    M random Fourier features of the spec's kernel (``--option joker_rf.features=cossin|cos|orf``).
``joker_nystrom``
    M Nystrom centres drawn uniformly from the training points (seeded): the model class Falkon uses,
    so that with the squared loss both solve the same problem.

Translation: ``C = 1 / (n * penalty)`` (:func:`joker_ext.conversions.penalty_to_C`), the kernel family and
sigma unchanged, -1/+1 targets for classification (one-vs-rest columns for multi-class).
Budget: ``iterations`` = block iterations; ``epochs`` = passes over the blocks; the default is
:func:`joker_ext.defaults.default_max_iter`; the fit stops at the relative duality gap ``tol`` (default
:data:`joker_ext.defaults.PRACTICAL_TOL`, 1e-6) or after ``spec.soft_seconds``. The settings become one
:func:`joker_ext.plan.make_fit_plan`, as in every other face of joker_ext.
Options: ``block_size``, ``tol``, ``features`` (joker_rf), ``points`` (trace points, default 30).
"""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

from joker_ext.defaults import PRACTICAL_TOL
from joker_ext.losses import get_loss
from joker_ext.plan import RANDOM_FEATURE_MODES, make_fit_plan
from joker_ext.validation import check_choice

from .base import Backend, Skip, pm_targets

__all__ = ["JokerBackend", "JokerRFBackend", "JokerNystromBackend"]

DEFAULT_TOL = PRACTICAL_TOL


def _schedule(max_iter: int, n_points: int) -> set:
    """About ``n_points`` iteration numbers spaced geometrically in [1, max_iter]."""
    pts = np.unique(np.round(np.geomspace(1, max(1, max_iter), num=max(2, n_points))).astype(int))
    return set(int(p) for p in pts)


class JokerBackend(Backend):
    """Joker with the exact kernel."""

    name = "joker"
    uses_M = False
    mode = "exact"
    _known = ("block_size", "tol", "points", "max_iter")

    def check(self) -> None:
        super().check()
        self.unused_options(self._known)
        loss = self.spec.effective_loss
        if self.problem.task == "regression" and loss in ("hinge", "squared_hinge", "logistic"):
            raise Skip(f"loss {loss!r} is a classification loss")

    # ------------------------------------------------------------------ model class
    def _features(self, X) -> Dict[str, Any]:
        """The model class as :func:`joker_ext.plan.make_fit_plan` arguments (``features``, ``n_features``,
        ``centers``)."""
        if self.spec.M is not None:
            self.note(f"exact kernel on all n={self.n} points: M={self.spec.M} not used")
        return {"features": "exact"}

    def _model_size(self) -> int:
        return self.n

    # ------------------------------------------------------------------ fit / predict
    def fit(self, X: np.ndarray, y: np.ndarray, trace) -> None:
        import torch

        spec = self.spec
        dtype, device = self.torch_dtype, torch.device(spec.device)
        loss = get_loss(spec.effective_loss, delta=spec.delta, epsilon=spec.epsilon, quantile=spec.quantile)
        Y = pm_targets(y, self.problem.task, self.problem.n_classes)
        Y = Y.reshape(len(Y), -1)
        n = X.shape[0]
        self.kernel_ = self.joker_kernel()
        Xt = torch.as_tensor(np.ascontiguousarray(X))
        tol = self.option("tol", spec.tol)
        block_size = self.option("block_size")
        max_iter = self.option("max_iter")
        plan = make_fit_plan(
            self.kernel_, loss, n=n, C=self.C, **self._features(Xt), seed=int(spec.seed),
            tol=None if tol is None else float(tol), default_tol=DEFAULT_TOL,
            block_size=int(block_size) if block_size else None,
            max_iter=int(max_iter) if max_iter is not None else (None if spec.iterations is None else
                                                                 int(spec.iterations)), epochs=spec.epochs,
            iteration_budget="blocks", max_time=spec.soft_seconds, dtype=dtype, device=device,
            callback_every=1 if self.mode == "exact" else None, handle_sigint=False,
            # features: the squared loss is one CG run of the Newton engine; its iterates go to the trace too
            callback_cg_every=None if self.mode == "exact" else 1)
        self.fit_plan_ = plan
        self.feature_map_ = plan.feature_map
        if getattr(plan.feature_map, "jitter_used", 0.0):
            self.note(f"K(Z, Z) factorised with jitter {plan.feature_map.jitter_used:.1e}")
        b, max_iter, tol = plan.options.block_size, plan.options.max_iter, plan.options.tol
        C = self.C
        exact = self.feature_map_ is None
        n_points = int(self.option("points", 30))
        metric_at = _schedule(max_iter, n_points)
        gap_at = _schedule(max_iter, 8 * n_points)
        Xtr_dev = Xt.to(device=device, dtype=dtype)
        fmap = self.feature_map_
        kernel = self.kernel_

        def predict_from(alpha, state):
            def f(Xq):
                Xq = torch.as_tensor(Xq).to(device=device, dtype=dtype)
                if fmap is None:
                    return kernel.mmv(Xq, Xtr_dev, alpha)
                return fmap(Xq) @ state["beta"]
            return f

        def callback(info: Dict[str, Any]) -> None:
            it = int(info["iteration"])
            want_metric = (it in metric_at) or not exact
            if it in gap_at or want_metric:
                # Joker minimises D(alpha); the dual objective in the maximisation form is -D.
                trace.record(iteration=it,
                             predict=predict_from(info["alpha"], info["state"]) if want_metric else None,
                             primal=info["primal"], dual=-info["dual"], gap=info["gap"], rel_gap=info["rel_gap"])
            return None

        self.model_ = plan.fit(Xt, torch.as_tensor(Y), callback=callback)
        res = self.model_.result
        last = res.history[-1] if res.history else None
        if last is not None and (not trace.points or trace.points[-1].get("iteration") != res.n_iter):
            trace.record(iteration=res.n_iter, predict=predict_from(self.model_.alpha, res.state),
                         primal=res.primal, dual=-res.dual, gap=res.gap, rel_gap=res.rel_gap)
        if res.status != "converged":
            self.note(f"stopped by {res.status} after {res.n_iter} block iterations at relative duality gap "
                      f"{res.rel_gap:.1e} (tol {tol:g})")
        self._params = {"C": C, "loss": loss.name, "sigma": self.sigma, "kernel": spec.kernel,
                        "M": self._model_size(), "mode": self.mode, "block_size": b, "max_iter": max_iter,
                        "tol": float(tol), "n_iter": res.n_iter, "status": res.status,
                        "rel_gap": res.rel_gap}

    def predict(self, X: np.ndarray) -> np.ndarray:
        F = self.model_.decision(np.ascontiguousarray(X))
        return self.squeeze_scores(self.to_numpy(F), self.problem.task)


class JokerRFBackend(JokerBackend):
    """Joker with M random Fourier features."""

    name = "joker_rf"
    uses_M = True
    mode = "random_features"
    _known = JokerBackend._known + ("features",)

    def check(self) -> None:
        super().check()
        if self.spec.M is None:
            raise Skip("random features need a model size M (--M)")
        check_choice("option joker_rf.features", self.option("features", "cossin"), RANDOM_FEATURE_MODES)

    def _features(self, X) -> Dict[str, Any]:
        return {"features": self.option("features", "cossin"), "n_features": int(self.spec.M)}

    def _model_size(self) -> int:
        return int(self.spec.M)


class JokerNystromBackend(JokerBackend):
    """Joker with M uniformly drawn Nystrom centres (Falkon's model class)."""

    name = "joker_nystrom"
    uses_M = True
    mode = "nystrom"

    def _features(self, X) -> Dict[str, Any]:
        import torch

        M = self.model_size()
        g = torch.Generator().manual_seed(int(self.spec.seed))
        idx = torch.randperm(X.shape[0], generator=g)[:M].sort().values
        centers = X[idx].to(dtype=self.torch_dtype, device=torch.device(self.spec.device))
        return {"features": "nystrom", "centers": centers}

    def _model_size(self) -> int:
        return self.model_size()
