"""Data in blocks: random access to rows of a data set that may live in host memory, on a device or
on disk.

The solver never asks for the whole data set on its device. It asks for one block of rows
(:meth:`BlockData.take`) or streams the rows in chunks (:meth:`BlockData.chunks`); each piece is moved
to the solver's device and dtype on the way.

Accepted sources: torch tensors (any device), numpy arrays, numpy memmaps (rows are read from disk
when a block needs them), and map-style ``torch.utils.data.Dataset`` objects whose items are
``(x, ...)`` tuples or tensors (random access through ``__getitem__``; iterable datasets cannot be
used because the solver revisits blocks in random order).
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple, Union

import numpy as np
import torch

__all__ = ["BlockData", "as_block_data", "resolve_dtype", "resolve_device"]

_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "single": torch.float32,
    "double": torch.float64,
    torch.float32: torch.float32,
    torch.float64: torch.float64,
    np.float32: torch.float32,
    np.float64: torch.float64,
}


def resolve_dtype(dtype, default: torch.dtype = torch.float64) -> torch.dtype:
    """Map 'float32' / 'float64' / torch or numpy float dtypes to a torch dtype (None -> default)."""
    if dtype is None:
        return default
    try:
        key = np.dtype(dtype).type if not isinstance(dtype, (str, torch.dtype)) else dtype
    except TypeError:
        key = dtype
    if key in _DTYPES:
        return _DTYPES[key]
    raise ValueError(f"dtype must be 'float32', 'float64' or a torch float dtype, got {dtype!r}")


def resolve_device(device) -> torch.device:
    """Return a torch.device; raise ValueError naming the device when it cannot be used."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda:0', got {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available on this machine")
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ValueError(f"device {device!r} was asked for but MPS is not available on this machine")
    return dev


class BlockData:
    """Row access to a 2-D data set, producing tensors of one dtype on one device.

    Parameters
    ----------
    source : Tensor, ndarray, memmap or map-style Dataset
    dtype : torch.dtype
    device : torch.device
    """

    def __init__(self, source, dtype: torch.dtype, device: torch.device):
        self.source = source
        self.dtype = dtype
        self.device = device
        if torch.is_tensor(source):
            self.kind = "tensor"
            self.n, self.d = source.shape
        elif isinstance(source, np.ndarray):
            self.kind = "numpy"
            self.n, self.d = source.shape
        elif hasattr(source, "__getitem__") and hasattr(source, "__len__"):
            self.kind = "dataset"
            self.n = len(source)
            first = self._item(0)
            self.d = first.shape[-1]
        else:
            raise TypeError(
                "X must be a torch tensor, a numpy array or memmap, or a map-style torch Dataset, "
                f"got {type(source).__name__}"
            )

    def _item(self, i: int) -> torch.Tensor:
        item = self.source[int(i)]
        if isinstance(item, (tuple, list)):
            item = item[0]
        return torch.as_tensor(item).reshape(-1)

    def _convert(self, block) -> torch.Tensor:
        if isinstance(block, np.ndarray):
            block = torch.from_numpy(np.ascontiguousarray(block))
        return block.to(device=self.device, dtype=self.dtype)

    def take(self, idx: Union[np.ndarray, torch.Tensor]) -> torch.Tensor:
        """Rows ``idx`` (sorted indices read fastest from a memmap) as a (len(idx), d) tensor."""
        if self.kind == "tensor":
            ii = torch.as_tensor(idx, device=self.source.device, dtype=torch.long)
            return self._convert(self.source.index_select(0, ii))
        if self.kind == "numpy":
            ii = idx.cpu().numpy() if torch.is_tensor(idx) else np.asarray(idx)
            return self._convert(self.source[ii])
        ii = idx.tolist() if torch.is_tensor(idx) else list(np.asarray(idx))
        return self._convert(torch.stack([self._item(i) for i in ii]))

    def slice(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` as a tensor."""
        if self.kind in ("tensor", "numpy"):
            return self._convert(self.source[start:stop])
        return self.take(np.arange(start, stop))

    def chunks(self, chunk_rows: int) -> Iterator[Tuple[int, int, torch.Tensor]]:
        """Yield ``(start, stop, rows)`` over the whole data set."""
        for start in range(0, self.n, chunk_rows):
            stop = min(start + chunk_rows, self.n)
            yield start, stop, self.slice(start, stop)

    def all(self) -> torch.Tensor:
        """The whole data set as one tensor (used only where it is known to fit)."""
        return self.slice(0, self.n)


def as_block_data(X, dtype: torch.dtype, device: torch.device) -> BlockData:
    """Wrap ``X`` (or return it unchanged when it already is a BlockData)."""
    if isinstance(X, BlockData):
        return X
    return BlockData(X, dtype, device)
