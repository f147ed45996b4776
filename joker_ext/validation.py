"""One validation layer for every public entry point that takes tensors (JokerFalkon, JokerGP, the harness).

The scikit-learn estimators validate through scikit-learn's own ``validate_data`` (so that its checks
and messages are the ones scikit-learn users know); everything else calls these functions. Each raises
ValueError or TypeError whose message names the argument, what was expected and what came in.

Accepted and converted silently: integer, boolean and float16 arrays (to the working float dtype),
non-contiguous arrays (made contiguous), numpy arrays and memmaps (memmaps are checked in chunks and
left on disk). Refused: None, strings and object arrays, complex numbers, NaN or infinity, empty arrays,
wrong number of dimensions, mismatched lengths, a different number of features at prediction.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Tuple

import numpy as np
import torch

__all__ = ["check_features", "check_targets", "check_positive", "check_fraction", "check_same_length",
           "check_n_features"]


def _describe(x) -> str:
    if torch.is_tensor(x):
        return f"a tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    if isinstance(x, np.ndarray):
        return f"an array of shape {x.shape} and dtype {x.dtype}"
    return f"{type(x).__name__} {x!r}"[:120]


def _finite_check(X, name: str) -> None:
    if torch.is_tensor(X):
        bad = ~torch.isfinite(X)
        if bool(bad.any()):
            row = int(torch.nonzero(bad.reshape(X.shape[0], -1).any(1))[0])
            raise ValueError(f"{name} contains NaN or infinity (first in row {row}); clean or impute the data first")
        return
    step = max(1, (1 << 22) // max(1, X.shape[1] if X.ndim > 1 else 1))
    for s in range(0, X.shape[0], step):
        chunk = np.asarray(X[s : s + step])
        ok = np.isfinite(chunk)
        if not ok.all():
            row = s + int(np.nonzero(~ok.reshape(chunk.shape[0], -1).all(1))[0][0])
            raise ValueError(f"{name} contains NaN or infinity (first in row {row}); clean or impute the data first")


def _numeric(X, name: str):
    if X is None:
        raise TypeError(f"{name} must be an array or tensor of numbers, got None")
    if torch.is_tensor(X):
        if X.is_complex():
            raise TypeError(f"{name} must be real, got {_describe(X)}")
        return X
    if hasattr(X, "__array__") or isinstance(X, (list, tuple)):
        try:
            A = np.asarray(X)
        except Exception as exc:  # ragged lists and the like
            raise TypeError(f"{name} must be an array of numbers, got {type(X).__name__}") from exc
        if A.dtype.kind in "OUSV":
            raise TypeError(f"{name} must contain numbers, got {_describe(A)} (strings or objects): encode them first")
        if A.dtype.kind == "c":
            raise TypeError(f"{name} must be real, got {_describe(A)}")
        if A.dtype.kind not in "biuf":
            raise TypeError(f"{name} must contain numbers, got {_describe(A)}")
        return A
    raise TypeError(f"{name} must be a torch tensor or a numpy array, got {type(X).__name__}")


def check_features(X, name: str = "X", *, dtype: Optional[torch.dtype] = None, min_samples: int = 1,
                   keep_memmap: bool = True):
    """Validate a 2-D feature matrix; return a tensor (or the memmap itself) of a float dtype.

    ``dtype`` None keeps float32 / float64 inputs as they are and turns others into float64.
    """
    X = _numeric(X, name)
    if X.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D (n_samples, n_features), got {X.ndim}-D with shape {tuple(X.shape)}"
            + ("; reshape a single feature with X.reshape(-1, 1)" if X.ndim == 1 else "")
        )
    if X.shape[0] < min_samples or X.shape[1] == 0:
        raise ValueError(f"{name} must have at least {min_samples} row(s) and 1 column, got shape {tuple(X.shape)}")
    _finite_check(X, name)
    if isinstance(X, np.memmap) and keep_memmap and X.dtype in (np.float32, np.float64) and \
            (dtype is None or np.dtype(str(dtype).replace("torch.", "")) == X.dtype):
        return X
    if isinstance(X, np.ndarray):
        X = torch.from_numpy(np.ascontiguousarray(X))
    target = dtype or (X.dtype if X.dtype in (torch.float32, torch.float64) else torch.float64)
    if X.dtype == torch.float16 or X.dtype == torch.bfloat16:
        target = dtype or torch.float32
    X = X.to(dtype=target)
    return X if X.is_contiguous() else X.contiguous()


def check_targets(Y, n: int, name: str = "Y", *, dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, bool]:
    """Validate targets for ``n`` samples; return ``(Y as (n, T) float tensor, was_1d)``."""
    Y = _numeric(Y, name)
    if isinstance(Y, np.ndarray):
        Y = torch.from_numpy(np.ascontiguousarray(Y))
    if Y.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1-D (n,) or 2-D (n, n_targets), got shape {tuple(Y.shape)}")
    if Y.shape[0] != n:
        raise ValueError(f"{name} has {Y.shape[0]} rows but X has {n}: they must have the same number of samples")
    if Y.ndim == 2 and Y.shape[1] == 0:
        raise ValueError(f"{name} must have at least one target column, got shape {tuple(Y.shape)}")
    target = dtype or (Y.dtype if Y.dtype in (torch.float32, torch.float64) else torch.float64)
    Y = Y.to(dtype=target)
    _finite_check(Y.reshape(n, -1), name)
    was_1d = Y.ndim == 1
    return (Y.reshape(n, 1) if was_1d else Y).contiguous(), was_1d


def check_positive(name: str, value, *, allow_zero: bool = False) -> float:
    """A finite positive (or non-negative) number."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        if torch.is_tensor(value) and value.numel() == 1:
            value = float(value)
        else:
            raise TypeError(f"{name} must be a positive number, got {_describe(value)}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'non-negative' if allow_zero else 'positive'} and finite, got {value!r}")
    return v


def check_fraction(name: str, value) -> float:
    """A number strictly between 0 and 1."""
    v = check_positive(name, value)
    if not v < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return v


def check_same_length(**arrays) -> int:
    """All arrays have the same number of rows; return it."""
    lengths = {k: len(v) for k, v in arrays.items() if v is not None}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"inconsistent numbers of samples: {lengths}")
    return next(iter(lengths.values()))


def check_n_features(X, expected: int, name: str = "X") -> None:
    """At prediction: the same number of features as at fit."""
    if X.shape[1] != expected:
        raise ValueError(f"{name} has {X.shape[1]} features, but the model was fitted with {expected}")
