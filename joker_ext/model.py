"""Fitting and evaluating a kernel model: the glue between data, kernel operator and solver.

:func:`fit_dual` is the one entry point every face of joker_ext (the scikit-learn estimators,
JokerFalkon, JokerGP, the comparison harness) uses to train; :class:`KernelModel` is what it returns.
It knows nothing about Falkon, GPyTorch or scikit-learn.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import torch

from .data import BlockData, as_block_data
from .defaults import CHUNK_ROWS, default_block_size, default_max_iter  # noqa: F401  (re-exported)
from .distributed import row_shards
from .features import FeatureMap, NystromFeatureMap
from .kernels import Kernel
from .losses import Loss
from .engines import default_max_iter as default_engine_iter, get_solver, resolve_solver, supports_intercept
from .intercept import fit_intercept_search
from .memory import parse_memory, plan_blocks
from .primal_newton import default_budget, plan_memory
from .operators import ExactOperator, FeatureOperator
from .solver import SolverOptions, SolverResult

__all__ = ["KernelModel", "fit_dual", "default_block_size", "default_max_iter"]


@dataclass
class KernelModel:
    """A fitted kernel model ``f(x) = sum_i alpha_i k(x_i, x)`` or ``f(x) = phi(x)^T beta``.

    Attributes
    ----------
    kernel : Kernel
    feature_map : FeatureMap or None
        None in exact mode.
    X_train : BlockData
        Training inputs (needed to predict in exact mode).
    alpha : Tensor (n, T)
        Dual coefficients.
    beta : Tensor (M, T) or None
        Primal weights ``Phi^T alpha`` in feature mode.
    result : SolverResult
    """

    kernel: Kernel
    feature_map: Optional[FeatureMap]
    X_train: BlockData
    alpha: torch.Tensor
    beta: Optional[torch.Tensor]
    result: Optional[SolverResult] = None
    chunk_rows: int = CHUNK_ROWS
    backend: str = "torch"
    extra: dict = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return "exact" if self.feature_map is None else "features"

    def decision(self, X, chunk_rows: Optional[int] = None) -> torch.Tensor:
        """``f(X)`` as an (n, T) tensor, computed in chunks of rows."""
        data = as_block_data(X, self.alpha.dtype, self.alpha.device)
        rows = chunk_rows or self.chunk_rows
        if self.feature_map is None:
            op = ExactOperator(self.kernel, self.X_train, chunk_rows=self.chunk_rows, backend=self.backend)
            if self.backend == "keops":
                return self.kernel.mmv(data.all(), self.X_train.all(), self.alpha, backend="keops")
            return op.predict_new(None, self.alpha, data, chunk_rows=rows)
        out = torch.empty(data.n, self.beta.shape[1], dtype=self.beta.dtype, device=self.beta.device)
        for start, stop, Xc in data.chunks(rows):
            out[start:stop] = self.feature_map(Xc) @ self.beta
        return out


def fit_dual(
    X,
    Y: torch.Tensor,
    *,
    loss: Loss,
    c: torch.Tensor,
    kernel: Kernel,
    feature_map: Optional[FeatureMap] = None,
    options: Optional[SolverOptions] = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device = torch.device("cpu"),
    alpha0: Optional[torch.Tensor] = None,
    callback: Optional[Callable] = None,
    validation: Optional[Callable] = None,
    chunk_rows: int = CHUNK_ROWS,
    backend: str = "torch",
    resume=None,
    checkpoint_path=None,
    checkpoint_every: Optional[int] = None,
    max_memory=None,
    block_model: str = "auto",
    solver: str = "auto",
    intercept: bool = False,
    intercept0=None,
    distributed=False,
) -> KernelModel:
    """Train the model with the chosen engine and return a :class:`KernelModel`.

    Parameters
    ----------
    X : tensor, ndarray, memmap, Dataset or BlockData (n, d)
    Y : Tensor (n, T)
        Targets (already -1/+1 for margin losses), any device/dtype (moved to ``device``/``dtype``).
    loss : Loss
    c : Tensor (n,)
        ``C * sample_weight``, all > 0.
    kernel : Kernel
    feature_map : FeatureMap, optional
        Random or Nystrom features; None for the exact kernel.
    options : SolverOptions
    alpha0 : Tensor (n, T), optional
        Warm start.
    resume : dict or path, optional
        A solver checkpoint (``{'alpha', 'state', 'radius', 'iteration', 'rng_state'}`` or the path of a
        file written by :class:`joker_ext.checkpoint.SolverCheckpointer`): the fit continues from it. DBCD-TR and
        the intercept search end bitwise where an uninterrupted fit with the same data, options and seed would
        (on CPU); so does feature Newton with a kinked loss interrupted during its interior start (the start runs
        again); elsewhere the second-order engines go on from the saved iterate and intercept (feature Newton also
        from the saved smoothing level and centre of its continuation) and end at the same tolerance.
    max_memory : int or str, optional
        Memory budget ('2GB', bytes) of this process's device: block size and chunk rows (DBCD-TR) or the
        preconditioner's rank and the chunk rows (feature Newton with random features,
        :func:`joker_ext.memory.plan_newton`) are
        chosen so that the estimate of :func:`joker_ext.memory.estimate_fit_memory` fits. None: no budget,
        except that the feature Newton engine on a GPU (one process, no ``newton_rank`` given, more than 4,096
        features) keeps its working memory within :data:`joker_ext.defaults.GPU_NEWTON_WORKSPACE` of its O(n)
        state (:func:`joker_ext.primal_newton.default_budget`). Independently of it, a block that runs out of
        memory is halved (with a warning) and the fit continues from the last consistent iterate.
    checkpoint_path, checkpoint_every : optional
        Write a solver checkpoint to ``checkpoint_path`` every ``checkpoint_every`` iterations (atomic; with the
        intercept, its current value is in the checkpoint's state).
    solver : str
        The engine (:mod:`joker_ext.engines`): 'auto', 'newton' or 'dbcd_tr' (or a registered one).
        ``options.max_iter`` counts that engine's outer iterations. The chosen name is stored in
        ``model.extra['solver']``.
    intercept : bool
        Fit an unregularized intercept per target, returned as ``model.result.state['intercept']`` (shape (T,);
        ``model.decision`` leaves it out). Engines registered with ``intercept=True`` (e.g. 'active_set',
        'working_set') fit it themselves; around every other engine the intercept search of
        :func:`joker_ext.intercept.fit_intercept_search` runs (warm-started engine solves; ``options.max_iter``
        is then the budget of all solves, ``model.result.state['intercept_rounds']`` their number and
        ``model.result.history`` has one record per solve). The search takes no ``validation``; ``callback`` is
        called once per solve with the joint problem's iterate; its checkpoints are written between solves (after
        a solve in which the iterations of all solves together pass a multiple of ``checkpoint_every``) and
        ``resume`` continues the search from there (not with rows spread over processes). A checkpoint of the other
        kind (an engine's own, for the search; the search's, for an engine that fits the intercept) or of another
        problem is used as a warm start only, with a RuntimeWarning.
    intercept0 : array (T,), optional
        Warm start of the intercept: the search's first ``b``, or the engine's starting intercept.
    distributed : bool or RowShards
        True: ``X``, ``Y`` and ``c`` are this process's shard of the training rows, spread over the
        processes of the initialised ``torch.distributed`` process group (:mod:`joker_ext.distributed`);
        every process calls ``fit_dual`` with its shard and gets the same ``beta`` (``alpha`` holds its
        own rows' dual variables). Feature mode with an engine registered ``distributed=True``
        ('newton', which 'auto' then picks for every loss). Only rank 0 writes checkpoints; ``resume``
        reads the primal weights from the checkpoint on every rank.
    block_model : {'auto', 'exact', 'gram', 'kernel', 'products'}
        DBCD-TR in feature mode only: the block matrix of the trust-region model (see
        :class:`joker_ext.operators.FeatureOperator`). All choices solve the same random-feature
        problem; 'auto' takes the kernel's block as preconditioner of Newton steps for the squared loss
        (when ``M >= 2 b`` and ``M > 8 d``) and the exact block otherwise.
    """
    data = as_block_data(X, dtype, device)
    Yd = Y.to(device=device, dtype=dtype)
    if Yd.dim() == 1:
        Yd = Yd.unsqueeze(1)
    cd = c.to(device=device, dtype=dtype)
    if feature_map is None:
        op = ExactOperator(kernel, data, chunk_rows=chunk_rows, backend=backend)
    else:
        op = FeatureOperator(feature_map, data, chunk_rows=chunk_rows, block_model=block_model)
    shards = row_shards(distributed)
    n_all = shards.plan(data.n, data.d) if shards.distributed else data.n
    snapshot = None
    if checkpoint_path is not None and shards.rank == 0:
        from .checkpoint import SolverCheckpointer

        snapshot = SolverCheckpointer(checkpoint_path, checkpoint_every or 100)
    if resume is not None and not isinstance(resume, dict):
        from .checkpoint import load_solver_state

        resume = load_solver_state(resume)
    if resume is not None and not shards.distributed:  # (sharded: only beta is read, alpha is rank 0's)
        n_rows = data.n
        if tuple(resume["alpha"].shape) != (n_rows, Yd.shape[1]):
            raise ValueError(
                f"resume holds dual variables of shape {tuple(resume['alpha'].shape)}, the data need "
                f"{(n_rows, Yd.shape[1])}: resume with the same data"
            )
        resume = {k: (v.to(device) if torch.is_tensor(v) and k != "rng_state" else v) for k, v in resume.items()}
        resume["state"] = {k: v.to(device=device, dtype=dtype) for k, v in resume["state"].items()}
    if resume is not None:
        kw = dict(alpha0=None if shards.distributed else resume["alpha"], state0=resume["state"],
                  radius0=resume.get("radius"), start_iter=int(resume.get("iteration", 0)),
                  rng_state=resume.get("rng_state"))
    else:
        kw = dict(alpha0=alpha0)
    opts = options or SolverOptions()
    budget = None if max_memory is None else parse_memory(max_memory)
    name = resolve_solver(solver, op.mode, n_all, torch.finfo(dtype).bits // 8, loss, budget,
                          distributed=shards.distributed)
    engine = get_solver(name, op.mode)
    if shards.distributed:
        kw["shards"] = shards
    searched = resume is not None and "search" in resume
    if intercept and not supports_intercept(name, op.mode, loss):
        return _fit_with_search(data, Yd, loss=loss, c=c, kernel=kernel, feature_map=feature_map, options=opts,
                                dtype=dtype, device=device, alpha0=alpha0, intercept0=intercept0, callback=callback,
                                chunk_rows=chunk_rows, backend=backend, max_memory=max_memory,
                                block_model=block_model, solver=name, shards=shards, n_all=n_all,
                                snapshot=snapshot, checkpointing=checkpoint_path is not None, resume=resume,
                                validation=validation)
    if searched:  # a checkpoint of another kind of fit: its iterate is a warm start
        warnings.warn(f"resume holds a checkpoint of the intercept search (joker_ext.intercept), but solver {name!r} "
                      f"{'fits the intercept itself' if intercept else 'runs without intercept'}: its dual variables "
                      f"are used as a warm start", RuntimeWarning, stacklevel=2)
        kw = {k: v for k, v in kw.items() if k in ("alpha0", "shards")}
        intercept0 = resume["state"].get("intercept") if intercept else None
        resume = None
    if intercept:
        kw["intercept"] = True
        if resume is None and intercept0 is not None:  # a warm start of the engine's own intercept
            kw["state0"] = {"intercept": torch.as_tensor(intercept0, dtype=dtype, device=device).reshape(Yd.shape[1])}
    if budget is not None and name == "working_set":  # half the budget to the kernel-column cache
        kw["cache_columns"] = max(1, budget // (2 * data.n * (torch.finfo(dtype).bits // 8)))
    if budget is not None and op.mode == "exact" and name in ("active_set", "newton"):  # K and a factor in float64?
        kw["max_memory"] = budget
    if opts.max_iter is None:
        opts = replace(opts, max_iter=default_engine_iter(name, n_all, opts.block_size, loss=loss))
    if max_memory is not None and name == "dbcd_tr":
        b, rows, est = plan_blocks(max_memory, data.n, data.d, Yd.shape[1],
                                   n_features=None if feature_map is None else feature_map.n_features,
                                   block_size=opts.block_size, chunk_rows=chunk_rows,
                                   itemsize=torch.finfo(dtype).bits // 8)
        if b < opts.block_size:
            warnings.warn(f"max_memory={max_memory!r}: block_size reduced from {opts.block_size} to {b} "
                          f"(estimated need {est})", RuntimeWarning, stacklevel=2)
        opts = replace(opts, block_size=b)
        op.chunk_rows = rows
    planned = {}
    # (Nystrom features take Falkon's M x M preconditioner, sized by M alone: nothing to plan)
    newton_budget = None
    if name == "newton" and feature_map is not None and not isinstance(feature_map, NystromFeatureMap):
        newton_budget = max_memory
        if newton_budget is None and opts.newton_rank is None and not shards.distributed:
            newton_budget = default_budget(feature_map, data.n, data.d, T=Yd.shape[1], dtype=dtype, device=device,
                                           chunk_rows=op.chunk_rows, sketch_rows=opts.newton_sketch_rows)
    if newton_budget is not None:
        rank, rows, resident = plan_memory(feature_map, data.n, data.d, opts.newton_rank, T=Yd.shape[1],
                                           dtype=dtype, device=device, max_memory=newton_budget,
                                           chunk_rows=op.chunk_rows, sketch_rows=opts.newton_sketch_rows)
        op.chunk_rows = rows
        opts = replace(opts, newton_rank=rank, newton_resident=resident and opts.newton_resident is not False,
                       newton_cache=bool(opts.newton_cache))  # (the plan does not count a feature cache)
        planned = {"newton_rank": rank, "chunk_rows": rows, "newton_resident": resident}
    while True:
        res = engine(op, Yd, loss, cd, opts, callback=callback, validation=validation, snapshot=snapshot,
                     snapshot_every=None if snapshot is None else snapshot.every, **kw)
        if res.status != "out_of_memory":
            break
        if intercept or shards.distributed:
            raise MemoryError(f"solver {name!r} ran out of memory; pass a smaller max_memory (or random features)"
                              + (", or spread the rows over more processes" if shards.distributed else ""))
        if name != "dbcd_tr":
            warnings.warn(f"solver {name!r} ran out of memory; continuing with 'dbcd_tr' from its last iterate",
                          RuntimeWarning, stacklevel=2)
            name, engine = "dbcd_tr", get_solver("dbcd_tr", op.mode)
            kw = dict(alpha0=res.alpha, start_iter=res.n_iter)
            continue
        if opts.block_size <= 1 and op.chunk_rows <= 1:
            raise MemoryError("out of memory even with one-row blocks and chunks")
        new_b = max(1, opts.block_size // 2)
        op.chunk_rows = max(1, op.chunk_rows // 2)
        warnings.warn(f"a block of {opts.block_size} rows did not fit in memory: continuing with block_size={new_b} "
                      f"and chunks of {op.chunk_rows} rows from the last consistent iterate", RuntimeWarning,
                      stacklevel=2)
        opts = replace(opts, block_size=new_b)
        # A new partition: continue from the current iterate (the radius carries over).
        kw = dict(alpha0=res.alpha, state0=res.state, radius0=res.radius, start_iter=res.n_iter)
    beta = res.state.get("beta") if feature_map is not None else None
    return KernelModel(kernel=kernel, feature_map=feature_map, X_train=data, alpha=res.alpha, beta=beta,
                       result=res, chunk_rows=chunk_rows, backend=backend,
                       extra={"solver": name, "bytes_reduced": shards.bytes_reduced, "world_size": shards.world_size,
                              **planned})


def _fit_with_search(data, Yd, *, loss, c, kernel, feature_map, options, dtype, device, alpha0, intercept0, callback,
                     chunk_rows, backend, max_memory, block_model, solver, shards, n_all, snapshot, checkpointing,
                     resume, validation) -> KernelModel:
    """:func:`fit_dual` with ``intercept=True`` for an engine that does not fit the intercept itself: the search of
    :func:`joker_ext.intercept.fit_intercept_search`, each of its solves one :func:`fit_dual` without intercept,
    checkpointed and resumed between solves."""
    if validation is not None:
        raise ValueError(f"validation cannot be used with intercept=True and solver {solver!r}, which gets the "
                         f"intercept from the intercept search (joker_ext.intercept); got validation={validation!r:.80}")
    if shards.distributed and (checkpointing or resume is not None):
        raise ValueError("checkpoint_path and resume cannot be used with intercept=True and rows spread over "
                         "processes when the intercept comes from the intercept search (each process's dual "
                         "variables would be needed; only rank 0 writes): fit without them, or with a loss whose "
                         "engine fits the intercept")
    if resume is not None and "search" not in resume:  # a checkpoint of another kind of fit: a warm start
        warnings.warn(f"resume holds a checkpoint of solver {solver!r} alone, but this fit gets the intercept from the "
                      f"intercept search (joker_ext.intercept) around it: its dual variables are used as a warm start",
                      RuntimeWarning, stacklevel=3)
        alpha0, resume = resume["alpha"], None
    if options.max_iter is None:
        options = replace(options, max_iter=default_engine_iter(solver, n_all, options.block_size, search=True,
                                                                  loss=loss))

    def solve(*, loss, kernel, feature_map, options, alpha0) -> SolverResult:
        return fit_dual(data, Yd, loss=loss, c=c, kernel=kernel, feature_map=feature_map, options=options,
                        dtype=dtype, device=device, alpha0=alpha0, chunk_rows=chunk_rows, backend=backend,
                        max_memory=max_memory, block_model=block_model, solver=solver, intercept=False,
                        distributed=shards).result

    res = fit_intercept_search(data, Yd, loss=loss, c=c, kernel=kernel, feature_map=feature_map, options=options,
                               dtype=dtype, device=device, solve=solve, alpha0=alpha0, intercept0=intercept0,
                               shards=shards, callback=callback, snapshot=snapshot, resume=resume)
    return KernelModel(kernel=kernel, feature_map=feature_map, X_train=data, alpha=res.alpha,
                       beta=res.state.get("beta"), result=res, chunk_rows=chunk_rows, backend=backend,
                       extra={"solver": solver, "intercept": "search", "bytes_reduced": shards.bytes_reduced,
                              "world_size": shards.world_size})
