#!/usr/bin/env python3
"""Write datatrove tokenized files (.ds, .ds.index, .ds.metadata[, .ds.loss]) with datatrove itself.

Runs the real pipeline steps: `DocumentTokenizer` (one task per --tasks, each tokenizing its
documents, then shuffling them inside its file with a seeded permutation, as by default) and,
with --merge, `DocumentTokenizerMerger` (shuffles the documents of all task files into
NNN_<name>.ds files of at most --max-tokens-per-file tokens). The tokenizer is a word-level
`tokenizers` tokenizer built here (no hub download): word "w<i>" is token id i, and EOS
"<|endoftext|>" is appended to every document by datatrove's TemplateProcessing.
--token-size 4 uses a vocabulary above 65,536 ids, so datatrove stores uint32.

Usage: write_datatrove.py OUT_DIR [--tasks N] [--merge] [--token-size 2|4] [--loss]
Prints one JSON line: the .ds files written (in sorted order) and the tokenizer's ids.
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import sys
from contextlib import redirect_stderr, redirect_stdout

from common import emit, make_docs


def build_tokenizer(path: str, vocab_size: int) -> int:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = {f"w{i}": i for i in range(vocab_size - 2)}
    vocab["<unk>"] = vocab_size - 2
    vocab["<|endoftext|>"] = vocab_size - 1
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(path)
    return vocab_size - 1


def write(out_dir: str, tasks: int = 2, merge: bool = False, token_size: int = 2, loss: bool = False,
          n_docs: int = 80, mean_len: float = 50.0, seed: int = 3, max_tokens_per_file: int = 3000) -> dict:
    from datatrove.data import Document
    from datatrove.pipeline.tokens.merger import DocumentTokenizerMerger
    from datatrove.pipeline.tokens.tokenizer import DocumentTokenizer
    from datatrove.utils.logging import logger

    logger.remove()  # loguru: keep stdout/stderr for our JSON
    os.makedirs(out_dir, exist_ok=True)
    vocab_size = 50257 if token_size == 2 else 70000
    # the tokenizer goes in a subdirectory: the dataset directory holds only datatrove's files
    os.makedirs(os.path.join(out_dir, "tokenizer"), exist_ok=True)
    tok_path = os.path.join(out_dir, "tokenizer", "tokenizer.json")
    eos = build_tokenizer(tok_path, vocab_size)
    stage1 = os.path.join(out_dir, "tokenized") if merge else out_dir
    all_docs = []
    for rank in range(tasks):
        low = 0 if token_size == 2 else 65536
        docs = make_docs(seed + rank, n_docs, mean_len, vocab_size - 2, low=low)
        all_docs.extend(docs)
        items = []
        for i, d in enumerate(docs):
            meta = {}
            if loss and i % 3 == 0 and len(d) > 4:
                text_prefix = " ".join(f"w{t}" for t in d[:2])
                # character range of the first two words (end = first char of the third word):
                # datatrove zeroes the loss of tokens 0..2
                meta["no_loss_ranges"] = [(0, len(text_prefix) + 1)]
            items.append(Document(text=" ".join(f"w{t}" for t in d), id=f"{rank}/{i}", metadata=meta))
        step = DocumentTokenizer(output_folder=stage1, tokenizer_name_or_path=tok_path,
                                 eos_token="<|endoftext|>", save_loss_metadata=loss, seed=seed + rank)
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            step.run(iter(items), rank=rank, world_size=tasks)
    if merge:
        step = DocumentTokenizerMerger(input_folder=stage1, output_folder=out_dir, save_filename="merged",
                                       max_tokens_per_file=max_tokens_per_file, seed=seed,
                                       save_loss_metadata=loss, progress=False)
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            step.run(None, rank=0, world_size=1)
    files = sorted(glob.glob(os.path.join(out_dir, "*.ds")))
    return {"format": "datatrove", "writer": f"datatrove {_dist_version('datatrove')}",
            "token_size": token_size, "eos": eos, "files": files,
            # the documents before datatrove shuffles them (each gets EOS appended)
            "documents_unshuffled": [d + [eos] for d in all_docs]}


def _dist_version(name: str) -> str:
    from importlib import metadata

    return metadata.version(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--merge", action="store_true")
    ap.add_argument("--token-size", type=int, choices=[2, 4], default=2)
    ap.add_argument("--loss", action="store_true")
    ap.add_argument("--docs", type=int, default=80)
    ap.add_argument("--mean-len", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--max-tokens-per-file", type=int, default=3000)
    a = ap.parse_args()
    emit(write(a.out_dir, a.tasks, a.merge, a.token_size, a.loss, a.docs, a.mean_len, a.seed,
               a.max_tokens_per_file))


if __name__ == "__main__":
    sys.exit(main())
