import numpy as np
import pytest
import torch


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def make_regression(n=120, d=3, seed=0):
    g = np.random.default_rng(seed)
    X = g.standard_normal((n, d))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 + 0.1 * g.standard_normal(n)
    return X, y


def make_binary(n=120, d=3, seed=0):
    g = np.random.default_rng(seed)
    X = g.standard_normal((n, d))
    y = np.where(X[:, 0] + 0.5 * np.sin(3 * X[:, 1]) + 0.3 * g.standard_normal(n) > 0, 1.0, -1.0)
    return X, y
