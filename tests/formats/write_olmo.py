#!/usr/bin/env python3
"""Write Dolma-toolkit token files, the input of OLMo-core's numpy datasets.

`dolma tokens` (allenai/dolma 669f534, python/dolma/tokenizer/) writes each output file with
`MemmapWriter`: a np.memmap of `dtype` and `max_tokens` items opened 'w+', documents written one
after the other (a document that does not fit makes the executor open the next file: documents
never span files), and on close the file is cut to the tokens written by copying it into a new
memmap of that size. The file is named *.npy but is a raw array, no .npy header. Beside it,
PATH.csv.gz holds one CSV row per document: start,end,id,src,loc (token offsets, end exclusive).
Special tokens come from `Tokenizer.add_special_tokens`: BOS prepended if set and not already
first, EOS appended if set and not already last. dtype: `np.min_scalar_type(vocab_size - 1)` in
the tokenizer, but the executor's default is uint16 unless --dtype is given.
MemmapWriter and add_special_tokens are transcribed below (dolma pulls Rust wheels and many
dependencies; the bytes depend only on these few lines).

Presets (OLMo-core TokenizerConfig, olmo_core/data/tokenizer.py fa6c501):
  dolma1     uint16, eos 50279, no bos   (gpt_neox_olmo_dolma_v1_5)
  dolma2     uint32, eos 100257, no bos  (dolma2, OLMo 2/3)
  dolma2-bos uint32, eos = bos = 100257  (dolma2_sigdig)

Usage: write_olmo.py OUT_DIR [--preset dolma1|dolma2|dolma2-bos] [--max-tokens N]
Prints one JSON line: files, dtype, eos, bos and the documents (with special tokens) per file.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import os

import numpy as np

from common import emit, make_docs

PRESETS = {
    "dolma1": ("uint16", 50280, 50279, None),
    "dolma2": ("uint32", 100278, 100257, None),
    "dolma2-bos": ("uint32", 100278, 100257, 100257),
}


def add_special_tokens(input_ids: list[int], bos, eos) -> list[int]:
    """dolma Tokenizer.add_special_tokens."""
    if not input_ids:
        return input_ids
    if bos is not None and input_ids[0] != bos:
        input_ids.insert(0, bos)
    if eos is not None and input_ids[-1] != eos:
        input_ids.append(eos)
    return input_ids


class MemmapWriter:
    """dolma/tokenizer/memmap_writer.py MemmapWriter, local paths only."""

    def __init__(self, path: str, dtype, max_tokens: int):
        import re

        base_path = re.sub(r"(\.npy?)?(\.[a-zA-Z]+)*$", "", path)
        self.memmap_path = f"{base_path}.npy"
        self.metadata_path = f"{base_path}.csv.gz"
        self.dtype = dtype
        self.max_tokens = max_tokens
        self._written_tokens = 0

    def __enter__(self):
        self._memmap_file = np.memmap(mode="w+", filename=self.memmap_path, dtype=self.dtype,
                                      shape=(self.max_tokens,))
        self._metadata_file = gzip.open(self.metadata_path, mode="wt")  # smart_open .gz -> gzip
        self._writer = csv.writer(self._metadata_file)
        return self

    def write(self, tokens: list[int], doc_id: str, src: str, loc: int) -> bool:
        if (len(tokens) + self._written_tokens) >= self.max_tokens:
            return False
        start, end = self._written_tokens, self._written_tokens + len(tokens)
        self._memmap_file[start:end] = tokens
        self._written_tokens = end
        self._writer.writerow((start, end, doc_id, src, loc))  # MemmapMetadata field order
        return True

    def __exit__(self, *_):
        self._memmap_file.flush()
        self._metadata_file.close()
        if self._written_tokens < self.max_tokens and self._written_tokens > 0:
            del self._memmap_file
            temp_path = self.memmap_path[: -len(".npy")] + ".tmp"
            os.rename(self.memmap_path, temp_path)
            new_memmap = np.memmap(mode="w+", filename=self.memmap_path, dtype=self.dtype,
                                   shape=(self._written_tokens,))
            old_memmap = np.memmap(mode="r", filename=temp_path, dtype=self.dtype, shape=(self.max_tokens,))
            new_memmap[:] = old_memmap[: self._written_tokens]
            new_memmap.flush()
            del new_memmap, old_memmap
            os.remove(temp_path)


def write(out_dir: str, preset: str = "dolma2", max_tokens: int = 4000, n_docs: int = 150,
          mean_len: float = 40.0, seed: int = 5) -> dict:
    dtype, vocab, eos, bos = PRESETS[preset]
    os.makedirs(out_dir, exist_ok=True)
    low = 0 if dtype == "uint16" else 66000
    docs = make_docs(seed, n_docs, mean_len, vocab, exclude=(eos, 100277, 1), low=min(low, vocab - 1))
    files, per_file = [], []
    i, cnt = 0, 0
    while i < len(docs):
        path = os.path.join(out_dir, f"part-0-{cnt:05d}")
        written = []
        with MemmapWriter(path, np.dtype(dtype), max_tokens) as w:
            while i < len(docs):
                toks = add_special_tokens(list(docs[i]), bos, eos)
                if not w.write(toks, f"doc-{i}", "input.jsonl.gz", i):
                    break
                written.append(toks)
                i += 1
        files.append(path + ".npy")
        per_file.append(written)
        cnt += 1
    return {"format": "olmo", "writer": "dolma 669f534 MemmapWriter (transcribed)", "preset": preset,
            "dtype": dtype, "eos": eos, "bos": bos, "files": files, "documents": per_file}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="dolma2")
    ap.add_argument("--max-tokens", type=int, default=4000)
    ap.add_argument("--docs", type=int, default=150)
    ap.add_argument("--mean-len", type=float, default=40.0)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    emit(write(a.out_dir, a.preset, a.max_tokens, a.docs, a.mean_len, a.seed))


if __name__ == "__main__":
    main()
