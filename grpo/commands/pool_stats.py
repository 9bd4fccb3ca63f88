"""`gravity-grpo pool-stats POOL`: rows per task, reference-length percentiles, optionally a length histogram
PNG and the statistics as JSON.

Files are written only where asked (`--png`, `--json`), checked by `grpo.outputs.output_file` before the pool
is read, each under a temporary name renamed into place.
"""
from __future__ import annotations

import argparse
import json

STAMP = "gravity-grpo pool-stats"  # in each file it writes (grpo.outputs)
HELP = "validate a prompt pool and print rows per task and reference-length percentiles"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pool", help="save_to_disk folder, .parquet, .jsonl or a built-in name (e.g. tiny)")
    parser.add_argument("--skip-bad", action="store_true", help="leave malformed rows out (they are listed)")
    parser.add_argument("--png", default=None, metavar="FILE.png",
                        help="also write a reference-length histogram here (its folder must exist)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="also write the statistics as JSON here (its folder must exist)")
    parser.add_argument("--overwrite", action="store_true", help="replace --png / --json files of an earlier "
                                                                 "pool-stats run")


def run(args: argparse.Namespace) -> int:
    from grpo.pool import load_pool
    from grpo.console import console, print_table
    from grpo.errors import UserError
    from grpo.mining.report import PERCENTILES, describe_pool, histogram_png
    from grpo.outputs import atomic_write, output_file

    png, json_path = (output_file(value, flag, stamp=STAMP, inputs=[args.pool], suffix=suffix, overwrite=args.overwrite)
                      for value, flag, suffix in ((args.png, "--png", ".png"), (args.json, "--json", None)))
    if png is not None and json_path is not None and png.resolve() == json_path.resolve():
        raise UserError(f"--png and --json name the same file {args.png}")
    stats = {"written_by": STAMP, **describe_pool(load_pool(args.pool, skip_bad=args.skip_bad))}
    lengths = stats.pop("lengths")
    replace = STAMP if args.overwrite else False  # never a file that appeared meanwhile (grpo.outputs.publish)
    headers = ["task", "rows", "share", *(f"p{q}" for q in PERCENTILES), "max"]
    rows = [[task, str(s["rows"]), f"{s['share']:.1%}", *(f"{s[f'p{q}_chars']:.0f}" for q in PERCENTILES),
             str(s["max_chars"])] for task, s in [*stats["tasks"].items(), ("all", stats["all"])]]
    print_table(f"{args.pool}: {stats['rows']} rows; reference length in characters", headers, rows)
    writes = [(png, lambda: histogram_png(lengths, png, "reference length (characters)",
                                          f"{args.pool}: reference lengths", software=STAMP, replace=replace)),
              (json_path, lambda: atomic_write(json_path, json.dumps(stats, indent=2) + "\n", replace))]
    for path, write in writes:
        if path is not None:
            try:
                write()
            except OSError as err:
                raise UserError(f"cannot write {path} ({err.strerror or err})") from None
            console.print(f"wrote {path}", markup=False)
    return 0
