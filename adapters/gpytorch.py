"""GPyTorch bridge: translate GPyTorch kernels, and fit a GP posterior mean with Joker (:class:`JokerGP`).

Kernel translation (:func:`translate_kernel`)
---------------------------------------------
Hyperparameters are read through GPyTorch's constrained properties (``lengthscale``, ``outputscale``,
``alpha``), so whatever constraint or prior a module uses, the translated kernel has the values GPyTorch
itself evaluates with. The translation is a *snapshot*: changing the GPyTorch module afterwards does not
change the translated kernel.

============================================ ==========================================================
GPyTorch                                     joker_ext
============================================ ==========================================================
``RBFKernel`` (lengthscale l)                ``StationaryKernel('gaussian', sigma=l)``
``MaternKernel(nu=0.5)``                     ``StationaryKernel('laplacian', sigma=l)`` (Euclidean)
``MaternKernel(nu=1.5 / 2.5)``               ``StationaryKernel('matern', sigma=l, nu)``
``ard_num_dims=d``                           ``sigma`` is the vector of the d lengthscales
``ScaleKernel(base)`` (outputscale s)        the translated base with its output scale multiplied by s
``AdditiveKernel`` / ``k1 + k2``             :class:`joker_ext.kernels.SumKernel` of the translated parts
``RQKernel`` (l, alpha)                      :class:`~joker_ext.kernels.RationalQuadraticKernel` (exact), or
                                             with ``rq='quadrature'`` a SumKernel of Gaussians (see below)
``active_dims``                              :class:`~joker_ext.kernels.ActiveDimsKernel` (selects the
                                             columns first)
anything else (Linear, Polynomial, Periodic, :class:`joker_ext.kernels.CallableKernel` running the
products, a user's own kernel)               GPyTorch module's own evaluation block by block
============================================ ==========================================================

The mapping of GPyTorch's ``k(x, y)`` conventions: ``RBFKernel`` is ``exp(-||x - y||^2 / (2 l^2))``
(joker_ext's Gaussian with sigma = l, scikit-learn's ``gamma = 1 / (2 l^2)``); ``MaternKernel`` uses the
Euclidean distance scaled by ``l`` exactly like joker_ext's Matern family; ``RQKernel`` is
``(1 + ||x - y||^2 / (2 alpha l^2))^(-alpha)``.

Exact types are matched (``type(k) is RBFKernel``): a user's subclass that overrides ``forward`` is run
through its own evaluation, never mistaken for its parent. Kernels with a non-empty ``batch_shape``
(batched / multi-output GP) are refused with a ValueError.

``active_dims``: GPyTorch selects the columns in ``Kernel.__call__``; :class:`ScaleKernel` copies its
base kernel's ``active_dims`` and then calls ``base_kernel.forward`` (no second selection), and
:class:`AdditiveKernel` calls each part (each part selects its own columns). The translation follows
exactly these rules.

Rational quadratic and active-dims kernels
------------------------------------------
Both are core kernels (:class:`joker_ext.kernels.RationalQuadraticKernel`,
:class:`joker_ext.kernels.ActiveDimsKernel`, re-exported here): this adapter only translates to them. The RQ
kernel is a Gamma scale mixture of Gaussians, so its random features are *exact* (unbiased for the RQ kernel
itself; see its docstring for the derivation); ``rq='quadrature'`` describes it instead as a finite SumKernel of
Gaussians within ``rq_tol`` (:func:`joker_ext.kernels.rq_quadrature`). An active-dims kernel draws the base
kernel's features of the selected columns.

JokerGP
-------
See :class:`JokerGP`.
"""
from __future__ import annotations

import copy
import math
import warnings
from typing import Callable, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from joker_ext.data import BlockData
from joker_ext.defaults import CHUNK_ROWS, CONVERGENCE_WARN_GAP
from joker_ext.features import FeatureMap, make_feature_map
from joker_ext.kernels import (  # RQ and active-dims kernels live in the core; re-exported here
    ActiveDimsKernel,
    CallableKernel,
    GaussianKernel,
    Kernel,
    RationalQuadraticKernel,
    StationaryKernel,
    SumKernel,
    rq_quadrature,
)
from joker_ext.losses import Loss
from joker_ext.model import KernelModel
from joker_ext.plan import RANDOM_FEATURE_MODES, FitPlan, feature_map_for, make_fit_plan
from joker_ext.validation import (
    check_bool,
    check_choice,
    check_device,
    check_dtype,
    check_dtype_range,
    check_fit_finite,
    check_features,
    check_labels,
    check_loss,
    check_magnitude,
    check_n_features,
    check_predictions,
    check_number,
    check_positive,
    check_positive_int,
    check_targets,
    require_package,
)

__all__ = [
    "translate_kernel",
    "random_feature_map",
    "rq_quadrature",
    "RationalQuadraticKernel",
    "ActiveDimsKernel",
    "JokerGP",
]


def _gpytorch():
    return require_package("gpytorch", purpose="JokerGP and the GPyTorch kernel translation",
                           install="pip install gpytorch (or: pip install 'joker-ext[gpytorch]')")


# ============================================================================ feature maps


def random_feature_map(kernel: Kernel, n_features: int, *, form: str = "cossin", orthogonal: bool = False,
                       seed: Optional[int] = 0, compute_dtype: Optional[torch.dtype] = None) -> FeatureMap:
    """Random features of a translated kernel: :func:`joker_ext.features.make_feature_map` (the kernel builds its
    own map: RBF, Matern and RQ kernels, their scales, sums and active_dims), with the GPyTorch spelling of the
    error for a kernel that has none (Linear, Polynomial, Periodic, products, a user's own)."""
    n_features = check_positive_int("n_features", n_features)
    if not kernel.supports_random_features:
        raise ValueError(
            f"random features (n_features={n_features}) need RBF, Matern or RQ kernels (with ScaleKernel, sums and "
            f"active_dims); the kernel {getattr(kernel, 'name', None) or type(kernel).__name__} "
            "has no spectral description: use n_features=None (exact kernel)")
    return make_feature_map(kernel, n_features, form=form, orthogonal=orthogonal, seed=seed, compute_dtype=compute_dtype)


# ============================================================================ translation


class _GPyTorchEvaluator:
    """Evaluates a snapshot of a GPyTorch kernel module on two blocks (``to_dense`` of its lazy output).

    ``via_call=False`` runs ``module.forward`` (what ScaleKernel does with its base kernel: no second
    ``active_dims`` selection). A copy of the module is kept per (dtype, device) of the inputs.
    """

    def __init__(self, module, via_call: bool = True):
        snap = copy.deepcopy(module)
        snap.eval()
        for p in snap.parameters():
            p.requires_grad_(False)
        self.module = snap
        self.via_call = via_call
        self._copies: dict = {}

    def _get(self, dtype, device):
        key = (dtype, str(device))
        if key not in self._copies:
            self._copies[key] = copy.deepcopy(self.module).to(device=device, dtype=dtype)
        return self._copies[key]

    def __call__(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        from linear_operator import to_dense

        mod = self._get(X1.dtype, X1.device)
        with torch.no_grad():
            out = mod(X1, X2) if self.via_call else mod.forward(X1, X2)
            return to_dense(out)

    def __deepcopy__(self, memo):
        new = _GPyTorchEvaluator.__new__(_GPyTorchEvaluator)
        new.module, new.via_call, new._copies = self.module, self.via_call, {}
        return new

    def __getstate__(self):
        # the per-(dtype, device) copies are a cache (possibly on a device the unpickling machine lacks)
        return {"module": self.module, "via_call": self.via_call, "_copies": {}}


class _ConstantMeanFn:
    """``X -> m(X)`` of a constant mean (module level, so that a fitted JokerGP pickles)."""

    def __init__(self, value: float):
        self.value = value

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        return torch.full((X.shape[0],), self.value, dtype=X.dtype, device=X.device)


class _ModuleMeanFn:
    """``X -> m(X)`` from a snapshot of a GPyTorch mean module (module level, so that a fitted JokerGP pickles)."""

    def __init__(self, evaluator: "_GPyTorchEvaluator"):
        self.evaluator = evaluator

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        mod = self.evaluator._get(X.dtype, X.device)
        with torch.no_grad():
            out = mod(X)
        out = out.reshape(-1) if out.dim() > 1 and out.shape[-1] == X.shape[0] else out
        if out.shape != (X.shape[0],):
            raise ValueError(f"mean_module returned shape {tuple(out.shape)} for {X.shape[0]} points")
        return out.to(X.dtype)


def _float(value, what: str) -> float:
    t = value.detach().reshape(-1)
    if t.numel() != 1:
        raise ValueError(f"{what} must be a single value (batched GPyTorch kernels are not supported), got "
                         f"{t.numel()} values")
    return float(t.cpu().double())


def _lengthscale(k) -> Union[float, torch.Tensor]:
    ls = k.lengthscale.detach().cpu().double().reshape(-1)
    return float(ls) if ls.numel() == 1 else ls.clone()


def _types():
    gp = _gpytorch()
    K = gp.kernels
    rbf, matern = {K.RBFKernel}, {K.MaternKernel}
    try:
        from gpytorch.kernels import keops as _keops

        rbf.add(_keops.RBFKernel)
        matern.add(_keops.MaternKernel)
    except Exception:  # pragma: no cover - keops variants missing
        pass
    return K, rbf, matern


def _translate(k, via_call: bool, rq: str, rq_tol: float) -> Kernel:
    K, rbf_types, matern_types = _types()
    batch = getattr(k, "batch_shape", torch.Size([]))
    if len(batch) > 0:
        raise ValueError(
            "kernel must have an empty batch_shape (batched GPyTorch kernels are not supported: translate one kernel "
            f"per output), got batch_shape={tuple(batch)}"
        )
    t = type(k)
    if t is K.ScaleKernel:
        out = _translate(k.base_kernel, False, rq, rq_tol).scaled(_float(k.outputscale, "outputscale"))
    elif t is K.AdditiveKernel:
        out = SumKernel([_translate(p, True, rq, rq_tol) for p in k.kernels])
    elif t in rbf_types:
        out = GaussianKernel(_lengthscale(k))
    elif t in matern_types:
        nu = float(k.nu)
        if nu == 0.5:
            out = StationaryKernel("laplacian", _lengthscale(k))
        elif nu in (1.5, 2.5):
            out = StationaryKernel("matern", _lengthscale(k), nu)
        else:  # pragma: no cover - GPyTorch refuses other nu
            return CallableKernel(_GPyTorchEvaluator(k, via_call), name=type(k).__name__)
    elif t is K.RQKernel:
        rqk = RationalQuadraticKernel(_lengthscale(k), _float(k.alpha, "alpha"))
        out = rqk if rq == "exact" else rqk.quadrature(rq_tol)
    else:
        # Linear, Polynomial, Periodic, products, user kernels: the module's own evaluation, by blocks.
        # (__call__ applies the module's own active_dims; forward, used under a ScaleKernel, does not.)
        return CallableKernel(_GPyTorchEvaluator(k, via_call), name=type(k).__name__)
    dims = getattr(k, "active_dims", None)
    if via_call and dims is not None:
        out = ActiveDimsKernel(out, dims)
    return out


def translate_kernel(kernel, *, rq: str = "exact", rq_tol: float = 1e-3) -> Kernel:
    """Translate a GPyTorch kernel module into a :class:`joker_ext.kernels.Kernel` (see the module
    docstring for the table).

    Parameters
    ----------
    kernel : gpytorch.kernels.Kernel
    rq : {'exact', 'quadrature'}
        How ``RQKernel`` is described: :class:`~joker_ext.kernels.RationalQuadraticKernel` (exact; its random
        features are exact too), or a SumKernel of Gaussians within ``rq_tol`` of the kernel.
    rq_tol : float
        Maximum error of the quadrature (relative to the output scale).

    Returns
    -------
    Kernel
        A snapshot of the module's current hyperparameters.
    """
    gp = _gpytorch()
    if not isinstance(kernel, gp.kernels.Kernel):
        raise TypeError(
            f"kernel must be a gpytorch.kernels.Kernel, got {type(kernel).__module__}.{type(kernel).__name__}"
        )
    check_choice("rq", rq, ("exact", "quadrature"))
    rq_tol = check_number("rq_tol", rq_tol, low=0.0, high=1.0, low_open=True, high_open=True)
    return _translate(kernel, True, rq, rq_tol)


# ============================================================================ JokerGP


def _as_2d_inputs(x, name: str) -> torch.Tensor:
    """Inputs as an (n, d) float tensor (a 1-D input is one feature, as in GPyTorch); see
    :func:`joker_ext.validation.check_features`."""
    if not (torch.is_tensor(x) or isinstance(x, (np.ndarray, list, tuple))):
        raise TypeError(f"{name} must be a tensor, a numpy array, a map-style torch Dataset or a DataLoader over one, "
                        f"got {type(x).__name__}")
    return check_features(x, name, allow_1d=True, keep_memmap=False)


class JokerGP(torch.nn.Module):
    """The posterior mean of a GPyTorch GP, fitted by Joker on data too large for a Cholesky.

    Built from the modules a GPyTorch user already has (typically with hyperparameters learned on a
    subset by marginal likelihood)::

        jgp = JokerGP(model.covar_module, model.likelihood, model.mean_module, n_features=4096)
        jgp.fit(train_x, train_y)          # all the data
        mean = jgp.predict(test_x)         # tensor, the posterior mean

    What is solved. With the translated kernel ``k`` (output scale included, see
    :func:`translate_kernel`), the mean function ``m`` and the per-sample weights ``c_i``, Joker solves
    ``min_f 1/2 ||f||_H^2 + sum_i c_i l(y_i - m(x_i), f(x_i))`` and predicts ``m(x) + f(x)``:

    * ``GaussianLikelihood`` (noise s2): squared loss ``l = r^2 / 2`` with ``c_i = 1 / s2``. The dual
      solution is ``alpha = (K_o + s2 I)^{-1} (y - m)`` where ``K_o`` is the kernel matrix *with* the
      output scale o, i.e. exactly GPyTorch's posterior mean ``m(x) + k_o(x, X) alpha``. (With the unit
      kernel ``K = K_o / o`` this is ``C = o / s2``, CONVENTIONS.md section 2; joker_ext keeps o inside the
      kernel, so C = 1 / s2: :func:`joker_ext.conversions.gp_noise_to_C_scaled`.)
      ``FixedNoiseGaussianLikelihood`` gives per-sample ``c_i = 1 / noise_i`` (plus its learned second
      noise when it has one), the heteroscedastic posterior mean.
    * ``BernoulliLikelihood``: logistic loss with ``c_i = 1``, i.e. the MAP / Laplace mode of GP
      classification with the *logistic* link. GPyTorch's Bernoulli likelihood uses the probit link
      ``Phi(f)`` and a variational posterior, so the two latent functions agree in sign and shape, not in
      value. Labels 0/1 (GPyTorch's) or -1/+1. Only a zero mean is supported with it (a mean function
      would be an offset inside the loss); a non-zero mean raises ValueError.
    * ``loss=``: any registered loss name or Loss object replaces the likelihood's, keeping its ``c_i``:
      ``'huber'`` (``delta``), ``'pinball'`` (``quantile``), ``'epsilon_insensitive'``, ``'absolute'`` for
      robust or quantile regression with a Gaussian likelihood's noise as the scale (Huber with a large
      delta is the GP posterior mean); ``'hinge'`` etc. with a Bernoulli likelihood.
    * ``C=`` replaces the likelihood's ``c_i`` by one constant.

    The mean function is handled as GPyTorch does: ``m`` is subtracted from the targets before the fit
    and added at prediction (ZeroMean, ConstantMean, LinearMean, any ``gpytorch.means.Mean``).

    Parameters
    ----------
    covar_module : gpytorch.kernels.Kernel
        Translated by :func:`translate_kernel` at fit (RQ exact).
    likelihood : GaussianLikelihood, FixedNoiseGaussianLikelihood or BernoulliLikelihood
    mean_module : gpytorch.means.Mean, optional
        None means a zero mean.
    loss : str or Loss, optional
        Overrides the likelihood's loss (see above).
    C : float, optional
        Overrides the likelihood's per-sample weights.
    n_features : int, optional
        None: exact kernel (cost O(n^2) kernel evaluations per pass). An int: that many random Fourier
        features (RBF, Matern, RQ, their scales, sums and active_dims; :func:`random_feature_map`).
    features : {'cossin', 'cos', 'orf'}
        Random-feature form (pairs, random phases, orthogonal random features).
    block_size : int, optional
        Rows per block. Default: a single block (``block_size = n``) with the exact trust-region
        subproblem (eigendecomposition) in exact mode when ``n <= 2048``: float64 fits then reach machine
        precision in tens of iterations. Otherwise the seed paper's sizes
        (:func:`joker_ext.defaults.default_block_size`).
    max_iter : int, optional
        Block iterations (default: 50 passes over the blocks, at least 200).
    tol : float, optional
        Relative duality gap to stop at (default 1e-14 in float64, 1e-7 in float32).
    max_time : float, optional
        Time budget in seconds.
    delta, epsilon, quantile : float
        Parameters of the huber, epsilon_insensitive and pinball losses.
    predictive_variance : bool
        Random features with the squared loss only: also factor the M x M posterior precision
        ``I + Phi^T diag(c) Phi`` (Bayesian linear regression in feature space, the exact GP posterior of
        the feature kernel) so that ``predict(x, return_var=True)`` gives the latent variance. Costs
        ``O(n M^2)`` once and ``M^2`` memory: for small M. Exact mode has no predictive variance.
    seed : int
        Seeds the block partition, the block choice and the random features.
    fit_intercept : bool, default False
        Add an unregularized constant ``b`` to the latent function: ``m(x) + f(x) + b`` with ``f`` penalised
        and ``b`` not (the GP with a flat prior on a constant offset; for the Gaussian likelihood on the exact
        kernel, the solution of ``[[K_o + s2 I, 1], [1^T, 0]] [alpha; b] = [y - m; 0]``). Fitted by the engine
        when it can, else by the intercept search of :mod:`joker_ext.intercept` (``fit_plan_.intercept``);
        ``intercept_`` holds ``b``. Not with ``predictive_variance``.
    dtype : torch dtype or 'float32' / 'float64'
    device : str or torch.device, optional
        Device of the fit (default: the device of ``train_x`` when it is a tensor, else the CPU).
    verbose : bool
        Progress bar.

    Attributes
    ----------
    alpha_ : Tensor (n,)
        Dual coefficients (buffer).
    X_train_ : Tensor (n, d)
        Training inputs (buffer; exact mode only, empty with random features).
    beta_ : Tensor (M,)
        Feature-space weights (buffer; random features only).
    precision_chol_ : Tensor (M, M)
        Cholesky factor of the feature-space posterior precision (buffer; ``predictive_variance=True``).
    intercept_ : Tensor (1,)
        The fitted intercept ``b`` (buffer; ``fit_intercept=True``, empty without).
    n_intercept_rounds_ : int
        Engine solves of the intercept search (1 when the engine fits the intercept, 0 without one).
    kernel_, feature_map_, loss_ : the translated kernel, feature map and loss
    n_iter_, status_, relative_gap_, history_ : solver report
    fit_plan_ : joker_ext.plan.FitPlan
        What the fit ran (:func:`joker_ext.plan.make_fit_plan`): kernel, feature map, costs, engine, options.

    Notes
    -----
    ``state_dict`` holds the GPyTorch modules' parameters and the fitted buffers; a JokerGP built with the
    same arguments loads it and predicts identically (the random features are redrawn from ``seed``).
    The modules are read at fit (and when a state dict is loaded): changing them afterwards has no effect
    on predictions until the next fit.

    Inputs: tensors or numpy arrays (``train_x`` of shape (n, d), or (n,) for one feature as in GPyTorch),
    a map-style ``torch.utils.data.Dataset`` whose items are ``(x, y)`` pairs (``train_y`` then optional),
    or a ``DataLoader`` over one (its ``dataset`` is used; batching and shuffling are the solver's). The
    solver revisits blocks of rows in random order, so an ``IterableDataset`` cannot be used (TypeError).
    In exact mode the inputs are gathered into one (n, d) tensor (the fit costs O(n^2) anyway); with random
    features the Dataset is read block by block.
    """

    _FIT_BUFFERS = ("alpha_", "X_train_", "beta_", "precision_chol_", "fit_shape_", "intercept_")

    def __init__(self, covar_module, likelihood, mean_module=None, *, loss=None, C: Optional[float] = None,
                 n_features: Optional[int] = None, features: str = "cossin", block_size: Optional[int] = None,
                 max_iter: Optional[int] = None, tol: Optional[float] = None, max_time: Optional[float] = None,
                 delta: float = 1.0, epsilon: float = 0.1, quantile: float = 0.5, predictive_variance: bool = False,
                 seed: int = 0, dtype=torch.float64, device=None, verbose: bool = False, fit_intercept: bool = False):
        super().__init__()
        self.fit_intercept = fit_intercept
        self.covar_module = covar_module
        self.likelihood = likelihood
        self.mean_module = mean_module
        self.loss = loss
        self.C = C
        self.n_features = n_features
        self.features = features
        self.block_size = block_size
        self.max_iter = max_iter
        self.tol = tol
        self.max_time = max_time
        self.delta = delta
        self.epsilon = epsilon
        self.quantile = quantile
        self.predictive_variance = predictive_variance
        self.seed = seed
        self.dtype = dtype
        self.device = device
        self.verbose = verbose
        for name in self._FIT_BUFFERS:
            self.register_buffer(name, torch.empty(0))
        self._model_cache: Optional[KernelModel] = None
        self._mean_eval = None
        self.kernel_ = None
        self.feature_map_ = None
        self.loss_ = None

    @classmethod
    def from_model(cls, model, **kwargs) -> "JokerGP":
        """Build from a GPyTorch model with ``covar_module``, ``likelihood`` and ``mean_module`` attributes."""
        for attr in ("covar_module", "likelihood"):
            if not hasattr(model, attr):
                raise TypeError(f"model must have a {attr!r} attribute (a GPyTorch ExactGP-style model), "
                                f"got {type(model).__name__}")
        return cls(model.covar_module, model.likelihood, getattr(model, "mean_module", None), **kwargs)

    # ------------------------------------------------------------------ validation helpers
    @property
    def is_fitted(self) -> bool:
        return self.alpha_.numel() > 0

    def _likelihood_kind(self) -> str:
        gp = _gpytorch()
        L = gp.likelihoods
        lik = self.likelihood
        if isinstance(lik, L.FixedNoiseGaussianLikelihood):
            return "fixed_noise"
        if isinstance(lik, L.GaussianLikelihood):
            return "gaussian"
        if isinstance(lik, L.BernoulliLikelihood):
            return "bernoulli"
        raise TypeError(
            "likelihood must be a gpytorch GaussianLikelihood, FixedNoiseGaussianLikelihood or BernoulliLikelihood, "
            f"got {type(lik).__module__}.{type(lik).__name__}"
        )

    def _resolve_loss(self, kind: str) -> Loss:
        default = "logistic" if kind == "bernoulli" else "squared"
        loss = check_loss(default if self.loss is None else self.loss, delta=self.delta, epsilon=self.epsilon,
                          quantile=self.quantile)
        if self.loss is None:
            return loss
        if kind == "bernoulli" and not loss.margin:
            raise ValueError("loss must be a classification loss ('logistic', 'hinge' or 'squared_hinge') with "
                             f"BernoulliLikelihood, got the regression loss {loss.name!r}")
        if kind != "bernoulli" and loss.margin:
            raise ValueError("loss must be a regression loss with a Gaussian likelihood (or use BernoulliLikelihood), "
                             f"got the classification loss {loss.name!r}")
        return loss

    def _weights(self, kind: str, n: int) -> torch.Tensor:
        if self.C is not None:
            return torch.full((n,), check_positive("C", self.C), dtype=torch.float64)
        if kind == "bernoulli":
            return torch.ones(n, dtype=torch.float64)
        with torch.no_grad():
            noise = self.likelihood.noise.detach().cpu().double().reshape(-1)
        if kind == "fixed_noise":
            if noise.numel() != n:
                raise ValueError(f"FixedNoiseGaussianLikelihood noise must have one value per row of train_x ({n}), "
                                 f"got {noise.numel()} values")
        elif noise.numel() != 1:
            raise ValueError(f"GaussianLikelihood noise must be a single value, got {noise.numel()} (batched likelihood)")
        if not bool(torch.all(torch.isfinite(noise))) or not bool(torch.all(noise > 0)):
            bad = noise[~torch.isfinite(noise) | (noise <= 0)][:3].tolist()
            raise ValueError(f"likelihood.noise must be positive and finite, got values such as {bad}")
        return (1.0 / noise).expand(n).clone() if noise.numel() == 1 else 1.0 / noise

    def _mean_snapshot(self):
        """A function X -> m(X) (float64 tensor) from a snapshot of mean_module, or None for a zero mean."""
        gp = _gpytorch()
        mm = self.mean_module
        if mm is None or isinstance(mm, gp.means.ZeroMean):
            return None
        if not isinstance(mm, gp.means.Mean):
            raise TypeError(f"mean_module must be a gpytorch.means.Mean or None, got {type(mm).__name__}")
        if isinstance(mm, gp.means.ConstantMean) and type(mm) is gp.means.ConstantMean:
            const = mm.constant.detach().cpu().double().reshape(-1)
            if const.numel() != 1:
                raise ValueError(f"batched ConstantMean (shape {tuple(mm.constant.shape)}) is not supported")
            value = float(const)
            if value == 0.0:
                return None
            return _ConstantMeanFn(value)
        return _ModuleMeanFn(_GPyTorchEvaluator(mm))  # snapshot; evaluated per dtype / device

    def _resolve_data(self, train_x, train_y):
        """Returns (X source for BlockData or tensor, y tensor (n,), n, d)."""
        from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

        src = train_x
        if isinstance(src, DataLoader):
            src = src.dataset
        if isinstance(src, IterableDataset):
            raise TypeError(
                "train_x is an IterableDataset (or a DataLoader over one); JokerGP needs random access to blocks "
                "of rows: pass a map-style Dataset (with __getitem__ and __len__), a tensor or a numpy array"
            )
        if isinstance(src, Dataset):
            if isinstance(src, TensorDataset):
                X = _as_2d_inputs(src.tensors[0], "train_x")
                if train_y is None:
                    if len(src.tensors) < 2:
                        raise ValueError("train_x is a TensorDataset without targets; pass train_y")
                    train_y = src.tensors[1]
                return X, train_y
            if not hasattr(src, "__len__"):
                raise TypeError("train_x is a Dataset without __len__; JokerGP needs a map-style Dataset of known length")
            n = len(src)
            if n == 0:
                raise ValueError("train_x must have at least one row, got an empty Dataset")
            if train_y is None:
                first = src[0]
                if not isinstance(first, (tuple, list)) or len(first) < 2:
                    raise TypeError("train_x is a Dataset whose items are not (x, y) pairs; pass train_y, or make "
                                    "the items (x, y) tuples")
                train_y = torch.stack([torch.as_tensor(src[i][1]).reshape(()) for i in range(n)])
            return src, train_y
        return _as_2d_inputs(train_x, "train_x"), train_y

    # ------------------------------------------------------------------ fit / predict
    def fit(self, train_x, train_y=None) -> "JokerGP":
        """Fit the posterior mean (or the loss's minimiser) on all of ``train_x``.

        Parameters
        ----------
        train_x : Tensor (n, d) or (n,), ndarray, map-style Dataset of (x, y), or DataLoader over one
        train_y : Tensor (n,), optional when ``train_x`` yields (x, y) pairs
            Real targets (Gaussian likelihood) or labels in {0, 1} / {-1, +1} (Bernoulli).
        """
        kind = self._likelihood_kind()
        loss = self._resolve_loss(kind)
        self._check_params()
        if self.predictive_variance and (self.n_features is None or loss.name != "squared"):
            raise ValueError("predictive_variance=True needs random features (n_features) and the squared loss "
                             f"(got n_features={self.n_features!r}, loss={loss.name!r})")
        if self.predictive_variance and self.fit_intercept:
            raise ValueError("predictive_variance=True is the posterior of a model without intercept: it cannot be "
                             "combined with fit_intercept=True, got both")
        dtype = check_dtype(self.dtype)
        device = check_device(self.device)
        X_src, y = self._resolve_data(train_x, train_y)
        if device is None:
            device = X_src.device if torch.is_tensor(X_src) else torch.device("cpu")
        data = BlockData(X_src, dtype, device)
        n, d = data.n, data.d
        if torch.is_tensor(X_src):
            check_magnitude(X_src, "train_x", dtype=dtype)
        else:  # a map-style Dataset: one pass, block by block
            for start, stop, Xc in data.chunks(CHUNK_ROWS):
                check_features(Xc, f"train_x (rows {start} to {stop - 1})")
                check_magnitude(Xc, f"train_x (rows {start} to {stop - 1})", dtype=dtype, d=d)
        y, _ = check_targets(y, n, "train_y", dtype=torch.float64, x_name="train_x", ndim=(1,))
        check_magnitude(y, "train_y", dtype=dtype, d=1)
        y = y[:, 0].detach().to(device=device)

        self.kernel_ = translate_kernel(self.covar_module, rq="exact")
        self._mean_eval = self._mean_snapshot()
        self.loss_ = loss
        c = self._weights(kind, n)
        if kind == "bernoulli":
            Y = check_labels(y.reshape(n, 1), "train_y", context=f"BernoulliLikelihood with loss {loss.name!r}",
                             allowed=("01", "pm1"))[:, 0].clone()
            if self._mean_eval is not None:
                raise ValueError("mean_module must be ZeroMean or None with BernoulliLikelihood (a mean would be an "
                                 "offset inside the logistic loss), got a non-zero mean_module "
                                 f"{type(self.mean_module).__name__}")
        else:
            Y = y.clone()
            if self._mean_eval is not None:
                for start, stop, Xc in data.chunks(CHUNK_ROWS):
                    Y[start:stop] -= self._mean_eval(Xc.to(torch.float64)).to(Y.device)
                check_features(Y.reshape(n, 1), "train_y - mean_module(train_x)")
        scale = n * max(1.0, float(Y.abs().max()))
        cost = "C" if self.C is not None else "1 / likelihood.noise (the per-sample cost c_i)"
        check_dtype_range(cost, c, dtype, scale=scale,
                          hint=f" for n={n} and max|y|={float(Y.abs().max()):.3g}: change it or use dtype=torch.float64")

        exact = self.n_features is None
        if exact:
            X_tensor = data.all()
            data = BlockData(X_tensor, dtype, device)
        plan = self._fit_plan(loss, c, n, dtype, device)
        self.feature_map_ = plan.feature_map
        self.fit_plan_ = plan
        opts = plan.options
        model = plan.fit(data, Y.reshape(n, 1))
        res = model.result
        check_fit_finite(cost, float(c.max()), model.alpha, model.beta, res.primal if res.history else None)
        self.alpha_ = model.alpha[:, 0].detach().clone()
        self.X_train_ = data.all().detach().clone() if exact else torch.empty(0, dtype=dtype, device=device)
        self.beta_ = torch.empty(0, dtype=dtype, device=device) if exact else model.beta[:, 0].detach().clone()
        self.fit_shape_ = torch.tensor([n, d], dtype=torch.long, device=device)
        self.precision_chol_ = torch.empty(0, dtype=dtype, device=device)
        # the unregularized intercept: fitted by the engine or by joker_ext.intercept's search (fit_plan_.intercept)
        self.intercept_ = res.state["intercept"].reshape(1).to(device=device, dtype=dtype).clone() \
            if self.fit_intercept else torch.empty(0, dtype=dtype, device=device)
        self.n_intercept_rounds_ = int(res.state["intercept_rounds"]) if "intercept_rounds" in res.state else \
            int(bool(self.fit_intercept))
        if self.predictive_variance:
            self.precision_chol_ = self._precision_factor(data, c.to(device=device, dtype=dtype))
        self.n_iter_ = res.n_iter
        self.status_ = res.status
        self.relative_gap_ = res.rel_gap
        self.history_ = res.history
        self.block_size_ = opts.block_size
        self._model_cache = None
        tol = opts.tol
        if res.status == "max_iter" and res.rel_gap > max(tol, CONVERGENCE_WARN_GAP):
            from sklearn.exceptions import ConvergenceWarning

            warnings.warn(f"JokerGP stopped after max_iter={opts.max_iter} block iterations with relative duality "
                          f"gap {res.rel_gap:.2e}; increase max_iter", ConvergenceWarning, stacklevel=2)
        return self

    def _check_params(self) -> None:
        """The numeric and string parameters (see joker_ext.validation); likelihood, loss and modules are
        checked where they are read."""
        check_choice("features", self.features, RANDOM_FEATURE_MODES)
        check_positive_int("n_features", self.n_features, allow_none=True)
        check_positive_int("block_size", self.block_size, allow_none=True)
        check_positive_int("max_iter", self.max_iter, allow_none=True)
        check_positive("tol", self.tol, allow_zero=True, allow_none=True)
        check_positive("max_time", self.max_time, allow_none=True)
        check_positive_int("seed", self.seed, low=0)
        check_positive("C", self.C, allow_none=True)
        check_bool("fit_intercept", self.fit_intercept)

    def _random_feature_map(self) -> FeatureMap:
        """The random-feature map of ``kernel_`` for ``n_features``, ``features`` and ``seed``."""
        return feature_map_for(self.kernel_, self.features, int(self.n_features), seed=self.seed,
                               random_features=random_feature_map)

    def _fit_plan(self, loss: Loss, c: torch.Tensor, n: int, dtype: torch.dtype, device: torch.device) -> FitPlan:
        """The fit plan (:func:`joker_ext.plan.make_fit_plan`) with the per-sample costs ``c`` of the likelihood
        (``C`` times ones when ``C`` is given).

        Exact kernel on at most 2048 rows without a ``block_size``: one block with the exact trust-region
        subproblem (float64 fits then reach machine precision in tens of iterations); the iteration budget is
        DBCD-TR's block iterations (50 passes over the blocks, at least 200) whatever the engine."""
        given = self.C is not None
        return make_fit_plan(self.kernel_, loss, n=n, C=self.C if given else 1.0, sample_weight=None if given else c,
                             features="exact" if self.n_features is None else self.features,
                             n_features=self.n_features, seed=self.seed, random_features=random_feature_map,
                             tol=self.tol, block_size=self.block_size, single_exact_block=True,
                             max_iter=self.max_iter, iteration_budget="blocks", max_time=self.max_time,
                             verbose=bool(self.verbose), dtype=dtype, device=device, intercept=self.fit_intercept)

    def _precision_factor(self, data: BlockData, c: torch.Tensor) -> torch.Tensor:
        fm = self.feature_map_
        M = fm.n_features
        A = torch.eye(M, dtype=data.dtype, device=data.device)
        for start, stop, Xc in data.chunks(CHUNK_ROWS):
            Phi = fm(Xc)
            A += Phi.T @ (Phi * c[start:stop].unsqueeze(1))
        return torch.linalg.cholesky(0.5 * (A + A.T))

    def _check_fitted(self):
        if not self.is_fitted:
            raise RuntimeError("this JokerGP is not fitted yet; call fit(train_x, train_y) first")

    def _model(self) -> KernelModel:
        if self._model_cache is not None and self._model_cache.alpha.device == self.alpha_.device \
                and self._model_cache.alpha.dtype == self.alpha_.dtype:
            return self._model_cache
        if self.kernel_ is None:  # after load_state_dict
            self._snapshot_from_modules()
        alpha = self.alpha_.reshape(-1, 1)
        if self.X_train_.numel() > 0:
            data = BlockData(self.X_train_, self.alpha_.dtype, self.alpha_.device)
            self._model_cache = KernelModel(self.kernel_, None, data, alpha, None)
        else:
            data = BlockData(torch.empty(0, int(self.fit_shape_[1]), dtype=alpha.dtype, device=alpha.device),
                             alpha.dtype, alpha.device)
            self._model_cache = KernelModel(self.kernel_, self.feature_map_, data, alpha, self.beta_.reshape(-1, 1))
        return self._model_cache

    def _snapshot_from_modules(self):
        self.kernel_ = translate_kernel(self.covar_module, rq="exact")
        self._mean_eval = self._mean_snapshot()
        self.loss_ = self._resolve_loss(self._likelihood_kind())
        if self.beta_.numel() > 0:
            self.feature_map_ = self._random_feature_map()
        else:
            self.feature_map_ = None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        for name in self._FIT_BUFFERS:
            key = prefix + name
            if key in state_dict:
                cur = self._buffers.get(name)
                dev = cur.device if cur is not None else torch.device("cpu")
                self._buffers[name] = torch.empty_like(state_dict[key], device=dev)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        key = prefix + "intercept_"
        if key not in state_dict and key in missing_keys:  # saved before fit_intercept existed: no intercept
            missing_keys.remove(key)
            self._buffers["intercept_"] = torch.empty(0, dtype=self.alpha_.dtype, device=self.alpha_.device)
        self.kernel_ = None
        self._model_cache = None

    def _test_inputs(self, test_x) -> torch.Tensor:
        X = _as_2d_inputs(test_x, "test_x")
        check_n_features(X, int(self.fit_shape_[1]), "test_x")
        check_magnitude(X, "test_x", dtype=self.alpha_.dtype)
        return X.to(device=self.alpha_.device, dtype=self.alpha_.dtype)

    @torch.no_grad()
    def predict(self, test_x, return_var: bool = False):
        """Posterior mean ``m(x) + f(x)`` at ``test_x`` (latent mean / MAP for classification).

        Parameters
        ----------
        test_x : Tensor (m, d) or (m,)
        return_var : bool
            Also return the latent posterior variance (needs ``predictive_variance=True``, random features).
            Like GPyTorch's ``model(x).variance``, it excludes the likelihood noise.

        Returns
        -------
        Tensor (m,), or (mean, variance) with ``return_var``; on the device and in the dtype of the fitted
        buffers.
        """
        self._check_fitted()
        X = self._test_inputs(test_x)
        model = self._model()
        f = model.decision(X)[:, 0]
        if self.intercept_.numel() > 0:  # fit_intercept=True
            f = f + self.intercept_.to(device=f.device, dtype=f.dtype)
        if self._mean_eval is not None:
            f = f + self._mean_eval(X).to(device=f.device, dtype=f.dtype)
        f = check_predictions(f, name="test_x", hint=": refit with a smaller C (or larger noise) or in float64")
        if not return_var:
            return f
        if self.precision_chol_.numel() == 0:
            raise ValueError("predictive variance is available with n_features set and predictive_variance=True "
                             "(Bayesian linear regression in feature space); exact mode gives the mean only")
        var = torch.empty_like(f)
        L = self.precision_chol_
        for start in range(0, X.shape[0], CHUNK_ROWS):
            Phi = self.feature_map_(X[start:start + CHUNK_ROWS])
            Z = torch.linalg.solve_triangular(L, Phi.T, upper=False)
            var[start:start + CHUNK_ROWS] = (Z * Z).sum(0)
        return f, var

    def forward(self, test_x):
        """``module(test_x)`` is :meth:`predict`."""
        return self.predict(test_x)

    @torch.no_grad()
    def predict_proba(self, test_x) -> torch.Tensor:
        """Probability of the positive class, ``sigmoid(f(x))`` (BernoulliLikelihood with the logistic loss)."""
        self._check_fitted()
        if self._likelihood_kind() != "bernoulli" or self.loss_ is None or self.loss_.name != "logistic":
            raise ValueError("predict_proba needs BernoulliLikelihood with the logistic loss")
        return torch.sigmoid(self.predict(test_x))

    def extra_repr(self) -> str:
        mode = "exact" if self.n_features is None else f"n_features={self.n_features}"
        return f"{mode}, loss={self.loss!r}, fitted={self.is_fitted}"
