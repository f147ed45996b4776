"""Shared argument checks and tensor conversions of the seed-paper solvers.

The checks are joker_ext's one validation layer (:mod:`joker_ext.validation`, re-exported here: ``check_choice``,
``check_number``, ``check_positive``, ``check_positive_int``, ``check_dtype``, ``check_device``), all called
``check_*(name, value, ...)`` for parameters; the few below add the solvers' own spellings. Every check raises
``TypeError`` (wrong kind of object) or ``ValueError`` (right kind, bad value) with a message naming the
argument, what was expected and what came in.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from joker_ext.dense import cholesky_solve  # noqa: F401  (re-exported for the solvers)
from joker_ext.kernels import Kernel
from joker_ext.validation import (  # noqa: F401  (re-exported for the solvers)
    check_choice,
    check_device,
    check_dtype,
    check_number,
    check_positive,
    check_positive_int,
    invalid,
)

ArrayLike = Union[np.ndarray, torch.Tensor, Sequence]


def _desc(value: Any) -> str:
    """Short description of a value for error messages."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def check_kernel(kernel: Any, name: str = "kernel") -> Kernel:
    """Return ``kernel`` if it is a joker_ext kernel object, else raise TypeError."""
    if not isinstance(kernel, Kernel):
        raise invalid(name, "a joker_ext kernel object (e.g. joker_ext.kernels.GaussianKernel(sigma))", kernel,
                      type_error=True)
    return kernel


def make_generator(seed: Any, name: str = "seed") -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed`` (an int)."""
    return torch.Generator().manual_seed(check_positive_int(name, seed, low=0))


def _tensor(value: Any, name: str, numeric: str, shape: str) -> torch.Tensor:
    """``value`` (a tensor, an array or nested lists of numbers) as a tensor, or TypeError naming ``name``."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (np.ndarray, list, tuple)):
        try:
            return torch.as_tensor(np.asarray(value, dtype=np.float64))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be a numeric {numeric}, got {_desc(value)}") from exc
    raise TypeError(f"{name} must be a numpy array or torch tensor of shape {shape}, got {_desc(value)}")


def as_matrix(X: Any, name: str, *, dtype: torch.dtype, device: torch.device,
              n_features: Optional[int] = None) -> torch.Tensor:
    """Convert ``X`` to a finite 2-D tensor (n, d) of ``dtype`` on ``device``."""
    T = _tensor(X, name, "2-D array or tensor", "(n, d)")
    if not (T.is_floating_point() or T.dtype in (torch.int32, torch.int64, torch.int16, torch.uint8)):
        raise TypeError(f"{name} must hold real numbers, got {_desc(X)}")
    if T.dim() != 2:
        raise ValueError(f"{name} must be 2-D with shape (n, d), got shape {tuple(T.shape)}")
    if T.shape[0] < 1 or T.shape[1] < 1:
        raise ValueError(f"{name} must have at least one row and one column, got shape {tuple(T.shape)}")
    if n_features is not None and T.shape[1] != n_features:
        raise ValueError(f"{name} must have {n_features} columns (as the training data), got {T.shape[1]}")
    T = T.to(device=device, dtype=dtype)
    if not torch.isfinite(T).all():
        raise ValueError(f"{name} must be finite, got NaN or infinite entries")
    return T


def as_targets(y: Any, n: int, *, dtype: torch.dtype, device: torch.device, name: str = "y") -> Tuple[torch.Tensor, bool]:
    """Targets as an (n, t) tensor; the flag says whether ``y`` was 1-D."""
    T = _tensor(y, name, "1-D or 2-D array", "(n,) or (n, t)")
    if T.dim() not in (1, 2):
        raise ValueError(f"{name} must be 1-D (n,) or 2-D (n, t), got shape {tuple(T.shape)}")
    if T.shape[0] != n:
        raise ValueError(f"{name} must have {n} rows (one per row of X), got {T.shape[0]}")
    one_d = T.dim() == 1
    T = T.to(device=device, dtype=dtype)
    if one_d:
        T = T.unsqueeze(1)
    if T.shape[1] < 1:
        raise ValueError(f"{name} must have at least one column, got shape {tuple(T.shape)}")
    if not torch.isfinite(T).all():
        raise ValueError(f"{name} must be finite, got NaN or infinite entries")
    return T, one_d


def binary_labels(y: Any, n: int, *, dtype: torch.dtype, device: torch.device, name: str = "y"
                  ) -> Tuple[torch.Tensor, np.ndarray]:
    """Map two-class labels to -1/+1 (the larger label is +1); returns (signs (n,), classes (2,))."""
    arr = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else y
    if not isinstance(arr, (np.ndarray, list, tuple)):
        raise TypeError(f"{name} must be a 1-D array or tensor of two-class labels, got {_desc(y)}")
    arr = np.asarray(arr)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (n,) with two classes, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"{name} must have {n} entries (one per row of X), got {arr.shape[0]}")
    classes = np.unique(arr)
    if classes.shape[0] != 2:
        raise ValueError(f"{name} must contain exactly two classes, got {classes.shape[0]} distinct values")
    signs = np.where(arr == classes[1], 1.0, -1.0)
    return torch.as_tensor(signs, dtype=dtype, device=device), classes


def output_like(T: torch.Tensor, like: Any, squeeze: bool) -> Union[np.ndarray, torch.Tensor]:
    """Return ``T`` as a numpy array when ``like`` is not a tensor, else as a tensor; squeeze a 1-column result."""
    if squeeze and T.dim() == 2 and T.shape[1] == 1:
        T = T[:, 0]
    if isinstance(like, torch.Tensor):
        return T
    return T.detach().cpu().numpy()


def check_fitted(obj: Any, attr: str) -> None:
    """Raise a RuntimeError when the estimator has not been fitted."""
    if getattr(obj, attr, None) is None:
        raise RuntimeError(f"{type(obj).__name__} is not fitted yet: call fit(X, y) first")


def check_callback(callback: Any) -> Optional[Callable[[Dict[str, Any]], Any]]:
    """``callback`` must be None or callable (it receives a dict of progress information)."""
    if callback is not None and not callable(callback):
        raise invalid("callback", "a callable taking a dict, or None", callback, type_error=True)
    return callback


def scorer(kernel: Kernel, points: torch.Tensor, coef: torch.Tensor, dtype: torch.dtype, device: torch.device,
           squeeze: bool, offset: float = 0.0) -> Callable[[Any], Any]:
    """A function ``X -> K(X, points) coef + offset`` on a snapshot of ``coef`` (for progress callbacks)."""
    snap = coef.detach().clone()

    def predict(X: Any):
        Xt = as_matrix(X, "X", dtype=dtype, device=device, n_features=points.shape[1])
        return output_like(kernel.mmv(Xt, points, snap) + offset, X, squeeze)

    return predict


class Stopwatch:
    """Fit time of a solver without the time spent in its progress callbacks (which a harness evaluates off
    its own clock), for the ``max_time`` stopping rule.

    ``elapsed()`` is the seconds since construction minus those spent inside :meth:`call`;
    ``call(callback, info)`` calls the callback (if any) off the clock.
    """

    def __init__(self, max_time: Optional[float] = None):
        self.max_time = max_time
        self._t0 = time.perf_counter()
        self._outside = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0 - self._outside

    def expired(self) -> bool:
        """True when a time budget is set and the fit has used it up."""
        return self.max_time is not None and self.elapsed() >= self.max_time

    def call(self, callback: Optional[Callable[[Dict[str, Any]], Any]], info: Dict[str, Any]) -> None:
        if callback is None:
            return
        t = time.perf_counter()
        try:
            callback(info)
        finally:
            self._outside += time.perf_counter() - t


def check_max_time(value: Any) -> Optional[float]:
    """``max_time``: None (no time budget) or a number of seconds > 0."""
    return check_positive("max_time", value, allow_none=True)


class LazyValue:
    """A number computed on first call only (a progress quantity such as a residual, which a caller that
    times the fit evaluates off its clock). ``done`` says whether it was computed, ``value`` holds it."""

    def __init__(self, fn: Callable[[], float]):
        self._fn = fn
        self.done = False
        self.value = math.nan

    def __call__(self) -> float:
        if not self.done:
            self.value = float(self._fn())
            self.done = True
        return self.value


#: Rows on which a progress callback's residual is estimated (the exact one costs a pass over all n^2 entries).
RESIDUAL_ROWS = 2000


def residual_rows(n: int, seed: int) -> Optional[torch.Tensor]:
    """A fixed random subset of ``RESIDUAL_ROWS`` of the n training rows (None when n is not larger): the
    rows on which a solver estimates, for its progress callback, ``||(K + r I) a - y|| / ||y||`` (cost
    ``RESIDUAL_ROWS * n`` kernel entries instead of ``n^2``). Drawn from its own generator, so that the
    solver's random stream does not depend on whether a callback is given."""
    if n <= RESIDUAL_ROWS:
        return None
    g = torch.Generator().manual_seed(int(seed) + 7919)
    return torch.randperm(n, generator=g)[:RESIDUAL_ROWS].sort().values


def relative_residual(kernel: Kernel, X: torch.Tensor, a: torch.Tensor, Y: torch.Tensor, ridge: float,
                      rows: Optional[torch.Tensor] = None) -> float:
    """``||(K(X, X) + ridge I) a - Y|| / ||Y||``, or the same restricted to ``rows`` (an estimate)."""
    if rows is None:
        r = kernel.mmv(X, X, a) + ridge * a - Y
        return float(r.norm() / Y.norm().clamp_min(1e-300))
    rows = rows.to(X.device)
    r = kernel.mmv(X[rows], X, a) + ridge * a[rows] - Y[rows]
    return float(r.norm() / Y[rows].norm().clamp_min(1e-300))
