"""Tests of the comparison harness (joker_ext.comparisons.spec, runner, backends, reporting, __main__).

References are independent of the code under test: scikit-learn's KernelRidge / LogisticRegression /
LinearSVC, Falkon and GPyTorch themselves (the same problem solved by other libraries), the closed-form KRR
solution, scikit-learn's metric functions, and properties that must hold (a crashed run is recorded, a
run over budget is killed, the CSV is complete).
"""
from __future__ import annotations

import csv
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from joker_ext.comparisons import datasets as D
from joker_ext.comparisons.backends.base import Problem, Skip, pm_targets
from joker_ext.comparisons.reporting import (CSV_COLUMNS, make_figures, markdown_table, read_csv, relative_gap_to_best,
                                   write_csv)
from joker_ext.comparisons.runner import (backend_class, compute_metrics, prepare_data, resolve_sigma, run_one,
                                          run_suite, start_method)
from joker_ext.comparisons.spec import ALL_BACKENDS, ExperimentSpec, load_toml, quick_suite, spec_from_args

from backend_fit import fit_backend

REQUIRED_COLUMNS = ["dataset", "task", "backend", "loss", "kernel", "sigma", "penalty", "M", "fit_seconds",
                    "predict_seconds", "peak_rss_mb", "metric_name", "metric", "notes"]


# ---------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def flights_small():
    return D.load("flights", "regression", n_train=300, n_test=200, seed=1, standardize_y=True)


@pytest.fixture(scope="module")
def magic_small():
    return D.load("magic", "binary", n_train=300, n_test=200, seed=1)


def _fit_predict(name, spec, ds):
    """Run one backend in this process on a Dataset; return its test scores and the backend."""
    b, _ = fit_backend(name, spec, ds)
    return np.asarray(b.predict(ds.X_test), dtype=np.float64), b


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ---------------------------------------------------------------------------- the mapping: same problem
@pytest.mark.parametrize("kernel", ["gaussian", "laplacian", "matern"])
def test_exact_krr_same_predictions_across_libraries(flights_small, kernel):
    """With exact kernels and M = n, Joker, Falkon, scikit-learn and GPyTorch solve one KRR problem."""
    ds = flights_small
    n = ds.n_train
    penalty, sigma = 1e-3, 5.0
    spec = ExperimentSpec(dataset="flights", task="regression", kernel=kernel, sigma=sigma, nu=1.5,
                          penalty=penalty, M=None, n_train=n, tol=1e-12,
                          options={"joker": {"block_size": n, "max_iter": 300}, "falkon": {"maxiter": 200}})
    # closed form of Falkon's problem: (K + n lam I) a = y
    from joker_ext.kernels import make_kernel
    import torch

    k = make_kernel(kernel, sigma, nu=1.5 if kernel == "matern" else None)
    Xtr, Xte = torch.as_tensor(ds.X_train), torch.as_tensor(ds.X_test)
    a = torch.linalg.solve(k(Xtr, Xtr) + n * penalty * torch.eye(n, dtype=torch.float64),
                           torch.as_tensor(ds.y_train))
    ref = (k(Xte, Xtr) @ a).numpy()
    names = ["joker", "sklearn", "gpytorch"]
    try:
        import falkon  # noqa: F401

        names.append("falkon")
    except ImportError:
        pass
    for name in names:
        pred, b = _fit_predict(name, spec, ds)
        assert pred.shape == ref.shape
        assert _rel(pred, ref) < 1e-6, (name, _rel(pred, ref), b.params())


def test_exact_classification_squared_loss_same_scores(magic_small):
    """Least squares on -1/+1 labels: Joker, scikit-learn (KernelRidge), GPyTorch, Falkon agree."""
    pytest.importorskip("falkon")
    ds = magic_small
    n = ds.n_train
    spec = ExperimentSpec(dataset="magic", task="binary", loss="squared", sigma=3.0, penalty=1e-4, n_train=n,
                          tol=1e-12, options={"joker": {"block_size": n, "max_iter": 300},
                                              "falkon": {"maxiter": 300}})
    preds = {name: _fit_predict(name, spec, ds)[0] for name in ("joker", "sklearn", "gpytorch", "falkon")}
    for name, p in preds.items():
        assert _rel(p, preds["sklearn"]) < 1e-6, name


def test_logistic_mapping_joker_sklearn_falkon(magic_small):
    """Logistic loss: C = 1/(n lambda) in Joker, LogisticRegression on exact kernel features and LogisticFalkon
    (M = n) give the same decision function."""
    ds = magic_small
    n = ds.n_train
    spec = ExperimentSpec(dataset="magic", task="binary", loss="logistic", sigma=3.0, penalty=1e-3, n_train=n,
                          tol=1e-10, options={"joker": {"block_size": n, "max_iter": 400},
                                              "sklearn": {"tol": 1e-12, "max_iter": 20000}})
    pj, bj = _fit_predict("joker", spec, ds)
    ps, _ = _fit_predict("sklearn", spec, ds)
    assert bj.params()["status"] == "converged"
    assert _rel(pj, ps) < 1e-4
    try:
        import falkon  # noqa: F401
    except ImportError:
        return
    # one Newton step per penalty_list entry: end with several steps at the spec's penalty
    spec_f = spec.replace(options={"falkon": {"penalty_list": [1e-1, 1e-2] + [1e-3] * 4,
                                              "iter_list": [5, 5] + [25] * 4}})
    pf, _ = _fit_predict("falkon", spec_f, ds)
    assert _rel(pf, pj) < 1e-4


def test_squared_hinge_mapping_halves_C_for_liblinear(magic_small):
    """Joker's squared hinge carries a 1/2; LinearSVC's does not: C_sklearn = C / 2 gives the same model."""
    ds = magic_small
    n = ds.n_train
    spec = ExperimentSpec(dataset="magic", task="binary", loss="squared_hinge", sigma=3.0, penalty=1e-3,
                          n_train=n, tol=1e-10, options={"joker": {"block_size": n, "max_iter": 400},
                                                         "sklearn": {"tol": 1e-10, "max_iter": 200000}})
    pj, bj = _fit_predict("joker", spec, ds)
    ps, bs = _fit_predict("sklearn", spec, ds)
    assert bs.params()["C"] == pytest.approx(bj.params()["C"] / 2)
    assert _rel(pj, ps) < 1e-3


def test_backends_skip_what_they_cannot_solve():
    spec = ExperimentSpec(dataset="magic", task="binary", loss="hinge", sigma=1.0)
    problem = Problem("binary", 100, 10, 3, 2)
    for name in ("gpytorch", "eigenpro2", "eigenpro3", "askotch"):
        with pytest.raises(Skip, match="hinge"):
            backend_class(name)(spec, problem).check()
    spec_l1 = ExperimentSpec(dataset="flights", task="regression", kernel="laplacian_l1", sigma=1.0)
    with pytest.raises(Skip, match="L1"):
        backend_class("gpytorch")(spec_l1, Problem("regression", 100, 10, 3)).check()
    big = ExperimentSpec(dataset="flights", task="regression", sigma=1.0)
    with pytest.raises(Skip, match="max_n"):
        backend_class("sklearn")(big, Problem("regression", 50_000, 10, 3)).check()
    with pytest.raises(ValueError, match="block_sise"):
        backend_class("joker")(big.replace(options={"joker": {"block_sise": 3}}),
                               Problem("regression", 100, 10, 3)).check()


def test_eigenpro_notes_say_the_penalty_is_not_honoured():
    spec = ExperimentSpec(dataset="flights", task="regression", sigma=2.0, M=50, epochs=1,
                          options={"eigenpro2": {"ridge": False}})
    ds = D.synthetic("regression", n=200, d=3, seed=0)
    _, b2 = _fit_predict("eigenpro2", spec, ds)
    assert any("NOT honoured" in s for s in b2.notes)
    assert b2.params()["ridge"] == 0.0
    _, b3 = _fit_predict("eigenpro3", spec, ds)
    assert any("ridge" in s.lower() and "ignored" in s for s in b3.notes)


# ---------------------------------------------------------------------------- Joker vs the best backend
@pytest.mark.parametrize("name,task,penalty", [("flights", "regression", 1e-4), ("magic", "binary", 1e-5)])
def test_joker_within_two_percent_of_best_on_real_data(tmp_path, name, task, penalty):
    """Matched hyperparameters on flights and magic (1,000 training points): Joker's test metric is within
    2% of the best of Falkon, scikit-learn, GPyTorch and Joker itself."""
    spec = ExperimentSpec(dataset=name, task=task, loss="squared", sigma="median", penalty=penalty, M=500,
                          n_train=1000, n_test=1000, seed=0)
    cache = {}
    prep = prepare_data(spec, str(tmp_path), cache)
    sigma = resolve_sigma(spec, prep)
    backends = ["joker", "sklearn", "gpytorch"]
    try:
        import falkon  # noqa: F401

        backends.append("falkon")
    except ImportError:
        pass
    metrics = {}
    for b in backends:
        res = run_one({"spec": spec.replace(sigma=sigma).to_dict(), "backend": b, "data": prep.__dict__})
        assert res["status"] == "ok", (b, res["error"])
        metrics[b] = res["metrics"]["rmse" if task == "regression" else "accuracy"]
    if task == "regression":
        assert metrics["joker"] <= 1.02 * min(metrics.values()), metrics
    else:
        assert metrics["joker"] >= 0.98 * max(metrics.values()), metrics


# ---------------------------------------------------------------------------- metrics
def test_metrics_match_sklearn():
    from sklearn.metrics import accuracy_score, mean_absolute_error, mean_squared_error, roc_auc_score

    rng = np.random.default_rng(0)
    y = rng.normal(size=50)
    f = y + rng.normal(scale=0.3, size=50)
    m = compute_metrics("regression", y, f)
    assert m["rmse"] == pytest.approx(math.sqrt(mean_squared_error(y, f)))
    assert m["mae"] == pytest.approx(mean_absolute_error(y, f))
    assert m["rel_error"] == pytest.approx(np.linalg.norm(y - f) / np.linalg.norm(y))
    yc = rng.integers(0, 2, size=60)
    s = rng.normal(size=60) + (yc - 0.5)
    m = compute_metrics("binary", yc, s)
    assert m["accuracy"] == pytest.approx(accuracy_score(yc, (s > 0).astype(int)))
    assert m["auc"] == pytest.approx(roc_auc_score(yc, s))
    ym = rng.integers(0, 3, size=40)
    S = rng.normal(size=(40, 3))
    assert compute_metrics("multiclass", ym, S)["accuracy"] == pytest.approx(accuracy_score(ym, S.argmax(1)))
    with pytest.raises(ValueError, match="finite"):
        compute_metrics("regression", y, np.full(50, np.nan))


def test_pm_targets():
    assert pm_targets(np.array([0, 1, 1]), "binary").tolist() == [-1.0, 1.0, 1.0]
    T = pm_targets(np.array([0, 2, 1]), "multiclass", 3)
    assert T.tolist() == [[1, -1, -1], [-1, -1, 1], [-1, 1, -1]]


# ---------------------------------------------------------------------------- spec / CLI / TOML
def test_spec_validation_names_the_field():
    with pytest.raises(ValueError, match="penalty"):
        ExperimentSpec(penalty=-1.0)
    with pytest.raises(ValueError, match="kernel"):
        ExperimentSpec(kernel="rbf")
    with pytest.raises(ValueError, match="loss"):
        ExperimentSpec(task="regression", loss="hinge")
    with pytest.raises(ValueError, match="backends"):
        ExperimentSpec(backends="joker,nonsense")
    with pytest.raises(TypeError, match="M"):
        ExperimentSpec(M="many")
    with pytest.raises(ValueError, match="unknown experiment keys"):
        ExperimentSpec.from_dict({"datset": "flights"})
    s = ExperimentSpec(sigma="2.5", backends="all")
    assert s.sigma == 2.5 and s.backends == ALL_BACKENDS


def test_cli_flags():
    specs, run = spec_from_args(["--dataset", "magic", "--loss", "logistic", "--penalty", "1e-6", "--M", "100,exact",
                                 "--backends", "joker,falkon", "--n-train", "500", "--seed", "3", "--out", "o",
                                 "--option", "joker.block_size=256", "--option", "falkon.keops_active=\"no\"",
                                 "--sigma", "median", "--seconds", "30", "--threads", "1"])
    assert [s.M for s in specs] == [100, None]
    s = specs[0]
    assert (s.dataset, s.loss, s.penalty, s.n_train, s.seed, s.seconds) == ("magic", "logistic", 1e-6, 500, 3, 30.0)
    assert s.backends == ("joker", "falkon")
    assert s.options == {"joker": {"block_size": 256}, "falkon": {"keops_active": "no"}}
    assert run["out"] == "o" and run["threads"] == 1
    q, run = spec_from_args(["--quick", "--backends", "joker,sklearn"])
    assert run["out"] == "results/quick" and run["threads"] == 1
    assert all(set(s.backends) <= {"joker", "sklearn"} for s in q)
    assert {s.dataset for s in q} == {"flights", "magic"}
    with pytest.raises(ValueError, match="--option"):
        spec_from_args(["--option", "nodot=1"])


def test_max_time_flag_reaches_every_iterative_backend(flights_small):
    """--max-time is one flag for a comparison at equal time: each seed solver gets it as its time budget."""
    specs, _ = spec_from_args(["--dataset", "flights", "--max-time", "42", "--seconds", "30"])
    s = specs[0]
    assert s.max_time == 42.0 and s.soft_seconds == 42.0
    assert s.hard_seconds >= 1.5 * 42  # the kill leaves the solver time to stop and predict
    assert ExperimentSpec(seconds=100).soft_seconds == 70.0 and ExperimentSpec(seconds=100).hard_seconds == 100.0
    ds = flights_small
    problem = Problem(ds.task, ds.n_train, ds.n_test, ds.n_features, ds.n_classes, ds.name)
    for name in ("eigenpro2", "eigenpro3", "askotch", "dsg"):
        b = backend_class(name)(s.replace(sigma=5.0, M=50), problem)
        assert b.make_solver(b.solver_class(), None).max_time == 42.0, name
    with pytest.raises(ValueError, match="max_time"):
        ExperimentSpec(max_time=-1.0)


def test_quick_suite_covers_the_required_backends():
    specs = quick_suite()
    names = {b for s in specs for b in s.backends}
    assert {"joker", "falkon", "sklearn", "eigenpro2", "eigenpro3"} <= names
    assert {(s.dataset, s.task) for s in specs} >= {("flights", "regression"), ("magic", "binary")}


def test_toml(tmp_path):
    p = tmp_path / "exp.toml"
    p.write_text(
        'out = "res"\n'
        "[defaults]\n"
        'kernel = "laplacian"\n'
        "penalty = 1e-4\n"
        'backends = ["joker", "sklearn"]\n'
        "[[experiment]]\n"
        'dataset = "flights"\n'
        "M = [10, 20]\n"
        "[[experiment]]\n"
        'dataset = "magic"\n'
        'loss = "hinge"\n'
        "[options.joker]\n"
        "block_size = 64\n"
    )
    specs, run = load_toml(p)
    assert run == {"out": "res"}
    assert [(s.dataset, s.M) for s in specs] == [("flights", 10), ("flights", 20), ("magic", None)]
    assert all(s.kernel == "laplacian" and s.penalty == 1e-4 for s in specs)
    assert specs[2].loss == "hinge" and specs[0].options == {"joker": {"block_size": 64}}
    specs2, run2 = spec_from_args(["--config", str(p), "--penalty", "1e-2"])
    assert all(s.penalty == 1e-2 for s in specs2) and run2["out"] == "res"
    bad = tmp_path / "bad.toml"
    bad.write_text('dataset = "flights"\nkernal = "gaussian"\n')
    with pytest.raises(ValueError, match="kernal"):
        load_toml(bad)


# ---------------------------------------------------------------------------- reporting
def _fake_rows(tmp_path):
    rows = []
    for b, m, M in (("joker", 1.00, ""), ("falkon", 1.02, 100), ("falkon", 1.05, 50), ("eigenpro2", math.nan, "")):
        rid = f"e-{b}-{M}"
        trace = {"points": [{"time": 0.1, "iteration": 1, "metric": 2.0, "primal": 10.0, "dual": 1.0, "rel_gap": 0.9},
                            {"time": 0.5, "iteration": 2, "metric": m, "primal": 5.0, "dual": 4.9, "rel_gap": 0.02}]}
        (tmp_path / "traces").mkdir(exist_ok=True)
        (tmp_path / "traces" / f"{rid}.json").write_text(json.dumps(trace))
        rows.append({"experiment": "e", "run_id": rid, "dataset": "d", "task": "regression", "backend": b,
                     "loss": "squared", "kernel": "gaussian", "sigma": 1.0, "penalty": 1e-3, "M": M,
                     "n_train": 10, "n_test": 5, "status": "ok" if m == m else "error", "fit_seconds": 0.5,
                     "predict_seconds": 0.1, "peak_rss_mb": 300.0, "fit_rss_mb": 10.0 + (M or 0),
                     "metric_name": "rmse", "metric": m, "notes": "a | note", "error": "" if m == m else "boom",
                     "trace_file": f"traces/{rid}.json", "repeat": 0})
    return rows


def test_csv_table_and_figures(tmp_path):
    rows = _fake_rows(tmp_path)
    write_csv(rows, tmp_path / "results.csv")
    back = read_csv(tmp_path / "results.csv")
    with open(tmp_path / "results.csv") as fh:
        header = next(csv.reader(fh))
    assert set(REQUIRED_COLUMNS) <= set(header) and header[: len(CSV_COLUMNS)] == CSV_COLUMNS
    assert [r["backend"] for r in back] == ["joker", "falkon", "falkon", "eigenpro2"]
    assert back[1]["metric"] == pytest.approx(1.02) and math.isnan(back[3]["metric"])
    table = markdown_table(back)
    assert "| joker |" in table and "boom" in table and "+2.00%" in table
    gaps = relative_gap_to_best(back[:3])
    assert gaps[0] == 0.0 and gaps[1] == pytest.approx(2.0)
    figs = make_figures(back, tmp_path)
    # metric and convergence measure (Joker's gap) against time, model size, Joker's objectives
    assert sorted(Path(f).name.split("_")[0] for f in figs) == ["convergence", "joker", "metric", "model"]
    for f in figs:
        assert Path(f).stat().st_size > 5000 and Path(f).read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------------------- the harness end to end
@pytest.fixture
def fault_backends(monkeypatch):
    """Register the backends that fail on purpose (``fault_backends.py`` beside this file) for one test."""
    from joker_ext.comparisons.backends import BACKEND_MODULES

    for name, cls in (("_crash", "CrashBackend"), ("_hang", "HangBackend"), ("_die", "DieBackend"),
                      ("_alloc", "AllocBackend")):
        monkeypatch.setitem(BACKEND_MODULES, name, ("fault_backends", cls))


def test_cuda_runs_start_fresh_interpreters():
    """CUDA cannot be used in a process forked from one that initialised it (the forkserver's preloads can):
    any experiment on a CUDA device makes every run spawn; CPU experiments keep the isolation asked for."""
    cpu = ExperimentSpec(dataset="flights")
    gpu = ExperimentSpec(dataset="flights")
    gpu.device = "cuda:0"  # set after validation: this machine may have no GPU
    assert start_method("spawn", [cpu]) == "spawn"
    assert start_method("forkserver", [cpu, gpu]) == "spawn"
    assert start_method("spawn", [gpu]) == "spawn"
    import multiprocessing as mp

    if "forkserver" in mp.get_all_start_methods():
        assert start_method("forkserver", [cpu]) == "forkserver"
    with pytest.raises(ValueError, match="isolation"):
        start_method("fork", [cpu])


def test_main_end_to_end_records_failures(tmp_path, fault_backends):
    """Subprocess runs: good backends are measured; a crash, a hang (killed at the budget) and a dying
    process are recorded with their errors, and results.csv keeps every row."""
    from joker_ext.comparisons.__main__ import main

    out = tmp_path / "out"
    t0 = time.perf_counter()
    code = main(["--dataset", "diabetes", "--n-train", "200", "--n-test", "100", "--penalty", "1e-3",
                 "--backends", "joker,sklearn,_crash,_die", "--out", str(out), "--seconds", "60", "--threads", "1"])
    assert code == 0
    rows = read_csv(out / "results.csv")
    status = {r["backend"]: r for r in rows}
    assert status["joker"]["status"] == "ok" and status["sklearn"]["status"] == "ok"
    assert status["joker"]["metric"] == pytest.approx(status["sklearn"]["metric"], rel=1e-4)
    for r in (status["joker"], status["sklearn"]):
        assert r["fit_seconds"] > 0 and r["peak_rss_mb"] > 50 and r["metric_name"] == "rmse"
        assert r["sigma"] > 0 and r["penalty"] == 1e-3
    assert status["_crash"]["status"] == "error" and "deliberate failure" in status["_crash"]["error"]
    assert "on purpose" in status["_crash"]["notes"]
    assert status["_die"]["status"] == "crashed"
    assert (out / "results.md").is_file() and list(out.glob("metric_vs_time_*.png"))
    # the time budget is enforced by killing the run process
    spec = ExperimentSpec(dataset="diabetes", n_train=100, n_test=50, sigma=1.0, seconds=1.0,
                          backends=("_hang",))
    t1 = time.perf_counter()
    rows2 = run_suite([spec], str(tmp_path / "out2"), echo=None, startup_grace=2.0)
    assert rows2[0]["status"] == "timeout" and "killed" in rows2[0]["error"]
    assert time.perf_counter() - t1 < 30
    assert read_csv(tmp_path / "out2" / "results.csv")[0]["status"] == "timeout"


@pytest.mark.parametrize("isolation", ["spawn", "forkserver"])
def test_memory_columns_are_the_run_process_own(tmp_path, fault_backends, isolation):
    """A run that touches ALLOC_MB MB reports that growth, also when spawned from a parent whose own peak is far
    higher (getrusage's ru_maxrss carries the parent's mark across exec: spawned runs reported a growth of 0)."""
    from fault_backends import ALLOC_MB

    parent = np.ones(3 * ALLOC_MB * 2**20 // 8)  # the parent's peak: above anything the run reaches
    spec = ExperimentSpec(dataset="diabetes", n_train=100, n_test=50, sigma=1.0, backends=("_alloc",))
    row = run_suite([spec], str(tmp_path), isolation=isolation, echo=None, threads=1)[0]
    del parent
    assert row["status"] == "ok"
    assert 0.9 * ALLOC_MB <= row["fit_rss_mb"] <= 1.5 * ALLOC_MB
    assert row["peak_rss_mb"] >= row["fit_rss_mb"]
    assert math.isnan(row["peak_gpu_mb"])  # a CPU run has no GPU peak


def test_falkon_backend_skips_with_a_note_when_not_installed(monkeypatch):
    import joker_ext.comparisons.backends.base as base

    monkeypatch.setattr(base, "package_available", lambda name: name != "falkon")
    spec = ExperimentSpec(dataset="flights", task="regression", sigma=1.0)
    with pytest.raises(Skip, match="falkon is not installed"):
        backend_class("falkon")(spec, Problem("regression", 100, 10, 3)).check()
