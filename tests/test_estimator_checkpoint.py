"""Saving and loading fitted estimators: same predictions, no pickled code, atomic files."""
import numpy as np
import pytest

from joker_ext import JokerClassifier, JokerRegressor
from joker_ext.checkpoint import load_estimator, save_estimator


@pytest.mark.parametrize("make", [
    lambda: JokerRegressor(loss="huber", C=5.0, n_features=None),
    lambda: JokerRegressor(loss="pinball", quantile=0.8, n_features=128, random_state=3),
    lambda: JokerRegressor(loss="squared", fit_intercept=True),
    lambda: JokerClassifier(loss="logistic", C=2.0),
    lambda: JokerClassifier(loss="hinge", n_features=64, random_state=1, probability=True),
    # float32 random features with an intercept: solved in float32 (C n small), or in float64 (C n above
    # FLOAT32_INTERCEPT_MAX_COST), each rebuilt as fitted
    lambda: JokerRegressor(loss="squared", n_features=32, fit_intercept=True, dtype="float32", random_state=2),
    lambda: JokerRegressor(loss="squared", C=1e6, n_features=32, fit_intercept=True, dtype="float32", random_state=2),
])
def test_save_load_predicts_identically(tmp_path, make):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((80, 3))
    est = make()
    if isinstance(est, JokerClassifier):
        y = np.array(["a", "b", "c"])[(X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5).astype(int)]
    else:
        y = np.sin(X[:, 0]) + 3.0
    est.fit(X, y)
    path = tmp_path / "model.joker"
    save_estimator(est, path)
    back = load_estimator(path)
    Xt = rng.standard_normal((20, 3))
    np.testing.assert_array_equal(back.predict(Xt), est.predict(Xt))
    if hasattr(est, "decision_function"):
        np.testing.assert_array_equal(back.decision_function(Xt), est.decision_function(Xt))
    if hasattr(est, "predict_proba") and (est.loss == "logistic" or est.probability):
        np.testing.assert_allclose(back.predict_proba(Xt), est.predict_proba(Xt), rtol=1e-12)


def test_saving_an_unfitted_estimator_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not fitted"):
        save_estimator(JokerRegressor(), tmp_path / "m.joker")


def test_interrupted_fit_resumes_from_its_checkpoint_bitwise(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((600, 3))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(600)
    kw = dict(loss="huber", C=50.0, n_features=64, block_size=100, max_iter=60, tol=0.0, random_state=0)
    full = JokerRegressor(**kw).fit(X, y)
    path = tmp_path / "fit.ckpt"
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        JokerRegressor(**{**kw, "max_iter": 25}, checkpoint=str(path), checkpoint_every=10).fit(X, y)  # "crash" at 25
    resumed = JokerRegressor(**kw, checkpoint=str(path), checkpoint_every=10).fit(X, y)
    np.testing.assert_array_equal(resumed.dual_coef_, full.dual_coef_)
    np.testing.assert_array_equal(resumed.predict(X), full.predict(X))


def test_max_memory_parameter_is_honoured():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((3000, 4))
    y = X[:, 0]
    with pytest.warns(RuntimeWarning, match="block_size reduced"):
        m = JokerRegressor(block_size=3000, max_iter=5, max_memory="40MB", sigma=1.0).fit(X, y)
    assert np.all(np.isfinite(m.predict(X[:10])))


# ----------------------------------------------------------------------------- other libraries' kernels
def _sklearn_composite():
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, DotProduct, RationalQuadratic

    return {
        "sk-rbf*dot": (lambda: RBF(1.5) * DotProduct(), None),  # once a local closure: could not be pickled
        "sk-2*rbf_ard+dot": (lambda: ConstantKernel(2.0) * RBF([1.0, 2.0, 0.5]) + DotProduct(sigma_0=0.5), None),
        "sk-const+0.5*rq": (lambda: ConstantKernel(0.7) + 0.5 * RationalQuadratic(alpha=2.0), None),
        "sk-2*rbf+matern-rff": (lambda: ConstantKernel(2.0) * RBF(1.5) + _sk_matern(), 64),
    }


def _sk_matern():
    from sklearn.gaussian_process.kernels import Matern

    return Matern(length_scale=0.8, nu=2.5)


def _sk_rq():
    from sklearn.gaussian_process.kernels import RationalQuadratic

    return 0.5 * RationalQuadratic(length_scale=1.2, alpha=0.8)


def _gpytorch_kernel():
    gk = pytest.importorskip("gpytorch").kernels
    k = gk.ScaleKernel(gk.RBFKernel())
    k.outputscale = 1.7
    k.base_kernel.lengthscale = 0.9
    return k


def _gpytorch_rq_active_dims():
    gk = pytest.importorskip("gpytorch").kernels
    return gk.AdditiveKernel(gk.RQKernel(active_dims=[0, 2]), gk.MaternKernel(nu=1.5, active_dims=[1]))


def _pairwise(metric, **params):
    from joker_ext.adapters.sklearn import pairwise_kernel

    return pairwise_kernel(metric, **params)


def _falkon_kernel():
    return pytest.importorskip("falkon").kernels.GaussianKernel(1.3)


_KERNEL_CASES = {
    **{name: (make, nf) for name, (make, nf) in _sklearn_composite().items()},
    "gpytorch-scale(rbf)-exact": (_gpytorch_kernel, None),
    "gpytorch-scale(rbf)-rff": (_gpytorch_kernel, 64),
    "gpytorch-rq+matern-active-dims": (_gpytorch_rq_active_dims, None),
    "gpytorch-rq+matern-active-dims-rff": (_gpytorch_rq_active_dims, 64),  # core RQ / active-dims features
    "sk-0.5*rq-rff": (lambda: _sk_rq(), 64),
    "sk-pairwise-poly": (lambda: _pairwise("poly", degree=2, gamma=0.5, coef0=1.0), None),
    "falkon-gaussian-exact": (_falkon_kernel, None),
    "falkon-gaussian-rff": (_falkon_kernel, 64),
}


@pytest.mark.parametrize("name", list(_KERNEL_CASES))
@pytest.mark.parametrize("cls", [JokerRegressor, JokerClassifier])
def test_library_kernels_round_trip_through_pickle_and_checkpoint(tmp_path, name, cls):
    """issue #15: an estimator fitted with a composite scikit-learn kernel, a GPyTorch kernel or a Falkon kernel
    (exact and random features) predicts identically after pickle and after save/load."""
    import pickle

    make, n_features = _KERNEL_CASES[name]
    rng = np.random.default_rng(4)
    X = rng.standard_normal((70, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] if cls is JokerRegressor else (X[:, 0] + 0.3 * X[:, 2] > 0).astype(int)
    est = cls(kernel=make(), n_features=n_features, random_state=2, max_iter=30, tol=1e-6)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a short fit: convergence is not the point
        est.fit(X, y)
    Xt = rng.standard_normal((25, 3))
    out = est.predict if cls is JokerRegressor else est.decision_function
    ref = out(Xt)
    assert np.all(np.isfinite(ref)) and np.ptp(ref) > 0

    back = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal((back.predict if cls is JokerRegressor else back.decision_function)(Xt), ref)
    np.testing.assert_array_equal(back.predict(Xt), est.predict(Xt))

    path = tmp_path / "model.joker"
    save_estimator(est, path)
    loaded = load_estimator(path)
    np.testing.assert_array_equal((loaded.predict if cls is JokerRegressor else loaded.decision_function)(Xt), ref)
    np.testing.assert_array_equal(loaded.predict(Xt), est.predict(Xt))
    assert type(loaded.kernel_) is type(est.kernel_)
    # the loaded estimator refits to the same model (its kernel parameter is the fitted kernel's translation)
    params = {k: v for k, v in est.get_params(deep=False).items() if k != "kernel"}
    assert {k: v for k, v in loaded.get_params(deep=False).items() if k != "kernel"} == params


def test_composite_sklearn_kernel_survives_as_scikit_learn_object(tmp_path):
    """The checkpoint stores scikit-learn kernels as class names and hyperparameters, and rebuilds the same objects."""
    from sklearn.gaussian_process.kernels import RBF, DotProduct

    rng = np.random.default_rng(5)
    X = rng.standard_normal((40, 2))
    est = JokerRegressor(kernel=RBF(0.7) * DotProduct(sigma_0=2.0), max_iter=20, tol=1e-6).fit(X, X[:, 0])
    save_estimator(est, tmp_path / "m")
    back = load_estimator(tmp_path / "m")
    assert back.kernel_.sk_kernel == RBF(0.7) * DotProduct(sigma_0=2.0)
    assert back.kernel_.sk_kernel is not est.kernel_.sk_kernel


def test_kernels_that_are_code_are_refused_at_save(tmp_path):
    from joker_ext.kernels import CallableKernel

    rng = np.random.default_rng(6)
    X = rng.standard_normal((30, 2))
    est = JokerRegressor(kernel=CallableKernel(_linear, name="linear"), max_iter=10, tol=1e-6).fit(X, X[:, 0])
    with pytest.raises(TypeError, match="pickle the estimator"):
        save_estimator(est, tmp_path / "m")
    assert not (tmp_path / "m").exists()


def _linear(A, B):
    return A @ B.T


def test_scikit_learn_kernel_descriptions_rebuild_equal_objects():
    """kernel_spec is plain data (JSON) and kernel_from_spec rebuilds an equal kernel: nested kernels, ARD arrays,
    bounds ('fixed', tuples, arrays of pairs), exponents, compound kernels; a user's subclass is refused."""
    import json

    from sklearn.gaussian_process import kernels as gpk

    from joker_ext.adapters.sklearn import kernel_from_spec, kernel_spec

    kernels = [
        gpk.ConstantKernel(2.0, "fixed") * gpk.RBF([1.0, 2.0], length_scale_bounds=[(1e-2, 1e2), (1e-3, 1e3)]),
        gpk.Matern(0.5, nu=float("inf")) + gpk.RationalQuadratic(alpha=3.0) ** 2,
        gpk.ExpSineSquared(1.2, 0.7) * gpk.DotProduct(sigma_0=0.1, sigma_0_bounds=(1e-3, 1.0)),
        gpk.PairwiseKernel(gamma=0.3, metric="laplacian"),
        gpk.CompoundKernel([gpk.RBF(), gpk.Matern(nu=1.5)]),
    ]
    for k in kernels:
        spec = json.loads(json.dumps(kernel_spec(k)))
        back = kernel_from_spec(spec)
        assert back == k and type(back) is type(k)
    X = np.random.default_rng(0).standard_normal((5, 2))
    np.testing.assert_array_equal(kernel_from_spec(kernel_spec(kernels[0]))(X), kernels[0](X))

    class MyRBF(gpk.RBF):
        pass

    with pytest.raises(TypeError, match="own kernel classes"):
        kernel_spec(MyRBF())
    with pytest.raises(ValueError, match="not a kernel class"):
        kernel_from_spec({"class": "os", "params": {}})
