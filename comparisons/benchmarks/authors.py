"""Part 6 of the performance suite: the Joker authors' public code beside joker_ext, same settings.

The authors' code (github.com/Apple-Zhang/Joker-paper, ``src/``) is *run*, never copied: it must be
unpacked locally (``git archive`` of the public repository) into ``$JOKER_AUTHORS_SRC`` (default
``/work/joker_authors/src``) and is imported from there in a separate process.

Identical settings on both sides: the same synthetic regression data (n, d), squared loss with the
same ``C`` (their ``MeanSquareError(c)``: dual ``a^2/(2c) - a y``, primal ``c (y - f)^2 / 2``, the same
as joker_ext's ``squared`` loss with ``c_i = C``), random Fourier features of the same Gaussian kernel
in the ``cos(W^T x + b)`` form (their ``rff``; joker_ext ``form='cos'``), the same number of features
``M``, block size ``b`` (their ``opt_blksz``), the same number of block iterations, float32, CPU.
Each side runs in its own subprocess (one torch thread by default). Printed: time per block
iteration, the ratio authors / joker_ext, the relative duality gap and the test RMSE each reached.

Run alone: ``python -m joker_ext.comparisons.benchmarks.authors [--quick]``.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import resource
import subprocess
import sys
import time

AUTHORS_SRC = os.environ.get("JOKER_AUTHORS_SRC", "/work/joker_authors/src")


def _data(n, n_test, d, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n + n_test, d, generator=g, dtype=torch.float32)
    w = torch.randn(d, 1, generator=g, dtype=torch.float32) / math.sqrt(d)
    y = torch.sin(2 * X @ w) + 0.5 * torch.cos(X[:, :1]) + 0.1 * torch.randn(n + n_test, 1, generator=g)
    return X[:n], y[:n], X[n:], y[n:]


def _gap_features(Phi_fn, X, y, alpha, beta, C, chunk=8192):
    """Relative duality gap of the random-feature squared-loss problem, evaluated independently.

    P = 1/2 ||beta||^2 + C/2 sum (y - phi^T beta)^2 with beta = Phi^T alpha,
    D = 1/2 ||beta||^2 + sum (alpha^2 / (2C) - alpha y);  gap = P + D (>= 0).
    """
    import torch
    X64 = X.double()
    loss = 0.0
    for s in range(0, X.shape[0], chunk):
        f = Phi_fn(X64[s:s + chunk]) @ beta.double()
        loss += float(((y[s:s + chunk].double() - f) ** 2).sum()) * C / 2
    reg = 0.5 * float((beta.double() ** 2).sum())
    a = alpha.double()
    dual = reg + float((a * a).sum() / (2 * C) - (a * y.double()).sum())
    P = reg + loss
    return (P + dual) / max(abs(P), abs(dual), 1e-300)


def worker(args):
    import torch
    torch.set_num_threads(args.threads)
    n, d, M, b, iters, C = args.n, args.d, args.M, args.b, args.iters, args.C
    X, y, Xt, yt = _data(n, args.n_test, d, 0)
    sigma = math.sqrt(d)
    gamma = 1.0 / (2 * sigma ** 2)
    out = {"side": args.side}
    if args.side == "authors":
        sys.path.insert(0, AUTHORS_SRC)
        from joker import InexactJoker  # the authors' public code, run from its source
        from kernels.kernel import KeRBF
        from criterion import make_criterion
        torch.manual_seed(0)
        kern = KeRBF(gamma=gamma)
        crit = make_criterion("mse", c=C)
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            model = InexactJoker(X, y, dtype=torch.float32, kernel=kern, criterion=crit, n_features=M,
                                 data_blksz=8192, opt_blksz=b, device="cpu", feature_type="rff")
            # warm-up: a few iterations, then reset the model (same as joker_ext's side)
            model._fit_one_block("random", 50, 64.0)
            model.alpha.zero_()
            model.beta.zero_()
            t0 = time.perf_counter()
            model.fit(max_iter=iters, max_iter_subprob=50, max_region_size=64.0, region_shrink_freq=1000,
                      region_shrink_rate=0.5, blk_strategy="random", verbose_freq=10 ** 9)
            dt = time.perf_counter() - t0
            pred = model.predict(Xt)
        phi = lambda Z: torch.cos(Z @ kern.W.double() + kern.b.double()) * math.sqrt(2.0 / M)
        out["rel_gap"] = _gap_features(phi, X, y, model.alpha, model.beta, C)
    else:
        from joker_ext.features import RandomFeatureMap
        from joker_ext.kernels import GaussianKernel
        from joker_ext.losses import get_loss
        from joker_ext.model import fit_dual
        from joker_ext.solver import SolverOptions
        kern = GaussianKernel(sigma)
        fmap = RandomFeatureMap(kern, M, form="cos", seed=0)
        c = torch.full((n,), float(C))
        common = dict(loss=get_loss("squared"), c=c, kernel=kern, feature_map=fmap, dtype=torch.float32)
        # 'ours': the default block model (the kernel's K_BB in the model, PCG Newton steps on Phi_B Phi_B^T);
        # 'ours_gram': the exact model Phi_B Phi_B^T formed per block (the authors' model, solved exactly)
        common["block_model"] = "gram" if args.side == "ours_gram" else "auto"
        fit_dual(X, y, options=SolverOptions(block_size=b, max_iter=2, tol=0.0, check_every=10 ** 9,
                                             final_gap=False, seed=1), **common)
        opts = SolverOptions(block_size=b, max_iter=iters, tol=0.0, check_every=10 ** 9, final_gap=False, seed=0)
        t0 = time.perf_counter()
        model = fit_dual(X, y, options=opts, **common)
        dt = time.perf_counter() - t0
        pred = model.decision(Xt)
        W, bias = None, None
        phi = lambda Z: fmap(Z.float()).double()
        out["rel_gap"] = _gap_features(phi, X, y, model.alpha, model.beta, C)
    out["iter_ms"] = 1e3 * dt / iters
    out["fit_s"] = dt
    out["test_rmse"] = float(torch.sqrt(((pred.reshape(-1, 1).float() - yt) ** 2).mean()))
    out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(out), flush=True)


def _run(side, ns, timeout):
    cmd = [sys.executable, "-m", "joker_ext.comparisons.benchmarks.authors", "--worker", side,
           "--n", str(ns.n), "--n-test", str(ns.n_test), "--d", str(ns.d), "--M", str(ns.M), "--b", str(ns.b),
           "--iters", str(ns.iters), "--C", str(ns.C), "--threads", str(ns.threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{side} worker failed (rc {p.returncode}):\n{p.stderr[-3000:]}")


def run(quick: bool = False, threads: int = 1, timeout: float = 900) -> list:
    """Run part 6 and print its table; returns the rows."""
    if not os.path.isfile(os.path.join(AUTHORS_SRC, "joker.py")):
        print(f"(6) skipped: the authors' source is not unpacked at {AUTHORS_SRC} "
              "(git archive of github:Apple-Zhang/Joker-paper; set JOKER_AUTHORS_SRC)")
        return []
    settings = ([dict(n=20_000, M=2000, b=512, iters=200)] if quick else
                [dict(n=20_000, M=2000, b=512, iters=400), dict(n=100_000, M=5000, b=1024, iters=200)])
    rows = []
    print(f"(6) Joker authors' code (InexactJoker, trust_region, rff) vs joker_ext fit_dual, identical settings, "
          f"float32, CPU, {threads} thread(s)")
    print("| n | d | M | b | iters | C | ours | authors ms/iter | ours ms/iter | ratio authors/ours | "
          "authors rel gap | ours rel gap | authors test RMSE | ours test RMSE |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in settings:
        ns = argparse.Namespace(n=s["n"], n_test=5000, d=10, M=s["M"], b=s["b"], iters=s["iters"], C=1.0,
                                threads=threads)
        try:
            a = _run("authors", ns, timeout)
        except Exception as exc:  # report exactly why it could not run
            print(f"| {ns.n} | authors' code failed: {str(exc).strip().splitlines()[-1][:300]} |")
            continue
        for side, label in (("ours", "joker_ext (block_model='auto')"), ("ours_gram", "joker_ext (block_model='gram')")):
            o = _run(side, ns, timeout)
            r = a["iter_ms"] / o["iter_ms"]
            rows.append(dict(setting=s, authors=a, ours=o, ratio=r, side=side))
            print(f"| {ns.n} | {ns.d} | {ns.M} | {ns.b} | {ns.iters} | {ns.C:g} | {label} | {a['iter_ms']:.3g} | "
                  f"{o['iter_ms']:.3g} | {r:.2f} | {a['rel_gap']:.2e} | {o['rel_gap']:.2e} | {a['test_rmse']:.4f} | "
                  f"{o['test_rmse']:.4f} |")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--worker", choices=["authors", "ours", "ours_gram"])
    for k, t in (("--n", int), ("--n-test", int), ("--d", int), ("--M", int), ("--b", int), ("--iters", int),
                 ("--C", float)):
        p.add_argument(k, type=t)
    args = p.parse_args(argv)
    if args.worker:
        args.side = args.worker
        worker(args)
    else:
        run(args.quick, args.threads)


if __name__ == "__main__":
    main()
