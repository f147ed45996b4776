"""One validation layer for every public entry point that is not a scikit-learn estimator: JokerFalkon and
JokerLogisticFalkon (:mod:`joker_ext.adapters.falkon`), JokerGP (:mod:`joker_ext.adapters.gpytorch`) and the
comparison harness (:mod:`joker_ext.comparisons.spec`, :mod:`joker_ext.comparisons.runner`).

The scikit-learn estimators validate through scikit-learn's own ``validate_data`` (so that its checks
and messages are the ones scikit-learn users know); everything else calls these functions. Each raises
ValueError or TypeError (ImportError for a missing optional package) whose message names the argument,
what was expected and what came in, in the form ``"<argument> must be <expected>, got <what came in>"``.

Data
    Accepted and converted silently: integer, boolean and float16 arrays (to the working float dtype;
    ``float_only=True`` refuses them, as Falkon does), non-contiguous arrays (made contiguous), numpy
    arrays and memmaps (memmaps are checked in chunks and left on disk). Refused: None, strings and
    object arrays, complex numbers, sparse matrices, NaN or infinity, values so large that squared
    distances overflow the working dtype, empty arrays, wrong number of dimensions, mismatched lengths,
    a different number of features at prediction. Classification labels (:func:`check_labels`): values
    other than -1/+1 (or 0/1 where accepted) and a single class are refused.
Parameters
    :func:`check_positive`, :func:`check_number`, :func:`check_fraction`, :func:`check_positive_int`,
    :func:`check_choice`, :func:`check_callable`, :func:`check_bool`; losses and their parameters
    (:func:`check_loss`, :func:`check_loss_params`), dtypes (:func:`check_dtype`), devices
    (:func:`check_device`), sample weights (:func:`check_sample_weights`).
Optional packages
    :func:`require_package` imports one or raises ImportError naming it and how to install it.
"""
from __future__ import annotations

import importlib
import math
import numbers
from typing import Callable, Iterable, Optional, Sequence, Tuple, Union

import numpy as np
import torch

__all__ = [
    "check_features",
    "check_targets",
    "check_magnitude",
    "check_labels",
    "check_positive",
    "check_number",
    "check_fraction",
    "check_positive_int",
    "check_choice",
    "check_callable",
    "check_bool",
    "check_loss",
    "check_loss_params",
    "check_dtype",
    "check_device",
    "check_sample_weights",
    "check_dtype_range",
    "check_fit_finite",
    "check_predictions",
    "check_same_length",
    "check_n_features",
    "require_package",
    "invalid",
]


def invalid(name: str, expected: str, got, *, type_error: bool = False) -> Exception:
    """The exception every check raises: ``"<name> must be <expected>, got <got>"`` (ValueError, or TypeError
    with ``type_error``). Returned, not raised: ``raise invalid("M", "a positive integer", M)``."""
    if type_error:
        return TypeError(f"{name} must be {expected}, got {got!r} ({type(got).__name__})")
    return ValueError(f"{name} must be {expected}, got {got!r}")


def _describe(x) -> str:
    if torch.is_tensor(x):
        return f"a tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    if isinstance(x, np.ndarray):
        return f"an array of shape {x.shape} and dtype {x.dtype}"
    return f"{type(x).__name__} {x!r}"[:120]


# ============================================================================ arrays
def _finite_check(X, name: str) -> None:
    if torch.is_tensor(X):
        bad = ~torch.isfinite(X)
        if bool(bad.any()):
            row = int(torch.nonzero(bad.reshape(X.shape[0], -1).any(1))[0])
            raise ValueError(f"{name} must be finite, got NaN or infinity (first in row {row}); clean or impute "
                             "the data first")
        return
    step = max(1, (1 << 22) // max(1, X.shape[1] if X.ndim > 1 else 1))
    for s in range(0, X.shape[0], step):
        chunk = np.asarray(X[s : s + step])
        ok = np.isfinite(chunk)
        if not ok.all():
            row = s + int(np.nonzero(~ok.reshape(chunk.shape[0], -1).all(1))[0][0])
            raise ValueError(f"{name} must be finite, got NaN or infinity (first in row {row}); clean or impute "
                             "the data first")


def _numeric(X, name: str):
    if X is None:
        raise TypeError(f"{name} must be an array or tensor of numbers, got None")
    if torch.is_tensor(X):
        if X.layout != torch.strided:
            raise TypeError(f"{name} must be a dense tensor, got a tensor with layout {X.layout} (sparse inputs are "
                            "not supported): call .to_dense() first")
        if X.is_complex():
            raise TypeError(f"{name} must be real, got {_describe(X)}")
        return X
    if hasattr(X, "tocsr") or hasattr(X, "todense"):  # scipy.sparse
        raise TypeError(f"{name} must be a dense array or tensor, got a sparse {type(X).__name__}: call .toarray() "
                        "first")
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
                   keep_memmap: bool = True, allow_1d: bool = False, float_only: bool = False,
                   reason: str = "") -> Union[torch.Tensor, np.memmap]:
    """Validate a 2-D feature matrix; return a tensor (or the memmap itself) of a float dtype.

    Parameters
    ----------
    X : tensor, ndarray, memmap or nested list
    name : str
        The argument's name in messages.
    dtype : torch.dtype, optional
        Convert to this dtype. None keeps float32 / float64 inputs as they are (no copy) and turns others
        into float64 (float16 / bfloat16 into float32).
    min_samples : int
        Fewest rows accepted.
    keep_memmap : bool
        Return a float memmap unchanged (checked in chunks, left on disk).
    allow_1d : bool
        Read a 1-D array as one feature, shape (n, 1) (GPyTorch's convention).
    float_only : bool
        Refuse non-float32/64 inputs with TypeError instead of converting them (``reason`` is appended to
        the message, e.g. "(as Falkon requires)").
    """
    X = _numeric(X, name)
    if allow_1d and X.ndim == 1:
        X = X.reshape(-1, 1)
    if X.ndim != 2:
        if allow_1d:
            raise ValueError(f"{name} must have shape (n, d) or (n,), got shape {tuple(X.shape)}")
        raise ValueError(
            f"{name} must be 2-D (n_samples, n_features), got {X.ndim}-D with shape {tuple(X.shape)}"
            + ("; reshape a single feature with X.reshape(-1, 1)" if X.ndim == 1 else "")
        )
    if X.shape[0] < min_samples or X.shape[1] == 0:
        raise ValueError(f"{name} must have at least {min_samples} row(s) and 1 column, got shape {tuple(X.shape)}")
    if float_only:
        kind_ok = X.dtype in (torch.float32, torch.float64) if torch.is_tensor(X) else \
            X.dtype in (np.float32, np.float64)
        if not kind_ok:
            raise TypeError(f"{name} must be a float32 or float64 tensor{(' ' + reason) if reason else ''}, "
                            f"got {X.dtype}")
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


def check_magnitude(X, name: str = "X", *, dtype: torch.dtype = torch.float64, d: Optional[int] = None) -> None:
    """Values small enough for kernel computations in ``dtype``: squared distances and inner products of
    rows (``d`` columns) must not overflow, i.e. ``max |x| < sqrt(finfo(dtype).max / (4 d))``."""
    if X is None:
        return
    d = int(d if d is not None else (X.shape[1] if X.ndim > 1 else 1))
    limit = math.sqrt(torch.finfo(dtype).max / (4.0 * max(1, d)))
    if torch.is_tensor(X):
        if X.numel() == 0:
            big = 0.0
        else:  # no |X| copy: the extremes
            lo, hi = torch.aminmax(X.detach()) if X.is_floating_point() else (X.min(), X.max())
            big = max(abs(float(lo)), abs(float(hi)))
    else:
        big = 0.0
        step = max(1, (1 << 22) // max(1, d))
        for s in range(0, X.shape[0], step):
            chunk = np.asarray(X[s : s + step])
            if chunk.size:
                big = max(big, abs(float(chunk.min())), abs(float(chunk.max())))
    if big >= limit:
        raise ValueError(f"{name} must have values of magnitude below {limit:.3g} for {dtype} kernel computations "
                         f"(squared distances would overflow), got a value of magnitude {big:.3g}: rescale the data")


def check_targets(Y, n: int, name: str = "Y", *, dtype: Optional[torch.dtype] = None, x_name: str = "X",
                  ndim: Tuple[int, ...] = (1, 2)) -> Tuple[torch.Tensor, bool]:
    """Validate targets for ``n`` samples; return ``(Y as (n, T) float tensor, was_1d)``.

    ``ndim=(1,)`` accepts only a 1-D vector (a single-output model).
    """
    Y = _numeric(Y, name)
    if isinstance(Y, np.ndarray):
        Y = torch.from_numpy(np.ascontiguousarray(Y))
    if Y.ndim not in ndim:
        if ndim == (1,):
            raise ValueError(f"{name} must be 1-D of length n={n}, got shape {tuple(Y.shape)}")
        raise ValueError(f"{name} must be 1-D (n,) or 2-D (n, n_targets), got shape {tuple(Y.shape)}")
    if Y.shape[0] != n:
        what = "values" if Y.ndim == 1 else "rows"
        raise ValueError(f"{name} has {Y.shape[0]} {what} but {x_name} has {n} rows: {name} must have the same "
                         f"number of samples as {x_name}, got {Y.shape[0]}")
    if Y.ndim == 2 and Y.shape[1] == 0:
        raise ValueError(f"{name} must have at least one target column, got shape {tuple(Y.shape)}")
    target = dtype or (Y.dtype if Y.dtype in (torch.float32, torch.float64) else torch.float64)
    _finite_check(Y.reshape(n, -1), name)
    Y = Y.to(dtype=target)
    _finite_check(Y.reshape(n, -1), f"{name} (in {target})")
    was_1d = Y.ndim == 1
    return (Y.reshape(n, 1) if was_1d else Y).contiguous(), was_1d


_LABEL_SETS = {"pm1": "{-1, +1}", "01": "{0, 1}"}


def check_labels(Y: torch.Tensor, name: str = "Y", *, context: str, allowed: Sequence[str] = ("pm1", "01"),
                 one_hot_note: bool = False) -> torch.Tensor:
    """Class labels for a margin loss: return ``Y`` with values in {-1, +1}.

    ``Y`` is an (n, T) float tensor (from :func:`check_targets`). ``allowed`` lists the accepted label sets,
    in order of preference: ``'pm1'`` (-1/+1, returned as they are) and ``'01'`` (0/1, mapped to -1/+1).
    Refused with ValueError: continuous values or any other labels, and a single class (every column
    constant: nothing to separate).
    """
    sets = " or ".join(_LABEL_SETS[a] for a in allowed)
    note = ", one-hot for several classes" if one_hot_note else ""
    out = None
    for a in allowed:
        if a == "pm1" and bool(((Y == 1) | (Y == -1)).all()):
            out = Y
            break
        if a == "01" and bool(((Y == 0) | (Y == 1)).all()):
            out = 2.0 * Y - 1.0
            break
    if out is None:
        vals = torch.unique(Y.detach().cpu())[:6].tolist()
        raise ValueError(f"{name} must hold class labels in {sets} ({context} needs {name} in {sets}{note}), "
                         f"got values {vals}" + (" (continuous targets?)" if len(vals) > 2 else ""))
    if Y.shape[0] > 0 and bool((out == out[:1]).all()):
        vals = torch.unique(Y.detach().cpu()).tolist()
        raise ValueError(f"{name} must contain at least two classes ({context} has nothing to separate), got only "
                         f"the label {vals[0] if len(vals) == 1 else vals} in all {Y.shape[0]} samples")
    return out


# ============================================================================ scalar parameters
def _real(name: str, value, expected: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        if torch.is_tensor(value) and value.numel() == 1 and not value.is_complex():
            return float(value)
        if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iuf":
            return float(value)
        raise TypeError(f"{name} must be {expected}, got {_describe(value)}")
    return float(value)


def check_positive(name: str, value, *, allow_zero: bool = False, allow_none: bool = False) -> Optional[float]:
    """A finite positive (or non-negative) number."""
    if value is None and allow_none:
        return None
    v = _real(name, value, "a positive number" + (" or None" if allow_none else ""))
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'non-negative' if allow_zero else 'positive'} and finite, got {value!r}")
    return v


def check_number(name: str, value, *, low: float = -math.inf, high: float = math.inf, low_open: bool = False,
                 high_open: bool = False, allow_none: bool = False) -> Optional[float]:
    """A finite number in an interval (``low_open`` / ``high_open`` exclude the ends)."""
    if value is None and allow_none:
        return None
    interval = _interval(low, high, low_open, high_open)
    v = _real(name, value, f"a number {interval}".rstrip() + (" or None" if allow_none else ""))
    ok = math.isfinite(v) and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    if not ok:
        raise ValueError(f"{name} must be a finite number {interval}".rstrip() + f", got {value!r}")
    return v


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    """``'> 0'``, ``'<= 1'``, ``'in [0, 1)'`` or ``''`` (no bound): the allowed range in words."""
    if math.isinf(low) and math.isinf(high):
        return ""
    if math.isinf(high):
        return f"{'>' if low_open else '>='} {low:g}"
    if math.isinf(low):
        return f"{'<' if high_open else '<='} {high:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def check_fraction(name: str, value) -> float:
    """A number strictly between 0 and 1."""
    v = _real(name, value, "a number in (0, 1)")
    if not (math.isfinite(v) and 0 < v < 1):
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return v


def check_positive_int(name: str, value, *, low: int = 1, high: Optional[int] = None, allow_none: bool = False,
                       allow_integral_float: bool = False) -> Optional[int]:
    """An integer in ``[low, high]`` (``high=None``: no upper bound). Another kind of object (a bool, 2.5, a
    string) is a TypeError. ``allow_integral_float`` (numbers read from TOML) makes floats a kind of number
    accepted: 3.0 is taken as 3, and 2.5 is then a bad value (ValueError)."""
    if value is None and allow_none:
        return None
    if high is not None:
        expected = f"an integer in [{low}, {high}]"
    else:
        expected = "a positive integer (>= 1)" if low == 1 else f"an integer >= {low}"
    expected += " or None" if allow_none else ""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        if not (allow_integral_float and isinstance(value, (float, np.floating))):
            raise TypeError(f"{name} must be {expected}, got {_describe(value)}")
        if not (math.isfinite(value) and float(value).is_integer()):
            raise ValueError(f"{name} must be {expected}, got {value!r}")
        value = int(value)
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def check_choice(name: str, value, choices: Iterable, *, allow_none: bool = False):
    """One of ``choices`` (compared with ``==``; strings are not lower-cased)."""
    choices = tuple(choices)
    if value is None and allow_none:
        return None
    ok = not isinstance(value, (np.ndarray, torch.Tensor)) and any(
        isinstance(value, type(c)) and isinstance(value, bool) == isinstance(c, bool) and value == c
        for c in choices)
    if not ok:
        raise ValueError(f"{name} must be one of {choices}{' or None' if allow_none else ''}, got {value!r}")
    return value


def check_callable(name: str, value, *, allow_none: bool = True) -> Optional[Callable]:
    if value is None and allow_none:
        return None
    if not callable(value):
        raise TypeError(f"{name} must be callable{' or None' if allow_none else ''}, got {_describe(value)}")
    return value


def check_bool(name: str, value) -> bool:
    """``True`` or ``False`` (numpy's ``bool_`` too); anything else, 0 and 1 and strings included, is a TypeError."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {_describe(value)}")


# ============================================================================ losses, dtypes, devices
def check_loss_params(*, delta=None, epsilon=None, quantile=None) -> dict:
    """The parameters of the robust losses, each checked when given (None = not given):
    ``delta`` (Huber) > 0, ``epsilon`` (epsilon-insensitive) >= 0, ``quantile`` (pinball) in (0, 1)."""
    out = {}
    if delta is not None:
        out["delta"] = check_positive("delta", delta)
    if epsilon is not None:
        out["epsilon"] = check_positive("epsilon", epsilon, allow_zero=True)
    if quantile is not None:
        out["quantile"] = check_fraction("quantile", quantile)
    return out


def check_loss(loss, *, name: str = "loss", delta=None, epsilon=None, quantile=None):
    """A :class:`joker_ext.losses.Loss` from a registered name or a Loss object.

    The loss parameters given are checked whatever the loss (:func:`check_loss_params`), so that a typo
    such as ``quantile=1.5`` is never silently ignored.
    """
    from joker_ext.losses import Loss, available_losses, get_loss

    params = check_loss_params(delta=delta, epsilon=epsilon, quantile=quantile)
    if isinstance(loss, Loss):
        return loss
    if not isinstance(loss, str):
        raise TypeError(f"{name} must be a registered loss name {tuple(available_losses())} or a joker_ext Loss, "
                        f"got {_describe(loss)}")
    if loss not in available_losses():
        raise ValueError(f"{name} must be one of {tuple(available_losses())} or a joker_ext Loss, got unknown loss "
                         f"{loss!r}")
    return get_loss(loss, **params)


_DTYPE_NAMES = {"float32": torch.float32, "float64": torch.float64, "single": torch.float32, "double": torch.float64}


def check_dtype(value, name: str = "dtype", *, default: torch.dtype = torch.float64) -> torch.dtype:
    """'float32' / 'float64' (or 'single' / 'double'), a torch or numpy float32 / float64 dtype; None gives
    ``default``. float16 and integer dtypes are refused (the solver's trust-region steps need at least
    single precision)."""
    if value is None:
        return default
    if isinstance(value, str):
        if value in _DTYPE_NAMES:
            return _DTYPE_NAMES[value]
    elif isinstance(value, torch.dtype):
        if value in (torch.float32, torch.float64):
            return value
    else:
        try:
            npd = np.dtype(value)
        except TypeError:
            npd = None
        if npd is not None and npd in (np.float32, np.float64):
            return torch.float32 if npd == np.float32 else torch.float64
    raise ValueError(f"{name} must be 'float32', 'float64' or a torch float32 / float64 dtype, got {value!r}")


def check_device(value, name: str = "device", *, allow_none: bool = True,
                 require_available: bool = True) -> Optional[torch.device]:
    """A torch device ('cpu', 'cuda', 'cuda:1', a torch.device); None when ``allow_none``. With
    ``require_available`` a CUDA or MPS device must exist on this machine."""
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{name} must be a torch device such as 'cpu' or 'cuda:0', got None")
    if not isinstance(value, (str, torch.device)):
        raise TypeError(f"{name} must be a torch device such as 'cpu' or 'cuda:0', got {_describe(value)}")
    try:
        dev = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{name} must be a torch device such as 'cpu' or 'cuda:0', got {value!r}") from None
    if require_available:
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{name} must be a device available on this machine ('cpu'; CUDA is not available), "
                             f"got {value!r}")
        if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError(f"{name} must be a device available on this machine ('cpu'; MPS is not available), "
                             f"got {value!r}")
        if dev.type not in ("cpu", "cuda", "mps"):
            raise ValueError(f"{name} must be 'cpu', 'cuda' or 'mps' (with an optional index), got {value!r}")
    return dev


def check_dtype_range(name: str, values, dtype: torch.dtype, *, scale: float = 1.0, hint: str = "") -> None:
    """Positive costs (a number or a tensor, e.g. ``c_i = C w_i``) that the solver can work with in ``dtype``.

    At least ``finfo(dtype).tiny`` (no underflow to 0) and at most ``sqrt(finfo(dtype).max) / scale``: the
    dual variables grow like ``c_i |y_i|`` and the dual objective like ``(n C max|y|)^2``, so with
    ``scale = n max(1, max|y|)`` nothing overflows. ``hint`` is appended to the message (what to change).
    """
    t = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    if t.numel() == 0:
        return
    fi = torch.finfo(dtype)
    upper = math.sqrt(fi.max) / max(1.0, float(scale))
    lo, hi = float(t.min()), float(t.max())
    if not (hi <= upper and lo >= fi.tiny):
        got = hi if not hi <= upper else lo
        raise ValueError(f"{name} must be between {fi.tiny:.3g} and {upper:.3g} in {dtype} (beyond, the dual "
                         f"objective under- or overflows), got {got:.3g}{hint}")


def check_fit_finite(name: str, got, *values, hint: str = "") -> None:
    """After a fit: coefficients and objective finite. A backstop for overflow that the range checks did not
    foresee; the message blames ``name`` (the parameter to change), with its value ``got``."""
    for v in values:
        if v is None:
            continue
        ok = bool(torch.isfinite(v).all()) if torch.is_tensor(v) else math.isfinite(float(v))
        if not ok:
            raise ValueError(f"{name} must keep the fit finite, got {got!r}: the solver overflowed (NaN or infinity "
                             f"in the coefficients or the objective){hint}")


def check_predictions(out: torch.Tensor, *, name: str = "X", dtype: Optional[torch.dtype] = None,
                      hint: str = "") -> torch.Tensor:
    """At prediction, the last guard against a silent NaN: the model's output for the input ``name`` must be
    finite, and representable in ``dtype`` (the dtype predictions are returned in). Returns ``out`` in ``dtype``."""
    if not bool(torch.isfinite(out).all()):
        raise ValueError(f"{name} must give finite predictions, got NaN or infinity from the fitted model (it "
                         f"overflowed){hint}")
    if dtype is not None and dtype != out.dtype:
        conv = out.to(dtype=dtype)
        if not bool(torch.isfinite(conv).all()):
            big = float(out.abs().max())
            raise ValueError(f"{name} must be float64 for these predictions (up to {big:.3g}, beyond the {dtype} "
                             f"range), got {dtype}")
        return conv
    return out


def check_sample_weights(w, n: int, name: str = "sample_weight") -> torch.Tensor:
    """(n,) or (n, 1) finite non-negative weights, not all zero; returned as an (n,) float64 tensor. A (n, T)
    array is accepted when its columns are equal (one weight per sample)."""
    w = _numeric(w, name)
    w = torch.from_numpy(np.ascontiguousarray(w)) if isinstance(w, np.ndarray) else w
    if w.dim() == 2 and w.shape[0] == n:
        if w.shape[1] != 1 and not bool((w == w[:, :1]).all()):
            raise ValueError(f"{name} must be one weight per sample, shape ({n},) or ({n}, 1), got different weights "
                             f"per output column, shape {tuple(w.shape)}")
        w = w[:, 0]
    if w.dim() != 1 or w.shape[0] != n:
        raise ValueError(f"{name} must be a tensor of shape ({n},) or ({n}, 1), got shape {tuple(w.shape)}")
    w = w.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        bad = w[~torch.isfinite(w) | (w < 0)][:3].tolist()
        raise ValueError(f"{name} must be finite and non-negative, got values such as {bad}")
    if not bool((w > 0).any()):
        raise ValueError(f"{name} must have at least one positive weight, got all zeros")
    return w


def check_same_length(**arrays) -> int:
    """All arrays have the same number of rows; return it."""
    lengths = {k: len(v) for k, v in arrays.items() if v is not None}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"inconsistent numbers of samples: {lengths}")
    return next(iter(lengths.values()))


def check_n_features(X, expected: int, name: str = "X") -> None:
    """At prediction: the same number of features as at fit."""
    if X.shape[1] != expected:
        raise ValueError(f"{name} has {X.shape[1]} features, but the model was fitted with {expected}: {name} must "
                         f"have {expected} columns, got {X.shape[1]}")


# ============================================================================ optional packages
def require_package(module: str, *, purpose: str, install: str):
    """Import and return ``module``; raise ImportError naming it and how to install it when it cannot be."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{purpose} needs the optional package {module.split('.')[0]!r}, which cannot be imported "
                          f"here ({exc}); install it with: {install}") from exc
