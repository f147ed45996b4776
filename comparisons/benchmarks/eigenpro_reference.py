"""Reference row: the authors' EigenPro 2 code beside :class:`joker_ext.comparisons.solvers.EigenPro2`, same problem
and budget.

    # a checkout of https://github.com/EigenPro/EigenPro-pytorch *outside* this project (never copied in):
    git clone https://github.com/EigenPro/EigenPro-pytorch /tmp/EigenPro-pytorch
    OMP_NUM_THREADS=1 nice -n 19 python -m joker_ext.comparisons.benchmarks.eigenpro_reference \\
        --source /tmp/EigenPro-pytorch --n-train 20000 --epochs 5

The authors' package (``eigenpro2.KernelModel``) is imported from ``--source`` at run time. Both solve
EigenPro's own problem, kernel interpolation ``K alpha = y`` stopped after ``--epochs`` passes (the authors' code
has no ridge term: ours runs with ``ridge=0``), on the harness's flights split (targets z-scored, RMSE in minutes),
Gaussian kernel ``exp(-||x - y||^2 / (2 sigma^2))`` (their ``gaussian(samples, centers, bandwidth)`` is the same
function), float32 (the authors' model keeps its weights in float32), one thread, the same subsample size
(their default ``min(n, 2000)`` below 100,000 points) and their automatic q, batch and step. The random
streams differ (their subsample and batches come from torch's global generator). Prints one markdown row per
implementation: fit seconds, test RMSE, and the gap between them.
Their ``fit`` also evaluates the training and validation error after every epoch; that time is inside their
measured fit time (it is ~2 x 5000 x n kernel entries per epoch against n^2 for the epoch itself).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time

import numpy as np
import torch


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, help="folder of a checkout of EigenPro/EigenPro-pytorch")
    ap.add_argument("--n-train", type=int, default=20000)
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    from joker_ext.comparisons.datasets import load
    from joker_ext.comparisons.solvers.eigenpro import EigenPro2, ep2_default_nystrom
    from joker_ext.kernels import GaussianKernel

    ds = load("flights", "regression", n_train=args.n_train, n_test=args.n_test, seed=args.seed, standardize_y=True)
    std = float(ds.info["y_std"])
    X, y, Xt, yt = ds.X_train, ds.y_train, ds.X_test, ds.y_test
    n = X.shape[0]
    s = ep2_default_nystrom(n)

    def rmse(pred) -> float:
        return std * float(np.sqrt(np.mean((np.asarray(pred, dtype=np.float64).reshape(-1) - yt) ** 2)))

    rows = []
    # ---- ours
    t0 = time.perf_counter()
    ours = EigenPro2(GaussianKernel(args.sigma), n_nystrom=s, ridge=0.0, epochs=args.epochs, track_residual=False,
                     seed=args.seed, dtype=torch.float32).fit(X, y)
    rows.append(("joker_ext.comparisons.solvers.EigenPro2", time.perf_counter() - t0, rmse(ours.predict(Xt)),
                 f"s={s}, q={ours.top_q_}, batch={ours.batch_size_}, eta={ours.step_:.3g}"))
    print(f"flights n={n}, test {Xt.shape[0]}, Gaussian sigma {args.sigma}, K alpha = y, {args.epochs} epochs, "
          "float32, 1 thread")
    print("| implementation | fit s | test RMSE | set-up |")
    print("|---|---:|---:|---|")
    print("| {} | {:.1f} | {:.3f} | {} |".format(*rows[0]), flush=True)

    # ---- the authors' code, imported from outside the project
    sys.path.insert(0, args.source)
    try:
        from eigenpro2 import KernelModel
        from eigenpro2.kernels import gaussian
    finally:
        sys.path.pop(0)
    torch.manual_seed(args.seed)
    f32 = dict(dtype=torch.float32)
    Xtr = torch.as_tensor(X, **f32)
    model = KernelModel(lambda a, b: gaussian(a, b, args.sigma), Xtr, 1, device="cpu")
    log = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(log):
        # mem_gb only bounds their batch size by device memory: large enough not to bind on a CPU
        model.fit(Xtr, torch.as_tensor(y, **f32).reshape(-1, 1), x_val=torch.as_tensor(Xt, **f32),
                  y_val=torch.as_tensor(yt, **f32).reshape(-1, 1), epochs=args.epochs, mem_gb=64, n_subsamples=s)
    t_ref = time.perf_counter() - t0
    with torch.no_grad():
        ref_pred = model.forward(torch.as_tensor(Xt, **f32)).numpy()
    setup = [line for line in log.getvalue().splitlines() if line.startswith(("SVD time", "n_subsamples"))]
    rows.append(("EigenPro/EigenPro-pytorch eigenpro2.KernelModel", t_ref, rmse(ref_pred), "; ".join(setup)))

    print("| {} | {:.1f} | {:.3f} | {} |".format(*rows[1]))
    print(f"ours vs the authors': {100 * (rows[0][2] - rows[1][2]) / rows[1][2]:+.2f}% test RMSE")


if __name__ == "__main__":
    main()
