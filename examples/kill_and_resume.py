#!/usr/bin/env python3
"""Kill a training run mid-way, resume it, and check it trains on exactly the batches (and
reaches exactly the losses) of an uninterrupted run: with the mount and without FUSE.

    python examples/kill_and_resume.py                 # both backends, ~1-2 min on 2 cores
    python examples/kill_and_resume.py --backend dataset --steps 200

For each backend: pack a small synthetic corpus with the `shufflefs` binary, run
examples/train_gpt.py to --steps uninterrupted, run it again and SIGKILL it once it has
logged --kill-after steps, start it again (it resumes from its last checkpoint), then compare
the two runs step by step. Exit status 0 when every step matches.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

HERE = Path(__file__).resolve().parent
PLAN = ["--window", "33", "--stride", "32", "--batch-size", "8", "--seed", "1", "--epochs", "2"]


def find_binary(explicit: str | None) -> str:
    for candidate in (explicit, os.environ.get("SHUFFLEFS_BIN")):
        if candidate:
            return candidate
    for profile in ("release", "debug"):
        path = HERE.parent / "target" / profile / "shufflefs"
        if path.exists():
            return str(path)
    sys.exit("no shufflefs binary: cargo build --release, or pass --bin")


def write_corpus(path: Path, tokens: int, vocab: int) -> None:
    """A learnable token stream: each token is followed by one of 4 fixed successors."""
    rng = np.random.default_rng(0)
    successors = rng.integers(0, vocab, size=(vocab, 4))
    choice = rng.integers(0, 4, size=tokens)
    out = np.empty(tokens, dtype=np.uint16)
    t = 0
    for i in range(tokens):
        out[i] = t
        t = successors[t, choice[i]]
    out.tofile(path)


def read_log(path: Path) -> List[Dict[str, object]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def train(source: List[str], ckpt: Path, log: Path, args: argparse.Namespace) -> List[str]:
    return [
        sys.executable, str(HERE / "train_gpt.py"), *source,
        "--ckpt", str(ckpt), "--log", str(log), "--steps", str(args.steps),
        "--ckpt-every", str(args.ckpt_every), "--vocab", str(args.vocab),
    ]  # fmt: skip


def run_backend(name: str, source: List[str], work: Path, args: argparse.Namespace) -> bool:
    print(f"== {name}: uninterrupted run of {args.steps} steps", flush=True)
    ref_log = work / f"{name}-ref.jsonl"
    subprocess.run(train(source, work / f"{name}-ref.pt", ref_log, args), check=True)
    ref = {(r["epoch"], r["step"]): r for r in read_log(ref_log)}

    print(f"== {name}: a run killed (SIGKILL) after {args.kill_after} steps", flush=True)
    ckpt, log = work / f"{name}-run.pt", work / f"{name}-run.jsonl"
    cmd = train(source, ckpt, log, args)
    proc = subprocess.Popen(cmd + ["--step-delay", "0.01"])
    deadline = time.monotonic() + 600  # a watchdog against a hang, not a timing check
    while not (log.exists() and len(read_log(log)) >= args.kill_after):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"{name}: the run ended or hung before step {args.kill_after}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(read_log(log))
    print(f"   killed after {killed_at} logged steps", flush=True)

    print(f"== {name}: resumed run", flush=True)
    subprocess.run(cmd, check=True)
    lines = read_log(log)
    resumed = lines[killed_at:]
    first = (resumed[0]["epoch"], resumed[0]["step"])
    print(f"   resumed at (epoch, step) = {first}; the next batches:")
    print(f"   {'epoch':>5} {'step':>5}  {'sha256 (resumed)':16}  {'sha256 (uninterrupted)':22}  "
          "loss (resumed) / (uninterrupted)")  # fmt: skip
    ok = True
    for i, r in enumerate(resumed):
        key = (r["epoch"], r["step"])
        want = ref.get(key)
        same = want is not None and want["sha"] == r["sha"] and want["loss"] == r["loss"]
        ok &= same
        if i < 5 or not same:
            print(f"   {key[0]:>5} {key[1]:>5}  {r['sha']:16}  {want['sha'] if want else '-':22}  "
                  f"{r['loss']:.6f} / {want['loss'] if want else float('nan'):.6f}"
                  f"{'' if same else '  DIFFERENT'}")  # fmt: skip
    # Every step of the run was trained on the same batch as the uninterrupted run, and the
    # run covered the same steps.
    trained = {(r["epoch"], r["step"]) for r in lines}
    ok &= trained == set(ref) and len(resumed) + killed_at - len(ref) < args.ckpt_every + 1
    print(f"   {len(resumed)} resumed steps: {'all EQUAL to the uninterrupted run' if ok else 'MISMATCH'}",
          flush=True)  # fmt: skip
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["mount", "dataset", "both"], default="both")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--ckpt-every", type=int, default=25)
    p.add_argument("--kill-after", type=int, default=140)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--bin", help="the shufflefs binary")
    p.add_argument("--work", help="keep the files here (default: a temp dir, removed)")
    args = p.parse_args()
    binary = find_binary(args.bin)
    tmp = None if args.work else tempfile.TemporaryDirectory()
    work = Path(args.work or tmp.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    write_corpus(work / "tokens.bin", 200_000, args.vocab)
    ds = work / "ds"
    subprocess.run([binary, "pack", str(ds), str(work / "tokens.bin"), "--dtype", "u16",
                    "--force", "--no-progress", "-q"], check=True)  # fmt: skip
    ok = True
    try:
        if args.backend in ("dataset", "both"):
            ok &= run_backend("dataset", ["--dataset", str(ds), *PLAN[:-2]], work, args)
        if args.backend in ("mount", "both"):
            mnt = work / "mnt"
            mnt.mkdir(exist_ok=True)
            subprocess.run([binary, "mount", str(ds), str(mnt), *PLAN], check=True)
            try:
                ok &= run_backend("mount", ["--mount", str(mnt)], work, args)
            finally:
                subprocess.run([binary, "unmount", str(mnt)], check=False)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print("OK: resumed runs equal uninterrupted runs" if ok else "FAILED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
