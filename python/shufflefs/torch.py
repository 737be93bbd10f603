"""PyTorch: an ``IterableDataset`` of one rank's steps, for ``DataLoader`` with or without
worker processes, and a loader that knows the next step for checkpoints.

>>> from shufflefs.torch import StepDataset
>>> ds = StepDataset(shufflefs.Mount("/mnt/train"))           # rank from RANK/WORLD_SIZE
>>> loader = ds.loader(num_workers=2, pin_memory=True)
>>> for x in loader:                                          # int64 (batch_size, window)
...     ckpt = {"data": loader.state_dict()}                  # {"epoch": e, "step": s}
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Optional, Tuple, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ._source import PositionLike, Source

Item = Union[torch.Tensor, Dict[str, torch.Tensor]]

_TORCH_OF_NUMPY = {
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _TORCH_OF_NUMPY[np.dtype(_name)] = getattr(torch, _name)


def _numpy_of(dtype: torch.dtype) -> np.dtype:
    return np.dtype(torch.empty((), dtype=dtype).numpy().dtype)


class StepDataset(IterableDataset):  # type: ignore[type-arg]
    """The steps of one rank, from ``start`` to ``stop``, as tensors of ``step_shape``.

    - ``dtype=torch.int64`` (default): the tokens cast in the worker, ready for
      ``nn.Embedding``; ``dtype=None`` keeps the dataset's own type. Structured records give a
      dict of one tensor per field.
    - With ``DataLoader(num_workers=W)`` worker ``w`` reads items ``w, w+W, w+2W, ...`` of the
      rank's steps: a disjoint, deterministic share; the DataLoader's round-robin over workers
      then yields every step once, in order. Use ``batch_size=None`` (each item is already a
      batch), or :meth:`loader`.
    - ``state_dict()`` is the next step ``{"epoch": e, "step": s}``; it follows the items this
      process iterated (``num_workers=0``). With workers use :meth:`loader`, whose
      ``state_dict()`` follows the items the DataLoader handed out.
    """

    def __init__(
        self,
        source: Source,
        *,
        rank: Optional[int] = None,
        start: PositionLike = (0, 0),
        stop: Optional[PositionLike] = None,
        dtype: Optional[torch.dtype] = torch.int64,
    ) -> None:
        super().__init__()
        self.source = source
        self.rank = source.resolve_rank(rank)
        self.dtype = dtype
        self._stop = (
            source.total_steps if stop is None else source.global_step(*source.position(stop))
        )
        self._start = source.global_step(*source.position(start))
        self._next = self._start

    def __len__(self) -> int:
        return max(0, self._stop - self._start)

    def state_dict(self) -> Dict[str, int]:
        """The next step to be read: ``{"epoch": e, "step": s}``."""
        epoch, step = self.source.position(self._next)
        return {"epoch": epoch, "step": step}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue from ``state`` (a :meth:`state_dict`) at the next iteration."""
        self._start = self._next = self.source.global_step(*self.source.position(state))

    def __iter__(self) -> Iterator[Item]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        shared = info is not None  # tensors leave through shared memory: allocate them there
        source = self.source
        largest = source.new_buffer()
        for g in range(self._start + worker, self._stop, workers):
            epoch, step = source.position(g)
            scratch = largest[: source.rows_at(epoch, step)]
            item = self._read(epoch, step, scratch, shared)
            if info is None:
                self._next = g + 1
            yield item

    def _tensor(self, dtype: torch.dtype, shape: Tuple[int, ...], shared: bool) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype)
        return t.share_memory_() if shared else t

    def _read(self, epoch: int, step: int, scratch: np.ndarray, shared: bool) -> Item:
        source = self.source
        fields = source.dtype.names
        if fields:
            source.step(epoch, self.rank, step, out=scratch)
            return {name: self._convert(scratch[name], shared) for name in fields}
        native = _TORCH_OF_NUMPY.get(source.dtype)
        if self.dtype is None or self.dtype == native:
            if native is None:
                raise TypeError(f"torch has no dtype for {source.dtype}; pass dtype=")
            # Read straight into the tensor's memory.
            t = self._tensor(native, scratch.shape, shared)
            source.step(epoch, self.rank, step, out=t.numpy())
            return t
        source.step(epoch, self.rank, step, out=scratch)
        return self._convert(scratch, shared)

    def _convert(self, array: np.ndarray, shared: bool) -> torch.Tensor:
        if self.dtype is None:
            dtype = _TORCH_OF_NUMPY.get(np.dtype(array.dtype))
            if dtype is None:
                raise TypeError(f"torch has no dtype for {array.dtype}; pass dtype=")
        else:
            dtype = self.dtype
        t = self._tensor(dtype, array.shape, shared)
        np.copyto(t.numpy(), array, casting="unsafe")
        return t

    def loader(self, **kwargs: Any) -> "StepLoader":
        """A :class:`StepLoader` over this dataset (``DataLoader`` keywords, e.g.
        ``num_workers``, ``pin_memory``, ``prefetch_factor``)."""
        return StepLoader(self, **kwargs)


class StepLoader:
    """A ``DataLoader(dataset, batch_size=None, **kwargs)`` that counts the items it hands
    out, so ``state_dict()`` is the next step even with worker processes.

    ``load_state_dict`` takes effect at the next ``iter()``; ``persistent_workers`` is refused
    (workers would keep the old start).
    """

    def __init__(self, dataset: StepDataset, **kwargs: Any) -> None:
        if kwargs.get("persistent_workers"):
            raise ValueError("persistent_workers=True would keep the start of the first epoch")
        for key in ("batch_size", "shuffle", "sampler", "batch_sampler"):
            if key in kwargs:
                raise TypeError(f"{key} is not for a StepLoader: each item is one step")
        self.dataset = dataset
        self.kwargs = kwargs
        self._next = dataset._start

    def __len__(self) -> int:
        return max(0, self.dataset._stop - self._next)

    def state_dict(self) -> Dict[str, int]:
        """The next step the loader will hand out: ``{"epoch": e, "step": s}``."""
        epoch, step = self.dataset.source.position(self._next)
        return {"epoch": epoch, "step": step}

    def load_state_dict(
        self, state: Mapping[str, int], expect_fingerprint: Optional[str] = None
    ) -> None:
        """Continue from ``state`` (a :meth:`state_dict`) at the next iteration; with
        ``expect_fingerprint`` (stored with the checkpoint) first check that the source serves
        the same data and plan (:class:`shufflefs.FingerprintMismatch` otherwise)."""
        source = self.dataset.source
        if expect_fingerprint is not None:
            source.check_fingerprint(expect_fingerprint)
        self._next = source.global_step(*source.position(state))

    def __iter__(self) -> Iterator[Item]:
        self.dataset.load_state_dict(self.state_dict())
        for item in DataLoader(self.dataset, batch_size=None, **self.kwargs):
            self._next += 1
            yield item
