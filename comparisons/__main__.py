"""``python -m joker_ext.comparisons`` / ``joker-compare``: the comparison harness's command line.

Examples::

    python -m joker_ext.comparisons --quick                       # the main job: a few minutes on 2 cores
    python -m joker_ext.comparisons --dataset magic --loss logistic --penalty 1e-6 --M 1000 \\
        --backends joker,falkon,sklearn --n-train 5000 --out results/magic
    python -m joker_ext.comparisons --config experiments.toml     # see comparisons/spec.py for the layout
    python -m joker_ext.comparisons --list-backends

Every run happens in its own process; results.csv (rewritten after each run), the markdown table
(results.md, also printed), per-run traces and logs, and the figures land in ``--out``.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

__all__ = ["main"]


def _list_backends() -> str:
    """A markdown table: each backend, whether it can run here, and what it is."""
    import sys as _sys

    from .backends.base import Skip, package_available
    from .backends import backend_class
    from .spec import ALL_BACKENDS

    lines = ["| backend | available | losses | what |", "|---|---|---|---|"]
    for name in ALL_BACKENDS:
        cls = backend_class(name)
        missing = [p for p in cls.requires if not package_available(p)]
        status = "yes" if not missing else f"no ({', '.join(missing)} not installed)"
        if not missing and hasattr(cls, "solver_class"):
            try:
                cls.solver_class(cls)
            except Skip as exc:
                status = f"no ({exc})"
        doc = (_sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
        what = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else (doc[0] if doc else "")
        losses = ", ".join(cls.losses) if cls.losses else "any"
        lines.append(f"| {name} | {status} | {losses} | {what} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the harness; returns the process exit status (0 when at least one run succeeded)."""
    from .spec import spec_from_args

    t0 = time.perf_counter()
    try:
        specs, run = spec_from_args(argv)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if run.get("list_backends"):
        print(_list_backends())
        return 0
    from .reporting import make_figures, markdown_table
    from .runner import run_suite

    out = Path(run["out"])
    n_runs = sum(len(s.backends) * s.repeats for s in specs)
    print(f"joker-compare: {len(specs)} experiment(s), up to {n_runs} runs, output in {out}/", flush=True)
    rows = run_suite(specs, str(out), isolation=run.get("isolation", "forkserver"),
                     threads=int(run.get("threads", 1)) or None,
                     echo=lambda s: print(s, flush=True))
    table = markdown_table(rows)
    (out / "results.md").write_text(table + "\n")
    print()
    print(table)
    print()
    figures: List[str] = []
    if run.get("figures", True):
        try:
            figures = make_figures(rows, out)
        except Exception as exc:  # figures must never lose the results
            print(f"figures failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    ok = sum(1 for r in rows if r.get("status") == "ok")
    print(f"{ok}/{len(rows)} runs ok; results: {out / 'results.csv'}, {out / 'results.md'}")
    for f in figures:
        print(f"figure: {f}")
    print(f"total wall time {time.perf_counter() - t0:.1f} s")
    return 0 if ok > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
