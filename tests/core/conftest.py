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


# Parameters of the huber, epsilon-insensitive and pinball losses in the tests against cvxpy.
PARAMS = dict(delta=0.4, epsilon=0.15, quantile=0.3)


def cvxpy_primal(loss_name, K, y, c, intercept=False):
    """min_theta 1/2 ||theta||^2 + sum_i c_i l(y_i, (L theta)_i [+ b]), K = L L^T (independent of joker_ext);
    with ``intercept`` the unregularized ``b`` is a variable too.

    The optimal value is that of the kernel problem with kernel matrix K, whatever the factor: for
    random features, ``K = Phi Phi^T`` gives the primal ``min_w 1/2 ||w||^2 + sum_i c_i l(y_i, (Phi w)_i)``.
    """
    import cvxpy as cp

    lam, Q = np.linalg.eigh(K)
    L = Q * np.sqrt(np.clip(lam, 0, None))
    th = cp.Variable(K.shape[0])
    f = L @ th + (cp.Variable() if intercept else 0.0)
    r = y - f
    m = cp.multiply(y, f)
    d, e, q = PARAMS["delta"], PARAMS["epsilon"], PARAMS["quantile"]
    terms = {
        "squared": 0.5 * cp.square(r),
        "huber": 0.5 * cp.huber(r, d),
        "epsilon_insensitive": cp.pos(cp.abs(r) - e),
        "absolute": cp.abs(r),
        "pinball": cp.maximum(q * r, (q - 1) * r),
        "hinge": cp.pos(1 - m),
        "squared_hinge": 0.5 * cp.square(cp.pos(1 - m)),
        "logistic": cp.logistic(-m),
    }[loss_name]
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(th) + cp.sum(cp.multiply(c, terms))))
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    return prob.value


def spy(cls, made: list):
    """``cls``, recording every instance it makes in ``made`` (for monkeypatching a class an engine instantiates)."""
    class Spy(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)
    return Spy

