"""Fixtures shared by the comparison tests."""
import pytest
import torch
from threadpoolctl import threadpool_limits


@pytest.fixture(scope="module")
def single_thread():
    """Torch and the BLAS/OpenMP pools on one thread for a module: small dense LAPACK calls are much faster
    single-threaded on a shared 2-core machine. A module opts in with
    ``pytestmark = pytest.mark.usefixtures("single_thread")``."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(old)
