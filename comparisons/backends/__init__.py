"""Harness backends: one small module per library or solver (see :mod:`joker_ext.comparisons.backends.base`).

=============== ==================================================== =========================================
name            module                                               model
=============== ==================================================== =========================================
joker           :mod:`joker_ext.comparisons.backends.joker`          Joker DBCD-TR, exact kernel, any loss
joker_rf        :mod:`joker_ext.comparisons.backends.joker`          Joker with M random features
joker_nystrom   :mod:`joker_ext.comparisons.backends.joker`          Joker with M Nystrom centres
falkon          :mod:`joker_ext.comparisons.backends.falkon`         Falkon / LogisticFalkon (if installed)
sklearn         :mod:`joker_ext.comparisons.backends.sklearn`        KernelRidge, SVC, LogisticRegression, ...
gpytorch        :mod:`joker_ext.comparisons.backends.gpytorch`       exact GP posterior mean
eigenpro2       :mod:`joker_ext.comparisons.backends.eigenpro`       EigenPro 2 (seed 001)
eigenpro3       :mod:`joker_ext.comparisons.backends.eigenpro`       EigenPro 3 (seed 001)
askotch         :mod:`joker_ext.comparisons.backends.askotch`        ASkotch (seed 004)
dsg             :mod:`joker_ext.comparisons.backends.dsg`            doubly stochastic gradients (seed 003)
admm_svm        :mod:`joker_ext.comparisons.backends.admm_svm`       ADMM (+ HSS) SVM (seed 002)
=============== ==================================================== =========================================

Adding a backend: write a module with a :class:`~joker_ext.comparisons.backends.base.Backend` subclass,
register it in :data:`BACKEND_MODULES` below and in ``joker_ext.comparisons.spec.ALL_BACKENDS``.
"""
import importlib

from joker_ext.validation import check_choice

from .base import Backend, Problem, Skip

__all__ = ["Backend", "Problem", "Skip", "BACKEND_MODULES", "backend_class"]

#: name -> (module, class) of each backend; a backend's module is imported only when the backend is used.
#: A backend added here at run time (the harness's tests add backends that fail on purpose) is accepted by
#: name, but is not part of ``--backends all`` (``joker_ext.comparisons.spec.ALL_BACKENDS``).
BACKEND_MODULES = {
    "joker": ("joker_ext.comparisons.backends.joker", "JokerBackend"),
    "joker_rf": ("joker_ext.comparisons.backends.joker", "JokerRFBackend"),
    "joker_nystrom": ("joker_ext.comparisons.backends.joker", "JokerNystromBackend"),
    "falkon": ("joker_ext.comparisons.backends.falkon", "FalkonBackend"),
    "sklearn": ("joker_ext.comparisons.backends.sklearn", "SklearnBackend"),
    "gpytorch": ("joker_ext.comparisons.backends.gpytorch", "GPyTorchBackend"),
    "eigenpro2": ("joker_ext.comparisons.backends.eigenpro", "EigenPro2Backend"),
    "eigenpro3": ("joker_ext.comparisons.backends.eigenpro", "EigenPro3Backend"),
    "askotch": ("joker_ext.comparisons.backends.askotch", "ASkotchBackend"),
    "dsg": ("joker_ext.comparisons.backends.dsg", "DSGBackend"),
    "admm_svm": ("joker_ext.comparisons.backends.admm_svm", "ADMMSVMBackend"),
}


def backend_class(name: str):
    """The backend class registered under ``name`` (imports its module, which imports nothing heavy)."""
    check_choice("backend", name, tuple(BACKEND_MODULES))
    module, cls = BACKEND_MODULES[name]
    return getattr(importlib.import_module(module), cls)
