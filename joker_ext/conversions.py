"""One hyperparameter, every library's spelling (CONVENTIONS.md section 2 is the specification).

``n`` is the number of training points, ``lam`` Falkon's ``penalty``. Joker's ``C`` multiplies the loss
in ``1/2 ||f||^2 + C sum_i l(y_i, f(x_i))``.

================================= ========================================================
quantity                          relation
================================= ========================================================
Falkon penalty -> Joker C         C = 1 / (n lam)
Falkon penalty -> sklearn         KernelRidge alpha = n lam; SVC / LogisticRegression C = C
Falkon penalty -> GPyTorch noise  noise = n lam * outputscale  (so C = outputscale / noise)
Falkon penalty -> ASkotch         lambda_askotch = n lam, solves (K + lambda I) w = y
Joker C -> DSG nu                 nu = 1 / (n C)
Gaussian sigma -> sklearn gamma   gamma = 1 / (2 sigma^2)
laplacian_l1 sigma -> gamma       gamma = 1 / sigma  (sklearn's laplacian_kernel)
================================= ========================================================
"""
from __future__ import annotations

import math

from .validation import check_positive, check_positive_int

__all__ = [
    "penalty_to_C",
    "C_to_penalty",
    "penalty_to_krr_alpha",
    "krr_alpha_to_C",
    "gp_to_C",
    "gp_noise_to_C_scaled",
    "penalty_to_gp_noise",
    "penalty_to_askotch_lambda",
    "C_to_dsg_nu",
    "sigma_to_gamma",
    "gamma_to_sigma",
]


def _positive(name: str, value) -> float:
    return check_positive(name, value)


def _count(n) -> int:
    """The number of training points (an integer >= 1; 100.0 is taken as 100)."""
    return check_positive_int("n", n, allow_integral_float=True)


def penalty_to_C(penalty: float, n: int) -> float:
    """Falkon ``penalty`` (minimises ``(1/n)||y - f||^2 + lam ||f||^2``) -> Joker ``C = 1/(n lam)``."""
    return 1.0 / (_count(n) * _positive("penalty", penalty))


def C_to_penalty(C: float, n: int) -> float:
    """Joker ``C`` -> Falkon ``penalty = 1/(n C)``."""
    return 1.0 / (_count(n) * _positive("C", C))


def penalty_to_krr_alpha(penalty: float, n: int) -> float:
    """Falkon ``penalty`` -> scikit-learn ``KernelRidge(alpha=n lam)``."""
    return _count(n) * _positive("penalty", penalty)


def krr_alpha_to_C(alpha: float) -> float:
    """scikit-learn ``KernelRidge(alpha)`` (``||y - f||^2 + alpha ||f||^2``) -> Joker ``C = 1/alpha``."""
    return 1.0 / _positive("alpha", alpha)


def gp_to_C(noise: float, outputscale: float = 1.0) -> float:
    """GP posterior mean with likelihood noise ``s2`` and outputscale ``o`` is KRR with ``C = o / s2``.

    The posterior mean is ``k_o(x, X) (K_o + s2 I)^{-1} y`` with ``K_o = o K``. Joker with the unit-scale
    kernel ``K`` and C solves ``alpha = (K + I/C)^{-1} y``; writing ``K_o + s2 I = o (K + (s2/o) I)`` shows
    the two agree when ``1/C = s2/o``. joker_ext keeps the outputscale in the kernel, so with the
    scaled kernel ``K_o`` the dual is ``(K_o + I/C)^{-1} y`` and ``C = 1/s2``; this function returns the
    C for the unit-scale kernel. See :func:`gp_noise_to_C_scaled` for the other.
    """
    return _positive("outputscale", outputscale) / _positive("noise", noise)


def gp_noise_to_C_scaled(noise: float) -> float:
    """C to use with the *scaled* kernel (outputscale kept inside the kernel): ``C = 1 / noise``."""
    return 1.0 / _positive("noise", noise)


def penalty_to_gp_noise(penalty: float, n: int, outputscale: float = 1.0) -> float:
    """Falkon ``penalty`` -> GP likelihood noise ``n lam * outputscale``."""
    return _count(n) * _positive("penalty", penalty) * _positive("outputscale", outputscale)


def penalty_to_askotch_lambda(penalty: float, n: int) -> float:
    """Falkon ``penalty`` -> ASkotch's ``lambda = n lam`` in ``(K + lambda I) w = y``."""
    return _count(n) * _positive("penalty", penalty)


def C_to_dsg_nu(C: float, n: int) -> float:
    """Joker ``C`` -> doubly-stochastic-gradient regulariser ``nu = 1/(n C)`` (objective ``E l + nu/2 ||f||^2``)."""
    return 1.0 / (_count(n) * _positive("C", C))


def sigma_to_gamma(sigma: float, kernel: str = "gaussian") -> float:
    """Bandwidth -> scikit-learn ``gamma``: ``1/(2 sigma^2)`` (rbf) or ``1/sigma`` (laplacian_l1)."""
    s = _positive("sigma", sigma)
    if kernel == "gaussian":
        return 1.0 / (2.0 * s * s)
    if kernel == "laplacian_l1":
        return 1.0 / s
    raise ValueError(f"kernel must be 'gaussian' or 'laplacian_l1' for a gamma, got {kernel!r}")


def gamma_to_sigma(gamma: float, kernel: str = "gaussian") -> float:
    """scikit-learn ``gamma`` -> bandwidth (inverse of :func:`sigma_to_gamma`)."""
    g = _positive("gamma", gamma)
    if kernel == "gaussian":
        return 1.0 / math.sqrt(2.0 * g)
    if kernel == "laplacian_l1":
        return 1.0 / g
    raise ValueError(f"kernel must be 'gaussian' or 'laplacian_l1' for a gamma, got {kernel!r}")
