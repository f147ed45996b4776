"""Reference row: the authors' ASkotch code beside :class:`joker_ext.comparisons.solvers.ASkotch`, same problem and
budget.

    # a checkout of the authors' repository *outside* this project (never copied in), and pykeops, which their
    # kernels need (it compiles its CPU kernels with the system compiler on first use), both kept out of the
    # project's environment:
    #   https://github.com/pratikrathore8/fast_krr -> /tmp/fast_krr
    pip install --target /tmp/keops_target pykeops==2.3     # then remove the numpy it brings along
    PYTHONPATH=/tmp/keops_target OMP_NUM_THREADS=1 python -m joker_ext.comparisons.benchmarks.askotch_reference \\
        --source /tmp/fast_krr --n-train 20000 --iterations 500

Problem: kernel ridge regression ``(K + lam I) w = y`` on the harness's flights split (targets z-scored, RMSE in
minutes), Gaussian kernel ``exp(-||x - y||^2 / (2 sigma^2))`` (their ``rbf`` with ``sigma`` is the same function),
``lam = n * penalty`` (their ``lambd``, ours ``lam``: CONVENTIONS section 2). Both run ASkotch as the authors'
README recommends: blocks of ``n / 100`` coordinates drawn uniformly, a Nystrom block preconditioner of rank
``--rank`` with the "damped" ``rho``, acceleration with ``mu = lam`` and ``nu = n / block``, the step from the
block's preconditioned top eigenvalue; the same number of iterations from ``w = 0``, float32 (their code's dtype:
its kernel constants are float32), one thread. The authors' ``FullKRR`` / ``ASkotchV2`` are imported from
``--source`` at run time; their random stream (torch's global generator, seeded with ``--seed``) differs from ours.
Prints one markdown row per implementation (fit seconds, test RMSE, set-up) and the gap between them.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import time

import torch

from .eigenpro_reference import _import_from, flights_split, print_gap, print_rows


def _ours(args, X, y, Xt):
    from joker_ext.comparisons.solvers import ASkotch
    from joker_ext.kernels import GaussianKernel

    n = X.shape[0]
    model = ASkotch(GaussianKernel(args.sigma), lam=n * args.penalty, block_size=args.block_size or n // 100,
                    rank=args.rank, max_iter=args.iterations, tol=None, seed=args.seed, dtype=torch.float32)
    t0 = time.perf_counter()
    model.fit(X, y)
    return time.perf_counter() - t0, model.predict(Xt)


def _theirs(args, X, y, Xt, yt):
    FullKRR, = _import_from(args.source, "fast_krr.models", ["FullKRR"])
    ASkotchV2, = _import_from(args.source, "fast_krr.opts", ["ASkotchV2"])
    n = X.shape[0]
    f32 = dict(dtype=torch.float32)
    torch.manual_seed(args.seed)
    log = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(log):
        model = FullKRR(torch.as_tensor(X, **f32), torch.as_tensor(y, **f32), torch.as_tensor(Xt, **f32),
                        torch.as_tensor(yt, **f32), kernel_params={"type": "rbf", "sigma": args.sigma},
                        Ktr_needed=True, lambd=n * args.penalty, task="regression", w0=torch.zeros(n, **f32),
                        device=torch.device("cpu"))
        opt = ASkotchV2(model=model, block_sz=args.block_size or n // 100,
                        precond_params={"type": "nystrom", "r": args.rank, "rho": "damped"})
        for _ in range(args.iterations):
            opt.step()
    seconds = time.perf_counter() - t0
    return seconds, (model.K_tst @ model.w).numpy()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, help="folder of a checkout of the authors' fast_krr repository")
    ap.add_argument("--n-train", type=int, default=20000)
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--penalty", type=float, default=1e-5, help="Falkon's penalty; lam = n * penalty")
    ap.add_argument("--iterations", type=int, default=500)
    ap.add_argument("--block-size", type=int, default=None, help="default n / 100 (the authors' README)")
    ap.add_argument("--rank", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    ds, rmse = flights_split(args.n_train, args.n_test, args.seed)
    yt = ds.y_test
    n = ds.X_train.shape[0]
    b = args.block_size or n // 100
    title = (f"flights n={n}, test {len(yt)}, Gaussian sigma {args.sigma}, (K + lam I) w = y with lam = n * "
             f"{args.penalty:g}, {args.iterations} iterations of blocks of {b}, rank {args.rank}, float32, 1 thread")
    setup = f"block {b}, rank {args.rank}, damped rho, accelerated"
    t, pred = _ours(args, ds.X_train, ds.y_train, ds.X_test)
    rows = [("joker_ext.comparisons.solvers.ASkotch", t, rmse(pred), setup)]
    print_rows(title, rows)
    t, pred = _theirs(args, ds.X_train, ds.y_train, ds.X_test, yt)
    rows.append(("pratikrathore8/fast_krr ASkotchV2", t, rmse(pred), setup))
    print_rows("", rows[1:])
    print_gap(rows[0], rows[1])


if __name__ == "__main__":
    main()
