"""Relative duality gap against time for each engine on one real problem: the figure of docs/math.rst.

Data: flights (``joker_ext.comparisons.datasets.flights``, arrival delay, standardized), ``--n`` training rows.
Problems (the same C and Gaussian sigma for every engine):

* exact kernel, epsilon-insensitive loss with intercept (an SVR): ``working_set`` (with its SMO phase, the default,
  and without it: the decomposition alone, as on a GPU), ``active_set`` and ``dbcd_tr``;
* exact kernel, squared loss (kernel ridge regression): ``active_set``, ``newton`` and ``dbcd_tr``;
* random features (M = ``--M``), squared loss: ``newton`` and ``dbcd_tr``.

Each engine's history (time, relative gap) is plotted on log scales; the figure goes to
``docs/_static/gap_vs_time.png`` and the final gaps and times are printed. Run from the repository root::

    python -m joker_ext.comparisons.benchmarks.gap_figure            # n = 3000, M = 1000 (a few minutes)
"""
from __future__ import annotations

import argparse
import os

import numpy as np


#: The label of the working set run without its SMO phase (``joker_ext.working_set.USE_SMO`` off for that fit).
NO_SMO = "working_set without SMO"


def _fit(solver: str, X, y, **kw):
    """A JokerRegressor fitted with ``solver``; ``NO_SMO`` is the working set with its SMO phase turned off."""
    from joker_ext import JokerRegressor, working_set

    if solver != NO_SMO:
        return JokerRegressor(solver=solver, **kw).fit(X, y)
    saved, working_set.USE_SMO = working_set.USE_SMO, False
    try:
        return JokerRegressor(solver="working_set", **kw).fit(X, y)
    finally:
        working_set.USE_SMO = saved


def _curves(est) -> tuple:
    hist = [h for h in est.history_ if "time" in h and np.isfinite(h.get("rel_gap", np.inf))]
    return [h["time"] for h in hist], [max(h["rel_gap"], 1e-17) for h in hist]


def main(argv=None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from joker_ext.comparisons.datasets import flights

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--M", type=int, default=1000)
    ap.add_argument("--C", type=float, default=10.0)
    ap.add_argument("--out", default=os.path.join("docs", "_static", "gap_vs_time.png"))
    ap.add_argument("--max-time", type=float, default=60.0)
    args = ap.parse_args(argv)
    data = flights(n_train=args.n, n_test=100, seed=0, standardize_y=True)
    X, y = data.X_train, data.y_train
    problems = [
        ("exact, epsilon-insensitive + intercept", dict(loss="epsilon_insensitive", epsilon=0.1, fit_intercept=True),
         ("working_set", NO_SMO, "active_set", "dbcd_tr")),
        ("exact, squared", dict(loss="squared"), ("active_set", "newton", "dbcd_tr")),
        (f"{args.M} random features, squared", dict(loss="squared", n_features=args.M, random_state=0),
         ("newton", "dbcd_tr")),
    ]
    fig, axes = plt.subplots(1, len(problems), figsize=(5 * len(problems), 3.8), sharey=True)
    for ax, (title, kw, solvers) in zip(axes, problems):
        for solver in solvers:
            est = _fit(solver, X, y, C=args.C, sigma="median", max_time=args.max_time, tol=1e-12, **kw)
            t, g = _curves(est)
            ax.loglog(t, g, marker=".", label=solver)  # log time: the second-order engines end within a second
            print(f"{title:42s} {solver:10s} {t[-1] if t else float('nan'):7.2f} s  rel gap {est.relative_gap_:.1e}"
                  f"  status {est.status_}", flush=True)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("time (s, log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("relative duality gap")
    fig.suptitle(f"flights, n = {args.n}, C = {args.C}, Gaussian kernel at the median bandwidth", fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"figure: {args.out}")


if __name__ == "__main__":
    main()
