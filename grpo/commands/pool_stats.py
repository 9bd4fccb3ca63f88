"""`gravity-grpo pool-stats POOL`: rows per task, reference-length percentiles, a length histogram PNG."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "validate a prompt pool and print rows per task and reference-length percentiles"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pool", help="save_to_disk folder, .parquet, .jsonl or a built-in name (e.g. tiny)")
    parser.add_argument("--skip-bad", action="store_true", help="leave malformed rows out (they are listed)")
    parser.add_argument("--png", type=Path, default=Path("pool_lengths.png"),
                        help="reference-length histogram (default: pool_lengths.png)")
    parser.add_argument("--json", type=Path, default=None, help="also write the statistics as JSON here")


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from data.pool import load_pool
    from grpo.console import console, escape
    from grpo.mining.report import PERCENTILES, describe_pool, histogram_png

    stats = describe_pool(load_pool(args.pool, skip_bad=args.skip_bad))
    lengths = stats.pop("lengths")
    table = Table(title=f"{escape(args.pool)}: {stats['rows']} rows; reference length in characters")
    for column in ("task", "rows", "share", *(f"p{q}" for q in PERCENTILES), "max"):
        table.add_column(column, justify="left" if column == "task" else "right")
    for task, s in [*stats["tasks"].items(), ("all", stats["all"])]:
        table.add_row(task, str(s["rows"]), f"{s['share']:.1%}", *(f"{s[f'p{q}_chars']:.0f}" for q in PERCENTILES),
                      str(s["max_chars"]))
    console.print(table)
    histogram_png(lengths, args.png, "reference length (characters)", f"{args.pool}: reference lengths")
    console.print(f"wrote {args.png}", markup=False)
    if args.json is not None:
        args.json.write_text(json.dumps(stats, indent=2) + "\n")
        console.print(f"wrote {args.json}", markup=False)
    return 0
