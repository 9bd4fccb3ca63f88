"""`gravity-grpo tpf`: tokens per forward of a joint checkpoint on a prompt pool, by task and length."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "measure the drafter's tokens per forward (self-speculative or direct diffusion) on a prompt pool"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny", help="checkpoint folder, or 'tiny' (default)")
    from grpo.yaml_config import RenamedFlag

    pool = parser.add_mutually_exclusive_group(required=True)
    pool.add_argument("--pool", help="prompt pool: save_to_disk folder, .parquet, .jsonl or a built-in name "
                                     "(e.g. tiny-probe)")
    pool.add_argument("--data", dest="pool", action=RenamedFlag, new="--pool", help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=None, help="use the first N rows")
    parser.add_argument("--skip-bad", action="store_true", help="leave malformed pool rows out (listed) "
                                                                 "instead of stopping")
    parser.add_argument("--bd-size", type=int, default=None, help="draft block size B (default: the checkpoint's)")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="output cap per prompt")
    parser.add_argument("--compare-ar", action="store_true", help="also decode AR greedy; report the equal share")
    parser.add_argument("--score", action="store_true", help="also score each output against the row's target "
                                                             "(the GRPO reward; selfspec output = AR greedy)")
    parser.add_argument("--mode", choices=("selfspec", "diffusion"), default="selfspec", help="decoder")
    parser.add_argument("--tau", type=float, default=0.9, help="confidence threshold of --mode diffusion")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="model dtype")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--out", type=Path, default=None, help="write the statistics as JSON here")


def _table(stats: dict):
    from rich.table import Table

    table = Table(title=f"TPF ({stats['mode']}, B={stats['bd_size']}, n={stats['n']})")
    for column in ("group", "n", "TPF", "accepted/round", "AR-equal", "reward", "exact", "tokens", "forwards"):
        table.add_column(column, justify="left" if column == "group" else "right")

    def fmt(value, spec=".2f"):
        return "-" if value is None else format(value, spec)

    def add(name: str, s: dict) -> None:
        table.add_row(name, str(s["n"]), fmt(s["tpf"]), fmt(s["accepted_per_round"]),
                      fmt(s["ar_equal_rate"], ".1%"), fmt(s["reward"], ".3f"), fmt(s["exact_rate"], ".0%"),
                      str(s["tokens"]), str(s["forwards"]))

    add("all", stats)
    for task, s in stats["by_task"].items():
        add(f"task {task}", s)
    for label, s in stats["by_length"].items():
        add(f"length {label}", s)
    return table


def run(args: argparse.Namespace) -> int:
    import torch

    from data.pool import load_pool
    from grpo.checkpoint import load_checkpoint
    from grpo.console import console
    from grpo.decoding.tpf import measure_tpf
    from grpo.errors import UserError
    from grpo.hardware import on_cpu

    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    ckpt = load_checkpoint(args.model, need_drafter=True, dtype=getattr(torch, args.dtype))
    pool = load_pool(args.pool, skip_bad=args.skip_bad)
    ckpt.model.to(args.device or ("cpu" if on_cpu() else "cuda"))
    if args.limit is not None:
        pool = pool.select(range(min(args.limit, len(pool))))
    stats = measure_tpf(ckpt.model, ckpt.processor, pool, ckpt.bd, is_vlm=ckpt.is_vlm, bd_size=args.bd_size,
                        max_new_tokens=args.max_new_tokens, compare_ar=args.compare_ar, mode=args.mode,
                        tau=args.tau, score=args.score)
    stats.update(model=str(ckpt.path), pool=args.pool)
    console.print(_table(stats))
    if stats["truncated"]:
        console.print(f"{stats['truncated']} output(s) reached --max-new-tokens {args.max_new_tokens}", markup=False)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(stats, indent=2) + "\n")
        console.print(f"wrote {args.out}", markup=False)
    return 0
