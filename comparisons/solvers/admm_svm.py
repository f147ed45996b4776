"""ADMM for the kernel SVM dual, with an exact or HSS-compressed kernel (seed 002, Cipolla & Gondzio).

Written from the paper's Algorithms 1-3 (no code of the authors or of STRUMPACK is used).

Problem (seed 002 eq. 1; LIBSVM's C-SVC dual):

    min_x  1/2 x^T Y K Y x - e^T x     s.t.  y^T x = 0,  0 <= x_i <= C,          Y = diag(y), y in {-1, +1}

with decision function ``f(v) = sum_i y_i x_i k(x_i, v) + b``. ADMM on the splitting x = z (x carries the
equality constraint, z the box), penalty beta, multiplier mu (Algorithm 2):

    x+ = Y Kb^{-1} Y q - (e^T Kb^{-1} Y q / e^T Kb^{-1} e) Y Kb^{-1} e,   q = e + mu + beta z,  Kb = K + beta I
    z+ = Pi_[0, C](x+ - mu / beta)
    mu+ = mu - beta (x+ - z+)

``Kb`` is factorised once: dense Cholesky (``mode='exact'``, n up to ~2e4) or the HSS approximation of
:mod:`joker_ext.comparisons.solvers.hss` with its fast direct solver (``mode='hss'``, the paper's setting, where the
problem solved is the one with K replaced by its HSS approximation).

What is reproduced
------------------
* The closed-form ADMM iteration above, the precomputation of ``Kb^{-1} e``, the paper's beta rule
  (1e2 for n < 1e5, 1e3 for n < 1e6, 1e4 beyond; the paper states 1e2 for n in [1e4, 1e5]: it is used for
  smaller n too), its MaxIt = 10 default (``max_iter=10``, ``converged=False``), the returned dual point
  ``z`` (box-feasible) and the bias averaged over the free support vectors ``0 < z_j < C`` (their eq. 7).
* The paper reports that 10 iterations suffice for accuracy, not that they reach the QP optimum; they do not
  (the iterates are of size ~ MaxIt / beta). ``converged=True`` runs ADMM to the standard stopping test of
  Boyd et al.: primal residual ``||x - z|| <= eps_abs sqrt(n) + tol max(||x||, ||z||)`` and dual residual
  ``beta ||z - z_prev|| <= eps_abs sqrt(n) + tol ||mu||``.

Notes on the paper's text: its bias formula (2) / (7) is written ``b = sum_i y_i x_i K_ij - y_j`` with the
decision function ``sign(sum_i y_i x_i K(f_i, f) + b)``, which has the opposite sign convention; here
``b = mean_{j free} (y_j - sum_i y_i x_i K_ij)`` so that ``f = sum_i y_i x_i k(x_i, .) + b`` (LIBSVM's).
Algorithm 3's x-update line reads ``Y (ULV)^{-1} Y x^k``; the q^k of Algorithm 2 is meant and used.
When no support vector is free, b is the midpoint of the interval allowed by the KKT conditions (LIBSVM's
rule). Multi-class problems are not handled (two classes only).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from joker_ext.kernels import Kernel

from ._common import (
    cholesky_solve,
    as_matrix,
    binary_labels,
    check_choice,
    check_device,
    check_dtype,
    check_fitted,
    check_number,
    check_positive_int,
    check_callback,
    check_kernel,
    check_max_time,
    output_like,
    Stopwatch,
)
from .hss import HSSMatrix

__all__ = ["ADMMSVM", "paper_beta", "svm_dual_objective"]


def paper_beta(n: int) -> float:
    """The paper's ADMM penalty by training size: 1e2 (n < 1e5), 1e3 (n < 1e6), 1e4 otherwise."""
    if n < 100_000:
        return 1e2
    if n < 1_000_000:
        return 1e3
    return 1e4


def svm_dual_objective(K: Any, y: Any, x: Any) -> float:
    """``1/2 x^T Y K Y x - e^T x`` (numpy or torch inputs)."""
    K = np.asarray(K.detach().cpu() if isinstance(K, torch.Tensor) else K, dtype=np.float64)
    y = np.asarray(y.detach().cpu() if isinstance(y, torch.Tensor) else y, dtype=np.float64)
    x = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    yx = y * x
    return float(0.5 * yx @ K @ yx - x.sum())


class ADMMSVM:
    """Kernel SVM (C-SVC dual) by ADMM with a once-factorised ``K + beta I`` (seed 002).

    Parameters
    ----------
    kernel : joker_ext Kernel
        E.g. ``GaussianKernel(h)``: ``exp(-||x - y||^2 / (2 h^2))``, the paper's kernel with h = sigma.
    C : float
        Box constraint (LIBSVM / scikit-learn's C; Joker's C; Falkon's ``1 / (n lambda)``).
    beta : float, optional
        ADMM penalty; default :func:`paper_beta` (n).
    max_iter : int, default 10
        The paper's MaxIt. In converged mode it is the iteration cap (raise it, e.g. 10000).
    converged : bool, default False
        Stop on primal / dual residuals (``tol``, ``eps_abs``) instead of after ``max_iter`` iterations.
    tol : float, default 1e-8
        Relative tolerance of the residual test.
    eps_abs : float, default 1e-10
        Absolute tolerance of the residual test (per sqrt(n)).
    mode : {'exact', 'hss'}
        Dense Cholesky of ``K + beta I`` or HSS compression + fast solver.
    hss_options : dict, optional
        Keyword arguments of :meth:`HSSMatrix.from_kernel` (max_rank, rel_tol, leaf_size, ...), plus
        ``refine`` (iterative-refinement steps of each solve, default 0).
    max_time : float, optional
        Time budget in seconds (the factorisation included, callbacks excluded), checked after every
        iteration. The stopping rule is ``max_iter`` iterations, the residual test (``converged=True``) or
        ``max_time``, whichever comes first (``stop_reason_``).
    seed : int, default 0
    device, dtype : as usual.

    Attributes
    ----------
    dual_coef_ : Tensor (n,)
        The dual point z (``0 <= z <= C``; ``y^T z ~ 0``).
    intercept_ : float
    support_ : Tensor of indices with ``z > 0``
    n_iter_ : int
    history_ : list of (iteration, primal residual, dual residual)
    stop_reason_ : {'max_iter', 'tol', 'max_time'}
    objective_ : float
        ``1/2 z^T Y K Y z - e^T z`` with the kernel used (K, or the HSS approximation in mode 'hss').
    notes : list of str
    """

    def __init__(self, kernel: Kernel, C: float = 1.0, beta: Optional[float] = None, max_iter: int = 10,
                 converged: bool = False, tol: float = 1e-8, eps_abs: float = 1e-10, mode: str = "exact",
                 hss_options: Optional[Dict[str, Any]] = None, max_time: Optional[float] = None, seed: int = 0,
                 device: Union[str, torch.device] = "cpu", dtype: torch.dtype = torch.float64):
        self.kernel = check_kernel(kernel)
        self.max_time = check_max_time(max_time)
        self.C = check_number("C", C, low=0.0, low_open=True)
        self.beta = check_number("beta", beta, low=0.0, low_open=True, allow_none=True)
        self.max_iter = check_positive_int("max_iter", max_iter, low=1)
        if not isinstance(converged, bool):
            raise TypeError(f"converged must be a bool, got {converged!r} ({type(converged).__name__})")
        self.converged = converged
        self.tol = check_number("tol", tol, low=0.0)
        self.eps_abs = check_number("eps_abs", eps_abs, low=0.0)
        self.mode = check_choice("mode", mode, ("exact", "hss"))
        if hss_options is not None and not isinstance(hss_options, dict):
            raise TypeError(f"hss_options must be a dict of HSSMatrix.from_kernel arguments, got {type(hss_options).__name__}")
        self.hss_options = dict(hss_options or {})
        self.seed = check_positive_int("seed", seed, low=0)
        self.device = check_device(device)
        self.dtype = check_dtype(dtype)
        self.notes: List[str] = []
        self.dual_coef_: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ linear algebra of K + beta I
    def _setup(self, X: torch.Tensor, beta: float):
        n = X.shape[0]
        if self.mode == "exact":
            K = self.kernel(X, X)
            K = 0.5 * (K + K.T)
            Kb = K + beta * torch.eye(n, dtype=self.dtype, device=self.device)
            L, info = torch.linalg.cholesky_ex(Kb)
            if int(info) != 0:
                raise RuntimeError(f"K + beta I is not positive definite (beta={beta}); raise beta")
            solve = lambda B: cholesky_solve(B, L)  # noqa: E731
            matvec = lambda V: K @ V  # noqa: E731
            self._K = K
            return solve, matvec
        opts = dict(self.hss_options)
        refine = opts.pop("refine", 0)  # K + beta I is well conditioned for ADMM's beta: no refinement
        opts.setdefault("seed", self.seed)
        H = HSSMatrix.from_kernel(self.kernel, X, device=self.device, dtype=self.dtype, **opts)
        F = H.factorize(beta, refine=refine)
        self.hss_ = H
        self.hss_factorization_ = F
        solve = lambda B: F._solve_perm(B[H.perm])[H.inv_perm]  # noqa: E731
        matvec = lambda V: H._matvec_perm(V[H.perm])[H.inv_perm]  # noqa: E731
        return solve, matvec

    # ------------------------------------------------------------------ fit
    def fit(self, X: Any, y: Any, callback: Optional[Callable[[Dict[str, Any]], Any]] = None) -> "ADMMSVM":
        """Solve the SVM dual on (X, y) by ADMM; y has two classes (the larger label is +1).

        ``callback(info)``, if given, is called after every iteration with ``info = {'iteration',
        'primal_residual', 'dual_residual', 'predict', 'objective'}``: ``predict(X)`` is the decision
        function of the iterate z (with its bias, eq. 7) and ``objective()`` its dual objective
        ``1/2 z^T Y K Y z - e^T z``. Both are evaluated only when called (one product with K, shared),
        so a caller that times the fit can call them off its clock.
        """
        callback = check_callback(callback)
        watch = Stopwatch(self.max_time)
        X = as_matrix(X, "X", dtype=self.dtype, device=self.device)
        n = X.shape[0]
        ys, self.classes_ = binary_labels(y, n, dtype=self.dtype, device=self.device)
        beta = paper_beta(n) if self.beta is None else self.beta
        notes: List[str] = []
        if not self.converged:
            notes.append(f"paper mode: {self.max_iter} ADMM iterations, not run to the QP optimum "
                         "(use converged=True for the exact SVM solution)")
        if self.mode == "hss":
            notes.append("mode='hss' solves the SVM with the HSS approximation of K (the paper's setting)")
        solve, matvec = self._setup(X, beta)
        C = self.C
        e = torch.ones(n, 1, dtype=self.dtype, device=self.device)
        Y = ys.unsqueeze(1)
        w = solve(e)  # Kb^{-1} e
        w1 = float(e.T @ w)
        Yw = Y * w
        x = torch.zeros(n, 1, dtype=self.dtype, device=self.device)
        z = torch.zeros_like(x)
        mu = torch.zeros_like(x)
        history: List[Tuple[int, float, float]] = []
        sqn = math.sqrt(n)
        it = 0
        stop_reason = "max_iter"
        for it in range(1, self.max_iter + 1):
            q = e + mu + beta * z
            u = solve(Y * q)  # Kb^{-1} Y q
            x = Y * u - (float(e.T @ u) / w1) * Yw
            z_prev = z
            z = (x - mu / beta).clamp(0.0, C)
            mu = mu - beta * (x - z)
            r_p = float((x - z).norm())
            r_d = beta * float((z - z_prev).norm())
            history.append((it, r_p, r_d))
            if callback is not None:
                snap = _Snapshot(self, X, ys, z, matvec)
                watch.call(callback, {"iteration": it, "primal_residual": r_p, "dual_residual": r_d,
                                      "predict": snap.predict, "objective": snap.objective})
            if self.converged:
                eps_p = self.eps_abs * sqn + self.tol * max(float(x.norm()), float(z.norm()))
                eps_d = self.eps_abs * sqn + self.tol * float(mu.norm())
                if r_p <= eps_p and r_d <= eps_d:
                    stop_reason = "tol"
                    break
            if it < self.max_iter and watch.expired():
                stop_reason = "max_time"
                notes.append(f"stopped by max_time={self.max_time:g} s after {it} iterations (primal residual "
                             f"{r_p:.1e}, dual residual {r_d:.1e})")
                break
        if self.converged and stop_reason == "max_iter":
            notes.append(f"converged mode stopped at max_iter={self.max_iter} before meeting tol={self.tol}")
        self.stop_reason_ = stop_reason
        zy = (Y * z)
        Kzy = matvec(zy)[:, 0]
        self.intercept_ = self._bias(z[:, 0], ys, Kzy)
        self.X_ = X
        self.y_signs_ = ys
        self.dual_coef_ = z[:, 0]
        self.coef_y_ = zy[:, 0]
        self.support_ = torch.nonzero(z[:, 0] > 0).flatten()
        self.n_iter_ = it
        self.history_ = history
        self.beta_ = beta
        self.objective_ = float(0.5 * (zy[:, 0] @ Kzy) - z.sum())
        self.equality_violation_ = float((ys * z[:, 0]).sum())
        self.notes = notes
        return self

    def _bias(self, z: torch.Tensor, ys: torch.Tensor, Kzy: torch.Tensor) -> float:
        """Mean of ``y_j - (K Y z)_j`` over free SVs; else the midpoint of the KKT interval (LIBSVM)."""
        C = self.C
        eps = 1e-8 * C
        g = ys - Kzy
        free = (z > eps) & (z < C - eps)
        if bool(free.any()):
            return float(g[free].mean())
        # x_j = 0: y_j f_j >= 1 ; x_j = C: y_j f_j <= 1, with f_j = Kzy_j + b
        lower = torch.cat([g[(z <= eps) & (ys > 0)], g[(z >= C - eps) & (ys < 0)]])
        upper = torch.cat([g[(z <= eps) & (ys < 0)], g[(z >= C - eps) & (ys > 0)]])
        lo = float(lower.max()) if lower.numel() else -math.inf
        hi = float(upper.min()) if upper.numel() else math.inf
        if math.isfinite(lo) and math.isfinite(hi):
            return 0.5 * (lo + hi)
        return lo if math.isfinite(lo) else (hi if math.isfinite(hi) else 0.0)

    # ------------------------------------------------------------------ prediction
    def _decision(self, Xt: torch.Tensor, X: torch.Tensor, coef_y: torch.Tensor, support: torch.Tensor,
                  b: float) -> torch.Tensor:
        if support.numel() == 0:
            return torch.full((Xt.shape[0],), b, dtype=self.dtype, device=self.device)
        return self.kernel.mmv(Xt, X[support], coef_y[support]) + b

    def decision_function(self, X: Any) -> Union[np.ndarray, torch.Tensor]:
        """``f(X) = sum_i y_i z_i k(x_i, X) + b`` with the exact kernel; numpy in, numpy out."""
        check_fitted(self, "dual_coef_")
        Xt = as_matrix(X, "X", dtype=self.dtype, device=self.device, n_features=self.X_.shape[1])
        f = self._decision(Xt, self.X_, self.coef_y_, self.support_, self.intercept_)
        return output_like(f, X, squeeze=True)

    def predict(self, X: Any) -> Union[np.ndarray, torch.Tensor]:
        """Class labels (as given to fit): the larger label where ``f >= 0``."""
        f = self.decision_function(X)
        ft = f if isinstance(f, torch.Tensor) else torch.as_tensor(f)
        labels = np.where((ft >= 0).cpu().numpy(), self.classes_[1], self.classes_[0])
        if isinstance(X, torch.Tensor) and np.issubdtype(labels.dtype, np.number):
            return torch.as_tensor(labels)
        return labels


class _Snapshot:
    """The ADMM iterate z of one iteration, scored lazily for progress callbacks: ``K Y z`` (for the bias and
    the dual objective) is computed on the first call of :meth:`predict` or :meth:`objective` only."""

    def __init__(self, svm: ADMMSVM, X: torch.Tensor, ys: torch.Tensor, z: torch.Tensor, matvec):
        self._svm, self._X, self._ys, self._matvec = svm, X, ys, matvec
        self._z = z[:, 0].detach().clone()
        self._Kzy: Optional[torch.Tensor] = None

    def _products(self) -> torch.Tensor:
        if self._Kzy is None:
            self._Kzy = self._matvec((self._ys * self._z).unsqueeze(1))[:, 0]
            self._b = self._svm._bias(self._z, self._ys, self._Kzy)
        return self._Kzy

    def objective(self) -> float:
        """``1/2 z^T Y K Y z - e^T z`` (K as used by the solver: exact or HSS)."""
        Kzy = self._products()
        return float(0.5 * ((self._ys * self._z) @ Kzy) - self._z.sum())

    def predict(self, X: Any) -> Union[np.ndarray, torch.Tensor]:
        """``sum_i y_i z_i k(x_i, X) + b`` of this iterate (b by eq. 7, as at the end of fit)."""
        self._products()
        svm = self._svm
        Xt = as_matrix(X, "X", dtype=svm.dtype, device=svm.device, n_features=self._X.shape[1])
        support = torch.nonzero(self._z > 0).flatten()
        f = svm._decision(Xt, self._X, self._ys * self._z, support, self._b)
        return output_like(f, X, squeeze=True)
