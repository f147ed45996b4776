"""The seed papers' solvers, written as the project's own harness backends.

* :class:`EigenPro2`, :class:`EigenPro3` -- seed 001 (Abedsoltan, Belkin & Pandit): Nystrom-preconditioned SGD
  on ``K alpha = y`` and projected preconditioned SGD over centres.
* :class:`ASkotch` -- seed 004 (Rathore, Frangella & Udell): preconditioned, accelerated block coordinate
  descent for ``(K + lam I) w = y``, ``lam = n * lambda_Falkon``.
* :class:`DoublyStochasticGradient` -- seed 003 (Dai et al.): random-feature functional SGD, features
  regenerated from per-iteration seeds.
* :class:`ADMMSVM` -- seed 002 (Cipolla & Gondzio): ADMM on the SVM dual with a once-factorised
  ``K + beta I``, dense or :class:`HSSMatrix`-compressed.

Every class records in ``notes`` what it could not honour.
"""
from .admm_svm import ADMMSVM, paper_beta, svm_dual_objective
from .askotch import ASkotch
from .dsg import DoublyStochasticGradient
from .eigenpro import EigenPro2, EigenPro3
from .hss import HSSFactorization, HSSMatrix

__all__ = [
    "ADMMSVM",
    "ASkotch",
    "DoublyStochasticGradient",
    "EigenPro2",
    "EigenPro3",
    "HSSFactorization",
    "HSSMatrix",
    "paper_beta",
    "svm_dual_objective",
]
