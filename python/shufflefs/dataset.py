"""The in-process backend: the same core as the mount, without FUSE."""

from __future__ import annotations

import json
import os
from typing import Any, List, Optional, Sequence

import numpy as np

from ._source import Source


def plan_flags(**options: Any) -> List[str]:
    """The mount's command-line flags for plan keywords: ``batch_size=8`` -> ``--batch-size 8``;
    ``True`` gives the bare flag, ``None`` and ``False`` leave it out."""
    flags: List[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        else:
            flags += [flag, str(value)]
    return flags


class Dataset(Source):
    """A packed dataset directory read in this process through a plan: the bytes a
    ``shufflefs mount`` of it with the same plan flags would serve, without FUSE.

    The keywords are the mount's plan flags (``--window`` -> ``window=``, ``--batch-size`` ->
    ``batch_size=``, ...), with the same defaults and checks; flags added to the mount later
    are accepted the same way. Reads release the GIL and write straight into the output
    array.
    """

    def __init__(
        self,
        path: "str | os.PathLike[str]",
        *,
        window: int,
        batch_size: int,
        stride: Optional[int] = None,
        ranks: int = 1,
        seed: int = 0,
        epochs: int = 1,
        mode: str = "stream",
        pad_id: Optional[int] = None,
        **options: Any,
    ) -> None:
        flags = plan_flags(
            window=window,
            stride=stride,
            batch_size=batch_size,
            ranks=ranks,
            seed=seed,
            epochs=epochs,
            mode=mode,
            pad_id=pad_id,
            **options,
        )
        self._open(os.fspath(path), flags)

    def _open(self, path: str, flags: Sequence[str]) -> None:
        from . import _native

        self.path = path
        self._flags = list(flags)
        self._view = _native.View(path, self._flags)
        self._info_bytes: bytes = self._view.info_json()
        Source.__init__(self, json.loads(self._info_bytes))

    @classmethod
    def from_config(
        cls,
        config: "str | os.PathLike[str]",
        *,
        plan: Optional[str] = None,
        **options: Any,
    ) -> "Dataset":
        """The mixture of a run configuration (``RUN.toml``: sources, weights, schedule,
        split, quarantine), in-process: the bytes ``shufflefs mount --config RUN.toml MNT``
        serves. ``plan`` chooses one of several ``[[plan]]`` tables (as ``--plan NAME``); the
        other keywords are the mount's remaining flags. The plan itself (window, batch size,
        ranks, seed) comes from the file."""
        path = os.fspath(config)
        flags = ["--config", path] + plan_flags(plan=plan, **options)
        return cls._from_flags(path, flags)

    @classmethod
    def _from_flags(cls, path: str, flags: Sequence[str]) -> "Dataset":
        self = cls.__new__(cls)
        self._open(path, flags)
        return self

    def __reduce__(self) -> Any:
        # Pickles as (path, flags): a DataLoader worker or another process reopens it.
        return (Dataset._from_flags, (self.path, self._flags))

    def __repr__(self) -> str:
        return f"shufflefs.Dataset({self.path!r}, {' '.join(self._flags)})"

    @property
    def flags(self) -> List[str]:
        """The plan as mount flags: ``shufflefs mount DIR MNT <flags>`` serves the same bytes."""
        return list(self._flags)

    @property
    def info_bytes(self) -> bytes:
        """The bytes of the ``info.json`` a mount with these flags serves."""
        return self._info_bytes

    def _read_into(self, epoch: int, rank: int, step: int, raw: np.ndarray) -> None:
        self._view.read_step(epoch, rank, step, raw)

    def step_json_bytes(self, epoch: int, rank: int, step: int) -> bytes:
        self._check_key(epoch, rank, step)
        return bytes(self._view.step_json(epoch, rank, step))
