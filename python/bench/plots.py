"""The pictures in docs/img, drawn from data measured in this run (matplotlib).

Runs in the peer harness's venv (python/bench/run_peers.sh builds it, its data and the
package), with the harness's modules beside it (target/bench-peers), the raw shards packed
in place at $SHUFFLEFS_DATASET, and two mounts of them (world 1, seed 0, batch 32 x 2048):
$SHUFFLEFS_MOUNT (default flags) and $SHUFFLEFS_MOUNT_PREFILL (--prefill).

- docs/img/shuffle_quality.png: for the first 20,000 windows each loader hands out, the
  source index of the window (recovered from its content, as the harness does) against its
  output position: shufflefs (the mount, through the package), a 10,000-window shuffle
  buffer, and litdata's default shuffle (chunks in random order, items shuffled in blocks).
- docs/img/read_latency.png: the distribution of one step's read time for a paced reader
  (a step, then 5 ms of "compute"), through the default mount, a --prefill mount, and direct
  os.preadv of the same 32 windows from the raw shards (the harness's numpy_pread).
- docs/img/plots.json: the figures the pictures show (percentiles, shuffle metrics).

  python/bench/run_peers.sh --plots     # sets everything up, then runs this
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Dict, Iterator, List

import numpy as np

import bench_peers  # the harness (target/bench-peers), with the package's peers registered
import common

WINDOWS = 20_000
STEPS = 600
PACE = 0.005


def ctx_for(peer_args: List[str]) -> "bench_peers.Ctx":
    args = bench_peers.parse_args(peer_args)
    ddir = common.data_dir(args.data)
    meta = common.load_meta(ddir)
    args.seq_len = args.seq_len or meta["seq_len"]
    return bench_peers.Ctx(args, ddir, meta)


def source_order(name: str, n: int) -> np.ndarray:
    """The source window index of each of the first ``n`` windows the peer ``name`` yields."""
    ctx = ctx_for([])
    keys = []
    got = 0
    for batch in bench_peers.PEER_FNS[name](ctx):
        keys.append(common.window_keys(np.asarray(batch)))
        got += len(batch)
        if got >= n:
            break
    src = common.KeyIndex(ctx.ddir).lookup(np.concatenate(keys)[:n])
    if (src < 0).any():
        raise SystemExit(f"{name}: {int((src < 0).sum())} windows not found in the source")
    return src


def paced(read: Callable[[int], None], steps: int) -> np.ndarray:
    """Read times (µs) of ``steps`` steps, each followed by PACE seconds of "compute"."""
    out = np.empty(steps)
    for s in range(steps):
        t0 = time.perf_counter()
        read(s)
        out[s] = (time.perf_counter() - t0) * 1e6
        time.sleep(PACE)
    return out


def pread_reader() -> Callable[[int], None]:
    """The harness's numpy_pread, one batch per call: 32 windows of its own permutation, each
    one os.preadv of 8 KiB into one buffer (what a step through the mount costs the disk)."""
    it: Iterator[np.ndarray] = iter(bench_peers.PEER_FNS["numpy_pread"](ctx_for([])))
    return lambda s: next(it)


def mount_reader(path: str) -> Callable[[int], None]:
    import shufflefs

    m = shufflefs.Mount(path)
    buf = m.new_buffer()
    return lambda s: m.step(0, 0, s, out=buf)


def metrics(src: np.ndarray, n_windows: int, batch: int) -> Dict[str, float]:
    return {k: round(float(v), 4) for k, v in bench_peers.shuffle_quality(src, n_windows, batch).items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=None, help="directory for the pictures (default docs/img)")
    a = p.parse_args()
    out = a.out or os.path.join(os.environ["SHUFFLEFS_REPO"], "docs", "img")
    os.makedirs(out, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ctx = ctx_for([])
    n_windows = ctx.n_windows
    orders = {
        "shufflefs (mount, package)": source_order("pkg_mount", WINDOWS),
        "shuffle buffer, 10,000 windows": source_order("shuffle_buffer", WINDOWS),
        "litdata default (shuffle=True)": source_order("litdata", WINDOWS),
    }
    data: Dict[str, object] = {
        "windows": WINDOWS,
        "corpus_windows": n_windows,
        "shuffle": {k: metrics(v, n_windows, ctx.B) for k, v in orders.items()},
    }
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2), sharey=True)
    for ax, (name, src) in zip(axes, orders.items()):
        ax.scatter(np.arange(len(src)), src, s=0.3, alpha=0.5, color="#1f5fa8", rasterized=True)
        q = data["shuffle"][name]  # type: ignore[index]
        ax.set_title(f"{name}\nbatch_std {q['batch_std']:.2f}, adj {q['adj']:.2f}", fontsize=10)
        ax.set_xlabel("output position (window)")
    axes[0].set_ylabel("source index (window)")
    fig.suptitle(
        f"Where the first {WINDOWS:,} windows come from ({n_windows:,}-window corpus; "
        "uniform = a filled square)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(os.path.join(out, "shuffle_quality.png"), dpi=110)

    readers = {
        "direct os.preadv (numpy_pread)": pread_reader(),
        "mount, default (passthrough)": mount_reader(os.environ["SHUFFLEFS_MOUNT"]),
        "mount, --prefill": mount_reader(os.environ["SHUFFLEFS_MOUNT_PREFILL"]),
    }
    lat: Dict[str, np.ndarray] = {}
    # Interleaved in blocks of 100 steps, so drift on the VM hits every reader alike.
    parts: Dict[str, List[np.ndarray]] = {k: [] for k in readers}
    for block in range(STEPS // 100):
        for name, read in readers.items():
            offset = block * 100
            parts[name].append(paced(lambda s, r=read, o=offset: r(o + s), 100))
    for name, chunks in parts.items():
        lat[name] = np.concatenate(chunks)[5:]  # the first steps of a mount warm it up
    data["latency_us"] = {
        k: {f"p{q}": round(float(np.percentile(v, q)), 1) for q in (50, 90, 99)} for k, v in lat.items()
    }
    fig, ax = plt.subplots(figsize=(8, 4.2))
    bins = np.logspace(np.log10(10), np.log10(max(float(v.max()) for v in lat.values()) * 1.1), 60)
    for name, v in lat.items():
        p50, p99 = np.percentile(v, [50, 99])
        ax.hist(v, bins=bins, histtype="step", linewidth=1.6, label=f"{name}: p50 {p50:.0f} µs, p99 {p99:.0f} µs")
    ax.set_xscale("log")
    ax.set_xlabel("read time of one step, 32 x 2048 u32 (µs, log scale)")
    ax.set_ylabel("steps")
    ax.set_title(f"A paced reader ({len(next(iter(lat.values())))} steps, 5 ms compute between reads)")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.4)  # room for the legend above the bars
    ax.legend(fontsize=9, loc="upper right")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "read_latency.png"), dpi=110)

    with open(os.path.join(out, "plots.json"), "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    json.dump(data, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
