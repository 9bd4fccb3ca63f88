"""`gravity-grpo pool-stats POOL`: rows per task, reference-length percentiles, optionally a length histogram
PNG and the statistics as JSON.

Files are written only where asked (`--png`, `--json`), into a folder that exists (none is created), never
over the pool itself, each under a temporary name renamed into place.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "validate a prompt pool and print rows per task and reference-length percentiles"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pool", help="save_to_disk folder, .parquet, .jsonl or a built-in name (e.g. tiny)")
    parser.add_argument("--skip-bad", action="store_true", help="leave malformed rows out (they are listed)")
    parser.add_argument("--png", default=None, metavar="FILE.png",
                        help="also write a reference-length histogram here (its folder must exist)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="also write the statistics as JSON here (its folder must exist)")


def output_file(value: str | None, flag: str, pool: str, suffix: str | None = None) -> Path | None:
    """The file `flag` names, checked before any work: a file path in an existing folder, not the pool."""
    from grpo.errors import UserError

    if value is None:
        return None
    path = Path(value)
    if not value.strip() or value.endswith(("/", "\\")) or path.name in ("", ".", ".."):
        raise UserError(f"{flag} {value!r}: give a file path")
    if path.is_dir():
        raise UserError(f"{flag} {value}: is a folder; give a file path")
    if path.exists() and not path.is_file():
        raise UserError(f"{flag} {value}: exists and is not a regular file (pool-stats replaces only files)")
    if suffix and path.suffix.lower() != suffix:
        raise UserError(f"{flag} {value}: the file name must end in {suffix}")
    if not path.parent.is_dir():
        raise UserError(f"{flag} {value}: the folder {path.parent} does not exist (pool-stats creates none)")
    source = Path(pool)
    if source.exists() and (path.resolve() == source.resolve() or
                            source.is_dir() and source.resolve() in path.resolve().parents):
        raise UserError(f"{flag} {value}: would write over or into the pool {pool}")
    return path


def run(args: argparse.Namespace) -> int:
    from grpo.pool import load_pool
    from grpo.console import console, print_table
    from grpo.errors import UserError
    from grpo.mining.report import PERCENTILES, describe_pool, histogram_png
    from grpo.mining.store import atomic_write

    png = output_file(args.png, "--png", args.pool, ".png")
    json_path = output_file(args.json, "--json", args.pool)
    if png is not None and json_path is not None and png.resolve() == json_path.resolve():
        raise UserError(f"--png and --json name the same file {args.png}")
    stats = describe_pool(load_pool(args.pool, skip_bad=args.skip_bad))
    lengths = stats.pop("lengths")
    headers = ["task", "rows", "share", *(f"p{q}" for q in PERCENTILES), "max"]
    rows = [[task, str(s["rows"]), f"{s['share']:.1%}", *(f"{s[f'p{q}_chars']:.0f}" for q in PERCENTILES),
             str(s["max_chars"])] for task, s in [*stats["tasks"].items(), ("all", stats["all"])]]
    print_table(f"{args.pool}: {stats['rows']} rows; reference length in characters", headers, rows)
    writes = [(png, lambda: histogram_png(lengths, png, "reference length (characters)",
                                          f"{args.pool}: reference lengths")),
              (json_path, lambda: atomic_write(json_path, json.dumps(stats, indent=2) + "\n"))]
    for path, write in writes:
        if path is not None:
            try:
                write()
            except OSError as err:
                raise UserError(f"cannot write {path} ({err.strerror or err})") from None
            console.print(f"wrote {path}", markup=False)
    return 0
