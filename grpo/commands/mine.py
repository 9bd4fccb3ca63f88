"""`gravity-grpo mine`: screen a prompt pool by reward variance and keep the hard, long ones (SPEC §8)."""
from __future__ import annotations

import argparse

HELP = "sample k rollouts per prompt, drop zero-variance prompts, rank toward hard long tables, keep the top N"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from grpo.mining.selection import PREFER  # light: the ranking presets only

    parser.add_argument("--model", default="tiny", help="checkpoint folder, or 'tiny' (default)")
    parser.add_argument("--data", required=True, help="prompt pool: save_to_disk folder, .parquet, .jsonl or a "
                                                      "built-in name (e.g. tiny)")
    parser.add_argument("--out", required=True, help="output folder (a datasets folder + mining/ + report/); "
                                                     "rerun with the same arguments to resume")
    parser.add_argument("--k", type=int, default=8, help="rollouts per prompt (default 8)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    parser.add_argument("--max-tokens", type=int, default=8448, help="completion cap in tokens (default 8448)")
    parser.add_argument("--min-std", type=float, default=0.0,
                        help="drop prompts whose reward std is <= this (equal rewards are always dropped)")
    parser.add_argument("--prefer", default="long-tables", choices=list(PREFER),
                        help="ranking preset (default long-tables); the rule is in grpo/mining/selection.py")
    parser.add_argument("--hard-weight", type=float, default=None, help="override the preset's weight of 1 - mean")
    parser.add_argument("--length-weight", type=float, default=None,
                        help="override the preset's weight of min(ref_chars / length_scale, 1)")
    parser.add_argument("--length-scale", type=float, default=None, help="override the preset's length scale "
                                                                         "(characters)")
    parser.add_argument("--table-bonus", type=float, default=None, help="override the preset's table bonus")
    parser.add_argument("--keep", type=int, default=None, help="keep the top N prompts (default: all that vary)")
    parser.add_argument("--shard", default="0/1", help="mine part I of N (I from 0), e.g. 2/4; join with "
                                                       "mine-merge")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (per prompt, so resumes agree)")
    parser.add_argument("--chunk-size", type=int, default=32, help="prompts per engine call and part file")
    parser.add_argument("--skip-bad", action="store_true", help="leave malformed pool rows out (they are listed)")
    parser.add_argument("--hf-generate", action="store_true",
                        help="fallback: sample with HF generate instead of vLLM (e.g. GLM-OCR on a CPU)")
    parser.add_argument("--max-model-len", type=int, default=None, help="vLLM context length (default: model's)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM GPU memory share")
    parser.add_argument("--dtype", default="auto", help="vLLM dtype: auto (default), float32, bfloat16, float16")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _rank_rule(args: argparse.Namespace):
    import dataclasses

    from grpo.mining.selection import PREFER

    overrides = {name: getattr(args, name) for name in ("hard_weight", "length_weight", "length_scale",
                                                        "table_bonus") if getattr(args, name) is not None}
    return dataclasses.replace(PREFER[args.prefer], **overrides)


def print_summary(summary: dict, out: str) -> None:
    """The per-task counts table and where the report went (shared with mine-merge)."""
    from grpo.console import console, print_table

    keys = ("mined", "dropped_zero_variance", "ranked_out", "kept")
    print_table(f"mined into {out}", ["task", *keys],
                [[task, *(str(row[k]) for k in keys)] for task, row in summary["counts"].items()])
    console.print(f"truncated rollouts: {summary['truncated_rollouts']}; histograms: "
                  f"{summary['reward_mean_png']}, {summary['reward_std_png']}", markup=False)


def run(args: argparse.Namespace) -> int:
    from grpo.mining.miner import MineConfig, mine, parse_shard

    cfg = MineConfig(model=args.model, data=args.data, out=args.out, k=args.k, temperature=args.temperature,
                     max_tokens=args.max_tokens, min_std=args.min_std, rank=_rank_rule(args), keep=args.keep,
                     shard=parse_shard(args.shard), seed=args.seed, chunk_size=args.chunk_size,
                     skip_bad=args.skip_bad, hf_generate=args.hf_generate, max_model_len=args.max_model_len,
                     gpu_memory_utilization=args.gpu_memory_utilization, dtype=args.dtype,
                     progress=not args.no_progress)
    print_summary(mine(cfg), args.out)
    return 0
