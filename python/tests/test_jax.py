"""shufflefs.jax: batches on 2 (host-emulated) CPU devices, rows sharded.

The checks run in a child interpreter: JAX starts threads at import, and the torch tests fork
DataLoader workers from this process; XLA_FLAGS must also be set before JAX starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import numpy as np

from conftest import PLANS


def run_child(check: str, dataset: Path, plan: Dict[str, Any]) -> None:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    p = subprocess.run(
        [sys.executable, __file__, check, str(dataset), json.dumps(plan)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,  # a watchdog against a hang, not a timing check
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().endswith(f"{check} ok"), p.stdout


def test_batches_sharded_over_local_devices(datasets: Dict[str, Path]) -> None:
    run_child("sharded", datasets["stream"], dict(PLANS["stream"], batch_size=4))


def test_rows_must_split(datasets: Dict[str, Path]) -> None:
    run_child("indivisible", datasets["stream"], dict(PLANS["stream"], batch_size=3))


def check_sharded(src: Any) -> None:
    import jax

    from shufflefs.jax import iter_device_batches

    assert len(jax.local_devices()) == 2
    got = list(iter_device_batches(src, rank=1, start=(1, 0), stop=(1, 6)))
    assert [(b.epoch, b.step) for b in got] == [(1, s) for s in range(6)]
    for b in got:
        want = src.step(b.epoch, 1, b.step).astype(np.int32)
        assert b.data.dtype == np.int32
        assert np.array_equal(np.asarray(b.data), want)
        shards = sorted(b.data.addressable_shards, key=lambda s: s.index[0].start or 0)
        assert len(shards) == 2 and {s.device for s in shards} == set(jax.local_devices())
        assert np.array_equal(np.asarray(shards[0].data), want[:2])
        assert np.array_equal(np.asarray(shards[1].data), want[2:])


def check_indivisible(src: Any) -> None:
    from shufflefs.jax import device_put_batch

    try:
        device_put_batch(src.step(0, 0, 0))
    except ValueError as e:
        assert "2 devices" in str(e), e
    else:
        raise AssertionError("3 rows over 2 devices was accepted")


if __name__ == "__main__":
    import shufflefs

    check, dataset, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    globals()[f"check_{check}"](shufflefs.Dataset(dataset, **plan))
    print(f"{check} ok")
