"""Memory: what a fit will need, before it starts, and block sizes that fit a budget.

The estimate counts the tensors the solver holds (sizes in elements times the dtype's bytes):

* per row of data: dual variables, targets, their box bounds, weights (``~6 T + 1`` numbers per row),
  plus ``f = K alpha`` in exact mode (``T``);
* per block (b rows): the block's inputs (``b d``), its kernel matrix ``b^2`` and, for the direct
  trust-region solve, an eigendecomposition (``2 b^2``) in exact mode; its features ``b M`` (twice, for
  the cos/sin intermediate) and the block matrix (``K_BB`` or ``Phi_B Phi_B^T``), its shifted copy and
  its Cholesky factor (``3 b^2``) in feature mode; about ``20 T`` work vectors of length b;
* per chunk (r rows, used to stream over the data): ``r b`` kernel values (exact update) or ``r M``
  features (gap evaluation);
* the model: ``M T`` primal weights and the feature map's ``d M`` frequencies.

The data themselves are not counted (they stay where the user keeps them: host memory or disk).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional, Union

__all__ = ["MemoryEstimate", "estimate_fit_memory", "plan_blocks", "parse_memory", "is_out_of_memory"]

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3,
          "t": 1024**4, "tb": 1024**4}


def parse_memory(value: Union[int, float, str, None]) -> Optional[int]:
    """Bytes from an int/float or a string like '512MB', '2 GB', '1.5g' (None stays None)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"max_memory must be a number of bytes or a string like '2GB', got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"max_memory must be positive, got {value!r}")
        return int(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            out = float(m.group(1)) * _UNITS[m.group(2).lower()]
            if out > 0:
                return int(out)
    raise ValueError(f"max_memory must be a number of bytes or a string like '2GB', got {value!r}")


@dataclass
class MemoryEstimate:
    """Bytes by component; ``total`` is their sum."""

    per_row: int
    per_block: int
    per_chunk: int
    model: int

    @property
    def total(self) -> int:
        return self.per_row + self.per_block + self.per_chunk + self.model

    def __str__(self) -> str:
        mb = lambda x: f"{x / 2**20:.1f} MB"
        return (f"{mb(self.total)} (rows {mb(self.per_row)}, block {mb(self.per_block)}, "
                f"chunks {mb(self.per_chunk)}, model {mb(self.model)})")


def estimate_fit_memory(n: int, d: int, T: int = 1, *, n_features: Optional[int] = None, block_size: int = 1024,
                        chunk_rows: int = 4096, itemsize: int = 8, direct_max: int = 2048) -> MemoryEstimate:
    """Estimate the memory a fit needs (see the module docstring for what is counted)."""
    b = min(block_size, n)
    exact = n_features is None
    per_row = n * (6 * T + 1 + (T if exact else 0)) * itemsize
    if exact:
        per_block = (b * d + b * b + (2 * b * b if b <= direct_max else 0) + 20 * b * T) * itemsize
        per_chunk = min(chunk_rows, n) * b * itemsize
        model = 0
    else:
        M = n_features
        # features (b x M, and their float32 evaluation), the block matrix (K_BB or Phi_B Phi_B^T), its
        # shifted copy and its Cholesky factor
        per_block = (b * d + 2 * b * M + 3 * b * b + 20 * b * T) * itemsize
        per_chunk = 2 * min(chunk_rows, n) * M * itemsize
        model = (M * T + d * M) * itemsize
    return MemoryEstimate(per_row, per_block, per_chunk, model)


def plan_blocks(max_memory: Union[int, str], n: int, d: int, T: int = 1, *, n_features: Optional[int] = None,
                block_size: int = 1024, chunk_rows: int = 4096, itemsize: int = 8):
    """The largest ``(block_size, chunk_rows)`` not above the requested ones whose estimate fits.

    Chunks shrink first (they only cost time), then the block. Raises ValueError naming ``max_memory``
    when even one-row blocks do not fit.
    """
    budget = parse_memory(max_memory)
    b, r = min(block_size, n), min(chunk_rows, n)
    while True:
        est = estimate_fit_memory(n, d, T, n_features=n_features, block_size=b, chunk_rows=r, itemsize=itemsize)
        if est.total <= budget:
            return b, r, est
        if r > max(64, b):
            r = max(64, b, r // 2)
        elif b > 1:
            b = max(1, b // 2)
            r = min(r, max(64, b))
        else:
            raise ValueError(
                f"max_memory={max_memory!r} is too small: even one-row blocks need {est}; "
                f"the rows alone need {est.per_row / 2**20:.1f} MB"
            )


def is_out_of_memory(exc: BaseException) -> bool:
    """True for torch's out-of-memory errors on any device (and MemoryError)."""
    if isinstance(exc, MemoryError):
        return True
    oom = getattr(__import__("torch"), "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "not enough memory" in msg
                                             or "can't allocate memory" in msg)
