"""`gravity-grpo`: one CLI, one module per subcommand under `grpo/commands/`.

Each command module exposes `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`.
Command modules import heavy libraries (torch, vLLM) inside `run`, so `--help` stays fast.

`main` is the one boundary between people and the library (`ocr_rewards.cli.boundary`): a `UserError` from any
command becomes one `error: ...` line on stderr and exit code 2 (its traceback only with `-v`, which goes before
or after the subcommand), Ctrl-C exit 130, a crash exit 70. Argparse's own usage errors exit 2 as well.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

import grpo
from grpo.console import setup_logging
from ocr_rewards.cli import USER_ERROR_EXIT, boundary

__all__ = ["USER_ERROR_EXIT", "build_parser", "main"]

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
    "compare": "compare",
    "env": "env",
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The CLI parser; only the subcommand named in `argv` gets its arguments (`train` generates its flags from
    TRL's config classes, so the others, and `--help`, need not import TRL)."""
    named = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    parser = argparse.ArgumentParser(
        prog="gravity-grpo",
        description="GRPO through the causal AR path of a self-speculative OCR model, and its tools.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {grpo.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, and tracebacks of errors")
    # -v after the subcommand too; SUPPRESS keeps a subcommand's absent -v from resetting one given before it
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="debug logging, and tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"grpo.commands.{module_name}")
        command = sub.add_parser(name, help=module.HELP, description=module.HELP, parents=[verbose])
        if name == named:
            module.add_arguments(command)
        command.set_defaults(run=module.run, parser=command)
    return parser


def flag_hint(parser: argparse.ArgumentParser, setting: str | None) -> str:
    """` (flag --skip-bad)` when the command has a flag for the library setting `setting`, else ``."""
    flags = [a.option_strings[0] for a in parser._actions if a.dest == setting and a.option_strings]
    return f" (flag {flags[0]})" if flags else ""


def checked_run(args: argparse.Namespace) -> int:
    """`args.run(args)` once no argument holds a NUL byte or a path the system cannot look up (a name over 255
    bytes, a path over 4,096), each refused naming its flag; such a path read from a file is named where the
    system refuses it."""
    import errno

    from grpo.errors import UserError, quoted
    from grpo.paths import path_problem

    for dest, value in vars(args).items():
        if dest.endswith("_text"):  # literal text (`score --pred-text`), not a path
            continue
        for text in (value if isinstance(value, list) else [value]):
            text = str(text) if isinstance(text, os.PathLike) else text
            problem = path_problem(text) if isinstance(text, str) and ("\0" in text or "=" not in text) else None
            if problem:
                flags = [a.option_strings[0] for a in args.parser._actions if a.dest == dest and a.option_strings]
                raise UserError(f"{flags[0] if flags else dest} {quoted(text, 80)} {problem}")
    try:
        return args.run(args)
    except OSError as err:
        if err.errno != errno.ENAMETOOLONG:
            raise
        raise UserError(f"{quoted(str(err.filename), 80)}: a name over 255 bytes or a path over 4,096 "
                        "(the system refuses it)") from None


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    setup_logging(verbose=any(a in ("-v", "--verbose") for a in given))  # before `train`'s parser loads TRL
    args = build_parser(argv).parse_args(argv)
    return boundary(lambda: checked_run(args), args.verbose, lambda err: flag_hint(args.parser, err.setting))


if __name__ == "__main__":
    sys.exit(main())
