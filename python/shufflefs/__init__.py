"""shufflefs for Python: read a rank's shuffled batches as numpy arrays.

Two backends with one API and identical bytes:

- :class:`Mount` reads the step files of a ``shufflefs mount`` with plain file I/O;
- :class:`Dataset` opens a packed dataset directory in this process (no FUSE: for hosts and
  containers without ``/dev/fuse``), through the same Rust core as the mount.

>>> import shufflefs
>>> m = shufflefs.Mount("/mnt/train")                  # m.info is info.json as a dict
>>> d = shufflefs.Dataset("/data/ds", window=2049, stride=2048, batch_size=8, ranks=64,
...                       seed=1234)                  # the mount's plan flags as keywords
>>> a = m.step(0, 3, 17)                               # equal to np.load of S.npy
>>> for epoch, step, batch in d.iter_steps(rank=3, buffers=2):   # a ring of 2 buffers
...     ...

``shufflefs.torch`` has a PyTorch ``IterableDataset``; ``shufflefs.jax`` places batches on
JAX devices.
"""

from ._env import DistEnv, dist_env
from ._source import (
    Batch,
    FingerprintMismatch,
    Position,
    Source,
    StepIterator,
    WorldSizeMismatch,
)
from .dataset import Dataset
from .mount import Mount

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "Dataset",
    "DistEnv",
    "FingerprintMismatch",
    "Mount",
    "Position",
    "Source",
    "StepIterator",
    "WorldSizeMismatch",
    "dist_env",
    "open",
]


def open(path: "str | os.PathLike[str]", **plan: object) -> Source:  # noqa: A001
    """A :class:`Mount` when ``path`` is a shufflefs mount (it has ``info.json``), else a
    :class:`Dataset` of the packed dataset directory with the plan keywords ``plan``."""
    import os

    if os.path.exists(os.path.join(os.fspath(path), "info.json")):
        if plan:
            raise TypeError(
                f"{path} is a mount: its plan was fixed at mount time ({', '.join(plan)} given)"
            )
        return Mount(path)
    return Dataset(path, **plan)  # type: ignore[arg-type]
