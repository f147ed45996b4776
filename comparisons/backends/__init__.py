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
in ``comparisons.runner._BACKEND_MODULES`` and in ``comparisons.spec.ALL_BACKENDS``.
"""
from .base import Backend, Problem, Skip

__all__ = ["Backend", "Problem", "Skip"]
