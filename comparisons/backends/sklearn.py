"""scikit-learn's exact kernel machines as the reference backend.

Translation of the spec (CONVENTIONS.md section 2; Joker's ``C = 1/(n lambda)``):

=================  ==========================================================================================
loss               scikit-learn model
=================  ==========================================================================================
squared            ``KernelRidge(alpha = n lambda)`` (-1/+1 targets for classification, one column per class)
hinge              ``SVC(C)`` (one-vs-rest for multi-class); LIBSVM adds an unpenalised intercept b that
                   Joker's model does not have (said in ``notes``)
squared_hinge      ``LinearSVC(loss='squared_hinge', C = C / 2, fit_intercept=False)`` on exact kernel
                   features (its loss has no 1/2: ``C_sklearn = C / 2``)
logistic           ``LogisticRegression(C, fit_intercept=False)`` on exact kernel features
epsilon_insens.    ``SVR(C, epsilon)``, with LIBSVM's intercept (noted)
=================  ==========================================================================================

"Exact kernel features": ``Phi = U S^{1/2}`` from the eigendecomposition ``K = U S U^T`` of the training
kernel matrix (``Phi Phi^T = K``), and ``Phi(x) = k(x, X) U S^{-1/2}`` for new points, so that a linear
model ``f = Phi w`` with ``||w||^2`` is the kernel model with ``||f||_H^2``: the same problem as Joker's.
Directions with eigenvalues below ``1e-12 * max`` are dropped.

Kernels: Gaussian as ``rbf`` with ``gamma = 1/(2 sigma^2)``, laplacian_l1 as ``laplacian`` with
``gamma = 1/sigma``, Matern through ``sklearn.gaussian_process.kernels.Matern(length_scale=sigma, nu)``;
the L2-distance Laplacian (not in scikit-learn) is computed by joker_ext's kernel and passed precomputed.
Exact methods hold the n x n kernel matrix: skipped above ``max_n`` (option, default 20,000).
"""
from __future__ import annotations

from typing import Any, Callable, Dict

import numpy as np

from .base import Backend, Skip, pm_targets

__all__ = ["SklearnBackend"]

DEFAULT_MAX_N = 20_000


class SklearnBackend(Backend):
    """Exact kernel ridge / SVC / SVR / logistic regression (scikit-learn), n up to 20,000."""

    name = "sklearn"
    uses_M = False
    losses = ("squared", "hinge", "squared_hinge", "logistic", "epsilon_insensitive")
    requires = ("sklearn",)

    def check(self) -> None:
        super().check()
        self.unused_options(("max_n", "max_iter", "tol"))
        max_n = int(self.option("max_n", DEFAULT_MAX_N))
        if self.n > max_n:
            raise Skip(f"exact kernel methods need the {self.n} x {self.n} kernel matrix; n > max_n={max_n}")
        loss = self.spec.effective_loss
        if loss == "epsilon_insensitive" and self.problem.task != "regression":
            raise Skip("epsilon_insensitive is a regression loss")
        if loss in ("hinge", "squared_hinge", "logistic") and self.problem.task == "regression":
            raise Skip(f"loss {loss!r} is a classification loss")

    # ------------------------------------------------------------------ kernels
    def _kernel_fn(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """k(A, B) as scikit-learn computes it, from the translated parameters."""
        from joker_ext.conversions import sigma_to_gamma

        fam, s = self.spec.kernel, self.sigma
        if fam == "gaussian":
            from sklearn.metrics.pairwise import rbf_kernel

            g = sigma_to_gamma(s, "gaussian")
            self._params.update(kernel="rbf", gamma=g)
            return lambda A, B: rbf_kernel(A, B, gamma=g)
        if fam == "laplacian_l1":
            from sklearn.metrics.pairwise import laplacian_kernel

            g = sigma_to_gamma(s, "laplacian_l1")
            self._params.update(kernel="laplacian", gamma=g)
            return lambda A, B: laplacian_kernel(A, B, gamma=g)
        if fam == "matern":
            from sklearn.gaussian_process.kernels import Matern

            k = Matern(length_scale=s, nu=self.spec.nu)
            self._params.update(kernel="Matern", length_scale=s, nu=self.spec.nu)
            return lambda A, B: k(A, B)
        # L2 Laplacian: scikit-learn has none; evaluate joker_ext's definition
        import torch

        jk = self.joker_kernel()
        self._params.update(kernel="precomputed (joker_ext laplacian, L2 distance)", sigma=s)
        self.note("scikit-learn has no L2-distance Laplacian kernel: the matrix comes from joker_ext's kernel")
        return lambda A, B: jk(torch.as_tensor(A), torch.as_tensor(B)).numpy()

    def _exact_features(self, K: np.ndarray):
        from scipy.linalg import eigh

        S, U = eigh(K)
        keep = S > 1e-12 * max(S.max(), 1e-300)
        if not keep.all():
            self.note(f"exact kernel features: {int((~keep).sum())} directions with eigenvalue < 1e-12 max dropped")
        S, U = S[keep], U[:, keep]
        root = np.sqrt(S)
        self._proj = U / root  # k(x, X) @ proj = phi(x)
        return U * root

    # ------------------------------------------------------------------ fit / predict
    def fit(self, X: np.ndarray, y: np.ndarray, trace) -> None:
        from joker_ext.conversions import penalty_to_krr_alpha

        spec, task = self.spec, self.problem.task
        loss = spec.effective_loss
        if spec.dtype != "float64":
            self.note(f"scikit-learn computes in float64 (dtype={spec.dtype} not used)")
        if spec.device != "cpu":
            self.note(f"scikit-learn runs on the CPU (device={spec.device} not used)")
        self._X = np.ascontiguousarray(X, dtype=np.float64)
        self._k = self._kernel_fn()
        K = self._k(self._X, self._X)
        C = self.C
        max_iter = int(self.option("max_iter", spec.iterations or 10_000))
        tol = float(self.option("tol", spec.tol if spec.tol is not None else 1e-8))
        self._mode = "kernel"
        if loss == "squared":
            from sklearn.kernel_ridge import KernelRidge

            alpha = penalty_to_krr_alpha(spec.penalty, self.n)
            self.model_ = KernelRidge(alpha=alpha, kernel="precomputed")
            Y = pm_targets(y, task, self.problem.n_classes)
            self.model_.fit(K, Y)
            self._params.update(model="KernelRidge", alpha=alpha)
        elif loss == "hinge":
            from sklearn.svm import SVC

            base = SVC(C=C, kernel="precomputed", tol=min(tol, 1e-3), max_iter=-1)
            self.note("SVC (LIBSVM) fits an unpenalised intercept b; Joker's model has none")
            if task == "multiclass":
                from sklearn.multiclass import OneVsRestClassifier

                self.model_ = OneVsRestClassifier(base)
            else:
                self.model_ = base
            self.model_.fit(K, y)
            self._params.update(model="SVC", C=C)
        elif loss == "epsilon_insensitive":
            from sklearn.svm import SVR

            self.model_ = SVR(C=C, epsilon=spec.epsilon, kernel="precomputed", tol=min(tol, 1e-3))
            self.note("SVR (LIBSVM) fits an unpenalised intercept b; Joker's model has none")
            self.model_.fit(K, y)
            self._params.update(model="SVR", C=C, epsilon=spec.epsilon)
        else:
            Phi = self._exact_features(K)
            self._mode = "features"
            if loss == "logistic":
                from sklearn.linear_model import LogisticRegression

                base = LogisticRegression(C=C, fit_intercept=False, tol=tol, max_iter=max_iter)
                self._params.update(model="LogisticRegression on exact kernel features", C=C)
            else:  # squared_hinge
                from sklearn.svm import LinearSVC

                base = LinearSVC(C=C / 2.0, loss="squared_hinge", fit_intercept=False, dual=True, tol=tol,
                                 max_iter=max_iter)
                self._params.update(model="LinearSVC(squared_hinge) on exact kernel features", C=C / 2.0)
            if task == "multiclass":
                from sklearn.multiclass import OneVsRestClassifier

                self.model_ = OneVsRestClassifier(base)
            else:
                self.model_ = base
            self.model_.fit(Phi, y)
        self._params.update(M=self.n, C_joker=C, sigma=self.sigma)

    def predict(self, X: np.ndarray) -> np.ndarray:
        Kt = self._k(np.ascontiguousarray(X, dtype=np.float64), self._X)
        A = Kt @ self._proj if self._mode == "features" else Kt
        if hasattr(self.model_, "decision_function") and self.problem.task != "regression":
            F = self.model_.decision_function(A)
        else:
            F = self.model_.predict(A)
        return self.squeeze_scores(np.asarray(F, dtype=np.float64), self.problem.task)
