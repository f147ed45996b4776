"""scikit-learn bridge: translate scikit-learn kernels into joker_ext kernels.

Two spellings of a kernel exist in scikit-learn, and both map onto :mod:`joker_ext.kernels`:

=============================================== =====================================================
scikit-learn                                    joker_ext
=============================================== =====================================================
``gaussian_process.kernels.RBF(l)``             ``StationaryKernel('gaussian', sigma=l)`` (ARD: l a vector)
``Matern(l, nu)``, nu in {0.5, 1.5, 2.5}        ``StationaryKernel('matern', sigma=l, nu)``
``Matern(l, nu=inf)``                           ``StationaryKernel('gaussian', sigma=l)``
``RationalQuadratic(l, alpha)``                 :class:`joker_ext.kernels.RationalQuadraticKernel` (sigma=l,
                                                alpha; exact random features)
``ConstantKernel(c) * k`` (either side)         the translated ``k`` with its output scale times ``c``
``k1 + k2``                                     :class:`joker_ext.kernels.SumKernel`
other kernels (DotProduct, ExpSineSquared,      :class:`SklearnKernel` (a CallableKernel) running the
products, ...)                                  scikit-learn kernel's own ``__call__`` (exact mode only)
``WhiteKernel``                                 refused: ``k(x, y)`` is 0 for two sets of points; its
                                                role (noise) is played by ``C`` (``C = outputscale / noise``)
pairwise name 'rbf' (gamma)                     gaussian with ``sigma = 1 / sqrt(2 gamma)``
pairwise name 'laplacian' (gamma)               'laplacian_l1' with ``sigma = 1 / gamma`` (L1 distance!)
other pairwise names ('linear', 'poly', ...)    :class:`SklearnPairwiseKernel` over ``pairwise_kernels``
pairwise names 'sigmoid', 'additive_chi2'       refused: not positive semidefinite (:data:`INDEFINITE_METRICS`)
=============================================== =====================================================

scikit-learn's RBF is ``exp(-||x - y||^2 / (2 l^2))``, its Matern uses ``sqrt(2 nu) ||x - y|| / l`` and its
RationalQuadratic is ``(1 + ||x - y||^2 / (2 alpha l^2))^(-alpha)``: the same conventions as joker_ext's Gaussian,
Matern and rational quadratic kernels, so the length scale is ``sigma``.
Hyperparameters are read as they are (a snapshot, fixed bounds ignored): fitting a Gaussian process
first and passing its ``kernel_`` gives Joker the optimised values.

Every translated kernel pickles (no closures), and every one built from scikit-learn's own kernel classes has a
plain :meth:`~joker_ext.kernels.Kernel.describe` (class names and hyperparameters, :func:`kernel_spec`), so an
estimator fitted with it can be saved in joker_ext's checkpoint format, which holds no code.
"""
from __future__ import annotations

import copy
import math
import numbers
from typing import Optional

import numpy as np
import torch

from joker_ext.kernels import (CallableKernel, Kernel, RationalQuadraticKernel, StationaryKernel, SumKernel,
                               matern_family)

__all__ = ["translate_kernel", "pairwise_kernel", "SklearnKernel", "SklearnPairwiseKernel", "kernel_spec",
           "kernel_from_spec"]


def _gp_kernels():
    from sklearn.gaussian_process import kernels as gpk

    return gpk


def _numpy_pair(X1: torch.Tensor, X2: torch.Tensor):
    return (X1.detach().cpu().numpy().astype(np.float64, copy=False),
            X2.detach().cpu().numpy().astype(np.float64, copy=False))


class _SklearnEvaluation:
    """``fn(X1, X2)``: a scikit-learn kernel object's own ``__call__`` on two blocks (module level, so that an
    estimator holding it pickles)."""

    def __init__(self, sk_kernel):
        self.sk_kernel = sk_kernel

    def __call__(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        A, B = _numpy_pair(X1, X2)
        return torch.from_numpy(np.asarray(self.sk_kernel(A, B), dtype=np.float64))


class _PairwiseEvaluation:
    """``fn(X1, X2)``: ``sklearn.metrics.pairwise_kernels(X1, X2, metric, **params)`` on two blocks."""

    def __init__(self, metric: str, params: dict):
        self.metric = metric
        self.params = dict(params)

    def __call__(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        from sklearn.metrics.pairwise import pairwise_kernels

        A, B = _numpy_pair(X1, X2)
        return torch.from_numpy(np.asarray(pairwise_kernels(A, B, metric=self.metric, **self.params),
                                           dtype=np.float64))


class SklearnKernel(CallableKernel):
    """A scikit-learn Gaussian-process kernel object evaluated by its own ``__call__``, block by block (exact
    mode only: no spectral description). Its :meth:`describe` is the kernel's :func:`kernel_spec` (class name
    and hyperparameters), so checkpoints can hold it without pickled code."""

    def __init__(self, sk_kernel):
        sk_kernel = copy.deepcopy(sk_kernel)  # a snapshot: later changes to the user's object change nothing here
        super().__init__(_SklearnEvaluation(sk_kernel), name=f"sklearn {sk_kernel!r}")
        self.sk_kernel = sk_kernel

    def scaled(self, factor: float) -> "SklearnKernel":
        """``ConstantKernel(factor) * k``: still one scikit-learn kernel object (describable)."""
        return SklearnKernel(_gp_kernels().ConstantKernel(float(factor)) * self.sk_kernel)

    def describe(self) -> dict:
        try:
            return {"type": "sklearn", "kernel": kernel_spec(self.sk_kernel)}
        except TypeError:  # a user's kernel class, or a parameter that is code: not describable
            return super().describe()


class SklearnPairwiseKernel(CallableKernel):
    """``sklearn.metrics.pairwise_kernels(X1, X2, metric, **params)`` as an exact-mode kernel (see
    :func:`pairwise_kernel`)."""

    def __init__(self, metric: str, params: dict):
        super().__init__(_PairwiseEvaluation(metric, params), name=f"sklearn pairwise {metric}")
        self.metric = metric
        self.params = dict(params)

    def describe(self) -> dict:
        try:
            return {"type": "sklearn_pairwise", "metric": self.metric,
                    "params": {str(k): _encode(v) for k, v in self.params.items()}}
        except TypeError:
            return super().describe()


# ---------------------------------------------------------------------------- plain descriptions
def _encode(v):
    """A kernel parameter as plain data (JSON-able); nested kernels, arrays, tuples, lists and dicts tagged."""
    gpk = _gp_kernels()
    if isinstance(v, gpk.Kernel):
        return {"kernel": kernel_spec(v)}
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    if isinstance(v, np.ndarray) and v.dtype.kind in "biuf":
        return {"array": v.tolist(), "dtype": v.dtype.str}
    if isinstance(v, tuple):
        return {"tuple": [_encode(e) for e in v]}
    if isinstance(v, list):
        return {"list": [_encode(e) for e in v]}
    if isinstance(v, dict):
        return {"dict": {str(k): _encode(e) for k, e in v.items()}}
    raise TypeError(f"the kernel parameter {v!r} ({type(v).__name__}) has no plain description")


def _decode(v):
    if not isinstance(v, dict):
        return v
    if "array" in v:
        return np.asarray(v["array"], dtype=np.dtype(v["dtype"]))
    if len(v) != 1:
        raise ValueError(f"malformed value {v!r} in a scikit-learn kernel description")
    (tag, value), = v.items()
    if tag == "kernel":
        return kernel_from_spec(value)
    if tag == "tuple":
        return tuple(_decode(e) for e in value)
    if tag == "list":
        return [_decode(e) for e in value]
    if tag == "dict":
        return {k: _decode(e) for k, e in value.items()}
    raise ValueError(f"unknown tag {tag!r} in a scikit-learn kernel description")


def kernel_spec(kernel) -> dict:
    """A scikit-learn Gaussian-process kernel as plain data: ``{'class': name, 'params': {...}}`` with the
    constructor parameters (``get_params(deep=False)``; nested kernels described the same way).

    Raises
    ------
    TypeError
        For a class that is not one of ``sklearn.gaussian_process.kernels``' own (a user's subclass is code),
        or a parameter that is code (a PairwiseKernel with a callable metric).
    """
    gpk = _gp_kernels()
    cls = type(kernel)
    if getattr(gpk, cls.__name__, None) is not cls:
        raise TypeError(f"only scikit-learn's own kernel classes have a plain description, got "
                        f"{cls.__module__}.{cls.__qualname__}")
    return {"class": cls.__name__, "params": {k: _encode(v) for k, v in kernel.get_params(deep=False).items()}}


def kernel_from_spec(spec: dict):
    """The scikit-learn kernel object :func:`kernel_spec` described (only classes of
    ``sklearn.gaussian_process.kernels`` are built: a description never runs other code)."""
    gpk = _gp_kernels()
    cls = getattr(gpk, spec["class"], None)
    if not (isinstance(cls, type) and issubclass(cls, gpk.Kernel) and cls.__module__ == gpk.__name__):
        raise ValueError(f"{spec['class']!r} is not a kernel class of sklearn.gaussian_process.kernels")
    return cls(**{k: _decode(v) for k, v in spec["params"].items()})


def load_description(desc: dict) -> Kernel:
    """Rebuild a :class:`SklearnKernel` or :class:`SklearnPairwiseKernel` from its ``describe()``."""
    if desc["type"] == "sklearn":
        return SklearnKernel(kernel_from_spec(desc["kernel"]))
    if desc["type"] == "sklearn_pairwise":
        return SklearnPairwiseKernel(desc["metric"], {k: _decode(v) for k, v in desc["params"].items()})
    raise ValueError(f"not a scikit-learn kernel description: {desc!r}")


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
        family, nu = matern_family(kernel.nu, "Matern")
        return StationaryKernel(family, _length_scale(kernel), nu)
    if cls is gpk.RationalQuadratic:
        return RationalQuadraticKernel(_length_scale(kernel), kernel.alpha)
    if cls is gpk.WhiteKernel:
        raise ValueError(
            "WhiteKernel is zero between two different sets of points, so it changes nothing in a kernel "
            "machine's predictions; its noise level corresponds to the regularisation C = outputscale / noise_level. "
            "Remove it from the kernel and set C"
        )
    if cls is gpk.Product:
        for a, b in ((kernel.k1, kernel.k2), (kernel.k2, kernel.k1)):
            if type(a) is gpk.ConstantKernel:
                c = float(a.constant_value)
                if not math.isfinite(c) or c <= 0:
                    raise ValueError(f"ConstantKernel constant_value must be positive, got {a.constant_value!r}")
                inner = translate_kernel(b)
                # c * (a kernel scikit-learn evaluates) stays one kernel scikit-learn evaluates: the product itself
                return SklearnKernel(kernel) if isinstance(inner, SklearnKernel) else inner.scaled(c)
        return SklearnKernel(kernel)
    if cls is gpk.Sum:
        white = [p for p in (kernel.k1, kernel.k2) if type(p) is gpk.WhiteKernel]
        if white:
            translate_kernel(white[0])  # raises the explanation
        return SumKernel([translate_kernel(kernel.k1), translate_kernel(kernel.k2)])
    # ConstantKernel, DotProduct, ExpSineSquared, Exponentiation, products, ...
    return SklearnKernel(kernel)


#: ``pairwise_kernels`` names whose kernel is not positive semidefinite, with the reason. The dual that joker_ext
#: solves is convex, and its duality gap a certificate, only for a positive semidefinite kernel (LIBSVM runs these
#: anyway and returns a stationary point of a nonconvex problem; joker_ext's Cholesky factorisations of the
#: free block failed on them, with a LinAlgError that did not say why).
INDEFINITE_METRICS = {
    "sigmoid": "tanh(gamma <x, y> + coef0) has negative eigenvalues for every gamma > 0",
    "additive_chi2": "-sum (x - y)^2 / (x + y) is only conditionally positive definite (its diagonal is 0)",
}


def _check_polynomial(params: dict) -> None:
    """``(gamma <x, y> + coef0)^degree`` is positive semidefinite for ``gamma > 0``, ``coef0 >= 0`` and a whole
    ``degree >= 0`` (a sum of powers of the linear kernel with nonnegative weights); refuse other values."""
    degree, coef0, gamma = params.get("degree", 3), params.get("coef0", 1), params.get("gamma")
    if not isinstance(degree, numbers.Real) or not math.isfinite(degree) or degree < 0 or degree != int(degree):
        raise ValueError(f"pairwise_kernel('poly'): degree must be a whole number >= 0 (else the kernel is not "
                         f"positive semidefinite), got {degree!r}")
    if not isinstance(coef0, numbers.Real) or not math.isfinite(coef0) or coef0 < 0:
        raise ValueError(f"pairwise_kernel('poly'): coef0 must be a number >= 0 (else the kernel is not positive "
                         f"semidefinite), got {coef0!r}")
    if gamma is not None and (not isinstance(gamma, numbers.Real) or not math.isfinite(gamma) or gamma <= 0):
        raise ValueError(f"pairwise_kernel('poly'): gamma must be a positive number or None, got {gamma!r}")


def pairwise_kernel(metric: str, **params) -> Kernel:
    """A joker_ext kernel for a ``sklearn.metrics.pairwise_kernels`` name and its parameters.

    ``'rbf'`` and ``'laplacian'`` become stationary kernels (random features available; note that
    scikit-learn's laplacian uses the L1 distance, joker_ext's 'laplacian_l1'); other names run
    ``pairwise_kernels`` itself in exact mode. ``gamma=None`` means scikit-learn's ``1 / n_features``,
    which needs the data: pass gamma explicitly. Names whose kernel is not positive semidefinite
    (:data:`INDEFINITE_METRICS`: 'sigmoid', 'additive_chi2'), and 'poly' with a negative ``coef0`` or a
    fractional ``degree``, are refused: the dual problem is convex only with a positive semidefinite kernel.
    """
    from sklearn.metrics.pairwise import PAIRWISE_KERNEL_FUNCTIONS

    if not isinstance(metric, str) or metric not in PAIRWISE_KERNEL_FUNCTIONS:
        raise ValueError(
            f"metric must be one of {sorted(PAIRWISE_KERNEL_FUNCTIONS)}, got {metric!r}"
        )
    if metric in INDEFINITE_METRICS:
        usable = sorted(set(PAIRWISE_KERNEL_FUNCTIONS) - set(INDEFINITE_METRICS))
        raise ValueError(f"metric {metric!r} is not a positive semidefinite kernel ({INDEFINITE_METRICS[metric]}); "
                         f"joker_ext's dual problem needs one: use one of {usable}")
    if metric in ("poly", "polynomial"):
        _check_polynomial(params)
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

    return SklearnPairwiseKernel(metric, params)
