#!/usr/bin/env python3
"""Write llm.c token shards the way dev/data/fineweb.py + data_common.write_datafile do.

llm.c is not a package (karpathy/llm.c, commit f1e2ace651495b74ae22d45d1723443fd00ecd3a), so
`write_datafile` below is its dev/data/data_common.py function transcribed line for line (minus
the print), and `shard` is fineweb.py's main loop: every document is [EOT] + its tokens (EOT is
*prepended*: 50256 for gpt-2, 128000 = <|begin_of_text|> for llama-3), documents are packed into
shards of exactly --shard-size tokens (a document is split across two shards where it does not
fit), the last shard holds the remainder; shard 0 is named val, the others train.

Usage: write_llmc.py OUT_DIR [--model gpt-2|llama-3] [--shard-size N] [--docs N]
Prints one JSON line: the shard paths and the documents as written.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from common import emit, make_docs

HEADERS_INFO = {
    "gpt-2": {"magic": 20240520, "version": 1, "token_dtype": np.uint16},
    "llama-3": {"magic": 20240801, "version": 7, "token_dtype": np.uint32},
}
EOT = {"gpt-2": 50256, "llama-3": 128000}


def write_datafile(filename, toks, model_desc="gpt-2"):
    """dev/data/data_common.py write_datafile (llm.c f1e2ace)."""
    assert len(toks) < 2**31, "token count too large"  # ~2.1B tokens
    assert model_desc in ["gpt-2", "llama-3"], f"unknown model descriptor {model_desc}"
    info = HEADERS_INFO[model_desc]
    header = np.zeros(256, dtype=np.int32)  # header is always 256 int32 values
    header[0] = info["magic"]
    header[1] = info["version"]
    header[2] = len(toks)  # number of tokens after the 256*4 bytes of header
    toks_np = np.array(toks, dtype=info["token_dtype"])
    with open(filename, "wb") as f:
        f.write(header.tobytes())
        f.write(toks_np.tobytes())


def shard(docs_tokens, shard_size, out_dir, name, model_desc):
    """dev/data/fineweb.py main loop (without the multiprocessing pool and progress bar)."""
    token_dtype = HEADERS_INFO[model_desc]["token_dtype"]
    files = []
    shard_index = 0
    all_tokens_np = np.empty((shard_size,), dtype=token_dtype)
    token_count = 0
    for tokens in docs_tokens:
        if token_count + len(tokens) < shard_size:
            all_tokens_np[token_count:token_count + len(tokens)] = tokens
            token_count += len(tokens)
        else:
            split = "val" if shard_index == 0 else "train"
            filename = os.path.join(out_dir, f"{name}_{split}_{shard_index:06d}.bin")
            remainder = shard_size - token_count
            all_tokens_np[token_count:token_count + remainder] = tokens[:remainder]
            write_datafile(filename, all_tokens_np.tolist(), model_desc)
            files.append(filename)
            shard_index += 1
            all_tokens_np[0:len(tokens) - remainder] = tokens[remainder:]
            token_count = len(tokens) - remainder
    if token_count != 0:
        split = "val" if shard_index == 0 else "train"
        filename = os.path.join(out_dir, f"{name}_{split}_{shard_index:06d}.bin")
        write_datafile(filename, (all_tokens_np[:token_count]).tolist(), model_desc)
        files.append(filename)
    return files


def write(out_dir: str, model: str = "gpt-2", shard_size: int = 2000, n_docs: int = 150,
          mean_len: float = 40.0, seed: int = 2) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    vocab = 50257 if model == "gpt-2" else 128000  # llama-3 text ids are < 128000
    low = 0 if model == "gpt-2" else 60000
    docs = make_docs(seed, n_docs, mean_len, vocab, exclude=(EOT[model],), low=low)
    docs_tokens = [np.array([EOT[model]] + d, dtype=HEADERS_INFO[model]["token_dtype"]) for d in docs]
    files = shard(docs_tokens, shard_size, out_dir, "fineweb", model)
    return {"format": "llmc", "writer": "llm.c f1e2ace data_common.write_datafile + fineweb.py sharding",
            "model": model, "eot": EOT[model], "files": files,
            "documents": [[int(x) for x in t] for t in docs_tokens]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--model", choices=["gpt-2", "llama-3"], default="gpt-2")
    ap.add_argument("--shard-size", type=int, default=2000)
    ap.add_argument("--docs", type=int, default=150)
    ap.add_argument("--mean-len", type=float, default=40.0)
    ap.add_argument("--seed", type=int, default=2)
    a = ap.parse_args()
    emit(write(a.out_dir, a.model, a.shard_size, a.docs, a.mean_len, a.seed))


if __name__ == "__main__":
    main()
