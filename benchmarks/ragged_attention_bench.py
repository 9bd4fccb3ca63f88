"""Attention over ragged rows at the batched decoder's shapes: one masked call vs rows grouped by length.

`BatchSession.forward` attends every row to the longest row's span, with an additive mask hiding the rest.
This compares that call with the same attention done per length group (rows gathered, each group cut to
its own longest span) and with eager attention (matmul, softmax, matmul), on random rows whose cached
lengths lie between `--min-len` and `--max-len` (the probe's prompts are 5-91 tokens, plus their outputs). Prints microseconds per call and the ratios to the
single masked call, all measured in this run; the outputs are checked equal first.

    python benchmarks/ragged_attention_bench.py --rows 16 --threads 1
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--window", type=int, default=17, help="new tokens per row (B + 1)")
    parser.add_argument("--min-len", type=int, default=60)
    parser.add_argument("--max-len", type=int, default=240)
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    n, h, w, d = args.rows, args.heads, args.window, args.head_dim
    lengths = torch.randint(args.min_len, args.max_len, (n,), generator=gen)
    span = int(lengths.max()) + w
    keys, values = (torch.randn(n, h, 2 * span, d, generator=gen) for _ in range(2))  # a buffer, as the cache's
    query = torch.randn(n, h, w, d, generator=gen)
    rel = torch.arange(span)[None, None] - lengths[:, None, None]
    allowed = (rel < 0) | ((rel >= 0) & (rel <= torch.arange(w)[None, :, None]))   # causal window after each row
    mask = torch.zeros(n, 1, w, span).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    by_length = lengths.argsort(descending=True).chunk(args.groups)

    def masked():
        return F.scaled_dot_product_attention(query, keys[:, :, :span], values[:, :, :span], attn_mask=mask)

    def grouped():
        out = torch.empty_like(query)
        for rows in by_length:
            cut = int(lengths[rows].max()) + w
            out[rows] = F.scaled_dot_product_attention(query[rows], keys[rows, :, :cut], values[rows, :, :cut],
                                                       attn_mask=mask[rows, :, :, :cut])
        return out

    def eager():
        scores = query @ keys[:, :, :span].transpose(-1, -2) / d ** 0.5 + mask
        return scores.softmax(-1) @ values[:, :, :span]

    reference = masked()
    variants = {"one masked call": masked, f"{args.groups} length groups": grouped, "eager": eager}
    for name, fn in variants.items():
        torch.testing.assert_close(fn(), reference, atol=1e-5, rtol=1e-4, msg=name)
    needed = int((lengths + w).sum())
    print(f"{n} rows, span {span}, key slots computed {n * span} vs needed {needed} ({n * span / needed:.2f}x)")
    times = {name: [] for name in variants}
    for _ in range(3):  # take turns, so a change in machine load hits every variant
        for name, fn in variants.items():
            begin = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - begin) / args.calls)
    base = min(times["one masked call"])
    for name, runs in times.items():
        print(f"{name:>18}: {min(runs) * 1e6:7.0f} us per call, {min(runs) / base:.2f}x the masked call")


if __name__ == "__main__":
    main()
