"""Run every (experiment, backend, repeat) in its own process and collect comparable measurements.

For each run the harness records

* ``fit_seconds`` and ``predict_seconds`` (wall clock; time spent by the harness evaluating the
  convergence trace inside a fit is excluded),
* ``peak_rss_mb``: the run process's peak resident set size (on Linux ``VmHWM`` of ``/proc/self/status``,
  reset through ``/proc/self/clear_refs`` when the run starts: ``getrusage``'s ``ru_maxrss`` keeps the
  parent's mark across the ``exec`` of a spawned run, which then reported the harness's own peak and a fit
  growth of 0; ``ru_maxrss`` elsewhere) and ``fit_rss_mb``, the growth of that peak during fit and predict
  (the part due to the method, over the baseline of the interpreter, the libraries and the data),
* ``peak_gpu_mb``: on a CUDA device, ``torch.cuda.max_memory_allocated`` over fit and predict less what was
  allocated before the fit (NaN on the CPU),
* test metrics: RMSE, MAE and relative error ``||y - f|| / ||y||`` for regression (in the original units
  of the target); accuracy and ROC AUC for binary classification; accuracy for multi-class;
* a convergence trace: the test metric (on at most ``TRACE_TEST_POINTS`` test points) against fit time
  and, for Joker, the primal and dual objectives and the duality gap against iterations.

Isolation: each run is a separate process. By default they are forked from a multiprocessing
*forkserver* that imported torch, scikit-learn, Falkon and GPyTorch once (saving several seconds of
imports per run); ``isolation='spawn'`` starts a fresh interpreter per run instead, and is used whatever
``isolation`` says when an experiment runs on a CUDA device: a preloaded library can initialise CUDA in the
forkserver (Falkon's CUDA extension does), and CUDA cannot be used in a process forked after that (every GPU
run failed with "Cannot re-initialize CUDA in forked subprocess" on an H200). A run that raises is
recorded with status ``error`` and its message; a run that exceeds its budget (``spec.hard_seconds``:
``spec.seconds``, raised for a large ``spec.max_time``) is killed
and recorded with status ``timeout``; a process that dies (e.g. out of memory) is recorded as ``crashed``
with its exit code. ``results.csv`` is rewritten atomically after every run, so an interrupted
comparison loses nothing already measured.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from joker_ext.validation import check_choice, check_positive, check_positive_int

from . import spec as _spec
from .backends import BACKEND_MODULES, backend_class
from .benchmarks._process import maxrss_mb, reset_peak, status_mb
from .spec import TASKS, ExperimentSpec

__all__ = [
    "Trace",
    "compute_metrics",
    "primary_metric",
    "higher_is_better",
    "prepare_data",
    "run_suite",
    "run_one",
    "backend_class",
    "TRACE_TEST_POINTS",
]

#: Test points used for the convergence trace (the final metrics use the whole test split).
TRACE_TEST_POINTS = 1000
#: Seconds granted on top of ``spec.seconds`` for the run process to start and load its data.
STARTUP_GRACE = 5.0

# ---------------------------------------------------------------------------- metrics
def primary_metric(task: str) -> str:
    """The metric shown in the table: RMSE for regression, accuracy for classification."""
    return "rmse" if task == "regression" else "accuracy"


def higher_is_better(metric_name: str) -> bool:
    return metric_name in ("accuracy", "auc")


def compute_metrics(task: str, y_true: np.ndarray, scores: np.ndarray) -> Dict[str, float]:
    """Test metrics from a backend's scores.

    Regression: ``rmse``, ``mae``, ``rel_error = ||y - f|| / ||y||`` (scores are predictions in the
    target's original units). Binary: ``accuracy`` (score > 0 means class 1) and ``auc`` (ROC AUC of the
    scores). Multi-class: ``accuracy`` of the arg-max of the (n, K) scores.
    """
    check_choice("task", task, TASKS)
    y_true = np.asarray(y_true)
    s = np.asarray(scores, dtype=np.float64)
    if not np.all(np.isfinite(s)):
        raise ValueError(f"scores must be finite, got {int(np.sum(~np.isfinite(s)))} NaN or infinite values")
    if task == "regression":
        s = s.reshape(-1)
        if s.shape[0] != y_true.shape[0]:
            raise ValueError(f"scores must have {y_true.shape[0]} entries, got {s.shape[0]}")
        r = y_true - s
        norm = float(np.linalg.norm(y_true))
        return {
            "rmse": float(np.sqrt(np.mean(r * r))),
            "mae": float(np.mean(np.abs(r))),
            "rel_error": float(np.linalg.norm(r) / norm) if norm > 0 else math.nan,
        }
    if task == "binary":
        s = s.reshape(-1)
        if s.shape[0] != y_true.shape[0]:
            raise ValueError(f"scores must have {y_true.shape[0]} entries, got {s.shape[0]}")
        out = {"accuracy": float(np.mean((s > 0).astype(int) == y_true))}
        try:
            from sklearn.metrics import roc_auc_score

            out["auc"] = float(roc_auc_score(y_true, s)) if len(np.unique(y_true)) == 2 else math.nan
        except ValueError:
            out["auc"] = math.nan
        return out
    if s.ndim != 2 or s.shape[0] != y_true.shape[0]:
        raise ValueError(f"multi-class scores must have shape ({y_true.shape[0]}, K), got {s.shape}")
    return {"accuracy": float(np.mean(np.argmax(s, axis=1) == y_true))}


# ---------------------------------------------------------------------------- trace
class Trace:
    """Convergence trace of one fit: test metric (and solver quantities) against fit time.

    The runner calls :meth:`start` just before ``backend.fit``. Backends call :meth:`record` from
    their solver's callback; :attr:`X` holds the trace's test inputs and ``predict`` (a function
    ``X -> scores``) is evaluated *off the clock*: :meth:`clock` is the fit time elapsed without the
    harness's own evaluation time, and :attr:`overhead` is what the runner subtracts from the wall time.
    """

    def __init__(self, X: np.ndarray, y: np.ndarray, task: str, to_original: Callable[[np.ndarray], np.ndarray]):
        self.X = X
        self.y = y
        self.task = task
        self.metric_name = primary_metric(task)
        self._to_original = to_original
        self.points: List[Dict[str, Any]] = []
        self.overhead = 0.0
        self._t0 = time.perf_counter()
        self._paused_at: Optional[float] = None

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self.overhead = 0.0

    def clock(self) -> float:
        """Fit seconds elapsed, excluding time spent evaluating the trace."""
        now = self._paused_at if self._paused_at is not None else time.perf_counter()
        return now - self._t0 - self.overhead

    @contextlib.contextmanager
    def pause(self):
        """Time inside this block does not count as fit time."""
        if self._paused_at is not None:  # nested
            yield
            return
        self._paused_at = time.perf_counter()
        try:
            yield
        finally:
            self.overhead += time.perf_counter() - self._paused_at
            self._paused_at = None

    def sync(self, solver_seconds: float) -> None:
        """Align :meth:`clock` with a solver's own training-time account when that is smaller (e.g. Falkon
        excludes the time of its validation predictions)."""
        excess = self.clock() - float(solver_seconds)
        if excess > 0:
            self.overhead += excess

    def metric_of(self, scores) -> float:
        s = np.asarray(scores.detach().cpu().numpy() if hasattr(scores, "detach") else scores, dtype=np.float64)
        if self.task in ("regression", "binary") and s.ndim == 2:
            s = s[:, 0]
        if self.task == "regression":
            s = self._to_original(s)
        if not np.all(np.isfinite(s)):
            return math.nan
        return compute_metrics(self.task, self.y, s)[self.metric_name]

    def record(self, *, iteration: Optional[float] = None, predict: Optional[Callable] = None,
               scores=None, time_s: Optional[float] = None, **extra: Any) -> None:
        """Add a point: ``time`` (fit seconds), ``iteration``, ``metric`` (from ``predict(self.X)`` or
        ``scores``) and any ``extra`` numbers (primal, dual, gap, ...); an ``extra`` given as a function
        without arguments is called here, off the clock, like ``predict``."""
        t = self.clock() if time_s is None else float(time_s)
        with self.pause():
            point: Dict[str, Any] = {"time": t}
            if iteration is not None:
                point["iteration"] = float(iteration)
            try:
                if predict is not None:
                    scores = predict(self.X)
                if scores is not None:
                    point["metric"] = self.metric_of(scores)
            except Exception as exc:  # a failing trace evaluation must not kill the fit
                point["metric"] = math.nan
                point["trace_error"] = f"{type(exc).__name__}: {exc}"
            for k, v in extra.items():
                try:
                    if callable(v):  # a lazily computed quantity (an objective): evaluated off the clock
                        v = v()
                    point[k] = float(v)
                except (TypeError, ValueError):
                    point[k] = str(v)
                except Exception as exc:  # like a failing predict: recorded, never fatal to the fit
                    point[k] = math.nan
                    point.setdefault("trace_error", f"{k}: {type(exc).__name__}: {exc}")
            self.points.append(point)


# ---------------------------------------------------------------------------- data
@dataclass
class PreparedData:
    """A loaded data set saved for the run processes, with the spec's resolved bandwidth."""

    key: str
    folder: str
    task: str
    name: str
    n_train: int
    n_test: int
    n_features: int
    n_classes: Optional[int]
    sigma: float
    y_mean: float = 0.0
    y_std: float = 1.0
    info: Dict[str, Any] = field(default_factory=dict)

    def load(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        f = Path(self.folder)
        return tuple(np.load(f / f"{k}.npy") for k in ("X_train", "y_train", "X_test", "y_test"))  # type: ignore


def _data_key(spec: ExperimentSpec) -> str:
    parts = [spec.dataset, spec.task, spec.n_train, spec.n_test, spec.seed, spec.standardize_y, spec.data_path]
    return hashlib.sha1(json.dumps(parts, default=str).encode()).hexdigest()[:12]


def _load_capped(datasets, spec: ExperimentSpec, kw: Dict[str, Any]):
    """``datasets.load`` with n_train / n_test read as caps: a split smaller than the cap is used whole."""
    for _ in range(3):
        try:
            return datasets.load(spec.dataset, spec.task, **kw)
        except ValueError as exc:
            msg = str(exc)
            key = next((k for k in ("n_train", "n_test") if msg.startswith(k) and kw.get(k) is not None), None)
            if key is None or "at most" not in msg:
                raise
            kw = dict(kw, **{key: None})
    return datasets.load(spec.dataset, spec.task, **kw)


def prepare_data(spec: ExperimentSpec, cache_dir: str, cache: Dict[str, PreparedData]) -> PreparedData:
    """Load the spec's data once (through :func:`joker_ext.comparisons.datasets.load`), save it for the run processes
    and resolve ``sigma='median'`` on the training points (so every backend gets the same number)."""
    from . import datasets

    key = _data_key(spec)
    if key not in cache:
        kw: Dict[str, Any] = {"n_train": spec.n_train, "n_test": spec.n_test, "seed": spec.seed}
        if spec.data_path is not None:
            kw["path"] = spec.data_path
        ds = _load_capped(datasets, spec, kw)
        if ds.task == "regression" and spec.standardize_y:
            ds = _load_capped(datasets, spec, dict(kw, standardize_y=True))
        folder = Path(cache_dir) / key
        folder.mkdir(parents=True, exist_ok=True)
        y_mean = float(ds.info.get("y_mean", 0.0)) if ds.task == "regression" and spec.standardize_y else 0.0
        y_std = float(ds.info.get("y_std", 1.0)) if ds.task == "regression" and spec.standardize_y else 1.0
        for k in ("X_train", "y_train", "X_test", "y_test"):
            np.save(folder / f"{k}.npy", np.ascontiguousarray(getattr(ds, k)))
        cache[key] = PreparedData(key=key, folder=str(folder), task=ds.task, name=ds.name, n_train=ds.n_train,
                                  n_test=ds.n_test, n_features=ds.n_features, n_classes=ds.n_classes,
                                  sigma=math.nan, y_mean=y_mean, y_std=y_std,
                                  info={"X_train_sample": None})
    prep = cache[key]
    return prep


def resolve_sigma(spec: ExperimentSpec, prep: PreparedData) -> float:
    """The numeric bandwidth of the spec: itself, or the median heuristic on (a seeded subsample of) the
    training points, with the L1 distance for ``laplacian_l1``."""
    if not isinstance(spec.sigma, str):
        return float(spec.sigma)
    from joker_ext.kernels import median_heuristic

    X = np.load(Path(prep.folder) / "X_train.npy")
    metric = "l1" if spec.kernel == "laplacian_l1" else "l2"
    return float(median_heuristic(X, metric=metric, seed=spec.seed))


# ---------------------------------------------------------------------------- one run (in the child)
def _maxrss_mb() -> float:
    """Peak resident set of this process in MB: ``VmHWM`` where /proc has it (reset at a run's start by
    :func:`~joker_ext.comparisons.benchmarks._process.reset_peak`), else ``getrusage``'s ``ru_maxrss``."""
    peak = status_mb("VmHWM")
    return maxrss_mb() if math.isnan(peak) else peak


class _GpuPeak:
    """``torch.cuda.max_memory_allocated`` over a run on a CUDA device, less what was allocated at its start."""

    def __init__(self, device: str):
        self.cuda = str(device).startswith("cuda")
        self.device, self.base = str(device), 0

    def start(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)

    def mb(self) -> float:
        if not self.cuda:
            return math.nan
        import torch

        torch.cuda.synchronize(self.device)
        return (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20


def _atomic_write_json(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, default=_json_default)
    os.replace(tmp, path)


def _json_default(o: Any):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if hasattr(o, "item") and callable(o.item):
        try:
            return o.item()
        except Exception:
            pass
    return str(o)


def run_one(job: Dict[str, Any]) -> Dict[str, Any]:
    """Execute one run in the current process and return its result dict (never raises for backend
    failures: they become ``status='error'``)."""
    from .backends.base import Problem, Skip

    _spec._CHECKED_DATASETS.add(job["spec"]["dataset"])  # checked by the parent that built the job
    # The parent's registry entries for the spec's backends: one registered at run time (the harness's tests
    # register backends that fail on purpose) is then known in this run process too.
    for name, where in job.get("backend_modules", {}).items():
        BACKEND_MODULES.setdefault(name, tuple(where))
    spec = ExperimentSpec.from_dict(job["spec"])
    prep = PreparedData(**job["data"])
    result: Dict[str, Any] = {"status": "ok", "notes": [], "params": {}, "trace": [], "error": ""}
    backend = None
    reset_peak()  # this run's own mark, not the parent's (spawn)
    try:
        X_train, y_train, X_test, y_test = prep.load()
        problem = Problem(task=prep.task, n_train=prep.n_train, n_test=prep.n_test, n_features=prep.n_features,
                          n_classes=prep.n_classes, dataset=prep.name)
        cls = backend_class(job["backend"])
        backend = cls(spec, problem)
        backend.check()

        def to_original(s: np.ndarray) -> np.ndarray:
            return prep.y_std * np.asarray(s, dtype=np.float64) + prep.y_mean

        y_test_orig = to_original(y_test) if prep.task == "regression" else y_test
        rng = np.random.default_rng(spec.seed)
        m = min(TRACE_TEST_POINTS, prep.n_test)
        sub = np.sort(rng.choice(prep.n_test, size=m, replace=False)) if m < prep.n_test else np.arange(prep.n_test)
        trace = Trace(X_test[sub], y_test_orig[sub], prep.task, to_original)
        rss0 = _maxrss_mb()
        gpu = _GpuPeak(spec.device)
        gpu.start()
        trace.start()
        t0 = time.perf_counter()
        backend.fit(X_train, y_train, trace)
        fit_wall = time.perf_counter() - t0
        result["fit_seconds"] = max(0.0, fit_wall - trace.overhead)
        result["trace_overhead_seconds"] = trace.overhead
        t0 = time.perf_counter()
        scores = backend.predict(X_test)
        result["predict_seconds"] = time.perf_counter() - t0
        scores = np.asarray(scores, dtype=np.float64)
        if prep.task == "regression":
            scores = to_original(scores.reshape(-1))
        result["metrics"] = compute_metrics(prep.task, y_test_orig, scores)
        result["peak_rss_mb"] = _maxrss_mb()
        result["fit_rss_mb"] = max(0.0, result["peak_rss_mb"] - rss0)
        result["peak_gpu_mb"] = gpu.mb()
        pts = list(trace.points)
        if not pts or all("metric" not in p for p in pts):  # a direct solver: one point at the end
            pts.append({"time": result["fit_seconds"], "metric": result["metrics"][primary_metric(prep.task)]})
        result["trace"] = pts
    except Skip as exc:
        result["status"] = "skipped"
        result["error"] = str(exc)
    except Exception as exc:  # recorded, never lost
        result["status"] = "error"
        result["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    if backend is not None:
        result["notes"] = list(backend.notes)
        try:
            result["params"] = backend.params()
        except Exception as exc:  # pragma: no cover
            result["params"] = {"params_error": str(exc)}
    result.setdefault("peak_rss_mb", _maxrss_mb())
    return result


def _child_main(job: Dict[str, Any], result_path: str, log_path: str) -> None:
    """Entry point of a run process: output to the run's log file, result to ``result_path``."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    threads = job.get("threads")
    limiter = contextlib.nullcontext()
    if threads:
        import torch

        torch.set_num_threads(int(threads))
        try:
            from threadpoolctl import threadpool_limits

            limiter = threadpool_limits(int(threads))
        except ImportError:  # pragma: no cover
            pass
    with limiter:
        res = run_one(job)
    _atomic_write_json(result_path, res)
    sys.stdout.flush()
    sys.stderr.flush()


# ---------------------------------------------------------------------------- the parent
_PRELOAD = ["numpy", "scipy.linalg", "torch", "joker_ext", "joker_ext.estimators", "sklearn.kernel_ridge",
            "sklearn.svm", "sklearn.linear_model", "sklearn.metrics", "joker_ext.comparisons.runner",
            "joker_ext.comparisons.backends.base", "falkon", "gpytorch"]


def start_method(isolation: str, specs: Sequence[ExperimentSpec]) -> str:
    """The multiprocessing start method of the runs: ``isolation``, except 'spawn' when any experiment runs on
    a CUDA device (see the module docstring) or the platform has no forkserver."""
    check_choice("isolation", isolation, ("forkserver", "spawn"))
    if any(str(s.device).startswith("cuda") for s in specs):
        return "spawn"
    if isolation == "forkserver" and "forkserver" not in mp.get_all_start_methods():  # pragma: no cover
        return "spawn"
    return isolation


def _context(isolation: str):
    ctx = mp.get_context(isolation)
    if isolation == "forkserver":
        from .backends.base import package_available

        ctx.set_forkserver_preload([m for m in _PRELOAD if package_available(m.split(".")[0])])
    return ctx


def _launch(ctx, job: Dict[str, Any], run_dir: Path, timeout: float) -> Dict[str, Any]:
    result_path = str(run_dir / f"{job['run_id']}.result.json")
    log_path = str(run_dir / f"{job['run_id']}.log")
    if os.path.exists(result_path):
        os.remove(result_path)
    t0 = time.perf_counter()
    p = ctx.Process(target=_child_main, args=(job, result_path, log_path), name=f"run-{job['run_id']}")
    p.start()
    p.join(timeout)
    status = None
    if p.is_alive():
        p.kill()
        p.join(10)
        status = ("timeout", f"killed after {timeout:.0f} s (budget: --seconds {job['spec']['seconds']:g}"
                             + (f", --max-time {job['spec']['max_time']:g}" if job["spec"].get("max_time") else "")
                             + ")")
    wall = time.perf_counter() - t0
    if status is None and os.path.exists(result_path):
        with open(result_path) as fh:
            res = json.load(fh)
    else:
        if status is None:
            status = ("crashed", f"run process exited with code {p.exitcode} without a result "
                                 f"(out of memory or a native crash?); see {log_path}")
        res = {"status": status[0], "error": status[1], "notes": [], "params": {}, "trace": []}
    res["wall_seconds"] = wall
    res["log"] = log_path
    return res


def _row(spec: ExperimentSpec, backend: str, repeat: int, prep: Optional[PreparedData], sigma: float,
         res: Dict[str, Any], trace_file: str, run_id: str) -> Dict[str, Any]:
    task = prep.task if prep is not None else (spec.task or "")
    metrics = res.get("metrics", {}) or {}
    mname = primary_metric(task) if task else ""
    params = res.get("params", {}) or {}
    M = params.get("M", spec.M)
    row = {
        "experiment": spec.label,
        "run_id": run_id,
        "dataset": spec.dataset,
        "task": task,
        "backend": backend,
        "loss": spec.effective_loss,
        "kernel": spec.kernel,
        "sigma": sigma,
        "penalty": spec.penalty,
        "M": "" if M is None else M,
        "n_train": prep.n_train if prep is not None else spec.n_train,
        "n_test": prep.n_test if prep is not None else spec.n_test,
        "dtype": spec.dtype,
        "device": spec.device,
        "seed": spec.seed,
        "repeat": repeat,
        "status": res.get("status", "error"),
        "fit_seconds": res.get("fit_seconds", math.nan),
        "predict_seconds": res.get("predict_seconds", math.nan),
        "peak_rss_mb": res.get("peak_rss_mb", math.nan),
        "fit_rss_mb": res.get("fit_rss_mb", math.nan),
        "peak_gpu_mb": res.get("peak_gpu_mb", math.nan),
        "metric_name": mname,
        "metric": metrics.get(mname, math.nan) if mname else math.nan,
        "rmse": metrics.get("rmse", math.nan),
        "mae": metrics.get("mae", math.nan),
        "rel_error": metrics.get("rel_error", math.nan),
        "accuracy": metrics.get("accuracy", math.nan),
        "auc": metrics.get("auc", math.nan),
        "wall_seconds": res.get("wall_seconds", math.nan),
        "params": json.dumps(params, default=_json_default, sort_keys=True),
        "notes": " | ".join(res.get("notes", []) or []),
        "error": res.get("error", ""),
        "trace_file": trace_file,
    }
    return row


def run_suite(
    specs: Sequence[ExperimentSpec],
    out: str = "results",
    *,
    isolation: str = "forkserver",
    echo: Optional[Callable[[str], None]] = print,
    threads: Optional[int] = None,
    startup_grace: float = STARTUP_GRACE,
) -> List[Dict[str, Any]]:
    """Run every experiment of ``specs`` with each of its backends (and repeats), one process per run.

    Rows are appended to ``out/results.csv`` (rewritten atomically after each run); traces go to
    ``out/traces/<run_id>.json`` and run logs to ``out/logs/``. Returns the rows.

    Parameters
    ----------
    specs : sequence of ExperimentSpec
    out : str
        Output folder.
    isolation : {'forkserver', 'spawn'}
        How run processes start (see the module docstring; 'spawn' whenever an experiment runs on CUDA).
    echo : callable, optional
        Receives one progress line per run.
    threads : int, optional
        CPU threads of each run (torch and BLAS).
    startup_grace : float
        Seconds added to ``spec.seconds`` before a run is killed (process start and data loading).
    """
    from .backends.base import Problem, Skip
    from .reporting import write_csv

    if isinstance(specs, ExperimentSpec) or isinstance(specs, (str, bytes, dict)) or not hasattr(specs, "__iter__"):
        raise TypeError(f"specs must be a sequence of ExperimentSpec, got {type(specs).__name__}")
    specs = list(specs)
    for s in specs:
        if not isinstance(s, ExperimentSpec):
            raise TypeError(f"specs must be a sequence of ExperimentSpec, got an element of type {type(s).__name__}")
    check_choice("isolation", isolation, ("forkserver", "spawn"))
    threads = check_positive_int("threads", threads, allow_none=True)
    startup_grace = check_positive("startup_grace", startup_grace, allow_zero=True)
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out must be a folder path (str), got {type(out).__name__}")
    outp = Path(out)
    (outp / "traces").mkdir(parents=True, exist_ok=True)
    (outp / "logs").mkdir(parents=True, exist_ok=True)
    csv_path = outp / "results.csv"
    rows: List[Dict[str, Any]] = []
    say = echo or (lambda s: None)
    ctx = None
    cache: Dict[str, PreparedData] = {}
    done_exact: Dict[Tuple[str, str, int], bool] = {}
    with tempfile.TemporaryDirectory(prefix="joker-compare-") as tmp:
        for si, spec in enumerate(specs):
            prep, sigma, data_error = None, math.nan, ""
            try:
                prep = prepare_data(spec, tmp, cache)
                sigma = resolve_sigma(spec, prep)
            except Exception as exc:  # a data problem is recorded for each backend
                data_error = f"data: {type(exc).__name__}: {exc}"
            if prep is not None and spec.task is None:
                spec = spec.replace(task=prep.task)
            spec_run = spec if prep is None else spec.replace(sigma=sigma)
            for backend in spec.backends:
                for r in range(spec.repeats):
                    run_spec = spec_run.replace(seed=spec.seed + r) if r else spec_run
                    ident = json.dumps([spec_run.to_dict(), backend, r], sort_keys=True, default=str)
                    run_id = f"{spec.label}-{backend}-M{spec.M or 'exact'}-r{r}-" + \
                        hashlib.sha1(ident.encode()).hexdigest()[:6]
                    run_id = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run_id)
                    if data_error:
                        res = {"status": "error", "error": data_error}
                        rows.append(_row(spec, backend, r, None, sigma, res, "", run_id))
                        write_csv(rows, csv_path)
                        say(f"[{len(rows)}] {spec.label} {backend}: error ({data_error})")
                        continue
                    problem = Problem(task=prep.task, n_train=prep.n_train, n_test=prep.n_test,
                                      n_features=prep.n_features, n_classes=prep.n_classes, dataset=prep.name)
                    b = None
                    try:
                        cls = backend_class(backend)
                        b = cls(run_spec, problem)
                        b.check()
                    except Skip as exc:
                        res = {"status": "skipped", "error": str(exc), "notes": list(getattr(b, "notes", []))}
                        rows.append(_row(spec, backend, r, prep, sigma, res, "", run_id))
                        write_csv(rows, csv_path)
                        say(f"[{len(rows)}] {spec.label} {backend}: skipped ({exc})")
                        continue
                    except Exception as exc:
                        res = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
                        rows.append(_row(spec, backend, r, prep, sigma, res, "", run_id))
                        write_csv(rows, csv_path)
                        say(f"[{len(rows)}] {spec.label} {backend}: error ({res['error']})")
                        continue
                    if not cls.uses_M:
                        key_spec = spec_run.replace(M=None).to_json()
                        key = (key_spec, backend, r)
                        if key in done_exact:
                            continue  # M does not change this backend: already run for this problem
                        done_exact[key] = True
                    if ctx is None:
                        ctx = _context(start_method(isolation, specs))
                    job = {"spec": run_spec.to_dict(), "backend": backend, "repeat": r, "run_id": run_id,
                           "data": prep.__dict__, "threads": threads,
                           "backend_modules": {b: BACKEND_MODULES[b] for b in spec.backends}}
                    res = _launch(ctx, job, outp / "logs", run_spec.hard_seconds + startup_grace)
                    trace_file = ""
                    if res.get("trace"):
                        trace_file = str(Path("traces") / f"{run_id}.json")
                        _atomic_write_json(str(outp / trace_file), {
                            "experiment": spec.label, "backend": backend, "M": res.get("params", {}).get("M", spec.M),
                            "metric_name": primary_metric(prep.task), "points": res["trace"]})
                    row = _row(spec, backend, r, prep, sigma, res, trace_file, run_id)
                    rows.append(row)
                    write_csv(rows, csv_path)
                    if row["status"] == "ok":
                        say(f"[{len(rows)}] {spec.label} {backend} M={row['M']}: {row['metric_name']}="
                            f"{row['metric']:.4g} fit {row['fit_seconds']:.2f}s peak {row['peak_rss_mb']:.0f}MB"
                            + (f" GPU {row['peak_gpu_mb']:.0f}MB" if math.isfinite(row["peak_gpu_mb"]) else ""))
                    else:
                        say(f"[{len(rows)}] {spec.label} {backend}: {row['status']} ({row['error']})")
    return rows
