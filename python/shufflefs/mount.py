"""The mount backend: step files read with plain file I/O."""

from __future__ import annotations

import io
import json
import os
from typing import Any, Dict, List, Optional

import numpy as np

from ._source import Source


class Mount(Source):
    """A ``shufflefs mount``: ``step()`` reads ``MOUNT/epoch/E/rank/R/step/S.npy``.

    Each read is one ``open`` + one ``preadv`` (header into a scratch buffer, rows straight
    into the output array) + ``close``: no ``np.load`` parsing. The header of every file is
    compared with the one checked at the first read.
    """

    def __init__(self, path: "str | os.PathLike[str]") -> None:
        self.path = os.fspath(path)
        info_path = os.path.join(self.path, "info.json")
        try:
            with open(info_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{info_path} does not exist: {self.path} is not a shufflefs mount (mount it "
                "with `shufflefs mount DATASET_DIR MOUNTPOINT ...`, or open the dataset "
                "directory in-process with shufflefs.Dataset)"
            ) from None
        self._info_bytes = raw
        super().__init__(json.loads(raw))
        self._header: Optional[bytes] = None

    def __repr__(self) -> str:
        return f"shufflefs.Mount({self.path!r})"

    def __reduce__(self) -> Any:
        return (Mount, (self.path,))

    @property
    def info_bytes(self) -> bytes:
        """The bytes of ``info.json`` as read at open."""
        return self._info_bytes

    def stats(self) -> Dict[str, Any]:
        """The mount's live counters, ``stats.json``."""
        with open(os.path.join(self.path, "stats.json"), "rb") as f:
            return json.loads(f.read())

    def step_path(self, epoch: int, rank: int, step: int, suffix: str = "npy") -> str:
        """The path of a step file."""
        return f"{self.path}/epoch/{epoch}/rank/{rank}/step/{step}.{suffix}"

    def _read_into(self, epoch: int, rank: int, step: int, raw: np.ndarray) -> None:
        path = self.step_path(epoch, rank, step)
        header = bytearray(self._header_bytes)
        want = len(header) + len(raw)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            n = os.preadv(fd, [header, raw], 0)
            while n < want:
                # A short read (rare): continue where it stopped.
                if n < len(header):
                    parts: List[Any] = [memoryview(header)[n:], raw]
                else:
                    parts = [memoryview(raw)[n - len(header) :]]
                got = os.preadv(fd, parts, n)
                if got == 0:
                    raise OSError(
                        f"{path}: {n} bytes, but info.json says step files are {want} bytes"
                    )
                n += got
        finally:
            os.close(fd)
        if header != self._header:
            self._check_header(path, bytes(header))

    def _check_header(self, path: str, header: bytes) -> None:
        """Checks a step file's header against info.json once; later headers must equal it."""
        if self._header is not None:
            raise OSError(f"{path}: the .npy header differs from the other step files'")
        stream = io.BytesIO(header)
        try:
            version = np.lib.format.read_magic(stream)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        except ValueError as e:
            raise OSError(f"{path}: not the .npy header info.json describes: {e}") from None
        if tuple(shape) != self._shape or dtype != self._dtype or fortran:
            raise OSError(
                f"{path}: header says {tuple(shape)} {dtype}, info.json {self._shape} "
                f"{self._dtype}"
            )
        self._header = header

    def step_json_bytes(self, epoch: int, rank: int, step: int) -> bytes:
        self._check_key(epoch, rank, step)
        with open(self.step_path(epoch, rank, step, "json"), "rb") as f:
            return f.read()
