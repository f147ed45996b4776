"""Rows sharded over the processes of a ``torch.distributed`` group (data parallelism).

Every process (rank) holds its own shard of the training rows; the random features are drawn from the
seed and are the same on every rank; the primal weights ``beta`` (M x T) and the preconditioner are
replicated. The feature Newton engine (:mod:`joker_ext.primal_newton`) touches the rows only through sums
over rows, so each of its sums is a local sum followed by one ``all_reduce``:

==========================  =======================================  ================================
sum over rows               what is reduced                          numbers per call
==========================  =======================================  ================================
gradient pass               ``Phi^T a``, loss and conjugate sums      ``M T + 3 T``
Hessian product (CG step)   ``Phi^T W Phi v``                         ``M T``
gap test of a CG step       loss and conjugate sums (quadratic)       ``2 T``
line-search trial           smoothed primal                           ``1``
preconditioner sketch       ``Phi_S^T W_S Phi_S Omega``               ``M r`` (once per sketch)
==========================  =======================================  ================================

so a pass costs one all-reduce of ``M T`` floats, whatever ``n``. The sketch is taken on the same rows as
in one process: the global row sample is drawn from the seed and each rank contributes the sampled rows it
holds. A fit on ``p`` ranks therefore computes the single-process model up to the order of floating-point
sums. Decisions that end a loop (convergence, time budget, callbacks) are agreed on by all ranks
(:meth:`RowShards.agree`) and ``beta`` is broadcast from rank 0 after every Newton step, so every rank
returns the same model.

Only the feature Newton engine runs distributed: DBCD-TR and the exact-kernel engines need every row's
kernel column on one process and stay single-process.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Optional, Sequence

import torch

__all__ = ["RowShards", "SingleProcess", "row_shards", "shard_rows", "local_positions", "run_local_group"]

#: Stop reasons in the order in which one rank's reason overrides another's (agreement takes the maximum).
STOP_REASONS = (None, "converged", "max_iter", "callback", "max_time", "interrupted")


class SingleProcess:
    """The one-process case of :class:`RowShards`: every reduction is the identity."""

    world_size = 1
    rank = 0
    distributed = False

    def __init__(self):
        self.bytes_reduced = 0
        self.n_total: Optional[int] = None
        self.offset = 0

    def plan(self, n_local: int, d: int) -> int:
        """Global row count and this rank's first row (here: ``n_local`` and 0)."""
        self.n_total, self.offset = int(n_local), 0
        return self.n_total

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def sum_many(self, *tensors: torch.Tensor) -> tuple:
        """The tensors summed over ranks, by one all-reduce (unchanged in one process)."""
        return tensors

    def broadcast_(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def agree(self, reason: Optional[str]) -> Optional[str]:
        return reason

    def any(self, flag: bool) -> bool:
        return bool(flag)

    def gather_objects(self, obj) -> list:
        return [obj]

    def sample_rows(self, X, max_rows: int, seed: int = 0):
        """At most ``max_rows`` rows of the data set (numpy ``X``: this rank's shard), the same on every rank:
        in one process ``X`` itself; over ``p`` ranks a seeded draw of ``ceil(max_rows / p)`` rows from each
        shard, stacked in rank order (for data-driven choices such as the median bandwidth)."""
        return X


class RowShards(SingleProcess):
    """The processes of an initialised ``torch.distributed`` group, each holding a shard of the rows.

    Parameters
    ----------
    group : ProcessGroup, optional
        The group (default: the world group).

    Attributes
    ----------
    rank, world_size : int
    n_total : int
        Rows over all ranks (after :meth:`plan`).
    offset : int
        Global index of this rank's first row: shards are stacked in rank order.
    bytes_reduced : int
        Bytes this rank has handed to ``all_reduce`` and ``broadcast`` so far (the payload; a ring
        all-reduce sends ``2 (p - 1) / p`` times it over the wire).
    """

    distributed = True

    def __init__(self, group=None):
        super().__init__()
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "distributed=True needs an initialised torch.distributed process group, got none: call "
                "torch.distributed.init_process_group(...) first (torchrun sets the environment for it)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        backend = dist.get_backend(group)
        self.backend = backend
        # NCCL reduces device tensors only; Gloo is used with host tensors (and moves device ones itself)
        self.comm_device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
            else torch.device("cpu")

    # ---------------------------------------------------------------- collectives
    def _to_comm(self, tensor: torch.Tensor):
        """The tensor on a device the backend reduces on (NCCL: the tensor's own GPU, else the current one;
        Gloo: the host), contiguous; and whether it is a copy."""
        target = tensor.device if (self.backend == "nccl" and tensor.is_cuda) else self.comm_device
        if tensor.device == target and tensor.is_contiguous():
            return tensor, False
        return tensor.to(target).contiguous(), True

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """All-reduce ``tensor`` (sum over ranks) in place and return it."""
        buf, moved = self._to_comm(tensor)
        torch.distributed.all_reduce(buf, group=self.group)
        self.bytes_reduced += buf.numel() * buf.element_size()
        if moved:
            tensor.copy_(buf)
        return tensor

    def sum_many(self, *tensors: torch.Tensor) -> tuple:
        """The tensors (one dtype and device) summed over ranks, packed into one all-reduce."""
        packed = torch.cat([t.reshape(-1) for t in tensors])
        self.sum_(packed)
        return tuple(p.view_as(t) for p, t in zip(packed.split([t.numel() for t in tensors]), tensors))

    def broadcast_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Overwrite ``tensor`` with rank 0's copy."""
        buf, moved = self._to_comm(tensor)
        torch.distributed.broadcast(buf, src=torch.distributed.get_global_rank(self.group, 0)
                                    if self.group is not None else 0, group=self.group)
        self.bytes_reduced += buf.numel() * buf.element_size()
        if moved:
            tensor.copy_(buf)
        return tensor

    def _max_int(self, value: int) -> int:
        t = torch.tensor([int(value)], dtype=torch.int64, device=self.comm_device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return int(t.item())

    def agree(self, reason: Optional[str]) -> Optional[str]:
        """The stop reason all ranks take: the most pressing one any rank has (None when none has one)."""
        return STOP_REASONS[self._max_int(STOP_REASONS.index(reason))]

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on one."""
        return bool(self._max_int(int(bool(flag))))

    def gather_objects(self, obj) -> list:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank (small picklable objects)."""
        out = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj, group=self.group)
        return out

    def sample_rows(self, X, max_rows: int, seed: int = 0):
        import numpy as np

        per_rank = -(-int(max_rows) // self.world_size)
        n = X.shape[0]
        if n > per_rank:
            pick = np.sort(np.random.RandomState(seed + self.rank).choice(n, per_rank, replace=False))
            X = X[pick]
        return np.concatenate(self.gather_objects(np.ascontiguousarray(X)), axis=0)

    # ---------------------------------------------------------------- shards
    def plan(self, n_local: int, d: int) -> int:
        """Check the shards against each other and return the global row count.

        Raises ValueError on every rank (the same message) when a shard is empty or the shards' widths differ.
        """
        sizes = self.gather_objects((int(n_local), int(d)))
        empty = [r for r, (n, _) in enumerate(sizes) if n == 0]
        if empty:
            raise ValueError(f"every rank needs at least one training row; the shards of rank(s) {empty} are empty "
                             f"(rows per rank: {[n for n, _ in sizes]})")
        widths = sorted({w for _, w in sizes})
        if len(widths) > 1:
            raise ValueError(f"the shards must have the same number of features (columns), got "
                             f"{[w for _, w in sizes]} on ranks 0..{self.world_size - 1}")
        self.n_total = sum(n for n, _ in sizes)
        self.offset = sum(n for n, _ in sizes[: self.rank])
        return self.n_total


def row_shards(distributed: bool, group=None) -> SingleProcess:
    """:class:`RowShards` over ``group`` when ``distributed`` is true, else :class:`SingleProcess`."""
    if isinstance(distributed, SingleProcess):
        return distributed
    if not isinstance(distributed, bool):
        raise TypeError(f"distributed must be True or False, got {distributed!r}")
    return RowShards(group) if distributed else SingleProcess()


def shard_rows(n: int, rank: Optional[int] = None, world_size: Optional[int] = None) -> slice:
    """The contiguous slice of ``range(n)`` that rank ``rank`` of ``world_size`` holds (sizes differ by at most
    one; defaults: this process's rank and world size). A helper for scripts that read their own shard."""
    if rank is None or world_size is None:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("shard_rows needs rank and world_size, or an initialised torch.distributed group")
        rank, world_size = dist.get_rank(), dist.get_world_size()
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    base, extra = divmod(int(n), int(world_size))
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def local_positions(sample: torch.Tensor, offset: int, n_local: int) -> torch.Tensor:
    """The entries of a sorted global row sample that fall in ``[offset, offset + n_local)``, as local rows."""
    lo = int(torch.searchsorted(sample, offset))
    hi = int(torch.searchsorted(sample, offset + n_local))
    return sample[lo:hi] - offset



def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_local_group(args: Sequence[str], nproc: int, *, timeout: float, logs: Sequence = (),
                    stop_when_rank_exits: Optional[int] = None, env: Optional[dict] = None) -> list:
    """Run ``python args...`` as ``nproc`` processes of one Gloo group on loopback (what ``torchrun
    --nproc_per_node`` sets up: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``)
    and return their exit codes (tests and benchmarks; users launch with ``torchrun``).

    ``logs[r]``: a file object for rank ``r``'s output (default: inherited). ``stop_when_rank_exits=r``: once
    rank ``r`` has exited, the others are killed (a rank that dies leaves the others waiting). Raises
    TimeoutError, after killing every process, when they run past ``timeout`` seconds.
    """
    base = dict(os.environ if env is None else env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                WORLD_SIZE=str(nproc), GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([sys.executable, *args], env=dict(base, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=logs[r] if r < len(logs) else None,
                              stderr=subprocess.STDOUT if r < len(logs) else None) for r in range(nproc)]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {nproc} processes of {list(args)} did not finish in {timeout} s")
            if stop_when_rank_exits is not None and procs[stop_when_rank_exits].poll() is not None:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return [p.returncode for p in procs]
