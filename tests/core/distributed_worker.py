"""One process of the 2-process Gloo tests of tests/core/test_distributed.py.

Run as ``python distributed_worker.py SCENARIO OUTDIR`` with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set (the test starts both ranks on loopback). Rank 0 writes what the test checks to OUTDIR.
The data and the cases are defined here once, so that the test fits the same cases in one process.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

N, D, M = 1200, 4, 150
#: Rows of rank 0 and rank 1 (uneven on purpose: the offsets matter).
SPLIT = (0, 700, N)


def data():
    g = np.random.default_rng(7)
    X = g.standard_normal((N, D))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 + 0.1 * g.standard_normal(N)
    labels = np.digitize(X[:, 0] + 0.3 * g.standard_normal(N), [-0.4, 0.5])  # three classes
    return X, y, labels


def fit_case(name: str, X, y, labels, *, distributed: bool):
    """``(predictions on X, primal, dual)`` of case ``name`` fitted on the rows given (a shard when
    ``distributed``)."""
    from joker_ext import JokerClassifier, JokerRegressor
    from joker_ext.features import make_feature_map
    from joker_ext.kernels import make_kernel
    from joker_ext.losses import get_loss
    from joker_ext.model import fit_dual
    from joker_ext.solver import SolverOptions

    Xall = data()[0]
    if name in ("squared", "logistic", "hinge"):
        kernel = make_kernel("gaussian", 1.5)
        fmap = make_feature_map(kernel, M, seed=3)
        target = np.sign(y) if name != "squared" else y
        opts = SolverOptions(tol=1e-12, max_iter=300)
        model = fit_dual(torch.from_numpy(X), torch.from_numpy(target), loss=get_loss(name),
                         c=torch.full((X.shape[0],), 4.0, dtype=torch.float64), kernel=kernel, feature_map=fmap,
                         options=opts, solver="newton", distributed=distributed)
        pred = model.decision(torch.from_numpy(Xall)).numpy()
        return pred, model.result.primal, model.result.dual
    if name == "regressor_intercept":
        est = JokerRegressor(loss="huber", C=4.0, sigma=1.5, n_features=M, fit_intercept=True, tol=1e-10,
                             random_state=3, distributed=distributed).fit(X, y + 2.0)
        return est.predict(Xall), est.primal_objective_, est.dual_objective_
    if name == "classifier_balanced":
        names = np.array(["low", "mid", "high"])[labels]
        est = JokerClassifier(loss="logistic", C=4.0, sigma=1.5, n_features=M, class_weight="balanced", tol=1e-10,
                              random_state=3, distributed=distributed).fit(X, names)
        return est.decision_function(Xall), est.primal_objective_, est.dual_objective_
    if name == "falkon_nystrom":
        import falkon

        from joker_ext import JokerFalkon

        est = JokerFalkon(falkon.kernels.GaussianKernel(1.5), 1e-5, M, seed=3, features="nystrom", tol=1e-11,
                          distributed=distributed).fit(torch.from_numpy(X), torch.from_numpy(y))
        return est.predict(torch.from_numpy(Xall)).numpy(), est.result_.primal, est.result_.dual
    raise ValueError(name)


def _falkon_available() -> bool:
    try:
        import falkon  # noqa: F401
    except Exception:
        return False
    return True


CASES = ["squared", "logistic", "hinge", "regressor_intercept", "classifier_balanced"] + \
    (["falkon_nystrom"] if _falkon_available() else [])


def _shard(rank: int, *arrays):
    lo, hi = SPLIT[rank], SPLIT[rank + 1]
    return [a[lo:hi] for a in arrays]


def _models(rank: int, out: Path) -> None:
    X, y, labels = _shard(rank, *data())
    results = {}
    for name in CASES:
        pred, primal, dual = fit_case(name, X, y, labels, distributed=True)
        results[name] = {"pred": pred.tolist(), "primal": primal, "dual": dual}
    if rank == 0:
        (out / "models.json").write_text(json.dumps(results))


def _errors(rank: int, out: Path) -> None:
    from joker_ext import JokerRegressor
    from joker_ext.kernels import make_kernel
    from joker_ext.losses import get_loss
    from joker_ext.model import fit_dual

    X, y, _ = _shard(rank, *data())
    messages = {}
    est = JokerRegressor(sigma=1.0, n_features=20, distributed=True)
    for case, (Xr, yr) in {"widths": (X if rank == 0 else np.hstack([X, X[:, :1]]), y),
                           "empty": (X if rank == 0 else X[:0], y if rank == 0 else y[:0])}.items():
        try:
            est.fit(Xr, yr)
            messages[case] = None
        except ValueError as exc:
            messages[case] = str(exc)
    try:
        fit_dual(torch.from_numpy(X), torch.from_numpy(y), loss=get_loss("squared"),
                 c=torch.ones(X.shape[0], dtype=torch.float64), kernel=make_kernel("gaussian", 1.0),
                 distributed=True)
        messages["exact"] = None
    except ValueError as exc:
        messages["exact"] = str(exc)
    (out / f"errors{rank}.json").write_text(json.dumps(messages))


def _dies(rank: int, out: Path, *, resume: bool) -> None:
    """Logistic fit with a checkpoint every Newton iteration; rank 1 dies at iteration 2 (``resume=False``),
    or the fit resumes from the checkpoint (``resume=True``)."""
    from joker_ext.features import make_feature_map
    from joker_ext.kernels import make_kernel
    from joker_ext.losses import get_loss
    from joker_ext.model import fit_dual

    X, y, _ = _shard(rank, *data())

    def die(info):
        if rank == 1 and info["iteration"] == 2:
            os._exit(17)
        return False

    kernel = make_kernel("gaussian", 1.5)
    path = out / "fit.ckpt"
    model = fit_dual(torch.from_numpy(X), torch.from_numpy(np.sign(y)), loss=get_loss("logistic"),
                     c=torch.full((X.shape[0],), 4.0, dtype=torch.float64), kernel=kernel,
                     feature_map=make_feature_map(kernel, M, seed=3), options=_die_options(),
                     callback=None if resume else die, checkpoint_path=path, checkpoint_every=1,
                     resume=path if resume else None, distributed=True)
    if rank == 0:
        pred = model.decision(torch.from_numpy(data()[0])).numpy()
        (out / "resumed.json").write_text(json.dumps({"pred": pred.tolist(), "n_iter": model.result.n_iter,
                                                      "status": model.result.status}))


def _die_options():
    from joker_ext.solver import SolverOptions

    return SolverOptions(tol=1e-12, max_iter=100)


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = torch.distributed.get_rank()
    try:
        if scenario == "models":
            _models(rank, out)
        elif scenario == "errors":
            _errors(rank, out)
        elif scenario in ("dies", "resume"):
            _dies(rank, out, resume=scenario == "resume")
        else:
            raise ValueError(scenario)
    finally:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
