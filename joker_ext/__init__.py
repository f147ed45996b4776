"""joker_ext: kernel machines for any convex loss, at scale.

The Joker solver (dual block coordinate descent with a trust region, DBCD-TR) over a registry of
conjugate losses, with exact kernels or random features, and faces for scikit-learn
(:class:`JokerRegressor`, :class:`JokerClassifier`), Falkon (:class:`JokerFalkon`) and GPyTorch
(:class:`JokerGP`).
"""
from .estimators import JokerClassifier, JokerRegressor
from .kernels import (
    CallableKernel,
    GaussianKernel,
    Kernel,
    LaplacianKernel,
    LaplacianL1Kernel,
    MaternKernel,
    StationaryKernel,
    SumKernel,
    make_kernel,
    median_heuristic,
)
from .features import NystromFeatureMap, RandomFeatureMap, make_feature_map
from .losses import Loss, available_losses, get_loss, infimal_convolution, register_loss, scaled
from .solver import SolverOptions, SolverResult, dbcd_tr

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
