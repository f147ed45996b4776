"""ADMM for the kernel SVM dual (seed 002) as a harness backend, from :mod:`joker_ext.comparisons.solvers.admm_svm`.

Translation: hinge loss, binary; LIBSVM's C-SVC dual with ``C = 1/(n penalty)`` (Joker's C) and the spec's
kernel. Like SVC it has an unpenalised intercept b (Joker's model has none; said in ``notes``).
``mode='exact'`` (dense Cholesky of ``K + beta I``) up to n = 20,000, HSS compression beyond (option
``mode``). Stopping rule: by default ADMM runs to its primal / dual residual test (``converged=True``,
relative tolerance ``tol``, default 1e-8) so that it solves the spec's problem, at most ``iterations``
(default 5,000) iterations or the time budget ``max_time`` (``spec.soft_seconds``), whichever comes first; ``--option admm_svm.converged=false`` gives the paper's fixed 10 iterations, which
stop far from the QP optimum (said in ``notes``).
M is not used. Other options: any keyword of :class:`~joker_ext.comparisons.solvers.admm_svm.ADMMSVM` (``beta``,
``tol``, ``hss_options``, ...).
"""
from __future__ import annotations

from typing import Any, Dict

from ._solver import SolverBackend

__all__ = ["ADMMSVMBackend"]

EXACT_MAX_N = 20_000


class ADMMSVMBackend(SolverBackend):
    """ADMM on the C-SVC dual (exact Cholesky or HSS), hinge loss, binary."""

    name = "admm_svm"
    uses_M = False
    losses = ("hinge",)
    tasks = ("binary",)
    module = "joker_ext.comparisons.solvers.admm_svm"
    cls_name = "ADMMSVM"

    def targets(self, y):
        return y  # class indices 0/1: the solver maps the larger label to +1

    def make_solver(self, cls, X):
        opts: Dict[str, Any] = dict(self.options)
        converged = bool(opts.pop("converged", True))
        mode = opts.pop("mode", "exact" if self.n <= EXACT_MAX_N else "hss")
        if converged:
            max_iter = int(opts.pop("max_iter", self.spec.iterations or 5000))
        else:
            max_iter = int(opts.pop("max_iter", self.spec.iterations or 10))
            self.note(f"paper mode: a fixed {max_iter} ADMM iterations (not run to the SVM optimum)")
        if self.spec.M is not None:
            self.note(f"M={self.spec.M} not used ({mode} kernel matrix)")
        self.note("C-SVC dual with an unpenalised intercept b (Joker's model has none)")
        kw: Dict[str, Any] = dict(C=self.C, max_iter=max_iter, converged=converged, mode=mode,
                                  max_time=self.spec.soft_seconds, seed=int(self.spec.seed),
                                  dtype=self.torch_dtype, device=self.spec.device)
        if self.spec.tol is not None:
            kw["tol"] = self.spec.tol
        kw.update(opts)
        solver = cls(self.joker_kernel(), **kw)
        self._params = {"C": self.C, "max_iter": max_iter, "converged": converged, "mode": mode, "M": self.n,
                        "sigma": self.sigma, **opts}
        return solver

    def fit(self, X, y, trace) -> None:
        super().fit(X, y, trace)
        s = self.solver_
        if hasattr(s, "n_iter_"):
            self._params["n_iter"] = int(s.n_iter_)
            if self._params["converged"] and getattr(s, "stop_reason_", "") == "max_iter":
                self.note(f"ADMM stopped at max_iter={self._params['max_iter']} before its residual test")
        if hasattr(s, "beta_"):
            self._params["beta"] = float(s.beta_)

    def progress(self) -> str:
        return f"{self.solver_.n_iter_} of {self._params['max_iter']} iterations"
