"""Random-feature block iterations against the matrix work they must do (issue: core engine, perf).

Prints, for the random-feature mode in float32 with the default block model ('auto': the kernel's
``K_BB`` in the trust-region model and, for the squared loss, Newton steps by CG on ``Phi_B Phi_B^T``
preconditioned with ``K_BB``; see :class:`joker_ext.operators.FeatureOperator`):

1. the time of one DBCD-TR block iteration, broken into the block's preparation (features ``X_B W``
   and cos/sin, ``f_B = Phi_B beta``, the model matrix ``K_BB``), the products inside the step (true
   ``Phi_B (Phi_B^T V)`` and model ``K_BB V``), the update ``beta += Phi_B^T s`` and the rest (Cholesky,
   solver logic), against the same matrix work (including the Cholesky factor and the preconditioner
   solves) replayed on its own in the same process: the "roofline" of this iteration, the work it
   cannot avoid. Target: iteration / work alone <= 1.3;
2. the machine's matrix-multiply rate (GFLOP/s) measured in the same run, and the rate the iteration
   achieves;
3. scaling: time per epoch and peak memory beyond the data as n grows (1e4 .. 1e6) and as M grows.

Iterations are timed from the first block on; the fit's one-off set-up (``setup_ms``: the random
partition of the rows into blocks, ``O(n log b)``) is reported apart and added once to ``epoch_s``.

Run: ``python -m joker_ext.comparisons.benchmarks.iteration`` (``--quick`` for a smaller sweep).
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
    """A FeatureOperator that times its parts and records the products it is asked for."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.reset()

    def reset(self):
        self.widths = []  # columns of each product with the true block matrix Phi_B Phi_B^T
        self.model_widths = []  # columns of each product with the model's matrix (formed, b x b)
        self.t_block = 0.0
        self.t_products = 0.0
        self.t_update = 0.0
        self.blocks = 0
        self.kinds = []
        self.t_first = None  # when the first block started (the fit's one-off set-up excluded)

    def block(self, idx, state):
        t0 = time.perf_counter()
        if self.t_first is None:
            self.t_first = t0
        ops = super().block(idx, state)
        self.t_block += time.perf_counter() - t0
        self.blocks += 1
        true_mv, model_mv = ops.true_matvec, ops.matvec
        self.kinds.append("kernel" if true_mv is not None else "gram" if ops.matrix is not None else "products")

        def timed(fn, widths):
            def mv(V):
                t1 = time.perf_counter()
                out = fn(V)
                self.t_products += time.perf_counter() - t1
                widths.append(V.shape[1])
                return out
            return mv

        if true_mv is not None:
            ops.true_matvec = timed(true_mv, self.widths)
            ops.matvec = timed(model_mv, self.model_widths)
        elif ops.matrix is None:
            ops.matvec = timed(model_mv, self.widths)
        else:
            ops.matvec = timed(model_mv, self.model_widths)
        return ops

    def state_delta(self, ops, s):
        t0 = time.perf_counter()
        out = super().state_delta(ops, s)
        self.t_update += time.perf_counter() - t0
        return out


def matmul_rate(dtype=torch.float32, size=2048, reps=5) -> float:
    A = torch.randn(size, size, dtype=dtype)
    B = torch.randn(size, size, dtype=dtype)
    A @ B
    t0 = time.perf_counter()
    for _ in range(reps):
        A @ B
    dt = (time.perf_counter() - t0) / reps
    return 2 * size**3 / dt / 1e9


def one_setting(n, d, M, b, iters, loss="squared", seed=0, penalty=1e-6, dtype=torch.float32):
    """Run ``iters`` block iterations, then replay alone the matrix work they did; return the timings."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=dtype)
    y = torch.sin(X[:, :1]) + 0.1 * torch.randn(n, 1, generator=g, dtype=dtype)
    kernel = GaussianKernel(math.sqrt(d))
    fmap = make_feature_map(kernel, M, seed=seed)
    op = CountingOperator(fmap, BlockData(X, dtype, torch.device("cpu")))
    lossf = get_loss(loss)
    if lossf.margin:
        y = torch.sign(y)
    c = torch.full((n,), 1.0 / (n * penalty), dtype=dtype)
    opts = SolverOptions(block_size=b, max_iter=iters, tol=0.0, check_every=10**9, seed=seed, final_gap=False)
    # warm-up (allocations, first-touch)
    dbcd_tr(op, y, lossf, c, SolverOptions(block_size=b, max_iter=2, tol=0.0, check_every=10**9, final_gap=False))
    op.reset()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    dbcd_tr(op, y, lossf, c, opts)
    t1 = time.perf_counter()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Per iteration: from the first block on. The fit's one-off set-up (the random partition of the n rows,
    # O(n log b)) is reported apart and amortised over an epoch of ceil(n / b) iterations in epoch_s.
    setup = op.t_first - t0
    per_it = (t1 - op.t_first) / iters
    kernel_model = op.kinds and op.kinds[0] == "kernel"
    # Replay alone the unavoidable matrix work of those iterations: features and f_B = Phi_B beta, the
    # model's block matrix (K_BB, or Phi_B Phi_B^T) and its Cholesky factor, the products the step made
    # (with the true matrix through Phi_B, with the formed model matrix), the preconditioner solves and
    # the update beta += Phi_B^T s.
    Xb = X[:b].contiguous()
    beta = torch.randn(M, 1, dtype=dtype)
    Phi = fmap(Xb)
    H = kernel(Xb, Xb) if kernel_model else Phi @ Phi.T
    H.diagonal().add_(1.0)
    Lc = torch.linalg.cholesky(H)
    t0 = time.perf_counter()
    for _ in range(iters):
        P = fmap(Xb)
        P @ beta
        G = kernel(Xb, Xb) if kernel_model else P @ P.T
        G.diagonal().add_(1.0)
        torch.linalg.cholesky_ex(G)
    t_block = (time.perf_counter() - t0) / iters
    t0 = time.perf_counter()
    for w in op.widths:
        V = torch.randn(b, w, dtype=dtype)
        Phi @ (Phi.T @ V)
        if kernel_model:
            torch.cholesky_solve(V, Lc)
    for w in op.model_widths:
        H @ torch.randn(b, w, dtype=dtype)
    t_prod = (time.perf_counter() - t0) / iters
    s = torch.randn(b, 1, dtype=dtype)
    t0 = time.perf_counter()
    for _ in range(iters):
        beta += Phi.T @ s
    t_upd = (time.perf_counter() - t0) / iters
    ref = t_block + t_prod + t_upd
    model_flops = 2 * b * b * d if kernel_model else 2 * b * b * M
    flops = (2 * b * d * (M // 2) + 2 * b * M + model_flops + b**3 / 3
             + sum(4 * b * M * w + (2 * b * b * w if kernel_model else 0) for w in op.widths) / iters
             + sum(2 * b * b * w for w in op.model_widths) / iters + 2 * b * M)
    return {
        "n": n, "d": d, "M": M, "b": b, "model": op.kinds[0] if op.kinds else "?",
        "iter_ms": 1e3 * per_it,
        "block_ms": 1e3 * op.t_block / iters,
        "step_products_ms": 1e3 * op.t_products / iters,
        "update_ms": 1e3 * op.t_update / iters,
        "other_ms": 1e3 * (per_it - (op.t_block + op.t_products + op.t_update) / iters),
        "work_alone_ms": 1e3 * ref,
        "ratio": per_it / ref,
        "gflops": flops / per_it / 1e9,
        "epoch_s": per_it * math.ceil(n / b) + setup,
        "setup_ms": 1e3 * setup,
        "extra_rss_mb": max(0, rss1 - rss0) / 1024,
        "true_products_per_iter": len(op.widths) / iters,
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
    rows.append(one_setting(20_000, 10, 2000, 512, iters))
    ns = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    for n in ns:
        rows.append(one_setting(n, 10, 2000, 512, iters))
    Ms = [1000, 2000, 5000] if args.quick else [1000, 2000, 5000, 10000, 20000]
    for M in Ms:
        rows.append(one_setting(20_000, 10, M, 512, iters))
    cols = ["n", "M", "b", "model", "iter_ms", "block_ms", "step_products_ms", "update_ms", "other_ms",
            "work_alone_ms", "ratio", "gflops", "setup_ms", "epoch_s", "extra_rss_mb", "true_products_per_iter"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    print(f"\niteration / its own matrix work run alone: worst {max(r['ratio'] for r in rows):.2f}x (target <= 1.3x); "
          f"iteration rate {np.mean([r['gflops'] for r in rows]):.1f} GFLOP/s vs matmul {peak:.1f} GFLOP/s")
    base = [r for r in rows[1:1 + len(ns)]]
    for r in base:
        print(f"n = {r['n']:>8}: epoch {r['epoch_s']:.3g} s, epoch/n = {1e6 * r['epoch_s'] / r['n']:.3g} us per row")


if __name__ == "__main__":
    main()
