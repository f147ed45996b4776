"""Test-wide settings.

Tests run on small problems where one thread is as fast as two, and several test processes (or other
work) may share the machine's cores: oversubscribed OpenMP threads slow small dense kernels (eigh,
QR) down by orders of magnitude, so the suite pins torch to one thread.

Falkon is optional: its tests skip without it (``pytest.importorskip("falkon")``). With
``JOKER_REQUIRE_FALKON=1`` (set by ``.ci/run`` when it installed Falkon) the session stops at once if Falkon
cannot be imported, so that those tests cannot skip silently.
"""
import os

import pytest
import torch

torch.set_num_threads(1)


def pytest_configure(config):
    if os.environ.get("JOKER_REQUIRE_FALKON", "") not in ("", "0"):
        try:
            import falkon  # noqa: F401
        except ImportError as exc:
            raise pytest.UsageError(f"JOKER_REQUIRE_FALKON is set but Falkon cannot be imported: {exc!r}") from exc


class PairDataset(torch.utils.data.Dataset):
    """A map-style Dataset of ``(x, y)`` pairs that is not a TensorDataset: the adapters' generic Dataset path."""

    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return len(self.X)

    def __getitem__(self, i):
        return self.X[i], self.y[i]


@pytest.fixture(scope="session")
def pair_dataset():
    """The class :class:`PairDataset` (a fixture: test modules do not import conftest files)."""
    return PairDataset
