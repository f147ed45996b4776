"""Every seed solver reports a convergence trace through the harness (issue #16).

EigenPro 2/3, ASkotch, doubly stochastic gradients and the ADMM SVM must each give the harness's
metric-against-time figure several points, not one. The in-process tests check each backend's trace against
an independent reference: the last trace point's metric is the metric of the fitted model's own test scores
computed here with scikit-learn's metric functions, and a run to convergence ends at scikit-learn's answer.
The end-to-end test runs the harness (one process per run) and reads the points the figure draws.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, mean_squared_error

from joker_ext.comparisons import datasets as D
from joker_ext.comparisons.reporting import convergence_curve, make_figures, trace_curve
from joker_ext.comparisons.runner import run_suite
from joker_ext.comparisons.spec import ExperimentSpec

from backend_fit import fit_backend

SQUARED = ("eigenpro2", "eigenpro3", "askotch", "dsg")


@pytest.fixture(scope="module")
def flights():
    return D.load("flights", "regression", n_train=400, n_test=200, seed=2, standardize_y=True)


@pytest.fixture(scope="module")
def magic():
    return D.load("magic", "binary", n_train=400, n_test=200, seed=2)


def _fit(name, spec, ds):
    return fit_backend(name, spec, ds, start=True)


def _metric_points(trace):
    return [p for p in trace.points if "metric" in p and math.isfinite(p["metric"])]


@pytest.mark.parametrize("name", SQUARED)
def test_squared_loss_solvers_report_a_trace(flights, name):
    spec = ExperimentSpec(dataset="flights", task="regression", sigma=5.0, penalty=1e-4, M=200, n_train=400,
                          epochs=4)
    b, trace = _fit(name, spec, flights)
    pts = _metric_points(trace)
    assert len(pts) >= 3, f"{name} reported {len(pts)} trace point(s): {trace.points}"
    times = [p["time"] for p in pts]
    assert times == sorted(times) and times[-1] > 0
    rmse = math.sqrt(mean_squared_error(flights.y_test, np.asarray(b.predict(flights.X_test))))
    assert pts[-1]["metric"] == pytest.approx(rmse, rel=1e-9)
    if name != "dsg":  # EigenPro 2/3 and ASkotch also trace their relative residual
        assert sum("relative_residual" in p for p in pts) >= 3


def test_joker_random_features_trace_the_iterates_inside_the_conjugate_gradients():
    """With the squared loss the feature Newton engine's fit is one CG run: the trace holds its iterates (not only
    the start and the end), with the primal objective decreasing along them (CG minimises it), and ends at the
    fitted model. (n well above the preconditioner's rank, else CG is done in one step.)"""
    flights = D.load("flights", "regression", n_train=3000, n_test=300, seed=2, standardize_y=True)
    spec = ExperimentSpec(dataset="flights", task="regression", sigma=5.0, penalty=1e-6, M=1500, n_train=3000,
                          tol=1e-10)
    b, trace = _fit("joker_rf", spec, flights)
    pts = _metric_points(trace)
    assert b.params()["n_iter"] <= 2 and len(pts) >= 6, trace.points
    primal = [p["primal"] for p in pts]
    assert primal[-1] < primal[0] and all(a >= c - 1e-9 * abs(c) for a, c in zip(primal, primal[1:]))
    rmse = math.sqrt(mean_squared_error(flights.y_test, np.asarray(b.predict(flights.X_test))))
    assert pts[-1]["metric"] == pytest.approx(rmse, rel=1e-9)


def test_admm_svm_reports_a_thinned_trace_that_ends_at_svc(magic):
    """The ADMM callback scores its iterate (it had no predictor: the figure showed one point); thousands of
    iterations are thinned to a few dozen points, and the last one is the converged SVM, as SVC's."""
    from sklearn.svm import SVC

    penalty, sigma = 1e-3, 3.0
    spec = ExperimentSpec(dataset="magic", task="binary", loss="hinge", sigma=sigma, penalty=penalty,
                          n_train=400, tol=1e-6)
    b, trace = _fit("admm_svm", spec, magic)
    pts = _metric_points(trace)
    n_iter = b.params()["n_iter"]
    assert len(pts) >= 10 and len(pts) <= 30 + 2 * math.log(max(n_iter, 2)) / math.log(1.15), (len(pts), n_iter)
    assert [p["iteration"] for p in pts][-1] == n_iter  # the last iteration is always recorded
    assert all("objective" in p and "primal_residual" in p for p in pts)
    objective = [p["objective"] for p in pts]
    assert objective[-1] < objective[0]
    ours = np.asarray(b.predict(magic.X_test))
    assert pts[-1]["metric"] == pytest.approx(accuracy_score(magic.y_test, ours > 0), abs=1e-12)
    svc = SVC(C=1.0 / (magic.n_train * penalty), kernel="rbf", gamma=1.0 / (2 * sigma ** 2), tol=1e-8)
    svc.fit(magic.X_train, magic.y_train)
    assert np.mean((ours > 0) == (svc.decision_function(magic.X_test) > 0)) >= 0.99


def test_every_seed_backend_draws_a_curve_in_the_harness_figure(tmp_path):
    """Through run_suite (one process per run) and the figure's own reading of the trace files: a backend that
    reports a single point fails here."""
    common = dict(sigma=5.0, penalty=1e-4, n_train=300, n_test=200, epochs=3, seconds=120)
    specs = [
        ExperimentSpec(dataset="flights", task="regression", M=150, backends=SQUARED, name="reg", **common),
        ExperimentSpec(dataset="magic", task="binary", loss="hinge", backends=("admm_svm", "dsg"), name="hinge",
                       **common),
    ]
    rows = run_suite(specs, str(tmp_path), isolation="spawn", echo=None, threads=1)
    assert [r["status"] for r in rows] == ["ok"] * 6, [(r["backend"], r["status"], r["error"]) for r in rows]
    for r in rows:
        pts = trace_curve(tmp_path, r)
        assert len(pts) > 1, f"{r['experiment']} {r['backend']}: {len(pts)} point(s) in the figure"
        assert pts[-1]["metric"] == pytest.approx(r["metric"], rel=1e-9)  # the trace ends at the final model
        if r["backend"] != "dsg":
            key, conv = convergence_curve(tmp_path, r)
            assert key is not None and len(conv) > 1, r["backend"]
    figures = make_figures(rows, tmp_path)
    for exp in ("reg", "hinge"):
        assert str(tmp_path / f"metric_vs_time_{exp}.png") in figures
        assert str(tmp_path / f"convergence_vs_time_{exp}.png") in figures
