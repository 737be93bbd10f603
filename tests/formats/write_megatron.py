#!/usr/bin/env python3
"""Write a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx) the way Megatron writes it.

Runs the real `IndexedDatasetBuilder` of the installed megatron-core wheel (see
common.megatron_indexed_dataset) in the order tools/preprocess_data.py calls it:
for each JSON line, `Encoder.encode` tokenizes each sentence, drops empty sentences, appends the
EOD id to the last sentence when --append-eod, and `builder.add_document(doc_ids, sentence_lens)`
records one *sequence* per sentence and one *document* per JSON line; an empty text gives an empty
document (no sequences). With --partitions K, each partition is built into its own prefix and the
final builder concatenates them with `add_index` (preprocess_data.py --partitions, and
tools/merge_datasets.py, which merges the sorted prefixes of a directory the same way).

Usage: write_megatron.py OUT_DIR [--prefix NAME] [--dtype uint16|int32] [--files N]
                         [--partitions K] [--split-sentences] [--no-eod] [--multimodal]
Prints one JSON line: the files written and the corpus each holds (documents as sentence lists).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from common import emit, make_docs, megatron_indexed_dataset, megatron_version

GPT2_EOD = 50256  # tiktoken gpt2 <|endoftext|>; Megatron's GPT2BPETokenizer.eod
LLAMA3_EOD = 128001  # <|end_of_text|>, the HF tokenizer's eos_token_id (int32 datasets)


def split_sentences(rng: np.random.Generator, doc: list[int]) -> list[list[int]]:
    """Cut a document into 1..4 sentences (some possibly empty, as NLTK splitting can give)."""
    if len(doc) < 2:
        return [doc]
    k = int(rng.integers(1, 5))
    cuts = sorted(set(int(c) for c in rng.integers(0, len(doc) + 1, size=k - 1)))
    out, prev = [], 0
    for c in cuts + [len(doc)]:
        out.append(doc[prev:c])
        prev = c
    return out


def encode(sentences: list[list[int]], append_eod: bool, eod: int):
    """tools/preprocess_data.py Encoder.encode for one json key, tokenizer already applied."""
    doc_ids, sentence_lens = [], []
    for sentence_ids in sentences:
        if len(sentence_ids) > 0:
            doc_ids.extend(sentence_ids)
            sentence_lens.append(len(sentence_ids))
    if len(doc_ids) > 0 and append_eod:
        doc_ids.append(eod)
        sentence_lens[-1] += 1
    return doc_ids, sentence_lens


def build(idx_mod, prefix: str, dtype, encoded, multimodal: bool, rng):
    builder = idx_mod.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype, multimodal=multimodal)
    for doc_ids, lens in encoded:
        modes = [int(m) for m in rng.integers(0, 3, size=len(lens))] if multimodal else None
        if multimodal:
            builder.add_document(doc_ids, lens, modes)
        else:
            builder.add_document(doc_ids, lens)
    builder.finalize(prefix + ".idx")


def write(out_dir: str, prefix: str = "corpus_text_document", dtype: str = "uint16", files: int = 1,
          partitions: int = 1, split: bool = False, append_eod: bool = True, multimodal: bool = False,
          n_docs: int = 120, mean_len: float = 60.0, seed: int = 1) -> dict:
    idx_mod = megatron_indexed_dataset()
    np_dtype = {"uint16": np.uint16, "int32": np.int32}[dtype]
    vocab, eod = (50257, GPT2_EOD) if dtype == "uint16" else (128256, LLAMA3_EOD)
    # int32 corpora: ids above 65535 so a reader that assumes u16 fails loudly
    low = 0 if dtype == "uint16" else 70000
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed + 1000)
    written = []
    for f in range(files):
        docs = make_docs(seed + f, n_docs, mean_len, vocab, exclude=(eod, 128000), low=low)
        # one empty document (an empty "text" in the JSON lines): Megatron indexes it as a
        # document with no sequences
        docs.insert(3, [])
        sentences = [split_sentences(rng, d) if split else [d] for d in docs]
        encoded = [encode(s, append_eod, eod) for s in sentences]
        name = prefix if files == 1 else f"{prefix}_{f:02d}"
        path = os.path.join(out_dir, name)
        if partitions == 1:
            build(idx_mod, path, np_dtype, encoded, multimodal, rng)
        else:
            parts = []
            step = (len(encoded) + partitions - 1) // partitions
            for p in range(partitions):
                part = f"{path}_part{p}"
                build(idx_mod, part, np_dtype, encoded[p * step:(p + 1) * step], multimodal, rng)
                parts.append(part)
            builder = idx_mod.IndexedDatasetBuilder(path + ".bin", dtype=np_dtype, multimodal=multimodal)
            for part in parts:
                builder.add_index(part)
            builder.finalize(path + ".idx")
            for part in parts:
                os.remove(part + ".bin")
                os.remove(part + ".idx")
        written.append({
            "prefix": path,
            "documents": [d for d, _ in encoded],
            "sequence_lengths": [lens for _, lens in encoded],
        })
    return {"format": "megatron", "writer": f"megatron-core {megatron_version()} IndexedDatasetBuilder",
            "dtype": dtype, "eod": eod if append_eod else None, "files": written}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--prefix", default="corpus_text_document")
    ap.add_argument("--dtype", choices=["uint16", "int32"], default="uint16")
    ap.add_argument("--files", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--split-sentences", action="store_true")
    ap.add_argument("--no-eod", action="store_true")
    ap.add_argument("--multimodal", action="store_true")
    ap.add_argument("--docs", type=int, default=120)
    ap.add_argument("--mean-len", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    emit(write(a.out_dir, a.prefix, a.dtype, a.files, a.partitions, a.split_sentences, not a.no_eod,
               a.multimodal, a.docs, a.mean_len, a.seed))


if __name__ == "__main__":
    main()
