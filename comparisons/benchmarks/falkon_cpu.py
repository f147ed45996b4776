"""JokerFalkon against Falkon on the CPU, both with their default settings: test error, fit time, peak memory.

Two parts, each fit in its own subprocess (so that its peak memory is its own):

``flights`` (the default)
    nycflights13 arrival delays (``joker_ext.comparisons.datasets.flights``, 25 features), a seeded split with
    ``--n-train`` training points (default 200,000) and 20,000 test points, passed to both libraries as
    float32 tensors (as Falkon users pass them). Gaussian kernel with the median-heuristic bandwidth
    (``--sigma`` to fix it), ``penalty`` 1e-6, ``M`` 5000; ``falkon.Falkon`` with its defaults (20 CG
    iterations, uniform centres, seed 0) and ``JokerFalkon`` with its defaults (seed 0; ``--joker-features``
    / ``--joker-tol`` / ``--joker-maxiter`` add non-default variants). Reported per fit: test RMSE, fit
    wall-clock and CPU seconds, peak resident memory of the fit above the memory in use when it started
    (``VmHWM`` reset through ``/proc/self/clear_refs`` after the data and the libraries are loaded; where
    that is unsupported, ``ru_maxrss`` minus the RSS before the fit, an upper bound), and the Joker /
    Falkon ratios.

    ``--profile`` adds a second, instrumented JokerFalkon run that splits its fit time into the feature
    evaluations (the random-feature map or Nystrom features), the Newton engine's preconditioner sketches,
    and the rest (products with the features, line searches, bookkeeping), and prints one line per Newton
    iteration: cumulative passes over the data, time, relative duality gap and test RMSE (the test
    evaluation is excluded from the times).

``sklearn`` (``--part sklearn``)
    scikit-learn problems of 1,000-5,000 points (``make_regression``, ``make_friedman1``,
    ``make_classification`` fitted as regression on -1/+1 labels, as Falkon users do), z-scored, 2,000 test
    points; Gaussian kernel with the median heuristic; ``M`` in {500, 1000}; penalties 1e-6, 1e-7, 1e-8.
    Falkon with its defaults against JokerFalkon with ``features`` in ``--features`` (default: the default
    and 'cossin'), float64 (``--float32`` for float32): test RMSE or misclassification rate and ratios.
    The same for ``LogisticFalkon`` against ``JokerLogisticFalkon`` on the classification problems, on
    the penalty path of Falkon's logistic example ending at the penalty: ``[1e-3, 1e-5, p, p, p]``,
    ``iter_list = [4, 4, 4, 8, 8]``; for these rows the objective value of both models is also reported
    (LogisticFalkon's ``(1/n) sum log(1 + e^{-y f}) + (penalty / 2) ||f||^2`` on the training data).

Run from the repository root::

    python -m joker_ext.comparisons.benchmarks.falkon_cpu                          # flights, 200k, M = 5000, 1 thread
    python -m joker_ext.comparisons.benchmarks.falkon_cpu --n-train 50000 --profile
    python -m joker_ext.comparisons.benchmarks.falkon_cpu --part sklearn           # a few minutes

``--threads`` (default 1) sets the torch / OpenMP / MKL threads of every worker: both libraries get the
same, and on a shared machine one thread per process gives stable times.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

import numpy as np

from joker_ext.comparisons.benchmarks._process import cpu_seconds, maxrss_mb, reset_peak, status_mb

MODULE = "joker_ext.comparisons.benchmarks.falkon_cpu"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ============================================================================ memory and time
class _Meter:
    """Peak memory above the baseline and wall / CPU time of one fit."""

    def __enter__(self):
        import gc

        gc.collect()
        self.reset = reset_peak()
        self.base = status_mb("VmRSS")
        self.maxrss_before = maxrss_mb()
        self.t0, self.c0 = time.perf_counter(), cpu_seconds()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        self.cpu = cpu_seconds() - self.c0
        peak = status_mb("VmHWM") if self.reset else maxrss_mb()
        self.peak_mb = peak - self.base
        self.upper_bound = (not self.reset) and maxrss_mb() == self.maxrss_before
        return False


# ============================================================================ flights worker
def _flights_worker(a) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    import falkon
    from joker_ext.adapters.falkon import JokerFalkon

    load = lambda k: torch.from_numpy(np.load(os.path.join(a.data, k + ".npy")))  # noqa: E731
    Xtr, ytr, Xts, yts = load("Xtr"), load("ytr").reshape(-1, 1), load("Xts"), load("yts").reshape(-1, 1)
    opt = falkon.FalkonOptions(use_cpu=True, keops_active="no")
    kern = falkon.kernels.GaussianKernel(a.sigma, opt=opt)

    def rmse(p):
        return float(((p.to(torch.float64) - yts.to(torch.float64)) ** 2).mean().sqrt())

    kw = {}
    if a.lib == "falkon":
        model = falkon.Falkon(kern, a.penalty, a.M, seed=0, options=opt)
    else:
        if a.feature is not None:
            kw["features"] = a.feature
        if a.tol is not None:
            kw["tol"] = a.tol
        if a.maxiter is not None:
            kw["maxiter"] = a.maxiter
        model = JokerFalkon(kern, a.penalty, a.M, seed=0, options=opt, **kw)
    out = {"lib": a.lib, "variant": ",".join(f"{k}={v}" for k, v in kw.items()) or "default",
           "n_train": int(Xtr.shape[0]), "M": a.M}
    if a.profile:
        return _profiled_fit(model, Xtr, ytr, Xts, rmse, out)
    with _Meter() as m:
        model.fit(Xtr, ytr)
    out.update(fit_s=m.wall, fit_cpu_s=m.cpu, peak_mb=m.peak_mb, peak_upper_bound=m.upper_bound,
               rmse=rmse(model.predict(Xts)))
    if a.lib == "joker":
        res = model.result_
        out.update(features=model.features_, solver=model.solver_, n_iter=int(model.n_iter_), status=model.status_,
                   rel_gap=float(model.relative_gap_),
                   passes=int(res.history[-1].get("passes", -1)) if res.history else -1)
    return out


def _profiled_fit(model, Xtr, ytr, Xts, rmse, out) -> dict:
    """Fit with timers around the feature Newton engine's pieces (read from ``joker_ext.primal_newton``,
    patched for this process only): its passes over the data (``_Passes.gradient`` and
    ``_Passes.hessian_product``) and, inside them, the feature evaluation (``_Basis.raw``); the
    preconditioner sketch (``NystromPreconditioner.sketch``, its own feature rows included); the test
    evaluation after every Newton iteration is timed apart and subtracted."""
    import contextlib
    import io

    import torch

    from joker_ext import primal_newton as pn

    t = {"passes": 0.0, "features": 0.0, "sketch": 0.0, "sketch_features": 0.0, "eval": 0.0}
    where = ["fit"]
    eval_before = {}  # Newton iteration -> evaluation seconds spent before it (subtracted from its time)
    cls = type(model)
    patched = []

    def patch(owner, name, wrapper):
        orig = owner.__dict__[name]
        patched.append((owner, name, orig))
        setattr(owner, name, wrapper(orig))

    def timed(key, inside=None):
        def wrapper(orig):
            func = orig.__func__ if isinstance(orig, classmethod) else orig

            def run(*args, **kw):
                t0, prev = time.perf_counter(), where[0]
                if inside is not None:
                    where[0] = inside
                try:
                    return func(*args, **kw)
                finally:
                    where[0] = prev
                    k = key if not (key == "features" and prev == "sketch") else "sketch_features"
                    t[k] += time.perf_counter() - t0

            return classmethod(run) if isinstance(orig, classmethod) else run

        return wrapper

    patch(pn._Passes, "gradient", timed("passes"))
    patch(pn._Passes, "hessian_product", timed("passes"))
    patch(pn._Basis, "raw", timed("features"))
    patch(pn.NystromPreconditioner, "sketch", timed("sketch", inside="sketch"))

    def reporter(orig):
        def make(self, *args, **kw):
            cb = orig(self, *args, **kw)

            def timed_cb(info):
                eval_before[info["iteration"]] = t["eval"]
                t0 = time.perf_counter()
                try:
                    return cb(info)
                finally:
                    t["eval"] += time.perf_counter() - t0

            return timed_cb

        return make

    orig_reporter = cls._reporter
    cls._reporter = reporter(orig_reporter)
    model.set_params(error_fn=lambda y, p: rmse(p), error_every=1)
    try:
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            model.fit(Xtr, ytr, Xts, torch.zeros(Xts.shape[0], 1, dtype=Xts.dtype))
        wall = time.perf_counter() - t0
    finally:
        cls._reporter = orig_reporter
        for owner, name, orig in reversed(patched):
            setattr(owner, name, orig)
    hist = model.result_.history
    errs = list(model.val_errors_)
    trace = [{"iteration": h["iteration"], "time": h["time"] - eval_before.get(h["iteration"], t["eval"]),
              "passes": h.get("passes"), "rel_gap": h["rel_gap"], "rmse": errs[k] if k < len(errs) else None}
             for k, h in enumerate(hist)]
    out.update(profile=True, fit_s=wall - t["eval"], passes_s=t["passes"], features_s=t["features"],
               sketch_s=t["sketch"], sketch_features_s=t["sketch_features"], eval_s=t["eval"],
               n_iter=int(model.n_iter_), status=model.status_, rel_gap=float(model.relative_gap_),
               features=model.features_, trace=trace, rmse=rmse(model.predict(Xts)))
    return out


# ============================================================================ sklearn worker
def _sk_problem(kind: str, n: int, seed: int):
    from sklearn import datasets

    nt = n + 2000
    if kind == "regression":
        X, y = datasets.make_regression(nt, 20, n_informative=10, noise=10.0, random_state=seed)
    elif kind == "friedman1":
        X, y = datasets.make_friedman1(nt, 10, noise=1.0, random_state=seed)
    elif kind == "classification":
        X, y = datasets.make_classification(nt, 20, n_informative=10, random_state=seed)
        y = 2.0 * y - 1.0
    else:
        raise ValueError(f"unknown problem {kind!r}")
    mu, sd = X[:n].mean(0), X[:n].std(0)
    X = (X - mu) / sd
    return X[:n], y[:n].astype(np.float64), X[n:], y[n:].astype(np.float64)


def _sk_error(kind: str, pred, y) -> float:
    pred = np.asarray(pred, dtype=np.float64).ravel()
    if kind == "classification":
        return float(np.mean(np.where(pred > 0, 1.0, -1.0) != y) * 100)
    return float(np.sqrt(np.mean((pred - y) ** 2)))


def _logistic_objective(model, kern, X, Y, pen: float) -> float:
    """LogisticFalkon's objective ``(1/n) sum log(1 + e^{-y f}) + (pen / 2) ||f||^2`` of a fitted model on
    its training data (``||f||^2 = a^T K_ZZ a`` on centres, ``||beta||^2`` on random features)."""
    import torch

    f = model.predict(X).to(torch.float64)
    a = model.alpha_.to(torch.float64)
    Z = getattr(model, "ny_points_", None)
    if Z is not None:
        norm2 = float((a * (kern(Z, Z).to(torch.float64) @ a)).sum())
    else:
        norm2 = float((a * a).sum())
    return float(torch.nn.functional.softplus(-Y.to(torch.float64) * f).mean()) + 0.5 * pen * norm2


def _sklearn_worker(a) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    import falkon

    from joker_ext.adapters.falkon import JokerFalkon, JokerLogisticFalkon
    from joker_ext.kernels import median_heuristic

    dt = torch.float32 if a.float32 else torch.float64
    opt = falkon.FalkonOptions(use_cpu=True, keops_active="no")
    Xtr, ytr, Xts, yts = _sk_problem(a.problem, a.n, a.seed)
    sigma = float(median_heuristic(Xtr))
    X, Y, Xt = (torch.as_tensor(v, dtype=dt) for v in (Xtr, ytr.reshape(-1, 1), Xts))
    kern = falkon.kernels.GaussianKernel(sigma, opt=opt)
    rows = []
    for M in a.M_list:
        for pen in a.penalties:
            t = time.perf_counter()
            f = falkon.Falkon(kern, pen, M, seed=0, options=opt).fit(X, Y)
            row = {"problem": a.problem, "n": a.n, "M": M, "penalty": pen, "sigma": sigma, "model": "Falkon",
                   "falkon": _sk_error(a.problem, f.predict(Xt).numpy(), yts), "falkon_s": time.perf_counter() - t}
            for feats in a.features_list:
                kw = {} if feats == "default" else {"features": feats}
                t = time.perf_counter()
                j = JokerFalkon(kern, pen, M, seed=0, options=opt, **kw).fit(X, Y)
                row[feats] = _sk_error(a.problem, j.predict(Xt).numpy(), yts)
                row[feats + "_s"] = time.perf_counter() - t
                row[feats + "_features"] = j.features_
                row[feats + "_gap"] = float(j.relative_gap_)
            rows.append(row)
            if a.problem == "classification":
                # the path of Falkon's logistic example (falkon/doc/examples/logistic_falkon.ipynb), ending at pen
                pl, il = [1e-3, 1e-5, pen, pen, pen], [4, 4, 4, 8, 8]
                t = time.perf_counter()
                lf = falkon.LogisticFalkon(kern, pl, il, falkon.gsc_losses.LogisticLoss(kern), M, seed=0,
                                           options=opt).fit(X, Y)
                row = {"problem": a.problem, "n": a.n, "M": M, "penalty": pen, "sigma": sigma,
                       "model": "LogisticFalkon", "falkon": _sk_error(a.problem, lf.predict(Xt).numpy(), yts),
                       "falkon_s": time.perf_counter() - t,
                       "falkon_objective": _logistic_objective(lf, kern, X, Y, pen)}
                for feats in a.features_list:
                    kw = {} if feats == "default" else {"features": feats}
                    t = time.perf_counter()
                    j = JokerLogisticFalkon(kern, pl, il, falkon.gsc_losses.LogisticLoss(kern), M, seed=0,
                                            options=opt, **kw).fit(X, Y)
                    row[feats] = _sk_error(a.problem, j.predict(Xt).numpy(), yts)
                    row[feats + "_s"] = time.perf_counter() - t
                    row[feats + "_features"] = j.features_
                    row[feats + "_gap"] = float(j.relative_gap_)
                    row[feats + "_objective"] = _logistic_objective(j, kern, X, Y, pen)
                rows.append(row)
    return {"rows": rows}


# ============================================================================ driver
def _run(args: List[str], threads: int, timeout: Optional[float] = None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-m", MODULE] + args + ["--threads", str(threads)], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=timeout)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"worker {' '.join(args[:4])} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


def _flights(a) -> list:
    from joker_ext.comparisons.datasets import flights
    from joker_ext.kernels import median_heuristic

    ds = flights("regression", n_train=a.n_train, n_test=a.n_test, seed=a.seed)
    sigma = a.sigma if a.sigma is not None else float(median_heuristic(ds.X_train))
    results = []
    with tempfile.TemporaryDirectory(prefix="falkon_cpu_") as folder:
        for k, v in (("Xtr", ds.X_train), ("ytr", ds.y_train), ("Xts", ds.X_test), ("yts", ds.y_test)):
            np.save(os.path.join(folder, k + ".npy"), np.ascontiguousarray(v, dtype=np.float32))
        print(f"flights regression: n_train={ds.X_train.shape[0]}, n_test={ds.X_test.shape[0]}, "
              f"d={ds.X_train.shape[1]}, float32 data; Gaussian sigma={sigma:.4g}"
              f"{' (median heuristic)' if a.sigma is None else ''}, penalty={a.penalty:g}, M={a.M}; "
              f"{a.threads} thread(s) per process, each fit in its own process", flush=True)
        common = ["--worker", "flights", "--data", folder, "--sigma", repr(sigma), "--penalty", repr(a.penalty),
                  "--M", str(a.M)]
        if a.profile_only:
            f = None
            variants = []
        else:
            f = _run(common + ["--lib", "falkon"], a.threads)
            results.append(f)
            variants = [[]]
        variants += [["--feature", v] for v in a.joker_features]
        variants += [["--tol", repr(v)] for v in a.joker_tol]
        variants += [["--maxiter", str(v)] for v in a.joker_maxiter]
        for v in a.joker_variant:  # e.g. features=nystrom,maxiter=1
            args = []
            for item in v.split(","):
                key, _, val = item.partition("=")
                if key not in ("features", "tol", "maxiter") or not val:
                    raise SystemExit(f"--joker-variant: expected features=..., tol=..., maxiter=..., got {item!r}")
                args += ["--feature" if key == "features" else f"--{key}", val]
            variants.append(args)
        head = (f"{'model':<34} {'RMSE':>8} {'ratio':>6} | {'fit s':>7} {'ratio':>6} {'cpu s':>7} | {'peak MB':>8} "
                f"{'ratio':>6} | details")
        if f is not None:
            print(head)
            print("-" * len(head))
            print(f"{'Falkon (defaults)':<34} {f['rmse']:>8.4f} {'':>6} | {f['fit_s']:>7.1f} {'':>6} "
                  f"{f['fit_cpu_s']:>7.1f} | "
                  f"{f['peak_mb']:>8.0f} {'':>6} | maxiter 20", flush=True)
        for v in variants:
            j = _run(common + ["--lib", "joker"] + v, a.threads)
            results.append(j)
            name = "JokerFalkon (" + (j["variant"]) + ")"
            print(f"{name:<34} {j['rmse']:>8.4f} {j['rmse'] / f['rmse']:>6.3f} | {j['fit_s']:>7.1f} "
                  f"{j['fit_s'] / f['fit_s']:>6.2f} {j['fit_cpu_s']:>7.1f} | {j['peak_mb']:>8.0f} "
                  f"{j['peak_mb'] / max(f['peak_mb'], 1e-9):>6.2f} | {j['features']}, {j['solver']}, "
                  f"{j['n_iter']} it, {j['passes']} passes, {j['status']}, rel gap {j['rel_gap']:.1e}", flush=True)
        if a.profile or a.profile_only:
            p = _run(common + ["--lib", "joker", "--profile"], a.threads)
            results.append(p)
            rest = p["fit_s"] - p["passes_s"] - p["sketch_s"]
            print(f"\nJokerFalkon (default, {p['features']} features) profiled, test evaluation excluded: fit "
                  f"{p['fit_s']:.1f} s = passes over the data {p['passes_s']:.1f} s (of which feature evaluation "
                  f"{p['features_s']:.1f} s, products with the features {p['passes_s'] - p['features_s']:.1f} s) + "
                  f"preconditioner sketches {p['sketch_s']:.1f} s (of which features of the sketched rows "
                  f"{p['sketch_features_s']:.1f} s) + rest {rest:.1f} s (set-up, CG vector work, line searches); "
                  f"{p['n_iter']} Newton iterations, {p['status']}, rel gap {p['rel_gap']:.1e}")
            for t in p["trace"]:
                r = "" if t["rmse"] is None else f", test RMSE {t['rmse']:.4f}"
                print(f"  Newton iteration {t['iteration']:>2}: {t['passes']:>3} passes, {t['time']:>7.1f} s, "
                      f"rel gap {t['rel_gap']:.2e}{r}")
    print("\nratio = Joker / Falkon. 'fit s': wall-clock seconds of fit; 'cpu s': the process's CPU seconds during "
          "fit; 'peak MB': the fit's peak resident memory above the memory in use when it started.")
    return results


def _sklearn(a) -> list:
    rows = []
    for problem in ("regression", "friedman1", "classification"):
        for n in a.sk_n:
            args = ["--worker", "sklearn", "--problem", problem, "--n", str(n), "--M-list", *map(str, a.sk_M),
                    "--penalties", *map(repr, a.sk_penalties), "--features-list", *a.features]
            if a.float32:
                args.append("--float32")
            rows += _run(args, a.threads)["rows"]
    head = f"{'problem':<15} {'model':<15} {'n':>5} {'M':>5} {'penalty':>8} | {'Falkon':>8} | " + " | ".join(
        f"{f:>22}" for f in a.features)
    print(f"scikit-learn problems, Gaussian kernel (median heuristic), {'float32' if a.float32 else 'float64'}, "
          f"{a.threads} thread(s); error = test RMSE (regression) or misclassification % (classification); "
          "each Joker column: error (ratio to Falkon's)")
    print(head)
    print("-" * len(head))
    for r in rows:
        cells = [f"{r[f]:>9.3f} ({r[f] / max(r['falkon'], 1e-12):5.3f})" for f in a.features]
        obj = ""
        if "falkon_objective" in r:
            obj = "   objective: Falkon " + f"{r['falkon_objective']:.4g}, " + ", ".join(
                f"{f} {r[f + '_objective']:.4g}" for f in a.features)
        print(f"{r['problem']:<15} {r['model']:<15} {r['n']:>5} {r['M']:>5} {r['penalty']:>8.0e} | "
              f"{r['falkon']:>8.3f} | " + " | ".join(f"{c:>22}" for c in cells) + obj, flush=True)
    for f in a.features:
        ratios = [r[f] / max(r["falkon"], 1e-12) for r in rows]
        print(f"{f}: worst ratio {max(ratios):.3f}, mean {np.mean(ratios):.3f}, losses by more than 2 %: "
              f"{sum(x > 1.02 for x in ratios)} of {len(ratios)}")
    return rows


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=["flights", "sklearn"], default="flights")
    p.add_argument("--n-train", type=int, default=200_000)
    p.add_argument("--n-test", type=int, default=20_000)
    p.add_argument("--M", type=int, default=5000)
    p.add_argument("--penalty", type=float, default=1e-6)
    p.add_argument("--sigma", type=float, default=None, help="Gaussian bandwidth (default: median heuristic)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--joker-features", nargs="*", default=[], help="extra JokerFalkon runs with these features")
    p.add_argument("--joker-tol", type=float, nargs="*", default=[], help="extra JokerFalkon runs with these tol")
    p.add_argument("--joker-maxiter", type=int, nargs="*", default=[], help="extra runs with these maxiter")
    p.add_argument("--joker-variant", nargs="*", default=[],
                   help="extra runs with several settings, e.g. features=nystrom,maxiter=1")
    p.add_argument("--profile", action="store_true", help="also an instrumented JokerFalkon run (time split)")
    p.add_argument("--profile-only", action="store_true", help="only the instrumented JokerFalkon run")
    p.add_argument("--sk-n", type=int, nargs="+", default=[1000, 2000, 5000])
    p.add_argument("--sk-M", type=int, nargs="+", default=[500, 1000])
    p.add_argument("--sk-penalties", type=float, nargs="+", default=[1e-6, 1e-7, 1e-8])
    p.add_argument("--features", nargs="+", default=["default", "cossin"],
                   help="JokerFalkon features compared on the sklearn part ('default' = not given)")
    p.add_argument("--float32", action="store_true")
    p.add_argument("--json", type=str, default=None, help="also write the results to this file")
    # worker mode (internal)
    p.add_argument("--worker", choices=["flights", "sklearn"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--lib", choices=["falkon", "joker"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    p.add_argument("--feature", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tol", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--maxiter", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--problem", default=None, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--M-list", type=int, nargs="+", default=None, help=argparse.SUPPRESS)
    p.add_argument("--penalties", type=float, nargs="+", default=None, help=argparse.SUPPRESS)
    p.add_argument("--features-list", nargs="+", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker == "flights":
        print("RESULT " + json.dumps(_flights_worker(a)), flush=True)
        return
    if a.worker == "sklearn":
        print("RESULT " + json.dumps(_sklearn_worker(a)), flush=True)
        return
    results = _flights(a) if a.part == "flights" else _sklearn(a)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"args": vars(a), "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
