"""The mount backend: step files read with plain file I/O."""

from __future__ import annotations

import io
import json
import os
from typing import Any, Dict, List, Tuple

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
        # The checked header of each step shape.
        self._headers: Dict[Tuple[int, ...], bytes] = {}

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
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if self.variable_shapes:
                # Steps of another batch size may have a header of another length.
                header = bytearray(max(0, os.fstat(fd).st_size - len(raw)))
            else:
                header = bytearray(self._header_bytes)
            want = len(header) + len(raw)
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
        shape = self.step_shape_at(epoch, step)
        if header != self._headers.get(shape):
            self._check_header(path, bytes(header), shape)

    def _check_header(self, path: str, header: bytes, shape: Tuple[int, ...]) -> None:
        """Checks the header of a step file of ``shape`` against info.json once; later
        headers of that shape must equal it."""
        if shape in self._headers:
            raise OSError(f"{path}: the .npy header differs from the other step files'")
        stream = io.BytesIO(header)
        try:
            version = np.lib.format.read_magic(stream)
            if version == (1, 0):
                found, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
            else:
                found, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        except ValueError as e:
            raise OSError(f"{path}: not the .npy header info.json describes: {e}") from None
        if tuple(found) != shape or dtype != self._dtype or fortran:
            raise OSError(
                f"{path}: header says {tuple(found)} {dtype}, info.json {shape} {self._dtype}"
            )
        self._headers[shape] = header

    def step_json_bytes(self, epoch: int, rank: int, step: int) -> bytes:
        self._check_key(epoch, rank, step)
        with open(self.step_path(epoch, rank, step, "json"), "rb") as f:
            return f.read()
