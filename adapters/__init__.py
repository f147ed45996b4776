"""Bridges from other kernel libraries into joker_ext (installed as ``joker_ext.adapters``).

One module per ecosystem: :mod:`joker_ext.adapters.falkon`, :mod:`joker_ext.adapters.gpytorch`,
:mod:`joker_ext.adapters.sklearn`. They only translate objects into joker_ext's own kernel and loss
descriptions; no solver logic lives here.
"""
from __future__ import annotations

from joker_ext.kernels import Kernel, register_kernel_loader, register_kernel_translator

__all__ = ["translate_kernel", "load_kernel_description"]


def translate_kernel(kernel) -> Kernel:
    """Translate a kernel object of a supported library into a :class:`joker_ext.kernels.Kernel`.

    joker_ext kernels are returned unchanged; Falkon kernels (``falkon.kernels.*``) and GPyTorch kernels
    (``gpytorch.kernels.*``) are translated by their adapters. Anything else raises TypeError naming what
    came in.
    """
    if isinstance(kernel, Kernel):
        return kernel
    module = type(kernel).__module__ or ""
    root = module.split(".")[0]
    if root == "falkon":
        from . import falkon as _falkon

        return _falkon.translate_kernel(kernel)
    if root == "gpytorch":
        from . import gpytorch as _gpytorch

        return _gpytorch.translate_kernel(kernel)
    if root == "sklearn":
        from . import sklearn as _sklearn

        return _sklearn.translate_kernel(kernel)
    # A user's own kernel class (defined outside gpytorch) that subclasses gpytorch.kernels.Kernel.
    import sys

    _gp = sys.modules.get("gpytorch")
    if _gp is not None and isinstance(kernel, _gp.kernels.Kernel):
        from . import gpytorch as _gpytorch

        return _gpytorch.translate_kernel(kernel)
    raise TypeError(
        "kernel must be 'gaussian', 'laplacian', 'laplacian_l1', 'matern', a joker_ext kernel, a Falkon kernel "
        f"or a GPyTorch kernel; got an object of type {type(kernel).__module__}.{type(kernel).__name__}"
    )


def load_kernel_description(desc: dict) -> Kernel:
    """Rebuild a kernel of an adapter from its ``describe()`` output (what checkpoints hold): scikit-learn kernel
    objects (``'sklearn'``, ``'sklearn_pairwise'``). The core's own kernels (stationary, sums, rational quadratic,
    active dims) are rebuilt by :func:`joker_ext.kernels.kernel_from_description` itself."""
    kind = desc.get("type")
    if kind in ("sklearn", "sklearn_pairwise"):
        from . import sklearn as _sklearn

        return _sklearn.load_description(desc)
    raise TypeError(f"unknown kernel description type {kind!r}")


# The core (joker_ext.kernels.as_kernel, used by the scikit-learn estimators; kernel_from_description, used by
# checkpoints) reaches other libraries' kernels through these two functions, without importing the adapters itself.
register_kernel_translator(translate_kernel)
register_kernel_loader(load_kernel_description)
