"""Kernel descriptions: the common currency every adapter translates into.

A kernel here is a small object that knows how to evaluate itself on two blocks of points
(``kernel(X1, X2) -> Tensor``), how to multiply its matrix with a vector without storing it
(:meth:`Kernel.mmv`), and, for the stationary families, how to describe its spectral density so that
:mod:`joker_ext.features` can draw random features from it.

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
============== =================================================== ==============================

``sigma`` is a scalar or one bandwidth per input dimension (GPyTorch's ARD lengthscales); ``s`` is the
output scale (GPyTorch's ScaleKernel ``outputscale``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch

__all__ = [
    "Kernel",
    "StationaryKernel",
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
    "as_kernel",
    "register_kernel_translator",
    "kernel_from_description",
    "register_kernel_loader",
    "KERNEL_FAMILIES",
]

KERNEL_FAMILIES = ("gaussian", "laplacian", "laplacian_l1", "matern")
MATERN_NUS = (0.5, 1.5, 2.5)

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[float], float]


def keops_available() -> bool:
    """Return True when ``pykeops`` can be imported (it compiles kernels on first use)."""
    try:
        import pykeops.torch  # noqa: F401
    except Exception:  # pragma: no cover - depends on the machine
        return False
    return True


class Kernel:
    """Base class of joker_ext kernels.

    Subclasses implement :meth:`__call__` (a dense block of the kernel matrix). :meth:`mmv`
    computes ``K(X1, X2) @ v`` in row chunks so that no more than ``chunk_size x len(X2)`` kernel values
    are held at once.
    """

    #: True when random features can be drawn for this kernel (see :mod:`joker_ext.features`).
    supports_random_features: bool = False

    def __call__(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        """Diagonal ``k(x_i, x_i)``; stationary kernels override this with a constant."""
        return torch.stack([self(X[i : i + 1], X[i : i + 1])[0, 0] for i in range(X.shape[0])])

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


@dataclass(eq=False)
class StationaryKernel(Kernel):
    """A stationary kernel of one of the families in :data:`KERNEL_FAMILIES`.

    ``k(x, y) = outputscale * profile(||(x - y) / sigma||)`` with the profile of the family (see the
    module docstring). The description is independent of device and dtype; evaluation follows the dtype
    and device of its inputs.

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

    def scale_inputs(self, X: torch.Tensor) -> torch.Tensor:
        """Return ``X / sigma`` (per dimension when ``sigma`` is a vector)."""
        sigma = self.sigma.to(device=X.device, dtype=X.dtype)
        if sigma.dim() == 1 and sigma.numel() > 1 and sigma.numel() != X.shape[1]:
            raise ValueError(
                f"sigma has {sigma.numel()} entries but the data have {X.shape[1]} features; "
                "pass a scalar or one bandwidth per feature"
            )
        return X / sigma

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

    def scaled_distance(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        """Distances between scaled points: squared L2 (gaussian), L1 (laplacian_l1) or L2 (others)."""
        A, B = self.scale_inputs(X1), self.scale_inputs(X2)
        if self.family == "laplacian_l1":
            return torch.cdist(A, B, p=1.0)
        # Squared distances through a centred Gram product: accurate and matmul-fast.
        mean = B.mean(dim=0, keepdim=True) if B.shape[0] > 0 else 0.0
        A = A - mean
        B = B - mean
        # in place on the product: one n1 x n2 allocation (large blocks are memory-bound)
        sq = (A @ B.T).mul_(-2.0).add_((A * A).sum(1, keepdim=True)).add_((B * B).sum(1).unsqueeze(0))
        sq.clamp_(min=0.0)
        if self.family == "gaussian":
            return sq
        return sq.sqrt_()

    # ------------------------------------------------------------------ Kernel API
    def __call__(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        """Dense block ``K(X1, X2)`` in the dtype and on the device of ``X1``."""
        r = self.scaled_distance(X1, X2)
        if self.family == "gaussian":
            K = r.mul_(-0.5).exp_()  # the profile, in place on the fresh distance block
        else:
            K = self.profile(r)
        if self.outputscale != 1.0:
            K.mul_(self.outputscale)
        return K

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

    def describe(self) -> dict:
        return {"type": "sum", "parts": [p.describe() for p in self.parts]}

    def __repr__(self) -> str:
        return " + ".join(repr(p) for p in self.parts)


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

    def __repr__(self) -> str:
        return f"CallableKernel({self.name})"


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


# Descriptions (``Kernel.describe()``) of kernels defined by joker_ext.adapters (scikit-learn kernel objects, the
# GPyTorch adapter's RQ and active-dims kernels) are rebuilt by a loader the adapters register here, as for the
# translator above.
_kernel_loader: Optional[Callable[[dict], Kernel]] = None


def register_kernel_loader(load: Callable[[dict], Kernel]) -> None:
    """Set the function :func:`kernel_from_description` hands the descriptions it does not know to."""
    global _kernel_loader
    _kernel_loader = load


def kernel_from_description(desc: dict) -> Kernel:
    """Rebuild a kernel from its :meth:`describe` output (plain data: what checkpoints store).

    ``'stationary'`` and ``'sum'`` descriptions are rebuilt here, the others by the loader of
    :mod:`joker_ext.adapters`. A ``'callable'`` description (a function's name only) cannot be rebuilt.

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
