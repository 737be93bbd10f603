#!/usr/bin/env python3
"""A 7-source mixture against one dataset: mount + first step, and the time per step file.

    python3 scripts/bench_mixture.py [--bin target/release/shufflefs] [--tmp /tmp]

Writes 7 datasets of 20 M u16 tokens (`shufflefs synth`, packed in place), a run
configuration with awkward weights and a schedule change at step 500, then mounts the mixture
and the first dataset alone (same window, stride, batch, ranks, seed; `--cache-size 0` so
every read assembles its file) five times each, interleaved, and prints the medians.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/shufflefs")
    ap.add_argument("--tmp", default="/tmp")
    args = ap.parse_args()
    b = os.path.abspath(args.bin)
    root = tempfile.mkdtemp(dir=args.tmp, prefix="bench-mixture-")
    try:
        os.chdir(root)
        os.mkdir("mnt")
        weights = [0.3, 0.2, 0.15, 0.15, 0.1, 0.07, 0.03]
        text = ("window = 2049\nstride = 2048\nbatch_size = 8\nranks = 8\nseed = 1\n"
                "steps_per_epoch = 1000\nepochs = 1\n")
        for k, w in enumerate(weights):
            subprocess.run([b, "synth", f"s{k}.bin", "--tokens", "20000000", "--dtype", "u16"],
                           check=True, stdout=subprocess.DEVNULL)
            subprocess.run([b, "pack", f"ds{k}", f"s{k}.bin", "--dtype", "u16", "--in-place",
                            "--no-progress"], check=True, stdout=subprocess.DEVNULL)
            text += f'[[source]]\nname = "s{k}"\npath = "ds{k}"\nweight = {w}\n'
        text += ("[[schedule]]\nfrom_step = 500\nweights = { "
                 + ", ".join(f"s{k} = 1" for k in range(7)) + " }\n")
        open("run.toml", "w").write(text)
        single = [b, "mount", "ds0", "mnt", "--window", "2049", "--stride", "2048",
                  "--batch-size", "8", "--ranks", "8", "--seed", "1", "--cache-size", "0"]
        mixture = [b, "mount", "--config", "run.toml", "mnt", "--cache-size", "0"]

        def run(cmd, steps=150):
            t = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            open("mnt/epoch/0/rank/0/step/0.npy", "rb").read()
            first = time.perf_counter() - t
            t = time.perf_counter()
            for s in range(1, steps):
                for r in range(8):
                    open(f"mnt/epoch/0/rank/{r}/step/{s}.npy", "rb").read()
            per = (time.perf_counter() - t) / ((steps - 1) * 8)
            subprocess.run([b, "unmount", "mnt"], check=True, stdout=subprocess.DEVNULL)
            return first, per

        res = {"single dataset": [], "7-source mixture": []}
        for _ in range(5):
            for name, cmd in (("single dataset", single), ("7-source mixture", mixture)):
                res[name].append(run(cmd))
        for name, xs in res.items():
            f = statistics.median(x[0] for x in xs)
            p = statistics.median(x[1] for x in xs)
            print(f"{name}: mount + first step {f * 1000:.1f} ms, {p * 1000:.3f} ms per step file")
    finally:
        subprocess.run([b, "unmount", os.path.join(root, "mnt")], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
