"""Reference rows: the authors' EigenPro 2 or EigenPro 3 code beside :class:`joker_ext.comparisons.solvers.EigenPro2`
or :class:`~joker_ext.comparisons.solvers.EigenPro3`, same problem and budget.

    # a checkout of the authors' repository *outside* this project (never copied in), e.g. with git clone:
    #   EigenPro 2: https://github.com/EigenPro/EigenPro-pytorch -> /tmp/EigenPro-pytorch
    #   EigenPro 3: https://github.com/EigenPro/EigenPro3        -> /tmp/EigenPro3
    OMP_NUM_THREADS=1 nice -n 19 python -m joker_ext.comparisons.benchmarks.eigenpro_reference \\
        --source /tmp/EigenPro-pytorch --n-train 20000 --epochs 5
    # EigenPro 3's code calls scipy.linalg.eigh(eigvals=...), removed in scipy 1.14: put an older scipy
    # (and a numpy it supports) on PYTHONPATH from a folder outside the project
    pip install --no-deps --target /tmp/ep3deps scipy==1.13.1 numpy==2.2.6
    PYTHONPATH=/tmp/ep3deps OMP_NUM_THREADS=1 nice -n 19 python -m joker_ext.comparisons.benchmarks.eigenpro_reference \\
        --implementation ep3 --source /tmp/EigenPro3 --n-train 20000 --epochs 5 --M 2000

The authors' package (``eigenpro2.KernelModel`` or ``eigenpro3.models.KernelModel``) is imported from
``--source`` at run time. Common to both: the harness's flights split (targets z-scored, RMSE in minutes),
Gaussian kernel ``exp(-||x - y||^2 / (2 sigma^2))`` (their ``gaussian(samples, centers, bandwidth)`` is the same
function with ``bandwidth = sigma``; checked on the data at start-up), float32 (the authors' models keep their
weights in float32), one thread, the same epochs. The random streams differ (their subsamples and batches
come from torch's global generator). Prints one markdown row per implementation: fit seconds, test RMSE,
set-up, and the gap between them.

``--implementation ep2`` (default): EigenPro's own problem, kernel interpolation ``K alpha = y`` stopped after
``--epochs`` passes (the authors' code has no ridge term: ours runs with ``ridge=0``), the same subsample size
(their default ``min(n, 2000)`` below 100,000 points) and their automatic q, batch and step. Their ``fit`` also
evaluates the training and validation error after every epoch; that time is inside their measured fit time
(it is ~2 x 5000 x n kernel entries per epoch against n^2 for the epoch itself).

``--eigensolver lapack`` (ep2): their run with ``torch.lobpcg`` replaced, for its duration, by the top eigenpairs
from LAPACK (``torch.linalg.eigh`` in float64, returned in lobpcg's order and dtype). Their set-up asks lobpcg
for a third of the subsample's eigenpairs, where it stalls on one CPU thread (20,000 rows: 46 of 666 pairs
after 36 iterations and 247 s, about two hours to its iteration cap); their own source keeps the LAPACK call
(``linalg.eigh`` of the top q) as a commented-out alternative. Nothing else of their code changes.
``--our-batch`` (ep2) hands our batch size to their ``fit(bs=...)`` (their own rule then sets the step from it):
ours bounds the critical batch by the preconditioned kernel's top eigenvalue measured outside the subsample,
theirs by the subsample's alone (at 20,000 flights rows their batch, 1,876, diverges; ours is 413).

``--implementation ep3``: least squares over ``f = K(., Z) alpha`` with the same ``--M`` centres Z (drawn once
from the training rows with ``--seed``, handed to both), the same data preconditioner (s = ``--n-nystrom``
rows, level q = ``--top-q``; ours draws the subsample and theirs is handed the same rows), their automatic
batch and step, and for the inexact projection both implementations' defaults (2 epochs of EigenPro 2 on the
centres with ``min(p, 2000)`` Nystrom centres and an automatic q). Their timed fit is the model's
construction (the data preconditioner) plus ``fit``, which sets up the projection's preconditioner on its
first batch. Their package imports ``torchvision.datasets`` for its demo loaders only; where torchvision is
not installed, a placeholder module stands in for it (any use of it raises).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import sys
import time
import types
import unittest.mock
from typing import Callable, List, Tuple

import numpy as np
import torch

Row = Tuple[str, float, float, str]


def _import_from(source: str, module: str, names: List[str]) -> list:
    """``from module import names`` with ``source`` (a checkout outside the project) first on sys.path."""
    sys.path.insert(0, source)
    try:
        mod = __import__(module, fromlist=names)
    finally:
        sys.path.pop(0)
    return [getattr(mod, name) for name in names]


def _stub_torchvision() -> None:
    """A placeholder ``torchvision.datasets`` for the authors' EigenPro 3 package, which imports its dataset
    classes at import time for its demo loaders (not used here); any use of the placeholders raises."""
    if importlib.util.find_spec("torchvision") is not None or "torchvision" in sys.modules:
        return

    class _Absent:
        def __init__(self, *a, **k):
            raise RuntimeError("torchvision is not installed: the demo data sets are unavailable")

    tv, ds = types.ModuleType("torchvision"), types.ModuleType("torchvision.datasets")
    for name in ("MNIST", "EMNIST", "FashionMNIST", "KMNIST", "CIFAR10"):
        setattr(ds, name, _Absent)
    tv.datasets = ds
    sys.modules["torchvision"], sys.modules["torchvision.datasets"] = tv, ds


def _check_bandwidth(theirs: Callable, ours, X: np.ndarray, sigma: float) -> float:
    """Largest difference between their ``gaussian(a, b, sigma)`` and our kernel on the first 200 rows."""
    A = torch.as_tensor(X[:200], dtype=torch.float64)
    return float((theirs(A, A, sigma) - ours(A, A)).abs().max())


def print_rows(title: str, rows: List[Row], metric: str = "test RMSE", digits: int = 3) -> None:
    """Markdown rows (implementation, fit s, metric, set-up); with a title, the title and the header first.
    Shared with the other reference-row benchmarks (:mod:`.admm_svm_reference`)."""
    if title:
        print(title)
        print(f"| implementation | fit s | {metric} | set-up |")
        print("|---|---:|---:|---|")
    for name, seconds, value, setup in rows:
        print(f"| {name} | {seconds:.1f} | {value:.{digits}f} | {setup} |", flush=True)


def print_gap(ours: Row, theirs: Row, metric: str = "test RMSE", label: str = "ours vs the authors'") -> None:
    """The relative gap of ``ours`` to ``theirs`` in the metric column."""
    print(f"{label}: {100 * (ours[2] - theirs[2]) / theirs[2]:+.2f}% {metric}")


def _run_ep2(args, X, y, Xt, yt, rmse) -> None:
    from joker_ext.comparisons.solvers.eigenpro import EigenPro2, ep2_default_nystrom
    from joker_ext.kernels import GaussianKernel

    n = X.shape[0]
    s = ep2_default_nystrom(n) if args.n_nystrom is None else args.n_nystrom
    title = (f"flights n={n}, test {Xt.shape[0]}, Gaussian sigma {args.sigma}, K alpha = y, {args.epochs} epochs, "
             "float32, 1 thread")
    t0 = time.perf_counter()
    ours = EigenPro2(GaussianKernel(args.sigma), n_nystrom=s, ridge=0.0, epochs=args.epochs, track_residual=False,
                     seed=args.seed, dtype=torch.float32).fit(X, y)
    rows = [("joker_ext.comparisons.solvers.EigenPro2", time.perf_counter() - t0, rmse(ours.predict(Xt)),
             f"s={s}, q={ours.top_q_}, batch={ours.batch_size_}, eta={ours.step_:.3g}")]
    print_rows(title, rows)

    KernelModel, = _import_from(args.source, "eigenpro2", ["KernelModel"])
    eigensolver = contextlib.nullcontext() if args.eigensolver == "lobpcg" else \
        unittest.mock.patch.object(torch, "lobpcg", _lapack_top_eigenpairs)
    gaussian, = _import_from(args.source, "eigenpro2.kernels", ["gaussian"])
    torch.manual_seed(args.seed)
    f32 = dict(dtype=torch.float32)
    Xtr = torch.as_tensor(X, **f32)
    model = KernelModel(lambda a, b: gaussian(a, b, args.sigma), Xtr, 1, device="cpu")
    log = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(log), eigensolver:
        # mem_gb only bounds their batch size by device memory: large enough not to bind on a CPU
        model.fit(Xtr, torch.as_tensor(y, **f32).reshape(-1, 1), x_val=torch.as_tensor(Xt, **f32),
                  y_val=torch.as_tensor(yt, **f32).reshape(-1, 1), epochs=args.epochs, mem_gb=64, n_subsamples=s,
                  bs=ours.batch_size_ if args.our_batch else None)
    t_ref = time.perf_counter() - t0
    with torch.no_grad():
        ref_pred = model.forward(torch.as_tensor(Xt, **f32)).numpy()
    setup = [line for line in log.getvalue().splitlines() if line.startswith(("SVD time", "n_subsamples"))]
    name = "EigenPro/EigenPro-pytorch eigenpro2.KernelModel" + (
        ", LAPACK eigenpairs" if args.eigensolver == "lapack" else "") + (", our batch" if args.our_batch else "")
    rows.append((name, t_ref, rmse(ref_pred), "; ".join(setup)))
    print_rows("", rows[1:])
    print_gap(rows[0], rows[1])


def _lapack_top_eigenpairs(A: torch.Tensor, k: int, *args, **kwargs):
    """``torch.lobpcg(A, k)``'s answer for a symmetric ``A``, the ``k`` largest eigenpairs in descending order, from
    LAPACK (float64, returned in ``A``'s dtype)."""
    values, vectors = torch.linalg.eigh(A.double())
    return values[-k:].flip(0).to(A.dtype), vectors[:, -k:].flip(1).to(A.dtype)


def _run_ep3(args, X, y, Xt, yt, rmse) -> None:
    import scipy

    from joker_ext.comparisons.solvers.eigenpro import EigenPro3
    from joker_ext.kernels import GaussianKernel

    if tuple(int(v) for v in scipy.__version__.split(".")[:2]) >= (1, 14):
        raise SystemExit(f"scipy {scipy.__version__}: the authors' EigenPro 3 code calls scipy.linalg.eigh(eigvals=...), "
                         "removed in scipy 1.14; put scipy<1.14 on PYTHONPATH (see the module docstring)")
    _stub_torchvision()
    KernelModel, = _import_from(args.source, "eigenpro3.models", ["KernelModel"])
    gaussian, = _import_from(args.source, "eigenpro3.kernels", ["gaussian"])
    kernel = GaussianKernel(args.sigma)
    print(f"bandwidth check: max |their gaussian(sigma) - our GaussianKernel(sigma)| on 200 rows = "
          f"{_check_bandwidth(gaussian, kernel, X, args.sigma):.1e}")

    n = X.shape[0]
    s = min(n, 5000) if args.n_nystrom is None else args.n_nystrom
    centers = np.random.default_rng(args.seed).choice(n, size=args.M, replace=False)
    f32 = dict(dtype=torch.float32)
    Xtr = torch.as_tensor(X, **f32)
    Z = Xtr[torch.as_tensor(centers)]
    title = (f"flights n={n}, test {Xt.shape[0]}, Gaussian sigma {args.sigma}, least squares over M={args.M} "
             f"shared centres, s={s}, q={args.top_q}, {args.epochs} epochs, float32, 1 thread")
    t0 = time.perf_counter()
    ours = EigenPro3(kernel, centers=Z, n_nystrom=s, top_q=args.top_q, epochs=args.epochs, track_residual=False,
                     seed=args.seed, dtype=torch.float32).fit(X, y)
    proj = ours._proj_pre
    rows = [("joker_ext.comparisons.solvers.EigenPro3", time.perf_counter() - t0, rmse(ours.predict(Xt)),
             f"batch={ours.batch_size_}, eta/batch={ours.step_ / ours.batch_size_:.3g}; projection: "
             f"q={proj.q}, batch={ours._proj_m}")]
    print_rows(title, rows)

    torch.manual_seed(args.seed)
    log = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(log), eigensolver:
        model = KernelModel(1, Z, lambda a, b: gaussian(a, b, args.sigma), X=Xtr,
                            y=torch.as_tensor(y, **f32).reshape(-1, 1), devices=[torch.device("cpu")],
                            nystrom_samples=Xtr[ours.nystrom_indices_], data_preconditioner_level=args.top_q)
        model.fit(model.train_loaders, epochs=args.epochs)
    t_ref = time.perf_counter() - t0
    with torch.no_grad():
        ref_pred = (gaussian(torch.as_tensor(Xt, **f32), Z, args.sigma) @ model.weights).numpy()
    setup = [line.strip() for line in log.getvalue().splitlines()
             if line.startswith(("Data: learning rate", "Setup time", "Projection SVD_time", "Projection setup"))]
    rows.append(("EigenPro/EigenPro3 eigenpro3.models.KernelModel", t_ref, rmse(ref_pred), "; ".join(setup)))
    print_rows("", rows[1:])
    print_gap(rows[0], rows[1])


def flights_split(n_train: int, n_test: int, seed: int):
    """The harness's flights split (targets z-scored) and ``rmse(pred)``: the test RMSE in minutes of predictions on
    the z-scored scale."""
    from joker_ext.comparisons.datasets import load

    ds = load("flights", "regression", n_train=n_train, n_test=n_test, seed=seed, standardize_y=True)
    std = float(ds.info["y_std"])

    def rmse(pred) -> float:
        return std * float(np.sqrt(np.mean((np.asarray(pred, dtype=np.float64).reshape(-1) - ds.y_test) ** 2)))

    return ds, rmse


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--implementation", choices=("ep2", "ep3"), default="ep2",
                    help="which authors' code --source holds: EigenPro-pytorch (ep2) or EigenPro3 (ep3)")
    ap.add_argument("--source", required=True, help="folder of a checkout of the authors' repository")
    ap.add_argument("--n-train", type=int, default=20000)
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--M", type=int, default=2000, help="ep3: number of centres")
    ap.add_argument("--n-nystrom", type=int, default=None,
                    help="subsample size s: default the authors' (ep2: min(n, 2000); ep3: min(n, 5000))")
    ap.add_argument("--top-q", type=int, default=500, help="ep3: data preconditioner level q (theirs: 500)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eigensolver", choices=("lobpcg", "lapack"), default="lobpcg",
                    help="ep2: their torch.lobpcg as written, or LAPACK's top eigenpairs in its place")
    ap.add_argument("--our-batch", action="store_true",
                    help="ep2: hand ours' batch size to their fit (bs=; their step rule then sets eta from it)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    ds, rmse = flights_split(args.n_train, args.n_test, args.seed)
    run = _run_ep2 if args.implementation == "ep2" else _run_ep3
    run(args, ds.X_train, ds.y_train, ds.X_test, ds.y_test, rmse)


if __name__ == "__main__":
    main()
