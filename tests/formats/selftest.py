#!/usr/bin/env python3
"""Check the reference writers and readers against each other and against docs/ (formats.md).

For every format: write a small corpus into a temp dir, read it back with read_format.py, and check
that the documents the format's own reader returns are the documents written; parse the bytes by
hand per the layout in the formats note, and check that too. Where the full library can be
imported (olmo_core and datatrove's torch dataset need torch), also check the transcribed
readers against the library. Prints "N passed, M failed" and exits non-zero on a failure.

Usage: selftest.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import read_format as R  # noqa: E402
import write_datatrove  # noqa: E402
import write_hf  # noqa: E402
import write_llmc  # noqa: E402
import write_megatron  # noqa: E402
import write_nanogpt  # noqa: E402
import write_npy  # noqa: E402
import write_olmo  # noqa: E402

RESULTS: list[tuple[str, str]] = []


def check(name: str, cond: bool, detail: str = "") -> None:
    RESULTS.append((name, "ok" if cond else f"FAILED {detail}"))
    print(f"{'ok  ' if cond else 'FAIL'} {name}{'' if cond else ' ' + detail}", flush=True)


def docs_of(r: dict) -> list[list[int]]:
    return [r["tokens"][s:e] for s, e in r["documents"]]


def megatron_layout(prefix: str) -> dict:
    """The .idx parsed per formats.md: 9-byte magic, u64 version 1, u8 dtype code, u64 sequence
    count, u64 document count, then i32 lengths, i64 byte pointers, i64 document indices,
    [i8 modes], all little-endian and unaligned."""
    b = open(prefix + ".idx", "rb").read()
    assert b[:9] == b"MMIDIDX\x00\x00"
    version, code, n, d = struct.unpack_from("<QBQQ", b, 9)
    o = 34
    lens = np.frombuffer(b, "<i4", n, o)
    ptrs = np.frombuffer(b, "<i8", n, o + 4 * n)
    didx = np.frombuffer(b, "<i8", d, o + 12 * n)
    rest = len(b) - (o + 12 * n + 8 * d)
    dt = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f8", 7: "<f4", 8: "<u2"}[code]
    return {"version": version, "code": code, "lens": lens, "ptrs": ptrs, "didx": didx, "rest": rest,
            "itemsize": np.dtype(dt).itemsize, "dtype": dt}


def t_megatron(tmp):
    for dtype, split, parts, files, mm in [("uint16", False, 1, 1, False), ("uint16", True, 3, 2, False),
                                           ("int32", True, 2, 1, True), ("int32", False, 1, 1, False)]:
        d = os.path.join(tmp, f"meg_{dtype}_{split}_{parts}_{files}_{mm}")
        w = write_megatron.write(d, dtype=dtype, files=files, partitions=parts, split=split, multimodal=mm)
        r = R.read_megatron([f["prefix"] for f in w["files"]])
        want = [doc for f in w["files"] for doc in f["documents"]]
        tag = f"megatron {dtype} split={split} partitions={parts} files={files} multimodal={mm}"
        check(f"{tag}: documents", docs_of(r) == want)
        seq_lens = [n for f in w["files"] for doc in f["sequence_lengths"] for n in doc]
        check(f"{tag}: sequences", [e - s for s, e in r["sequences"]] == seq_lens)
        check(f"{tag}: dtype", r["dtype"] == dtype, r["dtype"])
        ok = True
        for f in w["files"]:
            L = megatron_layout(f["prefix"])
            binsize = os.path.getsize(f["prefix"] + ".bin")
            ok &= L["version"] == 1 and L["code"] == (8 if dtype == "uint16" else 4)
            ok &= L["rest"] == (len(L["lens"]) if mm else 0)
            ok &= bool(L["didx"][0] == 0 and L["didx"][-1] == len(L["lens"]))
            ok &= len(L["didx"]) == len(f["documents"]) + 1
            exp_ptrs = np.concatenate([[0], np.cumsum(L["lens"].astype(np.int64))[:-1]]) * L["itemsize"]
            ok &= bool(np.array_equal(L["ptrs"], exp_ptrs))
            ok &= binsize == int(L["lens"].sum()) * L["itemsize"]
        check(f"{tag}: .idx layout per the note", ok)


def t_llmc(tmp):
    for model in ("gpt-2", "llama-3"):
        d = os.path.join(tmp, f"llmc_{model}")
        w = write_llmc.write(d, model=model)
        r = R.read_llmc(w["files"])
        check(f"llmc {model}: documents (split across shards, rejoined)", docs_of(r) == w["documents"])
        itemsize = 2 if model == "gpt-2" else 4
        ok = True
        for p in w["files"]:
            h = np.fromfile(p, dtype="<i4", count=256)
            ok &= os.path.getsize(p) == 1024 + int(h[2]) * itemsize and not h[3:].any()
        check(f"llmc {model}: header and file size", ok)
        check(f"llmc {model}: {len(w['files'])} shards, first is val",
              len(w["files"]) > 2 and "_val_" in w["files"][0] and "_train_" in w["files"][1])


def t_datatrove(tmp):
    for merge, ts, loss in [(False, 2, False), (True, 4, True), (True, 2, False)]:
        d = os.path.join(tmp, f"dt_{merge}_{ts}_{loss}")
        w = write_datatrove.write(d, merge=merge, token_size=ts, loss=loss)
        r = R.read_datatrove(w["files"])
        tag = f"datatrove merge={merge} token_size={ts} loss={loss}"
        check(f"{tag}: documents (as a multiset: datatrove shuffles)",
              sorted(map(tuple, docs_of(r))) == sorted(map(tuple, w["documents_unshuffled"])))
        ok = True
        for p in w["files"]:
            ends = np.fromfile(p + ".index", dtype="<u8")
            ok &= int(ends[-1]) == os.path.getsize(p) // ts and bool(np.all(np.diff(ends.astype(np.int64)) >= 0))
            meta = open(p + ".metadata").read().split("\n")
            ok &= meta[0].endswith(f"|{ts}") and int(meta[1]) == int(ends[-1])
            if loss:
                ok &= os.path.getsize(p + ".loss") == int(ends[-1])
        check(f"{tag}: index = cumulative u64 ends, metadata = name|size, count", ok)
        if loss:
            check(f"{tag}: some loss bytes are 0", 0 in r["loss"] and set(r["loss"]) <= {0, 1})
        check(f"{tag}: every document ends with EOS", all(x[-1] == w["eos"] for x in docs_of(r)))


def t_nanogpt(tmp):
    d = os.path.join(tmp, "nanogpt")
    w = write_nanogpt.write(d)
    for split in ("train", "val"):
        r = R.read_nanogpt([w["splits"][split]["path"]])
        check(f"nanogpt {split}: documents", docs_of(r) == w["splits"][split]["documents"])


def t_olmo(tmp):
    try:
        from olmo_core.data.utils import get_document_lengths, iter_document_indices
    except Exception:
        iter_document_indices = None
    for preset in ("dolma1", "dolma2", "dolma2-bos"):
        d = os.path.join(tmp, f"olmo_{preset}")
        w = write_olmo.write(d, preset=preset)
        r = R.read_olmo(w["files"], w["dtype"], w["eos"], w["bos"], sequence_length=256)
        want = [doc for f in w["documents"] for doc in f]
        check(f"olmo {preset}: documents", docs_of(r) == want)
        rows = [row for p in w["files"] for row in R.read_dolma_metadata(p)]
        base, spans = 0, []
        for p in w["files"]:
            for row in R.read_dolma_metadata(p):
                spans.append([base + int(row[0]), base + int(row[1])])
            base += os.path.getsize(p) // np.dtype(w["dtype"]).itemsize
        check(f"olmo {preset}: .csv.gz start,end = the EOS-scan documents", spans == r["documents"] and len(rows) == len(want))
        check(f"olmo {preset}: no .npy header", open(w["files"][0], "rb").read(6) != b"\x93NUMPY")
        if iter_document_indices is not None:
            import torch

            real = []
            base = 0
            for p in w["files"]:
                for s, e in iter_document_indices(p, eos_token_id=w["eos"], bos_token_id=w["bos"],
                                                  dtype=np.dtype(w["dtype"]).type):
                    real.append([base + s, base + e])
                base += os.path.getsize(p) // np.dtype(w["dtype"]).itemsize
            check(f"olmo {preset}: = real olmo_core iter_document_indices", real == r["documents"])
            same = True
            for inst in r["instances"]:
                ids = torch.tensor(r["tokens"][inst["start"]:inst["start"] + 256])
                same &= get_document_lengths(ids, w["eos"], bos_token_id=w["bos"]).tolist() == inst["doc_lens"]
            check(f"olmo {preset}: doc_lens = real olmo_core get_document_lengths", same)


def t_npy(tmp):
    d = os.path.join(tmp, "npy")
    w = write_npy.write(d)
    for f in w["files"]:
        r = R.read_npy([f["path"]])
        name = os.path.basename(f["path"])
        check(f"npy {name}: tokens", r["tokens"] == f["tokens"])
        off = r["files"][0]["offset"]
        check(f"npy {name}: data offset {off} % {16 if 'legacy' in name else 64} == 0",
              off % (16 if "legacy" in name else 64) == 0)


def t_hf(tmp):
    d = os.path.join(tmp, "hf")
    w = write_hf.write(d)
    p = w["paths"]
    for label, r in [("save_to_disk", R.read_hf_disk(p["disk"], "input_ids")),
                     ("to_parquet", R.read_parquet([p["parquet"]], "input_ids")),
                     ("parquet list<int64>", R.read_parquet([p["parquet_int64"]], "input_ids")),
                     ("parquet list<uint16>", R.read_parquet([p["parquet_uint16"]], "tokens")),
                     ("jsonl input_ids", R.read_jsonl([p["jsonl"]], "input_ids")),
                     ("jsonl tokens", R.read_jsonl([p["jsonl_tokens"]], "tokens"))]:
        check(f"hf {label}: documents (one per row)", docs_of(r) == w["documents"])
    r = R.read_hf_disk(p["disk"], "input_ids")
    check("hf save_to_disk: input_ids is list<int32>", r["dtype"] == "int32", r["dtype"])
    arrow = os.path.join(p["disk"], "data-00000-of-00002.arrow")
    check("hf save_to_disk: .arrow is IPC stream (continuation marker, no ARROW1 magic)",
          open(arrow, "rb").read(4) == b"\xff\xff\xff\xff")
    import pyarrow as pa

    with pa.memory_map(arrow) as src:
        t = pa.ipc.open_stream(src).read_all()
    check("hf save_to_disk: pyarrow.ipc.open_stream reads a shard", t.column_names == ["input_ids", "attention_mask"])


def t_datatrove_torch(tmp):
    """datatrove's own torch dataset (DatatroveFileDataset) on a written file, where torch exists."""
    try:
        import torch  # noqa: F401
        from datatrove.utils.dataset import DatatroveFileDataset
    except Exception:
        return
    d = os.path.join(tmp, "dt_torch")
    w = write_datatrove.write(d, tasks=1)
    p = w["files"][0]
    r = R.read_datatrove([p])
    seq = 63
    ds = DatatroveFileDataset(p, seq, token_size=2, return_positions=True)
    ok = len(ds) == len(r["tokens"]) // (seq + 1)
    for i in range(len(ds)):
        item = ds[i]
        s = i * (seq + 1)
        ok &= item["input_ids"].tolist() == r["tokens"][s:s + seq + 1]
        pos = []
        for j in range(s, s + seq + 1):
            start = max(a for a, b in r["documents"] if a <= j and (b > j or a == j))
            pos.append(j - max(start, s) if j - start >= 0 else 0)
        # datatrove restarts positions at each window start (window-relative)
        ok &= item["positions"].tolist() == pos
    check("datatrove DatatroveFileDataset (real, torch): windows of seq_len+1 and index positions", ok)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", help="write into this directory and keep it")
    a = ap.parse_args()
    tmp = a.keep or tempfile.mkdtemp(prefix="formats-selftest-")
    os.makedirs(tmp, exist_ok=True)
    try:
        for t in (t_megatron, t_llmc, t_datatrove, t_nanogpt, t_olmo, t_npy, t_hf, t_datatrove_torch):
            try:
                t(tmp)
            except Exception as e:
                traceback.print_exc()
                check(f"{t.__name__} raised", False, repr(e))
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    failed = sum(1 for _, s in RESULTS if s != "ok")
    print(f"{len(RESULTS) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
