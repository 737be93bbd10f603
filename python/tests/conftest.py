"""Fixtures: small datasets packed with the `shufflefs` binary, mounts that always unmount.

The binary is $SHUFFLEFS_BIN, else target/release/shufflefs or target/debug/shufflefs of the
repository. Where /dev/fuse cannot be used, mount tests skip locally but fail under CI
(SHUFFLEFS_REQUIRE_FUSE=1 or CI set), as the Rust mount tests do.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
STRICT = os.environ.get("SHUFFLEFS_REQUIRE_FUSE") == "1" or bool(os.environ.get("CI"))


def binary() -> str:
    explicit = os.environ.get("SHUFFLEFS_BIN")
    if explicit:
        return explicit
    for profile in ("release", "debug"):
        candidate = REPO / "target" / profile / "shufflefs"
        if candidate.exists():
            return str(candidate)
    pytest.fail("no shufflefs binary: build it (cargo build --release) or set SHUFFLEFS_BIN")


def run(*args: Any) -> str:
    """Runs the binary; a failure shows its stderr."""
    cmd = [binary(), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    return p.stdout


def fuse_usable() -> bool:
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
    except OSError:
        return False
    os.close(fd)
    return True


def write_documents(path: Path, n_docs: int, seed: int) -> None:
    """JSON Lines documents of varied lengths, with metadata and spans on some."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n_docs):
            n = int(rng.integers(1, 60))
            doc: Dict[str, Any] = {"tokens": rng.integers(0, 70000, n).tolist()}
            if i % 3 == 0:
                doc["meta"] = {"url": f"a.example/{i}", "lang": "en" if i % 2 else "fr"}
            if i % 4 == 1 and n >= 3:
                doc["spans"] = [{"start": 1, "end": 3, "meta": {"concept": i}}]
            f.write(json.dumps(doc) + "\n")


def write_records(path: Path, n: int) -> None:
    """A structured .npy: token and concept per record."""
    rec = np.zeros(n, dtype=[("token", "<u4"), ("concept", "<u2")])
    rec["token"] = np.arange(n, dtype=np.uint32) * 7 + 3
    rec["concept"] = np.arange(n) % 11
    np.save(path, rec)


@pytest.fixture(scope="session")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """Packed datasets by kind: stream (positional u16 tokens, several shards), documents
    (JSON Lines with metadata, u32) and records (structured .npy)."""
    root = tmp_path_factory.mktemp("datasets")
    out: Dict[str, Path] = {}
    run("synth", root / "tokens.bin", "--tokens", 60000, "--dtype", "u16")
    run("pack", root / "stream", root / "tokens.bin", "--dtype", "u16", "--shard-size", "16KiB")
    out["stream"] = root / "stream"
    write_documents(root / "docs.jsonl", 400, seed=5)
    run("pack", root / "documents", root / "docs.jsonl", "--dtype", "u32", "--shard-size", "8KiB")
    out["documents"] = root / "documents"
    write_records(root / "records.npy", 20000)
    run("pack", root / "records", root / "records.npy", "--shard-size", "32KiB")
    out["records"] = root / "records"
    return out


MIXTURE_HEAD = """\
window = 33
stride = 32
batch_size = 4
ranks = 2
seed = 7
steps_per_epoch = 24
epochs = 2
"""


@pytest.fixture(scope="session")
def mixtures(
    tmp_path_factory: pytest.TempPathFactory, datasets: Dict[str, Path]
) -> Dict[str, Path]:
    """Run configurations over two u16 token datasets (positional and random): "schedule"
    (weights and the batch size change at global step 20, a held-out split, a quarantined
    observation) and "plans" (two [[plan]] tables)."""
    root = tmp_path_factory.mktemp("mixtures")
    rng = np.random.default_rng(17)
    rng.integers(0, 50000, 80000, dtype=np.uint16).tofile(root / "random.bin")
    run("pack", root / "random", root / "random.bin", "--dtype", "u16", "--shard-size", "32KiB")
    sources = (
        f'[[source]]\nname = "pos"\npath = "{datasets["stream"]}"\nweight = 0.7\n\n'
        f'[[source]]\nname = "rnd"\npath = "{root / "random"}"\nweight = 0.3\n\n'
    )
    (root / "bad.txt").write_text("rnd 5\n")
    out: Dict[str, Path] = {}
    out["schedule"] = root / "schedule.toml"
    out["schedule"].write_text(
        MIXTURE_HEAD
        + 'quarantine = "bad.txt"\n\n[split]\nval = 0.01\n\n'
        + sources
        + "[[schedule]]\nfrom_step = 20\nweights = { pos = 0.2, rnd = 0.8 }\nbatch_size = 6\n"
    )
    out["plans"] = root / "plans.toml"
    out["plans"].write_text(
        MIXTURE_HEAD
        + sources
        + '[[plan]]\nname = "base"\n\n[[plan]]\nname = "other"\nseed = 99\n'
        + "weights = { pos = 0.5, rnd = 0.5 }\n"
    )
    return out


#: Plans per dataset kind, as Dataset keywords (= mount flags).
PLANS: Dict[str, Dict[str, Any]] = {
    "stream": dict(window=65, stride=64, batch_size=4, ranks=3, seed=11, epochs=2),
    "documents": dict(window=16, batch_size=3, ranks=2, seed=3, epochs=2),
    "documents-mode": dict(window=24, batch_size=2, ranks=2, seed=9, mode="documents", pad_id=7),
    "documents-packed": dict(window=32, batch_size=2, ranks=2, seed=4, epochs=2, mode="packed", bos=1),
    "stream-rewindow": dict(window=65, stride=64, batch_size=4, ranks=3, seed=11, epochs=2, rewindow=True),
    "records": dict(window=33, stride=17, batch_size=5, ranks=2, seed=2, epochs=2),
}


def kind_of(plan: str) -> str:
    return plan.split("-")[0]


def plan_flags(plan: Dict[str, Any]) -> List[str]:
    from shufflefs.dataset import plan_flags as flags

    return flags(**plan)


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """mount(dataset_dir, **plan) -> mountpoint; every mount is unmounted at teardown, even
    when the test fails."""
    if not fuse_usable():
        message = "/dev/fuse cannot be opened here"
        if STRICT:
            pytest.fail(message + " and SHUFFLEFS_REQUIRE_FUSE=1/CI requires mount tests")
        pytest.skip(message)
    mounted: List[Path] = []

    def do_mount(dataset: "Path | None", **plan: Any) -> Path:
        """A dataset directory with plan flags, or None with config=RUN.toml (a mixture)."""
        mnt = tmp_path / f"mnt{len(mounted)}"
        mnt.mkdir()
        if dataset is None:
            run("mount", mnt, *plan_flags(plan))
        else:
            run("mount", dataset, mnt, *plan_flags(plan))
        mounted.append(mnt)
        return mnt

    yield do_mount
    for mnt in mounted:
        p = subprocess.run([binary(), "unmount", str(mnt)], capture_output=True, timeout=60)
        if p.returncode != 0:
            lazy = [binary(), "unmount", "--lazy", str(mnt)]
            subprocess.run(lazy, capture_output=True, timeout=60)
