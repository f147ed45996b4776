"""joker_ext: kernel machines for any convex loss, at scale.

The Joker solver (dual block coordinate descent with a trust region, DBCD-TR) over a registry of
conjugate losses, with exact kernels or random features, and faces for scikit-learn
(:class:`JokerRegressor`, :class:`JokerClassifier`), Falkon (:class:`JokerFalkon`) and GPyTorch
(:class:`JokerGP`).
"""
from .estimators import JokerClassifier, JokerRegressor
from .kernels import (
    ActiveDimsKernel,
    CallableKernel,
    GaussianKernel,
    Kernel,
    LaplacianKernel,
    LaplacianL1Kernel,
    MaternKernel,
    RationalQuadraticKernel,
    SpectralKernel,
    StationaryKernel,
    SumKernel,
    make_kernel,
    median_heuristic,
)
from .features import NystromFeatureMap, RandomFeatureMap, make_feature_map
from .losses import Loss, available_losses, get_loss, infimal_convolution, register_loss, scaled
from .solver import SolverOptions, SolverResult, dbcd_tr
from . import builtin_engines  # noqa: E402,F401  (registers the built-in engines with joker_ext.engines)

__version__ = "0.1.0"

__all__ = [
    "JokerRegressor",
    "JokerClassifier",
    "Kernel",
    "StationaryKernel",
    "GaussianKernel",
    "LaplacianKernel",
    "LaplacianL1Kernel",
    "MaternKernel",
    "SumKernel",
    "CallableKernel",
    "SpectralKernel",
    "RationalQuadraticKernel",
    "ActiveDimsKernel",
    "make_kernel",
    "median_heuristic",
    "RandomFeatureMap",
    "NystromFeatureMap",
    "make_feature_map",
    "Loss",
    "get_loss",
    "register_loss",
    "available_losses",
    "infimal_convolution",
    "scaled",
    "SolverOptions",
    "SolverResult",
    "dbcd_tr",
]

# Faces that live in joker_ext.adapters, imported on first access (their optional dependencies stay optional).
_LAZY = {
    "JokerFalkon": "joker_ext.adapters.falkon",
    "JokerLogisticFalkon": "joker_ext.adapters.falkon",
    "JokerGP": "joker_ext.adapters.gpytorch",
}
__all__ += list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'joker_ext' has no attribute {name!r}")


def _expose_source_adapters() -> None:
    """Make ``joker_ext.adapters`` importable from a source checkout that was not pip-installed.

    Installed copies map the top-level ``adapters/`` folder to ``joker_ext.adapters`` (pyproject.toml);
    running from the repository root without installing finds ``joker_ext`` in the working directory
    instead, where ``adapters/`` is a sibling folder. This registers that folder under the same name.
    """
    import importlib.util
    import sys
    from pathlib import Path

    if "joker_ext.adapters" in sys.modules or importlib.util.find_spec("joker_ext.adapters") is not None:
        return
    folder = Path(__file__).resolve().parent.parent / "adapters"
    init = folder / "__init__.py"
    if not init.is_file():
        return
    spec = importlib.util.spec_from_file_location("joker_ext.adapters", init, submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["joker_ext.adapters"] = module
    spec.loader.exec_module(module)


_expose_source_adapters()

# joker_ext.adapters registers the translator of other libraries' kernel objects (scikit-learn, Falkon, GPyTorch)
# with joker_ext.kernels; importing it here imports none of those libraries.
from . import adapters  # noqa: E402,F401

# the compiled loops numba's cache holds are read now rather than inside the first fit (the import never compiles)
from .compiled import load_unless_lazy  # noqa: E402

load_unless_lazy()
