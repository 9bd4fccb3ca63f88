"""Self-speculative decoding vs AR greedy on one text checkpoint, at batch 1 and at batch N, in the same run.

Decoders, each over the same prompts (KV cache, greedy):
- `HF generate b1` / `HF generate bN`: transformers `generate(do_sample=False)`, one prompt at a time, and N
  left-padded prompts at a time;
- `self-spec b1` / `self-spec bN`: this package's batched self-speculative decoder at batch size 1 and N.
Per decoder: wall time, CPU time (the process's; steadier than wall time on a shared machine), output tokens, forwards after prefill (self-spec: per row, summed), TPF (tokens after
x0 per forward), tokens per second, and whether each output equals HF generate at batch 1. Ratios printed at
the end: self-spec bN against HF generate bN (batched AR), against self-spec b1, and against HF generate b1.
HF generate bN decodes N prompts per call (static batches); self-spec bN keeps N rows busy, a finished row's
place going to the next prompt. The decoders take turns, pass by pass (the order rotates), so a load change on
the machine hits all of them.
On random weights TPF ~ 1 is expected and says nothing; use a joint-trained checkpoint.

    python benchmarks/selfspec_bench.py --model tiny --pool tiny-probe --batch-size 16 --threads 1
"""
from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--pool", default="tiny-probe", help="prompt pool (as for gravity-grpo tpf)")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts (default: all)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2, help="passes over the prompts (wall times summed)")
    parser.add_argument("--bd-size", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from rich.console import Console
    from rich.table import Table

    from grpo.pool import load_pool
    from grpo.checkpoint import load_checkpoint, tokenizer_of
    from grpo.decoding.batched import BatchDecoder
    from grpo.decoding.kv_session import stop_token_ids
    from grpo.decoding.tpf import tpf_of
    from grpo.prompting import encode_prompt

    ckpt = load_checkpoint(args.model, need_drafter=True, dtype=getattr(torch, args.dtype))
    if ckpt.is_vlm:
        raise SystemExit("this benchmark batches text prompts for HF generate; use a text checkpoint")
    model = ckpt.model.to(args.device)
    tokenizer = tokenizer_of(ckpt.processor)
    pool = load_pool(args.pool)
    pool = pool.select(range(min(args.limit or len(pool), len(pool))))
    bd_size = args.bd_size or ckpt.bd.bd_size
    stops = stop_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stops)
    selfspec = BatchDecoder(model, ckpt.bd.mask_id, bd_size, stops, args.max_new_tokens)
    n = args.batch_size

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def cut(ids: list[int]) -> list[int]:
        """An HF output up to its first stop token (the padding after it dropped)."""
        for i, t in enumerate(ids):
            if t in stops:
                return ids[: i + 1]
        return ids

    def hf_generate(chunk):
        width = max(x["input_ids"].shape[1] for x in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for i, x in enumerate(chunk):
            ids[i, width - x["input_ids"].shape[1]:] = x["input_ids"][0]
            mask[i, width - x["input_ids"].shape[1]:] = 1
        out = model.generate(input_ids=ids.to(args.device), attention_mask=mask.to(args.device), do_sample=False,
                             max_new_tokens=args.max_new_tokens, pad_token_id=pad)
        return [(cut(row), None) for row in out[:, width:].tolist()]

    def hf_batches(size):
        return lambda prompts: [out for i in range(0, len(prompts), size) for out in hf_generate(prompts[i:i + size])]

    def spec(size):  # continuous batching: a finished row's place goes to the next prompt
        return lambda prompts: [(r.tokens, r.forwards) for r in selfspec.generate(prompts, size)]

    decoders = {"HF generate b1": hf_batches(1), f"HF generate b{n}": hf_batches(n), "self-spec b1": spec(1),
                f"self-spec b{n}": spec(n)}
    encoded = [encode_prompt(ckpt.processor, row, False) for row in pool]
    totals = {name: {"wall": 0.0, "cpu": 0.0, "tokens": 0, "records": [], "equal": 0}
              for name in decoders}
    for name, decode in decoders.items():
        decode(encoded[:2])  # warm-up (allocator, kernels)
    names = list(decoders)
    with torch.inference_mode():
        for rep in range(args.repeats):
            outputs = {}
            turn = rep % len(names)
            for name in names[turn:] + names[:turn]:  # rotate the order: no decoder always runs first
                sync()
                start, cpu = time.perf_counter(), time.process_time()
                results = decoders[name](encoded)
                sync()
                t = totals[name]
                t["wall"] += time.perf_counter() - start
                t["cpu"] += time.process_time() - cpu
                outputs[name] = [tokens for tokens, _ in results]
                t["tokens"] += sum(len(tokens) for tokens, _ in results)
                t["records"] += [{"tokens": len(tokens), "forwards": f} for tokens, f in results if f is not None]
            for name in names:
                totals[name]["equal"] += sum(a == b for a, b in zip(outputs[name], outputs["HF generate b1"]))

    count = len(encoded) * args.repeats
    table = Table(title=f"{ckpt.path} on {args.pool}: {len(encoded)} prompts x {args.repeats}, B={bd_size}, "
                        f"{args.dtype}, {args.device}, {torch.get_num_threads()} thread(s), max {args.max_new_tokens}")
    for column in ("decoder", "wall s", "CPU s", "tokens", "forwards", "TPF", "tok/s", "= HF b1"):
        table.add_column(column, justify="left" if column == "decoder" else "right")
    for name, t in totals.items():
        tpf, forwards = tpf_of(t["records"]), sum(r["forwards"] for r in t["records"])
        table.add_row(name, f"{t['wall']:.2f}", f"{t['cpu']:.2f}", str(t["tokens"]), str(forwards or "-"),
                      "-" if tpf is None else f"{tpf:.2f}",
                      f"{t['tokens'] / t['wall']:.1f}", f"{t['equal']}/{count}")
    console = Console()
    console.print(table)
    mine = totals[f"self-spec b{n}"]
    for other in (f"HF generate b{n}", "self-spec b1", "HF generate b1"):
        t = totals[other]
        console.print(f"self-spec b{n} against {other}: {t['wall'] / mine['wall']:.2f}x in wall time, "
                      f"{t['cpu'] / mine['cpu']:.2f}x in CPU time", markup=False)


if __name__ == "__main__":
    main()
