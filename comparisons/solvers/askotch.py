"""ASkotch and Skotch (seed 004, Rathore, Frangella & Udell) as a harness backend.

Written from the paper's Algorithms 2-4 and the acceleration parameters of the authors' public code (read for
facts, not copied).

Problem: full kernel ridge regression in ASkotch's convention, ``(K + lam I) w = y`` with
``lam = n * lambda_Falkon`` (CONVENTIONS section 2), i.e. the dual ``min_w 1/2 ||w||^2_{K + lam I} - y^T w``.
Prediction ``f(x) = sum_i w_i k(x_i, x)``.

What is reproduced
------------------
* Randomised block coordinate descent on the dual with a fresh **Nystrom block preconditioner** per
  iteration: for a block b (size ``|b|``, drawn uniformly without replacement), ``P_b = Nystrom(K_bb, r)``
  (Algorithm 2: Gaussian test matrix, thin QR, shift ``nu = eps * tr(K_bb)``, Cholesky, SVD,
  ``Lambda = max(0, Sigma^2 - nu)``), damping ``rho = lam + Lambda_r`` (the smallest kept eigenvalue; the
  paper's recommended "damped" choice), step ``1 / L_b`` with ``L_b = lambda_1((P_b + rho I)^{-1/2}
  (K_bb + lam I) (P_b + rho I)^{-1/2})`` estimated by 10 power iterations (Algorithm 3, get_L), and the
  preconditioned block gradient ``v_b = (P_b + rho I)^{-1} (K_b: w + lam w_b - y_b)`` applied through the
  Woodbury identity ``(U diag(L) U^T + rho I)^{-1} g = U (L + rho)^{-1} U^T g + (g - U U^T g) / rho``.
* **ASkotch** (``accelerated=True``): Nesterov-type coupling of accelerated sketch-and-project with
  ``mu = lam``, ``nu = n / |b|``: ``beta = 1 - sqrt(mu / nu)``, ``gamma = 1 / sqrt(mu nu)``,
  ``alpha = 1 / (1 + gamma nu)``; per iteration, with the gradient taken at the extrapolated point y,
  ``x = y - v_b / L_b`` (block only), ``z = beta z + (1 - beta) y - (gamma / L_b) v_b`` (the last term on the
  block), ``y = alpha z + (1 - alpha) x``. ``accelerated=False`` is **Skotch** (plain preconditioned RBCD at x).

What is not reproduced
----------------------
* The paper's first version (NU_ACDM with non-uniform block probabilities ``p_b ~ L_b^alpha`` over a fixed
  partition) is not implemented; blocks are sampled uniformly as in the authors' later code.
* get_L's last line in the paper reads ``lambda = (v^{T-1})^T v^T`` with both vectors normalised (a
  cosine); the Rayleigh quotient ``v^T A v`` of the last unit iterate is used instead [derived].
* Float32 Cholesky-based Woodbury variant (their eq. 10-11), GPU offloading and the inducing-points
  solvers (SketchySAGA) are not reproduced; float64 is the default here.

On a GPU
--------
An iteration's block work is a chain of small dense factorisations (QR, Cholesky with its check, the thin SVD
through an ``r x r`` eigendecomposition, ten power iterations) on ``|b| x r`` and ``r x r`` matrices: at
``|b| = 200``, ``r = 100`` about 0.2 GFLOP, 8.1 ms per iteration on an H100 (26 November 2026), bound by launches
and read-backs, not by the work. Computing the block factors on the CPU instead (a host copy of the data, the
GPU doing the ``|b| x n`` product and the updates) was slower there: 10.5-11.0 ms per iteration
(``comparisons/benchmarks/results/askotch_h100_s18.json``).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from joker_ext.kernels import Kernel

from ._common import (
    as_matrix,
    as_targets,
    check_choice,
    check_device,
    check_dtype,
    check_fitted,
    check_number,
    check_positive_int,
    check_callback,
    check_kernel,
    check_max_time,
    LazyValue,
    make_generator,
    output_like,
    relative_residual,
    residual_rows,
    scorer,
    Stopwatch,
)

__all__ = ["ASkotch", "nystrom_approximation"]


def nystrom_approximation(M: torch.Tensor, rank: int, gen: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    """Randomised Nystrom approximation ``M ~ U diag(L) U^T`` of a PSD matrix (seed 004, Algorithm 2).

    ``Omega = qr(randn(p, r))``, ``nu = eps * tr(M)``, ``Y = (M + nu I) Omega``, ``C = chol(Omega^T Y)``,
    ``B = Y C^{-T}``, ``U, Sigma = svd(B)``, ``L = max(0, Sigma^2 - nu)``. Returns U (p, r) and L (r,),
    L in decreasing order. The thin SVD is taken through the eigendecomposition of ``B^T B``
    (``U = B V Sigma^{-1}``), one small symmetric solve instead of the SVD of a tall matrix.
    """
    p = M.shape[0]
    r = min(rank, p)
    Omega = torch.randn(p, r, generator=gen, dtype=torch.float64).to(device=M.device, dtype=M.dtype)
    Omega, _ = torch.linalg.qr(Omega)
    nu = torch.finfo(M.dtype).eps * M.diagonal().sum()  # a 0-d tensor: no read-back to the host on a GPU
    Y = M @ Omega
    for _ in range(8):
        Ynu = Y + nu * Omega
        G = Omega.T @ Ynu
        G = 0.5 * (G + G.T)
        Lc, info = torch.linalg.cholesky_ex(G)
        if int(info) == 0:
            break
        nu = (nu * 10.0).clamp_min(torch.finfo(M.dtype).eps)
    else:  # pragma: no cover - M far from PSD
        raise RuntimeError("Nystrom approximation: the sketch is not positive definite")
    B = torch.linalg.solve_triangular(Lc, Ynu.T, upper=False).T  # Y_nu C^{-1} with C = Lc^T
    # the thin SVD through the r x r Gram matrix (B = U S V^T, B^T B = V S^2 V^T): 3x faster than the SVD of the
    # tall B on a CPU at |b| = 200, r = 100 (0.6 ms against 1.8 ms), and on a GPU no slow, synchronising SVD
    S2, V = torch.linalg.eigh(B.T @ B)
    S2, V = S2.flip(0), V.flip(1)
    # directions at the Gram matrix's rounding level get U = 0 and L = 0: (L + rho)^-1 = rho^-1 there, as in the
    # complement of U, so the preconditioner is the same whatever U held in them (their Sigma^2 is below
    # |b| eps Sigma_1^2, under the damping rho >= lam of any ridge the solver is used with)
    keep = S2 > B.shape[0] * torch.finfo(B.dtype).eps * S2[0]
    S2 = torch.where(keep, S2, torch.zeros_like(S2))
    U = B @ (V * torch.where(keep, S2.clamp_min(torch.finfo(B.dtype).tiny).rsqrt(), torch.zeros_like(S2)))
    L = (S2 - nu).clamp_min(0.0)
    return U, L


def _precond_apply(U: torch.Tensor, L: torch.Tensor, rho, g: torch.Tensor) -> torch.Tensor:
    """``(U diag(L) U^T + rho I)^{-1} g`` (Woodbury, U orthonormal; ``rho`` a float or a 0-d tensor)."""
    Ug = U.T @ g
    return U @ (Ug / (L + rho).unsqueeze(1)) + (g - U @ Ug) / rho


def _get_L(H: torch.Tensor, U: torch.Tensor, L: torch.Tensor, rho, gen: torch.Generator,
           iters: int = 10) -> torch.Tensor:
    """Power estimate of ``lambda_1((P + rho I)^{-1/2} H (P + rho I)^{-1/2})`` (seed 004, Algorithm 3), as a 0-d
    tensor at least 1e-300.

    ``S = (P + rho I)^{-1/2} = rho^{-1/2} I + U diag((L + rho)^{-1/2} - rho^{-1/2}) U^T`` is formed once
    (``2 |b|^2 r`` flops, as the sketch ``K_bb Omega``), so a power iteration is three ``|b| x |b|`` products,
    ``S (H (S v))``: the paper's ``2 |b|^2 + 8 |b| r`` flops at ``r = |b| / 2``, in a third of the tensor
    operations of applying the Woodbury form twice (on a GPU, a third of the kernel launches). Nothing is read
    back to the host: on a GPU the iterations queue without waiting (a zero iterate stays zero, and its estimate
    0 becomes 1e-300, as a stop at that iteration would give)."""
    v = torch.randn(H.shape[0], 1, generator=gen, dtype=torch.float64).to(device=H.device, dtype=H.dtype)
    v = v / v.norm()
    root = torch.as_tensor(rho, dtype=H.dtype, device=H.device).rsqrt()
    S = (U * ((L + rho).rsqrt() - root)) @ U.T
    S.diagonal().add_(root)
    est = torch.zeros((), dtype=H.dtype, device=H.device)
    tiny = torch.finfo(H.dtype).tiny
    for _ in range(iters):
        w = S @ (H @ (S @ v))
        est = (v * w).sum()
        v = w / w.norm().clamp_min(tiny)
    return est.clamp_min(1e-300)


class ASkotch:
    """ASkotch / Skotch for ``(K + lam I) w = y`` (seed 004).

    Parameters
    ----------
    kernel : joker_ext Kernel
    lam : float
        ASkotch's ridge lambda (> 0): solves ``(K + lam I) w = y``. From a Falkon penalty: ``lam = n * penalty``.
    block_size : int, optional
        Block size ``|b|``; default ``max(1, round(n / 100))`` (about n / 100, the authors' default), capped at n.
    rank : int, default 100
        Rank r of the block Nystrom preconditioner (capped at ``|b|``).
    rho : 'damped', 'regularization' or float
        Preconditioner damping: ``lam + smallest kept Nystrom eigenvalue`` (paper's recommendation), ``lam``,
        or a positive number.
    accelerated : bool, default True
        ASkotch (True) or Skotch (False).
    max_iter : int, default 1000
        Block iterations.
    tol : float or None, default 1e-8
        Stop when ``||K w + lam w - y|| / ||y|| <= tol`` (checked every ``eval_every`` iterations); None: no
        residual test (the residual is then computed only for the callback, which may do so off its clock,
        and estimated on a fixed random subset of 2000 rows when n is larger).
    eval_every : int, optional
        Residual evaluation period; default ``max(1, n // block_size)`` (once per pass over the data).
    max_time : float, optional
        Time budget in seconds (set-up included, callbacks excluded), checked after every iteration. The
        stopping rule is ``max_iter``, ``tol`` or ``max_time``, whichever comes first (``stop_reason_``).
    mu, nu : float, optional
        Acceleration parameters; defaults ``mu = lam``, ``nu = n / |b|``. ``mu < nu`` is required.
    power_iters : int, default 10
    seed : int, default 0
    device, dtype : as usual.

    Attributes
    ----------
    w_ : Tensor (n, t)
        Dual coefficients; ``f(x) = K(x, X) w``.
    history_ : list of (iteration, relative residual)
    n_iter_ : int
    stop_reason_ : {'max_iter', 'tol', 'max_time', 'diverged'}
    fit_seconds_ : float
        The time ``max_time`` was compared with.
    notes : list of str
    """

    def __init__(self, kernel: Kernel, lam: float, block_size: Optional[int] = None, rank: int = 100,
                 rho: Union[str, float] = "damped", accelerated: bool = True, max_iter: int = 1000,
                 tol: Optional[float] = 1e-8, eval_every: Optional[int] = None, mu: Optional[float] = None,
                 nu: Optional[float] = None, power_iters: int = 10, max_time: Optional[float] = None,
                 seed: int = 0, device: Union[str, torch.device] = "cpu", dtype: torch.dtype = torch.float64):
        self.kernel = check_kernel(kernel)
        self.max_time = check_max_time(max_time)
        self.lam = check_number("lam", lam, low=0.0, low_open=True)
        self.block_size = check_positive_int("block_size", block_size, low=1, allow_none=True)
        self.rank = check_positive_int("rank", rank, low=1)
        if isinstance(rho, str):
            self.rho = check_choice("rho", rho, ("damped", "regularization"))
        else:
            self.rho = check_number("rho", rho, low=0.0, low_open=True)
        if not isinstance(accelerated, bool):
            raise TypeError(f"accelerated must be a bool, got {accelerated!r} ({type(accelerated).__name__})")
        self.accelerated = accelerated
        self.max_iter = check_positive_int("max_iter", max_iter, low=0)
        self.tol = check_number("tol", tol, low=0.0, allow_none=True)
        self.eval_every = check_positive_int("eval_every", eval_every, low=1, allow_none=True)
        self.mu = check_number("mu", mu, low=0.0, low_open=True, allow_none=True)
        self.nu = check_number("nu", nu, low=0.0, low_open=True, allow_none=True)
        self.power_iters = check_positive_int("power_iters", power_iters, low=1)
        self.seed = check_positive_int("seed", seed, low=0)
        self.device = check_device(device)
        self.dtype = check_dtype(dtype)
        self.notes: List[str] = []
        self.w_: Optional[torch.Tensor] = None

    def _block_preconditioner(self, Xb: torch.Tensor, rank: int, eye_b: torch.Tensor, gen: torch.Generator):
        """``U, L`` (Nystrom factor of ``K_bb``), the damping ``rho`` and the step scale ``L_b`` of a block."""
        Kbb = self.kernel(Xb, Xb)
        Kbb = 0.5 * (Kbb + Kbb.T)
        U, Lr = nystrom_approximation(Kbb, rank, gen)
        if self.rho == "damped":
            rho = self.lam + Lr[-1]  # 0-d tensors from here on: no read-back per iteration
        elif self.rho == "regularization":
            rho = self.lam
        else:
            rho = float(self.rho)
        Lb = _get_L(Kbb + self.lam * eye_b, U, Lr, rho, gen, self.power_iters)
        return U, Lr, rho, Lb

    def _residual(self, X: torch.Tensor, w: torch.Tensor, Y: torch.Tensor, ynorm: float) -> float:
        r = self.kernel.mmv(X, X, w) + self.lam * w - Y
        return float(r.norm()) / ynorm

    def fit(self, X: Any, y: Any, callback: Optional[Callable[[Dict[str, Any]], Any]] = None) -> "ASkotch":
        """Solve ``(K + lam I) w = y`` by (A)Skotch iterations; y is (n,) or (n, t).

        ``callback(info)``, if given, is called at every residual evaluation with ``info = {'iteration',
        'relative_residual', 'predict'}`` (``predict(X)`` scores with the current iterate; the residual is
        a number, or with ``tol=None`` a function computing it).
        """
        callback = check_callback(callback)
        watch = Stopwatch(self.max_time)
        X = as_matrix(X, "X", dtype=self.dtype, device=self.device)
        n = X.shape[0]
        Y, self._one_d = as_targets(y, n, dtype=self.dtype, device=self.device)
        gen = make_generator(self.seed)
        b = max(1, int(round(n / 100))) if self.block_size is None else self.block_size
        if b > n:
            raise ValueError(f"block_size must be at most the number of training points n={n}, got {b}")
        r = min(self.rank, b)
        notes: List[str] = []
        if r < self.rank:
            notes.append(f"rank reduced from {self.rank} to the block size {b}")
        mu = self.lam if self.mu is None else self.mu
        nu = n / b if self.nu is None else self.nu
        if self.accelerated and not mu < nu:
            raise ValueError(f"mu must be smaller than nu for the acceleration (mu={mu}, nu={nu}); "
                             "lower mu or the block size")
        eval_every = max(1, n // b) if self.eval_every is None else self.eval_every
        ynorm = max(float(Y.norm()), 1e-300)
        w = torch.zeros_like(Y)  # x in the algorithm (the returned iterate)
        if self.accelerated:
            beta_acc = 1.0 - math.sqrt(mu / nu)
            gamma = 1.0 / math.sqrt(mu * nu)
            alpha_acc = 1.0 / (1.0 + gamma * nu)
            z = w.clone()
            yk = w.clone()
        history: List[Tuple[int, float]] = [(0, 1.0)]
        it = 0
        # the residual costs a pass of kernel products: on the clock only when tol needs it or there is no
        # callback; otherwise the callback gets a function computing it (off its clock)
        eager = self.tol is not None or callback is None
        rows = None if eager else residual_rows(n, self.seed)
        stop_reason = "max_iter"
        eye_b = torch.eye(b, dtype=self.dtype, device=self.device)
        for it in range(1, self.max_iter + 1):
            block = torch.randperm(n, generator=gen)[:b].to(self.device)
            Xb = X[block]
            U, Lr, rho, Lb = self._block_preconditioner(Xb, r, eye_b, gen)
            point = yk if self.accelerated else w
            g = self.kernel.mmv(Xb, X, point) + self.lam * point[block] - Y[block]
            v = _precond_apply(U, Lr, rho, g) / Lb
            if self.accelerated:
                w = yk.clone()
                w[block] -= v
                z = beta_acc * z + (1.0 - beta_acc) * yk
                z[block] -= gamma * v
                yk = alpha_acc * z + (1.0 - alpha_acc) * w
            else:
                w[block] -= v
            out_of_time = watch.expired()
            if it % eval_every == 0 or it == self.max_iter or out_of_time:
                if not torch.isfinite(w).all():
                    notes.append(f"diverged at iteration {it}")
                    stop_reason = "diverged"
                    break
                if eager:
                    res = LazyValue(lambda: self._residual(X, w, Y, ynorm))
                else:  # for the callback only: estimated on a fixed subset of rows
                    res = LazyValue(lambda v=w.clone(): relative_residual(self.kernel, X, v, Y, self.lam, rows))
                if eager:
                    res()
                if callback is not None:
                    watch.call(callback, {"iteration": it, "relative_residual": res.value if res.done else res,
                                          "predict": scorer(self.kernel, X, w, self.dtype, self.device,
                                                            self._one_d)})
                if res.done:
                    history.append((it, res.value))
                    if self.tol is not None and res.value <= self.tol:
                        stop_reason = "tol"
                        break
                if out_of_time:
                    stop_reason = "max_time"
                    break
        self.X_ = X
        self.w_ = w
        self.history_ = history
        self.n_iter_ = it
        self.stop_reason_ = stop_reason
        self.fit_seconds_ = watch.elapsed()
        self.block_size_ = b
        self.rank_ = r
        self.notes = notes
        return self

    def decision_function(self, X: Any) -> Union[np.ndarray, torch.Tensor]:
        """``f(X) = K(X, X_train) w``; numpy in, numpy out; tensor in, tensor out."""
        check_fitted(self, "w_")
        Xt = as_matrix(X, "X", dtype=self.dtype, device=self.device, n_features=self.X_.shape[1])
        return output_like(self.kernel.mmv(Xt, self.X_, self.w_), X, self._one_d)

    predict = decision_function
