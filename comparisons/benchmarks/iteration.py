"""Random-feature block iterations against the matrix products they must do (issue: core engine, perf).

Prints, for the random-feature mode in float32:

1. the time of one DBCD-TR block iteration, broken into features (``X_B W`` and cos/sin), the
   products with the block's feature matrix inside the trust-region step (``Phi_B (Phi_B^T V)``: Cauchy
   candidates, CG, projected search), and the update ``beta += Phi_B^T s``, against the time of exactly
   those matrix products run on their own in the same process (the "roofline" of this iteration: the
   work it cannot avoid). Target: iteration / products <= 1.3;
2. the machine's matrix-multiply rate (GFLOP/s) measured in the same run, and the rate the iteration
   achieves;
3. scaling: time per epoch and peak memory beyond the data as n grows (1e4 .. 1e6) and as M grows.

Run: ``python -m comparisons.benchmarks.iteration`` (``--quick`` for a smaller sweep).
"""
from __future__ import annotations

import argparse
import math
import resource
import time

import numpy as np
import torch

from joker_ext.data import BlockData
from joker_ext.features import make_feature_map
from joker_ext.kernels import GaussianKernel
from joker_ext.losses import get_loss
from joker_ext.operators import BlockOps, FeatureOperator
from joker_ext.solver import SolverOptions, dbcd_tr


class CountingOperator(FeatureOperator):
    """A FeatureOperator that records the widths of the products it is asked for and their time."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.reset()

    def reset(self):
        self.widths = []
        self.t_features = 0.0
        self.t_products = 0.0
        self.t_update = 0.0
        self.blocks = 0

    def block(self, idx, state):
        t0 = time.perf_counter()
        Phi = self.feature_map(self.data.take(idx))
        fB = Phi @ state["beta"]
        self.t_features += time.perf_counter() - t0
        self.blocks += 1

        def matvec(V):
            t1 = time.perf_counter()
            out = Phi @ (Phi.T @ V)
            self.t_products += time.perf_counter() - t1
            self.widths.append(V.shape[1])
            return out

        return BlockOps(fB, matvec, payload=Phi)

    def update(self, state, idx, ops, s):
        t0 = time.perf_counter()
        super().update(state, idx, ops, s)
        self.t_update += time.perf_counter() - t0


def matmul_rate(dtype=torch.float32, size=2048, reps=5) -> float:
    A = torch.randn(size, size, dtype=dtype)
    B = torch.randn(size, size, dtype=dtype)
    A @ B
    t0 = time.perf_counter()
    for _ in range(reps):
        A @ B
    dt = (time.perf_counter() - t0) / reps
    return 2 * size**3 / dt / 1e9


def one_setting(n, d, M, b, iters, loss="squared", seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float32)
    y = torch.sin(X[:, :1]) + 0.1 * torch.randn(n, 1, generator=g)
    kernel = GaussianKernel(math.sqrt(d))
    fmap = make_feature_map(kernel, M, seed=seed)
    op = CountingOperator(fmap, BlockData(X, torch.float32, torch.device("cpu")))
    lossf = get_loss(loss)
    if lossf.margin:
        y = torch.sign(y)
    c = torch.full((n,), 1.0 / (n * 1e-6))
    opts = SolverOptions(block_size=b, max_iter=iters, tol=0.0, check_every=10**9, seed=seed, final_gap=False)
    # warm-up (allocations, first-touch)
    dbcd_tr(op, y, lossf, c, SolverOptions(block_size=b, max_iter=2, tol=0.0, check_every=10**9, final_gap=False))
    op.reset()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    dbcd_tr(op, y, lossf, c, opts)
    total = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    per_it = total / iters
    # Replay exactly the products the iteration did, alone.
    Xb = X[:b]
    W = torch.randn(d, M // 2, dtype=torch.float32)
    beta = torch.randn(M, 1)
    Phi = torch.randn(b, M, dtype=torch.float32)
    t0 = time.perf_counter()
    for _ in range(iters):
        Z = Xb @ W
        torch.cos(Z)
        torch.sin(Z)
        Phi @ beta
    t_feat = (time.perf_counter() - t0) / iters
    t0 = time.perf_counter()
    for w in op.widths:
        V = torch.empty(b, w)
        Phi @ (Phi.T @ V)
    t_prod = (time.perf_counter() - t0) / iters
    s = torch.randn(b, 1)
    t0 = time.perf_counter()
    for _ in range(iters):
        beta += Phi.T @ s
    t_upd = (time.perf_counter() - t0) / iters
    ref = t_feat + t_prod + t_upd
    flops = (2 * b * d * (M // 2) + 2 * b * M + sum(4 * b * M * w for w in op.widths) / iters + 2 * b * M)
    return {
        "n": n, "d": d, "M": M, "b": b,
        "iter_ms": 1e3 * per_it,
        "features_ms": 1e3 * op.t_features / iters,
        "tr_products_ms": 1e3 * op.t_products / iters,
        "update_ms": 1e3 * op.t_update / iters,
        "other_ms": 1e3 * (per_it - (op.t_features + op.t_products + op.t_update) / iters),
        "products_alone_ms": 1e3 * ref,
        "ratio": per_it / ref,
        "gflops": flops / per_it / 1e9,
        "epoch_s": per_it * math.ceil(n / b),
        "extra_rss_mb": max(0, rss1 - rss0) / 1024,
        "cols_per_iter": sum(op.widths) / iters,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sweep (about a minute)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    peak = matmul_rate()
    print(f"machine: {torch.get_num_threads()} threads, float32 matmul {peak:.1f} GFLOP/s (2048^3)")
    iters = 10 if args.quick else 30
    rows = []
    rows.append(one_setting(20_000, 10, 2000, 2048, iters))
    ns = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    for n in ns:
        rows.append(one_setting(n, 10, 2000, 2048, iters))
    Ms = [1000, 2000, 5000] if args.quick else [1000, 2000, 5000, 10000]
    for M in Ms:
        rows.append(one_setting(20_000, 10, M, 2048, iters))
    cols = ["n", "M", "b", "iter_ms", "features_ms", "tr_products_ms", "update_ms", "other_ms",
            "products_alone_ms", "ratio", "gflops", "epoch_s", "extra_rss_mb", "cols_per_iter"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    print(f"\niteration / its own matrix products: worst {max(r['ratio'] for r in rows):.2f}x (target <= 1.3x); "
          f"iteration rate {np.mean([r['gflops'] for r in rows]):.1f} GFLOP/s vs matmul {peak:.1f} GFLOP/s")
    base = [r for r in rows[1:1 + len(ns)]]
    for r in base:
        print(f"n = {r['n']:>8}: epoch {r['epoch_s']:.3g} s, epoch/n = {1e6 * r['epoch_s'] / r['n']:.3g} us per row")


if __name__ == "__main__":
    main()
