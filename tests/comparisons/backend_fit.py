"""Fit one harness backend in this process on a Dataset (shared by test_harness.py and test_traces.py;
pytest puts this folder on ``sys.path``)."""
from joker_ext.comparisons.backends.base import Problem
from joker_ext.comparisons.runner import Trace, backend_class


def fit_backend(name, spec, ds, start=False):
    """Check and fit backend ``name`` under ``spec`` on ``ds``'s training split; returns the backend and its
    Trace (scored on the test split; ``start=True`` starts the trace's clock before the fit)."""
    problem = Problem(ds.task, ds.n_train, ds.n_test, ds.n_features, ds.n_classes, ds.name)
    b = backend_class(name)(spec, problem)
    b.check()
    trace = Trace(ds.X_test, ds.y_test, ds.task, lambda s: s)
    if start:
        trace.start()
    b.fit(ds.X_train, ds.y_train, trace)
    return b, trace
