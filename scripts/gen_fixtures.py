#!/usr/bin/env python3
"""Writes the golden .npy files in tests/fixtures with numpy itself.

Run by hand (needs numpy; the pack inputs also pyarrow, zstandard and lz4); the outputs
are committed. The Rust tests compare shufflefs's
.npy encoder with these files byte for byte, so any drift from numpy's header rules shows.
"""
import pathlib

import numpy as np

out = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
out.mkdir(parents=True, exist_ok=True)
np.save(out / "step_u4_4x6.npy", (np.arange(24, dtype="<u4") * 7).reshape(4, 6))
np.save(out / "step_u1_3x5.npy", np.arange(15, dtype="|u1").reshape(3, 5))
np.save(out / "step_i8_2x3.npy", np.array([[-1, 2, -3], [4, -5, 6]], dtype="<i8"))
np.save(out / "tokens_u2_1d.npy", np.arange(1000, dtype="<u2"))
tc = np.zeros(5, dtype=[("token", "<u4"), ("concept", "<u2")])
tc["token"] = np.arange(5) * 3
tc["concept"] = np.arange(5) + 100
np.save(out / "structured_tc_1d.npy", tc)
print(f"wrote fixtures to {out} with numpy {np.__version__}")

# Inputs of `shufflefs pack` written by the real tools (tests/it/inputs.rs): token files pack
# accepts, and files it must recognise and refuse. Needs numpy, pyarrow, zstandard and lz4.
import bz2
import gzip
import io
import json
import lzma
import struct
import tarfile
import zipfile

import lz4.frame
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

inp = out / "inputs"
inp.mkdir(exist_ok=True)


def llmc(path, magic, version, toks):
    # As llm.c's dev/data/data_common.py write_datafile: 256 int32 header, then the tokens.
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = magic, version, len(toks)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.tobytes())


gpt2 = (np.arange(1000, dtype=np.int64) * 37 % 50257).astype(np.uint16)
llama3 = (np.arange(600, dtype=np.int64) * 7919 % 128256).astype(np.uint32)
llmc(inp / "llmc_gpt2.bin", 20240520, 1, gpt2)
llmc(inp / "llmc_llama3.bin", 20240801, 7, llama3)

# .npy format versions 2.0 and 3.0 (np.save picks 1.0 whenever the header fits).
for version, name, arr in [
    ((2, 0), "npy_v2_u4.npy", llama3),
    ((3, 0), "npy_v3_i8.npy", np.arange(-50, 250, dtype="<i8")),
]:
    with open(inp / name, "wb") as f:
        np.lib.format.write_array(f, arr, version=version)
np.save(inp / "npy_fortran_2d.npy", np.asfortranarray(np.arange(12, dtype="<u4").reshape(3, 4)))
np.save(inp / "npy_c_2d.npy", np.arange(12, dtype="<u4").reshape(3, 4))
np.save(inp / "npy_object.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
np.save(inp / "npy_big_endian.npy", np.arange(8, dtype=">u2"))

# A token table as Hugging Face datasets keeps it: parquet, an Arrow IPC file, and the Arrow
# IPC stream that Dataset.save_to_disk writes (data-00000-of-0000N.arrow).
table = pa.table({"input_ids": pa.array([[1, 2, 3], [4, 5]], type=pa.list_(pa.int32()))})
table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": {}}})})
pq.write_table(table, inp / "table.parquet")
with pa.OSFile(str(inp / "table.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
    w.write_table(table)
with pa.OSFile(str(inp / "data-00000-of-00001.arrow"), "wb") as f:
    with pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)

# Megatron-LM: PREFIX.bin raw tokens and PREFIX.idx, as its _IndexWriter writes them.
docs = [gpt2[:300], gpt2[300:1000]]
with open(inp / "megatron_text_document.bin", "wb") as f:
    for d in docs:
        f.write(d.tobytes())
with open(inp / "megatron_text_document.idx", "wb") as f:
    lengths = [len(d) for d in docs]
    f.write(b"MMIDIDX\x00\x00")
    f.write(struct.pack("<Q", 1))
    f.write(struct.pack("<B", 8))  # DType.uint16
    f.write(struct.pack("<Q", len(lengths)))
    f.write(struct.pack("<Q", len(lengths) + 1))
    f.write(np.array(lengths, dtype=np.int32).tobytes())
    f.write(np.array([0, 2 * lengths[0]], dtype=np.int64).tobytes())
    f.write(np.array([0, 1, 2], dtype=np.int64).tobytes())

# datatrove's DocumentTokenizer: NAME.ds (u16 tokens), NAME.ds.index (u64 document ends),
# NAME.ds.metadata ("<tokenizer>|<token size>", token count, humanized count, as
# datatrove's TokenizedFile writes it).
with open(inp / "00000_unshuffled.ds", "wb") as f:
    f.write(gpt2.tobytes())
with open(inp / "00000_unshuffled.ds.index", "wb") as f:
    f.write(struct.pack("<2Q", 300, 1000))
with open(inp / "00000_unshuffled.ds.metadata", "w") as f:
    f.write("\n".join(["gpt2|2", "1000", "1.0 kT"]))

# Archives and compressed token files.
raw = gpt2.tobytes()
(inp / "tokens.bin.gz").write_bytes(gzip.compress(raw, mtime=0))
(inp / "tokens.bin.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
(inp / "tokens.bin.bz2").write_bytes(bz2.compress(raw))
(inp / "tokens.bin.xz").write_bytes(lzma.compress(raw))
(inp / "tokens.bin.lz4").write_bytes(lz4.frame.compress(raw))
with zipfile.ZipFile(inp / "tokens.zip", "w") as z:
    z.writestr("tokens.bin", raw)
# torch.save's layout: an uncompressed zip of archive/data.pkl and archive/data/N.
with zipfile.ZipFile(inp / "tokens.pt", "w", zipfile.ZIP_STORED) as z:
    z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    z.writestr("archive/data/0", raw)
with tarfile.open(inp / "tokens.tar", "w", format=tarfile.USTAR_FORMAT) as t:
    info = tarfile.TarInfo("tokens.bin")
    info.size, info.mtime = len(raw), 0
    t.addfile(info, io.BytesIO(raw))

# Text where token ids belong: JSON, JSON Lines under another name, plain text.
(inp / "tokens.json").write_text(json.dumps({"input_ids": gpt2[:40].tolist()}))
(inp / "docs.txt").write_text(
    "".join(json.dumps({"text": f"document {k}"}) + "\n" for k in range(8))
)
(inp / "corpus.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n")
print(f"wrote pack inputs to {inp}")
