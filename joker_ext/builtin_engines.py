"""The built-in engines, registered with :mod:`joker_ext.engines` by importing their modules.

Each engine module registers itself (``register_solver(...)`` at its end) and imports the registry to do so;
the registry imports none of them. This module imports them all, and ``joker_ext/__init__.py`` imports this
module, so ``import joker_ext`` (which any ``import joker_ext.<module>`` runs first) leaves the registry
complete: the import graph has edges ``joker_ext -> builtin_engines -> engine -> engines`` and no way back.

=========== ========== ==============================
name        mode       module
=========== ========== ==============================
dbcd_tr     both       :mod:`joker_ext.solver`
active_set  exact      :mod:`joker_ext.active_set`
working_set exact      :mod:`joker_ext.working_set`
newton      exact      :mod:`joker_ext.newton_exact`
newton      features   :mod:`joker_ext.primal_newton`
=========== ========== ==============================
"""
from __future__ import annotations

from . import active_set, newton_exact, primal_newton, solver, working_set  # noqa: F401  (they register themselves)

__all__: list = []
