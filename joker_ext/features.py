"""Feature maps ``phi: R^d -> R^M`` with ``phi(x)^T phi(y) ~ k(x, y)``.

Random Fourier features (Bochner): a stationary kernel ``k(x, y) = s * kappa(x - y)`` is the Fourier
transform of a probability density p(w), so with w_j ~ p and b_j ~ U[0, 2 pi]

* ``form='cos'``    : ``phi(x) = sqrt(2 s / M) cos(W^T x + b)``           (random phase)
* ``form='cossin'`` : ``phi(x) = sqrt(s / m) [cos(W^T x), sin(W^T x)]``   (m = M / 2 frequencies; lower
  variance). For odd ``M`` the last column is one random-phase cosine, weighted so the map stays unbiased.

The spectral density belongs to the kernel: a kernel with one (:class:`joker_ext.kernels.SpectralKernel`:
the stationary families, the rational quadratic kernel) draws its own frequencies
(``kernel.spectral_frequencies(d, m, generator, orthogonal=...)``, already divided by its lengthscales) and
carries its own scale (``kernel.outputscale``, the ``s`` above); :class:`RandomFeatureMap` only evaluates the
cosines. ``kernel.random_features(...)`` builds the map of any kernel (sums concatenate their parts' maps,
active-dims kernels select columns first), and :func:`make_feature_map` just asks the kernel, so a new kernel
with a spectral density needs no change here.

``orthogonal=True`` draws the directions of the frequencies as blocks of orthonormal vectors and their
lengths from the family's radial law (chi(d) for the Gaussian), which lowers the approximation error at
the same M for the radial families (Yu et al., 2016).

A Nystrom map ``phi(x) = K(x, Z) R^{-1}`` with ``K_ZZ = R^T R`` is also provided: it is the feature
map of Falkon's model, so a linear model on it solves Falkon's problem.

All random draws happen on the CPU in float64 from a ``torch.Generator`` seeded with ``seed``, so the
same seed gives the same features on every device and dtype.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

import torch

from .dense import cholesky_ex

if TYPE_CHECKING:  # joker_ext.kernels imports this module (kernels build their feature maps); not the other way
    from .kernels import Kernel

__all__ = ["FeatureMap", "RandomFeatureMap", "ConcatFeatureMap", "ColumnsFeatureMap", "NystromFeatureMap",
           "make_feature_map", "sum_feature_map", "feature_mode_options", "no_random_features_message"]

FEATURE_FORMS = ("cos", "cossin")
#: Rows per block of :meth:`RandomFeatureMap.pass_features` on the CPU (``X W`` of a block stays in cache).
ROW_BLOCK = 256


class FeatureMap:
    """Base class: ``phi = feature_map(X)`` returns an (n, n_features) tensor in X's dtype and device."""

    n_features: int

    def __call__(self, X: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def to(self, device=None, dtype=None) -> "FeatureMap":
        """Feature maps keep their parameters in float64 on the CPU and cast on use; returns self."""
        return self

    def expected_gram(self, X1: torch.Tensor, X2: torch.Tensor) -> Optional[torch.Tensor]:
        """``E[phi(X1) phi(X2)^T]`` over the random draw, when the map is an unbiased estimator of a kernel
        that can be evaluated (then it is that kernel's matrix); None otherwise (Nystrom features)."""
        return None


class RandomFeatureMap(FeatureMap):
    """Random Fourier features of a kernel with a spectral density (:class:`~joker_ext.kernels.SpectralKernel`).

    ``phi(x) = sqrt(2 s / M) [cos(W^T x) | sin(W^T x)]`` (or random-phase cosines), with the frequencies
    ``W = kernel.spectral_frequencies(d, m, generator, orthogonal=orthogonal)`` and the scale
    ``s = kernel.outputscale = k(x, x)``; see the module docstring.

    Parameters
    ----------
    kernel : SpectralKernel
        Any kernel with ``supports_random_features``, ``spectral_frequencies`` and ``outputscale`` (the
        stationary families, the rational quadratic kernel, a user's own).
    n_features : int
        Number of columns M of ``phi(X)``.
    form : {'cossin', 'cos'}, default 'cossin'
        Cos/sin pairs or random-phase cosines (see the module docstring).
    orthogonal : bool, default False
        Orthogonal random features (kernels with a radial spectral density: ``supports_orthogonal_features``).
    seed : int, default 0
        Seed of the draws; the same seed gives the same map.
    compute_dtype : torch.dtype, optional
        Precision in which ``X W`` and the cosines are evaluated (the result is returned in ``X``'s
        dtype). None: ``X``'s own. ``torch.float32`` for float32 data solved in float64 halves the cost
        of the features (the trigonometric functions dominate it) and loses nothing the data had; the
        fit, the duality gap and predictions use the same map. (A one-row batch may differ from a
        many-row one in the last float32 bit: the matrix product takes another code path.)
    """

    def __init__(
        self,
        kernel: "Kernel",
        n_features: int,
        *,
        form: str = "cossin",
        orthogonal: bool = False,
        seed: Optional[int] = 0,
        compute_dtype: Optional[torch.dtype] = None,
    ):
        if not (getattr(kernel, "supports_random_features", False) and hasattr(kernel, "spectral_frequencies")):
            raise TypeError(no_random_features_message(kernel, n_features))
        if isinstance(n_features, bool) or not isinstance(n_features, int) or n_features < 1:
            raise ValueError(f"n_features must be a positive integer, got {n_features!r}")
        if form not in FEATURE_FORMS:
            raise ValueError(f"form must be one of {FEATURE_FORMS}, got {form!r}")
        if orthogonal and not getattr(kernel, "supports_orthogonal_features", False):
            name = getattr(kernel, "family", None) or _kernel_name(kernel)
            raise ValueError(f"orthogonal random features need a radial kernel; {name} is not radial")
        self.kernel = kernel
        self.n_features = int(n_features)
        self.form = form
        self.orthogonal = bool(orthogonal)
        self.seed = 0 if seed is None else int(seed)
        if compute_dtype is not None and compute_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"compute_dtype must be None, torch.float32 or torch.float64, got {compute_dtype!r}")
        self.compute_dtype = compute_dtype
        self.input_dim: Optional[int] = None
        self._W: Optional[torch.Tensor] = None  # (d, m) float64, already divided by sigma
        self._b: Optional[torch.Tensor] = None  # (m,) phases for the random-phase columns
        self._n_pairs = 0
        self._cache: dict = {}

    # ------------------------------------------------------------------ sampling
    def _draw(self, d: int) -> None:
        """``m`` frequencies from the kernel's spectral density, then ``m`` phases ``b ~ U[0, 2 pi]``, all from one
        generator seeded with ``seed`` (CPU, float64)."""
        gen = torch.Generator().manual_seed(self.seed)
        M = self.n_features
        if self.form == "cossin":
            self._n_pairs = M // 2
            m = self._n_pairs + (M % 2)
        else:
            self._n_pairs = 0
            m = M
        W = self.kernel.spectral_frequencies(d, m, gen, orthogonal=self.orthogonal)
        b = 2.0 * math.pi * torch.rand(m, generator=gen, dtype=torch.float64)
        self._W, self._b, self.input_dim = W, b, d
        self._cache = {}

    def fit(self, d: int) -> "RandomFeatureMap":
        """Draw the frequencies for inputs of dimension ``d`` (done automatically on first use)."""
        if self.input_dim != d:
            self._draw(int(d))
        return self

    def _params(self, dtype, device):
        key = (dtype, str(device))
        if key not in self._cache:
            self._cache[key] = (self._W.to(device=device, dtype=dtype), self._b.to(device=device, dtype=dtype))
        return self._cache[key]

    # ------------------------------------------------------------------ evaluation
    def _check_input(self, X: torch.Tensor) -> None:
        """``X`` must be (n, d) with the map's ``d`` (drawn on first use when not set yet)."""
        if X.dim() != 2:
            raise ValueError(f"X must be 2-D, got shape {tuple(X.shape)}")
        if self.input_dim is None:
            self.fit(X.shape[1])
        elif X.shape[1] != self.input_dim:
            raise ValueError(f"X has {X.shape[1]} features, the feature map was drawn for {self.input_dim}")

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        """Return ``phi(X)``, an (n, n_features) tensor (see the module docstring for the scaling)."""
        self._check_input(X)
        cd = getattr(self, "compute_dtype", None)
        if cd is not None and X.dtype != cd:
            return self._evaluate(X.to(cd)).to(X.dtype)
        return self._evaluate(X)

    def _evaluate(self, X: torch.Tensor) -> torch.Tensor:
        W, b = self._params(X.dtype, X.device)
        s = self.kernel.outputscale
        M = self.n_features
        if self.form == "cos":
            Z = torch.addmm(b, X, W)
            Z.cos_()
            return Z.mul_(math.sqrt(2.0 * s / M))
        Z = X @ W
        p = self._n_pairs
        out = torch.empty(X.shape[0], M, dtype=X.dtype, device=X.device)
        scale = math.sqrt(2.0 * s / M)  # = sqrt(s / m) for even M
        torch.cos(Z[:, :p], out=out[:, :p])
        torch.sin(Z[:, :p], out=out[:, p : 2 * p])
        out[:, : 2 * p].mul_(scale)
        if M % 2:
            out[:, -1] = torch.cos(Z[:, -1] + b[-1]) * scale
        return out

    # ------------------------------------------------------------------ passes over the data
    def pass_layout(self, device=None):
        """``(scale, order)`` such that ``self(X)[:, order] == scale * self.pass_features(X)`` (up to the
        last bit of the compute dtype); ``order`` is None when it is the identity."""
        M = self.n_features
        scale = math.sqrt(2.0 * self.kernel.outputscale / M)
        if self.form == "cos" or device is None or torch.device(device).type != "cuda":
            return scale, None
        p = self._n_pairs if self.input_dim is not None else M // 2
        order = torch.stack([torch.arange(p), torch.arange(p) + p], dim=1).reshape(-1)
        if M % 2:
            order = torch.cat([order, torch.tensor([M - 1])])
        return scale, order.to(device=device)

    def pass_features(self, X: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Unscaled features for repeated passes over the data, in ``X``'s dtype and on its device (give
        ``X`` in the compute dtype), written into ``out`` (``rows x M``) when given: a pass that reuses one
        buffer skips the page faults of a fresh allocation per chunk, which on the CPU cost as much as
        the cosines. See :meth:`pass_layout` for the relation with ``self(X)``:

        * CPU: the layout of ``self(X)`` (cosines, then sines), evaluated :data:`ROW_BLOCK` rows at a
          time so that ``X W`` stays in cache between the cosine and the sine;
        * CUDA, ``form='cossin'``: the cosine and sine of each frequency side by side (``cos w_1.x,
          sin w_1.x, cos w_2.x, ...``; an odd ``M``'s random-phase column last), so that one complex
          exponential (``torch.polar``) evaluates both in one read of ``X W``.
        """
        self._check_input(X)
        W, b = self._params(X.dtype, X.device)
        rows, M = X.shape[0], self.n_features
        if out is None:
            out = torch.empty(rows, M, dtype=X.dtype, device=X.device)
        if self.form == "cos":
            return torch.addmm(b, X, W, out=out).cos_()
        p = self._n_pairs
        if X.device.type == "cuda":
            Z = X @ W
            if M % 2 == 0:  # one kernel: reads X W once and writes (cos, sin) pairs
                one = torch.ones((), dtype=X.dtype, device=X.device).expand(rows, p)
                torch.polar(one, Z, out=torch.view_as_complex(out.view(rows, p, 2)))
            else:
                pairs = out[:, : 2 * p].unflatten(1, (p, 2))
                torch.cos(Z[:, :p], out=pairs[:, :, 0])
                torch.sin(Z[:, :p], out=pairs[:, :, 1])
                out[:, -1] = torch.cos(Z[:, -1] + b[-1])
            return out
        for start in range(0, rows, ROW_BLOCK):
            stop = min(start + ROW_BLOCK, rows)
            Z = X[start:stop] @ W
            torch.cos(Z[:, :p], out=out[start:stop, :p])
            torch.sin(Z[:, :p], out=out[start:stop, p : 2 * p])
            if M % 2:
                out[start:stop, -1] = torch.cos(Z[:, -1] + b[-1])
        return out

    def expected_gram(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        """``K(X1, X2)``: random Fourier features are unbiased, ``E[phi(x)^T phi(y)] = k(x, y)``."""
        return self.kernel(X1, X2)

    def __repr__(self) -> str:
        return (f"RandomFeatureMap({self.kernel!r}, n_features={self.n_features}, form={self.form!r}, "
                f"orthogonal={self.orthogonal}, seed={self.seed}"
                + (f", compute_dtype={self.compute_dtype}" if getattr(self, "compute_dtype", None) else "") + ")")


class ConcatFeatureMap(FeatureMap):
    """Concatenation of feature maps: features of a sum of kernels."""

    def __init__(self, maps: List[FeatureMap]):
        self.maps = list(maps)
        self.n_features = sum(m.n_features for m in self.maps)

    def __call__(self, X):
        return torch.cat([m(X) for m in self.maps], dim=1)

    def expected_gram(self, X1, X2):
        """The sum of the parts' expected Gram matrices (None when one part has none)."""
        fns = [getattr(m, "expected_gram", None) for m in self.maps]
        if any(fn is None for fn in fns):
            return None
        parts = [fn(X1, X2) for fn in fns]
        return None if any(p is None for p in parts) else sum(parts[1:], parts[0])


class ColumnsFeatureMap(FeatureMap):
    """``phi(x) = inner(x[dims])``: the features of a kernel on a subset of the input columns
    (:class:`joker_ext.kernels.ActiveDimsKernel`).

    Parameters
    ----------
    inner : FeatureMap
        Features of the kernel on the selected columns.
    dims : Tensor of int64
        Column indices, in the order the kernel selects them.
    """

    def __init__(self, inner: FeatureMap, dims: torch.Tensor):
        self.inner = inner
        self.dims = torch.as_tensor(dims, dtype=torch.long).reshape(-1)
        self.n_features = inner.n_features

    def _cols(self, X: torch.Tensor) -> torch.Tensor:
        if int(self.dims.max()) >= X.shape[1]:
            raise ValueError(f"the feature map uses input columns {self.dims.tolist()} but X has {X.shape[1]} columns")
        return X.index_select(1, self.dims.to(X.device))

    def __call__(self, X):
        return self.inner(self._cols(X))

    def expected_gram(self, X1, X2):
        """The inner map's expected Gram matrix on the selected columns."""
        return self.inner.expected_gram(self._cols(X1), self._cols(X2))

    def __repr__(self) -> str:
        return f"ColumnsFeatureMap({self.inner!r}, dims={self.dims.tolist()})"


class NystromFeatureMap(FeatureMap):
    """Nystrom features ``phi(x) = K(x, Z) R^{-1}`` where ``K_ZZ = R^T R`` (Cholesky).

    ``phi(x)^T phi(y) = K(x, Z) K_ZZ^{-1} K(Z, y)``, the Nystrom approximation Falkon uses; a model
    ``f(x) = phi(x)^T beta`` equals Falkon's ``K(x, Z) a`` with ``beta = R a`` and
    ``||beta||^2 = a^T K_ZZ a``. Memory: the M x M factor (Falkon's order), against d x M for random
    features.

    When K_ZZ is numerically singular (duplicated centres) a jitter ``eps * trace / M`` is added, growing
    tenfold until the factorisation succeeds.
    """

    def __init__(self, kernel: Kernel, centers: torch.Tensor, *, jitter: Optional[float] = None):
        self.kernel = kernel
        self.centers = centers
        self.n_features = centers.shape[0]
        # Memory: K and its factor (2 M^2); the factorisation reads one triangle of K (no symmetrised copy)
        # and the jitter goes onto K's diagonal in place (no identity matrix).
        K = kernel(centers, centers)
        eps = torch.finfo(K.dtype).eps if jitter is None else jitter
        scale = float(K.diagonal().mean()) if K.numel() else 1.0
        level = 0.0 if jitter is None else jitter * scale
        applied = 0.0
        for _ in range(12):
            if level != applied:
                K.diagonal().add_(level - applied)
                applied = level
            R, info = cholesky_ex(K, upper=True)
            if int(info) == 0:
                break
            del R
            level = max(level * 10.0, eps * scale * K.shape[0])
        else:  # pragma: no cover - pathological
            raise ValueError("the centres' kernel matrix could not be factorised; remove duplicated centres")
        del K
        self.R = R
        self.jitter_used = level

    def __call__(self, X):
        Z = self.centers.to(device=X.device, dtype=X.dtype)
        R = self.R.to(device=X.device, dtype=X.dtype)
        KxZ = self.kernel(X, Z)
        # phi = KxZ R^{-1}  <=>  R^T phi^T = KxZ^T
        return torch.linalg.solve_triangular(R, KxZ, upper=True, left=False)

    def coefficients_to_centers(self, beta: torch.Tensor) -> torch.Tensor:
        """Return ``a = R^{-1} beta`` so that ``f(x) = K(x, Z) a`` (Falkon's ``alpha_``)."""
        return torch.linalg.solve_triangular(self.R.to(beta), beta, upper=True)


#: Seed offset between the parts of a sum kernel's features (a prime, so parts never share draws).
PART_SEED_STRIDE = 7919


def feature_mode_options(features: str) -> dict:
    """``form`` and ``orthogonal`` of :func:`make_feature_map` for the estimators' ``features`` parameter:
    'cos' -> random-phase cosines, 'orf' -> orthogonal cos/sin pairs, 'cossin' -> cos/sin pairs."""
    return {"form": "cos" if features == "cos" else "cossin", "orthogonal": features == "orf"}


def sum_feature_map(parts: Sequence[Kernel], n_features: int, seed: Optional[int],
                    part_map: Callable[[Kernel, int, int], FeatureMap]) -> "ConcatFeatureMap":
    """Random features of a sum of kernels: the concatenation of its parts' maps.

    ``n_features`` is split evenly (the first ``n_features % k`` parts take one more); part ``j`` is drawn
    with seed ``seed + PART_SEED_STRIDE * j`` by ``part_map(part, n_features_j, seed_j)``.
    """
    k = len(parts)
    if n_features < k:
        raise ValueError(f"n_features must be at least the number of kernel parts ({k}), got {n_features}")
    sizes = [n_features // k + (1 if j < n_features % k else 0) for j in range(k)]
    base = 0 if seed is None else int(seed)
    return ConcatFeatureMap([part_map(p, m, base + PART_SEED_STRIDE * j)
                             for j, (p, m) in enumerate(zip(parts, sizes))])


def _kernel_name(kernel) -> str:
    name = getattr(kernel, "name", None)
    return name if isinstance(name, str) else type(kernel).__name__


def no_random_features_message(kernel, n_features=None) -> str:
    """The error for random features of a kernel without a spectral density: names the kernel and the feature
    modes that work for every kernel (Nystrom, exact)."""
    what = "random features" if n_features is None else f"random features (n_features={n_features})"
    return (f"{what} need a kernel with a spectral density (gaussian, laplacian, laplacian_l1, matern, rational "
            f"quadratic, their sums, output scales and active-dims selections); the kernel {_kernel_name(kernel)} "
            "has no spectral description: use Nystrom features (features='nystrom') or the exact kernel "
            "(features='exact', n_features=None)")


def make_feature_map(
    kernel: "Kernel",
    n_features: int,
    *,
    form: str = "cossin",
    orthogonal: bool = False,
    seed: Optional[int] = 0,
    compute_dtype: Optional[torch.dtype] = None,
) -> FeatureMap:
    """Random features of ``kernel``: ``kernel.random_features(n_features, form=..., orthogonal=..., seed=...,
    compute_dtype=...)``.

    Every :class:`~joker_ext.kernels.Kernel` builds its own map (a kernel with a spectral density a
    :class:`RandomFeatureMap` on its frequencies; a sum the concatenation of its parts' maps, ``n_features``
    split evenly, see :func:`sum_feature_map`; an active-dims kernel a :class:`ColumnsFeatureMap`), so this
    function has no per-kernel dispatch.

    Raises
    ------
    ValueError
        For a kernel without a spectral density (naming it and the modes that work: Nystrom, exact).
    """
    build = getattr(kernel, "random_features", None)
    if build is None:
        raise ValueError(no_random_features_message(kernel, n_features))
    return build(n_features, form=form, orthogonal=orthogonal, seed=seed, compute_dtype=compute_dtype)
