"""The kinked losses' interior-point start (:mod:`joker_ext.feature_interior`) against the continuation alone.

::

    python -m joker_ext.comparisons.benchmarks.kinked_start [--quick]

fits JokerFalkon (Nystrom features, Gaussian kernel, its default ``tol``) with the epsilon-insensitive, absolute and
pinball losses on scikit-learn-generated regression problems, twice per setting, one after the other: with the
engine as it is, and with the starts switched off (``joker_ext.primal_newton.worth_starting`` answering False and
no working-set start, which is where the engine goes when the interior point does not start: the continuation
alone). For each it prints, at Falkon's default ``maxiter = 20``, the relative duality gap and the test mean
absolute error, and, with ``maxiter = 1000``, the Newton iterations and the time to the tolerance, and their ratios
(start / continuation). Timings are one run each on this machine.
"""
from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch

SETTINGS = [  # (n, M, sigma, make_regression or make_friedman1, input dimension, penalties)
    (5000, 500, 3.0, "regression", 10, (1e-6, 1e-8)),
    (3000, 300, 2.0, "friedman", 5, (1e-5, 1e-8)),
    (2000, 400, 5.0, "friedman", 20, (1e-5, 1e-8)),
    (4000, 1000, 3.0, "friedman", 8, (1e-5, 1e-7)),
]
LOSSES = ["epsilon_insensitive", "absolute", "pinball"]


def _data(n: int, kind: str, d: int, seed: int):
    from sklearn.datasets import make_friedman1, make_regression

    if kind == "friedman":
        X, y = make_friedman1(n_samples=n + 1000, n_features=d, noise=1.0, random_state=seed)
    else:
        X, y = make_regression(n_samples=n + 1000, n_features=d, noise=10.0, random_state=seed)
    X = (X - X.mean(0)) / X.std(0)
    y = (y - y.mean()) / y.std()
    return (torch.as_tensor(X[:n]), torch.as_tensor(y[:n]).reshape(-1, 1), torch.as_tensor(X[n:]), y[n:])


def _fit(loss: str, penalty: float, M: int, sigma: float, data, maxiter: int, start: bool):
    import joker_ext.primal_newton as newton
    from joker_ext import JokerFalkon
    from joker_ext.kernels import make_kernel

    Xtr, ytr, Xts, yts = data
    keep = newton.worth_starting, newton._working_set_start
    if not start:  # neither start: the interior point's nor the working set's, its fallback
        newton.worth_starting = lambda *args: False
        newton._working_set_start = lambda *args, **kwargs: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            model = JokerFalkon(make_kernel("gaussian", sigma), penalty, M, seed=0, loss=loss, maxiter=maxiter)
            model.fit(Xtr, ytr)
            seconds = time.perf_counter() - t0
    finally:
        newton.worth_starting, newton._working_set_start = keep
    error = float(np.mean(np.abs(model.predict(Xts).numpy().ravel() - yts)))
    return {"seconds": seconds, "iterations": model.n_iter_, "gap": model.relative_gap_, "error": error,
            "status": model.status_}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first setting at penalty 1e-6 only")
    parser.add_argument("--threads", type=int, default=None)
    a = parser.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    settings = [SETTINGS[0][:5] + ((1e-6,),)] if a.quick else SETTINGS
    print("n     M    loss                 penalty | at maxiter 20: gap, test MAE (start / continuation) | "
          "to tol: iterations, seconds (start / continuation), ratio of seconds")
    for seed, (n, M, sigma, kind, d, penalties) in enumerate(settings):
        data = _data(n, kind, d, seed)
        for loss in LOSSES:
            for penalty in penalties:
                short = [_fit(loss, penalty, M, sigma, data, 20, s) for s in (True, False)]
                full = [_fit(loss, penalty, M, sigma, data, 1000, s) for s in (True, False)]
                at20 = " / ".join(f"{r['gap']:.1e} {r['error']:.4f}" for r in short)
                print(f"{n:<5d} {M:<4d} {loss:20s} {penalty:.0e} | {at20} | "
                      f"{full[0]['iterations']} {full[0]['seconds']:.2f} s ({full[0]['status']}) / "
                      f"{full[1]['iterations']} {full[1]['seconds']:.2f} s ({full[1]['status']}), "
                      f"{full[0]['seconds'] / full[1]['seconds']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
