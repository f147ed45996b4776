"""JokerFalkon and Falkon at the same ``max_gpu_mem`` (issue #14, "Must show", the GPU memory target).

Per configuration (``--configs``: those of :mod:`joker_ext.comparisons.benchmarks.falkon_gpu`), in a fresh process
of its own, after a small warm-up fit of each library:

a. Falkon with ``FalkonOptions(max_gpu_mem=cap)``, ``cap`` the configuration's entry of ``--caps`` (GiB): the
   smallest cap at which Falkon's fit time stays within 10% of its uncapped time, as ``falkon_gpu``'s calibration
   finds it (flights, M = 20,000: 0.24 GiB; synthetic 1M: 0.29 GiB on an H200);
b. JokerFalkon with Falkon's default options (no cap) and with the same ``max_gpu_mem`` (its Newton engine then
   plans its preconditioner's rank and its chunks for the budget, :func:`joker_ext.memory.plan_newton`),
   ``--repeats`` times each;
c. per cap, one more JokerFalkon fit that reports its test RMSE after every Newton and CG iteration (the
   reporting's time excluded): the time at which it first reaches Falkon's test RMSE (``--no-time-to-target``
   skips it). Its peak is not reported: the test set it evaluates sits on the device.

Each fit reports its time, its test RMSE and its peak GPU memory: ``torch.cuda.max_memory_allocated`` during the
fit less what was allocated when it started. Falkon's capped fit comes first in a process that has run no
uncapped fit: an uncapped Falkon fit leaves about 1 GiB allocated behind it, which the next fit's peak then
does not show (``falkon_gpu``'s calibration table reads 0.22 GiB where this measures 0.80 GiB). Ratios
JokerFalkon / Falkon come from the same process. Both libraries get float32 CPU tensors.

Run on a CUDA machine (Falkon installed; the flights data as for ``falkon_gpu``)::

    python -m joker_ext.comparisons.benchmarks.falkon_gpu_capped --flights-npz flights200k.npz \\
        --configs flights20k,synth1m --caps 0.24,0.29 --out capped.jsonl

``--quick`` runs tiny sizes on the CPU (no GPU memory; for checking the script). Results:
``comparisons/benchmarks/results/falkon_gpu_h200_s12.md``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

MODULE = "joker_ext.comparisons.benchmarks.falkon_gpu_capped"
GIB = 2 ** 30


def _joker_fit(kernel, cfg, data, cuda: bool, cap_gib: float, max_time) -> dict:
    import falkon
    import torch

    from joker_ext import JokerFalkon

    from .falkon_gpu import _Clock, _rmse

    Xtr, ytr, Xts, yts = data
    cap = {} if math.isinf(cap_gib) else {"max_gpu_mem": cap_gib * GIB}
    model = JokerFalkon(kernel, cfg["penalty"], cfg["M"], seed=0, features="auto", max_time=max_time,
                        options=falkon.FalkonOptions(use_cpu=not cuda, **cap))
    with _Clock(cuda) as clk:
        model.fit(Xtr, ytr)
    extra = model.model_.extra
    out = {"lib": "joker", "cap_gib": cap_gib, "fit_time": clk.time, "peak_bytes": clk.peak - clk.base,
           "rmse": _rmse(yts, model.predict(Xts)), "status": model.status_, "rel_gap": model.relative_gap_,
           "solver": model.solver_, "passes": model.result_.history[-1].get("passes"),
           "planned": {k: extra[k] for k in ("newton_rank", "chunk_rows", "newton_resident") if k in extra}}
    del model
    if cuda:
        torch.cuda.empty_cache()
    return out


def worker(a) -> None:
    import falkon
    import torch

    from . import falkon_gpu as fg

    cuda = torch.cuda.is_available() and not a.quick
    cfg = dict((fg.QUICK if a.quick else fg.CONFIGS)[a.worker])
    Xtr, ytr, Xts, yts = fg.load(cfg, a.flights_npz)
    sigma = fg.median_sigma(Xtr)
    data = (torch.from_numpy(Xtr), torch.from_numpy(ytr).reshape(-1, 1), torch.from_numpy(Xts),
            torch.from_numpy(yts).reshape(-1, 1))
    kernel = falkon.kernels.GaussianKernel(sigma)
    fg._warmup(falkon, cuda)
    device = torch.cuda.get_device_name() if cuda else "cpu"

    def emit(rec):
        rec = dict(rec, config=a.worker, device=device, sigma=sigma, n_train=int(Xtr.shape[0]))
        print(json.dumps(rec, default=str), flush=True)
        if a.out:
            with open(a.out, "a") as fh:
                fh.write(json.dumps(rec, default=str) + "\n")

    f = fg._falkon_fit(falkon, kernel, cfg, data, cuda, max_gpu_mem=a.cap * GIB)
    emit(dict(f, lib="falkon", cap_gib=a.cap, peak_bytes=f.get("peak_bytes", 0) - f.get("base_bytes", 0)))
    for cap in (math.inf, a.cap):
        for _ in range(a.repeats):
            try:
                emit(_joker_fit(kernel, cfg, data, cuda, cap, a.joker_max_time))
            except Exception as exc:  # recorded, the other fits still run
                emit({"lib": "joker", "cap_gib": cap, "error": f"{type(exc).__name__}: {exc}"[:300]})
        if a.time_to_target and "rmse" in f:
            emit(_time_to_target(falkon, kernel, cfg, data, cuda, cap, f["rmse"], a))


def _time_to_target(falkon, kernel, cfg, data, cuda: bool, cap_gib: float, target: float, a) -> dict:
    """A reporting JokerFalkon fit (test RMSE after every Newton and CG iteration, the reporting's own time
    excluded, :func:`falkon_gpu._joker_fit`): the time at which it first reaches Falkon's test RMSE."""
    from . import falkon_gpu as fg

    cap = None if math.isinf(cap_gib) else cap_gib * GIB
    try:
        r = fg._joker_fit(falkon, kernel, cfg, data, cuda, "auto", target, report=True, max_time=a.joker_max_time,
                          report_every=a.cg_every, max_gpu_mem=cap)
    except Exception as exc:  # recorded, the other fits still run
        return {"lib": "joker_trace", "cap_gib": cap_gib, "error": f"{type(exc).__name__}: {exc}"[:300]}
    keep = ("time_to_target", "best_rmse", "fit_time_excl_reporting", "status", "trace")
    return dict({k: r.get(k) for k in keep}, lib="joker_trace", cap_gib=cap_gib, target_rmse=target)


def render(records) -> str:
    """Markdown table per configuration: each fit with its ratios to Falkon's time and peak."""
    lines = []
    for config in dict.fromkeys(r["config"] for r in records):
        rows = [r for r in records if r["config"] == config]
        fa = next((r for r in rows if r["lib"] == "falkon" and "fit_time" in r), None)
        lines += [f"### {config} ({rows[0].get('device')}, n = {rows[0].get('n_train')})", "",
                  "| fit | max_gpu_mem (GiB) | fit (s) | / Falkon | test RMSE | peak GPU (MiB) | / Falkon | planned |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["lib"] == "joker_trace":
                tt = r.get("time_to_target")
                ratio = f" ({tt / fa['fit_time']:.3f}x Falkon's fit time)" if tt is not None and fa else ""
                reached = f"{tt:.2f} s{ratio}" if tt is not None else (r.get("error") or "not reached")
                lines.append(f"| JokerFalkon to Falkon's RMSE | {r['cap_gib']} | {reached} | | "
                             f"best {r.get('best_rmse') or float('nan'):.5f} | | | |")
                continue
            if "fit_time" not in r:
                lines.append(f"| {r['lib']} | {r['cap_gib']} | {r.get('error', 'failed')} | | | | | |")
                continue
            t = f"{r['fit_time'] / fa['fit_time']:.3f}x" if fa else "-"
            m = f"{r['peak_bytes'] / fa['peak_bytes']:.2f}x" if fa and fa.get("peak_bytes") else "-"
            name = "Falkon" if r["lib"] == "falkon" else f"JokerFalkon ({r.get('status')})"
            lines.append(f"| {name} | {r['cap_gib']} | {r['fit_time']:.2f} | {t} | {r['rmse']:.5f} | "
                         f"{r['peak_bytes'] / 2 ** 20:.1f} | {m} | {r.get('planned') or ''} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", default="flights20k,synth1m")
    p.add_argument("--caps", default="0.24,0.29", help="Falkon's max_gpu_mem per configuration (GiB)")
    p.add_argument("--flights-npz", default=".device/data/flights200k.npz")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--joker-max-time", type=float, default=None)
    p.add_argument("--no-time-to-target", dest="time_to_target", action="store_false",
                   help="skip the reporting fit per cap that times JokerFalkon's reaching Falkon's test RMSE")
    p.add_argument("--cg-every", type=int, default=1, help="the reporting fit's error_every")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per configuration")
    p.add_argument("--out", default=None, help="JSON lines of the workers' records")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--cap", type=float, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a)
        return
    configs, caps = a.configs.split(","), [float(c) for c in a.caps.split(",")]
    if len(caps) != len(configs):
        raise SystemExit(f"--caps needs one cap per configuration ({len(configs)}), got {a.caps!r}")
    out = a.out or os.path.join("/tmp", f"falkon_gpu_capped_{os.getpid()}.jsonl")
    for cfg, cap in zip(configs, caps):
        cmd = [sys.executable, "-m", MODULE, "--worker", cfg, "--cap", str(cap), "--flights-npz", a.flights_npz,
               "--repeats", str(a.repeats), "--out", out, "--cg-every", str(a.cg_every)]
        if not a.time_to_target:
            cmd.append("--no-time-to-target")
        if a.joker_max_time:
            cmd += ["--joker-max-time", str(a.joker_max_time)]
        if a.quick:
            cmd.append("--quick")
        print("$", " ".join(cmd), flush=True)
        try:
            subprocess.run(cmd, timeout=a.timeout, check=False)
        except subprocess.TimeoutExpired:
            print(f"[{cfg}] timed out after {a.timeout} s", flush=True)
    records = []
    if os.path.exists(out):
        with open(out) as fh:
            records = [json.loads(line) for line in fh]
    print(render(records))


if __name__ == "__main__":
    main()
