#!/usr/bin/env python3
"""Write nanoGPT's train.bin / val.bin the way data/openwebtext/prepare.py does.

The steps of prepare.py (karpathy/nanoGPT 3adf61e), with HF `datasets` doing the same work:
`train_test_split(test_size=0.0005 -> --val-frac, seed=2357, shuffle=True)`, the test split
renamed val, `process` = token ids + [EOT 50256] (EOT *appended*), then each split written into a
np.memmap(uint16, mode='w+') of sum(len) tokens in 1024 contiguous shards of the split
(`dset.shard(num_shards=1024, index=i, contiguous=True).with_format('numpy')`). The tokenizer
(tiktoken gpt2) is replaced by the seeded ids of common.make_docs: tiktoken downloads its BPE
file at run time, and the bytes written depend only on the ids.
prepare.py's loop needs every one of its 1024 shards non-empty, so the split must have at least
1024 documents: --docs defaults to 2200 short documents.

Usage: write_nanogpt.py OUT_DIR [--docs N] [--mean-len L]
Prints one JSON line: the files and the documents (with EOT) of each split in file order.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from common import emit, make_docs

EOT = 50256


def write(out_dir: str, n_docs: int = 2200, mean_len: float = 12.0, seed: int = 4,
          val_frac: float = 0.0005) -> dict:
    import datasets

    datasets.disable_progress_bars()
    os.makedirs(out_dir, exist_ok=True)
    docs = make_docs(seed, n_docs, mean_len, 50256, exclude=(EOT,))
    dataset = datasets.Dataset.from_dict({"toks": docs})
    split_dataset = dataset.train_test_split(test_size=val_frac, seed=2357, shuffle=True)
    split_dataset["val"] = split_dataset.pop("test")

    def process(example):
        ids = list(example["toks"])  # enc.encode_ordinary(example['text'])
        ids.append(EOT)
        return {"ids": ids, "len": len(ids)}

    tokenized = split_dataset.map(process, remove_columns=["toks"], desc="tokenizing the splits")
    out = {}
    for split, dset in tokenized.items():
        arr_len = np.sum(dset["len"], dtype=np.uint64)
        filename = os.path.join(out_dir, f"{split}.bin")
        dtype = np.uint16
        arr = np.memmap(filename, dtype=dtype, mode="w+", shape=(arr_len,))
        total_batches = min(1024, len(dset))  # prepare.py: 1024 (needs >= 1024 docs per split)
        idx = 0
        for batch_idx in range(total_batches):
            batch = dset.shard(num_shards=total_batches, index=batch_idx, contiguous=True).with_format("numpy")
            arr_batch = np.concatenate(batch["ids"])
            arr[idx: idx + len(arr_batch)] = arr_batch
            idx += len(arr_batch)
        arr.flush()
        del arr
        out[split] = {"path": filename, "documents": [list(map(int, r)) for r in dset["ids"]],
                      "total_batches": total_batches}
    return {"format": "nanogpt", "writer": f"nanoGPT prepare.py steps with datasets {datasets.__version__}",
            "eot": EOT, "splits": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--docs", type=int, default=2200)
    ap.add_argument("--mean-len", type=float, default=12.0)
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--val-frac", type=float, default=0.0005)
    a = ap.parse_args()
    emit(write(a.out_dir, a.docs, a.mean_len, a.seed, a.val_frac))


if __name__ == "__main__":
    main()
