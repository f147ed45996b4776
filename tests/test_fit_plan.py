"""The fit plan (joker_ext.plan): one builder under every front end.

Properties checked: every front end given the same settings builds an equal plan (and the plan is what the fit
ran: same engine, options and costs); the policies (tolerance, block size, iteration budget, engine, intercept)
follow their documented rules; bad input raises an error naming the argument, what was expected and what came
in; the seed solvers' checks are joker_ext.validation's.
"""
import math

import numpy as np
import pytest
import torch

from joker_ext import JokerClassifier, JokerRegressor
from joker_ext.adapters.falkon import JokerFalkon, JokerLogisticFalkon
from joker_ext.checkpoint import load_estimator, save_estimator
from joker_ext.defaults import PRACTICAL_TOL, PRECISION_TOL, default_block_size, default_max_iter
from joker_ext.engines import default_max_iter as engine_max_iter
from joker_ext.features import NystromFeatureMap, RandomFeatureMap
from joker_ext.kernels import StationaryKernel
from joker_ext.losses import get_loss
from joker_ext.plan import FEATURE_MODES, FitPlan, feature_map_for, make_fit_plan

N, D = 256, 3
C = 0.25  # C = 1 / (n penalty) with penalty = 1/64: exact in binary, so every face computes the same C


@pytest.fixture(scope="module")
def data():
    rs = np.random.RandomState(0)
    X = rs.randn(N, D)
    y = np.sin(X[:, 0]) + 0.1 * rs.randn(N)
    return X, y


def _kernel():
    return StationaryKernel("gaussian", 1.3)


class _Trace:
    """What the harness's joker backends record into (only its interface)."""

    def __init__(self):
        self.points = []

    def record(self, **kw):
        self.points.append(kw)


# ---------------------------------------------------------------------------- the same settings, the same plan
SETTINGS = dict(n_features=32, features="orf", seed=5, tol=1e-9, block_size=64, max_iter=40, max_time=420.0)


def _estimator_plan(X, y, kernel, **over):
    s = {**SETTINGS, **over}
    m = JokerRegressor(kernel=kernel, C=C, n_features=s["n_features"], features=s["features"], random_state=s["seed"],
                       tol=s["tol"], block_size=s["block_size"], max_iter=s["max_iter"], max_time=s["max_time"]).fit(X, y)
    return m.fit_plan_


def _falkon_plan(X, y, kernel, **over):
    s = {**SETTINGS, **over}
    m = JokerFalkon(kernel, 1.0 / (N * C), M=s["n_features"], features=s["features"], seed=s["seed"], tol=s["tol"],
                    block_size=s["block_size"], maxiter=s["max_iter"], max_time=s["max_time"]).fit(
        torch.as_tensor(X), torch.as_tensor(y))
    return m.fit_plan_


def _harness_plan(X, y, kernel):
    from joker_ext.comparisons.backends import backend_class
    from joker_ext.comparisons.backends.base import Problem
    from joker_ext.comparisons.spec import ExperimentSpec

    s = SETTINGS
    spec = ExperimentSpec(kernel="gaussian", sigma=float(kernel.sigma), penalty=1.0 / (N * C), M=s["n_features"],
                          tol=s["tol"], seed=s["seed"], backends=("joker_rf",), max_time=s["max_time"],
                          options={"joker_rf": {"features": s["features"], "block_size": s["block_size"],
                                                "max_iter": s["max_iter"]}})
    b = backend_class("joker_rf")(spec, Problem("regression", N, 10, D))
    b.check()
    b.fit(X, y, _Trace())
    # the harness alone turns Ctrl-C handling off (its runner owns the signal) and traces every CG iterate of the
    # Newton engine (reporting only: the fit is the same): its two documented differences
    assert b.fit_plan_.options.handle_sigint is False and b.fit_plan_.options.callback_cg_every == 1
    return b.fit_plan_.replace(options={"handle_sigint": True, "callback_cg_every": None})


def test_every_front_end_builds_the_same_plan(data):
    X, y = data
    k = _kernel()
    plans = {"JokerRegressor": _estimator_plan(X, y, k), "JokerFalkon": _falkon_plan(X, y, k),
             "harness joker_rf": _harness_plan(X, y, k)}
    ref = plans["JokerRegressor"]
    assert isinstance(ref, FitPlan) and ref.features == "orf" and ref.n_features == 32 and ref.solver == "newton"
    for name, plan in plans.items():
        assert plan.describe() == ref.describe(), name
        assert plan == ref, name


def test_the_gpytorch_face_builds_the_same_plan(data):
    gpytorch = pytest.importorskip("gpytorch")
    from joker_ext.adapters.gpytorch import JokerGP

    X, y = data
    cov = gpytorch.kernels.RBFKernel().double()
    cov.lengthscale = 1.3
    lik = gpytorch.likelihoods.GaussianLikelihood().double()
    s = SETTINGS
    gp = JokerGP(cov, lik, C=C, n_features=s["n_features"], features=s["features"], seed=s["seed"], tol=s["tol"],
                 block_size=s["block_size"], max_iter=s["max_iter"], max_time=s["max_time"]).fit(
        torch.as_tensor(X), torch.as_tensor(y))
    est = _estimator_plan(X, y, gp.kernel_)
    assert gp.fit_plan_ == est
    assert gp.fit_plan_.describe() == est.describe()
    # without C the costs are the likelihood's precisions 1 / noise
    gp2 = JokerGP(cov, lik, n_features=8).fit(torch.as_tensor(X), torch.as_tensor(y))
    assert torch.allclose(gp2.fit_plan_.c, torch.full((N,), 1.0 / float(lik.noise.detach()), dtype=torch.float64))


def test_the_plan_is_what_the_fit_ran(data):
    X, y = data
    m = JokerRegressor(n_features=40, solver="dbcd_tr", max_iter=30, tol=1e-8, random_state=2).fit(X, y)
    plan = m.fit_plan_
    assert m.solver_ == plan.solver == m._model_cache.extra["solver"] == "dbcd_tr"
    assert m.block_size_ == plan.options.block_size and m.feature_map_ is plan.feature_map
    assert m.kernel_ is plan.kernel and m.loss_ is plan.loss and m.n_iter_ <= plan.options.max_iter
    refit = plan.fit(torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1))
    assert torch.equal(refit.alpha.cpu(), torch.as_tensor(m.dual_coef_))


def test_load_estimator_rebuilds_the_fitted_plan(data, tmp_path):
    X, y = data
    m = JokerRegressor(n_features=24, features="cos", random_state=7).fit(X, y)
    path = save_estimator(m, tmp_path / "m.pt")
    back = load_estimator(path)
    assert back.solver_ == m.solver_ and back.dtype_ == m.dtype_ and back.device_ == m.device_
    assert back.gamma_ == m.gamma_ and back.sigma_ == m.sigma_
    Z = torch.randn(5, D, dtype=torch.float64)
    assert torch.equal(back.feature_map_(Z), m.feature_map_(Z))


def test_logistic_falkon_plans_each_stage_with_its_penalty(data):
    X, y = data
    Y = torch.as_tensor(np.where(y > 0, 1.0, -1.0))
    m = JokerLogisticFalkon(_kernel(), [1e-2, 1e-3], [2, 2], "logistic", 16, seed=0).fit(torch.as_tensor(X), Y)
    assert m.fit_plan_.C == pytest.approx(1.0 / (N * 1e-3)) and m.fit_plan_.solver == m.solver_ == "newton"
    assert m.fit_plan_.options.max_iter == 1  # one Newton step per stage, as LogisticFalkon
    searched = JokerLogisticFalkon(_kernel(), [1e-2, 1e-3], [2, 3], "logistic", 16, seed=0,
                                   fit_intercept=True).fit(torch.as_tensor(X), Y)
    assert searched.fit_plan_.options.max_iter == 3  # the intercept search's Newton iterations of the last stage


# ---------------------------------------------------------------------------- policies
def _plan(**kw):
    kw.setdefault("n", 300)
    return make_fit_plan(kw.pop("kernel", _kernel()), kw.pop("loss", get_loss("squared")), **kw)


def test_tolerance_policy():
    # given > second-order default (engines other than DBCD-TR) > front end's default > working precision
    assert _plan(tol=1e-5, solver="newton", second_order_tol=1e-3).options.tol == 1e-5
    assert _plan(solver="newton", second_order_tol=1e-3, default_tol=1e-4).options.tol == 1e-3
    assert _plan(solver="dbcd_tr", second_order_tol=1e-3, default_tol=1e-4).options.tol == 1e-4
    assert _plan(solver="dbcd_tr").options.tol == PRECISION_TOL[torch.float64] == 1e-14
    assert _plan(solver="dbcd_tr", dtype="float32").options.tol == PRECISION_TOL[torch.float32] == 1e-7
    assert JokerFalkon(_kernel(), 1e-3, M=10).fit(torch.randn(50, 2, dtype=torch.float64),
                                                  torch.randn(50, dtype=torch.float64)).fit_plan_.options.tol \
        == PRACTICAL_TOL


@pytest.mark.parametrize("n,loss,expected", [(300, "squared", 300), (5000, "squared", 2048), (5000, "logistic", 1024),
                                             (600_000, "hinge", 512)])
def test_default_block_size(n, loss, expected):
    lo = get_loss(loss)
    assert default_block_size(n, lo) == expected
    assert _plan(n=n, loss=lo, sample_weight=torch.ones(3)).options.block_size == expected


def test_block_size_is_capped_at_n_and_one_exact_block_is_direct():
    assert _plan(n=50, block_size=500).options.block_size == 50
    one = _plan(n=50, single_exact_block=True)
    assert one.options.block_size == 50 and one.options.subproblem == "direct" and one.options.direct_max == 50
    # not with features, nor when a block size is given
    assert _plan(n=50, single_exact_block=True, features="cossin", n_features=8).options.subproblem == "auto"
    assert _plan(n=50, single_exact_block=True, block_size=10).options.subproblem == "auto"


def test_iteration_budgets():
    n, b = 5000, 100
    eng = _plan(n=n, block_size=b, solver="dbcd_tr", sample_weight=torch.ones(1))
    assert eng.options.max_iter == engine_max_iter("dbcd_tr", n, b) == default_max_iter(n, b) == 2500
    newton = _plan(n=n, block_size=b, solver="newton", sample_weight=torch.ones(1))
    blocks = _plan(n=n, block_size=b, solver="newton", iteration_budget="blocks", sample_weight=torch.ones(1))
    assert newton.options.max_iter == engine_max_iter("newton", n, b) and blocks.options.max_iter == 2500
    assert _plan(n=n, block_size=b, epochs=2.5, sample_weight=torch.ones(1)).options.max_iter == math.ceil(2.5 * 50)
    assert _plan(n=n, block_size=b, epochs=2.5, max_iter=7, sample_weight=torch.ones(1)).options.max_iter == 7


def test_engine_and_intercept_modes():
    assert _plan(intercept=True).intercept == "engine"  # exact, squared: the active-set engine fits b itself
    assert _plan().intercept == "none"
    kinked = _plan(loss=get_loss("epsilon_insensitive"), features="cossin", n_features=8, intercept=True)
    assert kinked.solver == "newton" and kinked.intercept == "search"
    smooth = _plan(loss=get_loss("logistic"), features="cossin", n_features=8, intercept=True)
    assert smooth.solver == "newton" and smooth.intercept == "engine"  # b inside the feature Newton steps
    assert _plan(loss=get_loss("epsilon_insensitive"), features="cossin", n_features=8).solver == "newton"
    assert _plan(solver="dbcd_tr").requested_solver == "dbcd_tr"


def test_costs_are_C_times_the_weights():
    w = torch.tensor([0.0, 1.0, 2.5])
    plan = _plan(C=2.0, sample_weight=w)
    assert plan.c.dtype == torch.float64 and torch.equal(plan.c, torch.tensor([0.0, 2.0, 5.0], dtype=torch.float64))
    assert torch.equal(_plan(n=4, C=3.0).c, torch.full((4,), 3.0, dtype=torch.float64))


def test_feature_modes():
    k = _kernel()
    assert feature_map_for(k, "exact") is None
    for mode in ("cossin", "cos", "orf"):
        fm = feature_map_for(k, mode, 16, seed=1)
        assert isinstance(fm, RandomFeatureMap) and fm.n_features == 16
    ny = feature_map_for(k, "nystrom", centers=torch.randn(6, 2, dtype=torch.float64))
    assert isinstance(ny, NystromFeatureMap)
    assert set(FEATURE_MODES) == {"exact", "cossin", "cos", "orf", "nystrom"}
    same = feature_map_for(k, "orf", 16, seed=1), feature_map_for(k, "orf", 16, seed=1)
    Z = torch.randn(4, 2, dtype=torch.float64)
    assert torch.equal(same[0](Z), same[1](Z))


def test_replace_and_equality():
    plan = _plan()
    assert plan == _plan() and plan != _plan(C=2.0) and plan != _plan(seed=1)
    other = plan.replace(options={"max_iter": 3})
    assert other.options.max_iter == 3 and plan.options.max_iter != 3 and other != plan
    with pytest.raises(Exception):
        plan.C = 3.0  # frozen


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw,pattern", [
    (dict(features="fourier"), r"^features must be one of \(.*'nystrom'\), got 'fourier'"),
    (dict(n=0), r"^n must be a positive integer \(>= 1\), got 0"),
    (dict(block_size=0), r"^block_size must be a positive integer \(>= 1\), got 0"),
    (dict(tol=-1.0), r"^tol must be non-negative and finite, got -1.0"),
    (dict(seed=-1), r"^seed must be an integer >= 0, got -1"),
    (dict(C=0.0), r"^C must be positive and finite, got 0.0"),
    (dict(features="cossin"), r"^n_features must be a positive integer with features='cossin', got None"),
    (dict(features="nystrom"), r"^centers must be a tensor of Nystrom centres .*, got None"),
    (dict(iteration_budget="epochs"), r"^iteration_budget must be one of \('engine', 'blocks'\), got 'epochs'"),
    (dict(sample_weight=torch.tensor([1.0, -2.0])), r"^sample_weight must be finite and non-negative, got \[-2.0\]"),
    (dict(max_memory="lots"), r"^max_memory must be a number of bytes or a string like '2GB', got 'lots'"),
    (dict(solver="simplex"), r"^solver must be one of .*, got 'simplex'"),
    (dict(dtype="float16"), r"^dtype must be 'float32', 'float64'.*, got 'float16'"),
    (dict(backend="cuda"), r"^backend must be one of \('torch', 'keops'\), got 'cuda'"),
    (dict(newton_rnak=3), r"^solver_options must be SolverOptions fields .*, got \['newton_rnak'\]"),
])
def test_bad_input_names_the_argument_what_was_expected_and_what_came_in(kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        _plan(**kw)


def test_wrong_kinds_of_objects_are_type_errors():
    with pytest.raises(TypeError, match=r"^kernel must be a joker_ext Kernel .*got 'gaussian' \(str\)"):
        make_fit_plan("gaussian", get_loss("squared"), n=10)
    with pytest.raises(TypeError, match=r"^loss must be a joker_ext Loss .*got 'squared' \(str\)"):
        make_fit_plan(_kernel(), "squared", n=10)


# ---------------------------------------------------------------------------- one validation layer
def test_the_seed_solvers_checks_are_joker_ext_validation():
    import joker_ext.validation as v
    from joker_ext.comparisons.solvers import _common

    for name in ("check_choice", "check_number", "check_positive", "check_positive_int", "check_dtype",
                 "check_device"):
        assert getattr(_common, name) is getattr(v, name), name
    assert not hasattr(_common, "check_int") and not hasattr(_common, "check_float")
    with pytest.raises(ValueError, match=r"^n_iter must be an integer in \[0, 5\], got 6"):
        v.check_positive_int("n_iter", 6, low=0, high=5)
    with pytest.raises(TypeError, match=r"^callback must be a callable taking a dict, or None, got 3 \(int\)"):
        _common.check_callback(3)


def test_classifier_and_regressor_share_the_plan_builder(data):
    X, y = data
    yc = np.where(y > 0, 1, 0)
    r = JokerRegressor(loss="squared", C=C, random_state=1, block_size=32, max_iter=5, solver="dbcd_tr").fit(X, 2.0 * yc - 1)
    c = JokerClassifier(loss="squared", C=C, random_state=1, block_size=32, max_iter=5, solver="dbcd_tr").fit(X, yc)
    assert r.fit_plan_ == c.fit_plan_
