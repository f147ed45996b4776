"""GPyTorch's exact GP posterior mean as a harness backend (squared loss only).

The posterior mean of a zero-mean GP with kernel ``o k`` and Gaussian likelihood noise ``s2`` is
``o k(x, X) (o K + s2 I)^{-1} y``: kernel ridge regression with ``C = o / s2``
(:func:`joker_ext.conversions.gp_to_C`). With outputscale ``o = 1`` the spec's Falkon penalty maps to
``s2 = n lambda`` (:func:`joker_ext.conversions.penalty_to_gp_noise`). Kernels: ``RBFKernel`` with
lengthscale sigma, ``MaternKernel(nu=0.5)`` for the L2 Laplacian, ``MaternKernel(nu)`` for Matern; no
L1-distance Laplacian. Hyperparameters are fixed (no marginal-likelihood training): the point is to solve
the spec's problem. Classification uses -1/+1 targets (one GP per class for multi-class). The linear
solve uses a Cholesky factorisation (``max_cholesky_size`` raised above n); too large problems are skipped
above ``max_n`` (option, default 20,000).
"""
from __future__ import annotations

import numpy as np

from .base import Backend, Skip, pm_targets

__all__ = ["GPyTorchBackend"]

DEFAULT_MAX_N = 20_000


class GPyTorchBackend(Backend):
    """Exact GP posterior mean with noise n * penalty (GPyTorch, Cholesky)."""

    name = "gpytorch"
    uses_M = False
    losses = ("squared",)
    requires = ("gpytorch",)

    def check(self) -> None:
        super().check()
        self.unused_options(("max_n",))
        if self.spec.kernel == "laplacian_l1":
            raise Skip("GPyTorch has no L1-distance Laplacian kernel")
        max_n = int(self.option("max_n", DEFAULT_MAX_N))
        if self.n > max_n:
            raise Skip(f"exact GP needs the {self.n} x {self.n} kernel matrix; n > max_n={max_n}")

    def _covar(self):
        import gpytorch

        fam = self.spec.kernel
        if fam == "gaussian":
            k = gpytorch.kernels.RBFKernel()
        elif fam == "laplacian":
            k = gpytorch.kernels.MaternKernel(nu=0.5)
        else:
            k = gpytorch.kernels.MaternKernel(nu=self.spec.nu)
        k.lengthscale = self.sigma
        return k

    def fit(self, X: np.ndarray, y: np.ndarray, trace) -> None:
        import gpytorch
        import torch

        from joker_ext.conversions import penalty_to_gp_noise

        dtype = self.torch_dtype
        device = torch.device(self.spec.device)
        noise = penalty_to_gp_noise(self.spec.penalty, self.n, outputscale=1.0)
        Xt = torch.as_tensor(np.ascontiguousarray(X), dtype=dtype, device=device)
        Y = pm_targets(y, self.problem.task, self.problem.n_classes).reshape(len(y), -1)
        covar = self._covar()

        class _GP(gpytorch.models.ExactGP):
            def __init__(self, Xtr, ytr, lik):
                super().__init__(Xtr, ytr, lik)
                self.mean_module = gpytorch.means.ZeroMean()
                self.covar_module = covar

            def forward(self, x):
                return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

        self.models_ = []
        n = self.n
        with torch.no_grad(), gpytorch.settings.max_cholesky_size(n + 1), \
                gpytorch.settings.fast_computations(False, False, False), gpytorch.settings.skip_posterior_variances():
            for j in range(Y.shape[1]):
                lik = gpytorch.likelihoods.GaussianLikelihood(
                    noise_constraint=gpytorch.constraints.GreaterThan(1e-12)).to(device=device, dtype=dtype)
                lik.noise = noise
                yt = torch.as_tensor(Y[:, j], dtype=dtype, device=device)
                model = _GP(Xt, yt, lik).to(device=device, dtype=dtype)
                model.eval()
                lik.eval()
                model(Xt[:1]).mean  # computes and caches (K + s2 I)^{-1} y
                self.models_.append(model)
        self._params = {"noise": noise, "outputscale": 1.0, "lengthscale": self.sigma,
                        "kernel": type(covar).__name__, "M": n, "C_equivalent": self.C}

    def predict(self, X: np.ndarray) -> np.ndarray:
        import gpytorch
        import torch

        Xt = torch.as_tensor(np.ascontiguousarray(X), dtype=self.torch_dtype, device=torch.device(self.spec.device))
        cols = []
        with torch.no_grad(), gpytorch.settings.max_cholesky_size(self.n + 1), \
                gpytorch.settings.fast_computations(False, False, False), gpytorch.settings.skip_posterior_variances():
            for m in self.models_:
                cols.append(m(Xt).mean.reshape(-1, 1))
        F = torch.cat(cols, dim=1)
        return self.squeeze_scores(self.to_numpy(F), self.problem.task)
