"""Doubly stochastic functional gradients (seed 003, Dai et al. 2014) as a harness backend.

Written from the paper's Algorithms 1 and 2 (no code of the authors is used).

Problem (seed 003 eq. 1, on the empirical distribution of the training set):

    min_f  R(f) = (1/n) sum_i l(f(x_i), y_i) + (nu / 2) ||f||_H^2,      nu = 1 / (n C)   (CONVENTIONS section 4)

with l one of ``squared`` ``(f - y)^2 / 2``, ``hinge`` ``max(0, 1 - y f)``, ``logistic`` ``log(1 + exp(-y f))``
(y in {-1, +1} for the last two; other two-class labels are mapped, the larger one to +1).

What is reproduced
------------------
At iteration t (t = 0, 1, ...): draw a mini-batch of ``batch_size`` training points uniformly with
replacement (every training point when ``batch_size >= n``) and a fresh block of ``n_features_per_iter`` random features
``phi_t(x) = sqrt(2 s / M) cos(W_t^T x + b_t)`` generated from a seed derived from (seed, t) only;
with the current prediction ``f(x_i)`` the new coefficients are
``a_t = -gamma_t (1 / m) sum_i l'(f(x_i), y_i) phi_t(x_i)`` and every older block is shrunk,
``a_j <- (1 - gamma_t nu) a_j`` (Algorithm 1, mini-batch form), step ``gamma_t = theta / (1 + eta t)``.
The model is ``f(x) = sum_t a_t^T phi_t(x)`` (Algorithm 2). Only the seeds' base and the coefficients are
kept after training: prediction regenerates each block's features from its seed. The spectral densities are
those of CONVENTIONS section 3 (Gaussian: ``w ~ N(0, I / sigma^2)``; Matern nu / Laplacian-L2: multivariate t
with 2 nu degrees of freedom; Laplacian-L1: independent Cauchy(0, 1 / sigma)); ``b ~ U[0, 2 pi]``.

The paper's rate: with ``gamma_t = theta / t`` and ``theta nu`` in (1, 2) or a positive integer,
``E |f_t(x) - f_*(x)|^2 = O(1 / t)`` (Theorem 4) and an O(1 / sqrt(t)) generalisation bound (Theorem 6).
The default ``eta = theta * nu`` makes ``gamma_t ~ (1 / nu) / t`` for large t, i.e. ``theta_eff nu = 1`` [derived].

Step size and batch [derived]
-----------------------------
The paper leaves theta to the user; its theory is asymptotic. For the squared loss the expected step is
functional gradient descent, ``f(X) <- (1 - gamma nu) f(X) - gamma (K / n) (f(X) - y)``, stable for
``gamma < 2 / lambda_1`` (lambda_1: top eigenvalue of ``K / n``) and converging along an eigendirection with
eigenvalue lambda at the rate ``gamma (lambda + nu)`` per step: reaching the exact solution needs a step sum
of several ``1 / (nu + lambda)`` over the directions that matter, and with a local kernel (``K`` close to
the identity, as on flights with sigma = 1 in 25 dimensions) those have ``lambda ~ 1 / n``. Two kinds of
noise cap the step: a mini-batch of m points (``gamma <= m / (s + (m - 1) lambda_1)``, the critical-batch
step of Ma, Bassily & Belkin) and the random features, which spread a step's error over all n training
points with variance ``~ gamma^2 r^2 / (m M)`` each (r: the residual) while the residual falls by
``~ 2 gamma r^2`` in all, so the sum of squared residuals is bounded only if ``gamma < 2 m M / n``. With
``theta = 'auto'`` the solver takes ``1.5 min(m / (L (s + (m - 1) lambda_1)), m M / n)``, L the loss's
curvature bound (1 squared, 1/4 logistic, 1/4 by convention for the hinge), lambda_1 by power iteration on
2,000 training rows. The former fixed ``theta = 1`` with batch 256 and 64 features sat near the feature-noise
bound (1.6 on flights at n = 20,000) and 100 times below ``1 / lambda_1``: 10 passes solved a far more
regularised problem than the stated one. A batch of every training point (``batch_size >= n``; the authors'
code used 32,768 points and 4,096 cos/sin pairs per step) lifts the feature bound to 2 M and costs no more
per step in the incremental mode below.

What is not reproduced
----------------------
* Features are evaluated in ``feature_dtype`` (float32 by default; their Monte Carlo error, ~1 / sqrt(M), is
  far above float32 rounding; frequencies and phases are drawn in float64 and rounded to it); coefficients,
  training predictions and gradients accumulate in ``dtype`` (float64 by default).
* Training-time evaluation: the paper regenerates all earlier features at every iteration (O(t) memory).
  In Python that costs O(t) generator calls per iteration, so either f is kept up to date on all n
  training points (exact, O(n M) per iteration, used when n <= batch_size * n_iter / 2) or the frequencies
  are cached during training (O(t M d) memory). The cache is dropped after fit unless ``keep_features``.
* The authors' GPU implementation, their preconditioned / multi-class (softmax) variants and data
  augmentation are not reproduced (their public code preconditions each block's update by the block's
  feature covariance, with no regularisation, ``reg_param = 0``; with nu > 0 that update does not have the
  stated problem's minimiser as its fixed point, so it is not used here); multi-output is supported for the squared loss only (one coefficient
  column per output).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from joker_ext.kernels import KERNEL_FAMILIES, StationaryKernel

from ._common import (
    _desc,
    as_matrix,
    as_targets,
    binary_labels,
    check_choice,
    check_device,
    check_dtype,
    check_fitted,
    check_number,
    check_callback,
    check_positive_int,
    check_max_time,
    make_generator,
    output_like,
    Stopwatch,
)

__all__ = ["DoublyStochasticGradient", "draw_features"]

LOSSES = ("squared", "hinge", "logistic")
#: Bound on l'' used by theta='auto': squared 1, logistic 1/4; the hinge has none (its subgradient is bounded,
#: a large step makes it oscillate, not diverge) and takes the logistic loss's 1/4.
LOSS_CURVATURE = {"squared": 1.0, "logistic": 0.25, "hinge": 0.25}


def _block_seed(seed: int, t: int) -> int:
    """Seed of the feature block of iteration t, a function of (seed, t) only."""
    state = np.random.SeedSequence([int(seed), int(t)]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


def draw_features(kernel: StationaryKernel, d: int, m: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Frequencies W (d, m) and phases b (m,) for ``phi(x) = sqrt(2 s / m) cos(W^T x + b)``, CPU float64.

    Spectral densities of CONVENTIONS section 3 for bandwidth sigma (scalar or per dimension):
    gaussian ``N(0, I / sigma^2)``; matern nu (laplacian: nu = 1/2) ``z / (sigma sqrt(u / (2 nu)))`` with
    ``z ~ N(0, I)``, ``u ~ chi2(2 nu)`` (a sum of 2 nu squared normals, 2 nu in {1, 3, 5}); laplacian_l1 each
    coordinate ``Cauchy(0, 1 / sigma)``. ``b ~ U[0, 2 pi]``. Same seed, same numbers.
    """
    gen = torch.Generator().manual_seed(seed)
    fam = kernel.family
    if fam == "gaussian":
        W = torch.randn(d, m, generator=gen, dtype=torch.float64)
    elif fam == "laplacian_l1":
        u = torch.rand(d, m, generator=gen, dtype=torch.float64)
        W = torch.tan(math.pi * (u - 0.5))
    else:
        nu = float(kernel.nu)
        dof = int(round(2 * nu))
        z = torch.randn(d, m, generator=gen, dtype=torch.float64)
        u = (torch.randn(dof, m, generator=gen, dtype=torch.float64) ** 2).sum(0)
        W = z / torch.sqrt(u / (2.0 * nu)).unsqueeze(0)
    b = 2.0 * math.pi * torch.rand(m, generator=gen, dtype=torch.float64)
    sigma = kernel.sigma
    if sigma.dim() == 1 and sigma.numel() > 1:
        if sigma.numel() != d:
            raise ValueError(f"sigma has {sigma.numel()} entries but the data have {d} features")
        W = W / sigma.unsqueeze(1)
    else:
        W = W / float(sigma.reshape(-1)[0])
    return W, b


def _loss_derivative(loss: str, f: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """``l'(f, y)`` with respect to f."""
    if loss == "squared":
        return f - Y
    if loss == "hinge":
        return torch.where(Y * f < 1.0, -Y, torch.zeros_like(Y))
    return -Y * torch.sigmoid(-Y * f)


class DoublyStochasticGradient:
    """Doubly stochastic functional gradient descent (seed 003) for squared, hinge or logistic loss.

    Parameters
    ----------
    kernel_family : {'gaussian', 'laplacian', 'laplacian_l1', 'matern'} or StationaryKernel
        Kernel whose random features are drawn (a StationaryKernel carries its own sigma, nu and outputscale).
    sigma : float or array (d,), default 1.0
        Bandwidth (ignored when a kernel object is given): Gaussian ``exp(-||x - y||^2 / (2 sigma^2))``,
        Laplacian ``exp(-||x - y|| / sigma)``.
    loss : {'squared', 'hinge', 'logistic'}
    nu : float, default 1e-4
        Regulariser of ``(1/n) sum l + (nu / 2) ||f||^2``; from an SVM / Joker C: ``nu = 1 / (n C)``.
    theta : float or 'auto', default 'auto'
        Initial step. ``'auto'``: ``1.5 min(m / (L (s + (m - 1) lambda_1)), m M / n)`` with m the batch, M
        ``n_features_per_iter``, L the loss's curvature bound (:data:`LOSS_CURVATURE`), s the kernel's
        outputscale and lambda_1 the top eigenvalue of ``K / n``
        (power iteration on ``min(n, 2000)`` training points) [derived, see the module docstring]; the value
        used is ``theta_``.
    eta : float, optional
        Decay of ``gamma_t = theta / (1 + eta t)``; default ``theta * nu``.
    batch_size : int, default 64
        Training points per iteration (uniform, with replacement); ``batch_size >= n`` takes every training
        point in every step (only the features are then random).
    n_features_per_iter : int, default 64
        Random features generated per iteration (M).
    n_iter : int, default 1000
    matern_nu : float, optional
        Smoothness for ``kernel_family='matern'`` (0.5, 1.5 or 2.5; default 1.5).
    feature_dtype : torch.dtype, default torch.float32
        Precision in which ``cos(W^T x + b)`` is evaluated (in training and prediction alike);
        coefficients, predictions on the training points and gradients are kept in ``dtype``. The features
        are a Monte Carlo estimate with relative error ``~ 1 / sqrt(M)``, far above float32 rounding; float32
        makes a step about three times faster on a CPU.
    keep_features : bool, default False
        Keep the training-time frequency cache (faster prediction, O(n_iter M d) memory).
    max_time : float, optional
        Time budget in seconds (callbacks excluded), checked after every step. The stopping rule is
        ``n_iter`` steps or ``max_time``, whichever comes first (``stop_reason_``); the method has no
        residual to test (its objective would need the whole growing model on all points).
    seed : int, default 0
    device, dtype : as usual.

    Attributes
    ----------
    coef_ : Tensor (n_iter, M, t)
        Raw block coefficients c_t; the model after iteration T is ``scale_[T] * sum_{t<T} c_t^T phi_t``.
    scale_ : Tensor (n_iter + 1,)
        Global shrinkage ``prod_{s<T} (1 - gamma_s nu)`` (lazy form of Algorithm 1's line 6).
    theta_ : float
        The initial step used (``theta``, or the ``'auto'`` value).
    n_iter_ : int
        Steps made (fewer than ``n_iter`` when ``max_time`` stopped the fit).
    stop_reason_ : {'n_iter', 'max_time', 'diverged'}
    fit_seconds_ : float
    notes : list of str
    """

    def __init__(self, kernel_family: Union[str, StationaryKernel] = "gaussian", sigma: Any = 1.0,
                 loss: str = "squared", nu: float = 1e-4, theta: Union[float, str] = "auto", eta: Optional[float] = None,
                 batch_size: int = 64, n_features_per_iter: int = 64, n_iter: int = 1000,
                 matern_nu: Optional[float] = None, feature_dtype: torch.dtype = torch.float32,
                 keep_features: bool = False, max_time: Optional[float] = None, seed: int = 0,
                 device: Union[str, torch.device] = "cpu", dtype: torch.dtype = torch.float64):
        self.max_time = check_max_time(max_time)
        if isinstance(kernel_family, StationaryKernel):
            self.kernel = kernel_family
        elif isinstance(kernel_family, str):
            check_choice("kernel_family", kernel_family, KERNEL_FAMILIES)
            if kernel_family == "matern":
                mn = 1.5 if matern_nu is None else matern_nu
                if mn not in (0.5, 1.5, 2.5):
                    raise ValueError(f"matern_nu must be one of (0.5, 1.5, 2.5), got {matern_nu!r}")
            else:
                mn = None
            try:
                self.kernel = StationaryKernel(kernel_family, sigma, mn)
            except TypeError as exc:
                raise TypeError(f"sigma must be a positive number or a per-dimension array, got {_desc(sigma)}") from exc
        else:
            raise TypeError(f"kernel_family must be one of {KERNEL_FAMILIES} or a StationaryKernel, "
                            f"got {_desc(kernel_family)}")
        self.loss = check_choice("loss", loss, LOSSES)
        self.nu = check_number("nu", nu, low=0.0, low_open=True)
        self.theta = "auto" if isinstance(theta, str) and theta == "auto" else \
            check_number("theta", theta, low=0.0, low_open=True)
        self.eta = check_number("eta", eta, low=0.0, allow_none=True)
        self.batch_size = check_positive_int("batch_size", batch_size, low=1)
        self.n_features_per_iter = check_positive_int("n_features_per_iter", n_features_per_iter, low=1)
        self.n_iter = check_positive_int("n_iter", n_iter, low=1)
        if not isinstance(keep_features, bool):
            raise TypeError(f"keep_features must be a bool, got {_desc(keep_features)}")
        self.keep_features = keep_features
        self.seed = check_positive_int("seed", seed, low=0)
        self.device = check_device(device)
        self.dtype = check_dtype(dtype)
        self.feature_dtype = check_dtype(feature_dtype)
        self.notes: List[str] = []
        self.coef_: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ features
    def _block(self, t: int, d: int) -> Tuple[torch.Tensor, torch.Tensor]:
        W, b = draw_features(self.kernel, d, self.n_features_per_iter, _block_seed(self.seed, t))
        fd = self.feature_dtype
        return W.to(device=self.device, dtype=fd), b.to(device=self.device, dtype=fd)

    def _phi(self, X: torch.Tensor, W: torch.Tensor, b: torch.Tensor, norm: float) -> torch.Tensor:
        """Features ``norm * cos(X W + b)`` evaluated in ``feature_dtype``, returned in ``dtype``."""
        return (torch.cos(torch.addmm(b, X.to(W.dtype), W)) * norm).to(self.dtype)

    def top_eigenvalue(self, X: torch.Tensor, rows: int = 2000, iters: int = 30) -> float:
        """Top eigenvalue of ``K / n`` estimated by power iteration on ``min(n, rows)`` seeded training rows."""
        n = X.shape[0]
        gen = torch.Generator().manual_seed(self.seed + 7919)
        sub = torch.randperm(n, generator=gen)[:rows].to(X.device) if n > rows else slice(None)
        Xs = X[sub]
        Ks = self.kernel(Xs, Xs).to(torch.float64) / Xs.shape[0]
        v = torch.randn(Xs.shape[0], generator=gen, dtype=torch.float64).to(Ks.device)
        lam = 0.0
        for _ in range(iters):
            w = Ks @ v
            lam = float(torch.linalg.vector_norm(w))
            v = w / lam
        return lam

    def auto_theta(self, X: torch.Tensor) -> float:
        """``1.5 min(m / (L (s + (m - 1) lambda_1)), m M / n)``, at most ``0.5 / nu`` (see ``theta``)."""
        n = X.shape[0]
        m, M = min(self.batch_size, n), self.n_features_per_iter
        lam1 = self.top_eigenvalue(X)
        self.lambda_1_ = lam1
        s = float(self.kernel.outputscale)
        L = LOSS_CURVATURE[self.loss]
        return min(1.5 * min(m / (L * (s + (m - 1) * lam1)), m * M / n), 0.5 / self.nu)

    def step_size(self, t: int) -> float:
        """``gamma_t = theta / (1 + eta t)`` (t = 0, 1, ...); theta is ``theta_`` once fitted."""
        theta = getattr(self, "theta_", None)
        if theta is None:
            if self.theta == "auto":
                raise ValueError("theta='auto' is set by fit (theta_)")
            theta = self.theta
        eta = theta * self.nu if self.eta is None else self.eta
        return theta / (1.0 + eta * t)

    # ------------------------------------------------------------------ training
    def fit(self, X: Any, y: Any, callback: Optional[Callable[[Dict[str, Any]], Any]] = None,
            callback_every: Optional[int] = None) -> "DoublyStochasticGradient":
        """Run ``n_iter`` doubly stochastic gradient steps on (X, y).

        ``callback(info)``, if given, is called every ``callback_every`` iterations (default n_iter / 20)
        with ``info = {'iteration', 'step'}``; after fit, :meth:`decision_function` (``n_iter=t``) evaluates
        any intermediate model exactly.
        """
        callback = check_callback(callback)
        watch = Stopwatch(self.max_time)
        every = max(1, self.n_iter // 20) if callback_every is None else \
            check_positive_int("callback_every", callback_every, low=1)
        X = as_matrix(X, "X", dtype=self.dtype, device=self.device)
        n, d = X.shape
        if self.loss == "squared":
            Y, self._one_d = as_targets(y, n, dtype=self.dtype, device=self.device)
            self.classes_ = None
        else:
            signs, self.classes_ = binary_labels(y, n, dtype=self.dtype, device=self.device)
            Y, self._one_d = signs.unsqueeze(1), True
        if self.theta != "auto" and self.theta * self.nu >= 1.0:
            raise ValueError(f"theta * nu must be < 1 so that the shrinkage 1 - gamma_t nu stays positive, "
                             f"got theta={self.theta} and nu={self.nu}")
        self.lambda_1_ = None
        self.theta_ = self.auto_theta(X) if self.theta == "auto" else self.theta
        gen = make_generator(self.seed)
        M, T, k = self.n_features_per_iter, self.n_iter, Y.shape[1]
        # Predictions on the batch need every earlier block. When the training set is small compared with
        # batch_size * n_iter / 2 it is cheaper to keep f on all training points up to date (O(n M) per
        # iteration, exact, and no frequency cache); otherwise the frequencies are cached during training.
        # batch_size >= n: every training point in every step (only the features are random).
        full_batch = self.batch_size >= n
        incremental = full_batch or n <= self.batch_size * T // 2
        cache = self.keep_features or not incremental
        if cache:
            W_all = torch.empty(d, T * M, dtype=self.feature_dtype, device=self.device)
            b_all = torch.empty(T * M, dtype=self.feature_dtype, device=self.device)
        G = torch.zeros(n, k, dtype=self.dtype, device=self.device) if incremental else None
        coef = torch.zeros(T * M, k, dtype=self.dtype, device=self.device)
        scale = torch.ones(T + 1, dtype=torch.float64)
        S = 1.0
        notes: List[str] = []
        norm = math.sqrt(2.0 * self.kernel.outputscale / M)
        stop_reason = "n_iter"
        T_done = 0
        for t in range(T):
            gamma = self.step_size(t)
            if full_batch:
                idx = None
                Yb = Y
            else:
                idx = torch.randint(0, n, (self.batch_size,), generator=gen).to(self.device)
                Yb = Y[idx]
            lo = t * M
            W, b = self._block(t, d)
            if incremental:
                f = S * (G if idx is None else G[idx])
                phi_all = self._phi(X, W, b, norm)  # the new block on every training point, used twice
                phi_b = phi_all if idx is None else phi_all[idx]
            else:
                Xb = X if idx is None else X[idx]
                if t > 0:
                    f = self._phi(Xb, W_all[:, :lo], b_all[:lo], norm) @ (S * coef[:lo])
                else:
                    f = torch.zeros_like(Yb)
                phi_b = self._phi(Xb, W, b, norm)
            if cache:
                W_all[:, lo:lo + M] = W
                b_all[lo:lo + M] = b
            grad = _loss_derivative(self.loss, f, Yb)
            a_new = -gamma * phi_b.T @ grad / Yb.shape[0]
            S *= 1.0 - gamma * self.nu
            if S < 1e-200:  # renormalise: keeps the numbers finite (snapshots before t are then lost)
                coef[:lo] *= S
                if incremental:
                    G *= S
                scale[: t + 1] = float("nan")
                S = 1.0
                notes.append(f"coefficients renormalised at iteration {t}; snapshots before it are unavailable")
            c_new = a_new / S
            coef[lo:lo + M] = c_new
            if incremental:
                G += phi_all @ c_new
            scale[t + 1] = S
            if not torch.isfinite(c_new).all():
                notes.append(f"diverged at iteration {t}: lower theta")
                stop_reason = "diverged"
                T_done = t + 1
                break
            T_done = t + 1
            out_of_time = watch.expired()
            if callback is not None and (T_done % every == 0 or T_done == T or out_of_time):
                watch.call(callback, {"iteration": T_done, "step": gamma})
            if out_of_time:
                stop_reason = "max_time"
                break
        self.n_features_in_ = d
        self.coef_ = coef[: T_done * M].reshape(T_done, M, k)
        self.scale_ = scale[: T_done + 1]
        self.n_iter_ = T_done
        self.stop_reason_ = stop_reason
        self.fit_seconds_ = watch.elapsed()
        self._cache = (W_all, b_all) if self.keep_features else None
        self.training_mode_ = 'incremental' if incremental else 'cached'
        self.notes = notes
        return self

    # ------------------------------------------------------------------ prediction
    def decision_function(self, X: Any, n_iter: Optional[int] = None) -> Union[np.ndarray, torch.Tensor]:
        """``f(X) = scale_T * sum_{t<T} c_t^T phi_t(X)`` with T = ``n_iter`` (default: all iterations).

        The features of block t are regenerated from its seed (unless ``keep_features``); numpy in, numpy
        out; tensor in, tensor out.
        """
        check_fitted(self, "coef_")
        Xt = as_matrix(X, "X", dtype=self.dtype, device=self.device, n_features=self.n_features_in_)
        T_all, M, k = self.coef_.shape
        T = T_all if n_iter is None else check_positive_int("n_iter", n_iter, low=0, high=T_all)
        s = float(self.scale_[T])
        if math.isnan(s):
            raise ValueError(f"the model after iteration {T} is unavailable (coefficients were renormalised later)")
        out = torch.zeros(Xt.shape[0], k, dtype=self.dtype, device=self.device)
        norm = math.sqrt(2.0 * self.kernel.outputscale / M)
        chunk = max(1, 4096 // M)
        for t0 in range(0, T, chunk):
            t1 = min(T, t0 + chunk)
            if self._cache is not None:
                W = self._cache[0][:, t0 * M:t1 * M]
                b = self._cache[1][t0 * M:t1 * M]
            else:
                blocks = [self._block(t, self.n_features_in_) for t in range(t0, t1)]
                W = torch.cat([w for w, _ in blocks], dim=1)
                b = torch.cat([bb for _, bb in blocks])
            out += self._phi(Xt, W, b, norm) @ self.coef_[t0:t1].reshape(-1, k)
        return output_like(out * s, X, self._one_d)

    def predict(self, X: Any) -> Union[np.ndarray, torch.Tensor]:
        """Squared loss: ``f(X)``; hinge / logistic: the predicted class labels (as given to fit)."""
        f = self.decision_function(X)
        if self.classes_ is None:
            return f
        ft = torch.as_tensor(f) if not isinstance(f, torch.Tensor) else f
        pos = (ft > 0).cpu().numpy()
        labels = np.where(pos, self.classes_[1], self.classes_[0])
        if isinstance(X, torch.Tensor) and np.issubdtype(labels.dtype, np.number):
            return torch.as_tensor(labels)
        return labels
