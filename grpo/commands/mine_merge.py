"""`gravity-grpo mine-merge`: join the shard outputs of one `mine --shard I/N` run."""
from __future__ import annotations

import argparse

HELP = "join the OUT folders of mine --shard 0/N .. N-1/N into one mined pool"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shards", nargs="+", help="the OUT folders of every shard")
    parser.add_argument("--out", required=True, help="merged output folder: new or empty (never a shard)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out folder (kept until the merge has succeeded)")


def run(args: argparse.Namespace) -> int:
    from grpo.commands.mine import print_summary
    from grpo.mining.miner import merge

    print_summary(merge(args.shards, args.out, overwrite=args.overwrite), args.out)
    return 0
