"""scikit-learn estimators: :class:`JokerRegressor` and :class:`JokerClassifier`.

Both solve ``min_f 1/2 ||f||_H^2 + C sum_i w_i l(y_i, f(x_i) [+ b])`` through its dual, with the exact kernel
(``n_features=None``) or ``n_features`` random features, by the engine ``solver`` names (``'auto'``: the
second-order engine :func:`joker_ext.engines.resolve_solver` picks for the loss and the memory budget; DBCD-TR, the
Joker paper's block method, with ``solver='dbcd_tr'`` or where no second-order engine fits). Without intercept
(the default, like KernelRidge and the Joker paper) ``f(x) = sum_i alpha_i k(x_i, x)``; with ``fit_intercept=True``
an unregularized bias ``b`` is added, as in SVC / SVR (see :class:`JokerRegressor`, ``fit_intercept``).

Conventions: ``C`` is LIBSVM's / scikit-learn SVC's C (for the squared loss, ``KernelRidge(alpha=1/C)``;
``LogisticRegression(C=C, fit_intercept=False)`` on features ``L`` with ``K = L L^T`` for the logistic
loss); ``sigma`` is the bandwidth of :mod:`joker_ext.kernels` (``gamma = 1/(2 sigma^2)`` for the
Gaussian, ``1/sigma`` for laplacian_l1); ``sigma='median'`` is the median pairwise distance of the
distinct training points (:func:`joker_ext.kernels.median_heuristic`).
"""
from __future__ import annotations

import hashlib
import numbers
import os
import warnings
from typing import Optional

import numpy as np
import torch
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._available_if import available_if
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

from .checkpoint import register_estimator
from .conversions import gamma_to_sigma, sigma_to_gamma
from .data import BlockData, resolve_device, resolve_dtype
from .defaults import CONVERGENCE_WARN_GAP, FLOAT32_INTERCEPT_MAX_COST, precision_tol
from .distributed import SingleProcess, row_shards
from .kernels import Kernel, StationaryKernel, as_kernel, make_kernel, median_heuristic
from .losses import Loss, get_loss
from .model import KernelModel
from .one_vs_one import coupled_probabilities, fit_one_vs_one, ovr_scores, vote
from .plan import FitPlan, make_fit_plan
from .validation import check_magnitude

#: What to try when a fit stops short of its tolerance, by the engine's status (the ConvergenceWarning's advice).
_STOP_ADVICE = {"max_iter": "; increase max_iter", "max_time": "; increase max_time",
                "stalled": "; the gap stopped falling there (rounding, or the engine's limit): try another solver"}

__all__ = ["JokerRegressor", "JokerClassifier"]

REGRESSION_LOSSES = ("squared", "huber", "epsilon_insensitive", "absolute", "pinball")
CLASSIFICATION_LOSSES = ("hinge", "squared_hinge", "logistic", "squared")

def _to_numpy(X):
    if torch.is_tensor(X):
        return X.detach().cpu().numpy()
    return X


def _store_params(estimator, params: dict) -> None:
    """Store the constructor's arguments on ``estimator`` as they came (scikit-learn's convention: ``__init__``
    only stores, ``fit`` validates); ``params`` is the constructor's ``locals()``."""
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(estimator, name, value)


def _fingerprint(*arrays) -> str:
    """A cheap identity of the training data (shapes, a strided sample of rows and the column sums),
    used to decide whether ``warm_start`` may reuse the previous dual variables."""
    h = hashlib.blake2b(digest_size=16)
    for A in arrays:
        A = np.ascontiguousarray(A)
        h.update(repr((A.shape, A.dtype.str)).encode())
        if A.size:
            rows = np.linspace(0, A.shape[0] - 1, min(A.shape[0], 257)).astype(np.int64)  # distinct, increasing
            h.update(A[rows].tobytes())
            h.update(np.asarray(A.sum(axis=0), dtype=np.float64).tobytes())
    return h.hexdigest()


def _encode_labels(y: np.ndarray):
    """``(classes, index)``: the sorted distinct labels and each label's position among them, as
    ``np.unique(y, return_inverse=True)`` (numeric labels by a search among the classes: six times faster at
    n = 4000)."""
    if y.dtype.kind not in "biuf":
        return np.unique(y, return_inverse=True)
    classes = np.unique(y)
    return classes, np.searchsorted(classes, y)


class _JokerBase(BaseEstimator):
    """Shared parameters and fitting logic of the two estimators."""

    _parameter_constraints: dict = {
        "loss": [str, Loss],
        "C": [Interval(numbers.Real, 0, None, closed="neither")],
        "kernel": [StrOptions({"gaussian", "laplacian", "laplacian_l1", "matern"}), object],
        "sigma": [StrOptions({"median"}), Interval(numbers.Real, 0, None, closed="neither"), "array-like", None],
        "gamma": [Interval(numbers.Real, 0, None, closed="neither"), None],
        "nu": [Interval(numbers.Real, 0, None, closed="neither")],
        "n_features": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "features": [StrOptions({"cossin", "cos", "orf"})],
        "fit_intercept": ["boolean"],
        "block_size": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "solver": [str],
        "tol": [Interval(numbers.Real, 0, None, closed="left"), None],
        "epsilon": [Interval(numbers.Real, 0, None, closed="left")],
        "delta": [Interval(numbers.Real, 0, None, closed="neither")],
        "quantile": [Interval(numbers.Real, 0, 1, closed="neither")],
        "device": [str, torch.device, None],
        "dtype": [StrOptions({"float32", "float64"}), torch.dtype, None],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
        "max_time": [Interval(numbers.Real, 0, None, closed="neither"), None],
        "max_memory": [Interval(numbers.Real, 0, None, closed="neither"), str, None],
        "checkpoint": [str, os.PathLike, None],
        "checkpoint_every": [Interval(numbers.Integral, 1, None, closed="left")],
        "distributed": ["boolean"],
    }

    _allowed_losses: tuple = ()

    # ------------------------------------------------------------------ helpers
    def _loss_object(self) -> Loss:
        if isinstance(self.loss, str) and self.loss not in self._allowed_losses:
            raise ValueError(
                f"loss must be one of {self._allowed_losses} for {type(self).__name__} "
                f"(or a Loss object), got {self.loss!r}"
            )
        return get_loss(self.loss, delta=self.delta, epsilon=self.epsilon, quantile=self.quantile)

    def _fit_plan(self, kernel: Kernel, loss: Loss, n: int, sample_weight=None,
                  mixed: Optional[bool] = None) -> FitPlan:
        """The fit plan (:func:`joker_ext.plan.make_fit_plan`) of these parameters for ``kernel`` and ``loss`` on
        ``n`` rows (over all processes), ``sample_weight`` those of this process's rows (default: ones); ``mixed``:
        whether float32 random features are solved in float64 (default: :meth:`_mixed_precision` decides)."""
        dtype = resolve_dtype(self.dtype)
        if mixed is None:
            mixed = self._mixed_precision(dtype, n, sample_weight)
        return make_fit_plan(kernel, loss, n=n, C=self.C, sample_weight=sample_weight,
                             features="exact" if self.n_features is None else self.features,
                             n_features=self.n_features, seed=self._seed(), tol=self.tol,
                             default_tol=precision_tol(dtype) if mixed else None, block_size=self.block_size,
                             max_iter=self.max_iter, max_time=self.max_time, verbose=bool(self.verbose),
                             max_memory=self.max_memory, dtype=torch.float64 if mixed else dtype,
                             compute_dtype=dtype if mixed else None,
                             device=resolve_device(self.device), solver=self.solver, intercept=self.fit_intercept,
                             distributed=bool(self.distributed))

    def _mixed_precision(self, dtype: torch.dtype, n: int, sample_weight=None) -> bool:
        """Whether a fit in ``dtype`` evaluates its random features in that dtype and solves in float64 (the feature
        Newton engine's mixed passes, as JokerFalkon's for float32 data), to ``dtype``'s tolerance: float32 random
        features with an intercept at ``C n mean(w) > FLOAT32_INTERCEPT_MAX_COST``
        (:data:`joker_ext.defaults.FLOAT32_INTERCEPT_MAX_COST`), where float32 Newton steps stalled."""
        if self.n_features is None or dtype == torch.float64 or not self.fit_intercept:
            return False
        mean_w = 1.0 if sample_weight is None or len(sample_weight) == 0 else float(np.mean(sample_weight))
        return self.C * n * mean_w > FLOAT32_INTERCEPT_MAX_COST

    def _set_fitted_plan(self, plan: FitPlan) -> None:
        """Set what follows from the fit plan (at fit and at :func:`~joker_ext.checkpoint.load_estimator`):
        ``kernel_``, ``sigma_`` (stationary kernels), ``gamma_`` (Gaussian or L1-Laplacian with one bandwidth:
        scikit-learn's ``rbf``/``laplacian`` gamma), ``feature_map_`` (with ``n_features``), ``loss_``,
        ``solver_``, ``dtype_`` and ``device_``."""
        kernel = plan.kernel
        self.kernel_ = kernel
        if isinstance(kernel, StationaryKernel):
            s = kernel.sigma
            self.sigma_ = float(s) if s.dim() == 0 or s.numel() == 1 else s.numpy().copy()
        else:
            self.sigma_ = None
        self.gamma_ = None
        if isinstance(kernel, StationaryKernel) and isinstance(self.sigma_, float) and \
                kernel.family in ("gaussian", "laplacian_l1"):
            self.gamma_ = sigma_to_gamma(self.sigma_, kernel.family)
        self.feature_map_ = plan.feature_map
        self.loss_ = plan.loss
        self.solver_ = plan.solver
        self.dtype_ = plan.dtype
        self.device_ = plan.device

    def _seed(self) -> int:
        rs = self.random_state
        if rs is None:
            return 0
        if isinstance(rs, numbers.Integral):
            return int(rs)
        return int(np.random.RandomState(rs).randint(0, 2**31 - 1)) if not isinstance(rs, np.random.RandomState) \
            else int(rs.randint(0, 2**31 - 1))

    def _check_bandwidth_params(self) -> None:
        """``gamma`` is an alias of ``sigma``: both at once is ambiguous."""
        sigma_default = self.sigma is None or (isinstance(self.sigma, str) and self.sigma == "median")
        if self.gamma is not None and not sigma_default:
            raise ValueError(
                f"sigma and gamma both set the bandwidth (gamma = 1/(2 sigma^2)); pass only one of them, "
                f"got sigma={self.sigma!r} and gamma={self.gamma!r}"
            )
        if self.gamma is not None and not isinstance(self.kernel, str):
            raise ValueError(
                f"gamma sets the bandwidth of kernel='gaussian' or 'laplacian_l1'; a kernel object carries its "
                f"own bandwidth, got gamma={self.gamma!r} with kernel={type(self.kernel).__name__}"
            )

    def _row_shards(self, X) -> SingleProcess:
        """The processes the rows are spread over (``distributed=True``), with the shards checked against
        each other before any per-rank validation can fail on one rank alone; a single process otherwise."""
        shards = row_shards(bool(self.distributed))
        if shards.distributed:
            shape = np.shape(X)
            shards.plan(shape[0] if len(shape) else 0, shape[1] if len(shape) == 2 else -1)
            if getattr(self, "probability", False):
                raise ValueError("probability=True cross-fits a calibration on one process; it cannot be used "
                                 "with distributed=True, got both")
        return shards

    def _effective_sigma(self, X: np.ndarray, shards: Optional[SingleProcess] = None):
        if self.gamma is not None:
            fam = self.kernel if isinstance(self.kernel, str) else "gaussian"
            if fam not in ("gaussian", "laplacian_l1"):
                raise ValueError(
                    f"gamma is defined for kernel='gaussian' or 'laplacian_l1', got kernel={self.kernel!r}"
                )
            return gamma_to_sigma(self.gamma, fam)
        if isinstance(self.sigma, str) or self.sigma is None:
            if shards is not None and shards.distributed:
                X = shards.sample_rows(X, 1000)  # the same rows on every rank
            if X.shape[0] < 2:
                return 1.0
            uniq = np.unique(X, axis=0) if X.shape[0] <= 20000 else X
            if uniq.shape[0] < 2:
                return 1.0
            return median_heuristic(uniq, metric="l1" if self.kernel == "laplacian_l1" else "l2", seed=0)
        sigma = np.asarray(self.sigma, dtype=np.float64)
        if sigma.ndim > 1 or (sigma.ndim == 1 and sigma.shape[0] not in (1, X.shape[1])):
            raise ValueError(
                f"sigma must be a positive number or one bandwidth per feature ({X.shape[1]}), got shape {sigma.shape}"
            )
        if not np.all(np.isfinite(sigma)) or np.any(sigma <= 0):
            raise ValueError(f"sigma must be positive and finite, got {self.sigma!r}")
        return float(sigma) if sigma.ndim == 0 else sigma

    def _build_kernel(self, X: np.ndarray, shards: Optional[SingleProcess] = None) -> Kernel:
        if isinstance(self.kernel, str):
            if self.kernel not in ("gaussian", "laplacian", "laplacian_l1", "matern"):
                raise ValueError(
                    "kernel must be one of 'gaussian', 'laplacian', 'laplacian_l1', 'matern' or a kernel object, "
                    f"got {self.kernel!r} (scikit-learn's 'rbf' is 'gaussian' with gamma = 1/(2 sigma^2), its "
                    "'laplacian' is 'laplacian_l1'; joker_ext.adapters.sklearn.pairwise_kernel translates the others)"
                )
            sigma = self._effective_sigma(X, shards)
            return make_kernel(self.kernel, sigma, nu=self.nu if self.kernel == "matern" else None)
        return as_kernel(self.kernel)  # other libraries' kernel objects: joker_ext.adapters translates them

    def _warm_start_point(self, fingerprint: str, n_targets: int):
        """``(alpha0, b0)`` of the previous fit when ``warm_start`` applies (same data), else Nones."""
        if not self.warm_start or getattr(self, "_fit_fingerprint", None) != fingerprint:
            return None, None
        alpha0 = torch.as_tensor(self.dual_coef_)
        b0 = None
        prev = self._intercept_array(n_targets)
        if self.fit_intercept and prev is not None:
            b0 = prev
        return alpha0, b0

    def _format_intercept(self, b: np.ndarray):
        """``intercept_`` as scikit-learn spells it: a float for one regression output, else an array
        (shape (1,) for a binary classifier, like SVC)."""
        if isinstance(self, RegressorMixin) and getattr(self, "_y_1d", False):
            return float(b[0])
        return b.copy()

    def _intercept_array(self, n_targets: int) -> Optional[np.ndarray]:
        """The fitted intercepts as a float array of length ``n_targets`` (None when absent)."""
        b = getattr(self, "intercept_", None)
        if b is None:
            return None
        b = np.atleast_1d(np.asarray(b, dtype=np.float64))
        return b if b.shape == (n_targets,) else None

    def _weighted_rows(self, X, sample_weight, shards: SingleProcess):
        """Check the inputs and weights of a fit: ``(w, keep)``, the weights (ones by default) and the rows of
        positive weight, which the fit uses (the others leave the problem unchanged)."""
        self._check_bandwidth_params()
        check_magnitude(X, "X", dtype=resolve_dtype(self.dtype))  # squared distances must not overflow
        w = np.ones(X.shape[0]) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if shards.any(np.any(w < 0)):
            raise ValueError("sample_weight must be non-negative, got negative weights")
        keep = w > 0
        if not shards.distributed and not np.any(keep):
            raise ValueError("sample_weight must have at least one positive weight, got all zeros")
        return w, keep

    def _fit_targets(self, X, Y: np.ndarray, sample_weight, loss: Loss, shards: SingleProcess):
        """Common part of ``fit`` once targets are an (n, T) float array (this rank's rows of them)."""
        w, keep = self._weighted_rows(X, sample_weight, shards)
        Xk, Yk, wk = (X, Y, w) if keep.all() else (X[keep], Y[keep], w[keep])
        # rows over all ranks (an empty shard, e.g. all its weights zero, is an error on every rank)
        n_all = shards.plan(Xk.shape[0], Xk.shape[1]) if shards.distributed else Xk.shape[0]
        plan = self._fit_plan(self._build_kernel(Xk, shards), loss, n_all, wk)
        self._set_fitted_plan(plan)
        fingerprint = _fingerprint(Xk, Yk, wk)
        alpha0, b0 = self._warm_start_point(fingerprint, Yk.shape[1])
        if shards.any(alpha0 is None):  # a warm start only when every rank has one
            alpha0, b0 = None, None
        data = BlockData(torch.from_numpy(np.array(Xk, copy=True, order="C")), plan.dtype, plan.device)
        Yt = torch.as_tensor(Yk)
        checkpoint = self.checkpoint
        if checkpoint is not None and plan.intercept == "search" and shards.distributed:
            raise ValueError(f"checkpoint cannot be used with fit_intercept=True and distributed=True for loss "
                             f"{plan.loss.name!r}, whose intercept comes from the intercept search (each process's "
                             f"dual variables would be needed); got checkpoint={str(checkpoint)!r}")
        resume = None
        if checkpoint is not None and not shards.any(not os.path.isfile(checkpoint)) and alpha0 is None:
            resume = checkpoint  # continue an interrupted fit of the same data bitwise
        # with an intercept the engine fits it or joker_ext.intercept searches for it (plan.intercept)
        model = plan.fit(data, Yt, shards=shards, alpha0=alpha0, resume=resume, checkpoint_path=checkpoint,
                         checkpoint_every=self.checkpoint_every, intercept0=b0)
        res = model.result
        n_iter = res.n_iter
        rounds = int(res.state["intercept_rounds"]) if plan.intercept == "search" else int(plan.intercept == "engine")
        intercept = res.state["intercept"].double().cpu().numpy() if self.fit_intercept else np.zeros(Yk.shape[1])
        self.fit_plan_ = plan
        self.X_fit_ = np.asarray(Xk, dtype=np.float64 if self.dtype_ == torch.float64 else np.float32)
        self._fit_fingerprint = fingerprint
        self.dual_coef_ = model.alpha.detach().cpu().numpy()
        self.coef_ = None if model.beta is None else model.beta.detach().cpu().numpy()
        self.intercept_ = self._format_intercept(np.asarray(intercept, dtype=np.float64))
        self.n_iter_ = int(n_iter)
        self.n_intercept_rounds_ = int(rounds)
        self.status_ = res.status
        for attr, key in (("primal_objective_", "primal"), ("dual_objective_", "dual"), ("duality_gap_", "gap"),
                          ("relative_gap_", "rel_gap")):
            setattr(self, attr, float(getattr(res, key)))
        self.history_ = res.history
        self.block_size_ = plan.options.block_size
        self._model_cache = model
        self._warn_unless_converged(plan, f"after {self.n_iter_} iterations")
        return self

    def _warn_unless_converged(self, plan: FitPlan, where: str) -> None:
        """A ConvergenceWarning (with advice by the status) when the fit stopped short of its tolerance and of
        :data:`~joker_ext.defaults.CONVERGENCE_WARN_GAP`; ``where``: what stopped there ('after 40 iterations')."""
        if self.status_ == "converged" or self.relative_gap_ <= max(plan.options.tol, CONVERGENCE_WARN_GAP):
            return
        advice = _STOP_ADVICE.get(self.status_, "")
        if self.dtype_ != torch.float64:
            advice += " or use dtype='float64'" if advice else "; use dtype='float64'"
        warnings.warn(f"{type(self).__name__} stopped ({self.status_}) {where} with relative duality gap "
                      f"{self.relative_gap_:.2e}{advice}", ConvergenceWarning)

    # ------------------------------------------------------------------ prediction
    def _model(self) -> KernelModel:
        cache = getattr(self, "_model_cache", None)
        if cache is not None:
            return cache
        dtype, device = self.dtype_, self.device_
        alpha = torch.as_tensor(self.dual_coef_).to(device=device, dtype=dtype)
        beta = None if self.coef_ is None else torch.as_tensor(self.coef_).to(device=device, dtype=dtype)
        data = BlockData(torch.from_numpy(np.array(self.X_fit_, copy=True, order="C")), dtype, device)
        self._model_cache = KernelModel(self.kernel_, self.feature_map_, data, alpha, beta)
        return self._model_cache

    def _decision(self, X) -> np.ndarray:
        check_is_fitted(self, "dual_coef_")
        X = validate_data(self, _to_numpy(X), reset=False, dtype=[np.float64, np.float32])
        check_magnitude(X, "X", dtype=resolve_dtype(self.dtype))
        F = self._model().decision(torch.from_numpy(np.ascontiguousarray(X)))
        out = F.detach().cpu().numpy().astype(np.float64)
        b = self._intercept_array(out.shape[1])
        if b is None:
            if self.fit_intercept:
                raise AttributeError(f"{type(self).__name__} was fitted with fit_intercept=True but has no intercept_")
        else:
            out = out + b[None, :]
        if not np.all(np.isfinite(out)):
            raise FloatingPointError(
                "the model produced non-finite predictions; refit with dtype='float64' or a smaller C"
            )
        return out

    # ------------------------------------------------------------------ pickling and display
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_model_cache"] = None  # tensors (possibly on a device) are rebuilt from the numpy copies
        for key, value in state.items():
            if torch.is_tensor(value):
                state[key] = value.detach().cpu()
        if isinstance(state.get("device_"), torch.device) and state["device_"].type != "cpu":
            state["_fitted_device"] = str(state["device_"])
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if "dual_coef_" in state:
            self._model_cache = None
            try:
                self._model_cache = self._model()
            except (RuntimeError, AssertionError) as exc:  # the fitted device is not available here
                warnings.warn(
                    f"{type(self).__name__} was fitted on device {self.device_}, which is not available here "
                    f"({exc}); predicting on the CPU",
                    RuntimeWarning,
                )
                self.device_ = torch.device("cpu")
                self._model_cache = None
                self._model_cache = self._model()

    def _fitted_summary(self) -> str:
        parts = []
        if getattr(self, "sigma_", None) is not None:
            s = self.sigma_
            parts.append(f"sigma_={s:.4g}" if isinstance(s, float) else f"sigma_=array(shape={np.shape(s)})")
        if getattr(self, "gamma_", None) is not None:
            parts.append(f"gamma_={self.gamma_:.4g}")
        if self.fit_intercept and getattr(self, "intercept_", None) is not None:
            b = np.atleast_1d(np.asarray(self.intercept_))
            parts.append(f"intercept_={b[0]:.4g}" if b.size == 1 else f"intercept_=array(shape={b.shape})")
        parts.append(f"n_iter_={self.n_iter_}")
        parts.append(f"status_={self.status_!r}")
        parts.append(f"relative_gap_={self.relative_gap_:.2e}")
        return ", ".join(parts)

    def __repr__(self, N_CHAR_MAX: int = 700) -> str:
        """scikit-learn's repr (the parameters that differ from their defaults), followed after fitting
        by the effective values: ``JokerClassifier(C=10) [fitted: sigma_=1.2, gamma_=0.35, n_iter_=12, ...]``.

        Estimators nested in a Pipeline or a search are printed by scikit-learn's own pretty-printer,
        which shows the parameters only."""
        base = super().__repr__(N_CHAR_MAX=N_CHAR_MAX)
        if getattr(self, "dual_coef_", None) is None or not hasattr(self, "n_iter_"):
            return base
        return f"{base} [fitted: {self._fitted_summary()}]"

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        return tags


_COMMON_PARAMS_DOC = """
    Parameters
    ----------
    loss : {losses} or Loss, default {default_loss!r}
        ``l(y, f)`` of :mod:`joker_ext.losses`; a :class:`~joker_ext.losses.Loss` object is also accepted.
    C : float, default 1.0
        Loss weight in ``1/2 ||f||^2 + C sum_i w_i l(y_i, f(x_i))``: LIBSVM's / SVC's C
        (squared loss: ``KernelRidge(alpha=1/C)``; Falkon: ``C = 1/(n penalty)``).
    kernel : {{'gaussian', 'laplacian', 'laplacian_l1', 'matern'}} or kernel object, default 'gaussian'
        A joker_ext kernel, a Falkon / GPyTorch kernel, or a scikit-learn Gaussian-process kernel
        (``RBF``, ``Matern``, ``ConstantKernel * ...``, sums; translated by :mod:`joker_ext.adapters`).
        Note that joker's 'laplacian' uses the Euclidean distance; scikit-learn's ``laplacian_kernel``
        is 'laplacian_l1'.
    sigma : float, array of shape (n_features,), or 'median', default 'median'
        Bandwidth (see :mod:`joker_ext.kernels`); 'median' is the median pairwise distance of the
        training points. The value used is ``sigma_`` after fitting.
    gamma : float, optional
        scikit-learn spelling of the bandwidth: ``gamma = 1/(2 sigma^2)`` (gaussian, as SVC's 'rbf') or
        ``1/sigma`` (laplacian_l1). Give either ``sigma`` or ``gamma``, not both. After fitting,
        ``gamma_`` holds the value used (also when ``sigma`` was given).
    nu : float, default 1.5
        Matern smoothness (0.5, 1.5 or 2.5).
    n_features : int, optional
        None: exact kernel. An int: that many random features.
    features : {{'cossin', 'cos', 'orf'}}, default 'cossin'
        Random-feature form: cos/sin pairs, random-phase cosines, orthogonal random features.
    fit_intercept : bool, default False
        Add an unregularized bias: ``f(x) = sum_i alpha_i k(x_i, x) + b`` (one ``b`` per output), the
        model of SVC / SVR. The dual then has the constraint ``sum_i alpha_i = 0``. The 'active_set' and
        'working_set' engines keep it themselves, the exact kernel's 'newton' engine does for the built-in
        losses (the logistic loss's primal Newton steps take ``b`` as one more unknown), and so does the 'newton'
        engine with random features for the losses that need no smoothing (squared, Huber, squared hinge,
        logistic); around the others (DBCD-TR, the kinked losses with random features, smoothed user losses),
        which cannot, ``b`` is
        its Lagrange multiplier and is found by the intercept search of :mod:`joker_ext.intercept` (the
        same for every face of joker_ext): a safeguarded root search on ``s(b) = sum_i alpha_i(b)``, each
        step one warm-started engine solve of the dual with the loss ``l(y, f + b)`` and the augmented
        kernel ``K + rho`` (``rho`` = mean kernel diagonal), typically 5-15 solves. It stops when the
        duality gap of the joint problem (``alpha`` made feasible by shrinking its excess side) is below
        ``tol``; ``n_iter_`` counts the iterations of all solves, ``n_intercept_rounds_`` the solves.
        Default False: the model of the Joker paper and of KernelRidge, ``f(x) = sum_i alpha_i k(x_i, x)``.
    block_size : int, optional
        Rows per block (default: 2048 for n <= 5e5, 512 above; 1024 for logistic; at most n).
    max_iter : int, optional
        Outer iterations of the engine: Newton iterations (default 100; 250 for the kinked losses' smoothing
        continuation) or DBCD-TR block iterations
        (default: 50 passes over the blocks, at least 200); with ``fit_intercept`` the budget of all
        solves together.
    tol : float, optional
        Stop at this relative duality gap ``(P + D) / max(P, |D|)``. The default, 1e-14 in float64 and
        1e-7 in float32, asks for a solution correct to the working precision (the prediction error is
        of order the square root of the gap); large fits then stop at ``max_iter`` or ``max_time``,
        with a ConvergenceWarning only when the gap is still above 1e-6.
    epsilon, delta, quantile : float
        Parameters of the epsilon_insensitive, huber and pinball losses.
    solver : str, default 'auto'
        The engine (:mod:`joker_ext.engines`): 'newton' (second order: projected Newton on the whole dual
        for exact kernels, Newton-PCG on the feature weights for random features), 'active_set' (exact
        kernels, losses with a quadratic or linear conjugate: proximal primal-dual active-set rounds on
        the whole dual), 'working_set' (exact kernels, the same losses by decomposition, never forming
        K), 'dbcd_tr' (the Joker paper's block method, memory O(n b)), or 'auto'
        (:func:`joker_ext.engines.resolve_solver`: the second-order engine measured fastest for the loss
        where its memory fits, DBCD-TR elsewhere). ``solver_`` holds the engine used.
    device : str or torch.device, default 'cpu'
    dtype : {{'float64', 'float32'}} or torch dtype, default 'float64'
        Precision of the data, the kernel values and the model (``dtype_``). The exact engines compute in
        float64 whatever it is where ``K`` fits the memory budget in float64 (the working set always; their
        float32 solves of the ill-conditioned free blocks did not settle). Random-feature fits run in it
        throughout, except float32 fits with ``fit_intercept`` at ``C n > 10^6``
        (:data:`joker_ext.defaults.FLOAT32_INTERCEPT_MAX_COST`), whose Newton steps stalled in float32: their
        features are evaluated in float32 and solved in float64 (``dtype_`` is then float64).
    random_state : int, RandomState or None
        Seeds the block partition, block choice and random features (None: seed 0).
    verbose : bool
        Progress bar.
    warm_start : bool
        Start from the previous ``dual_coef_`` (and intercept) when ``X``, ``y`` and the sample weights are
        those of the previous fit (checked by a fingerprint), e.g. along a path of C (the previous dual
        variables are projected on the new box); otherwise a cold start.
    max_time : float, optional
        Time budget in seconds.
    max_memory : int or str, optional
        Memory budget of the fit ('2GB' or bytes): block size and streaming chunks are chosen to fit it
        (:func:`joker_ext.memory.plan_blocks`); a block that still runs out of memory is halved with a
        warning and the fit continues from the last consistent iterate.
    checkpoint : str or path, optional
        Write the solver state to this file every ``checkpoint_every`` block iterations (atomically,
        tensors only; with ``fit_intercept=True`` the intercept too, and where the intercept search fits it
        (``fit_plan_.intercept == 'search'``) the search's state, written between its solves). If the file
        exists when ``fit`` starts (a fit of the same data and settings was interrupted), the fit resumes from
        it: DBCD-TR and the intercept search end bitwise where the uninterrupted fit would have (CPU, same
        seed), the second-order engines go on from the saved iterate to the same tolerance. Not with
        ``distributed=True`` when the intercept search fits the intercept.
    checkpoint_every : int, default 100
    distributed : bool, default False
        True: ``fit`` is called by every process of an initialised ``torch.distributed`` process group
        (e.g. launched by ``torchrun``), each with its own shard of the rows (and of ``y`` and
        ``sample_weight``); the fit runs on all shards together and every rank ends with the same model
        (``coef_``, ``intercept_``, ``classes_``; ``dual_coef_`` and ``X_fit_`` hold the rank's own rows).
        Random features only (``n_features`` set), with the feature Newton engine
        (:mod:`joker_ext.distributed`); ``sigma='median'`` is taken on a sample drawn from every shard;
        only rank 0 writes the checkpoint. Not with ``probability=True``.
"""

_COMMON_ATTRS_DOC = """
    Attributes
    ----------
    dual_coef_ : ndarray (n_samples, n_outputs)
        ``alpha``: ``f(x) = K(x, X_fit_) @ dual_coef_ (+ intercept_)`` in exact mode.
    coef_ : ndarray (n_features, n_outputs) or None
        ``beta = Phi^T alpha`` in random-feature mode: ``f(x) = phi(x) @ coef_ (+ intercept_)``.
    intercept_ : float or ndarray
        ``b`` (zero when ``fit_intercept=False``).
    kernel_, sigma_, gamma_, feature_map_, loss_
        The effective kernel, bandwidth (and its gamma when defined), feature map and loss.
    fit_plan_ : joker_ext.plan.FitPlan
        What the fit ran: kernel, feature map, loss and per-sample costs, engine (``solver_``), tolerance, block
        size and iteration budget (:func:`joker_ext.plan.make_fit_plan`).
    n_iter_, n_intercept_rounds_, status_
        Block iterations, solves of the intercept search, and 'converged' / 'max_iter' / 'max_time'.
    primal_objective_, dual_objective_, duality_gap_, relative_gap_, history_
        Final objective values (of the joint problem with ``fit_intercept``) and the solver's history.
    n_features_in_, feature_names_in_
"""


@register_estimator
class JokerRegressor(RegressorMixin, _JokerBase):
    _allowed_losses = REGRESSION_LOSSES

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def __init__(self, loss="squared", C=1.0, kernel="gaussian", sigma="median", gamma=None, nu=1.5,
                 n_features=None, features="cossin", block_size=None, max_iter=None, tol=None, epsilon=0.1,
                 delta=1.0, quantile=0.5, device="cpu", dtype="float64", random_state=None, verbose=False,
                 warm_start=False, max_time=None, fit_intercept=False, max_memory=None, checkpoint=None,
                 checkpoint_every=100, solver="auto", distributed=False):
        _store_params(self, locals())

    def fit(self, X, y, sample_weight=None):
        """Fit on X (n, d) and y (n,) or (n, n_outputs); ``sample_weight`` multiplies C per sample.

        With several outputs, one dual column per output is solved together (shared kernel or feature
        map, one trust-region radius per output): the same solutions as separate fits.
        """
        self._validate_params()
        loss = self._loss_object()
        if loss.margin:
            raise ValueError(f"loss {loss.name!r} is a classification loss; use JokerClassifier")
        X = _to_numpy(X)
        shards = self._row_shards(X)
        X, y = validate_data(self, X, _to_numpy(y), multi_output=True, y_numeric=True,
                             dtype=[np.float64, np.float32])
        sample_weight = _check_sample_weight(sample_weight, X, dtype=np.float64)
        self._y_1d = y.ndim == 1
        Y = y.reshape(-1, 1) if y.ndim == 1 else y
        return self._fit_targets(X, Y.astype(np.float64), sample_weight, loss, shards)

    def predict(self, X) -> np.ndarray:
        """``f(X)``, shape (n,) or (n, n_outputs)."""
        F = self._decision(X)
        return F[:, 0] if self._y_1d else F


JokerRegressor.__doc__ = """Kernel regression with any convex loss, trained on the dual by the engine ``solver`` picks.

    Solves ``min_f 1/2 ||f||_H^2 + C sum_i w_i l(y_i, f(x_i))``; predictions are
    ``K(X, X_train) @ dual_coef_`` (exact) or ``phi(X) @ coef_`` (random features), plus ``intercept_``
    with ``fit_intercept=True``. ``score`` is scikit-learn's R^2 (averaged uniformly over outputs).
""" + _COMMON_PARAMS_DOC.format(losses="{'squared', 'huber', 'epsilon_insensitive', 'absolute', 'pinball'}",
                                default_loss="squared") + _COMMON_ATTRS_DOC


@register_estimator
class JokerClassifier(ClassifierMixin, _JokerBase):
    _allowed_losses = CLASSIFICATION_LOSSES
    _parameter_constraints = {
        **_JokerBase._parameter_constraints,
        "class_weight": [dict, StrOptions({"balanced"}), None],
        "probability": ["boolean"],
        "multi_class": [StrOptions({"auto", "ovr", "ovo"})],
    }

    def __init__(self, loss="hinge", C=1.0, kernel="gaussian", sigma="median", gamma=None, nu=1.5,
                 n_features=None, features="cossin", block_size=None, max_iter=None, tol=None, epsilon=0.1,
                 delta=1.0, quantile=0.5, device="cpu", dtype="float64", random_state=None, verbose=False,
                 warm_start=False, max_time=None, class_weight=None, probability=False, fit_intercept=False,
                 max_memory=None, checkpoint=None, checkpoint_every=100, solver="auto", distributed=False,
                 multi_class="auto"):
        _store_params(self, locals())

    def fit(self, X, y, sample_weight=None):
        """Fit on X (n, d) and labels y (n,) of any type with at least two classes.

        ``sample_weight`` multiplies C per sample (for every loss), on top of ``class_weight``.
        """
        self._validate_params()
        loss = self._loss_object()
        X = _to_numpy(X)
        shards = self._row_shards(X)
        X, y = validate_data(self, X, _to_numpy(y), dtype=[np.float64, np.float32])
        check_classification_targets(y)
        self.classes_, y_idx = _encode_labels(y)
        if shards.distributed:  # the labels of every shard
            self.classes_ = np.unique(np.concatenate(shards.gather_objects(self.classes_)))
            y_idx = np.searchsorted(self.classes_, y)
        k = len(self.classes_)
        if k < 2:
            raise ValueError(
                f"y must contain at least 2 classes for JokerClassifier, got 1 class: {self.classes_[0]!r}"
            )
        sample_weight = _check_sample_weight(sample_weight, X, dtype=np.float64)
        sample_weight = sample_weight * self._class_weights(y_idx, k, shards)[y_idx]
        self.calibration_scale_ = None
        self._one_vs_one_fit = k > 2 and self._multi_class(loss) == "ovo"
        if self._one_vs_one_fit:
            self._fit_one_vs_one(X, y_idx, sample_weight, loss, shards)
        else:
            self._fit_targets(X, self._targets(y_idx, k), sample_weight, loss, shards)
        if self.probability and loss.name != "logistic":
            self._fit_calibration(X, y_idx, sample_weight)
        return self

    def _multi_class(self, loss: Loss) -> str:
        """``multi_class`` resolved: 'auto' is 'ovo' for the hinge loss with an intercept on the exact kernel (SVC's
        model) on the CPU (where the pairs are solved together), in one process, without a checkpoint; else 'ovr'."""
        if self.multi_class != "auto":
            return self.multi_class
        svc = loss.name == "hinge" and self.fit_intercept and self.n_features is None
        cpu = resolve_device(self.device).type == "cpu"
        return "ovo" if svc and cpu and not self.distributed and self.checkpoint is None else "ovr"

    @staticmethod
    def _targets(y_idx: np.ndarray, k: int) -> np.ndarray:
        """The +1 / -1 targets: one column (+1 for ``classes_[1]``) for two classes, one per class otherwise."""
        if k == 2:
            return np.where(y_idx == 1, 1.0, -1.0).reshape(-1, 1)
        return np.where(y_idx[:, None] == np.arange(k)[None, :], 1.0, -1.0)

    def _fit_one_vs_one(self, X, y_idx: np.ndarray, sample_weight: np.ndarray, loss: Loss, shards) -> None:
        """``multi_class='ovo'``: a binary problem per pair of classes (:mod:`joker_ext.one_vs_one`), each with this
        estimator's kernel (its bandwidth from all the data), loss, C and weights; the pairs' dual coefficients are
        the columns of ``dual_coef_`` (zero outside each pair's rows), their intercepts ``intercept_``."""
        for name, bad, expected in (("distributed", bool(self.distributed), "False"),
                                    ("n_features", self.n_features is not None, "None (the exact kernel)"),
                                    ("checkpoint", self.checkpoint is not None, "None (every pair is a fit)")):
            if bad:
                raise ValueError(f"multi_class='ovo' needs {name}={expected}, got {name}="
                                 f"{getattr(self, name)!r}; multi_class='ovr' supports it")
        w, keep = self._weighted_rows(X, sample_weight, shards)
        X, y_idx, w = X[keep], y_idx[keep], w[keep]
        present = np.unique(y_idx)
        if present.size < len(self.classes_):
            raise ValueError(f"multi_class='ovo' needs points of positive weight in every class; the classes "
                             f"{self.classes_[np.setdiff1d(np.arange(len(self.classes_)), present)].tolist()} have "
                             f"none")
        plan = self._fit_plan(self._build_kernel(X), loss, X.shape[0], w)
        self._set_fitted_plan(plan)
        fit = fit_one_vs_one(plan, X, y_idx, len(self.classes_),
                             fit_pair=lambda rows, y, start: self._fit_pair(plan, X[rows], y, w[rows], start),
                             batch=self.solver == "auto")
        self.fit_plan_ = plan
        self.X_fit_ = np.asarray(X, dtype=np.float64 if self.dtype_ == torch.float64 else np.float32)
        self._fit_fingerprint = None  # (no warm start from pairs)
        self.dual_coef_ = fit.dual_coef.astype(self.X_fit_.dtype)
        self.coef_ = None
        self.intercept_ = fit.intercept if self.fit_intercept else np.zeros(fit.intercept.size)
        self.n_iter_ = int(fit.n_iter.sum())
        self.n_intercept_rounds_ = 0
        self.status_ = fit.status
        self.primal_objective_, self.dual_objective_ = float(fit.primal.sum()), float(fit.dual.sum())
        self.duality_gap_, self.relative_gap_ = float(fit.gap.sum()), float(fit.rel_gap.max())
        self.history_ = []
        self.block_size_ = plan.options.block_size
        self._model_cache = None
        self._model_cache = self._model()  # (made now: predict leaves the estimator as it is)
        self._warn_unless_converged(plan, "on a pair of classes")

    def _fit_pair(self, plan: FitPlan, X: np.ndarray, y: np.ndarray, w: np.ndarray,
                  start: Optional[tuple] = None) -> "JokerClassifier":
        """One pair's binary fit by the engines: this estimator's parameters with the fitted kernel (its
        bandwidth from all the data) and the pair's weights (class weights included); from ``start`` (dual
        coefficients and intercept of these rows), when given, as a warm start."""
        from sklearn.base import clone

        pair = clone(self).set_params(probability=False, warm_start=start is not None, class_weight=None,
                                      kernel=plan.kernel, sigma="median", gamma=None)
        if start is not None:  # as if the pair had been fitted to ``start`` on these very rows
            pair._fit_fingerprint = _fingerprint(X, self._targets((y > 0).astype(np.int64), 2), w)
            pair.dual_coef_, pair.intercept_ = np.reshape(start[0], (-1, 1)), np.array([start[1]])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # (reported once, for the whole fit)
            return pair.fit(X, y, sample_weight=w)

    def _class_weights(self, y_idx: np.ndarray, k: int, shards: SingleProcess) -> np.ndarray:
        if self.class_weight is None:
            return np.ones(k)
        if isinstance(self.class_weight, str):  # 'balanced', as sklearn.utils.compute_class_weight
            (counts,) = shards.sum_many(torch.from_numpy(np.bincount(y_idx, minlength=k).astype(np.float64)))
            counts = counts.numpy()
            return counts.sum() / (k * counts)
        cw = np.ones(k)
        for label, weight in self.class_weight.items():
            hits = np.nonzero(self.classes_ == label)[0]
            if hits.size == 0:
                raise ValueError(
                    f"class_weight has the label {label!r}, which is not in y (classes {self.classes_.tolist()})"
                )
            if not isinstance(weight, numbers.Real) or not np.isfinite(weight) or weight < 0:
                raise ValueError(f"class_weight[{label!r}] must be a non-negative number, got {weight!r}")
            cw[hits[0]] = float(weight)
        return cw

    def _calibration_folds(self, X, y_idx, sample_weight, n_splits: int) -> Optional[np.ndarray]:
        """Fold of every row, a function of the row's content: the distinct (x, y) pairs of each class,
        ordered by a seeded hash, are dealt round-robin into ``n_splits`` folds. Repeated rows share
        a fold, so integer sample weights and repeated rows give the same calibration (scikit-learn's
        sample-weight equivalence), and every class reaches every training fold. None when a class has
        fewer than 2 distinct samples of positive weight."""
        Xc = np.ascontiguousarray(X, dtype=np.float64)
        seed = self._seed().to_bytes(8, "little", signed=False)
        keys = np.array([hashlib.blake2b(seed + Xc[i].tobytes() + int(y_idx[i]).to_bytes(8, "little"),
                                         digest_size=8).hexdigest() for i in range(Xc.shape[0])])
        fold = np.empty(Xc.shape[0], dtype=np.int64)
        for k in range(len(self.classes_)):
            rows = np.nonzero(y_idx == k)[0]
            uniq, inv = np.unique(keys[rows], return_inverse=True)
            if np.unique(inv[sample_weight[rows] > 0]).size < 2:
                return None  # a class with one distinct sample cannot be cross-fitted
            fold[rows] = inv % n_splits
        return fold

    def _fit_calibration(self, X, y_idx, sample_weight):
        """Temperature scaling of out-of-fold decision values (3 folds, see :meth:`_calibration_folds`).

        ``P = sigmoid(A f)`` (binary) or ``softmax(A F)`` (one-vs-rest scores), with one ``A > 0``
        minimising the weighted log-loss of the out-of-fold probabilities (of the in-sample ones when a
        class has fewer than 2 distinct samples). One slope for all classes and
        no offset keep ``predict`` equal to the argmax of ``predict_proba``, which Platt's per-class
        ``sigmoid(A_k f_k + B_k)`` (SVC's choice) would break.
        """
        from scipy.optimize import brentq
        from scipy.special import softmax
        from sklearn.base import clone

        k = len(self.classes_)
        n_splits = 3
        fold = self._calibration_folds(X, y_idx, sample_weight, n_splits)
        base = clone(self).set_params(probability=False, warm_start=False)
        D = np.zeros((X.shape[0], 1 if k == 2 else k))
        if fold is None:  # too few distinct samples to cross-fit: in-sample decision values
            D[:] = self.decision_function(X).reshape(X.shape[0], -1)
            fold = np.full(X.shape[0], -1)
        for j in range(n_splits):
            te, tr = fold == j, fold != j
            if not te.any():
                continue
            m = clone(base).fit(X[tr], self.classes_[y_idx[tr]], sample_weight=sample_weight[tr])
            D[te] = m.decision_function(X[te]).reshape(int(te.sum()), -1)
        Z = np.column_stack([np.zeros(len(D)), D[:, 0]]) if k == 2 else D
        target = y_idx
        w = sample_weight / sample_weight.sum()
        spread = float(np.sqrt(np.average((Z - Z.mean()) ** 2, axis=0, weights=w).mean()))
        spread = spread if np.isfinite(spread) and spread > 0 else 1.0

        Zt = Z[np.arange(len(Z)), target]

        def grad(A):  # derivative of the weighted negative log-likelihood; nondecreasing in A (convexity)
            P = softmax(A * Z, axis=1)
            return float(np.sum(w * ((P * Z).sum(1) - Zt)))

        # The optimum is the root of the derivative in [0, A_max]; A_max bounds the slope when the
        # scores separate the classes perfectly (the likelihood then keeps growing with A).
        # A_min > 0 keeps the argmax of the probabilities equal to predict when the scores carry no
        # information (the likelihood would then be best at A = 0, uniform probabilities).
        A_min, A_max = 1e-6 / spread, 1e4 / spread
        if grad(A_min) >= 0:
            A = A_min
        elif grad(A_max) <= 0:
            A = A_max
        else:
            A = brentq(grad, A_min, A_max, xtol=1e-15 * A_max, rtol=4 * np.finfo(float).eps, maxiter=500)
        self.calibration_scale_ = float(A)

    def _calibrated_proba(self, D: np.ndarray) -> np.ndarray:
        from scipy.special import softmax

        A = self.calibration_scale_
        if D.ndim == 1:
            p = expit(A * D)
            return np.column_stack([1.0 - p, p])
        return softmax(A * D, axis=1)

    def _pairwise(self) -> bool:
        """Whether the fitted model is one-vs-one (``dual_coef_``'s columns are pairs of classes); a model saved before
        one-vs-one existed has no such flag and is one-vs-rest."""
        check_is_fitted(self, "dual_coef_")
        return len(self.classes_) > 2 and getattr(self, "_one_vs_one_fit", False)

    def decision_function(self, X) -> np.ndarray:
        """``f(X)``: shape (n,) for two classes (positive means ``classes_[1]``), (n, n_classes) otherwise: the
        one-vs-rest scores, or with ``multi_class='ovo'`` each class's votes plus a term in (-1/3, 1/3) from the sum
        of its pairs' decision values (SVC's ``decision_function_shape='ovr'``,
        :func:`joker_ext.one_vs_one.ovr_scores`)."""
        F = self._decision(X)
        if self._pairwise():
            return ovr_scores(F, len(self.classes_))
        return F[:, 0] if F.shape[1] == 1 else F

    def predict(self, X) -> np.ndarray:
        """The class with the largest decision value (binary: ``classes_[1]`` when f > 0); with
        ``multi_class='ovo'`` the class with the most votes, the first of them on a tie (SVC's ``predict``)."""
        if self._pairwise():
            return self.classes_[np.argmax(vote(self._decision(X), len(self.classes_)), axis=1)]
        D = self.decision_function(X)
        if D.ndim == 1:
            return self.classes_[(D > 0).astype(int)]
        return self.classes_[np.argmax(D, axis=1)]

    def _has_proba(self) -> bool:
        return (isinstance(self.loss, str) and self.loss == "logistic") or \
            (isinstance(self.loss, Loss) and self.loss.name == "logistic") or bool(self.probability)

    @available_if(_has_proba)
    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities, columns in the order of ``classes_``.

        Logistic loss: ``sigmoid(f)`` (binary), or the one-vs-rest ``sigmoid(f_k)`` normalised to sum to
        one, or, one-vs-one, the pairs' ``sigmoid(f_ij)`` coupled into one distribution
        (:func:`joker_ext.one_vs_one.coupled_probabilities`). Hinge / squared hinge / squared loss with
        ``probability=True``: ``sigmoid(A f)`` or ``softmax(A F)`` with the temperature ``A =
        calibration_scale_`` fitted on out-of-fold decision values. The argmax of the probabilities is
        ``predict``, except one-vs-one's ties of votes and its coupled probabilities.
        """
        check_is_fitted(self, "dual_coef_")
        if self.loss_.name == "logistic" and self._pairwise():
            return coupled_probabilities(self._decision(X), len(self.classes_))
        if self.loss_.name == "logistic":
            D = self.decision_function(X)
            P = expit(D)
        elif getattr(self, "calibration_scale_", None) is not None:
            return self._calibrated_proba(self.decision_function(X))
        else:
            raise AttributeError(
                "predict_proba is available for loss='logistic', or with probability=True; "
                f"got loss={self.loss_.name!r}"
            )
        if P.ndim == 1:
            return np.column_stack([1.0 - P, P])
        return P / P.sum(axis=1, keepdims=True)

    @available_if(_has_proba)
    def predict_log_proba(self, X) -> np.ndarray:
        """``log(predict_proba(X))``."""
        return np.log(self.predict_proba(X))


JokerClassifier.__doc__ = """Kernel classifier (hinge, squared hinge, logistic or squared loss), trained on the dual by
    the engine ``solver`` picks.

    Labels of any type; ``classes_`` is sorted. Binary problems fit one decision function ``f`` (positive
    for ``classes_[1]``, trained on ``y = +1`` for ``classes_[1]``, ``-1`` otherwise). Multi-class problems fit
    one-vs-rest (``multi_class='ovr'``: a column per class on all points, the columns sharing one kernel / feature
    map and solved together; ``predict`` is the argmax of ``decision_function``) or one-vs-one (``'ovo'``: a
    binary problem per pair of classes on their points only; :mod:`joker_ext.one_vs_one`). With the hinge loss and
    ``fit_intercept=True`` one-vs-one is SVC's own model (every pair's decision values are LIBSVM's, to its
    tolerance), and its pairs are solved together by one compiled call: at n = 4,000 on five KEEL sets with 6-26
    classes, 0.3-0.8x SVC's time where one-vs-rest took 1.0-1.5x (the engines benchmark's ``--multiclass`` rows).
    ``score`` is accuracy.
""" + _COMMON_PARAMS_DOC.format(losses="{'hinge', 'squared_hinge', 'logistic', 'squared'}",
                                default_loss="hinge") + """    class_weight : dict, 'balanced' or None
        Multiplies C per class (``'balanced'``: ``n / (n_classes * count)``), as scikit-learn's SVC.
    probability : bool, default False
        For hinge / squared hinge / squared loss, calibrate the decision function by temperature scaling
        (``sigmoid(A f)``, ``softmax(A F)`` for several classes) fitted on out-of-fold decision values
        (3 folds dealt per class from a hash of the rows seeded by ``random_state``; a fit costs about 3
        more fits) so that ``predict_proba`` is available; logistic loss gives probabilities natively
        (``probability`` is then ignored). Unlike SVC's Platt scaling, ``predict`` stays the argmax of
        ``predict_proba`` (one-vs-one: but for ties of votes), and sample weights are equivalent to repeated rows.
    multi_class : {'auto', 'ovr', 'ovo'}, default 'auto'
        Several classes: ``'ovr'`` one-vs-rest, ``'ovo'`` one-vs-one (exact kernels, one process, no
        ``checkpoint``: each pair is a fit of its own; its pairs are solved together on the CPU, one fit after
        another elsewhere). One-vs-one's ``decision_function`` gives each class its votes plus a term in (-1/3, 1/3)
        from its pairs' decision values (SVC's ``decision_function_shape='ovr'``), ``predict`` the class with the
        most votes, the first on a tie (SVC's); ``dual_coef_`` holds a column per pair in SVC's order ``(0, 1), (0,
        2), ..., (1, 2), ...`` (zero outside the pair's points; its decision value is positive for the first class),
        ``intercept_`` an intercept per pair; ``relative_gap_`` is the worst pair's, the objectives and
        ``duality_gap_`` are sums over the pairs; fits start from zero (``warm_start`` applies to one-vs-rest).
        ``'auto'``: one-vs-one for the hinge loss with ``fit_intercept=True`` on the CPU where one-vs-one applies
        (SVC's model), one-vs-rest otherwise. Two classes are one problem either way.
""" + _COMMON_ATTRS_DOC + """    classes_ : ndarray (n_classes,)
    calibration_scale_ : float or None
        The temperature ``A`` (``probability=True`` with a non-logistic loss).
"""
