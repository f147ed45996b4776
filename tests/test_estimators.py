"""Behaviour of JokerRegressor / JokerClassifier against independent references.

References: cvxpy on the SVM dual (hinge, with and without the intercept's equality constraint),
scikit-learn's SVC / SVR (same kernel and C), LogisticRegression on exact kernel features
``K = L L^T`` (kernel logistic regression without intercept), closed forms (kernel ridge with and
without a bordered intercept system), scikit-learn's own utilities (compute_sample_weight, r2_score,
the pairwise kernels, the GP kernels), and properties that must hold (separate fits = one multi-output
fit, parallel search = sequential search, pickling round trip). scikit-learn's ``check_estimator`` runs
in test_sklearn_contract.py.
"""
import pickle
import warnings

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.special import expit
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer, make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import r2_score
from sklearn.metrics.pairwise import rbf_kernel
from sklearn.model_selection import GridSearchCV, RandomizedSearchCV, StratifiedKFold, cross_val_score, train_test_split
from sklearn.multiclass import OneVsOneClassifier
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC, SVR
from sklearn.utils.class_weight import compute_sample_weight

from joker_ext.checkpoint import load_solver_state
from joker_ext.estimators import CLASSIFICATION_LOSSES, REGRESSION_LOSSES, JokerClassifier, JokerRegressor


def gauss(A, B, sigma):
    return rbf_kernel(A, B, gamma=1.0 / (2.0 * sigma**2))


@pytest.fixture(scope="module")
def binary():
    X, y = make_classification(n_samples=120, n_features=5, n_informative=3, weights=[0.65, 0.35],
                               flip_y=0.05, random_state=0)
    return StandardScaler().fit_transform(X), y


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, stratify=y, random_state=0)
    sc = StandardScaler().fit(Xtr)
    return sc.transform(Xtr), sc.transform(Xte), ytr, yte


# ----------------------------------------------------------------------------- exactness vs QP / SVC
def _svm_dual_cvxpy(K, y, C, equality):
    """min 1/2 a^T K a - y^T a  s.t. 0 <= y_i a_i <= C (and sum a = 0): the SVM dual in joker's sign
    convention (a_i = y_i * LIBSVM's alpha_i). Returns a and, with the equality, the intercept b from
    the free support vectors (y_i f_i = 1)."""
    cp = pytest.importorskip("cvxpy")
    n = len(y)
    w, V = np.linalg.eigh(K)
    L = V * np.sqrt(np.clip(w, 0, None))  # K = L L^T
    a = cp.Variable(n)
    cons = [cp.multiply(y, a) >= 0, cp.multiply(y, a) <= C]
    if equality:
        cons.append(cp.sum(a) == 0)
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(L.T @ a) - y @ a), cons)
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    a = np.asarray(a.value)
    b = 0.0
    if equality:
        u = y * a
        free = (u > 1e-6 * C) & (u < C * (1 - 1e-6))
        b = float(np.mean(y[free] - (K @ a)[free]))
    return a, b


@pytest.mark.parametrize("C", [0.5, 5.0])
def test_hinge_without_intercept_equals_exact_qp(binary, C):
    X, y01 = binary
    y = np.where(y01 == 1, 1.0, -1.0)
    sigma = 1.5
    a, _ = _svm_dual_cvxpy(gauss(X, X, sigma), y, C, equality=False)
    Xnew = np.random.default_rng(1).normal(size=(40, X.shape[1]))
    ref = gauss(Xnew, X, sigma) @ a
    est = JokerClassifier(loss="hinge", C=C, sigma=sigma).fit(X, y01)
    assert est.status_ == "converged"
    np.testing.assert_allclose(est.decision_function(Xnew), ref, atol=1e-6 * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("C", [0.5, 5.0])
def test_hinge_with_intercept_matches_qp_and_svc(binary, C):
    X, y01 = binary
    y = np.where(y01 == 1, 1.0, -1.0)
    sigma = 1.5
    a, b = _svm_dual_cvxpy(gauss(X, X, sigma), y, C, equality=True)
    Xnew = np.random.default_rng(2).normal(size=(40, X.shape[1]))
    est = JokerClassifier(loss="hinge", C=C, sigma=sigma, fit_intercept=True).fit(X, y01)
    assert est.relative_gap_ < 1e-10
    ref = gauss(Xnew, X, sigma) @ a + b
    np.testing.assert_allclose(est.decision_function(Xnew), ref, atol=1e-5)
    np.testing.assert_allclose(est.intercept_, [b], atol=1e-5)
    svc = SVC(C=C, kernel="rbf", gamma=1.0 / (2 * sigma**2), tol=1e-10).fit(X, y01)
    np.testing.assert_allclose(est.decision_function(Xnew), svc.decision_function(Xnew), atol=1e-4)
    np.testing.assert_allclose(est.dual_coef_[:, 0].sum(), 0.0, atol=1e-9)


def test_svr_and_kernel_ridge_with_intercept():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 3))
    y = np.sin(X[:, 0]) + 3.0 + 0.1 * rng.normal(size=80)
    sigma, C = 1.5, 3.0
    # squared loss: [K + I/C, 1; 1^T, 0] [alpha; b] = [y; 0]
    K = gauss(X, X, sigma)
    n = len(y)
    A = np.block([[K + np.eye(n) / C, np.ones((n, 1))], [np.ones((1, n)), np.zeros((1, 1))]])
    sol = np.linalg.solve(A, np.r_[y, 0.0])
    krr = JokerRegressor(C=C, sigma=sigma, fit_intercept=True).fit(X, y)
    np.testing.assert_allclose(krr.dual_coef_[:, 0], sol[:n], atol=1e-9)
    np.testing.assert_allclose(krr.intercept_, sol[n], atol=1e-9)
    svr = SVR(C=C, gamma=1 / (2 * sigma**2), epsilon=0.1, tol=1e-10).fit(X, y)
    est = JokerRegressor(loss="epsilon_insensitive", epsilon=0.1, C=C, sigma=sigma, fit_intercept=True).fit(X, y)
    np.testing.assert_allclose(est.predict(X), svr.predict(X), atol=1e-4)


def test_logistic_equals_logistic_regression_on_kernel_features(binary):
    """Kernel logistic regression 1/2||f||^2 + C sum log(1 + exp(-y f)) is LogisticRegression(C,
    fit_intercept=False) on features L with K = L L^T (f = L w, ||f||_H = ||w||)."""
    X, y = binary
    sigma, C = 1.5, 2.0
    w, V = np.linalg.eigh(gauss(X, X, sigma))
    L = V * np.sqrt(np.clip(w, 0, None))
    lr = LogisticRegression(C=C, fit_intercept=False, tol=1e-12, max_iter=10000).fit(L, y)
    est = JokerClassifier(loss="logistic", C=C, sigma=sigma).fit(X, y)
    np.testing.assert_allclose(est.decision_function(X), L @ lr.coef_[0], atol=1e-5)
    np.testing.assert_allclose(est.predict_proba(X)[:, 1], expit(est.decision_function(X)), rtol=1e-12)


# ----------------------------------------------------------------------------- real data, model selection
def test_grid_search_on_breast_cancer_reaches_svc(cancer):
    """GridSearchCV over C and sigma (n_jobs=2) reaches the test accuracy of SVC searched over the same
    grid; with the intercept the problems are the same, so every candidate's CV score agrees."""
    Xtr, Xte, ytr, yte = cancer
    Cs, sigmas = [0.3, 3.0], [3.0, 8.0]
    cv = StratifiedKFold(3, shuffle=True, random_state=0)
    joker = GridSearchCV(JokerClassifier(fit_intercept=True), {"C": Cs, "sigma": sigmas}, cv=cv, n_jobs=2).fit(Xtr, ytr)
    svc = GridSearchCV(SVC(tol=1e-8), {"C": Cs, "gamma": [1 / (2 * s**2) for s in sigmas]}, cv=cv).fit(Xtr, ytr)
    np.testing.assert_allclose(joker.cv_results_["mean_test_score"], svc.cv_results_["mean_test_score"], atol=0.006)
    assert joker.score(Xte, yte) >= svc.score(Xte, yte) - 0.015
    plain = GridSearchCV(JokerClassifier(), {"C": Cs, "sigma": sigmas}, cv=cv).fit(Xtr, ytr)
    assert plain.score(Xte, yte) >= svc.score(Xte, yte) - 0.03
    assert svc.score(Xte, yte) > 0.93  # the reference itself is sensible


def test_logistic_grid_search_reaches_exact_kernel_logistic_regression(cancer):
    """Reference: LogisticRegression(C, no intercept) on exact kernel features of the training set,
    test points mapped by phi(x) = k(x, X) V diag(lambda^-1/2) (the same function space)."""
    Xtr, Xte, ytr, yte = cancer
    grid = {"C": [0.3, 3.0], "sigma": [3.0, 8.0]}
    search = RandomizedSearchCV(JokerClassifier(loss="logistic"), grid, n_iter=4, random_state=0,
                                cv=StratifiedKFold(3, shuffle=True, random_state=0)).fit(Xtr, ytr)
    ref_scores = []
    for C in grid["C"]:
        for s in grid["sigma"]:
            w, V = np.linalg.eigh(gauss(Xtr, Xtr, s))
            keep = w > 1e-10 * w.max()
            lr = LogisticRegression(C=C, fit_intercept=False, tol=1e-10, max_iter=10000)
            lr.fit(V[:, keep] * np.sqrt(w[keep]), ytr)
            phi = gauss(Xte, Xtr, s) @ (V[:, keep] / np.sqrt(w[keep]))
            ref_scores.append(lr.score(phi, yte))
    assert search.score(Xte, yte) >= max(ref_scores) - 0.02


def test_pipeline_and_cross_val_score_agree_with_svc(cancer):
    Xtr, _, ytr, _ = cancer
    cv = StratifiedKFold(4, shuffle=True, random_state=1)
    ours = cross_val_score(make_pipeline(StandardScaler(), JokerClassifier(C=2.0, sigma=5.0, fit_intercept=True)),
                           Xtr, ytr, cv=cv)
    ref = cross_val_score(make_pipeline(StandardScaler(), SVC(C=2.0, gamma=1 / 50.0, tol=1e-8)), Xtr, ytr, cv=cv)
    np.testing.assert_allclose(ours, ref, atol=0.01)


def test_parallel_grid_search_equals_sequential(binary):
    X, y = binary
    grid = {"C": [0.5, 2.0], "gamma": [0.05, 0.2]}
    runs = [GridSearchCV(JokerClassifier(loss="squared_hinge"), grid, cv=3, n_jobs=j).fit(X, y) for j in (1, 2)]
    np.testing.assert_array_equal(runs[0].cv_results_["mean_test_score"], runs[1].cv_results_["mean_test_score"])
    assert runs[0].best_params_ == runs[1].best_params_


# ----------------------------------------------------------------------------- weights
@pytest.mark.parametrize("n_classes", [2, 3])
def test_balanced_class_weight_equals_manual_sample_weights(n_classes):
    X, y = make_classification(n_samples=90, n_features=4, n_informative=3, n_redundant=0, n_classes=n_classes,
                               weights=[0.6, 0.3, 0.1][:n_classes] if n_classes == 3 else [0.7, 0.3],
                               random_state=3)
    a = JokerClassifier(class_weight="balanced", sigma=2.0).fit(X, y)
    b = JokerClassifier(sigma=2.0).fit(X, y, sample_weight=compute_sample_weight("balanced", y))
    np.testing.assert_allclose(a.decision_function(X), b.decision_function(X), atol=1e-9)
    c = JokerClassifier(class_weight="balanced", sigma=2.0).fit(X, y, sample_weight=np.full(len(y), 2.0))
    d = JokerClassifier(C=2.0, class_weight="balanced", sigma=2.0).fit(X, y)
    np.testing.assert_allclose(c.decision_function(X), d.decision_function(X), atol=1e-9)


@pytest.mark.parametrize(
    "est",
    [JokerRegressor(loss=l, sigma=1.0) for l in REGRESSION_LOSSES]
    + [JokerClassifier(loss=l, sigma=1.0) for l in CLASSIFICATION_LOSSES],
    ids=[f"reg-{l}" for l in REGRESSION_LOSSES] + [f"clf-{l}" for l in CLASSIFICATION_LOSSES],
)
def test_sample_weight_multiplies_C_for_every_loss(est):
    """c_i = C w_i: weights w scale like C (weights 3 everywhere = C * 3), and zero weights = removed rows."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=40)
    if isinstance(est, JokerClassifier):
        y = (y > 0).astype(int)
    a = clone(est).fit(X, y, sample_weight=np.full(40, 3.0))
    b = clone(est).set_params(C=3.0).fit(X, y)
    scale = max(1.0, np.abs(b.predict(X) if isinstance(est, JokerRegressor) else b.decision_function(X)).max())
    fa = a.predict(X) if isinstance(est, JokerRegressor) else a.decision_function(X)
    fb = b.predict(X) if isinstance(est, JokerRegressor) else b.decision_function(X)
    np.testing.assert_allclose(fa, fb, atol=1e-6 * scale)
    w = np.ones(40)
    w[::4] = 0.0
    c = clone(est).fit(X, y, sample_weight=w)
    d = clone(est).fit(X[w > 0], y[w > 0])
    fc = c.predict(X) if isinstance(est, JokerRegressor) else c.decision_function(X)
    fd = d.predict(X) if isinstance(est, JokerRegressor) else d.decision_function(X)
    np.testing.assert_allclose(fc, fd, atol=1e-6 * scale)


# ----------------------------------------------------------------------------- regression
@pytest.mark.parametrize("loss", ["squared", "epsilon_insensitive"])
def test_multi_output_equals_separate_fits(loss):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(70, 3))
    Y = np.column_stack([np.sin(X[:, 0]), X[:, 1] ** 2, np.cos(X[:, 2]) + 2.0])
    est = JokerRegressor(loss=loss, C=5.0, sigma=1.2, fit_intercept=(loss == "squared"))
    joint = clone(est).fit(X, Y)
    sep = np.column_stack([clone(est).fit(X, Y[:, j]).predict(X) for j in range(3)])
    np.testing.assert_allclose(joint.predict(X), sep, atol=1e-6)
    assert joint.predict(X).shape == (70, 3) and joint.intercept_.shape == (3,)
    np.testing.assert_allclose(joint.score(X, Y), r2_score(Y, joint.predict(X)), rtol=1e-12)
    if loss == "squared":  # kernel ridge closed form, with a bordered system for the intercepts
        K = gauss(X, X, 1.2)
        A = np.block([[K + np.eye(70) / 5.0, np.ones((70, 1))], [np.ones((1, 70)), np.zeros((1, 1))]])
        sol = np.linalg.solve(A, np.vstack([Y, np.zeros((1, 3))]))
        np.testing.assert_allclose(joint.dual_coef_, sol[:70], atol=1e-8)
        np.testing.assert_allclose(joint.intercept_, sol[70], atol=1e-8)


def test_regressor_score_is_r2_and_krr_closed_form():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(60, 2))
    y = X[:, 0] - X[:, 1] ** 2 + 0.1 * rng.normal(size=60)
    est = JokerRegressor(C=4.0, sigma=1.0).fit(X, y)
    alpha = np.linalg.solve(gauss(X, X, 1.0) + np.eye(60) / 4.0, y)  # KernelRidge(alpha=1/C)
    Xn = rng.normal(size=(25, 2))
    np.testing.assert_allclose(est.predict(Xn), gauss(Xn, X, 1.0) @ alpha, atol=1e-9)
    yn = Xn[:, 0] - Xn[:, 1] ** 2
    assert est.score(Xn, yn) == pytest.approx(r2_score(yn, est.predict(Xn)), rel=1e-12)


# ----------------------------------------------------------------------------- classification API
@pytest.mark.parametrize(
    "labels",
    [np.array(["cat", "dog"]), np.array([-7, 3, 11]), np.array([True, False]), np.array(["b", "a", "c", "d"])],
    ids=["str2", "int3", "bool", "str4"],
)
@pytest.mark.parametrize("n_features", [None, 48])
def test_any_labels_and_predict_is_argmax(labels, n_features):
    X, yi = make_classification(n_samples=80, n_features=4, n_informative=3, n_redundant=0,
                                n_classes=len(labels), n_clusters_per_class=1, random_state=0)
    y = labels[yi]
    est = JokerClassifier(loss="squared_hinge", n_features=n_features, random_state=0).fit(X, y)
    np.testing.assert_array_equal(est.classes_, np.sort(labels))
    D = est.decision_function(X)
    pred = est.predict(X)
    assert pred.dtype == y.dtype
    if len(labels) == 2:
        assert D.shape == (80,)
        np.testing.assert_array_equal(pred, est.classes_[(D > 0).astype(int)])
    else:
        assert D.shape == (80, len(labels))
        np.testing.assert_array_equal(pred, est.classes_[np.argmax(D, axis=1)])
    assert est.score(X, y) > 0.8
    if n_features is not None:  # one shared feature map: every class's column is phi(X) @ coef_[:, k]
        assert est.coef_.shape == (n_features, 1 if len(labels) == 2 else len(labels))
        phi = est.feature_map_(torch.as_tensor(X)).numpy()
        np.testing.assert_allclose((phi @ est.coef_).reshape(D.shape), D, atol=1e-10)


def test_one_vs_rest_equals_separate_binary_fits():
    X, y = make_classification(n_samples=90, n_features=4, n_informative=3, n_redundant=0, n_classes=3,
                               random_state=1)
    est = JokerClassifier(loss="squared_hinge", C=2.0, sigma=1.5).fit(X, y)
    for k in range(3):
        bk = JokerClassifier(loss="squared_hinge", C=2.0, sigma=1.5).fit(X, (y == k).astype(int))
        np.testing.assert_allclose(est.decision_function(X)[:, k], bk.decision_function(X), atol=1e-7)


def test_one_vs_one_through_scikit_learn_is_svcs_multiclass_model():
    """SVC's multiclass model is one-vs-one; scikit-learn's ``OneVsOneClassifier`` around a hinge classifier with
    an intercept gives it: every pair's decision values are LIBSVM's (SVC's pair ``(i, j)`` is positive for class
    ``i``, the wrapper's estimator for class ``j``), and so are the aggregated scores and the predictions."""
    X, y = make_classification(n_samples=150, n_features=4, n_informative=3, n_redundant=0, n_classes=3,
                               random_state=3)
    X = StandardScaler().fit_transform(X)
    Xnew = np.random.default_rng(4).normal(size=(60, 4))
    sigma, C = 1.2, 3.0
    svc = SVC(C=C, gamma=1.0 / (2 * sigma**2), tol=1e-10, decision_function_shape="ovo").fit(X, y)
    ovo = OneVsOneClassifier(JokerClassifier(loss="hinge", C=C, sigma=sigma, fit_intercept=True)).fit(X, y)
    pairs = np.column_stack([e.decision_function(Xnew) for e in ovo.estimators_])
    reference = -svc.decision_function(Xnew)
    np.testing.assert_allclose(pairs, reference, atol=1e-5 * np.abs(reference).max())
    svc.set_params(decision_function_shape="ovr")
    np.testing.assert_allclose(ovo.decision_function(Xnew), svc.decision_function(Xnew), atol=1e-5)
    np.testing.assert_array_equal(ovo.predict(Xnew), svc.predict(Xnew))


def test_predict_proba_native_and_calibrated(binary):
    X, y = binary
    assert not hasattr(JokerClassifier(loss="hinge").fit(X, y), "predict_proba")
    log = JokerClassifier(loss="logistic", sigma=1.5).fit(X, y)
    np.testing.assert_allclose(log.predict_proba(X)[:, 1], expit(log.decision_function(X)), rtol=1e-12)
    X3, y3 = make_classification(n_samples=120, n_features=4, n_informative=3, n_redundant=0, n_classes=3,
                                 random_state=2)
    for loss in ("hinge", "squared_hinge"):
        a = JokerClassifier(loss=loss, probability=True, random_state=3).fit(X3, y3)
        b = JokerClassifier(loss=loss, probability=True, random_state=3).fit(X3, y3)
        P = a.predict_proba(X3)
        np.testing.assert_allclose(P.sum(1), 1.0, rtol=1e-12)
        np.testing.assert_array_equal(a.classes_[P.argmax(1)], a.predict(X3))
        np.testing.assert_array_equal(P, b.predict_proba(X3))  # seeded calibration
        assert 0 < a.calibration_scale_ < np.inf
        # calibrated probabilities beat the uninformative ones in log-loss on the training set
        assert -np.mean(np.log(P[np.arange(len(y3)), y3])) < np.log(3)


# ----------------------------------------------------------------------------- bandwidth, repr
def test_gamma_alias_median_and_repr(binary):
    X, y = binary
    g = 0.2
    a = JokerClassifier(gamma=g).fit(X, y)
    b = JokerClassifier(sigma=1.0 / np.sqrt(2 * g)).fit(X, y)
    np.testing.assert_allclose(a.decision_function(X), b.decision_function(X), atol=1e-12)
    assert a.sigma_ == pytest.approx(1 / np.sqrt(2 * g)) and b.gamma_ == pytest.approx(g)
    m = JokerClassifier().fit(X, y)
    assert m.sigma_ == pytest.approx(np.median(pdist(np.unique(X, axis=0))))
    assert m.gamma_ == pytest.approx(1 / (2 * m.sigma_**2))
    r = repr(m)
    assert r.startswith("JokerClassifier()") and "sigma_=" in r and "n_iter_=" in r
    assert repr(JokerClassifier(C=3.0)) == "JokerClassifier(C=3.0)"
    assert m.get_params()["sigma"] == "median"  # parameters are never overwritten by fitted values
    pipe = Pipeline([("clf", m)])
    assert "fitted" not in repr(pipe) and "sigma_" not in repr(pipe)


def test_sklearn_kernel_objects_translate():
    gpk = pytest.importorskip("sklearn.gaussian_process.kernels")
    from joker_ext.adapters.sklearn import pairwise_kernel, translate_kernel
    from sklearn.metrics.pairwise import pairwise_kernels

    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(9, 3)), rng.normal(size=(6, 3))
    tA, tB = torch.as_tensor(A), torch.as_tensor(B)
    for k in [gpk.RBF(1.3), gpk.RBF([1.0, 2.0, 0.5]), gpk.Matern(0.7, nu=0.5), gpk.Matern(0.7, nu=2.5),
              gpk.Matern(2.0, nu=np.inf), gpk.ConstantKernel(2.0) * gpk.RBF(1.0),
              gpk.RBF(1.0) + gpk.Matern(1.0, nu=1.5), gpk.RationalQuadratic(1.0, 2.0)]:
        np.testing.assert_allclose(translate_kernel(k)(tA, tB).numpy(), k(A, B), atol=1e-12)
    for name, kw in [("rbf", {"gamma": 0.3}), ("laplacian", {"gamma": 0.3}), ("poly", {"degree": 2, "gamma": 0.5})]:
        ref = pairwise_kernels(A, B, metric=name, **kw)
        np.testing.assert_allclose(pairwise_kernel(name, **kw)(tA, tB).numpy(), ref, atol=1e-12)
    with pytest.raises(ValueError, match="WhiteKernel"):
        translate_kernel(gpk.RBF() + gpk.WhiteKernel())
    X, y = make_classification(n_samples=60, n_features=3, n_informative=3, n_redundant=0, random_state=0)
    a = JokerClassifier(kernel=gpk.RBF(1.7)).fit(X, y)
    b = JokerClassifier(sigma=1.7).fit(X, y)
    np.testing.assert_allclose(a.decision_function(X), b.decision_function(X), atol=1e-12)


def test_pairwise_kernel_refuses_kernels_that_are_not_positive_semidefinite():
    """scikit-learn's 'sigmoid' and 'additive_chi2' kernels, and 'poly' with coef0 < 0, have negative eigenvalues
    (checked here with numpy on the kernel matrices, so that the refusal is not taken on trust): pairwise_kernel
    refuses them with a ValueError naming the argument; 'poly' with coef0 >= 0 is positive semidefinite and kept.
    A kernel object that is indefinite reaches the solver, whose factorisation error says what to check."""
    from joker_ext.adapters.sklearn import pairwise_kernel
    from joker_ext.kernels import CallableKernel
    from sklearn.metrics.pairwise import pairwise_kernels

    A = np.abs(np.random.default_rng(0).normal(size=(40, 3)))
    refused = [("sigmoid", {}, "metric 'sigmoid'"), ("additive_chi2", {}, "metric 'additive_chi2'"),
               ("poly", {"gamma": 0.1, "coef0": -1.0}, "coef0")]
    for name, kw, message in refused:
        assert np.linalg.eigvalsh(pairwise_kernels(A, metric=name, **kw)).min() < -1e-8
        with pytest.raises(ValueError, match=message):
            pairwise_kernel(name, **kw)
    with pytest.raises(ValueError, match="degree must be a whole number"):
        pairwise_kernel("poly", degree=2.5)
    kept = {"gamma": 0.1, "coef0": 0.5, "degree": 2}
    assert np.linalg.eigvalsh(pairwise_kernels(A, metric="poly", **kept)).min() > -1e-10
    pairwise_kernel("poly", **kept)

    X, y = make_classification(n_samples=120, n_features=4, random_state=0)
    tanh = CallableKernel(lambda P, Q: torch.tanh(0.5 * P @ Q.T - 1.0), name="tanh")
    with pytest.raises(torch.linalg.LinAlgError, match="positive semidefinite"):
        JokerClassifier(kernel=tanh, loss="hinge", C=100.0).fit(X, y)


# ----------------------------------------------------------------------------- warm start, pickling
def test_warm_start_along_C_path_saves_iterations():
    """Along a path of C, warm starts reach the same solutions (each within its certified distance
    sqrt(2 gap) of the optimum: the primal is 1-strongly convex and k(x, x) = 1) in fewer iterations. (At C = 1 to
    2.2 the exact line search's Newton steps reach a gap of 1e-4 in two iterations cold, leaving nothing to save.)"""
    X, y = make_classification(n_samples=200, n_features=5, n_informative=4, n_redundant=0, random_state=0)
    path = [10.0, 13.0, 17.0, 22.0]
    kw = dict(loss="logistic", sigma=2.0, block_size=40, tol=1e-10, max_iter=5000, random_state=0)

    def first_below(m, level):
        return next(h["iteration"] for h in m.history_ if h["rel_gap"] <= level)

    cold = [JokerClassifier(C=C, **kw).fit(X, y) for C in path]
    warm_est = JokerClassifier(warm_start=True, **kw)
    warm_iters, warm_early = [], []
    for C, ref in zip(path, cold):
        warm_est.set_params(C=C).fit(X, y)
        warm_iters.append(warm_est.n_iter_)
        warm_early.append(first_below(warm_est, 1e-4))
        assert ref.status_ == "converged" and warm_est.status_ == "converged"
        bound = np.sqrt(2 * max(warm_est.duality_gap_, 0)) + np.sqrt(2 * max(ref.duality_gap_, 0))
        np.testing.assert_allclose(warm_est.decision_function(X), ref.decision_function(X), atol=bound + 1e-12)
    cold_iters = [m.n_iter_ for m in cold]
    cold_early = [first_below(m, 1e-4) for m in cold]
    assert sum(warm_iters[1:]) < 0.85 * sum(cold_iters[1:]), (warm_iters, cold_iters)
    assert sum(warm_early[1:]) < 0.5 * sum(cold_early[1:]), (warm_early, cold_early)
    # a warm start on other data is a cold start
    other = JokerClassifier(warm_start=True, C=1.0, **kw).fit(X, y)
    other.fit(X[:150], y[:150])
    fresh = JokerClassifier(C=1.0, **kw).fit(X[:150], y[:150])
    assert other.n_iter_ == fresh.n_iter_


def test_exact_logistic_warm_started_from_a_far_c_reaches_its_certified_optimum(monkeypatch):
    """Exact logistic regression with the intercept, warm-started at C = 10 from its solution at C = 1000: the
    clipped dual coefficients made a start whose primal objective was 200 times that of w = 0, and the intercept's
    Newton step carried the predictions into the loss's flat tail, where no step decreased it ('stalled' at a
    relative gap of 1.0). The engine starts from w = 0 when that is better, and a warm-started column whose Newton
    step fails starts again from w = 0: both fits end with a certified gap at the rounding floor."""
    import joker_ext.newton_exact as ne

    X, y = make_classification(n_samples=800, n_features=8, flip_y=0.05, random_state=1)
    X = (X - X.mean(0)) / X.std(0)
    est = JokerClassifier(loss="logistic", gamma=0.05, fit_intercept=True, warm_start=True, C=1000.0).fit(X, y)
    est.set_params(C=10.0).fit(X, y)
    assert est.status_ == "converged" and est.relative_gap_ <= 1e-11, (est.status_, est.relative_gap_)

    # the restart itself: a warm start better than w = 0 (from C = 8, inside the box of C = 10) whose first Newton
    # step fails
    failed, real_step = [], ne._Column.primal_step

    def first_step_fails(col, **kwargs):
        if not failed:
            failed.append(True)
            return False
        return real_step(col, **kwargs)

    est.set_params(C=8.0).fit(X, y)
    monkeypatch.setattr(ne._Column, "primal_step", first_step_fails)
    est.set_params(C=10.0).fit(X, y)
    assert failed and est.status_ == "converged" and est.relative_gap_ <= 1e-11, (est.status_, est.relative_gap_)


@pytest.mark.parametrize("n_features", [None, 64], ids=["exact", "rff"])
def test_warm_start_carries_the_intercept_an_engine_fits(n_features):
    """Where the engine fits the intercept (logistic: exact Newton's primal steps, feature Newton's bordered steps),
    a warm start starts it at the previous fit's intercept: a refit on the same data starts at the optimum and
    takes no iteration (started at b = 0 with the optimal weights, it took 6), and along C it stays at
    scikit-learn's LogisticRegression optimum on the same kernel features (intercept to 1e-5)."""
    X, y = make_classification(n_samples=300, n_features=4, n_informative=3, n_redundant=0, weights=[0.8],
                               random_state=2)
    est = JokerClassifier(loss="logistic", C=5.0, sigma=1.5, n_features=n_features, random_state=0,
                          fit_intercept=True, warm_start=True, tol=1e-12).fit(X, y)
    assert est.fit_plan_.intercept == "engine" and est.n_iter_ >= 3 and abs(est.intercept_[0]) > 0.5
    est.fit(X, y)
    assert est.n_iter_ == 0 and est.status_ == "converged"
    est.set_params(C=8.0).fit(X, y)
    assert est.status_ == "converged"
    if n_features is None:  # the exact kernel's features: the Cholesky factor of K (w = L^T alpha)
        Z = np.linalg.cholesky(rbf_kernel(X, gamma=1 / (2 * 1.5 ** 2)) + 1e-12 * np.eye(300))
    else:
        Z = est.feature_map_(torch.as_tensor(X)).numpy()
    ref = LogisticRegression(C=8.0, tol=1e-12, max_iter=10000).fit(Z, y)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, atol=1e-5)


@pytest.mark.parametrize("loss", ["hinge", "epsilon_insensitive"])
def test_warm_start_of_a_kinked_loss_along_C_costs_no_more_than_a_cold_fit(loss):
    """Random features, a kinked loss: a warm start from the fit at another C (whose own active sets do not finish the
    new problem) goes to the interior-point start as a cold fit does, instead of a smoothing continuation from the old
    point (19-30 Newton iterations where the cold fit took 1-21); same optimum as the cold fit."""
    X, y = make_classification(n_samples=1500, n_features=6, n_informative=4, n_redundant=0, weights=[0.7],
                               random_state=3)
    Est, target = (JokerClassifier, y) if loss == "hinge" else (JokerRegressor, X[:, 0] + np.sin(X[:, 1]))
    kw = dict(loss=loss, n_features=200, random_state=0)
    warm = Est(C=10.0, warm_start=True, **kw).fit(X, target)
    warm.set_params(C=14.0).fit(X, target)
    cold = Est(C=14.0, **kw).fit(X, target)
    assert warm.status_ == "converged" and cold.status_ == "converged"
    assert warm.n_iter_ <= cold.n_iter_ + 1, (warm.n_iter_, cold.n_iter_)
    assert warm.primal_objective_ == pytest.approx(cold.primal_objective_, rel=1e-9)


@pytest.mark.parametrize("n_features,loss", [(None, "logistic"), (64, "hinge")], ids=["exact-engine", "rff-search"])
def test_checkpoint_with_intercept_is_written_and_resumed(tmp_path, n_features, loss):
    """checkpoint= works with fit_intercept=True (it was ignored): the file holds the intercept (and, where the
    intercept search fits it, the search's state); a fit that finds the file left by an interrupted fit resumes
    from it and ends at the same model as a fit without checkpoint (predictions to 1e-6)."""
    X, y = make_classification(n_samples=400, n_features=4, n_informative=3, n_redundant=0, weights=[0.7],
                               random_state=5)
    kw = dict(loss=loss, C=10.0, sigma=1.5, n_features=n_features, random_state=0, fit_intercept=True, tol=1e-10)
    plain = JokerClassifier(**kw).fit(X, y)
    path = tmp_path / "fit.ckpt"
    first = JokerClassifier(**kw, checkpoint=str(path), checkpoint_every=1).fit(X, y)
    state = load_solver_state(path)
    assert "intercept" in state["state"]
    assert ("search" in state) == (first.fit_plan_.intercept == "search")
    resumed = JokerClassifier(**kw, checkpoint=str(path), checkpoint_every=1).fit(X, y)
    assert resumed.status_ == "converged"
    np.testing.assert_allclose(resumed.decision_function(X), plain.decision_function(X), atol=1e-6)
    np.testing.assert_allclose(resumed.intercept_, plain.intercept_, atol=1e-6)


@pytest.mark.parametrize(
    "est",
    [JokerClassifier(loss="logistic", sigma=1.5), JokerClassifier(n_features=32, fit_intercept=True, random_state=0),
     JokerRegressor(loss="huber", fit_intercept=True)],
    ids=["logistic-exact", "hinge-rff-intercept", "huber-intercept"],
)
def test_pickle_round_trip(binary, est):
    X, y = binary
    est = clone(est).fit(X, y)
    state = est.__getstate__()
    assert state["_model_cache"] is None
    assert all(v.device.type == "cpu" for v in state.values() if torch.is_tensor(v))
    loaded = pickle.loads(pickle.dumps(est))
    assert loaded._model_cache is not None  # rebuilt on unpickling
    predict = loaded.decision_function if hasattr(loaded, "decision_function") else loaded.predict
    ref = est.decision_function if hasattr(est, "decision_function") else est.predict
    np.testing.assert_array_equal(predict(X), ref(X))
    assert pickle.loads(pickle.dumps(clone(est))).get_params() == clone(est).get_params()


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "params, fit_kw, match",
    [
        ({"C": -1.0}, {}, "'C' parameter"),
        ({"loss": "hinge_loss"}, {}, "loss must be one of"),
        ({"kernel": "rbf"}, {}, "kernel must be one of .*scikit-learn's 'rbf' is 'gaussian'"),
        ({"sigma": -2.0}, {}, "'sigma' parameter"),
        ({"sigma": "auto"}, {}, "'sigma' parameter"),
        ({"sigma": [1.0, 2.0]}, {}, "sigma must be a positive number or one bandwidth per feature"),
        ({"sigma": 1.0, "gamma": 0.5}, {}, "sigma and gamma"),
        ({"kernel": "matern", "gamma": 0.5}, {}, "gamma is defined for kernel"),
        ({"n_features": 0}, {}, "'n_features' parameter"),
        ({"features": "fastfood"}, {}, "'features' parameter"),
        ({"class_weight": "auto"}, {}, "'class_weight' parameter"),
        ({"class_weight": {"zebra": 2.0}}, {}, "class_weight has the label 'zebra'"),
        ({"max_iter": 0}, {}, "'max_iter' parameter"),
        ({"fit_intercept": "yes"}, {}, "'fit_intercept' parameter"),
        ({}, {"sample_weight": -np.ones(30)}, "sample_weight"),
    ],
)
def test_bad_parameters_name_the_argument(params, fit_kw, match):
    X = np.random.default_rng(0).normal(size=(30, 3))
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises((ValueError, TypeError), match=match):
        JokerClassifier(**params).fit(X, y, **fit_kw)


def test_regressor_refuses_classification_loss():
    X = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(ValueError, match="loss must be one of"):
        JokerRegressor(loss="hinge").fit(X, X[:, 0])
    with pytest.raises(ValueError, match="at least 2 classes"):
        JokerClassifier().fit(X, np.zeros(20))


@pytest.mark.parametrize("Est", [JokerRegressor, JokerClassifier])
def test_values_whose_squares_overflow_are_refused_by_name(Est):
    """A value of 1e300 is finite, but its square (in every squared distance) overflows: fit and predict
    refuse it with a message naming X instead of producing NaN predictions (found by the fuzz test)."""
    X = np.array([[0.0], [1.0], [2.0], [0.5], [1e300]])
    y = np.array([0, 1, 0, 1, 1])
    with pytest.raises(ValueError, match=r"^X must have values of magnitude below .* got a value of magnitude 1e\+300"):
        Est().fit(X, y)
    est = Est().fit(X[:4], y[:4])
    with pytest.raises(ValueError, match=r"^X must have values of magnitude"):
        est.predict(X)


@pytest.mark.parametrize("loss", ["absolute", "hinge"])
def test_random_features_at_a_large_c_end_with_their_best_certificate(loss):
    """Default solver on random features, C = 1000, more rows than features: the Newton engine's smoothing
    continuation reaches the rounding floor while its smoothing still shrinks; going on, the dual points of ever less
    smoothed problems jump between the subgradients at the kinks, and the fit used to end 'stalled' with a gap above
    1 and a ConvergenceWarning for an optimal model. It ends converged, certified, at cvxpy's optimum on the same
    features."""
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((80, 3))
    y = np.sin(2 * X[:, 0]) + 0.2 * rng.standard_normal(80)
    if loss == "hinge":
        y = np.where(y > 0, 1.0, -1.0)
    Est = JokerClassifier if loss == "hinge" else JokerRegressor
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = Est(loss=loss, C=1000.0, gamma=0.3, n_features=40, random_state=3).fit(X, y)
    assert m.status_ == "converged" and 0.0 <= m.relative_gap_ <= 1e-10, (m.status_, m.relative_gap_)
    Phi = m.feature_map_(torch.from_numpy(X)).numpy()
    beta = cp.Variable(Phi.shape[1])
    f = Phi @ beta
    terms = cp.abs(y - f) if loss == "absolute" else cp.pos(1 - cp.multiply(y, f))
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(beta) + 1000.0 * cp.sum(terms)))
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert m.primal_objective_ == pytest.approx(prob.value, rel=1e-7)



def test_random_features_at_a_large_c_converge_within_the_default_budget():
    """Epsilon-insensitive on 300 random features, C = 300, 2,000 rows: the smoothing continuation takes 107 Newton
    iterations to the default tol (60-160 at C = 100-10,000 on such problems), and the default budget of 100 stopped
    it at 'max_iter' with a gap of 1.4e-7 and a ConvergenceWarning. The kinked losses' default budget
    (KINKED_NEWTON_MAX_ITER) takes it to cvxpy's optimum on the same features."""
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(1)
    X = rng.standard_normal((2000, 6))
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 - 1 + 0.3 * rng.standard_normal(2000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = JokerRegressor(loss="epsilon_insensitive", epsilon=0.1, C=300.0, gamma=0.5, n_features=300,
                           random_state=0).fit(X, y)
    assert m.status_ == "converged" and 0.0 <= m.relative_gap_ <= 1e-10, (m.status_, m.n_iter_, m.relative_gap_)
    Phi = m.feature_map_(torch.from_numpy(X)).numpy()
    beta = cp.Variable(Phi.shape[1])
    terms = cp.pos(cp.abs(y - Phi @ beta) - 0.1)
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(beta) + 300.0 * cp.sum(terms)))
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert m.primal_objective_ == pytest.approx(prob.value, rel=1e-7)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_float32_random_features_with_an_intercept_at_a_large_c_reach_the_closed_form(loss):
    """float32, 200 random features, C = 10^5 on 2,000 rows (scikit-learn's friedman1 / classification problems)
    with the intercept: in float32 throughout the Newton steps stalled at once (relative gap 1.0 after 2
    iterations, a ConvergenceWarning); above FLOAT32_INTERCEPT_MAX_COST the features are evaluated in float32
    and solved in float64. The model is the
    closed form on those float32 features (squared: the bordered ridge system; logistic: scikit-learn's
    LogisticRegression, whose objective is the same), and a float32 fit at C = 1 stays in float32 throughout."""
    from sklearn.datasets import make_friedman1

    C = 1e5
    if loss == "squared":
        Est, (X, y) = JokerRegressor, make_friedman1(n_samples=2000, n_features=6, noise=1.0, random_state=1)
    else:
        Est, (X, y) = JokerClassifier, make_classification(n_samples=2000, n_features=6, n_informative=4,
                                                           flip_y=0.05, random_state=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = Est(loss=loss, C=C, n_features=200, fit_intercept=True, dtype="float32", random_state=0).fit(X, y)
    assert m.status_ == "converged", (m.status_, m.relative_gap_)
    Phi = m.feature_map_(torch.from_numpy(X)).numpy()  # evaluated in float32
    f = m.decision_function(X) if loss == "logistic" else m.predict(X)
    if loss == "squared":
        # min 1/2 |beta|^2 + C/2 |y - Phi beta - b|^2: (I + C Phi^T Phi) beta + C Phi^T 1 b = C Phi^T y, ...
        A = np.block([[np.eye(Phi.shape[1]) + C * Phi.T @ Phi, C * Phi.sum(0)[:, None]],
                      [C * Phi.sum(0)[None, :], np.full((1, 1), C * len(y))]])
        sol = np.linalg.solve(A, C * np.r_[Phi.T @ y, y.sum()])
        f_ref = Phi @ sol[:-1] + sol[-1]
    else:
        ref = LogisticRegression(C=C, tol=1e-12, max_iter=10000).fit(Phi, y)
        f_ref = ref.decision_function(Phi)
    assert np.abs(f - f_ref).max() <= 1e-4 * np.abs(f_ref).max()
    assert m.dtype_ == torch.float64
    small = Est(loss=loss, C=1.0, n_features=200, fit_intercept=True, dtype="float32").fit(X, y)
    assert small.dtype_ == torch.float32 and small.status_ == "converged"


def test_huber_on_random_features_with_an_intercept_converges_to_cvxpy():
    """The intercept search around the Newton engine (random features, Huber): each solve's dual point is off by
    about the square root of its gap, so ``sum alpha`` at a solve to a gap of ``1e-2 rel`` was noise at the scale
    the search needed, and the search swung around the intercept for its 60 rounds ('max_iter' at a gap of 2e-5,
    whatever max_iter). With solves to ``rel^2`` it converges, to cvxpy's optimum on the same features."""
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(2)
    X = rng.standard_normal((50, 2))
    y = np.sin(2 * X[:, 0]) + 0.2 * rng.standard_normal(50)
    m = JokerRegressor(loss="huber", delta=0.3, C=0.1, gamma=0.5, fit_intercept=True, n_features=30).fit(X, y)
    assert m.status_ == "converged" and abs(m.relative_gap_) <= 1e-10, (m.status_, m.relative_gap_)
    Phi = m.feature_map_(torch.from_numpy(X)).numpy()
    beta, b = cp.Variable(Phi.shape[1]), cp.Variable()
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(beta) + 0.1 * cp.sum(0.5 * cp.huber(y - Phi @ beta - b, 0.3))))
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    assert m.primal_objective_ == pytest.approx(prob.value, rel=1e-8)
    assert m.intercept_ == pytest.approx(b.value, abs=1e-5)



def test_intercept_search_pairs_the_primal_weights_with_their_own_intercept():
    """Huber at C = 1000 on 300 random features with an intercept (2,000 rows): the engine's solves stopped at a
    relative gap of 6e-10, where its constant feature's weight (the primal iterate's intercept) was 0.013 away from
    the multiplier ``b + rho sum(alpha)``. The search certified the weights with that multiplier, its joint gap stayed
    at 4e-4, and the fit ended 'stalled' with an intercept off by 0.013. The search now also tries the primal
    iterate's own intercept, and reaches cvxpy's optimum on the same features."""
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(1)
    X = rng.standard_normal((2000, 6))
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 - 1 + 0.3 * rng.standard_normal(2000)
    m = JokerRegressor(loss="huber", delta=0.5, C=1000.0, gamma=0.5, n_features=300, fit_intercept=True,
                       random_state=0).fit(X, y)
    assert m.status_ == "converged" and abs(m.relative_gap_) <= 1e-10, (m.status_, m.relative_gap_)
    Phi = m.feature_map_(torch.from_numpy(X)).numpy()
    beta, b = cp.Variable(Phi.shape[1]), cp.Variable()
    huber = 0.5 * cp.huber(y - Phi @ beta - b, 0.5)
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(beta) + 1000.0 * cp.sum(huber)))
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert m.primal_objective_ == pytest.approx(prob.value, rel=1e-9)
    assert m.intercept_ == pytest.approx(b.value, abs=1e-6)

def test_a_stop_at_max_iter_advises_more_iterations():
    """The ConvergenceWarning names the cause of the stop; at ``max_iter`` it says to increase it."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((50, 2))
    y = np.sin(2 * X[:, 0]) + 0.2 * rng.standard_normal(50)
    with pytest.warns(ConvergenceWarning, match=r"stopped \(max_iter\).*increase max_iter"):
        m = JokerRegressor(loss="absolute", C=100.0, gamma=0.5, solver="dbcd_tr", max_iter=1).fit(X, y)
    assert m.status_ == "max_iter"


def test_newton_on_random_features_with_an_intercept_search_has_the_budget_to_converge():
    """Hinge on random features with ``solver='newton'`` and an intercept: the search's solves share one budget, and
    the engine's own (100 Newton iterations; 25-70 per solve of a kinked loss) ran out at a gap of 5e-5 after 8
    rounds. The default budget of a search is ``SEARCH_BUDGETS`` engine budgets: it reaches cvxpy's optimum."""
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 3))
    y = np.where(np.sin(2 * X[:, 0]) + 0.2 * rng.standard_normal(200) > 0, 1.0, -1.0)
    m = JokerClassifier(loss="hinge", C=10.0, solver="newton", fit_intercept=True, n_features=100,
                        random_state=0).fit(X, y)
    assert m.relative_gap_ <= 1e-9, (m.status_, m.n_iter_, m.relative_gap_)
    Phi = m.feature_map_(torch.from_numpy(X)).numpy()
    beta, b = cp.Variable(Phi.shape[1]), cp.Variable()
    hinge = cp.pos(1 - cp.multiply(y, Phi @ beta + b))
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(beta) + 10.0 * cp.sum(hinge)))
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert m.primal_objective_ == pytest.approx(prob.value, rel=1e-7)


@pytest.mark.parametrize("offset", [1000.0, -1e5])
def test_svr_with_targets_far_from_zero_reaches_libsvm(offset):
    """Targets around 1,000 or -100,000 (raw prices, temperatures in kelvin): the default fit with an intercept
    reaches LIBSVM's optimum. At 1,000 the working set's first subproblems predicted their sets at b = 0, every
    coordinate went to one bound, no set balanced and alpha stayed at zero for all 120 iterations (status
    'max_iter', relative gap 1.0); at -100,000 the gap's rounding noise at the intercept's level kept it above
    the default tolerance for 100 iterations ('max_iter')."""
    from sklearn.datasets import make_friedman1

    X, y = make_friedman1(n_samples=600, noise=1.0, random_state=0)
    y = y + offset
    C, eps = 100.0, 0.1
    m = JokerRegressor(loss="epsilon_insensitive", C=C, epsilon=eps, fit_intercept=True).fit(X, y)
    assert m.status_ == "converged"
    svr = SVR(C=C, gamma=m.gamma_, epsilon=eps, tol=1e-8).fit(X, y)
    K = rbf_kernel(X, gamma=m.gamma_)
    a_ref = np.zeros(len(y))
    a_ref[svr.support_] = svr.dual_coef_[0]
    a = m.dual_coef_[:, 0] if m.dual_coef_.ndim == 2 else m.dual_coef_

    def primal(a, f):
        return 0.5 * a @ K @ a + C * np.maximum(0.0, np.abs(y - f) - eps).sum()

    assert primal(a, m.predict(X)) <= primal(a_ref, svr.predict(X)) * (1 + 1e-9)


@pytest.mark.parametrize("loss", ["squared", "huber", "absolute", "pinball", "epsilon_insensitive"])
@pytest.mark.parametrize("n_features", [None, 100])
def test_targets_far_from_zero_shift_the_intercept_and_nothing_else(loss, n_features):
    """With an intercept, adding 10^4 to the targets of a loss of ``y - f`` adds 10^4 to the predictions (a property
    of the problem): the default fit converges either way, to the same model. At 10^4 the exact engines ran to
    max_iter on rounding noise and the intercept search took five times the iterations."""
    from sklearn.datasets import make_friedman1

    X, y = make_friedman1(n_samples=300, noise=1.0, random_state=1)
    kw = dict(loss=loss, C=10.0, fit_intercept=True, n_features=n_features, random_state=0)
    near = JokerRegressor(**kw).fit(X, y)
    far = JokerRegressor(**kw).fit(X, y + 1e4)
    assert near.status_ == far.status_ == "converged"
    np.testing.assert_allclose(far.predict(X) - 1e4, near.predict(X), rtol=0, atol=1e-7 * np.abs(y).max())
    assert far.n_iter_ <= 2 * near.n_iter_ + 2


@pytest.mark.parametrize("loss", ["squared", "huber", "absolute"])
@pytest.mark.parametrize("n_features", [None, 64])
def test_constant_targets_with_intercept_are_the_intercept(loss, n_features):
    """Constant targets: the optimum is f = 0 and b = the constant (primal and dual both 0). Feature Newton's relative
    gap there was 0/0-like rounding (1.4, 1.0, ...) and it ran its 100 iterations to 'max_iter' (squared)."""
    X = np.random.default_rng(0).standard_normal((200, 4))
    est = JokerRegressor(loss=loss, C=10.0, fit_intercept=True, n_features=n_features, random_state=0)
    m = est.fit(X, np.full(200, 3.0))
    assert m.status_ == "converged" and m.n_iter_ <= 2
    np.testing.assert_allclose(m.predict(X), 3.0, rtol=0, atol=1e-9)
