"""Results of the comparison harness: results.csv, a markdown table and matplotlib figures.

* :func:`write_csv` writes ``results.csv`` atomically (a temporary file renamed over the old one), so the
  file is always complete even if the harness is interrupted; :func:`read_csv` reads it back.
* :func:`markdown_table` makes one table per experiment: backend, M, status, fit / predict seconds, peak
  and fit memory, the test metric, its distance to the best backend, and the notes.
* :func:`make_figures` draws (matplotlib, Agg backend), after the seed paper's figures 1-3:
  ``metric_vs_time_<experiment>.png`` (test metric against fit time, per backend),
  ``convergence_vs_time_<experiment>.png`` (each solver's own convergence measure against fit time: Joker's
  relative duality gap, the relative residual of EigenPro 2/3 and ASkotch, ADMM's primal residual),
  ``model_size_<experiment>.png`` (memory, fit time and test metric against the model size M) and
  ``joker_objectives_<experiment>.png`` (Joker's primal and dual objectives and relative duality gap
  against block iterations).
"""
from __future__ import annotations

import csv
import json
import math
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

__all__ = ["CSV_COLUMNS", "write_csv", "read_csv", "markdown_table", "make_figures", "summarise",
           "relative_gap_to_best", "trace_curve", "convergence_curve", "CONVERGENCE_LABELS"]

CSV_COLUMNS = [
    "experiment", "run_id", "dataset", "task", "backend", "loss", "kernel", "sigma", "penalty", "M",
    "n_train", "n_test", "dtype", "device", "seed", "repeat", "status",
    "fit_seconds", "predict_seconds", "peak_rss_mb", "fit_rss_mb", "peak_gpu_mb", "metric_name", "metric",
    "rmse", "mae", "rel_error", "accuracy", "auc", "wall_seconds", "params", "notes", "error", "trace_file",
]

_NUMERIC = {"sigma", "penalty", "fit_seconds", "predict_seconds", "peak_rss_mb", "fit_rss_mb", "peak_gpu_mb", "metric",
            "rmse", "mae", "rel_error", "accuracy", "auc", "wall_seconds"}
_INTEGER = {"n_train", "n_test", "seed", "repeat"}


def write_csv(rows: Sequence[Dict[str, Any]], path) -> None:
    """Write ``rows`` to ``path`` atomically with the columns :data:`CSV_COLUMNS` (extra keys appended)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    extra: List[str] = []
    for r in rows:
        for k in r:
            if k not in CSV_COLUMNS and k not in extra:
                extra.append(k)
    cols = CSV_COLUMNS + extra
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r.get(k, "")) for k in cols})
    os.replace(tmp, path)


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return repr(v)
    return v


def read_csv(path) -> List[Dict[str, Any]]:
    """Rows of a results.csv, numbers converted back (empty cells are NaN)."""
    out = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            row: Dict[str, Any] = dict(r)
            for k in _NUMERIC:
                if k in row:
                    row[k] = float(row[k]) if row[k] not in ("", None) else math.nan
            for k in _INTEGER:
                if k in row and row[k] not in ("", None):
                    try:
                        row[k] = int(row[k])
                    except ValueError:
                        pass
            if row.get("M") not in ("", None):
                try:
                    row["M"] = int(row["M"])
                except ValueError:
                    pass
            out.append(row)
    return out


# ---------------------------------------------------------------------------- summaries
def _num(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def _better(metric_name: str) -> int:
    """+1 when larger is better, -1 when smaller is better."""
    return 1 if metric_name in ("accuracy", "auc") else -1


def summarise(rows: Sequence[Dict[str, Any]]) -> "OrderedDict[str, List[Dict[str, Any]]]":
    """Group rows by experiment, then average repeats of the same (backend, M): one summary row each."""
    groups: "OrderedDict[str, OrderedDict]" = OrderedDict()
    for r in rows:
        g = groups.setdefault(r.get("experiment", ""), OrderedDict())
        g.setdefault((r.get("backend"), str(r.get("M", ""))), []).append(r)
    out: "OrderedDict[str, List[Dict[str, Any]]]" = OrderedDict()
    for exp, runs in groups.items():
        summary = []
        for (backend, M), rs in runs.items():
            ok = [r for r in rs if r.get("status") == "ok"]
            base = dict(ok[0] if ok else rs[-1])
            if ok:
                for k in ("fit_seconds", "predict_seconds", "peak_rss_mb", "fit_rss_mb", "peak_gpu_mb", "metric",
                          "rmse", "mae", "rel_error", "accuracy", "auc"):
                    vals = [_num(r.get(k)) for r in ok]
                    vals = [v for v in vals if not math.isnan(v)]
                    base[k] = sum(vals) / len(vals) if vals else math.nan
                base["status"] = "ok" if len(ok) == len(rs) else f"ok {len(ok)}/{len(rs)}"
            base["repeats"] = len(rs)
            summary.append(base)
        out[exp] = summary
    return out


def relative_gap_to_best(summary: Sequence[Dict[str, Any]]) -> Dict[int, float]:
    """For each ok summary row (by position), how much worse than the best backend it is, in percent of the
    best metric (0 for the best; RMSE: ``(m - best)/best``; accuracy: ``(best - m)/best``)."""
    ok = [(i, _num(r.get("metric"))) for i, r in enumerate(summary) if str(r.get("status", "")).startswith("ok")]
    ok = [(i, m) for i, m in ok if not math.isnan(m)]
    if not ok:
        return {}
    name = summary[ok[0][0]].get("metric_name", "")
    sgn = _better(name)
    best = max(m * sgn for _, m in ok) * sgn
    out = {}
    for i, m in ok:
        if best == 0:
            out[i] = 0.0 if m == best else math.inf
        else:
            out[i] = 100.0 * (best - m) * sgn / abs(best)
    return out


def _short(text: str, width: int) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= width else text[: width - 3] + "..."


def markdown_table(rows: Sequence[Dict[str, Any]], notes_width: int = 110) -> str:
    """One markdown table per experiment (repeats averaged)."""
    parts = []
    for exp, summary in summarise(rows).items():
        if not summary:
            continue
        first = summary[0]
        sig = _num(first.get("sigma"))
        head = (f"### {exp}: {first.get('dataset')} {first.get('task')}, loss {first.get('loss')}, "
                f"kernel {first.get('kernel')} sigma={sig:.4g}, penalty={_num(first.get('penalty')):g}, "
                f"n_train={first.get('n_train')}, n_test={first.get('n_test')}, {first.get('dtype')}")
        mname = next((r.get("metric_name") for r in summary if r.get("metric_name")), "metric")
        gaps = relative_gap_to_best(summary)
        gpu = any(not math.isnan(_num(r.get("peak_gpu_mb"))) for r in summary)  # a GPU column for CUDA runs
        lines = [head, "",
                 f"| backend | M | status | fit s | predict s | peak MB | fit MB |{' GPU MB |' if gpu else ''} "
                 f"{mname} | vs best | notes |",
                 "|---|---|---|---:|---:|---:|---:|" + ("---:|" if gpu else "") + "---:|---:|---|"]
        for i, r in enumerate(summary):
            ok = str(r.get("status", "")).startswith("ok")
            cells = [
                str(r.get("backend")), str(r.get("M", "")), str(r.get("status")),
                f"{_num(r.get('fit_seconds')):.2f}" if ok else "",
                f"{_num(r.get('predict_seconds')):.2f}" if ok else "",
                f"{_num(r.get('peak_rss_mb')):.0f}" if ok else "",
                f"{_num(r.get('fit_rss_mb')):.0f}" if ok else "",
            ] + ([f"{_num(r.get('peak_gpu_mb')):.0f}" if ok else ""] if gpu else []) + [
                f"{_num(r.get('metric')):.4f}" if ok else "",
                (f"{gaps[i]:+.2f}%" if i in gaps else ""),
            ]
            text = r.get("notes", "") if ok else (r.get("error", "") + (" | " + r["notes"] if r.get("notes") else ""))
            cells.append(_short(text, notes_width))
            lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------- figures
def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def _save_figure(fig, path: Path, title: Optional[str] = None) -> str:
    """Give ``fig`` its title (if any), lay it out, write it to ``path`` at 110 dpi and close it; returns the path."""
    import matplotlib.pyplot as plt

    if title is not None:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _load_trace(out: Path, row: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    tf = row.get("trace_file")
    if not tf:
        return None
    p = out / tf
    if not p.is_file():
        return None
    try:
        with open(p) as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError):
        return None


def trace_curve(out, row: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The points of a run's trace that the metric-against-time figure draws (those with a finite test
    metric), in the order recorded. With fewer than two the figure shows the run as a single marker."""
    tr = _load_trace(Path(out), row)
    return [p for p in (tr or {}).get("points", []) if "metric" in p and _finite(p["metric"])]


#: Convergence measures a trace may carry, in order of preference, and their legend text.
CONVERGENCE_LABELS = {
    "rel_gap": "relative duality gap",
    "relative_residual": "relative residual ||(K + lam I) a - y|| / ||y||",
    "primal_residual": "ADMM primal residual ||x - z||",
}


def convergence_curve(out, row: Dict[str, Any]):
    """``(key, points)``: the points of a run's trace carrying its convergence measure (the first of
    :data:`CONVERGENCE_LABELS` it records, with a finite value >= 0), or ``(None, [])``."""
    tr = _load_trace(Path(out), row)
    pts = (tr or {}).get("points", [])
    for key in CONVERGENCE_LABELS:
        sel = [p for p in pts if key in p and _finite(p[key]) and float(p[key]) >= 0 and "time" in p]
        if sel:
            return key, sel
    return None, []


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _uses_M(backend: str) -> bool:
    try:
        from .backends import backend_class

        return bool(backend_class(backend).uses_M)
    except Exception:
        return True


def make_figures(rows: Sequence[Dict[str, Any]], out) -> List[str]:
    """Draw the figures into ``out`` and return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    made: List[str] = []
    by_exp: "OrderedDict[str, List[Dict[str, Any]]]" = OrderedDict()
    for r in rows:
        by_exp.setdefault(r.get("experiment", ""), []).append(r)
    for exp, rs in by_exp.items():
        ok = [r for r in rs if r.get("status") == "ok"]
        if not ok:
            continue
        mname = ok[0].get("metric_name", "metric")
        Ms = sorted({str(r.get("M")) for r in ok})
        multi_M = len(Ms) > 1

        # ---- 1. test metric against fit time (seed figure 2)
        fig, ax = plt.subplots(figsize=(8, 5))
        ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)
        plotted: List[float] = []
        # a model-size sweep is figure 2's business: here, the first M of each M-dependent backend
        main_M = {}
        for r in ok:
            main_M.setdefault(r["backend"], str(r.get("M")))
        for r in ok:
            if r.get("repeat", 0) not in (0, "0") or str(r.get("M")) != main_M[r["backend"]]:
                continue
            pts = trace_curve(out, r)
            label = r["backend"] + (f" (M={r.get('M')})" if multi_M and _uses_M(r["backend"]) else "")
            if len(pts) > 1:
                t = [max(p["time"], 1e-4) for p in pts]
                ys = [p["metric"] for p in pts]
                ax.plot(t, ys, marker=".", ms=3, lw=1.2, label=label)
                plotted.extend(ys)
            else:
                y = _num(r.get("metric"))
                ax.plot([max(_num(r.get("fit_seconds")), 1e-4)], [y], marker="o", ls="", label=label)
                plotted.append(y)
        ax.set_xscale("log")
        ax.set_xlabel("fit time (s)")
        ax.set_ylabel(f"test {mname}")
        ax.set_title(f"{exp}: test {mname} during training")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        finals = [_num(r.get("metric")) for r in ok if not math.isnan(_num(r.get("metric")))]
        plotted = [v for v in plotted if math.isfinite(v)]
        if finals and plotted:
            if mname in ("accuracy", "auc"):
                best = max(finals + plotted)
                lo = max(min(plotted), best - 0.2)
                ax.set_ylim(lo - 0.01, min(1.0, best + 0.01))
            else:
                best = min(finals + plotted)
                hi = min(max(plotted), best * 1.3)
                pad = 0.05 * max(hi - best, 1e-12)
                ax.set_ylim(best - pad, hi + pad)
        made.append(_save_figure(fig, out / f"metric_vs_time_{_safe(exp)}.png"))

        # ---- 1b. each solver's own convergence measure against fit time
        curves = []
        for r in ok:
            if r.get("repeat", 0) not in (0, "0") or str(r.get("M")) != main_M[r["backend"]]:
                continue
            key, pts = convergence_curve(out, r)
            if key and len(pts) > 1:
                curves.append((r, key, pts))
        if curves:
            fig, ax = plt.subplots(figsize=(8, 5))
            ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)
            for r, key, pts in curves:
                ax.plot([max(p["time"], 1e-4) for p in pts], [max(float(p[key]), 1e-17) for p in pts],
                        marker=".", ms=3, lw=1.2, label=f"{r['backend']}: {CONVERGENCE_LABELS[key]}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("fit time (s)")
            ax.set_ylabel("the solver's own convergence measure")
            ax.set_title(f"{exp}: residuals and duality gaps during training")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            made.append(_save_figure(fig, out / f"convergence_vs_time_{_safe(exp)}.png"))

        # ---- 2. memory, time and metric against model size (seed figure 1)
        fig, axes = plt.subplots(1, 3, figsize=(13, 4))
        series: "OrderedDict[str, List]" = OrderedDict()
        for r in ok:
            M = _num(r.get("M"))
            if math.isnan(M):
                M = _num(r.get("n_train"))
            series.setdefault(r["backend"], []).append((M, r))
        for backend, pts in series.items():
            pts.sort(key=lambda t: t[0])
            x = [t[0] for t in pts]
            style = dict(marker="o", lw=1.2) if len(pts) > 1 else dict(marker="s", ls="")
            axes[0].plot(x, [_num(t[1].get("fit_rss_mb")) for t in pts], label=backend, **style)
            axes[1].plot(x, [_num(t[1].get("fit_seconds")) for t in pts], label=backend, **style)
            axes[2].plot(x, [_num(t[1].get("metric")) for t in pts], label=backend, **style)
        for a, yl in zip(axes, ("memory during fit + predict (MB over baseline)", "fit time (s)", f"test {mname}")):
            a.set_xscale("log")
            a.set_xlabel("model size M (centres / features; exact = n)")
            a.set_ylabel(yl)
            a.grid(alpha=0.3)
        axes[1].set_yscale("log")
        axes[0].legend(fontsize=7)
        made.append(_save_figure(fig, out / f"model_size_{_safe(exp)}.png",
                                 title=f"{exp}: cost and accuracy against model size"))

        # ---- 3. Joker's primal and dual objectives (seed figure 3)
        jruns = [r for r in ok if str(r.get("backend", "")).startswith("joker") and r.get("repeat", 0) in (0, "0")]
        curves = []
        for r in jruns:
            tr = _load_trace(out, r)
            pts = [p for p in (tr or {}).get("points", []) if "primal" in p and "dual" in p and "iteration" in p]
            if len(pts) > 1:
                curves.append((r, pts))
        if curves:
            fig, axes = plt.subplots(1, 2, figsize=(12, 4.3))
            for r, pts in curves:
                it = [p["iteration"] for p in pts]
                lbl = r["backend"] + (f" M={r.get('M')}" if r["backend"] != "joker" else "")
                l1, = axes[0].plot(it, [p["primal"] for p in pts], lw=1.4, label=f"{lbl}: primal P")
                axes[0].plot(it, [p["dual"] for p in pts], lw=1.4, ls="--", color=l1.get_color(),
                             label=f"{lbl}: dual -D")
                axes[1].plot(it, [max(p.get("rel_gap", math.nan), 1e-17) for p in pts], lw=1.4, label=lbl)
            axes[0].set_xscale("log")
            axes[0].set_xlabel("block iterations")
            axes[0].set_ylabel("objective")
            vals = [v for _, pts in curves for p in pts for v in (p["primal"], p["dual"])]
            axes[0].set_yscale("log" if vals and min(vals) > 0 else "symlog")
            axes[0].set_title("primal (solid) and dual (dashed) objectives")
            axes[0].legend(fontsize=7)
            axes[1].set_xscale("log")
            axes[1].set_yscale("log")
            axes[1].set_xlabel("block iterations")
            axes[1].set_ylabel("relative duality gap (P + D) / max(|P|, |D|)")
            axes[1].legend(fontsize=7)
            for a in axes:
                a.grid(alpha=0.3)
            made.append(_save_figure(fig, out / f"joker_objectives_{_safe(exp)}.png",
                                     title=f"{exp}: Joker's convergence"))
    return made
