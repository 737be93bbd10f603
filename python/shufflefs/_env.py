"""Rank and world size of this process, as torch.distributed (torchrun) defines them."""

from __future__ import annotations

import os
import sys
from typing import NamedTuple, Optional


class DistEnv(NamedTuple):
    """Where this process sits in a data-parallel job.

    ``rank`` is the global rank (the mount's ``rank/R``), ``world_size`` the number of ranks,
    ``local_rank`` the rank on this node (for picking a device). ``source`` says where they came
    from: ``"torch.distributed"``, ``"environment"`` or ``"default"`` (a single process).
    """

    rank: int
    world_size: int
    local_rank: int
    source: str


def _int_env(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${name}={value!r} is not an integer") from None


def dist_env() -> DistEnv:
    """The rank and world size of this process.

    In order: an initialised ``torch.distributed`` process group (only if torch is already
    imported: this never imports torch), then the ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``
    variables that torchrun and most launchers set, then a single process (rank 0 of 1).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                local = _int_env("LOCAL_RANK")
                return DistEnv(
                    dist.get_rank(),
                    dist.get_world_size(),
                    local if local is not None else 0,
                    "torch.distributed",
                )
        except (RuntimeError, AttributeError):
            pass
    rank = _int_env("RANK")
    world = _int_env("WORLD_SIZE")
    local = _int_env("LOCAL_RANK")
    if rank is None and world is None:
        return DistEnv(0, 1, local if local is not None else 0, "default")
    if rank is None or world is None:
        missing = "RANK" if rank is None else "WORLD_SIZE"
        raise ValueError(
            f"${'WORLD_SIZE' if rank is None else 'RANK'} is set but ${missing} is not: set "
            "both (torchrun does), or pass rank= explicitly"
        )
    if not 0 <= rank < world:
        raise ValueError(f"$RANK={rank} is outside 0..$WORLD_SIZE={world}")
    return DistEnv(rank, world, local if local is not None else rank, "environment")
