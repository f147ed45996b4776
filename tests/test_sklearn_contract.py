"""scikit-learn's own estimator checks, for every loss each estimator accepts, in exact mode and with
64 random features (plus the intercept and calibrated-probability variants).

The reference is scikit-learn itself: ``check_estimator`` runs its ~60 checks (cloning, pickling,
parameter handling, sample-weight equivalence, dtype handling, classifier accuracy on blobs,
class_weight, ...). Any failed check fails the test with the check's name and message.
"""
import warnings

import pytest
from sklearn.utils.estimator_checks import check_estimator

from joker_ext.estimators import CLASSIFICATION_LOSSES, REGRESSION_LOSSES, JokerClassifier, JokerRegressor

MODES = {"exact": None, "rff64": 64}


def _run_checks(estimator):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarnings from deliberately tiny problems
        results = check_estimator(estimator, on_fail=None)
    assert len(results) > 50, "check_estimator ran fewer checks than expected"
    failed = [(r["check_name"], str(r["exception"])[:400]) for r in results if r["status"] == "failed"]
    assert not failed, f"{estimator!r} failed scikit-learn checks: {failed}"


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("loss", REGRESSION_LOSSES)
def test_regressor_check_estimator(loss, mode):
    _run_checks(JokerRegressor(loss=loss, n_features=MODES[mode]))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("loss", CLASSIFICATION_LOSSES)
def test_classifier_check_estimator(loss, mode):
    _run_checks(JokerClassifier(loss=loss, n_features=MODES[mode]))


@pytest.mark.parametrize(
    "estimator",
    [
        JokerClassifier(fit_intercept=True),
        JokerRegressor(loss="epsilon_insensitive", fit_intercept=True, n_features=64),
        JokerClassifier(loss="squared_hinge", probability=True),
        JokerClassifier(fit_intercept=True, multi_class="ovo"),
        JokerClassifier(loss="logistic", multi_class="ovo"),
        JokerClassifier(fit_intercept=True, probability=True),
    ],
    ids=["hinge-intercept", "svr-intercept-rff64", "squared_hinge-probability", "hinge-intercept-ovo",
         "logistic-ovo", "hinge-intercept-auto-probability"],
)
def test_variants_check_estimator(estimator):
    _run_checks(estimator)
