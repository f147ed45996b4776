"""Diagnostic: EigenPro 2's set-up (s, q, eigenvalues, beta, batch, step) and per-epoch training loss on flights.

    OMP_NUM_THREADS=1 nice -n 19 python -m joker_ext.comparisons.examples.eigenpro2_steps \\
        --n 5000 10000 20000 --epochs 3

Same spec as issue #16's run: Gaussian kernel sigma 1, penalty 1e-5 (ridge r = n * penalty), float64.
Prints one line of set-up per n, then per epoch the relative residual ``||(K + rI) a - y|| / ||y||``, the
training RMSE and the test RMSE, and finally KernelRidge's test RMSE when ``--krr`` is given.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def main(argv=None) -> None:
    from joker_ext.comparisons.datasets import flights
    from joker_ext.comparisons.solvers.eigenpro import EigenPro2
    from joker_ext.kernels import GaussianKernel

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[5000, 10000, 20000])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--penalty", type=float, default=1e-5)
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--krr", action="store_true", help="also fit sklearn KernelRidge (slow beyond 10k)")
    ap.add_argument("--option", action="append", default=[], help="EigenPro2 keyword, e.g. top_q=100")
    args = ap.parse_args(argv)
    opts = {}
    for o in args.option:
        k, v = o.split("=", 1)
        opts[k] = int(v) if v.isdigit() else float(v)
    for n in args.n:
        ds = flights("regression", n_train=n, n_test=args.n_test, seed=0)
        X, y, Xt, yt = ds.X_train, ds.y_train, ds.X_test, ds.y_test
        ridge = n * args.penalty
        kern = GaussianKernel(args.sigma)
        t0 = time.perf_counter()
        last = [t0]

        def cb(info, X=X, y=y, Xt=Xt, yt=yt):
            tr = np.sqrt(np.mean((info["predict"](X) - y) ** 2))
            te = np.sqrt(np.mean((info["predict"](Xt) - yt) ** 2))
            now = time.perf_counter()
            print(f"  n={n} epoch {info['epoch']}: rel. residual {info.get('relative_residual', float('nan')):.4e}"
                  f"  train RMSE {tr:.3f}  test RMSE {te:.3f}  ({now - last[0]:.1f} s)", flush=True)
            last[0] = time.perf_counter()

        ep = EigenPro2(kern, ridge=ridge, epochs=args.epochs, **opts)
        ep.fit(X, y, callback=cb)
        print(f"n={n}: s={ep.n_nystrom_} q={ep.top_q_} beta={ep.beta_:.4g} lambda_q+1={ep.lambda_q1_:.4g} out-of-sample={getattr(ep, 'lambda_out_of_sample_', float('nan')):.4g} "
              f"batch={ep.batch_size_} eta={ep.step_:.4g} (per sample {ep.step_ / ep.batch_size_:.4g}) "
              f"trivial RMSE {np.sqrt(np.mean((yt - y.mean()) ** 2)):.3f}  notes={ep.notes[1:]}"
              f"  total {time.perf_counter() - t0:.1f} s", flush=True)
        if args.krr:
            from sklearn.kernel_ridge import KernelRidge

            kr = KernelRidge(alpha=ridge, kernel="rbf", gamma=1.0 / (2 * args.sigma ** 2)).fit(X, y)
            print(f"  KernelRidge test RMSE {np.sqrt(np.mean((kr.predict(Xt) - yt) ** 2)):.3f}", flush=True)


if __name__ == "__main__":
    main()
