"""Shared helpers for the reference writers and readers in tests/formats/.

Every writer makes the same kind of corpus: a seeded list of documents (lists of token ids) with
log-normal lengths, ids drawn from a vocabulary that excludes the format's special ids (so a
document boundary is never ambiguous), plus a few edge cases every real corpus has (a one-token
document, a long one). The writers then store the corpus exactly as the real writer does.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import types

import numpy as np


def lognormal_lengths(rng: np.random.Generator, n: int, mean: float, sigma: float) -> np.ndarray:
    """n lengths >= 1 from a log-normal distribution with the given mean (mu chosen so that
    E[len] = mean before rounding) and shape sigma."""
    mu = math.log(mean) - sigma * sigma / 2.0
    lens = np.rint(rng.lognormal(mu, sigma, size=n)).astype(np.int64)
    return np.maximum(lens, 1)


def make_docs(
    seed: int,
    n_docs: int,
    mean_len: float,
    vocab: int,
    exclude: tuple[int, ...] = (),
    sigma: float = 1.0,
    low: int = 0,
) -> list[list[int]]:
    """Documents of plain token ids in [low, vocab), none in `exclude`. The first document has
    one token and one document is about 8x the mean, so every corpus has the edge cases."""
    rng = np.random.default_rng(seed)
    lens = lognormal_lengths(rng, n_docs, mean_len, sigma)
    if n_docs >= 1:
        lens[0] = 1
    if n_docs >= 3:
        lens[n_docs // 2] = int(mean_len * 8)
    excl = np.array(sorted(set(exclude)), dtype=np.int64)
    docs = []
    for n in lens:
        ids = rng.integers(low, vocab, size=int(n), dtype=np.int64)
        if excl.size:
            bad = np.isin(ids, excl)
            while bad.any():
                ids[bad] = rng.integers(low, vocab, size=int(bad.sum()), dtype=np.int64)
                bad = np.isin(ids, excl)
        docs.append([int(x) for x in ids])
    return docs


def emit(obj) -> None:
    """Print one JSON object on stdout (the contract with the Rust tests)."""
    json.dump(obj, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


def spans_from_lengths(lengths) -> list[list[int]]:
    """[[start, end), ...] token spans from document lengths."""
    out, pos = [], 0
    for n in lengths:
        out.append([pos, pos + int(n)])
        pos += int(n)
    return out


# --- megatron-core without torch ---------------------------------------------------------------
#
# megatron/core/datasets/indexed_dataset.py needs torch only for `torch.utils.data.Dataset` (a base
# class), type annotations, and `torch.distributed.is_initialized()` in its logging helper. The
# PyPI torch wheel pulls ~3 GB of CUDA wheels, so we run the real module file from the installed
# megatron-core wheel (`pip install --no-deps megatron-core`) with a minimal stand-in for those
# three names. Nothing of Megatron's byte handling is replaced: the writer and reader code that
# runs is the wheel's own file.


def _torch_stub() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__shufflefs_stub__ = True

    class Tensor:  # only used in annotations by indexed_dataset.py
        pass

    class Dataset:
        pass

    utils = types.ModuleType("torch.utils")
    data = types.ModuleType("torch.utils.data")
    data.Dataset = Dataset
    utils.data = data
    dist = types.ModuleType("torch.distributed")
    dist.is_initialized = lambda: False
    dist.get_rank = lambda: 0
    torch.Tensor = Tensor
    torch.utils = utils
    torch.distributed = dist
    sys.modules.update(
        {"torch": torch, "torch.utils": utils, "torch.utils.data": data, "torch.distributed": dist}
    )
    return torch


def _load_file(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def megatron_indexed_dataset() -> types.ModuleType:
    """The installed megatron-core wheel's megatron/core/datasets/indexed_dataset.py, imported
    without executing megatron/core/__init__.py (which needs the whole of torch)."""
    if "megatron.core.datasets.indexed_dataset" in sys.modules:
        return sys.modules["megatron.core.datasets.indexed_dataset"]
    from importlib import metadata

    dist = metadata.distribution("megatron-core")
    root = str(dist.locate_file("megatron"))
    if not os.path.isfile(os.path.join(root, "core", "datasets", "indexed_dataset.py")):
        raise RuntimeError(f"megatron-core is installed but {root}/core/datasets is missing")
    try:
        import torch  # noqa: F401  (a real torch, if present, is used as is)

        stub = False
    except ImportError:
        _torch_stub()
        stub = True
    for pkg, sub in (("megatron", ""), ("megatron.core", "core"), ("megatron.core.datasets", "core/datasets")):
        m = types.ModuleType(pkg)
        m.__path__ = [os.path.join(root, sub)] if sub else [root]
        sys.modules[pkg] = m
    _load_file("megatron.core.msc_utils", os.path.join(root, "core", "msc_utils.py"))
    rank = _load_file("megatron.core._rank_utils", os.path.join(root, "core", "_rank_utils.py"))
    # megatron.core.utils imports half of megatron and torch; indexed_dataset only takes
    # log_single_rank from it, which lives in _rank_utils.
    utils = types.ModuleType("megatron.core.utils")
    utils.log_single_rank = rank.log_single_rank
    sys.modules["megatron.core.utils"] = utils
    _load_file(
        "megatron.core.datasets.object_storage_utils",
        os.path.join(root, "core", "datasets", "object_storage_utils.py"),
    )
    mod = _load_file(
        "megatron.core.datasets.indexed_dataset",
        os.path.join(root, "core", "datasets", "indexed_dataset.py"),
    )
    if stub:
        # the loaded modules keep their reference; other libraries (datasets, datatrove) probe
        # for torch and must not find the stand-in
        for name in ("torch", "torch.utils", "torch.utils.data", "torch.distributed"):
            sys.modules.pop(name, None)
    return mod


def megatron_version() -> str:
    from importlib import metadata

    return metadata.version("megatron-core")
