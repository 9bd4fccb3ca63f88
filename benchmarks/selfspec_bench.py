"""Self-speculative decoding vs AR greedy on one checkpoint, measured in the same run (batch 1, KV cache).

For every prompt it decodes with AR greedy (our cache loop), HF `generate(do_sample=False)` and self-spec,
in that order, and reports per decoder: wall time, output tokens, forwards after prefill, tokens per forward,
tokens per second, and the wall-time ratio against AR greedy. Outputs are checked equal to AR greedy.
On random weights TPF ~ 1 is expected and says nothing; use a joint-trained checkpoint.

    python benchmarks/selfspec_bench.py --model tiny --data tiny-probe --limit 20
"""
from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--data", default="tiny-probe", help="prompt pool (as for gravity-grpo tpf)")
    parser.add_argument("--limit", type=int, default=20)
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
    from tqdm import tqdm

    from data.pool import load_pool
    from grpo.checkpoint import load_checkpoint, tokenizer_of
    from grpo.decoding.kv_session import stop_token_ids
    from grpo.prompting import encode_prompt
    from grpo.decoding.selfspec import SelfSpecDecoder, ar_generate

    ckpt = load_checkpoint(args.model, need_drafter=True, dtype=getattr(torch, args.dtype))
    model = ckpt.model.to(args.device)
    pool = load_pool(args.data)
    pool = pool.select(range(min(args.limit, len(pool))))
    bd_size = args.bd_size or ckpt.bd.bd_size
    stops = stop_token_ids(model, tokenizer_of(ckpt.processor))
    selfspec = SelfSpecDecoder(model, ckpt.bd.mask_id, bd_size, stops, args.max_new_tokens)

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def hf_generate(inputs):
        inputs = {k: v.to(args.device) for k, v in inputs.items()}
        out = model.generate(**inputs, do_sample=False, max_new_tokens=args.max_new_tokens)
        return out[0, inputs["input_ids"].shape[1]:].tolist(), None

    decoders = {
        "AR greedy": lambda x: (lambda r: (r.tokens, r.forwards))(ar_generate(model, x, stops, args.max_new_tokens)),
        "HF generate": hf_generate,
        "self-spec": lambda x: (lambda r: (r.tokens, r.forwards))(selfspec.generate(x)),
    }
    totals = {name: {"wall": 0.0, "tokens": 0, "forwards": 0, "equal": 0} for name in decoders}
    encoded = [encode_prompt(ckpt.processor, row, ckpt.is_vlm) for row in pool]
    decoders["AR greedy"](encoded[0])  # warm-up (allocator, kernels)
    names = list(decoders)
    with torch.inference_mode():
        for i, inputs in enumerate(tqdm(encoded, desc="decoding")):
            outputs = {}
            for name in names[i % 3:] + names[: i % 3]:  # rotate the order: no decoder always runs first
                sync()
                start = time.perf_counter()
                outputs[name], forwards = decoders[name](inputs)
                sync()
                t = totals[name]
                t["wall"] += time.perf_counter() - start
                t["tokens"] += len(outputs[name])
                t["forwards"] += forwards or 0
            for name in names:
                totals[name]["equal"] += outputs[name] == outputs["AR greedy"]

    ar_wall = totals["AR greedy"]["wall"]
    table = Table(title=f"{ckpt.path} on {args.data}: {len(encoded)} prompts, B={bd_size}, {args.dtype}, "
                        f"{args.device}, max {args.max_new_tokens} new tokens")
    for column in ("decoder", "wall s", "tokens", "forwards", "TPF", "tok/s", "vs AR", "= AR"):
        table.add_column(column, justify="left" if column == "decoder" else "right")
    for name, t in totals.items():
        tpf = f"{t['tokens'] / t['forwards']:.2f}" if t["forwards"] else "-"
        table.add_row(name, f"{t['wall']:.2f}", str(t["tokens"]), str(t["forwards"] or "-"), tpf,
                      f"{t['tokens'] / t['wall']:.1f}", f"{ar_wall / t['wall']:.2f}x", f"{t['equal']}/{len(encoded)}")
    Console().print(table)


if __name__ == "__main__":
    main()
