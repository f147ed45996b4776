"""Memory estimates against measured peaks, budgets, and recovery from a block that does not fit.

The estimate (:func:`joker_ext.memory.estimate_fit_memory`) is checked against what fits really use: each fit
runs in a fresh Python process, and its peak is the process's resident-set high-water mark (``VmHWM`` of
``/proc/self/status``, reset just before the fit through ``/proc/self/clear_refs``; it sees torch's CPU
allocations, unlike ``tracemalloc``; ``getrusage``'s ``ru_maxrss`` would not do: it keeps the forking parent's
mark across ``exec``) minus the resident set just before the fit (data made, libraries loaded by a small
warm-up fit). glibc's mmap threshold is
fixed (``MALLOC_MMAP_THRESHOLD_``) so that every large tensor is mapped on allocation and unmapped on release:
the resident set then follows the live allocations rather than the heap's history. On a GPU the peak is
``torch.cuda.max_memory_allocated`` over the fit, less what was allocated before it. The estimate must be an
upper bound of the measured peak and at most :data:`FACTOR` times it.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from joker_ext.features import make_feature_map
from joker_ext.kernels import GaussianKernel
from joker_ext.losses import get_loss
from joker_ext.memory import MIN_NEWTON_RANK, estimate_fit_memory, parse_memory, plan_blocks, plan_newton
from joker_ext.model import fit_dual
from joker_ext.primal_newton import default_rank, default_sketch_rows
from joker_ext.solver import SolverOptions

from conftest import make_regression

#: The estimate may be at most this many times the measured peak.
FACTOR = 3.0

# The child process: builds the data, runs a warm-up fit (loads LAPACK, OpenMP, the kernels' code paths), then
# measures the fit of the spec. Prints one JSON line {"peak": bytes}.
CHILD = textwrap.dedent(r'''
    import json, sys
    import torch
    torch.set_num_threads(1)
    from joker_ext.data import BlockData
    from joker_ext.features import make_feature_map
    from joker_ext.kernels import GaussianKernel
    from joker_ext.losses import get_loss
    from joker_ext.operators import ExactOperator, FeatureOperator
    from joker_ext.solver import SolverOptions
    from joker_ext.engines import get_solver

    spec = json.loads(sys.argv[1])
    device = torch.device(spec["device"])
    n, d, T, M = spec["n"], spec["d"], spec["T"], spec["n_features"]
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=g, dtype=torch.float64).to(device)
    y = torch.sin(X[:, :1]) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64).to(device)
    loss = get_loss(spec["loss"])
    Y = (torch.sign(y) + (y == 0)).repeat(1, T) if loss.margin else y.repeat(1, T)
    c = torch.full((n,), spec["C"], dtype=torch.float64, device=device)
    kernel = GaussianKernel(1.0)
    fmap = None if M is None else make_feature_map(kernel, M, seed=0)
    engine = get_solver(spec["solver"], "exact" if M is None else "features")

    def run(rows):
        data = BlockData(X[:rows], torch.float64, device)
        op = ExactOperator(kernel, data, chunk_rows=spec["chunk_rows"]) if M is None else \
            FeatureOperator(fmap, data, chunk_rows=spec["chunk_rows"])
        opts = SolverOptions(block_size=spec["block_size"], max_iter=spec["max_iter"], tol=0.0, handle_sigint=False,
                             newton_rank=spec.get("newton_rank"), newton_sketch_rows=spec.get("newton_sketch_rows"),
                             newton_cache=spec.get("newton_cache"))
        return engine(op, Y[:rows], loss, c[:rows], opts, **spec.get("engine_kw", {}))

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    run(min(n, 64))  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run(n)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        try:  # reset the high-water mark to the current resident set (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        before = status("VmRSS")
        run(n)
        peak = status("VmHWM") - before
    print(json.dumps({"peak": peak}))
''')

# Fits large enough that their peak stands well above the allocator's noise (a few MB), small enough to run in
# seconds on one core.
FITS = {
    "dbcd_tr exact, direct solve": dict(solver="dbcd_tr", loss="squared", n=3000, d=5, T=1, n_features=None,
                                        block_size=1000, chunk_rows=4096, C=1.0, max_iter=4),
    "dbcd_tr exact, CG (hinge, 3 targets)": dict(solver="dbcd_tr", loss="hinge", n=4000, d=5, T=3, n_features=None,
                                                block_size=1500, chunk_rows=2000, C=1.0, max_iter=3),
    "dbcd_tr features, Gram": dict(solver="dbcd_tr", loss="logistic", n=6000, d=5, T=1, n_features=2000,
                                   block_size=800, chunk_rows=4096, C=1.0, max_iter=4),
    "newton features": dict(solver="newton", loss="logistic", n=20000, d=5, T=1, n_features=1000,
                            block_size=1024, chunk_rows=4096, C=1.0, max_iter=3),
    "newton features, band Hessian (hinge)": dict(solver="newton", loss="hinge", n=20000, d=5, T=1, n_features=2000,
                                                  block_size=1024, chunk_rows=4096, C=1.0, max_iter=3),
    "working set": dict(solver="working_set", loss="hinge", n=4000, d=5, T=1, n_features=None, block_size=1024,
                        chunk_rows=4096, C=1.0, max_iter=6, engine_kw={"working_set_size": 128, "cache_columns": 512}),
}


def _estimate(spec) -> int:
    kw = {}
    if spec["solver"] == "newton":
        rank = default_rank(spec["n_features"], spec["device"])
        kw = dict(newton_rank=rank, newton_sketch_rows=default_sketch_rows(spec["n"], rank))
    if spec["solver"] == "working_set":
        kw = {k: v for k, v in spec["engine_kw"].items()}
    return estimate_fit_memory(spec["n"], spec["d"], spec["T"], n_features=spec["n_features"],
                               block_size=spec["block_size"], chunk_rows=spec["chunk_rows"], itemsize=8,
                               solver=spec["solver"], loss=get_loss(spec["loss"]), **kw).total


def measure_peak(spec) -> int:
    """Peak bytes of the fit ``spec``, measured in a fresh process (see the module docstring)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="131072")
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["peak"]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(FITS))
def test_estimate_bounds_the_measured_peak_within_a_factor(name, device):
    spec = dict(FITS[name], device=device)
    peak, est = measure_peak(spec), _estimate(spec)
    print(f"{name} [{device}]: measured {peak / 2**20:.1f} MB, estimate {est / 2**20:.1f} MB ({est / peak:.2f}x)")
    assert peak <= est, f"{name}: measured peak {peak / 2**20:.1f} MB above the estimate {est / 2**20:.1f} MB"
    assert est <= FACTOR * peak, f"{name}: estimate {est / 2**20:.1f} MB over {FACTOR}x the peak {peak / 2**20:.1f} MB"


def test_parse_memory_units_and_errors():
    assert parse_memory("2GB") == 2 * 1024**3
    assert parse_memory("512 mb") == 512 * 1024**2
    assert parse_memory(1000) == 1000
    for bad in ("lots", "-1GB", 0, -5, True):
        with pytest.raises((ValueError, TypeError), match="max_memory"):
            parse_memory(bad)


def test_planned_blocks_keep_the_measured_peak_within_the_budget():
    """plan_blocks' answer for a budget, run: the measured peak stays below the budget."""
    spec = dict(FITS["dbcd_tr exact, direct solve"], device="cpu")
    b, r, est = plan_blocks("30MB", spec["n"], spec["d"], spec["T"], block_size=3000, chunk_rows=4096, itemsize=8)
    assert b < 3000 and est.total <= 30 * 2**20
    peak = measure_peak(dict(spec, block_size=b, chunk_rows=r))
    assert peak <= 30 * 2**20, f"block {b}, chunks {r}: measured {peak / 2**20:.1f} MB"


def test_plan_blocks_fits_the_budget_and_refuses_impossible_ones():
    b, r, est = plan_blocks("64MB", 100_000, 20, 1, n_features=4096, block_size=2048, itemsize=4)
    assert est.total <= 64 * 2**20 and b >= 1
    assert b < 2048
    with pytest.raises(ValueError, match="max_memory"):
        plan_blocks(1000, 100_000, 20, 1, n_features=4096)


@pytest.mark.parametrize("device", DEVICES)
def test_planned_newton_rank_and_chunks_keep_the_measured_peak_within_the_budget(device):
    """plan_newton's answer for a budget below the default fit's need, run: the measured peak stays below it."""
    spec = dict(FITS["newton features"], device=device)
    rank = default_rank(spec["n_features"], device)
    rows = default_sketch_rows(spec["n"], rank)
    budget = 48 * 2**20
    assert _estimate(spec) > budget  # the default fit would not fit
    k, r, resident, est = plan_newton(budget, spec["n"], spec["d"], spec["T"], n_features=spec["n_features"],
                                      rank=rank, sketch_rows=rows, chunk_rows=spec["chunk_rows"], itemsize=8,
                                      device=device)
    assert est.total <= budget and (k < rank or r < spec["chunk_rows"])
    # (a planned fit keeps no feature cache: fit_dual sets newton_cache=False with max_memory)
    peak = measure_peak(dict(spec, newton_rank=k, newton_sketch_rows=min(rows, max(8 * k, 8192)), chunk_rows=r,
                             newton_cache=False))
    assert peak <= budget, f"rank {k}, chunks {r}: measured {peak / 2**20:.1f} MB"


def test_plan_newton_shrinks_what_holds_the_peak_and_refuses_impossible_budgets():
    kw = dict(n_features=20_000, rank=1000, sketch_rows=8192, chunk_rows=838, itemsize=8, pass_itemsize=4,
              device="cuda")
    full = plan_newton(10**12, 200_000, 25, **kw)
    assert full[:3] == (1000, 838, True)
    k, r, resident, est = plan_newton(int(0.2 * 2**30), 200_000, 25, **kw)
    assert est.total <= 0.2 * 2**30 and MIN_NEWTON_RANK <= k < 1000 and not resident  # the inputs go first
    with pytest.raises(ValueError, match="max_memory"):
        plan_newton(15 * 2**20, 200_000, 25, **kw)  # the n-vectors alone need 16 MB


def test_plan_newton_takes_back_the_largest_rank_that_fits_at_its_final_chunks():
    """The rank halves (1000 -> 500 -> 256) before the chunks do (838 -> 419); at 419-row chunks rank 500 fits the
    budget again and is what the plan returns: the largest rank tried whose estimate (``estimate_fit_memory``, the
    plan's own measure) fits at those chunks, while rank 1000 does not."""
    from joker_ext.memory import estimate_fit_memory

    n, d, M = 1_000_000, 28, 20_000
    kw = dict(n_features=M, rank=1000, sketch_rows=8192, chunk_rows=838, itemsize=8, pass_itemsize=4,
              device="cuda")
    budget = 349 * 10**6

    def total(k, r):
        return estimate_fit_memory(n, d, 1, n_features=M, chunk_rows=r, itemsize=8, solver="newton", newton_rank=k,
                                   newton_sketch_rows=min(8192, max(8 * k, 8192)), pass_itemsize=4, device="cuda",
                                   resident=False, newton_cache=False).total

    assert total(500, 838) > budget and total(256, 838) > budget  # the chunks must halve ...
    k, r, resident, est = plan_newton(budget, n, d, **kw)
    assert (k, r, resident) == (500, 419, False) and est.total <= budget
    assert total(1000, 419) > budget  # ... and at their final size rank 500 is the largest that fits


def test_max_memory_plans_the_newton_fit_which_reaches_the_same_optimum():
    """A budget below the default Newton fit's estimate: a smaller rank and chunks, the same optimum (closed
    form of the feature-space ridge regression)."""
    X, y = make_regression(n=6000, d=5)
    kernel = GaussianKernel(1.0)
    fmap = make_feature_map(kernel, 600, seed=0)
    Xt, Y = torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1)
    c = torch.full((6000,), 10.0, dtype=torch.float64)
    m = fit_dual(Xt, Y, loss=get_loss("squared"), c=c, kernel=kernel, feature_map=fmap, solver="newton",
                 options=SolverOptions(tol=1e-12, max_iter=20), chunk_rows=4096, max_memory="12MB")
    assert m.extra["newton_rank"] < default_rank(600, "cpu") and m.extra["chunk_rows"] < 4096
    assert m.result.status == "converged"
    Phi = fmap(Xt)
    beta = torch.linalg.solve(Phi.T @ Phi + torch.eye(600, dtype=torch.float64) / 10.0, Phi.T @ Y)
    assert float((m.beta - beta).norm() / beta.norm()) < 1e-5  # a relative gap of 1e-12: about 1e-6


def test_default_budget_plans_only_large_gpu_fits_and_leaves_the_workspace_to_them():
    """No budget given: the CPU, a small GPU fit and one whose M x M Hessian the engine may form (M = 4096) keep
    their defaults (None); a GPU fit of 200,000 rows and 20,000 float32 features gets its O(n) state plus
    GPU_NEWTON_WORKSPACE, which the planned rank, chunks and streamed inputs fit."""
    from joker_ext.defaults import GPU_NEWTON_WORKSPACE, KINKED_HESSIAN_MAX_FEATURES
    from joker_ext.primal_newton import default_budget, plan_memory

    kernel = GaussianKernel(1.0)
    small = make_feature_map(kernel, 500, seed=0, compute_dtype=torch.float32)
    formed = make_feature_map(kernel, KINKED_HESSIAN_MAX_FEATURES, seed=0, compute_dtype=torch.float32)
    large = make_feature_map(kernel, 20_000, seed=0, compute_dtype=torch.float32)
    kw = dict(dtype=torch.float64, chunk_rows=838)
    assert default_budget(large, 200_000, 25, device="cpu", **kw) is None
    assert default_budget(small, 2000, 25, device="cuda", **kw) is None
    assert default_budget(formed, 1_000_000, 25, device="cuda", **kw) is None
    budget = default_budget(large, 200_000, 25, device="cuda", **kw)
    n_vectors = 200_000 * 13 * 8  # (12 T + 1) n-vectors of float64
    assert n_vectors + GPU_NEWTON_WORKSPACE < budget < n_vectors + GPU_NEWTON_WORKSPACE + 32 * 2**20
    rank, rows, resident = plan_memory(large, 200_000, 25, device="cuda", max_memory=budget, **kw)
    est = estimate_fit_memory(200_000, 25, n_features=20_000, chunk_rows=rows, itemsize=8, solver="newton",
                              newton_rank=rank, newton_sketch_rows=default_sketch_rows(200_000, rank),
                              pass_itemsize=4, device="cuda", resident=resident, newton_cache=False)
    assert est.total <= budget and rank < default_rank(20_000, "cuda") and not resident
    # a million features: even rank 64 and chunks of 64 rows need more than the workspace; no plan, no error
    assert default_budget(make_feature_map(kernel, 10**6, seed=0), 200_000, 25, device="cuda", **kw) is None


def test_fit_without_a_budget_takes_the_default_budget_plan(monkeypatch):
    """fit_dual plans the Newton fit for default_budget's answer when no max_memory is given (a CPU stand-in for
    the GPU's budget), and reaches the same optimum (the closed form of the feature-space ridge regression)."""
    import joker_ext.model as model

    monkeypatch.setattr(model, "default_budget", lambda *a, **k: 12 * 2**20)
    X, y = make_regression(n=6000, d=5)
    kernel = GaussianKernel(1.0)
    fmap = make_feature_map(kernel, 600, seed=0)
    Xt, Y = torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1)
    m = fit_dual(Xt, Y, loss=get_loss("squared"), c=torch.full((6000,), 10.0, dtype=torch.float64), kernel=kernel,
                 feature_map=fmap, solver="newton", options=SolverOptions(tol=1e-12, max_iter=20), chunk_rows=4096)
    assert m.extra["newton_rank"] < default_rank(600, "cpu") and m.extra["chunk_rows"] < 4096
    Phi = fmap(Xt)
    beta = torch.linalg.solve(Phi.T @ Phi + torch.eye(600, dtype=torch.float64) / 10.0, Phi.T @ Y)
    assert m.result.status == "converged" and float((m.beta - beta).norm() / beta.norm()) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_gpu_sketch_on_fewer_rows_than_features_is_within_its_estimate():
    """On a GPU, a sketch sampled on fewer rows than M holds one M x r buffer (NystromPreconditioner.sketch's
    two_pass): the measured peak stays below the GPU estimate, which counts one."""
    spec = dict(FITS["newton features"], n=20_000, n_features=20_000, chunk_rows=256, device="cuda")
    rank = default_rank(spec["n_features"], "cuda")
    sketch_rows = default_sketch_rows(spec["n"], rank)
    assert sketch_rows < spec["n_features"] and 4 * rank <= spec["n_features"]
    est = estimate_fit_memory(spec["n"], spec["d"], n_features=spec["n_features"], chunk_rows=512, itemsize=8,
                              solver="newton", newton_rank=rank, newton_sketch_rows=sketch_rows, device="cuda",
                              loss=get_loss("logistic")).total
    peak = measure_peak(spec)
    print(f"two-pass sketch [cuda]: measured {peak / 2**20:.1f} MB, estimate {est / 2**20:.1f} MB")
    assert peak <= est <= FACTOR * peak


class FlakyFeatures:
    """A feature map that runs out of memory on blocks larger than ``limit`` rows."""

    def __init__(self, inner, limit):
        self.inner, self.limit, self.n_features = inner, limit, inner.n_features

    def __call__(self, X):
        if X.shape[0] > self.limit:
            raise torch.OutOfMemoryError("simulated: not enough memory for this block")
        return self.inner(X)


def test_block_that_does_not_fit_is_shrunk_with_a_warning_and_the_fit_completes():
    X, y = make_regression(n=400)
    kernel = GaussianKernel(1.0)
    fmap = make_feature_map(kernel, 64, seed=0)
    Xt, Y = torch.as_tensor(X), torch.as_tensor(y).reshape(-1, 1)
    C = 1.0
    c = torch.full((400,), C, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="did not fit"):
        m = fit_dual(Xt, Y, loss=get_loss("squared"), c=c, kernel=kernel, feature_map=FlakyFeatures(fmap, 120),
                     options=SolverOptions(block_size=400, max_iter=3000, tol=1e-11), chunk_rows=100,
                     solver="dbcd_tr")
    assert m.result.status == "converged"
    # closed form in feature space: beta = (Phi^T Phi + I / C)^-1 Phi^T y
    Phi = fmap(Xt)
    beta = torch.linalg.solve(Phi.T @ Phi + torch.eye(64, dtype=torch.float64) / C, Phi.T @ Y)
    np.testing.assert_allclose(m.beta.numpy(), beta.numpy(), rtol=1e-4, atol=1e-6)


def test_max_memory_budget_reduces_the_block_with_a_warning():
    X, y = make_regression(n=3000, d=5)
    with pytest.warns(RuntimeWarning, match="block_size reduced"):
        m = fit_dual(torch.as_tensor(X), torch.as_tensor(y), loss=get_loss("squared"),
                     c=torch.full((3000,), 1.0, dtype=torch.float64), kernel=GaussianKernel(1.0),
                     options=SolverOptions(block_size=3000, max_iter=20), max_memory="40MB")
    assert torch.all(torch.isfinite(m.alpha))
