#!/usr/bin/env python3
"""Print a token dataset as that format's own reader sees it: one JSON object on stdout.

Usage: read_format.py FORMAT PATH [PATH ...] [options]

FORMAT and PATH:
  megatron   PREFIX (PREFIX.bin + PREFIX.idx), several prefixes allowed
  llmc       shard .bin files (llm.c, header 20240520/1 or 20240801/7), in the order given
  datatrove  .ds files (with .ds.index, .ds.metadata beside them)
  nanogpt    train.bin / val.bin (headerless uint16) [--eos 50256]
  olmo       raw .npy token files (headerless) --dtype uint16|uint32 --eos ID [--bos ID]
  npy        .npy files with a header (numpy.load)
  hf-disk    a `save_to_disk` directory [--column input_ids]
  parquet    .parquet files [--column input_ids]
  jsonl      JSON Lines files [--column input_ids]

Output (all formats):
  format, dtype (the token type on disk, or of the column),
  files: [{path, offset (bytes before token 0), tokens}] for the in-place formats,
  tokens: every token id in reading order (files concatenated in the order given),
  documents: [[start, end), ...] token spans into `tokens`, as the format's own reader delimits
             documents (see docs in each function; null where the format has none),
  plus format-specific fields (megatron: sequences, document_indices; olmo: instances, doc_lens).
Each reader is the library's own code where it installs without torch (megatron-core's
IndexedDataset, numpy, datasets, pyarrow, datatrove's merger helpers), otherwise a line-for-line
transcription of the named source (llm.c, OLMo-core: see the functions).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import struct

import numpy as np

from common import emit, megatron_indexed_dataset


def _spans(bounds: list[int]) -> list[list[int]]:
    return [[int(bounds[i]), int(bounds[i + 1])] for i in range(len(bounds) - 1)]


# --- Megatron-LM ---------------------------------------------------------------------------------


def read_megatron(prefixes: list[str]) -> dict:
    """megatron.core.datasets.indexed_dataset.IndexedDataset (the real class).

    A *sequence* is one entry of the index (`dataset[i]`, `dataset.get(i, offset, length)`): its
    tokens are `sequence_lengths[i]` items of the index dtype at byte `sequence_pointers[i]` of the
    .bin. A *document* d is the run of sequences document_indices[d] .. document_indices[d+1]
    (document_indices starts with 0 and ends with the sequence count). GPTDataset samples over
    sequences (it calls `dataset.get(sequence_id, ...)`), so for GPT training each sequence is a
    "document"; without --split-sentences the two coincide."""
    idx_mod = megatron_indexed_dataset()
    tokens, seqs, docs, files, doc_idx_all, modes_all = [], [], [], [], [], []
    dtype = None
    for prefix in prefixes:
        idx_path = prefix + ".idx"
        with open(idx_path, "rb") as f:
            head = f.read(34)
        n_seq, n_doc = struct.unpack("<QQ", head[18:34])
        size = os.path.getsize(idx_path)
        base = 34 + 12 * n_seq + 8 * n_doc
        multimodal = size == base + n_seq
        if size not in (base, base + n_seq):
            raise ValueError(f"{idx_path}: size {size} is neither {base} nor {base + n_seq}")
        ds = idx_mod.IndexedDataset(prefix, multimodal=multimodal)
        d = np.dtype(ds.index.dtype).name
        if dtype not in (None, d):
            raise ValueError(f"{prefix}: dtype {d} differs from {dtype}")
        dtype = d
        base_tok = len(tokens)
        starts = []
        for i in range(len(ds)):
            item = ds[i]
            seq = item[0] if multimodal else item
            starts.append(len(tokens))
            tokens.extend(int(x) for x in seq)
            seqs.append([starts[-1], len(tokens)])
        starts.append(len(tokens))
        di = [int(x) for x in ds.document_indices]
        for k in range(len(di) - 1):
            docs.append([starts[di[k]], starts[di[k + 1]]])
        doc_idx_all.append(di)
        if multimodal:
            modes_all.append([int(x) for x in ds.index.sequence_modes])
        files.append({"path": prefix + ".bin", "offset": 0, "tokens": len(tokens) - base_tok,
                      "idx": idx_path, "sequences": int(n_seq), "document_count": int(n_doc),
                      "multimodal": multimodal})
    out = {"format": "megatron", "dtype": dtype, "files": files, "tokens": tokens,
           "documents": docs, "sequences": seqs, "document_indices": doc_idx_all}
    if modes_all:
        out["sequence_modes"] = modes_all
    return out


# --- llm.c ---------------------------------------------------------------------------------------

LLMC_HEADERS = {20240520: (1, np.uint16), 20240801: (7, np.uint32)}


def read_llmc(paths: list[str]) -> dict:
    """train_gpt2.py / train_llama3.py `_load_data_shard` (karpathy/llm.c f1e2ace): a 256 x int32
    header (magic, version, token count), then the tokens; the file must hold exactly that many.
    (llmc/dataloader.h, the C trainer's loader, accepts only 20240520/1 and checks the file size.)
    Documents: every document *starts* with the EOT id (fineweb.py prepends it: 50256 for gpt-2,
    128000 = <|begin_of_text|> for llama-3); a document runs to the next EOT and may continue
    into the next shard (fineweb.py splits a document at a shard boundary)."""
    tokens, files, dtype, eot = [], [], None, None
    for p in paths:
        with open(p, "rb") as f:
            header = np.frombuffer(f.read(256 * 4), dtype=np.int32)
            magic, version, ntok = int(header[0]), int(header[1]), int(header[2])
            if magic not in LLMC_HEADERS or LLMC_HEADERS[magic][0] != version:
                raise ValueError(f"{p}: magic {magic} version {version} is not an llm.c token shard")
            toks = np.frombuffer(f.read(), dtype=LLMC_HEADERS[magic][1])
        if len(toks) != ntok:
            raise ValueError(f"{p}: header says {ntok} tokens, file holds {len(toks)}")
        d = np.dtype(LLMC_HEADERS[magic][1]).name
        if dtype not in (None, d):
            raise ValueError(f"{p}: {d} shard among {dtype} shards")
        dtype, eot = d, (50256 if magic == 20240520 else 128000)
        files.append({"path": p, "offset": 1024, "tokens": ntok, "magic": magic, "version": version})
        tokens.extend(int(x) for x in toks)
    arr = np.array(tokens, dtype=np.int64)
    starts = [int(i) for i in np.nonzero(arr == eot)[0]]
    if not starts or starts[0] != 0:
        starts = [0] + starts  # a leading partial document (a shard read without its predecessor)
    docs = _spans(starts + [len(tokens)]) if tokens else []
    return {"format": "llmc", "dtype": dtype, "eot": eot, "files": files, "tokens": tokens,
            "documents": docs}


# --- datatrove / nanotron ------------------------------------------------------------------------


def read_datatrove(paths: list[str]) -> dict:
    """datatrove.pipeline.tokens.merger: `load_doc_ends` (the .ds.index is uint64 little-endian
    document *ends*, in tokens, cumulative, no leading 0, no count) and `get_data_reader` (yields
    each document's bytes), the real functions. Token size from the first line of .ds.metadata
    ("tokenizer|token_size"), as DocumentTokenizerMerger reads it; 2 if there is none."""
    from datatrove.pipeline.tokens.merger import get_data_reader, load_doc_ends

    tokens, docs, files, loss, dtype = [], [], [], [], None
    for p in paths:
        token_size = 2
        meta = p + ".metadata"
        if os.path.exists(meta):
            with open(meta) as f:
                first = f.read().splitlines()[0]
            if "|" in first:
                token_size = int(first.rsplit("|", 1)[1])
        d = {2: "uint16", 4: "uint32"}[token_size]
        if dtype not in (None, d):
            raise ValueError(f"{p}: {d} among {dtype} files")
        dtype = d
        ends = load_doc_ends(open(p + ".index", "rb"))
        base = len(tokens)
        for chunk in get_data_reader(open(p, "rb"), ends, nb_bytes=token_size):
            start = len(tokens)
            tokens.extend(int(x) for x in np.frombuffer(chunk, dtype=d))
            docs.append([start, len(tokens)])
        size = os.path.getsize(p) // token_size
        if len(tokens) - base != size:
            raise ValueError(f"{p}: index ends at {len(tokens) - base} tokens, file holds {size}")
        files.append({"path": p, "offset": 0, "tokens": size, "index": p + ".index"})
        if os.path.exists(p + ".loss"):  # one byte (bool) per token, same doc ends
            for chunk in get_data_reader(open(p + ".loss", "rb"), ends, nb_bytes=1):
                loss.extend(int(x) for x in chunk)
            files[-1]["loss"] = p + ".loss"
    out = {"format": "datatrove", "dtype": dtype, "files": files, "tokens": tokens, "documents": docs}
    if loss:
        if len(loss) != len(tokens):
            raise ValueError("some .ds files have a .ds.loss and some do not")
        out["loss"] = loss
    return out


# --- nanoGPT -------------------------------------------------------------------------------------


def read_nanogpt(paths: list[str], eos: int = 50256) -> dict:
    """train.py get_batch: np.memmap(path, dtype=np.uint16, mode='r'). prepare.py *appends* the
    EOT (50256) to every document, so a document ends with (and includes) its EOT."""
    tokens, files = [], []
    for p in paths:
        m = np.memmap(p, dtype=np.uint16, mode="r")
        files.append({"path": p, "offset": 0, "tokens": int(m.shape[0])})
        tokens.extend(int(x) for x in m)
    arr = np.array(tokens, dtype=np.int64)
    ends = [int(i) + 1 for i in np.nonzero(arr == eos)[0]]
    if not ends or ends[-1] != len(tokens):
        ends.append(len(tokens))  # trailing tokens without EOT (not written by prepare.py)
    docs = _spans([0] + ends) if tokens else []
    return {"format": "nanogpt", "dtype": "uint16", "eos": eos, "files": files, "tokens": tokens,
            "documents": docs}


# --- OLMo-core (Dolma token files) ---------------------------------------------------------------


def olmo_iter_document_indices(mmap: np.ndarray, eos: int, bos: int | None):
    """olmo_core/data/utils.py iter_document_indices, local-array branch (allenai/OLMo-core
    fa6c501): with no BOS, a document ends at (and includes) each EOS; with a BOS, a boundary is
    an EOS immediately followed by the BOS, plus a final EOS. Tokens after the last boundary are
    not part of any document."""
    if bos is None:
        doc_boundaries = (mmap == eos).nonzero()[0]
    else:
        doc_boundaries = np.logical_and(mmap[:-1] == eos, mmap[1:] == bos).nonzero()[0]
        if mmap[-1] == eos:
            doc_boundaries = np.append(doc_boundaries, mmap.shape[0] - 1)
    start_idx = 0
    for idx in doc_boundaries:
        end_idx = int(idx) + 1
        yield start_idx, end_idx
        start_idx = end_idx


def olmo_get_document_lengths(input_ids: np.ndarray, eos: int, bos: int | None) -> list[int]:
    """olmo_core/data/utils.py get_document_lengths (torch replaced by numpy, same arithmetic):
    the `doc_lens` of one instance; a trailing piece without EOS counts as a document."""
    if bos is None:
        b = np.concatenate([[-1], (input_ids == eos).nonzero()[0],
                            [] if input_ids[-1] == eos else [input_ids.shape[0] - 1]]).astype(np.int64)
    else:
        b = np.concatenate([[-1], np.logical_and(input_ids[:-1] == eos, input_ids[1:] == bos).nonzero()[0],
                            [input_ids.shape[0] - 1]]).astype(np.int64)
    return [int(x) for x in (b[1:] - b[:-1])]


def read_olmo(paths: list[str], dtype: str, eos: int, bos: int | None = None,
              sequence_length: int | None = None) -> dict:
    """OLMo-core numpy datasets over Dolma token files: each file is a headerless array of
    `dtype` (np.memmap). Documents per iter_document_indices (per file; OLMo never lets a document
    span files). With --sequence-length, also NumpyFSLDataset's instances: file i gives
    file_tokens // sequence_length instances of consecutive tokens (the remainder of each file is
    dropped), each with its doc_lens (generate_doc_lengths=True)."""
    tokens, docs, files, instances = [], [], [], []
    for p in paths:
        m = np.memmap(p, dtype=dtype, mode="r")
        base = len(tokens)
        for s, e in olmo_iter_document_indices(m, eos, bos):
            docs.append([base + s, base + e])
        tokens.extend(int(x) for x in m)
        files.append({"path": p, "offset": 0, "tokens": int(m.shape[0])})
        if sequence_length:
            for k in range(m.shape[0] // sequence_length):
                chunk = np.asarray(m[k * sequence_length:(k + 1) * sequence_length])
                instances.append({"start": base + k * sequence_length,
                                  "doc_lens": olmo_get_document_lengths(chunk, eos, bos)})
    out = {"format": "olmo", "dtype": dtype, "eos": eos, "bos": bos, "files": files, "tokens": tokens,
           "documents": docs}
    if sequence_length:
        out["sequence_length"] = sequence_length
        out["instances"] = instances
    return out


def read_dolma_metadata(path: str) -> list[list]:
    """The Dolma toolkit's PATH.csv.gz beside a token file: rows start,end,id,src,loc."""
    meta = path[: -len(".npy")] + ".csv.gz" if path.endswith(".npy") else path + ".csv.gz"
    with gzip.open(meta, "rt") as f:
        return [line.rstrip("\n").split(",") for line in f]


# --- numpy .npy ----------------------------------------------------------------------------------


def read_npy(paths: list[str]) -> dict:
    """numpy.load(mmap_mode='r'): the header (format 1.0/2.0/3.0) gives dtype, order and shape;
    the data starts right after it. No document boundaries (a 2-D array's rows are reported as
    `rows`)."""
    tokens, files, rows, dtype = [], [], [], None
    for p in paths:
        a = np.load(p, mmap_mode="r")  # numpy parses and checks the header
        with open(p, "rb") as f:
            head = f.read(12)
        version = (head[6], head[7])
        if version == (1, 0):
            offset = 10 + int.from_bytes(head[8:10], "little")
        else:
            offset = 12 + int.from_bytes(head[8:12], "little")
        assert offset == a.offset, (offset, a.offset)  # data starts right after the header
        fortran = bool(a.flags.f_contiguous and not a.flags.c_contiguous)
        dtype = a.dtype.str
        flat = np.asarray(a).ravel(order="C")
        if a.ndim == 2:
            for r in range(a.shape[0]):
                rows.append([len(tokens) + r * a.shape[1], len(tokens) + (r + 1) * a.shape[1]])
        files.append({"path": p, "offset": offset, "tokens": int(flat.size), "version": list(version),
                      "shape": list(a.shape), "fortran_order": fortran, "descr": a.dtype.str})
        tokens.extend(int(x) for x in flat)
    out = {"format": "npy", "dtype": dtype, "files": files, "tokens": tokens, "documents": None}
    if rows:
        out["rows"] = rows
    return out


# --- HF datasets, parquet, JSON Lines ------------------------------------------------------------


def _rows_to_out(fmt: str, rows, dtype: str, extra: dict) -> dict:
    tokens, docs = [], []
    for r in rows:
        start = len(tokens)
        tokens.extend(int(x) for x in r)
        docs.append([start, len(tokens)])
    return {"format": fmt, "dtype": dtype, "tokens": tokens, "documents": docs, **extra}


def read_hf_disk(path: str, column: str) -> dict:
    """datasets.load_from_disk(path)[column]: one row = one document, rows in shard order
    (state.json `_data_files`)."""
    import datasets

    ds = datasets.load_from_disk(path)
    feat = ds.features[column]
    dtype = str(ds.data.schema.field(column).type.value_type)
    with open(os.path.join(path, "state.json")) as f:
        shards = [d["filename"] for d in json.load(f)["_data_files"]]
    return _rows_to_out("hf-disk", ds[column], dtype,
                        {"files": shards, "column": column, "feature": repr(feat), "columns": ds.column_names})


def read_parquet(paths: list[str], column: str) -> dict:
    """pyarrow.parquet.read_table(path, columns=[column]) per file, in the order given."""
    import pyarrow.parquet as pq

    rows, files, dtype = [], [], None
    for p in paths:
        pf = pq.ParquetFile(p)
        t = pf.read(columns=[column])
        dtype = str(t.schema.field(column).type.value_type)
        files.append({"path": p, "rows": t.num_rows, "row_groups": pf.num_row_groups,
                      "rows_per_group": [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]})
        rows.extend(t.column(column).to_pylist())
    return _rows_to_out("parquet", rows, dtype, {"files": files, "column": column})


def read_jsonl(paths: list[str], column: str) -> dict:
    """json.loads per line; the token list is field `column` of each object."""
    rows, files = [], []
    for p in paths:
        n = 0
        with open(p) as f:
            for line in f:
                if line.strip():
                    rows.append(json.loads(line)[column])
                    n += 1
        files.append({"path": p, "rows": n})
    return _rows_to_out("jsonl", rows, "int64", {"files": files, "column": column})


def read(fmt: str, paths: list[str], **kw) -> dict:
    if fmt == "megatron":
        return read_megatron(paths)
    if fmt == "llmc":
        return read_llmc(paths)
    if fmt == "datatrove":
        return read_datatrove(paths)
    if fmt == "nanogpt":
        return read_nanogpt(paths, kw.get("eos") or 50256)
    if fmt == "olmo":
        return read_olmo(paths, kw["dtype"], kw["eos"], kw.get("bos"), kw.get("sequence_length"))
    if fmt == "npy":
        return read_npy(paths)
    if fmt == "hf-disk":
        return read_hf_disk(paths[0], kw.get("column") or "input_ids")
    if fmt == "parquet":
        return read_parquet(paths, kw.get("column") or "input_ids")
    if fmt == "jsonl":
        return read_jsonl(paths, kw.get("column") or "input_ids")
    raise SystemExit(f"unknown format {fmt}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("format")
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--dtype", help="olmo: uint16 or uint32")
    ap.add_argument("--eos", type=int)
    ap.add_argument("--bos", type=int)
    ap.add_argument("--sequence-length", type=int)
    ap.add_argument("--column")
    a = ap.parse_args()
    emit(read(a.format, a.paths, dtype=a.dtype, eos=a.eos, bos=a.bos,
              sequence_length=a.sequence_length, column=a.column))


if __name__ == "__main__":
    main()
