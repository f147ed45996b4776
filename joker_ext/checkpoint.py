"""Checkpoints: fitted models and solver states on disk, written atomically, read without pickled code.

A checkpoint is one file written by ``torch.save`` holding only tensors and plain metadata (numbers,
strings, lists, dicts), and read back with ``torch.load(weights_only=True)``, which refuses anything
else: no code is ever unpickled. Files are written to a temporary file in the same folder, flushed to
disk and renamed over the target (``os.replace``), so a crash leaves either the old file or the new one,
never half of one.

Two kinds:

* ``kind='solver'``: an engine's state during a fit (dual variables, operator state with the intercept, and for
  DBCD-TR the trust-region radii, iteration count and the block generator's state; for the intercept search of
  :mod:`joker_ext.intercept` its root search, best round and history under ``'search'``). Resuming DBCD-TR or
  the intercept search continues the fit bitwise as if it had not stopped (same seed, same data, CPU), and so
  does feature Newton with a kinked loss stopped during its interior start (the start, deterministic, runs again).
  The second-order engines otherwise go on from the saved iterate (feature Newton also from its continuation's
  smoothing level and centre, kept in one process's checkpoints; active sets, preconditioners and factorizations
  are rebuilt), so they end at the same tolerance, not bitwise at the same point.
* ``kind='estimator'``: a fitted :class:`~joker_ext.JokerRegressor` / :class:`~joker_ext.JokerClassifier`
  (its parameters, kernel description, feature-map seed, dual coefficients and training inputs).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np
import torch

__all__ = ["atomic_save", "load_checkpoint", "save_solver_state", "load_solver_state", "save_estimator",
           "load_estimator", "register_estimator", "SolverCheckpointer"]

FORMAT_VERSION = 1
PathLike = Union[str, os.PathLike]

#: The estimator classes :func:`load_estimator` rebuilds, by class name. :mod:`joker_ext.estimators` registers
#: its classes here (this module sits below the estimators and the solver driver, and imports neither).
_ESTIMATOR_CLASSES: Dict[str, type] = {}


def register_estimator(cls: type) -> type:
    """Class decorator: let :func:`load_estimator` rebuild estimators of class ``cls`` (found by its name)."""
    _ESTIMATOR_CLASSES[cls.__name__] = cls
    return cls


def atomic_save(obj: Dict[str, Any], path: PathLike) -> Path:
    """Write ``obj`` (tensors and plain data only) to ``path`` atomically; return the path."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def load_checkpoint(path: PathLike, kind: Optional[str] = None) -> Dict[str, Any]:
    """Read a checkpoint (tensors and plain data only; ``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {str(path)!r} does not exist")
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(obj, dict) or obj.get("format") != "joker_ext":
        raise ValueError(f"{str(path)!r} is not a joker_ext checkpoint")
    if kind is not None and obj.get("kind") != kind:
        raise ValueError(f"{str(path)!r} holds a {obj.get('kind')!r} checkpoint, expected {kind!r}")
    return obj


def _cpu(x):
    if torch.is_tensor(x):
        return x.detach().to("cpu").clone()
    if isinstance(x, dict):
        return {k: _cpu(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_cpu(v) for v in x]
    return x


def save_solver_state(path: PathLike, info: Dict[str, Any], meta: Optional[dict] = None) -> Path:
    """Save the solver state from a callback ``info`` dict (alpha, state, radius, iteration, rng_state, and the
    intercept search's own state under ``'search'`` when it wrote it)."""
    obj = {
        "format": "joker_ext",
        "version": FORMAT_VERSION,
        "kind": "solver",
        "alpha": _cpu(info["alpha"]),
        "state": _cpu(info["state"]),
        "radius": _cpu(info["radius"]),
        "iteration": int(info["iteration"]),
        "rng_state": _cpu(info["rng_state"]),
        "meta": json.dumps(meta or {}),
    }
    if "search" in info:
        obj["search"] = _cpu(info["search"])
    return atomic_save(obj, path)


def load_solver_state(path: PathLike) -> Dict[str, Any]:
    """Read a solver checkpoint as the ``resume`` dict that :func:`joker_ext.model.fit_dual` takes."""
    obj = load_checkpoint(path, kind="solver")
    obj["meta"] = json.loads(obj.get("meta", "{}"))
    return obj


class SolverCheckpointer:
    """A solver callback that writes a checkpoint every ``every`` iterations (chained to ``callback``); the
    intercept search, whose rounds do not end at multiples of ``every``, calls :meth:`save` itself."""

    def __init__(self, path: PathLike, every: int, meta: Optional[dict] = None, callback=None):
        if isinstance(every, bool) or int(every) != every or every < 1:
            raise ValueError(f"checkpoint_every must be a positive integer, got {every!r}")
        self.path = Path(path)
        self.every = int(every)
        self.meta = meta or {}
        self.callback = callback
        self.saved = 0

    def __call__(self, info: Dict[str, Any]):
        if info["iteration"] % self.every == 0:
            self.save(info)
        if self.callback is not None:
            return self.callback(info)
        return None

    def save(self, info: Dict[str, Any]) -> Path:
        """Write ``info`` now (:func:`save_solver_state`)."""
        path = save_solver_state(self.path, info, self.meta)
        self.saved += 1
        return path


# ---------------------------------------------------------------------------- estimators
def _plain_params(params: dict) -> dict:
    out = {}
    for k, v in params.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(e, (int, float)) for e in v):
            out[k] = list(v)
        elif isinstance(v, np.ndarray) and v.dtype.kind == "f":
            out[k] = v.tolist()
        elif isinstance(v, dict) and all(isinstance(e, (int, float)) for e in v.values()):
            out[k] = {str(a): b for a, b in v.items()}
        elif isinstance(v, torch.dtype):
            out[k] = str(v).replace("torch.", "")
        elif isinstance(v, torch.device):
            out[k] = str(v)
        else:
            raise TypeError(
                f"parameter {k}={v!r} cannot be stored in a checkpoint (only numbers, strings and arrays); "
                "use pickle for estimators built from other libraries' objects"
            )
    return out


def save_estimator(estimator, path: PathLike) -> Path:
    """Save a fitted JokerRegressor / JokerClassifier (tensors and plain metadata only, atomic).

    The fitted kernel is stored as its :meth:`~joker_ext.kernels.Kernel.describe` (family and bandwidths; class
    names and hyperparameters for scikit-learn's kernel objects), so an estimator whose ``kernel`` is a kernel
    object of scikit-learn, GPyTorch or Falkon is saved too. Such an object is stored as its joker_ext
    translation (``kernel_``): the loaded estimator's ``kernel`` parameter is that translation, which predicts
    and refits the same. A kernel that is code (a ``CallableKernel`` over a function, GPyTorch's or Falkon's
    kernels without a spectral description) cannot be described: TypeError, pickle the estimator instead.
    """
    from .kernels import kernel_from_description

    if not hasattr(estimator, "dual_coef_"):
        raise ValueError(f"estimator {type(estimator).__name__} is not fitted; call fit before saving it")
    kernel_desc = estimator.kernel_.describe()
    kernel_from_description(kernel_desc)  # TypeError now, at save, for a kernel no description can hold
    params = estimator.get_params(deep=False)  # a kernel object's own parameters are in its description
    kernel_param = params.pop("kernel")
    meta = {
        "class": type(estimator).__name__,
        "params": _plain_params(params),
        # the kernel parameter: a family name as it is, a kernel object as the fitted kernel's description
        "kernel_param": kernel_param if isinstance(kernel_param, str) else None,
        "kernel": kernel_desc,
        "y_1d": bool(getattr(estimator, "_y_1d", True)),
        "n_features_in": int(estimator.n_features_in_),
        # (``_one_vs_one_fit``: whether a classifier's columns are pairs of classes, as fitted)
        "fit": {k: getattr(estimator, k) for k in ("n_iter_", "status_", "primal_objective_", "dual_objective_",
                                                    "duality_gap_", "relative_gap_", "block_size_", "solver_",
                                                    "_one_vs_one_fit")
                if hasattr(estimator, k)},
    }
    tensors = {
        "dual_coef": torch.as_tensor(estimator.dual_coef_),
        "X_fit": torch.as_tensor(estimator.X_fit_),
    }
    if estimator.coef_ is not None:
        tensors["coef"] = torch.as_tensor(estimator.coef_)
    if hasattr(estimator, "classes_"):
        classes = estimator.classes_
        if classes.dtype.kind in "iuf":
            tensors["classes"] = torch.as_tensor(classes)
        else:
            meta["classes"] = [str(c) for c in classes]
    if getattr(estimator, "calibration_scale_", None) is not None:
        meta["calibration_scale"] = float(estimator.calibration_scale_)
    if getattr(estimator, "intercept_", None) is not None:
        tensors["intercept"] = torch.as_tensor(np.atleast_1d(np.asarray(estimator.intercept_, dtype=np.float64)))
    obj = {"format": "joker_ext", "version": FORMAT_VERSION, "kind": "estimator", "meta": json.dumps(meta),
           **tensors}
    return atomic_save(obj, path)


def load_estimator(path: PathLike):
    """Rebuild an estimator saved by :func:`save_estimator`; it predicts exactly as the saved one."""
    from .data import resolve_dtype
    from .kernels import kernel_from_description

    obj = load_checkpoint(path, kind="estimator")
    meta = json.loads(obj["meta"])
    cls = _ESTIMATOR_CLASSES.get(meta["class"])
    if cls is None:
        raise ValueError(f"unknown estimator class {meta['class']!r} in {str(path)!r}")
    kd = meta["kernel"]
    if "type" not in kd:  # written before descriptions carried their type: always a stationary kernel
        kd = {"type": "stationary", **kd}
    kernel = kernel_from_description(kd)
    params = dict(meta["params"])
    if "kernel" not in params:
        params["kernel"] = meta["kernel_param"] if meta.get("kernel_param") is not None else kernel
    est = cls(**params)
    est.X_fit_ = obj["X_fit"].numpy()
    # the fit plan of the saved parameters: kernel_, sigma_, gamma_, feature_map_, loss_, dtype_, device_ as at fit
    # (a float32 fit whose random features were solved in float64 kept its rows in float64)
    mixed = est.n_features is not None and est.X_fit_.dtype == np.float64 and resolve_dtype(est.dtype) != torch.float64
    est._set_fitted_plan(est._fit_plan(kernel, est._loss_object(), max(1, est.X_fit_.shape[0]), mixed=mixed))
    est.dual_coef_ = obj["dual_coef"].numpy()
    est.coef_ = obj["coef"].numpy() if "coef" in obj else None
    est.n_features_in_ = meta["n_features_in"]
    est._y_1d = meta["y_1d"]
    for k, v in meta["fit"].items():
        setattr(est, k, v)
    if "classes" in obj:
        est.classes_ = obj["classes"].numpy()
    elif "classes" in meta:
        est.classes_ = np.asarray(meta["classes"])
    est.calibration_scale_ = meta.get("calibration_scale")
    if "intercept" in obj:
        est.intercept_ = est._format_intercept(obj["intercept"].numpy())
    else:
        est.intercept_ = None
    est._model_cache = None
    est._model_cache = est._model()
    return est
