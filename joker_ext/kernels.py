"""Kernel descriptions: the common currency every adapter translates into.

A kernel here is a small object that knows how to evaluate itself on two blocks of points
(``kernel(X1, X2) -> Tensor``), how to multiply its matrix with a vector without storing it
(:meth:`Kernel.mmv`), and how to build its own random features (:meth:`Kernel.random_features`): a kernel with
a spectral density (:class:`SpectralKernel`) draws its frequencies (:meth:`SpectralKernel.spectral_frequencies`)
and carries its scale (``outputscale``), sums concatenate their parts' features, an active-dims kernel
selects columns first; a kernel without a spectral density raises a ValueError naming the modes that work
(Nystrom, exact). A new kernel with a spectral density plugs in by subclassing :class:`SpectralKernel`.

Conventions (the same as Falkon, GPyTorch and scikit-learn; see ``docs/conventions``):

============== =================================================== ==============================
family         k(x, y) with r = ||(x - y) / sigma||                 matches
============== =================================================== ==============================
gaussian       s * exp(-r_2^2 / 2)                                 Falkon GaussianKernel(sigma),
                                                                   GPyTorch RBFKernel(lengthscale),
                                                                   sklearn rbf gamma = 1/(2 sigma^2)
laplacian      s * exp(-r_2)            (Euclidean distance)       Falkon LaplacianKernel(sigma),
                                                                   GPyTorch MaternKernel(nu=0.5)
laplacian_l1   s * exp(-r_1)            (Manhattan distance)       sklearn laplacian_kernel,
                                                                   gamma = 1/sigma
matern         s * Matern_nu(r_2), nu in {1/2, 3/2, 5/2}           Falkon / GPyTorch MaternKernel,
                                                                   sklearn Matern
rational       s * (1 + r_2^2 / (2 alpha))^(-alpha)                GPyTorch RQKernel,
quadratic      (:class:`RationalQuadraticKernel`)                  sklearn RationalQuadratic
============== =================================================== ==============================

:class:`ActiveDimsKernel` evaluates a kernel on a subset of the input columns (GPyTorch's ``active_dims``).

``sigma`` is a scalar or one bandwidth per input dimension (GPyTorch's ARD lengthscales); ``s`` is the
output scale (GPyTorch's ScaleKernel ``outputscale``).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .features import ColumnsFeatureMap, FeatureMap, RandomFeatureMap, no_random_features_message, sum_feature_map
from .validation import check_number, check_positive

__all__ = [
    "Kernel",
    "SpectralKernel",
    "StationaryKernel",
    "RationalQuadraticKernel",
    "ActiveDimsKernel",
    "rq_quadrature",
    "radial_frequencies",
    "GaussianKernel",
    "LaplacianKernel",
    "LaplacianL1Kernel",
    "MaternKernel",
    "SumKernel",
    "CallableKernel",
    "make_kernel",
    "median_heuristic",
    "matern_family",
    "keops_available",
    "keops_works",
    "as_kernel",
    "register_kernel_translator",
    "kernel_from_description",
    "register_kernel_loader",
    "KERNEL_FAMILIES",
]

KERNEL_FAMILIES = ("gaussian", "laplacian", "laplacian_l1", "matern")
#: Pairs whose squared distance from the Gram form is at most this many units of its rounding
#: (``eps (max |a|^2 + max |b|^2)``, float64) are recomputed from their differences
#: (:meth:`StationaryKernel.scaled_distance`), ``NEAR_PAIRS_CHUNK`` pairs at a time. Elsewhere the distance's error
#: is then at most about ``sqrt(eps (|a|^2 + |b|^2) / NEAR_PAIRS)``: 1e-11 for points of norm 2.
NEAR_PAIRS = 1e6
NEAR_PAIRS_CHUNK = 2**16
#: The Gaussian's squared distances from the Gram form, ``|a|^2 + |b|^2 - 2 a.b`` of the centred scaled points, err by
#: about ``eps (|a|^2 + |b|^2)``; for a pair close enough for its kernel value to count, ``|a|`` is about ``|b|``, so
#: about ``2 eps max |b|^2``. Where that exceeds ``GRAM_FORM_TOL`` (points spread over more than about 1e6 bandwidths
#: in float64, 90 in float32), the distances come from the points' differences instead (:func:`torch.cdist` without
#: the product, off the matrix-multiply path). A kernel matrix of the Gram form there is not even positive
#: semidefinite: points at 0, 0, 1e-17, 2.3e-255, 2.7e-7 and 757 with the median heuristic's bandwidth of 2.7e-7 put
#: the scaled points 2.8e9 apart, the form's error at 1.7e3 in the exponent, and the squared loss's Newton system
#: could not be factored. On the CPU only: the test reads a norm back to the host (a synchronisation per block on a
#: GPU, whose inner loops keep the Gram form).
GRAM_FORM_TOL = 1e-3
MATERN_NUS = (0.5, 1.5, 2.5)

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[float], float]


def keops_available() -> bool:
    """Return True when ``pykeops`` can be imported (it compiles kernels on first use)."""
    try:
        import pykeops.torch  # noqa: F401
    except Exception:  # pragma: no cover - depends on the machine
        return False
    return True


_KEOPS_WORKS: dict = {}


def keops_works(device: Union[str, torch.device] = "cpu") -> bool:
    """Whether KeOps imports *and* runs on ``device``: one small Gaussian reduction, compiled on the first call
    (cached per device type for the process). An installed pykeops whose compilation fails (no compiler, no CUDA
    toolkit matching the driver, a broken cache) gives False and one RuntimeWarning with the error, so that a
    backend chosen automatically falls back to torch instead of failing the fit; ``backend='keops'`` asked for
    explicitly still raises."""
    kind = torch.device(device).type
    if kind not in _KEOPS_WORKS:
        ok = keops_available()
        if ok:
            try:
                X = torch.linspace(0.0, 1.0, 6, dtype=torch.float64, device=device).reshape(3, 2)
                ones = torch.ones(3, 1, dtype=X.dtype, device=device)
                got = StationaryKernel("gaussian", 1.0)._keops_mmv(X, X, ones)
                ok = bool(torch.isfinite(got).all())
            except Exception as exc:  # anything KeOps raises while compiling or running
                warnings.warn(f"pykeops is installed but does not run on {kind} ({type(exc).__name__}: "
                              f"{str(exc)[:200]}); the torch backend is used instead", RuntimeWarning, stacklevel=2)
                ok = False
        _KEOPS_WORKS[kind] = ok
    return _KEOPS_WORKS[kind]


class Kernel:
    """Base class of joker_ext kernels.

    Subclasses implement :meth:`__call__` (a dense block of the kernel matrix). :meth:`mmv`
    computes ``K(X1, X2) @ v`` in row chunks so that no more than ``chunk_size x len(X2)`` kernel values
    are held at once.
    """

    #: True when random features can be drawn for this kernel (:meth:`random_features`).
    supports_random_features: bool = False
    #: True when its random features may be orthogonal (a radial spectral density; Yu et al., 2016).
    supports_orthogonal_features: bool = False

    def __call__(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        """Diagonal ``k(x_i, x_i)``; stationary kernels override this with a constant."""
        return torch.stack([self(X[i : i + 1], X[i : i + 1])[0, 0] for i in range(X.shape[0])])

    def against(self, X2: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """A function ``X1 -> self(X1, X2)``, for many blocks ``X1`` against the same points ``X2`` (the rows of a
        kernel matrix, block by block); a kernel may prepare ``X2``'s part of the evaluation once."""
        return lambda X1: self(X1, X2)

    def mmv(
        self,
        X1: torch.Tensor,
        X2: torch.Tensor,
        v: torch.Tensor,
        *,
        chunk_size: Optional[int] = None,
        backend: str = "torch",
    ) -> torch.Tensor:
        """Return ``K(X1, X2) @ v`` computed in chunks of rows of ``X1``.

        Parameters
        ----------
        X1 : Tensor (n1, d)
        X2 : Tensor (n2, d)
        v : Tensor (n2,) or (n2, t)
        chunk_size : int, optional
            Rows of ``X1`` per chunk; by default about 2**24 kernel values per chunk.
        backend : {'torch', 'keops'}
            'keops' is available for the stationary families when pykeops is installed; it gives the
            same numbers without storing any block.
        """
        if chunk_size is None:
            chunk_size = max(1, (1 << 24) // max(1, X2.shape[0]))
        squeeze = v.dim() == 1
        V = v.unsqueeze(1) if squeeze else v
        out = torch.empty(X1.shape[0], V.shape[1], dtype=V.dtype, device=V.device)
        for start in range(0, X1.shape[0], chunk_size):
            stop = min(start + chunk_size, X1.shape[0])
            out[start:stop] = self(X1[start:stop], X2) @ V
        return out.squeeze(1) if squeeze else out

    def random_features(
        self,
        n_features: int,
        *,
        form: str = "cossin",
        orthogonal: bool = False,
        seed: Optional[int] = 0,
        compute_dtype: Optional[torch.dtype] = None,
    ) -> FeatureMap:
        """A random feature map ``phi`` with ``E[phi(x)^T phi(y)] = k(x, y)`` (M = ``n_features`` columns).

        Parameters
        ----------
        n_features : int
            M, the number of columns of ``phi(X)``.
        form : {'cossin', 'cos'}
            Cos/sin pairs or random-phase cosines (:class:`joker_ext.features.RandomFeatureMap`).
        orthogonal : bool
            Orthogonal random features (kernels with ``supports_orthogonal_features``).
        seed : int
            The same seed gives the same map, on every device and dtype (draws are CPU float64).
        compute_dtype : torch.dtype, optional
            Precision of the cosines (see :class:`~joker_ext.features.RandomFeatureMap`).

        Raises
        ------
        ValueError
            Here, in the base class: the kernel has no spectral density. The message names the kernel and the
            feature modes that work for every kernel (Nystrom, exact).
        """
        raise ValueError(no_random_features_message(self, n_features))

    def scaled(self, factor: float) -> "Kernel":
        """``factor * k`` in the same description (an output scale multiplied by ``factor > 0``)."""
        raise TypeError(f"cannot scale a kernel of type {type(self).__name__}")

    def describe(self) -> dict:
        """Plain metadata (numbers, strings, lists, dicts) from which :func:`kernel_from_description` rebuilds
        the kernel. A kernel class that does not override this is code, which no description holds: its
        description is ``'callable'``, which checkpoints refuse."""
        return {"type": "callable", "name": type(self).__qualname__}

    def __add__(self, other: "Kernel") -> "SumKernel":
        if not isinstance(other, Kernel):
            return NotImplemented
        return SumKernel([self, other])


def _as_sigma(sigma: ArrayLike, name: str = "sigma") -> torch.Tensor:
    """Validate a bandwidth (scalar or per-dimension) and return it as a float64 tensor."""
    if isinstance(sigma, str):
        raise TypeError(f"{name} must be a positive number or a per-dimension array, got the string {sigma!r}")
    try:
        s = torch.as_tensor(np.asarray(sigma.detach().cpu() if torch.is_tensor(sigma) else sigma, dtype=np.float64))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a positive number or a per-dimension array, got {sigma!r}") from exc
    s = s.reshape(-1) if s.dim() > 1 else s
    if s.numel() == 0:
        raise ValueError(f"{name} must not be empty, got {sigma!r}")
    if not torch.all(torch.isfinite(s)) or not torch.all(s > 0):
        raise ValueError(f"{name} must be positive and finite, got {sigma!r}")
    return s


def _chi2(df: float, size: int, gen: torch.Generator) -> torch.Tensor:
    """chi-square(df) samples via Gamma(df/2, scale=2) drawn with the generator (CPU float64)."""
    # torch has no generator-aware gamma sampler; use the Marsaglia-Tsang method, vectorised.
    shape = df / 2.0
    boost = shape < 1.0
    a = shape + 1.0 if boost else shape
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    out = torch.empty(size, dtype=torch.float64)
    filled = 0
    while filled < size:
        k = 2 * (size - filled) + 16
        z = torch.randn(k, generator=gen, dtype=torch.float64)
        u = torch.rand(k, generator=gen, dtype=torch.float64)
        v = (1.0 + c * z) ** 3
        ok = (v > 0) & (torch.log(u.clamp_min(1e-300)) < 0.5 * z * z + d - d * v + d * torch.log(v.clamp_min(1e-300)))
        g = (d * v)[ok]
        take = min(g.numel(), size - filled)
        out[filled : filled + take] = g[:take]
        filled += take
    if boost:
        u = torch.rand(size, generator=gen, dtype=torch.float64)
        out = out * u.pow(1.0 / shape)
    return 2.0 * out


def radial_frequencies(d: int, m: int, gen: torch.Generator, radial_scale: Callable[[int, torch.Generator], torch.Tensor],
                       *, orthogonal: bool = False) -> torch.Tensor:
    """``m`` frequencies ``w = rho z`` (columns of a (d, m) CPU float64 tensor) of a scale mixture of Gaussians.

    ``z ~ N(0, I_d)`` and, independently, ``rho = radial_scale(m, gen)`` (one factor per frequency), for unit
    lengthscale. ``orthogonal=True`` draws the directions ``z / ||z||`` as Haar-distributed blocks of ``d``
    orthonormal vectors and the lengths ``||z|| ~ chi(d)`` independently (the law of each ``w`` is unchanged, the
    frequencies of a block are orthogonal: Yu et al., 2016). The draws, in this order: the Gaussian matrix (or
    the blocks, then ``d x m`` normals for the lengths), then ``radial_scale``.
    """
    if orthogonal:
        blocks = []
        for _ in range(math.ceil(m / d)):
            G = torch.randn(d, d, generator=gen, dtype=torch.float64)
            Q, R = torch.linalg.qr(G)
            Q = Q * torch.sign(torch.diagonal(R)).unsqueeze(0)  # Haar-distributed
            blocks.append(Q)
        Wdir = torch.cat(blocks, dim=1)[:, :m]
        norms = torch.randn(d, m, generator=gen, dtype=torch.float64).norm(dim=0)  # chi(d)
        return Wdir * (norms * radial_scale(m, gen)).unsqueeze(0)
    return torch.randn(d, m, generator=gen, dtype=torch.float64) * radial_scale(m, gen).unsqueeze(0)


def _per_lengthscale(W: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Frequencies for unit lengthscale -> for the lengthscale ``sigma`` (scalar or one per row of ``W``):
    ``k(x, y) = kappa((x - y) / sigma)`` has the spectral density of ``kappa`` with ``w`` divided by ``sigma``."""
    d = W.shape[0]
    if sigma.dim() == 1 and sigma.numel() > 1:
        if sigma.numel() != d:
            raise ValueError(f"sigma has {sigma.numel()} entries but the data have {d} features")
        return W / sigma.unsqueeze(1)
    return W / float(sigma.reshape(-1)[0])


class SpectralKernel(Kernel):
    """A kernel with a spectral density: ``k(x, y) = s E_w[cos(w^T (x - y))]``, ``w ~ p`` (Bochner).

    A subclass provides :meth:`spectral_frequencies` (draws of ``w ~ p`` for its own lengthscales) and the
    attribute ``outputscale`` (``s = k(x, x)``); it inherits :meth:`random_features`, a
    :class:`joker_ext.features.RandomFeatureMap` on those frequencies scaled by ``sqrt(2 s / M)``. Nothing else
    (no dispatch table) needs to know about it. ``supports_orthogonal_features = True`` declares ``p`` radial
    (orthogonal directions keep it), for subclasses whose sampler honours ``orthogonal``.
    """

    supports_random_features = True

    def spectral_frequencies(self, d: int, m: int, generator: torch.Generator, *,
                             orthogonal: bool = False) -> torch.Tensor:  # pragma: no cover - abstract
        """``m`` frequencies ``w ~ p`` for inputs of dimension ``d``: a (d, m) CPU float64 tensor drawn from
        ``generator`` only (so the same seed gives the same features)."""
        raise NotImplementedError

    def random_features(self, n_features, *, form="cossin", orthogonal=False, seed=0, compute_dtype=None):
        return RandomFeatureMap(self, n_features, form=form, orthogonal=orthogonal, seed=seed,
                                compute_dtype=compute_dtype)


def _gram_form_inexact(norms: torch.Tensor) -> bool:
    """Whether the Gram form's squared distances to centred scaled points of squared norms ``norms`` may err by more
    than :data:`GRAM_FORM_TOL` (CPU tensors only; False on other devices)."""
    if norms.device.type != "cpu" or norms.numel() == 0:
        return False
    return 2.0 * torch.finfo(norms.dtype).eps * float(norms.max()) > GRAM_FORM_TOL


def _squared_differences(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``|a_i - b_j|^2`` from the differences (no Gram product): exact to rounding whatever the points' norms."""
    return torch.cdist(A, B, compute_mode="donot_use_mm_for_euclid_dist").square_()


@dataclass(eq=False)
class StationaryKernel(SpectralKernel):
    """A stationary kernel of one of the families in :data:`KERNEL_FAMILIES`.

    ``k(x, y) = outputscale * profile(||(x - y) / sigma||)`` with the profile of the family (see the
    module docstring). The description is independent of device and dtype; evaluation follows the dtype
    and device of its inputs. Random features: :meth:`spectral_frequencies` (its spectral density).

    Parameters
    ----------
    family : {'gaussian', 'laplacian', 'laplacian_l1', 'matern'}
    sigma : float or array of shape (d,)
        Bandwidth (lengthscale); a vector gives one bandwidth per input dimension.
    nu : float, optional
        Smoothness of the Matern family, one of 0.5, 1.5, 2.5 (required for 'matern').
    outputscale : float, default 1.0
        Multiplies the kernel.
    """

    family: str
    sigma: ArrayLike = 1.0
    nu: Optional[float] = None
    outputscale: float = 1.0
    supports_random_features = True

    def __post_init__(self) -> None:
        if not isinstance(self.family, str) or self.family not in KERNEL_FAMILIES:
            raise ValueError(f"kernel family must be one of {KERNEL_FAMILIES}, got {self.family!r}")
        self.sigma = _as_sigma(self.sigma)
        if self.family == "matern":
            if self.nu is None or float(self.nu) not in MATERN_NUS:
                raise ValueError(f"nu must be one of {MATERN_NUS} for the matern kernel, got {self.nu!r}")
            self.nu = float(self.nu)
        elif self.family == "laplacian":
            self.nu = 0.5
        else:
            self.nu = None
        os_ = float(self.outputscale)
        if not math.isfinite(os_) or os_ <= 0:
            raise ValueError(f"outputscale must be positive and finite, got {self.outputscale!r}")
        self.outputscale = os_

    # ------------------------------------------------------------------ helpers
    @property
    def is_ard(self) -> bool:
        """True when ``sigma`` has one entry per dimension."""
        return self.sigma.dim() == 1 and self.sigma.numel() > 1

    def bandwidths(self, d: int, dtype: torch.dtype, device) -> torch.Tensor:
        """``sigma`` for inputs of ``d`` features, in ``dtype`` on ``device``: a scalar, or one bandwidth per feature;
        a ValueError when a vector of bandwidths has another length."""
        sigma = self.sigma.to(device=device, dtype=dtype)
        if sigma.dim() == 1 and sigma.numel() > 1 and sigma.numel() != d:
            raise ValueError(
                f"sigma has {sigma.numel()} entries but the data have {d} features; "
                "pass a scalar or one bandwidth per feature"
            )
        return sigma

    def scale_inputs(self, X: torch.Tensor) -> torch.Tensor:
        """Return ``X / sigma`` (per dimension when ``sigma`` is a vector)."""
        return X / self.bandwidths(X.shape[1], X.dtype, X.device)

    def profile(self, r: torch.Tensor) -> torch.Tensor:
        """Kernel value as a function of the scaled distance ``r`` (without the output scale)."""
        if self.family == "gaussian":
            return torch.exp(-0.5 * r)  # r is the squared distance here
        if self.family in ("laplacian", "laplacian_l1") or self.nu == 0.5:
            return torch.exp(-r)
        if self.nu == 1.5:
            t = math.sqrt(3.0) * r
            return (1.0 + t) * torch.exp(-t)
        t = math.sqrt(5.0) * r
        return (1.0 + t + t * t / 3.0) * torch.exp(-t)

    def _centred(self, X1: torch.Tensor, X2: torch.Tensor):
        """The scaled points, both shifted by the mean of the scaled ``X2`` (distances are unchanged; the Gram
        products of centred points lose less to cancellation)."""
        B, mean = self._centre(X2)
        return self.scale_inputs(X1) - mean, B

    def _centre(self, X2: torch.Tensor):
        """``(B, mean)``: the scaled ``X2`` less its mean, and that mean (0 for no points)."""
        B = self.scale_inputs(X2)
        mean = B.mean(dim=0, keepdim=True) if B.shape[0] > 0 else 0.0
        return B - mean, mean

    def scaled_distance(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        """Distances between scaled points: squared L2 (gaussian), L1 (laplacian_l1) or L2 (others).

        The squared L2 distances come from a centred Gram product, ``|a|^2 + |b|^2 - 2 a.b``: matmul-fast, and
        accurate to ``eps (|a|^2 + |b|^2)``. That suffices for the Gaussian's ``exp(-r^2 / 2)``, but a square root
        magnifies it near zero to ``sqrt(eps) |a|``: the Laplacian kernel's diagonal was off by 7e-8 in float64 and
        2e-3 in float32 (``|a| ~ 2``). So the L2 families (laplacian, matern) form the squared distances in float64
        whatever the inputs' dtype (as scikit-learn's ``euclidean_distances`` does for float32) and recompute the
        pairs closer than :data:`NEAR_PAIRS` units of that rounding (the diagonal, near-duplicates) from their
        differences; their distances are returned in the inputs' dtype."""
        if self.family == "laplacian_l1":
            return torch.cdist(self.scale_inputs(X1), self.scale_inputs(X2), p=1.0)
        root = self.family != "gaussian"
        A, B = self._centred(X1.double(), X2.double()) if root else self._centred(X1, X2)
        norms_b = (B * B).sum(1)
        if not root and _gram_form_inexact(norms_b):  # uncentred: the centring rounds at the points' spread
            return _squared_differences(self.scale_inputs(X1), self.scale_inputs(X2))
        # in place on the product: one n1 x n2 allocation (large blocks are memory-bound)
        norms_a = (A * A).sum(1, keepdim=True)
        sq = (A @ B.T).mul_(-2.0).add_(norms_a).add_(norms_b.unsqueeze(0))
        sq.clamp_(min=0.0)
        if not root:
            return sq
        if sq.numel():
            bound = NEAR_PAIRS * torch.finfo(sq.dtype).eps * float(norms_a.detach().max() + norms_b.detach().max())
            i, j = torch.nonzero(sq <= bound, as_tuple=True)
            for s in range(0, i.numel(), NEAR_PAIRS_CHUNK):
                ii, jj = i[s:s + NEAR_PAIRS_CHUNK], j[s:s + NEAR_PAIRS_CHUNK]
                diff = A[ii] - B[jj]
                sq[ii, jj] = (diff * diff).sum(1)
        return sq.sqrt_().to(X1.dtype)

    def _gaussian_against(self, X2: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """``X1 -> exp(-|a - b|^2 / 2)`` of the scaled points (without the output scale) against ``X2``, as
        ``exp(min(0, a.b - |a|^2 / 2 - |b|^2 / 2))``: each block holds the norms' half sums and the product
        accumulates onto it, then the clamp and the exponential run in place (four passes over a memory-bound block
        instead of seven: 20-27% faster at 512-2000 x 10^4). ``X2``'s centred points and half squared norms are
        prepared once (repeating them for every block of 256 rows against 4,000 points cost 40% of the block's time
        at d = 25-98)."""
        B, mean = self._centre(X2)
        norms = (B * B).sum(1)
        if _gram_form_inexact(norms):  # uncentred: the centring rounds at the points' spread
            scaled = self.scale_inputs(X2)
            return lambda X1: _squared_differences(self.scale_inputs(X1), scaled).mul_(-0.5).exp_()
        half_norms = norms.mul_(-0.5).unsqueeze(0)

        def block(X1: torch.Tensor) -> torch.Tensor:
            A = self.scale_inputs(X1) - mean
            return ((A * A).sum(1, keepdim=True).mul_(-0.5) + half_norms).addmm_(A, B.T).clamp_(max=0.0).exp_()

        return block

    def _output(self, K: torch.Tensor) -> torch.Tensor:
        """``K`` times the output scale, in place."""
        return K.mul_(self.outputscale) if self.outputscale != 1.0 else K

    # ------------------------------------------------------------------ Kernel API
    def __call__(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        """Dense block ``K(X1, X2)`` in the dtype and on the device of ``X1``."""
        if self.family == "gaussian":
            return self._output(self._gaussian_against(X2)(X1))
        return self._output(self.profile(self.scaled_distance(X1, X2)))

    def against(self, X2: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """As :meth:`Kernel.against`; the Gaussian prepares ``X2``'s part of :meth:`__call__` once (the same
        numbers, bit for bit)."""
        if self.family != "gaussian":
            return super().against(X2)
        block = self._gaussian_against(X2)
        return lambda X1: self._output(block(X1))

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        return torch.full((X.shape[0],), self.outputscale, dtype=X.dtype, device=X.device)

    def mmv(self, X1, X2, v, *, chunk_size=None, backend="torch"):
        if backend == "keops":
            return self._keops_mmv(X1, X2, v)
        if backend != "torch":
            raise ValueError(f"backend must be 'torch' or 'keops', got {backend!r}")
        return super().mmv(X1, X2, v, chunk_size=chunk_size)

    def _keops_mmv(self, X1: torch.Tensor, X2: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        try:
            from pykeops.torch import LazyTensor
        except Exception as exc:  # pragma: no cover - depends on the machine
            raise ImportError("backend='keops' needs pykeops: pip install 'joker-ext[keops]'") from exc
        squeeze = v.dim() == 1
        V = v.unsqueeze(1) if squeeze else v
        A = self.scale_inputs(X1).contiguous()
        B = self.scale_inputs(X2).contiguous()
        a = LazyTensor(A[:, None, :])
        b = LazyTensor(B[None, :, :])
        if self.family == "laplacian_l1":
            r = (a - b).abs().sum(-1)
        else:
            D = ((a - b) ** 2).sum(-1)
            r = D if self.family == "gaussian" else D.sqrt()
        if self.family == "gaussian":
            K = (-0.5 * r).exp()
        elif self.family in ("laplacian", "laplacian_l1") or self.nu == 0.5:
            K = (-r).exp()
        elif self.nu == 1.5:
            t = math.sqrt(3.0) * r
            K = (1.0 + t) * (-t).exp()
        else:
            t = math.sqrt(5.0) * r
            K = (1.0 + t + t * t / 3.0) * (-t).exp()
        out = (K @ V.contiguous()) * self.outputscale
        return out.squeeze(1) if squeeze else out

    def with_sigma(self, sigma: ArrayLike) -> "StationaryKernel":
        """A copy of this kernel with another bandwidth."""
        return StationaryKernel(self.family, sigma, self.nu, self.outputscale)

    def scaled(self, factor: float) -> "StationaryKernel":
        return StationaryKernel(self.family, self.sigma, self.nu, self.outputscale * check_positive("factor", factor))

    # ------------------------------------------------------------------ spectral density
    @property
    def supports_orthogonal_features(self) -> bool:
        """The radial families (all but ``laplacian_l1``, whose density is a product over coordinates)."""
        return self.family != "laplacian_l1"

    def _radial_scale(self, m: int, gen: torch.Generator) -> torch.Tensor:
        """Per-frequency factor ``1 / sqrt(u / (2 nu))``, ``u ~ chi2(2 nu)``, of the multivariate t (ones for the
        Gaussian)."""
        if self.family == "gaussian":
            return torch.ones(m, dtype=torch.float64)
        u = _chi2(2.0 * self.nu, m, gen)
        return 1.0 / torch.sqrt(u / (2.0 * self.nu))

    def spectral_frequencies(self, d: int, m: int, generator: torch.Generator, *,
                             orthogonal: bool = False) -> torch.Tensor:
        """Frequencies of the family's spectral density (for unit lengthscale; then divided by ``sigma``):

        ============== ==========================================================================
        gaussian       w ~ N(0, I)
        matern nu      multivariate t with 2 nu degrees of freedom: w = z / sqrt(u / (2 nu)),
                       z ~ N(0, I), u ~ chi2(2 nu)   (laplacian = matern 1/2: multivariate Cauchy)
        laplacian_l1   each coordinate independently Cauchy(0, 1)
        ============== ==========================================================================

        The radial families go through :func:`radial_frequencies` (orthogonal blocks when asked).
        """
        if self.family == "laplacian_l1":
            if orthogonal:
                raise ValueError("orthogonal random features need a radial kernel; laplacian_l1 is not radial")
            u = torch.rand(d, m, generator=generator, dtype=torch.float64)
            W = torch.tan(math.pi * (u - 0.5))
        else:
            W = radial_frequencies(d, m, generator, self._radial_scale, orthogonal=orthogonal)
        return _per_lengthscale(W, self.sigma)

    def describe(self) -> dict:
        """Plain metadata (no tensors or pickled code): used by checkpoints and reports."""
        sigma = self.sigma.tolist()
        return {"type": "stationary", "family": self.family, "sigma": sigma, "nu": self.nu,
                "outputscale": self.outputscale}


def GaussianKernel(sigma: ArrayLike = 1.0, outputscale: float = 1.0) -> StationaryKernel:
    """``outputscale * exp(-||x - y||^2 / (2 sigma^2))``."""
    return StationaryKernel("gaussian", sigma, None, outputscale)


def LaplacianKernel(sigma: ArrayLike = 1.0, outputscale: float = 1.0) -> StationaryKernel:
    """``outputscale * exp(-||x - y||_2 / sigma)`` (Euclidean distance, as Falkon)."""
    return StationaryKernel("laplacian", sigma, None, outputscale)


def LaplacianL1Kernel(sigma: ArrayLike = 1.0, outputscale: float = 1.0) -> StationaryKernel:
    """``outputscale * exp(-||x - y||_1 / sigma)`` (Manhattan distance, as scikit-learn's laplacian)."""
    return StationaryKernel("laplacian_l1", sigma, None, outputscale)


def matern_family(nu, owner: str = "Matern") -> tuple:
    """``(family, nu)`` of a :class:`StationaryKernel` for another library's Matern kernel of smoothness ``nu``.

    ``nu = inf`` is the Gaussian kernel (``('gaussian', None)``); 0.5, 1.5 and 2.5 are ``('matern', nu)``.
    ``owner`` names the kernel class in the ValueError raised for any other ``nu``.
    """
    nu = float(nu)
    if math.isinf(nu):
        return "gaussian", None
    if nu not in MATERN_NUS:
        raise ValueError(f"{owner} nu must be 0.5, 1.5, 2.5 or inf, got {nu!r}")
    return "matern", nu


def MaternKernel(sigma: ArrayLike = 1.0, nu: float = 1.5, outputscale: float = 1.0) -> StationaryKernel:
    """Matern kernel with smoothness ``nu`` in {0.5, 1.5, 2.5}, lengthscale ``sigma``."""
    return StationaryKernel("matern", sigma, nu, outputscale)


class SumKernel(Kernel):
    """Sum of kernels ``k(x, y) = sum_j k_j(x, y)``.

    Random features of a sum are the concatenation of the parts' features (each part gets a share of
    the features), so the sum supports random features when every part does.
    """

    def __init__(self, parts: Sequence[Kernel]):
        flat = []
        for p in parts:
            if not isinstance(p, Kernel):
                raise TypeError(f"SumKernel parts must be joker_ext kernels, got {type(p).__name__}")
            flat.extend(p.parts if isinstance(p, SumKernel) else [p])
        if not flat:
            raise ValueError("SumKernel needs at least one part, got none")
        self.parts = flat
        self.supports_random_features = all(p.supports_random_features for p in flat)

    def __call__(self, X1, X2):
        out = self.parts[0](X1, X2)
        for p in self.parts[1:]:
            out = out + p(X1, X2)
        return out

    def diag(self, X):
        out = self.parts[0].diag(X)
        for p in self.parts[1:]:
            out = out + p.diag(X)
        return out

    def mmv(self, X1, X2, v, *, chunk_size=None, backend="torch"):
        if backend == "keops":
            out = self.parts[0].mmv(X1, X2, v, backend="keops")
            for p in self.parts[1:]:
                out = out + p.mmv(X1, X2, v, backend="keops")
            return out
        return super().mmv(X1, X2, v, chunk_size=chunk_size)

    @property
    def supports_orthogonal_features(self) -> bool:
        """True when some part's features may be orthogonal (the others are drawn without)."""
        return any(p.supports_orthogonal_features for p in self.parts)

    def random_features(self, n_features, *, form="cossin", orthogonal=False, seed=0, compute_dtype=None):
        """The concatenation of the parts' features (:func:`joker_ext.features.sum_feature_map`: ``n_features``
        split evenly, part ``j`` seeded ``seed + 7919 j``); ``orthogonal`` applies to the parts that allow it.
        ``E[phi(x)^T phi(y)] = sum_j E[phi_j(x)^T phi_j(y)] = sum_j k_j(x, y)``."""
        if not self.supports_random_features:
            raise ValueError(no_random_features_message(self, n_features))
        return sum_feature_map(self.parts, n_features, seed, lambda p, m, s: p.random_features(
            m, form=form, orthogonal=orthogonal and p.supports_orthogonal_features, seed=s,
            compute_dtype=compute_dtype))

    def scaled(self, factor: float) -> "SumKernel":
        return SumKernel([p.scaled(factor) for p in self.parts])

    def describe(self) -> dict:
        return {"type": "sum", "parts": [p.describe() for p in self.parts]}

    def __repr__(self) -> str:
        return " + ".join(repr(p) for p in self.parts)

    @property
    def name(self) -> str:
        """The parts without a spectral density (for error messages), or the whole sum."""
        bad = [p for p in self.parts if not p.supports_random_features]
        return " + ".join(getattr(p, "name", None) or type(p).__name__ for p in bad) if bad else repr(self)


class CallableKernel(Kernel):
    """Wrap any function ``fn(X1, X2) -> (n1, n2) matrix`` as an exact-mode kernel.

    This is how other libraries' kernels that have no spectral description (Falkon's Linear or
    Polynomial kernel, a GPyTorch product kernel, a user's own) run in joker_ext: block by block
    through their own evaluation, never on all data at once.

    Parameters
    ----------
    fn : callable
        Returns the kernel block as a torch tensor (or anything ``torch.as_tensor`` accepts, or an
        object with ``to_dense()`` / ``evaluate()`` such as a GPyTorch LinearOperator).
    name : str
        Shown in ``repr`` and reports.
    """

    supports_random_features = False

    def __init__(self, fn: Callable, name: str = "callable"):
        if not callable(fn):
            raise TypeError(f"kernel must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = name

    def __call__(self, X1, X2):
        out = self.fn(X1, X2)
        if hasattr(out, "to_dense"):
            out = out.to_dense()
        elif hasattr(out, "evaluate") and not torch.is_tensor(out):
            out = out.evaluate()
        out = torch.as_tensor(out)
        if out.shape != (X1.shape[0], X2.shape[0]):
            raise ValueError(
                f"kernel {self.name} returned a block of shape {tuple(out.shape)}, "
                f"expected {(X1.shape[0], X2.shape[0])}"
            )
        return out.to(dtype=X1.dtype, device=X1.device)

    def describe(self) -> dict:
        """``{'type': 'callable', 'name': ...}``: a function cannot be described without its code, so
        :func:`kernel_from_description` refuses this description (subclasses that wrap a describable kernel
        object, such as the scikit-learn adapter's, override this)."""
        return {"type": "callable", "name": self.name}

    def scaled(self, factor: float) -> "CallableKernel":
        s = check_positive("factor", factor)
        return CallableKernel(_ScaledCallable(self.fn, s), name=f"{s:.6g} * {self.name}")

    def __repr__(self) -> str:
        return f"CallableKernel({self.name})"


class _ScaledCallable:
    """``fn(X1, X2) * scale`` (module level, so that a scaled CallableKernel pickles)."""

    def __init__(self, inner: Callable, scale: float):
        self.inner, self.scale = inner, scale

    def __call__(self, X1, X2):
        out = self.inner(X1, X2)
        if hasattr(out, "to_dense"):
            out = out.to_dense()
        return out * self.scale


class RationalQuadraticKernel(SpectralKernel):
    """Rational quadratic kernel ``k(x, y) = s (1 + r^2 / (2 alpha))^(-alpha)``, ``r = ||(x - y) / sigma||``.

    The same function as GPyTorch's ``RQKernel`` (lengthscale ``sigma``, ``alpha``) and scikit-learn's
    ``RationalQuadratic(length_scale=sigma, alpha)``; ``alpha -> infinity`` gives the Gaussian kernel.

    Spectral density: a Gaussian scale mixture. For ``a = alpha > 0`` and ``c >= 0``,
    ``(1 + c)^(-a) = Gamma(a)^(-1) int_0^inf t^(a-1) e^(-t (1 + c)) dt = E_t[exp(-t c)]`` with
    ``t ~ Gamma(a, 1)`` (shape a, rate 1). With ``c = r^2 / (2 a)``::

        k(x, y) / s = E_t[ exp(-(t / a) r^2 / 2) ],   t ~ Gamma(a, 1),

    a mixture of Gaussian kernels whose inverse squared lengthscale ``tau = t / (a sigma^2)`` is
    ``Gamma(shape = a, rate = a sigma^2)`` (mean ``1 / sigma^2``). The Gaussian kernel of precision ``tau`` has
    frequencies ``N(0, tau I)``, so the RQ kernel's spectral density is that of ``w = sqrt(t / a) z / sigma``,
    ``z ~ N(0, I_d)``, ``t ~ Gamma(a, 1)`` independent (per dimension ``/ sigma_k`` for ARD): a radial law (a
    multivariate t-like scale mixture), so orthogonal features apply. Random features built on it are unbiased
    for the RQ kernel itself (not an approximation by finitely many Gaussians; :meth:`quadrature` gives that
    one, for faces that need a sum of Gaussians).

    Parameters
    ----------
    sigma : float or array (d,)
        Lengthscale, one per dimension for ARD (GPyTorch ``lengthscale``; scikit-learn ``length_scale``).
    alpha : float
        Shape (> 0).
    outputscale : float
        s.
    """

    supports_orthogonal_features = True

    def __init__(self, sigma: ArrayLike = 1.0, alpha: float = 1.0, outputscale: float = 1.0):
        self._gauss = StationaryKernel("gaussian", sigma)  # validates sigma; gives squared scaled distances
        self.sigma = self._gauss.sigma
        self.alpha = check_positive("alpha", alpha)
        self.outputscale = check_positive("outputscale", outputscale)

    def __call__(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        sq = self._gauss.scaled_distance(X1, X2)  # ||(x - y) / sigma||^2
        K = sq.mul_(0.5 / self.alpha).log1p_().mul_(-self.alpha).exp_()  # (1 + r^2 / (2 a))^(-a)
        return K.mul_(self.outputscale) if self.outputscale != 1.0 else K

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        return torch.full((X.shape[0],), self.outputscale, dtype=X.dtype, device=X.device)

    def _radial_scale(self, m: int, gen: torch.Generator) -> torch.Tensor:
        """``sqrt(t / a)``, ``t ~ Gamma(a, 1)``: one integer from ``gen`` seeds numpy's Gamma sampler."""
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        t = np.random.default_rng(seed).gamma(self.alpha, 1.0, size=m)
        return torch.as_tensor(np.sqrt(t / self.alpha), dtype=torch.float64)

    def spectral_frequencies(self, d: int, m: int, generator: torch.Generator, *,
                             orthogonal: bool = False) -> torch.Tensor:
        """``w = sqrt(t / a) z / sigma`` (see the class docstring), through :func:`radial_frequencies`."""
        return _per_lengthscale(radial_frequencies(d, m, generator, self._radial_scale, orthogonal=orthogonal),
                                self.sigma)

    def quadrature(self, tol: float = 1e-3) -> SumKernel:
        """A finite scale mixture of Gaussians within ``tol`` (relative to the output scale) of this kernel, as a
        SumKernel (:func:`rq_quadrature`)."""
        scales, weights, _ = rq_quadrature(self.alpha, tol=tol)
        return SumKernel([StationaryKernel("gaussian", self.sigma * float(f), None, self.outputscale * float(w))
                          for f, w in zip(scales, weights)])

    def scaled(self, factor: float) -> "RationalQuadraticKernel":
        return RationalQuadraticKernel(self.sigma, self.alpha, self.outputscale * check_positive("factor", factor))

    def describe(self) -> dict:
        return {"type": "rational_quadratic", "sigma": self.sigma.tolist(), "alpha": self.alpha,
                "outputscale": self.outputscale}

    def __repr__(self) -> str:
        return (f"RationalQuadraticKernel(sigma={self.sigma.tolist()}, alpha={self.alpha:g}, "
                f"outputscale={self.outputscale:g})")


def rq_quadrature(alpha: float, tol: float = 1e-3, max_nodes: int = 4096) -> Tuple[np.ndarray, np.ndarray, float]:
    """Finite scale mixture of Gaussians for the rational quadratic profile.

    Returns ``(scales, weights, error)`` such that, with ``r`` the distance in lengthscale units,
    ``sum_j weights[j] * exp(-r^2 / (2 scales[j]^2))`` approximates ``(1 + r^2 / (2 alpha))^(-alpha)``
    with ``max_r |difference| = error <= tol``. ``scales[j] = sqrt(alpha / t_j)`` multiplies the lengthscale of
    the j-th Gaussian.

    Method: ``(1 + r^2 / (2 a))^(-a) = E_t[exp(-t r^2 / (2 a))]``, ``t ~ Gamma(a, 1)`` (see
    :class:`RationalQuadraticKernel`), integrated by a trapezoidal rule in ``u = log t`` (the integrand is analytic
    in a strip, so the rule converges geometrically in the step), truncated at the ``tol`` and ``1 - 1e-16``
    quantiles of ``Gamma(a, 1)``; weights renormalised so that ``k(0)`` is exact. The truncation costs about
    ``tol`` in the kernel's tail (a finite mixture of Gaussians decays like a Gaussian, the RQ kernel like
    ``r^(-2a)``); the step is halved until the maximum error, measured on a grid of 4,000 distances spanning
    ``r^2 / (2a)`` in ``[1e-8, 1e12]``, is below ``tol``. Gauss-Laguerre rules were measured and rejected: for
    ``a <= 1`` their error stays above 1e-2 even with 64 nodes.
    """
    from scipy.special import gammaln
    from scipy.stats import gamma as gamma_dist

    a = check_positive("alpha", alpha)
    tol = check_number("tol", tol, low=0.0, high=1.0, low_open=True, high_open=True)
    u_lo = math.log(max(float(gamma_dist.ppf(tol, a)), 1e-300))
    u_hi = math.log(float(gamma_dist.isf(1e-16, a)))
    x = np.concatenate([[0.0], np.logspace(-8, 12, 4000)])  # x = r^2 / (2 a)
    exact = np.exp(-a * np.log1p(x))
    h = min(1.0, (u_hi - u_lo) / 8.0)
    while True:
        q = max(2, int(math.ceil((u_hi - u_lo) / h)) + 1)
        u = np.linspace(u_lo, u_hi, q)
        step = u[1] - u[0]
        logw = math.log(step) + a * u - np.exp(u) - gammaln(a)
        w = np.exp(logw)
        w = w / w.sum()  # k(0) exact
        keep = w > tol * 1e-4
        t, w = np.exp(u[keep]), w[keep] / w[keep].sum()
        approx = np.exp(-np.outer(x, t)) @ w
        err = float(np.abs(approx - exact).max())
        if err <= tol or q >= max_nodes:
            break
        h /= 2.0
    if err > tol:  # pragma: no cover - only with absurd tolerances
        warnings.warn(f"rq_quadrature reached {q} nodes with error {err:.2e} > tol={tol:.2e}", RuntimeWarning)
    return np.sqrt(a / t), w, err


class ActiveDimsKernel(Kernel):
    """``k(x, y) = base(x[dims], y[dims])``: a kernel on a subset of the input columns (GPyTorch's
    ``active_dims``).

    Random features are the base kernel's features of the selected columns
    (:class:`joker_ext.features.ColumnsFeatureMap`): ``E[phi_b(x[dims])^T phi_b(y[dims])] = base(x[dims],
    y[dims])``. Available when the base kernel has them.

    Parameters
    ----------
    base : Kernel
    dims : sequence of int
        Column indices, in the order they are selected (repeats allowed).
    """

    def __init__(self, base: Kernel, dims: Sequence[int]):
        if not isinstance(base, Kernel):
            raise TypeError(f"base must be a joker_ext kernel, got {type(base).__name__}")
        idx = torch.as_tensor(list(dims) if not torch.is_tensor(dims) else dims.detach().cpu(), dtype=torch.long)
        if idx.dim() != 1 or idx.numel() == 0 or bool((idx < 0).any()):
            raise ValueError(f"dims must be a non-empty list of non-negative column indices, got {dims!r}")
        self.base = base
        self.dims = idx.reshape(-1)

    @property
    def supports_random_features(self) -> bool:
        return self.base.supports_random_features

    @property
    def supports_orthogonal_features(self) -> bool:
        return self.base.supports_orthogonal_features

    @property
    def name(self) -> str:
        return f"{getattr(self.base, 'name', None) or type(self.base).__name__} on columns {self.dims.tolist()}"

    def _cols(self, X: torch.Tensor) -> torch.Tensor:
        if int(self.dims.max()) >= X.shape[1]:
            raise ValueError(
                f"the kernel uses input columns {self.dims.tolist()} (active_dims) but the data have "
                f"{X.shape[1]} columns"
            )
        return X.index_select(1, self.dims.to(X.device))

    def __call__(self, X1, X2):
        return self.base(self._cols(X1), self._cols(X2))

    def diag(self, X):
        return self.base.diag(self._cols(X))

    def mmv(self, X1, X2, v, *, chunk_size=None, backend="torch"):
        return self.base.mmv(self._cols(X1), self._cols(X2), v, chunk_size=chunk_size, backend=backend)

    def random_features(self, n_features, *, form="cossin", orthogonal=False, seed=0, compute_dtype=None):
        """The base kernel's features of the selected columns (:class:`joker_ext.features.ColumnsFeatureMap`)."""
        if not self.supports_random_features:
            raise ValueError(no_random_features_message(self, n_features))
        return ColumnsFeatureMap(self.base.random_features(n_features, form=form, orthogonal=orthogonal, seed=seed,
                                                           compute_dtype=compute_dtype), self.dims)

    def scaled(self, factor: float) -> "ActiveDimsKernel":
        return ActiveDimsKernel(self.base.scaled(factor), self.dims)

    def describe(self) -> dict:
        return {"type": "active_dims", "dims": self.dims.tolist(), "base": self.base.describe()}

    def __repr__(self) -> str:
        return f"ActiveDimsKernel({self.base!r}, dims={self.dims.tolist()})"


def median_heuristic(
    X: ArrayLike,
    *,
    metric: str = "l2",
    max_points: int = 1000,
    seed: Optional[int] = 0,
) -> float:
    """Median of the pairwise distances between (at most ``max_points``) distinct sample points.

    ``sigma = median_{i < j} ||x_i - x_j||`` with the Euclidean norm (``metric='l2'``) or the Manhattan
    norm (``metric='l1'``, for ``laplacian_l1``). A random subsample drawn with ``seed`` keeps the cost at
    ``O(max_points^2 d)``. Zero distances (duplicated points) are ignored; if all points coincide, 1.0 is
    returned.
    """
    if metric not in ("l1", "l2"):
        raise ValueError(f"metric must be 'l1' or 'l2', got {metric!r}")
    Xt = torch.as_tensor(np.asarray(X.detach().cpu() if torch.is_tensor(X) else X, dtype=np.float64))
    if Xt.dim() != 2 or Xt.shape[0] < 2:
        raise ValueError(f"X must be a 2-D array with at least 2 rows for the median heuristic, got shape {tuple(Xt.shape)}")
    n = Xt.shape[0]
    if n > max_points:
        g = torch.Generator().manual_seed(0 if seed is None else int(seed))
        Xt = Xt[torch.randperm(n, generator=g)[:max_points]]
    D = torch.cdist(Xt, Xt, p=1.0 if metric == "l1" else 2.0)
    iu = torch.triu_indices(D.shape[0], D.shape[0], offset=1)
    d = D[iu[0], iu[1]]
    d = d[d > 0]
    if d.numel() == 0:
        return 1.0
    return float(np.median(d.numpy()))  # numpy's median averages the two middle values


# Kernel objects of other libraries (scikit-learn, Falkon, GPyTorch) are translated by joker_ext.adapters, which
# registers its translator here when it is imported (joker_ext's __init__ imports it): the core never imports
# its adapters.
_kernel_translator: Optional[Callable[[object], Kernel]] = None


def register_kernel_translator(translate: Callable[[object], Kernel]) -> None:
    """Set the function :func:`as_kernel` hands other libraries' kernel objects to."""
    global _kernel_translator
    _kernel_translator = translate


def as_kernel(kernel) -> Kernel:
    """``kernel`` as a :class:`Kernel`: joker_ext kernels unchanged, other libraries' kernel objects translated
    (:func:`joker_ext.adapters.translate_kernel`)."""
    if isinstance(kernel, Kernel):
        return kernel
    if _kernel_translator is None:
        raise TypeError(f"kernel must be a joker_ext kernel (joker_ext.adapters, which translates other libraries' "
                        f"kernels, is not loaded); got {type(kernel).__module__}.{type(kernel).__name__}")
    return _kernel_translator(kernel)


# Descriptions (``Kernel.describe()``) of kernels defined by joker_ext.adapters (scikit-learn kernel objects) are
# rebuilt by a loader the adapters register here, as for the translator above.
_kernel_loader: Optional[Callable[[dict], Kernel]] = None


def register_kernel_loader(load: Callable[[dict], Kernel]) -> None:
    """Set the function :func:`kernel_from_description` hands the descriptions it does not know to."""
    global _kernel_loader
    _kernel_loader = load


def kernel_from_description(desc: dict) -> Kernel:
    """Rebuild a kernel from its :meth:`describe` output (plain data: what checkpoints store).

    ``'stationary'``, ``'sum'``, ``'rational_quadratic'`` and ``'active_dims'`` descriptions are rebuilt here,
    the others (scikit-learn kernel objects) by the loader of :mod:`joker_ext.adapters`. A ``'callable'`` description (a function's name only) cannot be rebuilt.

    Raises
    ------
    TypeError
        For a description of a kernel that holds code (``CallableKernel``) or of an unknown type.
    """
    if not isinstance(desc, dict) or "type" not in desc:
        raise TypeError(f"a kernel description is a dict with a 'type' entry, got {desc!r}")
    kind = desc["type"]
    if kind == "stationary":
        return StationaryKernel(desc["family"], desc["sigma"], desc.get("nu"), desc.get("outputscale", 1.0))
    if kind == "sum":
        return SumKernel([kernel_from_description(p) for p in desc["parts"]])
    if kind == "rational_quadratic":
        return RationalQuadraticKernel(desc["sigma"], desc["alpha"], desc.get("outputscale", 1.0))
    if kind == "active_dims":
        return ActiveDimsKernel(kernel_from_description(desc["base"]), desc["dims"])
    if kind == "callable":
        raise TypeError(f"the kernel {desc.get('name', '?')!r} is evaluated by its own code (a CallableKernel), which "
                        "a description cannot hold; pickle the estimator instead")
    if _kernel_loader is None:
        raise TypeError(f"unknown kernel description type {kind!r} (joker_ext.adapters is not loaded)")
    return _kernel_loader(desc)


def make_kernel(
    kernel: Union[str, Kernel] = "gaussian",
    sigma: Union[ArrayLike, str] = 1.0,
    nu: Optional[float] = None,
    outputscale: float = 1.0,
    X: Optional[ArrayLike] = None,
    seed: Optional[int] = 0,
) -> Kernel:
    """Build a kernel from a family name and bandwidth (``sigma='median'`` needs ``X``).

    A :class:`Kernel` instance is returned unchanged.
    """
    if isinstance(kernel, Kernel):
        return kernel
    if not isinstance(kernel, str):
        raise TypeError(
            f"kernel must be one of {KERNEL_FAMILIES} or a kernel object, got {type(kernel).__name__}"
        )
    if kernel not in KERNEL_FAMILIES:
        raise ValueError(f"kernel must be one of {KERNEL_FAMILIES} or a kernel object, got {kernel!r}")
    if isinstance(sigma, str):
        if sigma != "median":
            raise ValueError(f"sigma must be a positive number, a per-dimension array or 'median', got {sigma!r}")
        if X is None:
            raise ValueError("sigma='median' needs the training data X")
        sigma = median_heuristic(X, metric="l1" if kernel == "laplacian_l1" else "l2", seed=seed)
    if kernel == "matern" and nu is None:
        nu = 1.5
    return StationaryKernel(kernel, sigma, nu if kernel == "matern" else None, outputscale)
