"""Side-by-side benchmark of the engines (``python -m comparisons.benchmarks.engines``).

1. Exact kernels, float64: ``JokerRegressor(loss='squared')`` with ``solver='newton'`` and ``'dbcd_tr'``
   against scikit-learn's KernelRidge with the same C and gamma (fit time ratio, relative gap, largest
   prediction difference), and kernel logistic regression's relative gap and time.
2. JokerFalkon / JokerLogisticFalkon with Falkon's defaults against Falkon / LogisticFalkon on
   scikit-learn-generated problems (test error, fit time) at penalties 1e-6 and 1e-8, when Falkon is
   installed.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def exact_rows(n: int, seed: int = 0) -> None:
    from sklearn.datasets import make_classification, make_regression
    from sklearn.kernel_ridge import KernelRidge

    from joker_ext import JokerClassifier, JokerRegressor

    X, y = make_regression(n_samples=n, n_features=8, noise=10.0, random_state=seed)
    X = (X - X.mean(0)) / X.std(0)
    y = (y - y.mean()) / y.std()
    C, gamma = 10.0, 0.05
    krr, t_krr = _timed(lambda: KernelRidge(alpha=1.0 / C, kernel="rbf", gamma=gamma).fit(X, y))
    print(f"exact squared, n = {n}: KernelRidge {t_krr:.2f} s")
    for solver in ("newton", "dbcd_tr"):
        est = JokerRegressor(loss="squared", C=C, gamma=gamma, solver=solver, max_time=120)
        est, t = _timed(lambda: est.fit(X, y))
        diff = float(np.abs(est.predict(X) - krr.predict(X)).max())
        print(f"  joker {solver:8s} {t:7.2f} s  time ratio {t / t_krr:6.2f}  rel gap {est.relative_gap_:.1e}  "
              f"max |pred - KRR| {diff:.1e}")
    Xc, yc = make_classification(n_samples=n, n_features=8, random_state=seed)
    klr, t = _timed(lambda: JokerClassifier(loss="logistic", C=C, gamma=gamma, solver="newton").fit(Xc, yc))
    print(f"exact logistic, n = {n}: newton {t:.2f} s, {klr.n_iter_} iterations, rel gap {klr.relative_gap_:.1e}")


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
            print(f"{task}, n = {n}, M = {M}, penalty {pen:g}: " + "; ".join(
                f"{name} {e:.4f} in {t:.2f} s (x{t / tf:.2f})" for name, e, t in rows))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exact-n", type=int, nargs="+", default=[4000])
    ap.add_argument("--falkon-n", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--M", type=int, default=500)
    args = ap.parse_args(argv)
    for n in args.exact_n:
        exact_rows(n)
    for n in args.falkon_n:
        falkon_rows(n, args.M)


if __name__ == "__main__":
    main()
