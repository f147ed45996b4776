"""scikit-learn bridge: translate scikit-learn kernels into joker_ext kernels.

Two spellings of a kernel exist in scikit-learn, and both map onto :mod:`joker_ext.kernels`:

=============================================== =====================================================
scikit-learn                                    joker_ext
=============================================== =====================================================
``gaussian_process.kernels.RBF(l)``             ``StationaryKernel('gaussian', sigma=l)`` (ARD: l a vector)
``Matern(l, nu)``, nu in {0.5, 1.5, 2.5}        ``StationaryKernel('matern', sigma=l, nu)``
``Matern(l, nu=inf)``                           ``StationaryKernel('gaussian', sigma=l)``
``ConstantKernel(c) * k`` (either side)         the translated ``k`` with its output scale times ``c``
``k1 + k2``                                     :class:`joker_ext.kernels.SumKernel`
other kernels (RationalQuadratic, DotProduct,   :class:`joker_ext.kernels.CallableKernel` running the
ExpSineSquared, products, ...)                  scikit-learn kernel's own ``__call__`` (exact mode only)
``WhiteKernel``                                 refused: ``k(x, y)`` is 0 for two sets of points; its
                                                role (noise) is played by ``C`` (``C = outputscale / noise``)
pairwise name 'rbf' (gamma)                     gaussian with ``sigma = 1 / sqrt(2 gamma)``
pairwise name 'laplacian' (gamma)               'laplacian_l1' with ``sigma = 1 / gamma`` (L1 distance!)
other pairwise names ('linear', 'poly', ...)    ``CallableKernel`` over ``sklearn.metrics.pairwise_kernels``
=============================================== =====================================================

scikit-learn's RBF is ``exp(-||x - y||^2 / (2 l^2))`` and its Matern uses ``sqrt(2 nu) ||x - y|| / l``:
the same conventions as joker_ext's Gaussian and Matern families, so the length scale is ``sigma``.
Hyperparameters are read as they are (a snapshot, fixed bounds ignored): fitting a Gaussian process
first and passing its ``kernel_`` gives Joker the optimised values.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from joker_ext.kernels import CallableKernel, Kernel, StationaryKernel, SumKernel

__all__ = ["translate_kernel", "pairwise_kernel"]


def _gp_kernels():
    from sklearn.gaussian_process import kernels as gpk

    return gpk


def _with_scale(kernel: Kernel, scale: float) -> Kernel:
    if isinstance(kernel, StationaryKernel):
        return StationaryKernel(kernel.family, kernel.sigma, kernel.nu, kernel.outputscale * scale)
    if isinstance(kernel, SumKernel):
        return SumKernel([_with_scale(p, scale) for p in kernel.parts])
    fn = kernel
    return CallableKernel(lambda X1, X2: scale * fn(X1, X2), name=f"{scale:g}*{getattr(fn, 'name', 'kernel')}")


def _callable(sk_kernel) -> CallableKernel:
    def fn(X1: torch.Tensor, X2: torch.Tensor):
        A = X1.detach().cpu().numpy().astype(np.float64, copy=False)
        B = X2.detach().cpu().numpy().astype(np.float64, copy=False)
        return torch.from_numpy(np.asarray(sk_kernel(A, B), dtype=np.float64))

    return CallableKernel(fn, name=f"sklearn {sk_kernel!r}")


def _length_scale(kernel) -> np.ndarray | float:
    ls = np.asarray(kernel.length_scale, dtype=np.float64)
    if not np.all(np.isfinite(ls)) or np.any(ls <= 0):
        raise ValueError(f"length_scale of {kernel!r} must be positive and finite, got {kernel.length_scale!r}")
    return float(ls) if ls.ndim == 0 or ls.size == 1 else ls.reshape(-1)


def translate_kernel(kernel) -> Kernel:
    """Translate a ``sklearn.gaussian_process.kernels`` object into a joker_ext kernel (table above).

    Raises
    ------
    TypeError
        When ``kernel`` is not a scikit-learn Gaussian-process kernel (nor a joker_ext kernel).
    ValueError
        For a WhiteKernel, or a Matern smoothness other than 0.5, 1.5, 2.5 or inf.
    """
    if isinstance(kernel, Kernel):
        return kernel
    gpk = _gp_kernels()
    if not isinstance(kernel, gpk.Kernel):
        raise TypeError(
            "kernel must be a scikit-learn Gaussian-process kernel (sklearn.gaussian_process.kernels.*) or a "
            f"joker_ext kernel, got an object of type {type(kernel).__module__}.{type(kernel).__name__}"
        )
    cls = type(kernel)
    if cls is gpk.RBF:
        return StationaryKernel("gaussian", _length_scale(kernel))
    if cls is gpk.Matern:
        nu = float(kernel.nu)
        if math.isinf(nu):
            return StationaryKernel("gaussian", _length_scale(kernel))
        if nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"Matern nu must be 0.5, 1.5, 2.5 or inf to translate, got nu={kernel.nu!r}")
        return StationaryKernel("matern", _length_scale(kernel), nu)
    if cls is gpk.WhiteKernel:
        raise ValueError(
            "WhiteKernel is zero between two different sets of points, so it changes nothing in a kernel "
            "machine's predictions; its noise level corresponds to the regularisation C = outputscale / noise_level. "
            "Remove it from the kernel and set C"
        )
    if cls is gpk.ConstantKernel:
        c = float(kernel.constant_value)
        return CallableKernel(lambda X1, X2: torch.full((X1.shape[0], X2.shape[0]), c, dtype=X1.dtype,
                                                        device=X1.device), name=f"constant {c:g}")
    if cls is gpk.Product:
        for a, b in ((kernel.k1, kernel.k2), (kernel.k2, kernel.k1)):
            if type(a) is gpk.ConstantKernel:
                c = float(a.constant_value)
                if not math.isfinite(c) or c <= 0:
                    raise ValueError(f"ConstantKernel constant_value must be positive, got {a.constant_value!r}")
                return _with_scale(translate_kernel(b), c)
        return _callable(kernel)
    if cls is gpk.Sum:
        white = [p for p in (kernel.k1, kernel.k2) if type(p) is gpk.WhiteKernel]
        if white:
            translate_kernel(white[0])  # raises the explanation
        return SumKernel([translate_kernel(kernel.k1), translate_kernel(kernel.k2)])
    return _callable(kernel)


def pairwise_kernel(metric: str, **params) -> Kernel:
    """A joker_ext kernel for a ``sklearn.metrics.pairwise_kernels`` name and its parameters.

    ``'rbf'`` and ``'laplacian'`` become stationary kernels (random features available; note that
    scikit-learn's laplacian uses the L1 distance, joker_ext's 'laplacian_l1'); other names run
    ``pairwise_kernels`` itself in exact mode. ``gamma=None`` means scikit-learn's ``1 / n_features``,
    which needs the data: pass gamma explicitly.
    """
    from sklearn.metrics.pairwise import PAIRWISE_KERNEL_FUNCTIONS, pairwise_kernels

    if not isinstance(metric, str) or metric not in PAIRWISE_KERNEL_FUNCTIONS:
        raise ValueError(
            f"metric must be one of {sorted(PAIRWISE_KERNEL_FUNCTIONS)}, got {metric!r}"
        )
    gamma: Optional[float] = params.get("gamma")
    if metric in ("rbf", "laplacian"):
        if gamma is None:
            raise ValueError(f"pairwise_kernel({metric!r}) needs gamma (scikit-learn's default 1/n_features "
                             "depends on the data)")
        if not np.isfinite(gamma) or gamma <= 0:
            raise ValueError(f"gamma must be a positive number, got {gamma!r}")
        if metric == "rbf":
            return StationaryKernel("gaussian", 1.0 / math.sqrt(2.0 * gamma))
        return StationaryKernel("laplacian_l1", 1.0 / gamma)

    def fn(X1: torch.Tensor, X2: torch.Tensor):
        A = X1.detach().cpu().numpy().astype(np.float64, copy=False)
        B = X2.detach().cpu().numpy().astype(np.float64, copy=False)
        return torch.from_numpy(np.asarray(pairwise_kernels(A, B, metric=metric, **params), dtype=np.float64))

    return CallableKernel(fn, name=f"sklearn pairwise {metric}")
