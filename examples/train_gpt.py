#!/usr/bin/env python3
"""A small GPT trained on CPU from shufflefs, with checkpoints and exact resume.

Reads its batches from a mount (--mount MNT) or in-process without FUSE (--dataset DIR plus
the plan flags), through shufflefs.torch. Every --ckpt-every steps it writes a checkpoint
(model, optimizer, the loader's next step and the data fingerprint) atomically; started again
with the same --ckpt it resumes from there, refusing a checkpoint of other data or another
plan. Each trained step is logged as one JSON line: epoch, step, sha256 of the batch, loss.

    python examples/train_gpt.py --mount /mnt/train --ckpt run/ckpt.pt --log run/log.jsonl

examples/kill_and_resume.py kills it mid-run and checks the resumed run against an
uninterrupted one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import shufflefs
from shufflefs.torch import StepDataset


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, d: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        mask = torch.triu(torch.full((t, t), -math.inf), diagonal=1)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--mount", help="a shufflefs mount")
    where.add_argument("--dataset", help="a packed dataset directory, read in-process")
    p.add_argument("--window", type=int, default=33, help="plan (with --dataset)")
    p.add_argument("--stride", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--steps", type=int, default=400, help="stop after this many global steps")
    p.add_argument("--ckpt", required=True, help="checkpoint file (resumed from if present)")
    p.add_argument("--ckpt-every", type=int, default=25)
    p.add_argument("--log", required=True, help="JSON lines, one per trained step (appended)")
    p.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep per step (demos)")
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)  # same float results run after run
    if args.mount:
        source: shufflefs.Source = shufflefs.Mount(args.mount)
    else:
        source = shufflefs.Dataset(
            args.dataset,
            window=args.window,
            stride=args.stride,
            batch_size=args.batch_size,
            seed=args.seed,
            epochs=args.epochs,
        )
    context = source.step_shape[1] - 1
    model = GPT(args.vocab, context)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = StepDataset(source).loader(num_workers=args.workers)

    if os.path.exists(args.ckpt):
        ckpt = torch.load(args.ckpt, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        # One call: refuse other data or another plan, continue at the next step.
        loader.load_state_dict(ckpt["data"], expect_fingerprint=ckpt["fingerprint"])
        print(f"resumed at {ckpt['data']} (fingerprint {ckpt['fingerprint']})", flush=True)

    with open(args.log, "a") as log:
        for x in loader:
            epoch, step = source.position(loader.state_dict())  # the next step...
            g = source.global_step(epoch, step) - 1  # ...so this batch is the one before
            if g >= args.steps:
                break
            sha = hashlib.sha256(x.numpy().tobytes()).hexdigest()[:16]
            logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, args.vocab), x[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            e, s = source.position(g)
            log.write(json.dumps({"epoch": e, "step": s, "sha": sha, "loss": loss.item()}) + "\n")
            log.flush()
            if (g + 1) % args.ckpt_every == 0:
                state = {
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "data": loader.state_dict(),
                    "fingerprint": source.fingerprint,
                }
                torch.save(state, args.ckpt + ".tmp")
                os.replace(args.ckpt + ".tmp", args.ckpt)  # atomic: a kill leaves the old one
            if args.step_delay:
                time.sleep(args.step_delay)
    print("done", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
