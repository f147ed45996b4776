"""ASkotch's time per iteration on a device (issue #16: time in proportion to the work the paper states).

On #16's spec (the harness's flights split, 20,000 training rows, Gaussian kernel sigma 1, Falkon penalty 1e-5,
so ``lam = n * 1e-5``; ASkotch's defaults: blocks of ``n / 100`` rows, rank 100, 10 power iterations), runs
``--iters`` iterations with no residual checks (``tol=None``) after a warm-up, twice, and prints per run the
milliseconds per iteration, the test RMSE and the floating-point work of an iteration as the paper counts it
(the ``|b| x n`` kernel product, the ``|b| x |b|`` block and its rank-``r`` sketch, the power iterations) with the
rate it achieves. ``--profile`` adds torch.profiler's tables (self device time and self CPU time) for the
iterations of one more run; ``--count-ops`` counts the tensor operations of an iteration (each one kernel launch or
more on a GPU, so the launch count can be followed on a CPU too) and lists the most frequent.

Run (H100 numbers: ``comparisons/benchmarks/results/falkon_gpu_h100_s18.md``)::

    python -m joker_ext.comparisons.benchmarks.askotch_device --device cuda --iters 400 --profile
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np
import torch

from joker_ext.kernels import GaussianKernel

from ..solvers.askotch import ASkotch
from .eigenpro_reference import flights_split


def iteration_flops(n: int, d: int, block: int, rank: int, power_iters: int = 10) -> float:
    """Floating-point work of one ASkotch iteration: the block's kernel product with all ``n`` points
    (``2 |b| n d`` for the distances, ``2 |b| n`` for the product), the block kernel (``2 |b|^2 d``), its sketch
    ``K_bb Omega`` (``2 |b|^2 r``) and factor (``O(|b| r^2)``), and ``power_iters`` products with the block
    (``2 |b|^2`` each, plus ``8 |b| r`` for the two preconditioner applications)."""
    b, r = block, rank
    return (2.0 * b * n * (d + 1) + 2.0 * b * b * d + 2.0 * b * b * r + 6.0 * b * r * r
            + power_iters * (2.0 * b * b + 8.0 * b * r))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(X, y, lam: float, device: torch.device, iters: int) -> tuple:
    """``(seconds, model)`` of ``iters`` ASkotch iterations with the data already on ``device``."""
    model = ASkotch(GaussianKernel(1.0), lam, max_iter=iters, tol=None, device=device)
    _sync(device)
    t = time.perf_counter()
    model.fit(X, y)
    _sync(device)
    return time.perf_counter() - t, model


def count_ops(X, y, lam: float, device: torch.device, iters: int = 20) -> Counter:
    """Tensor operations per iteration of ASkotch, by ATen operator (``__torch_dispatch__`` sees each one)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    with _Count() as counter:
        run(X, y, lam, device, iters)
    return Counter({k: v / iters for k, v in counter.seen.items()})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n-train", type=int, default=20_000)
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--count-ops", action="store_true")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    ds, rmse = flights_split(a.n_train, 2000, seed=0)
    X = torch.as_tensor(ds.X_train, dtype=torch.float64, device=device)
    y = torch.as_tensor(ds.y_train, dtype=torch.float64, device=device)
    Xt = torch.as_tensor(ds.X_test, dtype=torch.float64, device=device)
    lam = a.n_train * 1e-5
    run(X, y, lam, device, min(30, a.iters))  # warm-up
    for _ in range(2):
        seconds, model = run(X, y, lam, device, a.iters)
        per = seconds / model.n_iter_
        flops = iteration_flops(X.shape[0], X.shape[1], model.block_size_, model.rank_, model.power_iters)
        pred = model.predict(Xt).reshape(-1).cpu().numpy()
        print(f"{device.type}: {1e3 * per:.2f} ms per iteration ({model.n_iter_} iterations, blocks of "
              f"{model.block_size_}, rank {model.rank_}); {flops / 1e9:.3f} GFLOP per iteration, "
              f"{flops / per / 1e9:.1f} GFLOP/s; test RMSE {rmse(np.asarray(pred)):.4f}", flush=True)
    if a.count_ops:
        ops = count_ops(X, y, lam, device)
        print(f"{sum(ops.values()):.1f} tensor operations per iteration; most frequent: "
              + ", ".join(f"{k} {v:.1f}" for k, v in ops.most_common(8)), flush=True)
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            run(X, y, lam, device, min(100, a.iters))
        table = prof.key_averages()
        if device.type == "cuda":
            print(table.table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=40))
        print(table.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=40))


if __name__ == "__main__":
    main()
