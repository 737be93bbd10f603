#!/usr/bin/env python3
"""Write a tokenized Hugging Face dataset the ways users have one on disk.

With `datasets` itself: a text dataset tokenized by `.map` (a tokenizer returns python lists
`input_ids` and `attention_mask`; datasets' ArrowWriter narrows them to list<int32> and list<int8>
by column name, OptimizedTypedSequence), then
  disk/       `save_to_disk(num_shards=2)`: data-0000K-of-00002.arrow (Arrow IPC *stream*
              format), state.json, dataset_info.json
  hf.parquet  `to_parquet` (pyarrow ParquetWriter, snappy, row groups of --rows-per-group rows)
and with pyarrow / json directly, the other shapes found in the wild:
  pa_int64.parquet   list<int64> column `input_ids` (python ints through pyarrow/pandas)
  pa_uint16.parquet  list<uint16> column `tokens` (numpy uint16 arrays through pyarrow)
  tokens.jsonl       {"id": .., "input_ids": [...]} per line
  tokens_field.jsonl {"text": .., "tokens": [...]} per line

Usage: write_hf.py OUT_DIR [--docs N] [--rows-per-group N]
Prints one JSON line: the paths and the documents (one per row).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from common import emit, make_docs


def write(out_dir: str, n_docs: int = 90, mean_len: float = 50.0, seed: int = 7,
          rows_per_group: int = 25) -> dict:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    datasets.disable_progress_bars()
    os.makedirs(out_dir, exist_ok=True)
    docs = make_docs(seed, n_docs, mean_len, 50257)
    texts = [" ".join(f"w{t}" for t in d) for d in docs]
    ds = datasets.Dataset.from_dict({"text": texts})

    def tokenize(batch):  # what a `transformers` tokenizer returns: python lists
        ids = [[int(w[1:]) for w in t.split()] for t in batch["text"]]
        return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids]}

    tok = ds.map(tokenize, batched=True, remove_columns=["text"])
    disk = os.path.join(out_dir, "disk")
    tok.save_to_disk(disk, num_shards=2)
    tok.to_parquet(os.path.join(out_dir, "hf.parquet"), batch_size=rows_per_group)
    t64 = pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int64()))})
    pq.write_table(t64, os.path.join(out_dir, "pa_int64.parquet"), row_group_size=rows_per_group)
    t16 = pa.table({"tokens": pa.array([np.array(d, dtype=np.uint16) for d in docs],
                                       type=pa.list_(pa.uint16()))})
    pq.write_table(t16, os.path.join(out_dir, "pa_uint16.parquet"), row_group_size=rows_per_group)
    with open(os.path.join(out_dir, "tokens.jsonl"), "w") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, "input_ids": d}) + "\n")
    with open(os.path.join(out_dir, "tokens_field.jsonl"), "w") as f:
        for t, d in zip(texts, docs):
            f.write(json.dumps({"text": t, "tokens": d}) + "\n")
    return {"format": "hf", "writer": f"datasets {datasets.__version__}, pyarrow {pa.__version__}",
            "features": repr(tok.features),
            "paths": {"disk": disk, "parquet": os.path.join(out_dir, "hf.parquet"),
                      "parquet_int64": os.path.join(out_dir, "pa_int64.parquet"),
                      "parquet_uint16": os.path.join(out_dir, "pa_uint16.parquet"),
                      "jsonl": os.path.join(out_dir, "tokens.jsonl"),
                      "jsonl_tokens": os.path.join(out_dir, "tokens_field.jsonl")},
            "documents": docs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--docs", type=int, default=90)
    ap.add_argument("--mean-len", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rows-per-group", type=int, default=25)
    a = ap.parse_args()
    emit(write(a.out_dir, a.docs, a.mean_len, a.seed, a.rows_per_group))


if __name__ == "__main__":
    main()
