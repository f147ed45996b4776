"""Reference rows: the authors' ADMM + HSS SVM code (seed 002, Cipolla & Gondzio) beside
:class:`joker_ext.comparisons.solvers.ADMMSVM` on magic, same problem and budget.

The authors' code is a C++ driver on STRUMPACK (github.com/StefanoCipolla/Strumpack_ADMM,
``KernelSVM_final.cpp``). Its README says "tested with STRUMPACK 6.3.1", but the driver keeps the ULV
factors that ``HSSMatrix::factor()`` returned up to STRUMPACK 5.1.1 (from 6.0.0 on it returns nothing and
the driver does not compile: checked against 6.3.1 and 8.0.0); it builds against 5.1.0, the version the paper
names. Both are built *outside* this project (never copied in) and the driver is run as a subprocess::

    # STRUMPACK v5.1.0 (github.com/pghysels/STRUMPACK, tag v5.1.0) without MPI or GPUs: needs BLAS/LAPACK,
    # METIS and a Fortran compiler
    apt-get install libopenblas-dev liblapack-dev libmetis-dev gfortran
    cmake -S /tmp/STRUMPACK-5.1.0 -B /tmp/STRUMPACK-5.1.0/build -DCMAKE_BUILD_TYPE=Release \\
        -DSTRUMPACK_USE_MPI=OFF -DSTRUMPACK_USE_CUDA=OFF -DSTRUMPACK_USE_HIP=OFF -DTPL_ENABLE_SLATE=OFF \\
        -DTPL_ENABLE_PARMETIS=OFF -DTPL_ENABLE_SCOTCH=OFF -DTPL_ENABLE_PTSCOTCH=OFF -DTPL_ENABLE_BPACK=OFF \\
        -DTPL_ENABLE_ZFP=OFF -DTPL_ENABLE_MAGMA=OFF -DCMAKE_INSTALL_PREFIX=/tmp/strumpack-5.1.0-install
    make -C /tmp/STRUMPACK-5.1.0/build install
    cmake -S /tmp/Strumpack_ADMM -B /tmp/Strumpack_ADMM/build -DCMAKE_BUILD_TYPE=Release \\
        -DSTRUMPACK_DIR=/tmp/strumpack-5.1.0-install/lib/cmake/STRUMPACK
    make -C /tmp/Strumpack_ADMM/build
    OMP_NUM_THREADS=1 nice -n 19 python -m joker_ext.comparisons.benchmarks.admm_svm_reference \\
        --binary /tmp/Strumpack_ADMM/build/SVM_ADMM

What their driver does (read, not copied): it reads ``PREFIX_train.csv``, ``PREFIX_test.csv`` (one point a
line) and ``PREFIX_train_label.csv``, ``PREFIX_test_label.csv`` (+1 / -1), the data dimension, the ADMM
penalty beta (parsed as an integer; their run script passes 100, the paper's beta for n < 1e5) and the kernel
(``Gauss``: ``exp(-||x - y||^2 / (2 h^2))``, the harness's convention with ``h = sigma``). It then runs a
grid fixed in its source, ``h`` in {1, 10, 0.1} times ``C`` in {0.1, 1, 10}: for each h, STRUMPACK's HSS
approximation of ``K + beta I`` (options fixed in the source after the command line is read, so they cannot
be changed from it: rel_tol 0.6, abs_tol 0.06, max rank 2000, leaf 512, 512 approximate neighbours, 20 ANN
iterations) and its ULV factorisation; for each C, MaxIt = 10 ADMM iterations (fixed), the bias over the free
support vectors ``1e-5 < z_j < C - 1e-5`` and the test accuracy.

This script writes the harness's magic split (all 15,216 training rows, 2,000 test rows, features z-scored
as in the harness) in that format to a temporary folder, runs the driver with beta = ``--beta``, takes the
``h = --sigma`` block, and runs ours on the same data with the same C, beta and 10 iterations, both with
the dense Cholesky of ``K + beta I`` (``mode='exact'``, the harness's mode at this n) and with our HSS
approximation (``mode='hss'``), once with the options ``--hss-*`` (by default their driver's values; our
``rel_tol`` is not STRUMPACK's, see below) and once with our defaults (max rank 64, close to the rank 66
STRUMPACK reaches at h = 1). The spec's ``C = 1/(n penalty)`` (6.57 for penalty
1e-5) is not on their grid, so the rows are at their grid's C values. Their timed fit is their own
timers' sum for the block: HSS compression + factorisation + the solve for ``(K + beta I)^{-1} e`` (shared
by the three C values of an h) + the C's ADMM iterations; ours is its ``fit`` (set-up included, per C).

Two differences to know when reading the rows. Their bias, as compiled, is not the paper's eq. 7: the driver
multiplies the indicator of the free support vectors by the HSS matrix with ``H.apply(KC)`` but does not keep
the result (STRUMPACK's ``apply`` returns the product), so the kernel term drops out and
``b = mean_j (y_j - y_j z_j)`` (:func:`their_bias`; a row puts that rule on our exact iterate). And our
``rel_tol`` truncates each pivoted QR at ``|R_kk| > rel_tol |R_11|``, far coarser than STRUMPACK's adaptive
randomized compression at the same number, so the same nominal options do not give the same approximation.
The findings are in the harness page (:doc:`/comparisons`, "Reference rows: the authors' code").
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from typing import Dict, List

import numpy as np
import torch

from .eigenpro_reference import Row, print_gap, print_rows

THEIR_C = (0.1, 1.0, 10.0)  # fixed in their driver
MAX_IT = 10  # fixed in their driver


def write_their_format(prefix: str, X: np.ndarray, y_pm: np.ndarray, Xt: np.ndarray, yt_pm: np.ndarray) -> None:
    """The four CSV files their driver reads (``mode='test'``)."""
    np.savetxt(prefix + "_train.csv", X, delimiter=",", fmt="%.17g")
    np.savetxt(prefix + "_test.csv", Xt, delimiter=",", fmt="%.17g")
    np.savetxt(prefix + "_train_label.csv", y_pm.reshape(-1, 1), fmt="%d")
    np.savetxt(prefix + "_test_label.csv", yt_pm.reshape(-1, 1), fmt="%d")


def parse_their_output(text: str) -> Dict[float, Dict]:
    """``{h: {'setup': seconds, 'rank': r, 'C': {C: {'admm': seconds, 'accuracy': fraction}}}}`` from their
    driver's printout (one block per h of its grid, one sub-block per C)."""
    out: Dict[float, Dict] = {}
    h = C = None
    num = r"([-+0-9.eE]+)"
    for line in text.splitlines():
        if m := re.match(r"# kernel h\s*=\s*" + num, line):
            h = float(m.group(1))
            out[h] = {"setup": 0.0, "rank": None, "C": {}}
        elif h is None:
            continue
        elif m := re.match(r"# (HSS compression|factorization|solve) time = " + num, line):
            out[h]["setup"] += float(m.group(2))
        elif m := re.match(r"# rank\(H\) = (\d+)", line):
            out[h]["rank"] = int(m.group(1))
        elif m := re.match(r"# C parameter for SVM = " + num, line):
            C = float(m.group(1))
            out[h]["C"][C] = {}
        elif C is not None and (m := re.match(r"# Training Time = " + num, line)):
            out[h]["C"][C]["admm"] = float(m.group(1))
        elif C is not None and (m := re.match(r"# prediction score: " + num + "%", line)):
            out[h]["C"][C]["accuracy"] = float(m.group(1)) / 100.0
    return out


def their_bias(svm, C: float) -> float:
    """The bias their driver computes, as compiled: it means ``b = mean_j (y_j - sum_i K_ji y_i z_i)`` over the
    free support vectors ``1e-5 < z_j < C - 1e-5`` (the paper's eq. 7) but discards the result of
    ``H.apply(KC)`` (STRUMPACK's ``apply`` returns the product), so the kernel drops out:
    ``b = mean_j (y_j - y_j z_j)``. Evaluated on our iterate, to separate this from the solvers."""
    z = svm.dual_coef_.detach().cpu().numpy()
    ys = svm.y_signs_.detach().cpu().numpy()
    free = (z > 1e-5) & (z < C - 1e-5)
    return float(np.mean(ys[free] - ys[free] * z[free])) if free.any() else 0.0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", required=True, help="their compiled driver (SVM_ADMM), built outside the project")
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--sigma", type=float, default=1.0, help="Gaussian bandwidth: their h (one of 1, 10, 0.1)")
    ap.add_argument("--beta", type=int, default=100, help="ADMM penalty (their run script's 100)")
    ap.add_argument("--hss-max-rank", type=int, default=2000, help="ours, mode='hss' (theirs: 2000)")
    ap.add_argument("--hss-rel-tol", type=float, default=0.6, help="ours, mode='hss' (theirs: 0.6)")
    ap.add_argument("--hss-leaf-size", type=int, default=512, help="ours, mode='hss' (theirs: 512)")
    ap.add_argument("--hss-neighbors", type=int, default=512, help="ours, mode='hss' (theirs: 512)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds for their driver")
    ap.add_argument("--their-log", default=None, help="file to keep their driver's whole printout in")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    from joker_ext.comparisons.datasets import load
    from joker_ext.comparisons.solvers.admm_svm import ADMMSVM
    from joker_ext.kernels import GaussianKernel

    ds = load("magic", "binary", n_train=None, n_test=args.n_test, seed=args.seed)
    X, Xt = ds.X_train, ds.X_test
    pos = np.unique(ds.y_train)[1]  # the larger label is +1, as in ADMMSVM
    y_pm = np.where(ds.y_train == pos, 1, -1)
    yt_pm = np.where(ds.y_test == pos, 1, -1)
    n, d = X.shape

    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "magic")
        write_their_format(prefix, X, y_pm, Xt, yt_pm)
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        t0 = time.perf_counter()
        proc = subprocess.run([args.binary, prefix, str(d), str(args.beta), "Gauss", "test"], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=args.timeout)
        wall = time.perf_counter() - t0
    if args.their_log:
        with open(args.their_log, "w") as fh:
            fh.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"their driver exited with {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    theirs = parse_their_output(proc.stdout)
    block = theirs.get(float(args.sigma))
    if block is None:
        raise SystemExit(f"h = {args.sigma} is not on their grid ({sorted(theirs)})")

    print_rows(f"magic n={n}, d={d}, test {Xt.shape[0]}, Gaussian sigma = h = {args.sigma}, C-SVC dual, ADMM beta "
               f"{args.beta}, {MAX_IT} iterations, float64, 1 thread; their driver's whole grid took {wall:.1f} s "
               "(HSS set-up per h: " + ", ".join(f"h={h:g} {b['setup']:.1f} s rank {b['rank']}"
                                                 for h, b in theirs.items()) + ")",
               [], metric="test accuracy")
    hss = dict(max_rank=args.hss_max_rank, rel_tol=args.hss_rel_tol, leaf_size=args.hss_leaf_size,
               n_neighbors=args.hss_neighbors)
    for C in THEIR_C:
        res = block["C"].get(C)
        if res is None or "accuracy" not in res:
            print(f"C={C:g}: no result in their printout")
            continue
        ref: Row = (f"StefanoCipolla/Strumpack_ADMM SVM_ADMM, C={C:g}", block["setup"] + res["admm"],
                    res["accuracy"], f"STRUMPACK HSS rank {block['rank']}; set-up {block['setup']:.1f} s "
                    f"(shared by the 3 C), ADMM {res['admm']:.2f} s")
        rows: List[Row] = [ref]
        tags: List[str] = []
        for mode, opts in (("exact", None), ("hss", hss), ("hss", {})):
            t0 = time.perf_counter()
            ours = ADMMSVM(GaussianKernel(args.sigma), C=C, beta=float(args.beta), max_iter=MAX_IT, mode=mode,
                           hss_options=opts, seed=args.seed, dtype=torch.float64).fit(X, ds.y_train)
            fit_s = time.perf_counter() - t0
            acc = float(np.mean(np.asarray(ours.predict(Xt)).reshape(-1) == ds.y_test))
            setup = f"mode={mode}" + ("" if opts is None else ", " + (", ".join(f"{k}={v}" for k, v in opts.items())
                                                                   or "our default HSS options") +
                                      f"; HSS rank {ours.hss_.max_rank_used}")
            rows.append((f"joker_ext ADMMSVM, C={C:g}", fit_s, acc, setup))
            tags.append(mode if opts is None else f"{mode}, {'their driver' if opts else 'our default'} options")
            if mode == "exact":
                f = np.asarray(ours.decision_function(Xt)).reshape(-1) - ours.intercept_ + their_bias(ours, C)
                acc_b = float(np.mean(np.where(f > 0, 1, -1) == yt_pm))
                rows.append((f"joker_ext ADMMSVM, C={C:g}, with their compiled bias", fit_s, acc_b,
                             "mode=exact; b = mean over 1e-5 < z_j < C - 1e-5 of (y_j - y_j z_j)"))
                tags.append("exact, their compiled bias")
        print_rows("", rows, digits=4)
        for row, tag in zip(rows[1:], tags):
            print_gap(row, ref, metric="test accuracy", label=f"C={C:g}, ours ({tag}) vs theirs")


if __name__ == "__main__":
    main()
