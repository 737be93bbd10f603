"""JAX: a rank's batches placed on the local devices with ``jax.device_put``, sharded along
the batch axis.

>>> from shufflefs.jax import iter_device_batches
>>> for epoch, step, x in iter_device_batches(shufflefs.Mount("/mnt/train")):
...     loss = train_step(state, x)          # x: jax.Array (batch_size, window), int32

Each array is a fresh numpy array (``device_put`` on CPU may keep a reference to host memory,
so a ring of reused buffers would be unsafe here). ``batch_size`` must divide by the number of
devices.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._source import PositionLike, Source


class DeviceBatch(NamedTuple):
    """One step on the devices."""

    epoch: int
    step: int
    data: jax.Array


def batch_sharding(
    devices: Optional[Sequence[jax.Device]] = None, axis: str = "data"
) -> NamedSharding:
    """Rows split over ``devices`` (the local devices by default), columns whole."""
    devs = list(jax.local_devices() if devices is None else devices)
    return NamedSharding(Mesh(np.array(devs), (axis,)), PartitionSpec(axis))


def device_put_batch(
    batch: np.ndarray,
    devices: Optional[Sequence[jax.Device]] = None,
    dtype: Optional[np.dtype] = np.dtype(np.int32),
) -> jax.Array:
    """``batch`` cast to ``dtype`` (int32 by default: JAX's integer without x64) and put on
    ``devices``, rows sharded."""
    sharding = batch_sharding(devices)
    n = len(sharding.mesh.devices.flat)
    if batch.shape[0] % n:
        raise ValueError(f"batch of {batch.shape[0]} rows does not split over {n} devices")
    if dtype is not None and batch.dtype != dtype:
        batch = batch.astype(dtype)
    return jax.device_put(batch, sharding)


def iter_device_batches(
    source: Source,
    *,
    rank: Optional[int] = None,
    start: PositionLike = (0, 0),
    stop: Optional[PositionLike] = None,
    devices: Optional[Sequence[jax.Device]] = None,
    dtype: Optional[np.dtype] = np.dtype(np.int32),
) -> Iterator[DeviceBatch]:
    """The steps of ``rank`` as device arrays. In a multi-process JAX job the rank defaults to
    ``jax.process_index()`` (checked against the plan's ranks), else to
    :meth:`Source.resolve_rank`."""
    if rank is None and jax.process_count() > 1:
        if jax.process_count() != source.ranks:
            raise ValueError(
                f"jax.process_count() is {jax.process_count()}, the plan has "
                f"ranks={source.ranks}"
            )
        rank = jax.process_index()
    for epoch, step, batch in source.iter_steps(rank=rank, start=start, stop=stop):
        yield DeviceBatch(epoch, step, device_put_batch(batch, devices, dtype))
