"""`gravity-grpo mine`: screen a prompt pool by reward variance and keep the hard, long ones (docs/spec.md §8)."""
from __future__ import annotations

import argparse

HELP = "sample k rollouts per prompt, drop zero-variance prompts, rank toward hard long tables, keep the top N"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from grpo.mining.miner import fields

    parser.add_argument("--config", help="YAML recipe of MineConfig keys (grpo/mining/miner.py), flags on top")
    fields().add_flags(parser)


def _rank_bonus_alias(args: argparse.Namespace) -> None:
    """`--table-bonus NUMBER` was the ranking bonus before the reward's reading took the name."""
    import logging

    value = getattr(args, "table_bonus", None)
    try:
        float(value)
    except (TypeError, ValueError):
        return
    logging.getLogger(__name__).warning("--table-bonus NUMBER is deprecated; use --rank-table-bonus NUMBER")
    delattr(args, "table_bonus")
    args.rank_table_bonus = value


def print_summary(summary: dict, out: str) -> None:
    """The per-task counts table and where the report went (shared with mine-merge)."""
    from grpo.console import console, print_table

    keys = ("mined", "dropped_zero_variance", "ranked_out", "kept")
    print_table(f"mined into {out}", ["task", *keys],
                [[task, *(str(row[k]) for k in keys)] for task, row in summary["counts"].items()])
    console.print(f"truncated rollouts: {summary['truncated_rollouts']}; histograms: "
                  f"{summary['reward_mean_png']}, {summary['reward_std_png']}", markup=False)


def run(args: argparse.Namespace) -> int:
    from grpo.mining.miner import MineConfig, fields, mine
    from grpo.yaml_config import build

    _rank_bonus_alias(args)
    cfg = build(MineConfig, fields().load(args.config, fields().command_line(args)), args.config or "command line")
    print_summary(mine(cfg), cfg.output_dir)
    return 0
