"""Fixtures shared by the adapter tests (Falkon and GPyTorch)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Small problems: on the shared 2-core CI machine one BLAS thread is several times faster than two
    competing ones. Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fk():
    """The Falkon package, or skip (Falkon is optional: it is installed from its public source)."""
    return pytest.importorskip("falkon")


@pytest.fixture
def fopt(fk):
    """Falkon options used throughout: CPU, no KeOps (fast, deterministic)."""
    return fk.FalkonOptions(use_cpu=True, keops_active="no")
