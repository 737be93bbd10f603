"""What both backends share: the plan's geometry, step reads into caller or ring buffers,
iteration over a rank's steps, resume and the fingerprint check."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple, Union

import numpy as np

from ._env import dist_env

#: A step of a rank as ``(epoch, step)``; where an int is accepted instead, it is the global
#: step ``epoch * steps_per_epoch + step``.
Position = Tuple[int, int]
PositionLike = Union[Position, int, Mapping[str, int]]


class FingerprintMismatch(ValueError):
    """The checkpoint was trained on other data or another plan than this source serves."""


class WorldSizeMismatch(ValueError):
    """The job's world size is not the plan's number of ranks."""


class Batch(NamedTuple):
    """One step of one rank: ``data`` is the step's rows, equal to ``np.load`` of its ``S.npy``."""

    epoch: int
    step: int
    data: np.ndarray


def dtype_of(info: Mapping[str, Any]) -> np.dtype:
    """The numpy dtype of a step's records, from ``info.json``."""
    fields = info.get("fields")
    if fields:
        return np.dtype([(str(name), str(descr)) for name, descr in fields])
    return np.dtype(str(info["dtype"]))


class Source(ABC):
    """A rank-partitioned, shuffled view of a dataset: what ``Mount`` and ``Dataset`` share.

    Every step is a pure function of ``(epoch, rank, step)``; both backends return the same
    bytes for it.
    """

    def __init__(self, info: Mapping[str, Any]) -> None:
        self._info: Dict[str, Any] = dict(info)
        self._dtype = dtype_of(info)
        self._shape: Tuple[int, ...] = tuple(int(x) for x in info["step_shape"])
        self._header_bytes = int(info["npy_header_bytes"])
        self._data_bytes = int(info["step_file_bytes"]) - self._header_bytes
        self._steps_per_epoch = int(info["steps_per_epoch"])
        self._epochs = int(info["epochs"])
        self._ranks = int(info["ranks"])
        # Batch-size changes of a mixture's schedule: (first global step, rows per rank).
        self._batches: List[Tuple[int, int]] = sorted(
            (int(e["from_step"]), int(e["batch_size"]))
            for e in (info.get("mixture") or {}).get("schedule") or []
            if e.get("batch_size") is not None
        )
        self._max_rows = max([self._shape[0]] + [b for _, b in self._batches])
        expected = int(np.prod(self._shape)) * self._dtype.itemsize
        if expected != self._data_bytes:
            raise ValueError(
                f"info.json is inconsistent: step_shape {list(self._shape)} of {self._dtype} is "
                f"{expected} bytes, but step_file_bytes - npy_header_bytes is {self._data_bytes}"
            )

    # ---- what info.json says ----------------------------------------------------------

    @property
    def info(self) -> Dict[str, Any]:
        """``info.json`` as a dict (a copy: changing it changes nothing)."""
        return json.loads(json.dumps(self._info))

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the data and the plan: store it with a checkpoint."""
        return str(self._info["fingerprint"])

    @property
    def steps_per_epoch(self) -> int:
        """Steps in every epoch (the same for every rank)."""
        return self._steps_per_epoch

    @property
    def epochs(self) -> int:
        """Epochs the plan exposes."""
        return self._epochs

    @property
    def ranks(self) -> int:
        """Ranks of the plan."""
        return self._ranks

    @property
    def batch_size(self) -> int:
        """Rows per step (per rank)."""
        return self._shape[0]

    @property
    def step_shape(self) -> Tuple[int, ...]:
        """Shape of a step array: ``(batch_size, window)`` (of the first step when a schedule
        changes the batch size: see :meth:`step_shape_at`)."""
        return self._shape

    @property
    def variable_shapes(self) -> bool:
        """Whether a schedule changes the batch size, so steps differ in shape."""
        return bool(self._batches)

    def rows_at(self, epoch: int, step: int) -> int:
        """Rows of the step ``(epoch, step)`` of every rank (the batch size in force there)."""
        g = self.global_step(epoch, step)
        rows = self._shape[0]
        for first, b in self._batches:
            if first > g:
                break
            rows = b
        return rows

    def step_shape_at(self, epoch: int, step: int) -> Tuple[int, ...]:
        """Shape of the step ``(epoch, step)``: ``(rows_at(epoch, step), window)``."""
        return (self.rows_at(epoch, step),) + self._shape[1:]

    @property
    def dtype(self) -> np.dtype:
        """dtype of every step array (the dataset's records)."""
        return self._dtype

    @property
    def total_steps(self) -> int:
        """``epochs * steps_per_epoch``: the steps of each rank."""
        return self._epochs * self._steps_per_epoch

    # ---- positions ------------------------------------------------------------------

    def global_step(self, epoch: int, step: int) -> int:
        """``epoch * steps_per_epoch + step``."""
        return epoch * self._steps_per_epoch + step

    def position(self, where: PositionLike) -> Position:
        """``(epoch, step)`` of a position given as a tuple, a global step or a state dict
        ``{"epoch": e, "step": s}``. The end of the plan is ``(epochs, 0)``."""
        if isinstance(where, Mapping):
            where = (int(where["epoch"]), int(where["step"]))
        if isinstance(where, (int, np.integer)) and not isinstance(where, bool):
            g = int(where)
            if not 0 <= g <= self.total_steps:
                raise ValueError(f"global step {g} is outside 0..{self.total_steps}")
            if self._steps_per_epoch == 0:
                return (self._epochs, 0)
            return divmod(g, self._steps_per_epoch)
        epoch, step = (int(x) for x in where)  # type: ignore[union-attr]
        if (epoch, step) != (self._epochs, 0) and not (
            0 <= epoch < self._epochs and 0 <= step < self._steps_per_epoch
        ):
            raise ValueError(
                f"no step (epoch {epoch}, step {step}) in this plan (epochs 0..{self._epochs}, "
                f"steps 0..{self._steps_per_epoch})"
            )
        return (epoch, step)

    def next_position(self, epoch: int, step: int) -> Position:
        """The step after ``(epoch, step)`` (``(epochs, 0)`` after the last one)."""
        return self.position(self.global_step(*self.position((epoch, step))) + 1)

    # ---- ranks ------------------------------------------------------------------------

    def resolve_rank(self, rank: Optional[int] = None) -> int:
        """``rank`` if given, else this process's rank from the torch.distributed environment
        (``RANK``/``WORLD_SIZE``), checking that the world size is the plan's ``ranks``."""
        if rank is not None:
            rank = int(rank)
            if not 0 <= rank < self._ranks:
                raise ValueError(f"rank {rank} is outside 0..{self._ranks} (the plan's ranks)")
            return rank
        env = dist_env()
        if env.source == "default":
            return 0
        if env.world_size != self._ranks:
            raise WorldSizeMismatch(self._world_message(env.world_size, env.source))
        return env.rank

    def _world_message(self, world: int, source: str) -> str:
        g = self._ranks * self.batch_size
        if g % world == 0:
            fix = (
                f"to resume elastically on {world} ranks with the same global batch "
                f"({self._ranks} x {self.batch_size} = {g} rows), use ranks={world} "
                f"batch_size={g // world} (mount --ranks {world} --batch-size {g // world}): "
                "the global batches, and the fingerprint, stay the same"
            )
        else:
            fix = (
                f"the global batch of {g} rows cannot be split over {world} ranks, so an "
                "elastic resume with the same batches is not possible on this world size"
            )
        return (
            f"world size {world} (from {source}) but this plan has ranks={self._ranks}: {fix}; "
            "or pass rank= explicitly"
        )

    # ---- reading ----------------------------------------------------------------------

    def new_buffer(self, epoch: Optional[int] = None, step: Optional[int] = None) -> np.ndarray:
        """A fresh array (contents undefined) of the shape of step ``(epoch, step)``, or
        without them of ``step_shape`` (the largest step when the batch size changes)."""
        if epoch is None or step is None:
            return np.empty((self._max_rows,) + self._shape[1:], self._dtype)
        return np.empty(self.step_shape_at(epoch, step), self._dtype)

    def _check_key(self, epoch: int, rank: int, step: int) -> None:
        if not (
            0 <= epoch < self._epochs
            and 0 <= rank < self._ranks
            and 0 <= step < self._steps_per_epoch
        ):
            raise ValueError(
                f"no such step: epoch {epoch} rank {rank} step {step} (this plan has epochs "
                f"0..{self._epochs}, ranks 0..{self._ranks}, steps 0..{self._steps_per_epoch})"
            )

    def _raw(self, out: np.ndarray, shape: Optional[Tuple[int, ...]] = None) -> np.ndarray:
        """The bytes of ``out`` as a flat uint8 view, after checking it can take a step of
        ``shape`` (``step_shape`` by default)."""
        shape = self._shape if shape is None else shape
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy array, not {type(out).__name__}")
        if out.shape != shape or out.dtype != self._dtype:
            raise ValueError(f"out is {out.shape} {out.dtype}; the step is {shape} {self._dtype}")
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("out must be C-contiguous and writeable")
        return out.reshape(-1).view(np.uint8)

    def step(
        self, epoch: int, rank: int, step: int, out: Optional[np.ndarray] = None
    ) -> np.ndarray:
        """The rows of ``epoch/E/rank/R/step/S.npy``: equal to ``np.load`` of that file.

        With ``out`` (an array of the step's shape, :meth:`step_shape_at`, and ``dtype``,
        C-contiguous) the rows are read into it and it is returned; otherwise a new array is
        returned.
        """
        self._check_key(epoch, rank, step)
        shape = self.step_shape_at(epoch, step)
        if out is None:
            out = np.empty(shape, self._dtype)
        self._read_into(epoch, rank, step, self._raw(out, shape))
        return out

    @abstractmethod
    def _read_into(self, epoch: int, rank: int, step: int, raw: np.ndarray) -> None:
        """Reads the step's rows (the file after its header) into ``raw`` (flat uint8)."""

    def step_json(self, epoch: int, rank: int, step: int) -> Dict[str, Any]:
        """The step's metadata, ``S.json``, as a dict (observations, token starts, rows...)."""
        return json.loads(self.step_json_bytes(epoch, rank, step))

    @abstractmethod
    def step_json_bytes(self, epoch: int, rank: int, step: int) -> bytes:
        """The bytes of ``S.json``."""

    # ---- iteration and resume ---------------------------------------------------------

    def iter_steps(
        self,
        rank: Optional[int] = None,
        start: PositionLike = (0, 0),
        stop: Optional[PositionLike] = None,
        buffers: Optional[int] = None,
    ) -> "StepIterator":
        """Iterates the steps of ``rank`` from ``start`` (included) to ``stop`` (excluded; the
        end of the plan by default), epoch after epoch, yielding :class:`Batch` objects.

        ``rank`` defaults to this process's rank (see :meth:`resolve_rank`).

        ``buffers=None`` gives every step a fresh array: keep it as long as you like.
        ``buffers=N`` reads into a ring of N arrays owned by the iterator, allocated once: the
        array yielded as the k-th item is overwritten when the iterator produces item k+N, so
        up to N-1 earlier batches stay intact while you hold the current one (e.g. N=2 or 3
        when a batch is still being copied to a device while the next one is read).
        """
        return StepIterator(self, self.resolve_rank(rank), start, stop, buffers)

    def check_fingerprint(self, expect_fingerprint: str) -> None:
        """Raises :class:`FingerprintMismatch` unless this source serves ``expect_fingerprint``."""
        if str(expect_fingerprint) != self.fingerprint:
            raise FingerprintMismatch(
                f"the checkpoint was made with fingerprint {expect_fingerprint}, this source "
                f"serves {self.fingerprint}: the data or the plan (seed, window, stride, global "
                "batch, mode) differ, so resuming would train on other batches. Open the "
                "dataset with the checkpoint's parameters, or start a new run."
            )

    def resume(
        self,
        checkpoint_step: PositionLike,
        expect_fingerprint: str,
        *,
        rank: Optional[int] = None,
        stop: Optional[PositionLike] = None,
        buffers: Optional[int] = None,
    ) -> "StepIterator":
        """Checks the fingerprint, then iterates from the step after ``checkpoint_step`` (the
        last step the checkpoint trained on, as ``(epoch, step)`` or a global step).
        Raises :class:`FingerprintMismatch` when the checkpoint is of other data or plan."""
        self.check_fingerprint(expect_fingerprint)
        epoch, step = self.position(checkpoint_step)
        if (epoch, step) == (self._epochs, 0):
            raise ValueError("checkpoint_step is the end of the plan, not a step")
        return self.iter_steps(
            rank=rank, start=self.next_position(epoch, step), stop=stop, buffers=buffers
        )


class StepIterator(Iterator[Batch]):
    """The steps of one rank in order (see :meth:`Source.iter_steps`).

    ``position`` is the next step it will read; ``state_dict()`` gives it as
    ``{"epoch": e, "step": s}`` for a checkpoint, and ``Source.iter_steps(start=that)``
    continues from it.
    """

    def __init__(
        self,
        source: Source,
        rank: int,
        start: PositionLike,
        stop: Optional[PositionLike],
        buffers: Optional[int],
    ) -> None:
        self.source = source
        self.rank = rank
        self._next = source.global_step(*source.position(start))
        self._stop = (
            source.total_steps if stop is None else source.global_step(*source.position(stop))
        )
        if buffers is not None and int(buffers) < 1:
            raise ValueError(f"buffers must be None (fresh arrays) or >= 1, not {buffers}")
        self._ring: List[Tuple[np.ndarray, np.ndarray]] = []
        self._ring_size = None if buffers is None else int(buffers)
        self._count = 0

    @property
    def position(self) -> Position:
        """The next step to be read, ``(epoch, step)`` (``(epochs, 0)`` at the end)."""
        return self.source.position(self._next)

    def state_dict(self) -> Dict[str, int]:
        """``{"epoch": e, "step": s}``: the next step to be read."""
        epoch, step = self.position
        return {"epoch": epoch, "step": step}

    def __len__(self) -> int:
        return max(0, self._stop - self._next)

    def __iter__(self) -> "StepIterator":
        return self

    def __next__(self) -> Batch:
        if self._next >= self._stop:
            raise StopIteration
        epoch, step = self.source.position(self._next)
        source = self.source
        if self._ring_size is None:
            out = source.new_buffer(epoch, step)
            raw = source._raw(out, out.shape)
        else:
            k = self._count % self._ring_size
            if k == len(self._ring):
                arr = source.new_buffer()
                self._ring.append((arr, source._raw(arr, arr.shape)))
            out, raw = self._ring[k]
            if source.variable_shapes:
                # The ring's arrays hold the largest step: this step is a prefix of one.
                out = out[: source.rows_at(epoch, step)]
                raw = raw[: out.nbytes]
        source._check_key(epoch, self.rank, step)
        source._read_into(epoch, self.rank, step, raw)
        self._next += 1
        self._count += 1
        return Batch(epoch, step, out)
