"""Harness backends: one small module per library or solver (see :mod:`comparisons.backends.base`).

=============== ================================================ =========================================
name            module                                           model
=============== ================================================ =========================================
joker           :mod:`comparisons.backends.joker`                Joker DBCD-TR, exact kernel, any loss
joker_rf        :mod:`comparisons.backends.joker`                Joker with M random features
joker_nystrom   :mod:`comparisons.backends.joker`                Joker with M Nystrom centres
falkon          :mod:`comparisons.backends.falkon`               Falkon / LogisticFalkon (if installed)
sklearn         :mod:`comparisons.backends.sklearn`              KernelRidge, SVC, LogisticRegression, ...
gpytorch        :mod:`comparisons.backends.gpytorch`             exact GP posterior mean
eigenpro2       :mod:`comparisons.backends.eigenpro`             EigenPro 2 (seed 001)
eigenpro3       :mod:`comparisons.backends.eigenpro`             EigenPro 3 (seed 001)
askotch         :mod:`comparisons.backends.askotch`              ASkotch (seed 004)
dsg             :mod:`comparisons.backends.dsg`                  doubly stochastic gradients (seed 003)
admm_svm        :mod:`comparisons.backends.admm_svm`             ADMM (+ HSS) SVM (seed 002)
=============== ================================================ =========================================

Adding a backend: write a module with a :class:`~comparisons.backends.base.Backend` subclass, register it
in :data:`BACKEND_MODULES` below and in ``comparisons.spec.ALL_BACKENDS``.
"""
import importlib

from joker_ext.validation import check_choice

from .base import Backend, Problem, Skip

__all__ = ["Backend", "Problem", "Skip", "BACKEND_MODULES", "backend_class"]

#: name -> (module, class) of each backend; a backend's module is imported only when the backend is used.
#: A backend added here at run time (the harness's tests add backends that fail on purpose) is accepted by
#: name, but is not part of ``--backends all`` (``comparisons.spec.ALL_BACKENDS``).
BACKEND_MODULES = {
    "joker": ("comparisons.backends.joker", "JokerBackend"),
    "joker_rf": ("comparisons.backends.joker", "JokerRFBackend"),
    "joker_nystrom": ("comparisons.backends.joker", "JokerNystromBackend"),
    "falkon": ("comparisons.backends.falkon", "FalkonBackend"),
    "sklearn": ("comparisons.backends.sklearn", "SklearnBackend"),
    "gpytorch": ("comparisons.backends.gpytorch", "GPyTorchBackend"),
    "eigenpro2": ("comparisons.backends.eigenpro", "EigenPro2Backend"),
    "eigenpro3": ("comparisons.backends.eigenpro", "EigenPro3Backend"),
    "askotch": ("comparisons.backends.askotch", "ASkotchBackend"),
    "dsg": ("comparisons.backends.dsg", "DSGBackend"),
    "admm_svm": ("comparisons.backends.admm_svm", "ADMMSVMBackend"),
}


def backend_class(name: str):
    """The backend class registered under ``name`` (imports its module, which imports nothing heavy)."""
    check_choice("backend", name, tuple(BACKEND_MODULES))
    module, cls = BACKEND_MODULES[name]
    return getattr(importlib.import_module(module), cls)
