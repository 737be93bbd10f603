"""shufflefs.torch: DataLoader with 0 and 2 workers, int64, state_dict resume."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import pytest
import torch

import shufflefs
from conftest import PLANS
from shufflefs.torch import StepDataset


def expected(src: shufflefs.Source, rank: int) -> List[np.ndarray]:
    return [b.data for b in src.iter_steps(rank=rank)]


@pytest.mark.parametrize("backend", ["mount", "dataset"])
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_covers_each_step_once_in_order(
    backend: str, workers: int, datasets: Dict[str, Path], mount: Callable[..., Path]
) -> None:
    kw = PLANS["stream"]
    if backend == "mount":
        src: shufflefs.Source = shufflefs.Mount(mount(datasets["stream"], **kw))
    else:
        src = shufflefs.Dataset(datasets["stream"], **kw)
    ds = StepDataset(src, rank=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    got = list(loader)
    want = expected(src, 1)
    assert len(got) == len(want) == len(ds) == src.total_steps
    for t, a in zip(got, want):
        assert t.dtype == torch.int64 and tuple(t.shape) == src.step_shape
        assert np.array_equal(t.numpy(), a.astype(np.int64))
    # Each step exactly once: the rows (positional tokens) of all steps never repeat within
    # an epoch.
    for e in range(src.epochs):
        epoch = got[e * src.steps_per_epoch : (e + 1) * src.steps_per_epoch]
        firsts = [int(t[r, 0]) for t in epoch for r in range(t.shape[0])]
        assert len(set(firsts)) == len(firsts)


def test_worker_shares_are_disjoint(datasets: Dict[str, Path]) -> None:
    src = shufflefs.Dataset(datasets["stream"], **PLANS["stream"])

    class Tagged(StepDataset):
        def _read(self, epoch, step, scratch, shared):  # type: ignore[no-untyped-def]
            info = torch.utils.data.get_worker_info()
            return torch.tensor([epoch, step, info.id if info else -1])

    loader = torch.utils.data.DataLoader(Tagged(src, rank=0), batch_size=None, num_workers=2)
    tags = [tuple(t.tolist()) for t in loader]
    assert [(e, s) for e, s, _ in tags] == [
        (e, s) for e in range(src.epochs) for s in range(src.steps_per_epoch)
    ]
    assert [w for _, _, w in tags] == [k % 2 for k in range(len(tags))]


# pin_memory=True is accepted and passed to the DataLoader; without an accelerator torch warns
# and returns unpinned tensors, which is what this machine can check.
@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
@pytest.mark.parametrize("workers", [0, 2])
def test_loader_state_dict_resume(workers: int, datasets: Dict[str, Path]) -> None:
    src = shufflefs.Dataset(datasets["stream"], **PLANS["stream"])
    want = expected(src, 2)
    loader = StepDataset(src, rank=2).loader(num_workers=workers, pin_memory=True)
    got = []
    for t in loader:
        got.append(t.numpy().copy())
        if len(got) == 9:
            break
    state = loader.state_dict()
    assert state == {"epoch": 0, "step": 9}
    # A new process would rebuild the loader and load the state.
    again = StepDataset(src, rank=2).loader(num_workers=workers)
    again.load_state_dict(state)
    assert len(again) == len(want) - 9
    got += [t.numpy() for t in again]
    assert again.state_dict() == {"epoch": src.epochs, "step": 0}
    assert len(got) == len(want)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_dataset_state_dict_in_process(datasets: Dict[str, Path]) -> None:
    src = shufflefs.Dataset(datasets["stream"], **PLANS["stream"])
    ds = StepDataset(src, rank=0, start=(1, 3))
    it = iter(torch.utils.data.DataLoader(ds, batch_size=None))
    first = next(it)
    assert np.array_equal(first.numpy(), src.step(1, 0, 3))
    assert ds.state_dict() == {"epoch": 1, "step": 4}


def test_dtypes_and_fields(datasets: Dict[str, Path]) -> None:
    src = shufflefs.Dataset(datasets["stream"], **PLANS["stream"])
    native = next(iter(StepDataset(src, rank=0, dtype=None)))
    assert native.dtype == torch.uint16
    assert np.array_equal(native.numpy(), src.step(0, 0, 0))
    rec = shufflefs.Dataset(datasets["records"], **PLANS["records"])
    item = next(iter(StepDataset(rec, rank=1)))
    want = rec.step(0, 1, 0)
    assert set(item) == {"token", "concept"}
    for name in item:
        assert item[name].dtype == torch.int64
        assert np.array_equal(item[name].numpy(), want[name])


def test_loader_refuses_batching(datasets: Dict[str, Path]) -> None:
    src = shufflefs.Dataset(datasets["stream"], **PLANS["stream"])
    with pytest.raises(TypeError, match="batch_size"):
        StepDataset(src, rank=0).loader(batch_size=2)
    with pytest.raises(ValueError, match="persistent"):
        StepDataset(src, rank=0).loader(num_workers=1, persistent_workers=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_mixture_with_a_batch_schedule_through_a_loader(
    workers: int, mixtures: Dict[str, Path]
) -> None:
    src = shufflefs.Dataset.from_config(mixtures["schedule"])
    got = list(StepDataset(src, rank=0).loader(num_workers=workers))
    want = expected(src, 0)
    assert len(got) == len(want) == src.total_steps
    for t, a in zip(got, want):
        assert tuple(t.shape) == a.shape and np.array_equal(t.numpy(), a.astype(np.int64))
    assert {tuple(t.shape) for t in got} == {(4, 33), (6, 33)}
