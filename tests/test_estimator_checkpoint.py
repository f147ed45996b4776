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
