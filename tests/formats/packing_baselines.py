#!/usr/bin/env python3
"""Packing baselines on log-normal document lengths: nanochat's BOS-aligned best-fit cropping and
OLMo-core's best-fit-decreasing (OBFD) packing, each transcribed from its source and run on the
same lengths. Prints token utilisation and the share of tokens cropped.

  nanochat  nanochat/dataloader.py tokenizing_distributed_data_loader_with_state_bos_bestfit
            (karpathy/nanochat 92d63d4): rows of T+1 tokens; a buffer of documents refilled 128 at
            a time (tokenizer_batch_size) whenever it holds fewer than buffer_size=1000; per row,
            repeatedly take the largest buffered document that fits the remaining space (first in
            buffer order among equals), and when none fits, crop the shortest buffered document
            to fill the row exactly and discard its rest. No padding: utilisation is 100% by
            construction, the cost is the cropped tokens.
  olmo      olmo_core/data/utils.py InstancePacker + SegmentTree + pack_documents_into_instances
            (allenai/OLMo-core fa6c501; same code in ai2-olmo-core 3.0.0): documents longer than
            the sequence length N are truncated to N (LongDocStrategy.truncate, the default; the
            rest is lost) or cut into N-token fragments (fragment); then sorted by length,
            decreasing (np.argsort(-len)), and each placed in the bin with the least remaining
            space that still fits it (a segment tree over remaining capacities 1..N; a new bin
            when only an empty one fits; among bins with equal space, the oldest). Instances are
            padded to N: the cost is padding, plus truncation.

Document lengths count every token of a document as packed: nanochat's lengths include the BOS it
prepends, OLMo's the EOS the Dolma toolkit appends. T: nanochat rows hold T+1 = 2049 tokens (inputs
and targets overlap by one); OLMo instances hold N = sequence_length tokens (N = 2048 by default,
--olmo-n to change). With olmo_core importable (it needs torch), the real InstancePacker also runs
and must place every document exactly as the transcription does.

Usage: packing_baselines.py [--docs 100000] [--mean 1000] [--sigma 1.0] [--T 2048] [--seed 0]
                            [--sweep] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict, deque

import numpy as np


def lognormal_lengths(n: int, mean: float, sigma: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mu = math.log(mean) - sigma * sigma / 2.0
    return np.maximum(np.rint(rng.lognormal(mu, sigma, size=n)).astype(np.int64), 1)


# --- nanochat ------------------------------------------------------------------------------------


def nanochat_bestfit(lengths: np.ndarray, T: int, buffer_size: int = 1000, refill: int = 128) -> dict:
    row_capacity = T + 1
    stream = iter(lengths.tolist())
    buf = np.empty(0, dtype=np.int64)
    exhausted = False
    rows = placed = cropped = consumed = docs_used = docs_cropped = 0
    half = None  # counters when half the corpus has been drawn: the second half is steady state

    def refill_buffer():
        nonlocal buf, exhausted
        batch = []
        for _ in range(refill):
            try:
                batch.append(next(stream))
            except StopIteration:
                exhausted = True
                break
        if batch:
            buf = np.concatenate([buf, np.array(batch, dtype=np.int64)])

    while True:
        # nanochat builds B rows per batch; the row loop is identical for every row, so the batch
        # size does not change the packing. Stop at the first row the corpus cannot fill.
        pos = 0
        row_ok = True
        snapshot = (placed, cropped, consumed, docs_used, docs_cropped)
        while pos < row_capacity:
            while len(buf) < buffer_size and not exhausted:
                refill_buffer()
            if len(buf) < buffer_size:  # nanochat would wrap to the next epoch here
                row_ok = False
                break
            remaining = row_capacity - pos
            fits = np.where(buf <= remaining, buf, 0)
            best_idx = int(np.argmax(fits))  # first index of the largest fitting length
            if fits[best_idx] > 0:
                doc_len = int(buf[best_idx])
                buf = np.delete(buf, best_idx)
                pos += doc_len
                placed += doc_len
                consumed += doc_len
                docs_used += 1
            else:
                shortest_idx = int(np.argmin(buf))  # min(range(len)), key=len: first shortest
                doc_len = int(buf[shortest_idx])
                buf = np.delete(buf, shortest_idx)
                placed += remaining
                cropped += doc_len - remaining
                consumed += doc_len
                docs_used += 1
                docs_cropped += 1
                pos += remaining
        if not row_ok:
            # the corpus ran out mid-row: count complete rows only
            placed, cropped, consumed, docs_used, docs_cropped = snapshot
            break
        rows += 1
        if half is None and docs_used >= len(lengths) // 2:
            half = (cropped, consumed)
    assert placed == rows * row_capacity
    return {"algorithm": "nanochat bos_bestfit", "row_tokens": row_capacity, "rows": rows,
            "tokens_in_rows": placed, "tokens_consumed": consumed, "utilisation": 1.0,
            "crop_share": cropped / consumed if consumed else 0.0,
            "docs_used": docs_used, "docs_cropped": docs_cropped,
            "docs_left_in_buffer": int(len(buf)),
            "buffered_longer_than_row": int((buf > row_capacity).sum()),
            # documents never placed: the buffer at the end (it keeps the longest) plus the
            # corpus tail that could not fill a row
            "unused_share": 1.0 - consumed / int(lengths.sum()),
            "lost_share": 1.0 - placed / int(lengths.sum()),
            "crop_share_second_half": (cropped - half[0]) / (consumed - half[1]) if half else None}


# --- OLMo-core -----------------------------------------------------------------------------------


class ArraySegmentTree:
    """olmo_core SegmentTree on an array: leaf i holds the capacity i+1 if some bin has exactly
    that much space left (else 0); leaf N-1 (a new, empty bin) always holds N. query(w) walks
    from the root to the leftmost leaf whose weight is >= w, i.e. the smallest fitting space."""

    def __init__(self, n: int):
        assert math.log2(n) % 1 == 0, "N should be a power of 2"
        self.n = n
        self.t = [0] * (2 * n)
        self.update(n - 1, n)

    def update(self, leaf: int, weight: int):
        i = self.n + leaf
        self.t[i] = weight
        i //= 2
        while i >= 1:
            self.t[i] = max(self.t[2 * i], self.t[2 * i + 1])
            i //= 2

    def query(self, weight: int) -> int:
        i = 1
        while i < self.n:
            assert weight <= self.t[i]
            left = 2 * i
            i = left if weight <= self.t[left] else left + 1
        return i - self.n


def olmo_obfd(lengths: np.ndarray, n: int, long_doc_strategy: str = "truncate") -> dict:
    """pack_documents_into_instances on one source (document_indices from the lengths)."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pairs = []
    truncated = 0
    for s, ln in zip(starts.tolist(), lengths.tolist()):
        e = s + ln
        if ln > n:
            if long_doc_strategy == "truncate":
                pairs.append((s, s + n))
                truncated += ln - n
            else:
                for ns in range(s, e, n):
                    pairs.append((ns, min(e, ns + n)))
        else:
            pairs.append((s, e))
    document_indices = np.array(pairs, dtype=np.uint64).reshape(-1, 2)
    # InstancePacker.pack_documents
    document_lengths = document_indices[:, 1] - document_indices[:, 0]
    sorted_index = np.argsort(-1 * document_lengths.astype(np.int64))
    document_indices = np.take(document_indices, sorted_index, axis=0)
    tree = ArraySegmentTree(n)
    bins: list[list[int]] = []
    space_to_bins: dict[int, deque] = defaultdict(deque)
    for document_id, (start_idx, end_idx) in enumerate(document_indices.tolist()):
        document_len = int(end_idx - start_idx)
        best_fit_capacity = tree.query(document_len) + 1
        if best_fit_capacity == n:
            bins.append([])
            bin_id = len(bins) - 1
        else:
            q = space_to_bins[best_fit_capacity]
            bin_id = q.popleft()
            if len(q) == 0:
                tree.update(best_fit_capacity - 1, 0)
        bins[bin_id].append(document_id)
        bin_space = best_fit_capacity - document_len
        if bin_space > 0:
            q = space_to_bins[bin_space]
            if len(q) == 0:
                tree.update(bin_space - 1, bin_space)
            q.append(bin_id)
    total_padding = sum(i * len(space_to_bins[i]) for i in range(1, n) if i in space_to_bins)
    total_tokens = n * len(bins) - total_padding
    total_input = int(lengths.sum())
    return {"algorithm": f"olmo-core OBFD ({long_doc_strategy})", "row_tokens": n, "rows": len(bins),
            "tokens_in_rows": total_tokens, "padding": total_padding,
            "utilisation": total_tokens / (n * len(bins)),
            "crop_share": truncated / total_input, "docs": len(document_indices),
            "_bins": bins, "_document_indices": document_indices}


def olmo_real(lengths: np.ndarray, n: int, long_doc_strategy: str = "truncate"):
    """The real olmo_core InstancePacker on the same document_indices, or None without torch."""
    try:
        from olmo_core.data.utils import InstancePacker
    except Exception:
        return None
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pairs = []
    for s, ln in zip(starts.tolist(), lengths.tolist()):
        e = s + ln
        if ln > n:
            if long_doc_strategy == "truncate":
                pairs.append((s, s + n))
            else:
                for ns in range(s, e, n):
                    pairs.append((ns, min(e, ns + n)))
        else:
            pairs.append((s, e))
    document_indices = np.array(pairs, dtype=np.uint64).reshape(-1, 2)
    instances, doc_idx, total_tokens = InstancePacker(n).pack_documents(document_indices)
    return instances, doc_idx, total_tokens


def run(docs: int, mean: float, sigma: float, T: int, seed: int, olmo_n: int | None, check_real: bool) -> dict:
    lengths = lognormal_lengths(docs, mean, sigma, seed)
    n = olmo_n or T
    out = {"docs": docs, "mean_target": mean, "sigma": sigma, "seed": seed,
           "mean_len": float(lengths.mean()), "median_len": float(np.median(lengths)),
           "p99_len": float(np.percentile(lengths, 99)), "share_docs_longer_than_T": float((lengths > T).mean()),
           "share_tokens_beyond_T": float(np.maximum(lengths - T, 0).sum() / lengths.sum()),
           "total_tokens": int(lengths.sum()), "T": T}
    t0 = time.time()
    nc = nanochat_bestfit(lengths, T)
    nc["seconds"] = round(time.time() - t0, 2)
    out["nanochat"] = {k: v for k, v in nc.items() if not k.startswith("_")}
    for strat in ("truncate", "fragment"):
        t0 = time.time()
        ob = olmo_obfd(lengths, n, strat)
        ob["seconds"] = round(time.time() - t0, 2)
        if check_real:
            real = olmo_real(lengths, n, strat)
            if real is not None:
                instances, doc_idx, total_tokens = real
                same = (instances == ob["_bins"] and np.array_equal(doc_idx, ob["_document_indices"])
                        and total_tokens == ob["tokens_in_rows"])
                ob["matches_real_olmo_core"] = bool(same)
                if not same:
                    raise SystemExit("transcribed OBFD differs from olmo_core's InstancePacker")
        out[f"olmo_{strat}"] = {k: v for k, v in ob.items() if not k.startswith("_")}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--mean", type=float, default=1000.0)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--olmo-n", type=int, help="OLMo sequence length (default T; a power of 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", action="store_true", help="also sigma 0.5, 1.5 and T 1024, 4096")
    ap.add_argument("--no-real", action="store_true", help="skip the real olmo_core check")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cases = [(a.sigma, a.T)]
    if a.sweep:
        cases += [(0.5, a.T), (1.5, a.T), (a.sigma, 1024), (a.sigma, 4096)]
    results = [run(a.docs, a.mean, s, t, a.seed, a.olmo_n if t == a.T else None, not a.no_real) for s, t in cases]
    if a.json:
        print(json.dumps(results, indent=1))
        return
    for r in results:
        print(f"log-normal lengths: {r['docs']} docs, sigma {r['sigma']}, mean {r['mean_len']:.0f}, "
              f"median {r['median_len']:.0f}, p99 {r['p99_len']:.0f}; docs > T: {100 * r['share_docs_longer_than_T']:.2f}%, "
              f"tokens beyond T: {100 * r['share_tokens_beyond_T']:.2f}%  (T = {r['T']})")
        nc = r["nanochat"]
        print(f"  nanochat best-fit crop (rows of T+1={nc['row_tokens']}): utilisation {100 * nc['utilisation']:.2f}%, "
              f"cropped {100 * nc['crop_share']:.2f}% of tokens, {nc['docs_cropped']} of {nc['docs_used']} docs cropped, "
              f"{nc['rows']} rows ({nc['seconds']} s)")
        print(f"    second half of the corpus (buffer in steady state): cropped {100 * nc['crop_share_second_half']:.2f}%; "
              f"at the end {nc['buffered_longer_than_row']} of the {nc['docs_left_in_buffer']} buffered docs are longer than a row, "
              f"{100 * nc['unused_share']:.2f}% of all tokens never drawn from the buffer; "
              f"tokens in rows / all tokens = {100 * (1 - nc['lost_share']):.2f}%")
        for strat in ("truncate", "fragment"):
            ob = r[f"olmo_{strat}"]
            real = ob.get("matches_real_olmo_core")
            tag = "" if real is None else (", = real olmo_core" if real else ", DIFFERS from olmo_core")
            print(f"  OLMo-core OBFD {strat:8s} (rows of N={ob['row_tokens']}): utilisation {100 * ob['utilisation']:.2f}% "
                  f"(padding {ob['padding']} tokens), cropped {100 * ob['crop_share']:.2f}%, {ob['rows']} rows "
                  f"({ob['seconds']} s{tag})")


if __name__ == "__main__":
    main()
