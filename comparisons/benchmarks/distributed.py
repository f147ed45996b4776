"""Data parallelism on this machine: time per pass and bytes all-reduced per pass, 1 and 2 processes.

::

    python -m joker_ext.comparisons.benchmarks.distributed --n-train 50000 --M 2000

fits flights (JokerFalkon, random features, squared loss, the feature Newton engine) three ways, one after
the other, each process with one thread: in one process without a process group, and as 1 and 2 Gloo
processes on loopback (:func:`joker_ext.distributed.run_local_group`, rows split with
:func:`joker_ext.distributed.shard_rows`). It prints, for each, the fit time, the passes over the data, the
time per pass, the bytes each rank handed to ``all_reduce``/``broadcast`` per pass (measured by
:class:`joker_ext.distributed.RowShards`; a ring all-reduce sends ``2 (p - 1) / p`` times that), the test
RMSE, and the ratios to the one-process fit.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _worker(a) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    distributed = a.processes > 0
    if distributed:
        torch.distributed.init_process_group("gloo")
    from joker_ext import JokerFalkon
    from joker_ext.distributed import shard_rows
    from joker_ext.kernels import make_kernel

    folder = Path(a.data)
    Xtr, ytr = (np.load(folder / f"{k}.npy", mmap_mode="r") for k in ("Xtr", "ytr"))
    mine = shard_rows(Xtr.shape[0]) if distributed else slice(0, Xtr.shape[0])
    X, y = torch.from_numpy(np.array(Xtr[mine])), torch.from_numpy(np.array(ytr[mine]))
    model = JokerFalkon(make_kernel("gaussian", a.sigma), a.penalty, a.M, seed=0, features="cossin",
                        distributed=distributed)
    t0 = time.perf_counter()
    model.fit(X, y)
    fit_s = time.perf_counter() - t0
    Xts, yts = np.load(folder / "Xts.npy"), np.load(folder / "yts.npy")
    rmse = float(((model.predict(torch.from_numpy(Xts)).reshape(-1).numpy() - yts) ** 2).mean() ** 0.5)
    rank = torch.distributed.get_rank() if distributed else 0
    if rank == 0:
        passes = int(model.result_.history[-1].get("passes", 0)) or 1
        row = {"processes": max(1, a.processes), "group": distributed, "rows_rank0": int(X.shape[0]),
               "fit_s": fit_s, "passes": passes, "s_per_pass": fit_s / passes,
               "bytes_per_pass": model.model_.extra["bytes_reduced"] / passes, "rmse": rmse,
               "status": model.status_, "rel_gap": float(model.relative_gap_)}
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    if distributed:
        torch.distributed.destroy_process_group()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-train", type=int, default=50_000)
    p.add_argument("--n-test", type=int, default=20_000)
    p.add_argument("--M", type=int, default=2000)
    p.add_argument("--sigma", type=float, default=3.0)
    p.add_argument("--penalty", type=float, default=1e-6)
    p.add_argument("--timeout", type=float, default=1200)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--processes", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return _worker(a)
    from joker_ext.comparisons.examples.distributed_flights import prepare
    from joker_ext.distributed import run_local_group

    tmp = Path(tempfile.mkdtemp(prefix="joker_dist_bench_"))
    prepare(tmp, a.n_train, a.n_test, seed=0)
    out = tmp / "rows.jsonl"
    common = ["-m", "joker_ext.comparisons.benchmarks.distributed", "--worker", "--data", str(tmp), "--out", str(out),
              "--M", str(a.M), "--sigma", str(a.sigma), "--penalty", str(a.penalty)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for procs in (0, 1, 2):  # 0: one process, no process group
        codes = run_local_group(common + ["--processes", str(procs)], max(1, procs), timeout=a.timeout, env=env)
        if any(codes):
            sys.exit(f"the run with {procs} process(es) failed: exit codes {codes}")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    base = rows[0]
    print(f"flights, {a.n_train} training rows, {a.n_test} test rows, Gaussian sigma {a.sigma}, penalty {a.penalty}, "
          f"M = {a.M} random features, squared loss, 1 thread per process")
    print(f"{'setup':<22}{'rows/rank':>10}{'fit s':>9}{'passes':>8}{'s/pass':>9}{'pass x':>8}{'kB/pass':>10}"
          f"{'ring kB':>9}{'RMSE':>10}{'gap':>9}")
    for r in rows:
        name = "1 process, no group" if not r["group"] else f"{r['processes']} Gloo process(es)"
        ring = 2 * (r["processes"] - 1) / r["processes"] * r["bytes_per_pass"]
        print(f"{name:<22}{r['rows_rank0']:>10}{r['fit_s']:>9.2f}{r['passes']:>8}{r['s_per_pass']:>9.3f}"
              f"{base['s_per_pass'] / r['s_per_pass']:>8.2f}{r['bytes_per_pass'] / 1e3:>10.1f}{ring / 1e3:>9.1f}"
              f"{r['rmse']:>10.4f}{r['rel_gap']:>9.1e}")
    print(f"(pass x: speed-up of the time per pass over the one-process fit; kB/pass: bytes each rank handed to "
          f"all_reduce/broadcast per pass, of which {8 * a.M / 1e3:.1f} kB is the pass's own M-vector and the rest "
          f"the preconditioner sketch's M x r matrix; ring kB: what a ring all-reduce sends per rank)")


if __name__ == "__main__":
    main()
