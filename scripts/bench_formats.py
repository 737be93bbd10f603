#!/usr/bin/env python3
"""Pack and mount time, and dataset bytes per token, for every token format shufflefs reads.

    python3 scripts/bench_formats.py [--tokens N] [--mean-doc 1000] [--bin target/release/shufflefs]

Writes N tokens (default 100 M) in each format's byte layout (the layouts of docs/FORMAT.md
section 9, as tests/formats/ checks them against the real writers), with log-normal document
lengths (mean --mean-doc), then times `shufflefs pack --in-place` (a copy for parquet), the
first mount (`shufflefs mount`, returns once the mount serves) and `unmount`, and reports the
dataset directory's bytes per token. Needs numpy (and pyarrow for the parquet row). Files go
to a temp dir under --tmp (default /tmp), removed at the end.
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time

import numpy as np


def lengths(n_tokens, mean, rng):
    out, total = [], 0
    sigma = 1.0
    mu = np.log(mean) - sigma**2 / 2
    while total < n_tokens:
        ls = np.maximum(1, rng.lognormal(mu, sigma, 100_000).astype(np.int64))
        out.append(ls)
        total += int(ls.sum())
    ls = np.concatenate(out)
    cut = np.searchsorted(np.cumsum(ls), n_tokens)
    ls = ls[: cut + 1].copy()
    ls[-1] -= int(ls.sum()) - n_tokens
    return ls[ls > 0]


def tokens(n, vocab, eos, ls, rng):
    t = rng.integers(0, eos, n, dtype=np.int64)
    ends = np.cumsum(ls) - 1
    t[ends] = eos
    return t.astype(np.uint16 if vocab <= 65536 else np.uint32)


def write_megatron(d, toks, ls):
    os.makedirs(d)
    toks.tofile(f"{d}/corpus_text_document.bin")
    item = toks.dtype.itemsize
    code = 8 if item == 2 else 4
    s = len(ls)
    with open(f"{d}/corpus_text_document.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<Q", s) + struct.pack("<Q", s + 1))
        f.write(ls.astype(np.int32).tobytes())
        ptr = np.concatenate([[0], np.cumsum(ls)[:-1]]) * item
        f.write(ptr.astype(np.int64).tobytes())
        f.write(np.arange(s + 1, dtype=np.int64).tobytes())
    return [f"{d}/corpus_text_document.bin"], []


def write_datatrove(d, toks, ls):
    os.makedirs(d)
    toks.tofile(f"{d}/00000_unshuffled.ds")
    np.cumsum(ls).astype(np.uint64).tofile(f"{d}/00000_unshuffled.ds.index")
    with open(f"{d}/00000_unshuffled.ds.metadata", "w") as f:
        f.write(f"gpt2|{toks.dtype.itemsize}\n{len(toks)}\n-")
    return [d], []


def write_nanogpt(d, toks, ls):
    os.makedirs(d)
    toks.tofile(f"{d}/train.bin")
    return [f"{d}/train.bin"], ["--dtype", "u16", "--doc-sep", "50256"]


def write_llmc(d, toks, ls):
    os.makedirs(d)
    files, per = [], 100_000_000
    for k, a in enumerate(range(0, len(toks), per)):
        part = toks[a : a + per]
        header = np.zeros(256, dtype=np.int32)
        header[:3] = [20240520, 1, len(part)]
        name = f"{d}/fineweb_train_{k:06d}.bin"
        with open(name, "wb") as f:
            f.write(header.tobytes())
            f.write(part.tobytes())
        files.append(name)
    return files, ["--doc-start", "50256"]


def write_olmo(d, toks, ls):
    os.makedirs(d)
    toks.astype(np.uint32).tofile(f"{d}/part-0-00000.npy")
    return [f"{d}/part-0-00000.npy"], ["--dtype", "u32", "--doc-sep", "50256"]


def write_parquet(d, toks, ls):
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(d)
    offsets = np.concatenate([[0], np.cumsum(ls)]).astype(np.int32)
    col = pa.ListArray.from_arrays(pa.array(offsets), pa.array(toks.astype(np.int32)))
    pq.write_table(pa.table({"input_ids": col}), f"{d}/train-00000-of-00001.parquet")
    return [f"{d}/train-00000-of-00001.parquet"], ["--dtype", "u16"]


FORMATS = [
    ("Megatron .bin + .idx", write_megatron, True),
    ("datatrove .ds + .ds.index", write_datatrove, True),
    ("nanoGPT train.bin, --doc-sep", write_nanogpt, True),
    ("llm.c shards, --doc-start", write_llmc, True),
    ("OLMo/Dolma u32 .npy, --doc-sep", write_olmo, True),
    ("HF parquet (converted)", write_parquet, False),
]


def du(path):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=100_000_000)
    ap.add_argument("--mean-doc", type=int, default=1000)
    ap.add_argument("--bin", default="target/release/shufflefs")
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    ls = lengths(args.tokens, args.mean_doc, rng)
    toks = tokens(args.tokens, 50257, 50256, ls, rng)
    print(f"{args.tokens:,} tokens, {len(ls):,} documents (mean {args.tokens / len(ls):.0f})")
    print("| format | pack | mount | unmount | dataset dir | bytes/token |")
    print("| --- | --- | --- | --- | --- | --- |")
    root = tempfile.mkdtemp(dir=args.tmp, prefix="bench-formats-")
    try:
        for name, write, in_place in FORMATS:
            if args.only and args.only not in name:
                continue
            src = f"{root}/src-{write.__name__}"
            inputs, flags = write(src, toks, ls)
            ds, mnt = f"{root}/ds", f"{root}/mnt"
            os.makedirs(mnt, exist_ok=True)
            cmd = [args.bin, "pack", ds, *inputs, *flags, "--no-progress"]
            if in_place:
                cmd.append("--in-place")
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            t_pack = time.perf_counter() - t0
            m = json.load(open(f"{ds}/manifest.json"))
            t0 = time.perf_counter()
            subprocess.run(
                [args.bin, "mount", ds, mnt, "--window", "2049", "--stride", "2048",
                 "--batch-size", "8", "--ranks", "8"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            t_mount = time.perf_counter() - t0
            open(f"{mnt}/epoch/0/rank/0/step/0.npy", "rb").read()
            t0 = time.perf_counter()
            subprocess.run([args.bin, "unmount", mnt], check=True, stdout=subprocess.DEVNULL)
            t_unmount = time.perf_counter() - t0
            size = du(ds)
            print(
                f"| {name} | {t_pack:.2f} s | {t_mount * 1000:.0f} ms | {t_unmount * 1000:.0f} ms "
                f"| {size / 1e6:.1f} MB ({m['documents']:,} documents) "
                f"| {size / m['records']:.4f} |",
                flush=True,
            )
            shutil.rmtree(ds)
            shutil.rmtree(src)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
