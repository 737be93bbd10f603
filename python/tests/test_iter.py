"""Iteration, ring buffers, resume, fingerprints and ranks from the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np
import pytest

import shufflefs
from conftest import PLANS


@pytest.fixture
def sources(
    datasets: Dict[str, Path], mount: Callable[..., Path]
) -> List[shufflefs.Source]:
    kw = PLANS["stream"]
    return [shufflefs.Mount(mount(datasets["stream"], **kw)), shufflefs.Dataset(datasets["stream"], **kw)]


def test_iter_steps_in_order(sources: List[shufflefs.Source]) -> None:
    for src in sources:
        got = list(src.iter_steps(rank=1))
        assert [(b.epoch, b.step) for b in got] == [
            (e, s) for e in range(src.epochs) for s in range(src.steps_per_epoch)
        ]
        for b in got[:: max(1, len(got) // 20)]:
            assert np.array_equal(b.data, src.step(b.epoch, 1, b.step))
        # Fresh arrays: no two batches share memory.
        assert not np.shares_memory(got[0].data, got[1].data)


def test_ring_buffers_reused_exactly_n_steps_later(sources: List[shufflefs.Source]) -> None:
    n = 3
    for src in sources:
        it = src.iter_steps(rank=2, start=(0, 5), buffers=n)
        held: List[Tuple[np.ndarray, np.ndarray]] = []  # (yielded array, copy at yield)
        for k, batch in enumerate(it):
            if k >= 3 * n + 2:
                break
            # Every batch yielded in the last n-1 steps is still intact...
            for arr, copy in held[-(n - 1) :]:
                assert np.array_equal(arr, copy)
            # ...and the ring wraps onto the batch of n steps ago.
            if k >= n:
                assert batch.data is held[k - n][0]
                assert not np.array_equal(held[k - n][1], batch.data)
            assert np.array_equal(batch.data, src.step(batch.epoch, 2, batch.step))
            held.append((batch.data, batch.data.copy()))
        assert len({id(a) for a, _ in held}) == n


def test_resume_equals_uninterrupted(sources: List[shufflefs.Source]) -> None:
    for src in sources:
        full = [(b.epoch, b.step, b.data) for b in src.iter_steps(rank=0)]
        spe = src.steps_per_epoch
        for ckpt in [(0, 0), (0, 7), (0, spe - 1), (1, 0), (1, spe - 2)]:
            g = ckpt[0] * spe + ckpt[1]
            it = src.resume(ckpt, expect_fingerprint=src.fingerprint, rank=0)
            assert it.state_dict() == {"epoch": full[g + 1][0], "step": full[g + 1][1]}
            rest = [(b.epoch, b.step, b.data) for b in it]
            assert len(rest) == len(full) - g - 1
            for (e1, s1, a1), (e2, s2, a2) in zip(rest, full[g + 1 :]):
                assert (e1, s1) == (e2, s2) and np.array_equal(a1, a2)
        # A global step works as a checkpoint too; the last step resumes to nothing.
        assert next(src.resume(spe + 3, src.fingerprint, rank=0)).step == 4
        assert list(src.resume((src.epochs - 1, spe - 1), src.fingerprint, rank=0)) == []


def test_state_dict_continues(sources: List[shufflefs.Source]) -> None:
    src = sources[1]
    it = src.iter_steps(rank=1, buffers=2)
    first = [next(it).data.copy() for _ in range(5)]
    state = it.state_dict()
    rest = src.iter_steps(rank=1, start=state)
    full = list(src.iter_steps(rank=1))
    assert all(np.array_equal(a, b.data) for a, b in zip(first, full[:5]))
    assert all(np.array_equal(a.data, b.data) for a, b in zip(rest, full[5:]))
    assert len(src.iter_steps(rank=1, start=state, stop=(1, 0))) == src.steps_per_epoch - 5


def test_fingerprint_mismatch_refused(datasets: Dict[str, Path], sources: List[shufflefs.Source]) -> None:
    other = shufflefs.Dataset(datasets["stream"], **dict(PLANS["stream"], seed=12))
    assert other.fingerprint != sources[0].fingerprint
    for src in sources:
        with pytest.raises(shufflefs.FingerprintMismatch, match=other.fingerprint):
            src.resume((0, 3), expect_fingerprint=other.fingerprint, rank=0)
        with pytest.raises(shufflefs.FingerprintMismatch):
            src.check_fingerprint("0000000000000000")
        src.check_fingerprint(src.fingerprint)


def test_rank_from_environment(
    sources: List[shufflefs.Source], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = sources[1]  # ranks=3, batch_size=4: global batch 12
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert src.iter_steps().rank == 0
    assert shufflefs.dist_env().source == "default"
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "0")
    it = src.iter_steps()
    assert it.rank == 2
    assert np.array_equal(next(it).data, src.step(0, 2, 0))
    assert shufflefs.dist_env() == shufflefs.DistEnv(2, 3, 0, "environment")
    assert src.iter_steps(rank=1).rank == 1  # explicit wins
    monkeypatch.setenv("WORLD_SIZE", "6")
    with pytest.raises(shufflefs.WorldSizeMismatch, match="ranks=6 batch_size=2"):
        src.iter_steps()
    monkeypatch.setenv("WORLD_SIZE", "5")
    with pytest.raises(shufflefs.WorldSizeMismatch, match="cannot be split"):
        src.iter_steps()
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="RANK"):
        src.iter_steps()


def test_elastic_resume_same_fingerprint_and_global_batches(datasets: Dict[str, Path]) -> None:
    # The recipe WorldSizeMismatch gives: 3 ranks x 4 rows -> 6 ranks x 2 rows.
    a = shufflefs.Dataset(datasets["stream"], **PLANS["stream"])
    b = shufflefs.Dataset(datasets["stream"], **dict(PLANS["stream"], ranks=6, batch_size=2))
    assert a.fingerprint == b.fingerprint
    assert a.steps_per_epoch == b.steps_per_epoch
    for step in (0, 9):
        rows_a = sorted(r.tobytes() for k in range(3) for r in a.step(1, k, step))
        rows_b = sorted(r.tobytes() for k in range(6) for r in b.step(1, k, step))
        assert rows_a == rows_b
    # Resuming the 3-rank checkpoint on 6 ranks passes the fingerprint check.
    assert next(b.resume((1, 3), a.fingerprint, rank=5)).step == 4
