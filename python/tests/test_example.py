"""examples/kill_and_resume.py: a GPT run killed mid-way and resumed trains on exactly the
batches, with exactly the losses, of an uninterrupted run (mount and in-process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

from conftest import REPO, binary


def test_kill_and_resume_example(tmp_path: Path, mount: Callable[..., Path]) -> None:
    # `mount` only asserts that FUSE is usable (the example mounts and unmounts by itself).
    cmd = [
        sys.executable, str(REPO / "examples" / "kill_and_resume.py"),
        "--steps", "60", "--ckpt-every", "10", "--kill-after", "25",
        "--bin", binary(), "--work", str(tmp_path / "work"),
    ]  # fmt: skip
    # A watchdog against a hang, not a timing check.
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count("all EQUAL to the uninterrupted run") == 2, p.stdout
    assert "OK: resumed runs equal uninterrupted runs" in p.stdout
