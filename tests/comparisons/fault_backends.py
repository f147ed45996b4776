"""Backends that fail on purpose, for the harness's own tests (kept out of the installed package).

``test_harness.py`` registers them in :data:`joker_ext.comparisons.backends.BACKEND_MODULES` under the module name
``fault_backends`` (pytest puts this folder on ``sys.path``, and the harness's run processes inherit it).

``_crash`` raises in ``fit``; ``_hang`` sleeps until it is killed; ``_die`` ends its process abruptly
(as an out-of-memory kill would). The harness must record each with its error and lose no other result.
``_alloc`` succeeds after touching :data:`ALLOC_MB` MB in ``fit`` (the memory columns must show it).
"""
from __future__ import annotations

import os
import time

import numpy as np

from joker_ext.comparisons.backends.base import Backend

__all__ = ["CrashBackend", "HangBackend", "DieBackend", "AllocBackend", "ALLOC_MB"]

#: Megabytes that AllocBackend.fit allocates and touches.
ALLOC_MB = 200


class CrashBackend(Backend):
    name = "_crash"
    uses_M = False

    def fit(self, X, y, trace) -> None:
        self.note("this backend raises on purpose")
        raise RuntimeError("deliberate failure in fit")

    def predict(self, X):  # pragma: no cover - never reached
        return np.zeros(len(X))


class HangBackend(Backend):
    name = "_hang"
    uses_M = False

    def fit(self, X, y, trace) -> None:
        while True:
            time.sleep(0.05)

    def predict(self, X):  # pragma: no cover - never reached
        return np.zeros(len(X))


class DieBackend(Backend):
    name = "_die"
    uses_M = False

    def fit(self, X, y, trace) -> None:
        os._exit(3)

    def predict(self, X):  # pragma: no cover - never reached
        return np.zeros(len(X))


class AllocBackend(Backend):
    name = "_alloc"
    uses_M = False

    def fit(self, X, y, trace) -> None:
        block = np.ones(ALLOC_MB * 2**20 // 8)  # every page written
        self.mean = float(block[::4096].mean())

    def predict(self, X):
        return np.full(len(X), self.mean)
