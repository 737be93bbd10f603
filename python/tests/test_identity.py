"""Mount and in-process backends serve the same bytes, and both equal np.load of S.npy."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Callable, Dict

import numpy as np
import pytest

import shufflefs
from conftest import PLANS, kind_of


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_every_step_identical(
    plan: str, datasets: Dict[str, Path], mount: Callable[..., Path]
) -> None:
    kw = PLANS[plan]
    ds = datasets[kind_of(plan)]
    mnt = mount(ds, **kw)
    m = shufflefs.Mount(mnt)
    d = shufflefs.Dataset(ds, **kw)
    assert m.info_bytes == d.info_bytes
    assert m.info == d.info and m.fingerprint == d.fingerprint
    assert m.steps_per_epoch > 10
    for epoch in range(m.epochs):
        for rank in range(m.ranks):
            for step in range(m.steps_per_epoch):
                expected = np.load(mnt / f"epoch/{epoch}/rank/{rank}/step/{step}.npy")
                a = m.step(epoch, rank, step)
                b = d.step(epoch, rank, step)
                assert a.dtype == expected.dtype == b.dtype
                assert a.shape == expected.shape == b.shape
                assert a.tobytes() == expected.tobytes() == b.tobytes(), (epoch, rank, step)
                assert m.step_json_bytes(epoch, rank, step) == d.step_json_bytes(
                    epoch, rank, step
                )


def test_metadata(datasets: Dict[str, Path], mount: Callable[..., Path]) -> None:
    kw = PLANS["documents-mode"]
    mnt = mount(datasets["documents"], **kw)
    m = shufflefs.Mount(mnt)
    d = shufflefs.Dataset(datasets["documents"], **kw)
    meta = d.step_json(0, 1, 2)
    assert meta == m.step_json(0, 1, 2)
    assert (meta["epoch"], meta["rank"], meta["step"]) == (0, 1, 2)
    assert len(meta["observations"]) == kw["batch_size"]
    assert len(meta["lengths"]) == kw["batch_size"]
    rows = d.step(0, 1, 2)
    for row, length in zip(rows, meta["lengths"]):
        assert (row[length:] == kw["pad_id"]).all()


def test_records_fields(datasets: Dict[str, Path]) -> None:
    d = shufflefs.Dataset(datasets["records"], **PLANS["records"])
    batch = d.step(1, 1, 3)
    assert batch.dtype.names == ("token", "concept")
    starts = d.step_json(1, 1, 3)["token_starts"]
    for row, start in zip(batch, starts):
        pos = np.arange(start, start + PLANS["records"]["window"])
        assert (row["token"] == pos * 7 + 3).all()
        assert (row["concept"] == pos % 11).all()


def test_out_parameter(datasets: Dict[str, Path], mount: Callable[..., Path]) -> None:
    kw = PLANS["stream"]
    m = shufflefs.Mount(mount(datasets["stream"], **kw))
    d = shufflefs.Dataset(datasets["stream"], **kw)
    for src in (m, d):
        out = src.new_buffer()
        got = src.step(1, 2, 5, out=out)
        assert got is out and np.array_equal(out, m.step(1, 2, 5))
        with pytest.raises(ValueError, match="the step is"):
            src.step(0, 0, 0, out=np.empty((1, 2), src.dtype))
        with pytest.raises(ValueError, match="C-contiguous"):
            src.step(0, 0, 0, out=np.empty(src.step_shape[::-1], src.dtype).T)
        ro = src.new_buffer()
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="writeable"):
            src.step(0, 0, 0, out=ro)


def test_errors(datasets: Dict[str, Path], tmp_path: Path) -> None:
    d = shufflefs.Dataset(datasets["stream"], **PLANS["stream"])
    with pytest.raises(ValueError, match="no such step"):
        d.step(0, 3, 0)
    with pytest.raises(ValueError, match="no such step"):
        d.step(0, 0, d.steps_per_epoch)
    with pytest.raises(ValueError, match="no such step"):
        d.step_json(2, 0, 0)
    with pytest.raises(ValueError, match="no-such-flag"):
        shufflefs.Dataset(datasets["stream"], window=8, batch_size=2, no_such_flag=1)
    with pytest.raises(ValueError):
        shufflefs.Dataset(datasets["stream"], window=10**9, batch_size=2)
    with pytest.raises(OSError, match="manifest"):
        shufflefs.Dataset(tmp_path, window=8, batch_size=2)
    with pytest.raises(FileNotFoundError, match="not a shufflefs mount"):
        shufflefs.Mount(tmp_path)


def test_pickle_reopens(datasets: Dict[str, Path]) -> None:
    d = shufflefs.Dataset(datasets["documents"], **PLANS["documents"])
    e = pickle.loads(pickle.dumps(d))
    assert e.info_bytes == d.info_bytes
    assert np.array_equal(e.step(1, 1, 4), d.step(1, 1, 4))
    assert d.flags[:2] == ["--window", "16"]


def test_open_chooses_backend(datasets: Dict[str, Path], mount: Callable[..., Path]) -> None:
    kw = PLANS["stream"]
    mnt = mount(datasets["stream"], **kw)
    assert isinstance(shufflefs.open(mnt), shufflefs.Mount)
    assert isinstance(shufflefs.open(datasets["stream"], **kw), shufflefs.Dataset)
    with pytest.raises(TypeError, match="mount"):
        shufflefs.open(mnt, window=3)


def test_out_dtype(datasets: Dict[str, Path], mount: Callable[..., Path]) -> None:
    kw = dict(PLANS["stream"], out_dtype="int64")
    m = shufflefs.Mount(mount(datasets["stream"], **kw))
    d = shufflefs.Dataset(datasets["stream"], **kw)
    plain = shufflefs.Dataset(datasets["stream"], **PLANS["stream"])
    assert m.info_bytes == d.info_bytes
    assert d.dtype == np.int64 and d.info["dataset_dtype"] == plain.info["dtype"]
    assert d.fingerprint != plain.fingerprint
    for step in range(3):
        a, b = m.step(1, 0, step), d.step(1, 0, step)
        assert a.dtype == b.dtype == np.int64
        assert np.array_equal(a, b)
        assert np.array_equal(a, plain.step(1, 0, step).astype(np.int64))


def test_mixture_with_a_batch_schedule_is_identical(
    mixtures: Dict[str, Path], mount: Callable[..., Path]
) -> None:
    cfg = mixtures["schedule"]
    mnt = mount(None, config=cfg)
    m = shufflefs.Mount(mnt)
    d = shufflefs.Dataset.from_config(cfg)
    assert m.info_bytes == d.info_bytes and m.fingerprint == d.fingerprint
    assert m.variable_shapes and d.variable_shapes
    shapes = set()
    for epoch in range(m.epochs):
        for rank in range(m.ranks):
            for step in range(m.steps_per_epoch):
                expected = np.load(mnt / f"epoch/{epoch}/rank/{rank}/step/{step}.npy")
                a = m.step(epoch, rank, step)
                b = d.step(epoch, rank, step)
                assert expected.shape == m.step_shape_at(epoch, step) == a.shape == b.shape
                assert a.tobytes() == expected.tobytes() == b.tobytes(), (epoch, rank, step)
                assert m.step_json_bytes(epoch, rank, step) == d.step_json_bytes(
                    epoch, rank, step
                )
                shapes.add(a.shape)
    assert shapes == {(4, 33), (6, 33)}
    # A ring of reused buffers holds steps of both sizes.
    for source in (m, d):
        for batch in source.iter_steps(rank=1, buffers=2):
            expected = np.load(mnt / f"epoch/{batch.epoch}/rank/1/step/{batch.step}.npy")
            assert batch.data.shape == expected.shape
            assert batch.data.tobytes() == expected.tobytes()


def test_config_plans_are_chosen_by_name(
    mixtures: Dict[str, Path], mount: Callable[..., Path]
) -> None:
    cfg = mixtures["plans"]
    mnt = mount(None, config=cfg)
    with pytest.raises(ValueError, match="several"):
        shufflefs.Dataset.from_config(cfg)
    with pytest.raises(ValueError, match="no \\[\\[plan\\]\\] named"):
        shufflefs.Dataset.from_config(cfg, plan="nope")
    for name in ("base", "other"):
        m = shufflefs.Mount(mnt / "plan" / name)
        d = shufflefs.Dataset.from_config(cfg, plan=name)
        assert m.info_bytes == d.info_bytes
        for step in range(m.steps_per_epoch):
            assert m.step(1, 1, step).tobytes() == d.step(1, 1, step).tobytes()
