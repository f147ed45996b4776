"""``JokerClassifier(multi_class='ovo')``: a binary problem per pair of classes (:mod:`joker_ext.one_vs_one`).

References: SVC (LIBSVM) at ``tol=1e-10``, whose multiclass model is exactly this one with the hinge loss and an
intercept; cvxpy's optimal value of every pair's problem (computed from the pair's points only); scikit-learn's
``OneVsOneClassifier`` around the binary classifier (each pair through the engines, one fit per pair).
"""
import pickle

import numpy as np
import pytest
import torch
from conftest import cvxpy_primal
from sklearn.datasets import load_wine, make_classification
from sklearn.metrics.pairwise import rbf_kernel
from sklearn.multiclass import OneVsOneClassifier
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from joker_ext import JokerClassifier
from joker_ext.checkpoint import load_estimator, save_estimator
from joker_ext.one_vs_one import class_pairs


def _classes(n, k, seed, d=4):
    X, y = make_classification(n_samples=n, n_features=d, n_informative=d - 1, n_redundant=0, n_classes=k,
                               n_clusters_per_class=1, class_sep=1.0, flip_y=0.05, random_state=seed)
    return StandardScaler().fit_transform(X), y


def _no_fallback(monkeypatch):
    """Make a pair that the compiled batch did not certify fail the test (the batch must solve these problems)."""
    def fail(*args, **kwargs):
        raise AssertionError("a pair fell back to the engines")
    monkeypatch.setattr(JokerClassifier, "_fit_pair", fail)


def _pair_values(est, X):
    """Every pair's decision values, from the fitted coefficients with scikit-learn's kernel (n x P)."""
    return rbf_kernel(X, est.X_fit_, gamma=est.gamma_) @ est.dual_coef_ + est.intercept_


def _svc_pair_coefficients(svc, y, i, j):
    """SVC's dual coefficients (n,) of pair ``(i, j)``: a support vector of class ``i`` keeps its coefficient in row
    ``j - 1`` of ``dual_coef_``, one of class ``j`` in row ``i`` (LIBSVM's layout)."""
    a = np.zeros(y.size)
    for col, s in enumerate(svc.support_):
        if y[s] == i:
            a[s] = svc.dual_coef_[j - 1, col]
        elif y[s] == j:
            a[s] = svc.dual_coef_[i, col]
    return a


@pytest.mark.parametrize("k, C", [(3, 1.0), (5, 10.0), (4, 100.0)])
def test_hinge_with_intercept_is_svcs_model(monkeypatch, k, C):
    """Hinge with an intercept: every pair's primal objective is SVC's (solved to ``tol=1e-10``) or below it by
    at most SVC's own inexactness (3-6e-6 relative at C = 100), and the pairs' decision values, the intercepts, the
    aggregated scores and the predictions are SVC's, all from the compiled batch."""
    X, y = _classes(60 * k, k, seed=k)
    Xnew = np.random.default_rng(k).normal(size=(80, X.shape[1]))
    gamma = 0.3
    _no_fallback(monkeypatch)
    est = JokerClassifier(loss="hinge", C=C, gamma=gamma, fit_intercept=True, multi_class="ovo").fit(X, y)
    svc = SVC(C=C, gamma=gamma, tol=1e-10, decision_function_shape="ovo").fit(X, y)
    assert est.status_ == "converged" and est.relative_gap_ <= 1e-11
    K = rbf_kernel(X, X, gamma=gamma)
    for p, (i, j) in enumerate(class_pairs(k)):
        rows = np.flatnonzero(np.isin(y, [i, j]))
        t = np.where(y[rows] == i, 1.0, -1.0)
        Kp = K[np.ix_(rows, rows)]
        primal = []
        for a, b in ((est.dual_coef_[rows, p], est.intercept_[p]),
                     (_svc_pair_coefficients(svc, y, i, j)[rows], svc.intercept_[p])):
            primal.append(0.5 * a @ Kp @ a + C * np.maximum(0.0, 1.0 - t * (Kp @ a + b)).sum())
        assert primal[1] * (1 - 1e-5) <= primal[0] <= primal[1] * (1 + 1e-12), (i, j)
        # each pair's coefficients live on its two classes' points only
        assert np.all(est.dual_coef_[~np.isin(y, [i, j]), p] == 0)
    reference = svc.decision_function(Xnew)
    atol = (1e-6 if C <= 10 else 1e-4) * np.abs(reference).max()
    np.testing.assert_allclose(_pair_values(est, Xnew), reference, atol=atol)
    np.testing.assert_allclose(est.intercept_, svc.intercept_, atol=atol)
    svc.set_params(decision_function_shape="ovr")
    np.testing.assert_allclose(est.decision_function(Xnew), svc.decision_function(Xnew), atol=atol)
    np.testing.assert_array_equal(est.predict(Xnew), svc.predict(Xnew))


def test_weights_and_repeated_points_match_svc():
    """Class weights, sample weights (some zero) and repeated points (a singular free block) as SVC weighs them."""
    X, y = _classes(240, 4, seed=7)
    X = np.vstack([X, X[:40]])  # 40 points twice, with their labels
    y = np.concatenate([y, y[:40]])
    w = np.random.default_rng(1).uniform(0.2, 3.0, size=y.size)
    w[::17] = 0.0  # points without weight: left out, as SVC leaves them
    Xnew = np.random.default_rng(2).normal(size=(50, X.shape[1]))
    est = JokerClassifier(C=5.0, gamma=0.4, fit_intercept=True, multi_class="ovo", class_weight="balanced")
    est.fit(X, y, sample_weight=w)
    svc = SVC(C=5.0, gamma=0.4, tol=1e-10, class_weight="balanced", decision_function_shape="ovo")
    svc.fit(X, y, sample_weight=w)
    reference = svc.decision_function(Xnew)
    np.testing.assert_allclose(_pair_values(est, Xnew), reference, atol=1e-6 * np.abs(reference).max())
    np.testing.assert_array_equal(est.predict(Xnew), svc.predict(Xnew))


@pytest.mark.parametrize("loss", ["hinge", "squared_hinge"])
@pytest.mark.parametrize("intercept", [False, True])
def test_every_pair_reaches_cvxpys_optimum(loss, intercept):
    """Each pair's primal objective (computed here from its column of ``dual_coef_`` on its own points) is cvxpy's
    optimal value of that pair's problem."""
    X, y = load_wine(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    C, gamma = 2.0, 0.05
    est = JokerClassifier(loss=loss, C=C, gamma=gamma, fit_intercept=intercept, multi_class="ovo").fit(X, y)
    K = rbf_kernel(X, X, gamma=gamma)
    for p, (i, j) in enumerate(class_pairs(3)):
        rows = np.flatnonzero(np.isin(y, [i, j]))
        t = np.where(y[rows] == i, 1.0, -1.0)
        a = est.dual_coef_[rows, p]
        f = K[np.ix_(rows, rows)] @ a + est.intercept_[p]
        margin = np.maximum(0.0, 1.0 - t * f)
        loss_sum = margin.sum() if loss == "hinge" else 0.5 * (margin ** 2).sum()
        primal = 0.5 * a @ K[np.ix_(rows, rows)] @ a + C * loss_sum
        reference = cvxpy_primal(loss, K[np.ix_(rows, rows)], t, np.full(rows.size, C), intercept=intercept)
        assert primal == pytest.approx(reference, rel=1e-6), (i, j)


@pytest.mark.parametrize("loss", ["hinge", "squared_hinge", "squared", "logistic"])
def test_every_loss_equals_one_vs_one_through_scikit_learn(loss):
    """Every classification loss, with an intercept: the pairs' decision values are those of scikit-learn's
    ``OneVsOneClassifier`` around the binary classifier (one fit per pair through the engines; its estimators are
    positive for the pair's second class), the compiled batch where it applies, the engines otherwise."""
    X, y = _classes(200, 4, seed=11)
    Xnew = np.random.default_rng(3).normal(size=(40, X.shape[1]))
    params = dict(loss=loss, C=3.0, sigma=1.3, fit_intercept=True)
    est = JokerClassifier(**params, multi_class="ovo").fit(X, y)
    wrapper = OneVsOneClassifier(JokerClassifier(**params)).fit(X, y)
    reference = -np.column_stack([e.decision_function(Xnew) for e in wrapper.estimators_])
    tol = 1e-6 if loss == "logistic" else 1e-7
    np.testing.assert_allclose(_pair_values(est, Xnew), reference, atol=tol * np.abs(reference).max())
    assert est.relative_gap_ <= 1e-10


def test_engines_alone_give_the_batchs_model():
    """A named solver fits every pair through the engines: the same model as the compiled batch."""
    X, y = _classes(180, 3, seed=5)
    batch = JokerClassifier(C=4.0, gamma=0.5, fit_intercept=True, multi_class="ovo").fit(X, y)
    engines = JokerClassifier(C=4.0, gamma=0.5, fit_intercept=True, multi_class="ovo", solver="active_set").fit(X, y)
    np.testing.assert_allclose(_pair_values(batch, X), _pair_values(engines, X), atol=1e-8)
    assert batch.primal_objective_ == pytest.approx(engines.primal_objective_, rel=1e-10)


def test_two_classes_fit_one_problem():
    """Two classes are one pair: the same model as one-vs-rest."""
    X, y = _classes(120, 2, seed=1)
    a = JokerClassifier(C=2.0, gamma=0.5, fit_intercept=True, multi_class="ovo").fit(X, y)
    b = JokerClassifier(C=2.0, gamma=0.5, fit_intercept=True).fit(X, y)
    np.testing.assert_allclose(a.decision_function(X), b.decision_function(X), atol=1e-9)


def test_saved_and_pickled_models_predict_the_same(tmp_path):
    """Saved (or pickled) and loaded, a one-vs-one model predicts as before, even with ``multi_class`` changed after
    the fit (the model is what was fitted)."""
    X, y = _classes(150, 3, seed=2)
    est = JokerClassifier(C=2.0, fit_intercept=True).fit(X, y)
    before = est.decision_function(X)
    est.set_params(multi_class="ovr")
    np.testing.assert_array_equal(est.decision_function(X), before)
    path = save_estimator(est, tmp_path / "ovo.pt")
    for other in (load_estimator(path), pickle.loads(pickle.dumps(est))):
        np.testing.assert_array_equal(other.predict(X), est.predict(X))
        np.testing.assert_allclose(other.decision_function(X), est.decision_function(X), atol=1e-12)


@pytest.mark.parametrize("param, value", [("n_features", 64), ("checkpoint", "model.pt")])
def test_what_one_vs_one_does_not_take_is_named(param, value):
    X, y = _classes(90, 3, seed=0)
    with pytest.raises(ValueError, match=f"multi_class='ovo' needs {param}="):
        JokerClassifier(multi_class="ovo", **{param: value}).fit(X, y)


def test_a_class_without_weight_is_named():
    X, y = _classes(90, 3, seed=0)
    w = np.where(y == 2, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"the classes \[2\] have none"):
        JokerClassifier(multi_class="ovo").fit(X, y, sample_weight=w)


def test_unknown_multi_class_is_named():
    X, y = _classes(90, 3, seed=0)
    with pytest.raises(ValueError, match="multi_class"):
        JokerClassifier(multi_class="crammer_singer").fit(X, y)


def test_threads_give_the_same_model(monkeypatch):
    """The batch splits the pairs over threads; one thread gives the same numbers."""
    from joker_ext import one_vs_one

    monkeypatch.setattr(one_vs_one, "THREADS_MIN_WORK", 0.0)  # (threads even for these small pairs)
    X, y = _classes(300, 6, seed=9)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = JokerClassifier(C=3.0, gamma=0.4, fit_intercept=True, multi_class="ovo").fit(X, y)
        torch.set_num_threads(2)
        two = JokerClassifier(C=3.0, gamma=0.4, fit_intercept=True, multi_class="ovo").fit(X, y)
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_array_equal(one.dual_coef_, two.dual_coef_)
    np.testing.assert_array_equal(one.intercept_, two.intercept_)


def test_auto_is_svcs_choice_where_one_vs_one_applies():
    """``multi_class='auto'``: one-vs-one (a column per pair) for the hinge loss with an intercept on the exact kernel,
    one-vs-rest (a column per class) otherwise, random features included (no error)."""
    X, y = _classes(120, 4, seed=6)
    pairs, classes = len(class_pairs(4)), 4
    cases = [(dict(fit_intercept=True), pairs), (dict(fit_intercept=False), classes),
             (dict(loss="squared_hinge", fit_intercept=True), classes),
             (dict(fit_intercept=True, n_features=32), classes),
             (dict(fit_intercept=True, multi_class="ovr"), classes),
             (dict(loss="logistic", multi_class="ovo"), pairs)]
    for params, columns in cases:
        est = JokerClassifier(C=2.0, **params).fit(X, y)
        width = (est.coef_ if est.coef_ is not None else est.dual_coef_).shape[1]
        assert width == columns, params
        assert est.decision_function(X).shape == (X.shape[0], classes)


def test_pairs_above_the_block_cap_go_to_the_engines(monkeypatch):
    """A pair whose kernel block would pass ``PAIR_BLOCK_BYTES`` is fitted by the engines; the model is the same."""
    from joker_ext import one_vs_one

    X, y = _classes(240, 4, seed=8)
    y[:30] = 0  # one class larger than the others: its three pairs pass the cap below
    sizes = np.diff(one_vs_one.pair_rows(y, 4)[2])
    cap = 8.0 * float(np.sort(sizes)[-4]) ** 2
    assert (8.0 * sizes.astype(float) ** 2 > cap).sum() == 3
    reference = JokerClassifier(C=3.0, gamma=0.4, fit_intercept=True).fit(X, y)
    fitted = []
    pair_fit = JokerClassifier._fit_pair
    monkeypatch.setattr(JokerClassifier, "_fit_pair", lambda self, *a: fitted.append(1) or pair_fit(self, *a))
    monkeypatch.setattr(one_vs_one, "PAIR_BLOCK_BYTES", cap)
    capped = JokerClassifier(C=3.0, gamma=0.4, fit_intercept=True).fit(X, y)
    assert len(fitted) == 3
    np.testing.assert_allclose(_pair_values(capped, X), _pair_values(reference, X), atol=1e-8)


def test_coupled_probabilities_recover_a_distribution_from_its_pairs():
    """Pairs' values that are the log-odds ``log(p_i / p_j)`` of one distribution couple back to it exactly."""
    from joker_ext.one_vs_one import coupled_probabilities

    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(5), size=20)
    F = np.column_stack([np.log(P[:, i] / P[:, j]) for i, j in class_pairs(5)])
    np.testing.assert_allclose(coupled_probabilities(F, 5), P, rtol=1e-10)


def test_logistic_one_vs_one_probabilities():
    """Logistic one-vs-one: probabilities in [0, 1] summing to one, agreeing with the votes on most points."""
    X, y = _classes(200, 4, seed=12)
    est = JokerClassifier(loss="logistic", C=3.0, multi_class="ovo").fit(X, y)
    P = est.predict_proba(X)
    assert P.shape == (200, 4) and np.all(P >= 0)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-12)
    assert np.mean(est.classes_[P.argmax(axis=1)] == est.predict(X)) >= 0.95


def test_uncertified_pairs_start_the_engines_from_the_batchs_point(monkeypatch):
    """A pair the batch tried but did not certify is fitted by the engines from the batch's point (a warm start that
    the engines take: ``alpha0`` reaches the fit), and the model is the batch's."""
    from joker_ext import one_vs_one
    from joker_ext.plan import FitPlan

    X, y = _classes(200, 3, seed=13)
    reference = JokerClassifier(C=3.0, gamma=0.4, fit_intercept=True).fit(X, y)
    gaps = one_vs_one.pair_gaps

    def uncertified(*args):  # every pair's gap too large for the batch to keep it
        primal, dual, gap, rel = gaps(*args)
        return primal, dual, gap, np.full_like(rel, np.inf)

    starts = []
    fit = FitPlan.fit
    monkeypatch.setattr(one_vs_one, "pair_gaps", uncertified)
    monkeypatch.setattr(FitPlan, "fit",
                        lambda self, *a, **run: starts.append(run.get("alpha0")) or fit(self, *a, **run))
    refitted = JokerClassifier(C=3.0, gamma=0.4, fit_intercept=True).fit(X, y)
    assert len(starts) == 3 and all(s is not None and torch.count_nonzero(s) > 0 for s in starts)
    np.testing.assert_allclose(_pair_values(refitted, X), _pair_values(reference, X), atol=1e-8)
    assert refitted.relative_gap_ <= 1e-11


def test_a_model_from_before_one_vs_one_reads_as_one_vs_rest():
    """A fitted classifier without the one-vs-one flag (saved before one-vs-one existed, when several classes were
    always one-vs-rest) keeps predicting one-vs-rest, even where 'auto' would now fit one-vs-one."""
    X, y = _classes(150, 3, seed=4)
    est = JokerClassifier(C=2.0, fit_intercept=True, multi_class="ovr").fit(X, y)
    before = est.decision_function(X)
    est.set_params(multi_class="auto")
    del est._one_vs_one_fit
    np.testing.assert_array_equal(est.decision_function(X), before)
    np.testing.assert_array_equal(est.predict(X), est.classes_[before.argmax(axis=1)])
