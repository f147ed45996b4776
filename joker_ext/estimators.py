"""scikit-learn estimators: :class:`JokerRegressor` and :class:`JokerClassifier`.

Both solve ``min_f 1/2 ||f||_H^2 + C sum_i w_i l(y_i, f(x_i))`` (no intercept, like KernelRidge) by
DBCD-TR on the dual, with the exact kernel (``n_features=None``) or ``n_features`` random features.

Conventions: ``C`` is LIBSVM's / scikit-learn SVC's C (for the squared loss, ``KernelRidge(alpha=1/C)``);
``sigma`` is the bandwidth of :mod:`joker_ext.kernels` (``gamma = 1/(2 sigma^2)`` for the Gaussian,
``1/sigma`` for laplacian_l1); ``sigma='median'`` is the median pairwise distance of the distinct
training points (:func:`joker_ext.kernels.median_heuristic`).
"""
from __future__ import annotations

import numbers
import warnings
from typing import Optional

import numpy as np
import torch
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils._available_if import available_if
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

from .conversions import gamma_to_sigma
from .data import resolve_device, resolve_dtype
from .features import make_feature_map
from .kernels import Kernel, StationaryKernel, make_kernel, median_heuristic
from .losses import Loss, get_loss
from .model import KernelModel, default_block_size, default_max_iter, fit_dual
from .data import BlockData
from .solver import SolverOptions

__all__ = ["JokerRegressor", "JokerClassifier"]

REGRESSION_LOSSES = ("squared", "huber", "epsilon_insensitive", "absolute", "pinball")
CLASSIFICATION_LOSSES = ("hinge", "squared_hinge", "logistic", "squared")


def _to_numpy(X):
    if torch.is_tensor(X):
        return X.detach().cpu().numpy()
    return X


def _resolve_kernel_object(kernel):
    """Joker kernels pass through; other libraries' kernel objects go through the adapters."""
    if isinstance(kernel, Kernel):
        return kernel
    from .adapters import translate_kernel  # imported lazily: optional dependencies

    return translate_kernel(kernel)


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
        "block_size": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left"), None],
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

    def _seed(self) -> int:
        rs = self.random_state
        if rs is None:
            return 0
        if isinstance(rs, numbers.Integral):
            return int(rs)
        return int(np.random.RandomState(rs).randint(0, 2**31 - 1)) if not isinstance(rs, np.random.RandomState) \
            else int(rs.randint(0, 2**31 - 1))

    def _effective_sigma(self, X: np.ndarray):
        if self.gamma is not None:
            fam = self.kernel if isinstance(self.kernel, str) else "gaussian"
            if fam not in ("gaussian", "laplacian_l1"):
                raise ValueError(f"gamma is defined for kernel='gaussian' or 'laplacian_l1', got kernel={self.kernel!r}")
            return gamma_to_sigma(self.gamma, fam)
        if isinstance(self.sigma, str) or self.sigma is None:
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

    def _build_kernel(self, X: np.ndarray) -> Kernel:
        if isinstance(self.kernel, str):
            sigma = self._effective_sigma(X)
            return make_kernel(self.kernel, sigma, nu=self.nu if self.kernel == "matern" else None)
        return _resolve_kernel_object(self.kernel)

    def _tol(self) -> float:
        if self.tol is not None:
            return float(self.tol)
        return 1e-14 if resolve_dtype(self.dtype) == torch.float64 else 1e-7

    def _solver_options(self, n: int, loss: Loss) -> SolverOptions:
        b = self.block_size or default_block_size(n, loss)
        b = min(b, n)
        return SolverOptions(
            block_size=b,
            max_iter=self.max_iter or default_max_iter(n, b),
            tol=self._tol(),
            max_time=self.max_time,
            seed=self._seed(),
            verbose=bool(self.verbose),
        )

    def _fit_targets(self, X, Y: np.ndarray, sample_weight, loss: Loss):
        """Common part of ``fit`` once targets are an (n, T) float array."""
        self.dtype_ = resolve_dtype(self.dtype)
        self.device_ = resolve_device(self.device)
        n = X.shape[0]
        w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if np.any(w < 0):
            raise ValueError("sample_weight must be non-negative, got negative weights")
        keep = w > 0
        if not np.any(keep):
            raise ValueError("sample_weight must have at least one positive weight, got all zeros")
        Xk, Yk, wk = (X, Y, w) if keep.all() else (X[keep], Y[keep], w[keep])
        self.kernel_ = self._build_kernel(Xk)
        if isinstance(self.kernel_, StationaryKernel):
            s = self.kernel_.sigma
            self.sigma_ = float(s) if s.dim() == 0 or s.numel() == 1 else s.numpy().copy()
        else:
            self.sigma_ = None
        if self.n_features is None:
            self.feature_map_ = None
        else:
            form = "cos" if self.features == "cos" else "cossin"
            self.feature_map_ = make_feature_map(self.kernel_, int(self.n_features), form=form,
                                                 orthogonal=self.features == "orf", seed=self._seed())
        self.loss_ = loss
        c = torch.as_tensor(self.C * wk, dtype=torch.float64)
        opts = self._solver_options(Xk.shape[0], loss)
        alpha0 = None
        if self.warm_start and hasattr(self, "dual_coef_") and self.dual_coef_.shape == Yk.shape \
                and getattr(self, "_fit_X_shape", None) == Xk.shape:
            alpha0 = torch.as_tensor(self.dual_coef_)
        Xt = torch.from_numpy(np.array(Xk, copy=True, order="C"))
        model = fit_dual(Xt, torch.as_tensor(Yk), loss=loss, c=c, kernel=self.kernel_,
                         feature_map=self.feature_map_, options=opts, dtype=self.dtype_, device=self.device_,
                         alpha0=alpha0)
        res = model.result
        self.X_fit_ = np.asarray(Xk, dtype=np.float64 if self.dtype_ == torch.float64 else np.float32)
        self._fit_X_shape = Xk.shape
        self.dual_coef_ = model.alpha.detach().cpu().numpy()
        self.coef_ = None if model.beta is None else model.beta.detach().cpu().numpy()
        self.n_iter_ = res.n_iter
        self.status_ = res.status
        self.primal_objective_ = res.primal
        self.dual_objective_ = res.dual
        self.duality_gap_ = res.gap
        self.relative_gap_ = res.rel_gap
        self.history_ = res.history
        self.block_size_ = opts.block_size
        self._model_cache = model
        if res.status == "max_iter" and res.rel_gap > max(self._tol(), 1e-6):
            from sklearn.exceptions import ConvergenceWarning

            warnings.warn(
                f"{type(self).__name__} stopped after max_iter={opts.max_iter} block iterations with relative "
                f"duality gap {res.rel_gap:.2e}; increase max_iter"
                + ("" if self.dtype_ == torch.float64 else " or use dtype='float64'"),
                ConvergenceWarning,
            )
        return self

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
        F = self._model().decision(torch.from_numpy(np.ascontiguousarray(X)))
        out = F.detach().cpu().numpy().astype(np.float64)
        if not np.all(np.isfinite(out)):
            raise FloatingPointError(
                "the model produced non-finite predictions; refit with dtype='float64' or a smaller C"
            )
        return out

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_model_cache"] = None  # tensors (possibly on a device) are rebuilt from the numpy copies
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if "dual_coef_" in state:
            self._model_cache = None
            self._model_cache = self._model()

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        return tags


class JokerRegressor(RegressorMixin, _JokerBase):
    """Kernel regression with any convex loss, trained by DBCD-TR (Joker).

    Solves ``min_f 1/2 ||f||_H^2 + C sum_i w_i l(y_i, f(x_i))``; predictions are
    ``K(X, X_train) @ dual_coef_`` (exact) or ``phi(X) @ coef_`` (random features).

    Parameters
    ----------
    loss : {'squared', 'huber', 'epsilon_insensitive', 'absolute', 'pinball'} or Loss, default 'squared'
    C : float, default 1.0
        Loss weight; squared loss equals ``KernelRidge(alpha=1/C)``.
    kernel : {'gaussian', 'laplacian', 'laplacian_l1', 'matern'} or kernel object, default 'gaussian'
        A joker_ext kernel, or a Falkon / GPyTorch kernel object (translated by :mod:`joker_ext.adapters`).
    sigma : float, array of shape (n_features,), or 'median', default 'median'
        Bandwidth (see :mod:`joker_ext.kernels`).
    gamma : float, optional
        scikit-learn spelling of the bandwidth: ``gamma = 1/(2 sigma^2)`` (gaussian) or ``1/sigma``
        (laplacian_l1); overrides ``sigma``.
    nu : float, default 1.5
        Matern smoothness (0.5, 1.5 or 2.5).
    n_features : int, optional
        None: exact kernel. An int: that many random features.
    features : {'cossin', 'cos', 'orf'}, default 'cossin'
        Random-feature form: cos/sin pairs, random-phase cosines, orthogonal random features.
    block_size : int, optional
        Rows per block (default: 2048 for n <= 5e5, 512 above; 1024 for logistic; at most n).
    max_iter : int, optional
        Block iterations (default: 50 passes over the blocks, at least 200).
    tol : float, optional
        Stop at this relative duality gap ``(P + D) / max(P, |D|)``. The default, 1e-14 in float64 and
        1e-7 in float32, asks for a solution correct to the working precision (the prediction error is
        of order the square root of the gap); large fits then stop at ``max_iter`` or ``max_time``,
        with a ConvergenceWarning only when the gap is still above 1e-6.
    epsilon, delta, quantile : float
        Parameters of the epsilon_insensitive, huber and pinball losses.
    device : str or torch.device, default 'cpu'
    dtype : {'float64', 'float32'} or torch dtype, default 'float64'
    random_state : int, RandomState or None
        Seeds the block partition, block choice and random features.
    verbose : bool
        Progress bar.
    warm_start : bool
        Start from the previous ``dual_coef_`` (same data), e.g. along a path of C.
    max_time : float, optional
        Time budget in seconds.

    Attributes
    ----------
    dual_coef_ : ndarray (n_samples, n_targets)
    coef_ : ndarray (n_features, n_targets) or None
    kernel_, sigma_, feature_map_, loss_ : the effective kernel, bandwidth, feature map, loss
    n_iter_, status_, primal_objective_, dual_objective_, duality_gap_, relative_gap_, history_
    """

    _allowed_losses = REGRESSION_LOSSES

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def __init__(self, loss="squared", C=1.0, kernel="gaussian", sigma="median", gamma=None, nu=1.5,
                 n_features=None, features="cossin", block_size=None, max_iter=None, tol=None, epsilon=0.1,
                 delta=1.0, quantile=0.5, device="cpu", dtype="float64", random_state=None, verbose=False,
                 warm_start=False, max_time=None):
        self.loss = loss
        self.C = C
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.nu = nu
        self.n_features = n_features
        self.features = features
        self.block_size = block_size
        self.max_iter = max_iter
        self.tol = tol
        self.epsilon = epsilon
        self.delta = delta
        self.quantile = quantile
        self.device = device
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start = warm_start
        self.max_time = max_time

    def fit(self, X, y, sample_weight=None):
        """Fit on X (n, d) and y (n,) or (n, n_targets); ``sample_weight`` multiplies C per sample."""
        self._validate_params()
        loss = self._loss_object()
        if loss.margin:
            raise ValueError(f"loss {loss.name!r} is a classification loss; use JokerClassifier")
        X, y = validate_data(self, _to_numpy(X), _to_numpy(y), multi_output=True, y_numeric=True,
                             dtype=[np.float64, np.float32])
        sample_weight = _check_sample_weight(sample_weight, X, dtype=np.float64)
        self._y_1d = y.ndim == 1
        Y = y.reshape(-1, 1) if y.ndim == 1 else y
        return self._fit_targets(X, Y.astype(np.float64), sample_weight, loss)

    def predict(self, X) -> np.ndarray:
        """``f(X)``, shape (n,) or (n, n_targets)."""
        F = self._decision(X)
        return F[:, 0] if self._y_1d else F


class JokerClassifier(ClassifierMixin, _JokerBase):
    """Kernel classifier (hinge, squared hinge, logistic or squared loss) trained by DBCD-TR.

    Binary problems fit one decision function ``f`` (positive for ``classes_[1]``); multi-class problems
    fit one-vs-rest, all classes sharing one kernel / feature map and solved together (one trust-region
    radius per class). ``predict`` is the argmax of ``decision_function``.

    Parameters are those of :class:`JokerRegressor` (``loss`` in 'hinge', 'squared_hinge', 'logistic',
    'squared', default 'hinge') plus

    class_weight : dict, 'balanced' or None
        Multiplies C per class (``'balanced'``: ``n / (n_classes * count)``), as scikit-learn's SVC.
    probability : bool, default False
        For hinge / squared hinge, fit a Platt (sigmoid) calibration of the decision function by
        cross-validation (seeded by ``random_state``) so that ``predict_proba`` is available; logistic
        loss gives probabilities natively.
    """

    _allowed_losses = CLASSIFICATION_LOSSES
    _parameter_constraints = {
        **_JokerBase._parameter_constraints,
        "class_weight": [dict, StrOptions({"balanced"}), None],
        "probability": ["boolean"],
    }

    def __init__(self, loss="hinge", C=1.0, kernel="gaussian", sigma="median", gamma=None, nu=1.5,
                 n_features=None, features="cossin", block_size=None, max_iter=None, tol=None, epsilon=0.1,
                 delta=1.0, quantile=0.5, device="cpu", dtype="float64", random_state=None, verbose=False,
                 warm_start=False, max_time=None, class_weight=None, probability=False):
        self.loss = loss
        self.C = C
        self.kernel = kernel
        self.sigma = sigma
        self.gamma = gamma
        self.nu = nu
        self.n_features = n_features
        self.features = features
        self.block_size = block_size
        self.max_iter = max_iter
        self.tol = tol
        self.epsilon = epsilon
        self.delta = delta
        self.quantile = quantile
        self.device = device
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start = warm_start
        self.max_time = max_time
        self.class_weight = class_weight
        self.probability = probability

    def fit(self, X, y, sample_weight=None):
        """Fit on X (n, d) and labels y (n,) of any type with at least two classes."""
        self._validate_params()
        loss = self._loss_object()
        X, y = validate_data(self, _to_numpy(X), _to_numpy(y), dtype=[np.float64, np.float32])
        check_classification_targets(y)
        self.classes_, y_idx = np.unique(y, return_inverse=True)
        k = len(self.classes_)
        if k < 2:
            raise ValueError(
                f"y must contain at least 2 classes for JokerClassifier, got 1 class: {self.classes_[0]!r}"
            )
        sample_weight = _check_sample_weight(sample_weight, X, dtype=np.float64)
        sample_weight = sample_weight * self._class_weights(y_idx, k)[y_idx]
        if k == 2:
            Y = np.where(y_idx == 1, 1.0, -1.0).reshape(-1, 1)
        else:
            Y = np.where(y_idx[:, None] == np.arange(k)[None, :], 1.0, -1.0)
        self._fit_targets(X, Y, sample_weight, loss)
        self.calibrator_ = None
        if self.probability and loss.name != "logistic":
            self._fit_calibration(X, y_idx, sample_weight)
        return self

    def _class_weights(self, y_idx: np.ndarray, k: int) -> np.ndarray:
        if self.class_weight is None:
            return np.ones(k)
        if isinstance(self.class_weight, str):  # 'balanced'
            counts = np.bincount(y_idx, minlength=k).astype(np.float64)
            return len(y_idx) / (k * counts)
        cw = np.ones(k)
        for label, weight in self.class_weight.items():
            hits = np.nonzero(self.classes_ == label)[0]
            if hits.size == 0:
                raise ValueError(f"class_weight has the label {label!r}, which is not in y (classes {self.classes_})")
            if not np.isfinite(weight) or weight < 0:
                raise ValueError(f"class_weight[{label!r}] must be a non-negative number, got {weight!r}")
            cw[hits[0]] = float(weight)
        return cw

    def _fit_calibration(self, X, y_idx, sample_weight):
        """Platt scaling of out-of-fold decision values (3 folds, seeded)."""
        from sklearn.base import clone
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import StratifiedKFold

        k = len(self.classes_)
        D = np.zeros((X.shape[0], 1 if k == 2 else k))
        n_splits = max(2, min(3, int(np.bincount(y_idx).min())))
        if np.bincount(y_idx).min() < 2:
            raise ValueError("probability=True needs at least 2 samples of every class for calibration")
        folds = StratifiedKFold(n_splits=n_splits, shuffle=True, random_state=self._seed())
        base = clone(self).set_params(probability=False, warm_start=False)
        for tr, te in folds.split(X, y_idx):
            labels = self.classes_[y_idx[tr]]
            if len(np.unique(labels)) < k:
                continue
            m = clone(base).fit(X[tr], labels, sample_weight=sample_weight[tr])
            d = m.decision_function(X[te])
            D[te] = d.reshape(len(te), -1)
        self.calibrator_ = []
        for j in range(D.shape[1]):
            target = (y_idx == (1 if k == 2 else j)).astype(int)
            lr = LogisticRegression(C=1e6)
            lr.fit(D[:, j : j + 1], target)
            self.calibrator_.append((float(lr.coef_[0, 0]), float(lr.intercept_[0])))

    def decision_function(self, X) -> np.ndarray:
        """``f(X)``: shape (n,) for two classes (positive means ``classes_[1]``), (n, n_classes) otherwise."""
        F = self._decision(X)
        return F[:, 0] if F.shape[1] == 1 else F

    def predict(self, X) -> np.ndarray:
        """The class with the largest decision value (binary: ``classes_[1]`` when f > 0)."""
        D = self.decision_function(X)
        if D.ndim == 1:
            return self.classes_[(D > 0).astype(int)]
        return self.classes_[np.argmax(D, axis=1)]

    def _has_proba(self) -> bool:
        return (isinstance(self.loss, str) and self.loss == "logistic") or \
            (isinstance(self.loss, Loss) and self.loss.name == "logistic") or bool(self.probability)

    @available_if(_has_proba)
    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities: ``sigmoid(f)`` for logistic loss (one-vs-rest, normalised); for hinge
        losses the Platt calibration fitted with ``probability=True``."""
        check_is_fitted(self, "dual_coef_")
        if self.loss_.name == "logistic":
            D = self.decision_function(X)
            P = expit(D)
        elif getattr(self, "calibrator_", None):
            D = self.decision_function(X)
            D2 = D.reshape(len(D), -1)
            P = np.column_stack([expit(a * D2[:, j] + b) for j, (a, b) in enumerate(self.calibrator_)])
            P = P[:, 0] if D.ndim == 1 else P
        else:
            raise AttributeError(
                f"predict_proba is available for loss='logistic', or with probability=True; got loss={self.loss_.name!r}"
            )
        if P.ndim == 1:
            return np.column_stack([1.0 - P, P])
        return P / P.sum(axis=1, keepdims=True)

    @available_if(_has_proba)
    def predict_log_proba(self, X) -> np.ndarray:
        """``log(predict_proba(X))``."""
        return np.log(self.predict_proba(X))
