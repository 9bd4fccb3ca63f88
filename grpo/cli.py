"""`gravity-grpo`: one CLI, one module per subcommand under `grpo/commands/`.

Each command module exposes `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`.
Command modules import heavy libraries (torch, vLLM) inside `run`, so `--help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# subcommand name -> module under grpo.commands (the only list of subcommands)
COMMANDS = {
    "score": "score",
    "tpf": "tpf",
    "joint": "joint",
    "pool-stats": "pool_stats",
    "mine": "mine",
    "mine-merge": "mine_merge",
    "train": "train",
    "tpf-drift": "tpf_drift",
    "demo": "demo",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gravity-grpo",
        description="GRPO through the causal AR path of a self-speculative OCR model, and its tools.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"grpo.commands.{module_name}")
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    return args.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
