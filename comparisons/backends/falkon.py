"""Falkon and LogisticFalkon (Falkon 0.9) as a harness backend; skipped with a note when not installed.

Translation of the spec (CONVENTIONS.md section 2):

* squared loss -> ``falkon.Falkon(kernel, penalty=lambda, M)``, which minimises
  ``(1/n) ||y - f||^2 + lambda ||f||^2`` over ``f`` in the span of M uniformly drawn centres (Joker's
  ``C = 1/(n lambda)``); classification uses -1/+1 targets (one-vs-rest columns for multi-class);
* logistic loss (binary) -> ``falkon.LogisticFalkon`` with the spec's penalty as the *last* entry of its
  ``penalty_list`` (its objective is ``(1/n) sum l + (lambda/2) ||f||^2``, again ``C = 1/(n lambda)``):
  the earlier entries are Falkon's Newton continuation (larger penalties, one Newton step each); then
  ``iterations`` (default 5) Newton steps at the spec's penalty, 10 CG iterations each;
* Gaussian / Laplacian (L2) / Matern kernels with the same sigma; ``laplacian_l1`` and the other losses
  have no Falkon counterpart and are skipped;
* ``M`` centres (``None``: all n points, the exact KRR solution); budget ``iterations`` = CG iterations
  (Falkon's default 20 otherwise; for LogisticFalkon the number of Newton steps at the final penalty);
* ``FalkonOptions(use_cpu=True, keops_active='no')`` on the CPU, so that no KeOps compilation happens
  (``--option falkon.keops_active=auto`` and other FalkonOptions fields may be given).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict

import numpy as np

from .base import Backend, Skip, pm_targets

__all__ = ["FalkonBackend"]


class FalkonBackend(Backend):
    """Falkon (squared loss) or LogisticFalkon (logistic) over M uniformly drawn centres."""

    name = "falkon"
    uses_M = True
    losses = ("squared", "logistic")
    requires = ("falkon",)

    def check(self) -> None:
        super().check()
        if self.spec.kernel == "laplacian_l1":
            raise Skip("Falkon has no L1-distance Laplacian kernel")
        if self.spec.effective_loss == "logistic" and self.problem.task != "binary":
            raise Skip("LogisticFalkon handles binary problems only")
        if self.spec.effective_loss == "squared" and self.problem.task == "regression":
            pass
        import falkon  # noqa: F401  (the package exists; make sure it imports)

        field_names = {f.name for f in dataclasses.fields(falkon.FalkonOptions)}
        known = field_names | {"maxiter", "penalty_list", "iter_list"}
        self.unused_options(known)

    def _options(self):
        import falkon

        fields = {f.name for f in dataclasses.fields(falkon.FalkonOptions)}
        kw: Dict[str, Any] = {"use_cpu": self.spec.device == "cpu", "keops_active": "no"}
        kw.update({k: v for k, v in self.options.items() if k in fields})
        return falkon.FalkonOptions(**kw)

    def _kernel(self, opt):
        import falkon.kernels as fk

        fam = self.spec.kernel
        if fam == "gaussian":
            return fk.GaussianKernel(sigma=self.sigma, opt=opt)
        if fam == "laplacian":
            return fk.LaplacianKernel(sigma=self.sigma, opt=opt)
        if fam == "matern":
            return fk.MaternKernel(sigma=self.sigma, nu=self.spec.nu, opt=opt)
        raise Skip(f"Falkon has no {fam!r} kernel")  # pragma: no cover (checked above)

    def fit(self, X: np.ndarray, y: np.ndarray, trace) -> None:
        import torch
        import falkon

        spec = self.spec
        dtype = self.torch_dtype
        device = torch.device(spec.device)
        opt = self._options()
        kernel = self._kernel(opt)
        M = self.model_size()
        Xt = torch.as_tensor(np.ascontiguousarray(X), dtype=dtype)
        Y = pm_targets(y, self.problem.task, self.problem.n_classes)
        Yt = torch.as_tensor(Y.reshape(len(Y), -1), dtype=dtype)
        Xts = torch.as_tensor(np.ascontiguousarray(trace.X), dtype=dtype)
        Yts = torch.zeros(Xts.shape[0], Yt.shape[1], dtype=dtype)  # the harness computes the metric itself
        holder: Dict[str, Any] = {}

        def error_fn(_y_true, pred):
            model = holder.get("model")
            if model is not None and getattr(model, "fit_times_", None):
                trace.sync(model.fit_times_[-1])
            holder["it"] = holder.get("it", 0) + 1
            trace.record(iteration=holder["it"], scores=pred)
            return float("nan"), "harness"

        if spec.effective_loss == "squared":
            maxiter = int(self.option("maxiter", spec.iterations or 20))
            if spec.iterations is None and self.option("maxiter") is None:
                self.note("budget: Falkon's default 20 CG iterations")
            model = falkon.Falkon(kernel=kernel, penalty=spec.penalty, M=M, center_selection="uniform",
                                  maxiter=maxiter, seed=int(spec.seed), error_fn=error_fn, error_every=1,
                                  options=opt)
            self._params = {"penalty": spec.penalty, "M": M, "maxiter": maxiter, "sigma": self.sigma,
                            "kernel": type(kernel).__name__, "C_equivalent": self.C}
        else:
            from falkon.gsc_losses import LogisticLoss

            lam = spec.penalty
            penalty_list = self.option("penalty_list")
            if penalty_list is None:
                steps = int(spec.iterations or 5)
                penalty_list = [p for p in (1e-2, 1e-4, 1e-6, 1e-8) if p > 10 * lam][:3] + [lam] * steps
            elif float(penalty_list[-1]) != lam:
                raise ValueError(f"option falkon.penalty_list must end with the spec's penalty {lam:g}, "
                                 f"got {penalty_list!r}")
            iter_list = self.option("iter_list")
            if iter_list is None:
                iter_list = [3 if p != lam else 10 for p in penalty_list]
            if len(iter_list) != len(penalty_list):
                raise ValueError(f"option falkon.iter_list must have one entry per penalty "
                                 f"({len(penalty_list)}), got {iter_list!r}")
            model = falkon.LogisticFalkon(kernel=kernel, penalty_list=list(penalty_list), iter_list=list(iter_list),
                                          loss=LogisticLoss(kernel), M=M, center_selection="uniform",
                                          seed=int(spec.seed), error_fn=error_fn, error_every=1, options=opt)
            self.note(f"LogisticFalkon Newton continuation: penalties {penalty_list}, CG iterations {iter_list}")
            self._params = {"penalty_list": list(penalty_list), "iter_list": list(iter_list), "M": M,
                            "sigma": self.sigma, "kernel": type(kernel).__name__, "C_equivalent": self.C}
        holder["model"] = model
        if device.type != "cpu":
            Xt, Yt = Xt.to(device), Yt.to(device)
            Xts, Yts = Xts.to(device), Yts.to(device)
        model.fit(Xt, Yt, Xts, Yts)
        self.model_ = model

    def predict(self, X: np.ndarray) -> np.ndarray:
        import torch

        Xt = torch.as_tensor(np.ascontiguousarray(X), dtype=self.torch_dtype)
        F = self.model_.predict(Xt)
        return self.squeeze_scores(self.to_numpy(F), self.problem.task)
