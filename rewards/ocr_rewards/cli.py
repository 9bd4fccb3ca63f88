"""`ocr-rewards`: score one prediction, or a JSONL file of pairs; `check` a pairs file in CI.

`ocr-rewards score` and `gravity-grpo score` are the same command (`add_score_arguments`, `run_score`);
`ocr-rewards check PAIRS.jsonl` is `score --pairs PAIRS.jsonl --check`. `boundary` is the one place where a
command's outcome becomes an exit code, for both CLIs: 0 done, 1 cases outside their bounds, 2 a user mistake
(one `error:` line), 70 a crash (its traceback; sysexits' EX_SOFTWARE), 130 Ctrl-C (one line).

`--pred` and `--ref` are always files (a missing or non-UTF-8 one is an error naming it); literal text goes
through `--pred-text` / `--ref-text`, so a mistyped path is never scored as the text of its name.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

from .console import console, print_error
from .errors import UserError, write_errno

HELP = "score a prediction against its reference (or a JSONL file of pairs) with the OCR rewards"
CHECK_FAILED_EXIT = 1  # --check: some case is outside its bounds
USER_ERROR_EXIT = 2    # a user mistake, as argparse's usage errors
CRASH_EXIT = 70        # a bug (EX_SOFTWARE): never 1, which CI reads as "cases outside their bounds", nor 3 (train: TPF floor)
INTERRUPTED_EXIT = 130


def boundary(run: Callable[[], int], verbose: bool, hint: Callable[[UserError], str] = lambda err: "") -> int:
    """`run()`'s exit code; a `UserError` is one `error:` line (and `hint(err)`), exit 2; Ctrl-C one line, 130;
    a closed stdout (`| head`) ends quietly; anything else is a crash: its traceback, exit 70.

    Python warnings of the libraries are held until the command ends and shown only with `verbose` or after a
    crash, so the `error:` line is all a refused command prints and a run prints its results alone."""
    with warnings.catch_warnings(record=True) as caught:
        code = _outcome(run, verbose, hint)
    if verbose or code == CRASH_EXIT:
        for w in caught:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return code


class _NamedStream:
    """`sys.stdout` for the duration of a command: its write errors carry the name "standard output"."""

    def __init__(self, stream, name: str):
        self._stream, self._name = stream, name

    def _named(self, method: str, *args):
        try:
            return getattr(self._stream, method)(*args)
        except OSError as err:
            err.filename = err.filename or self._name
            raise

    def write(self, text: str) -> int:
        return self._named("write", text)

    def flush(self) -> None:
        self._named("flush")

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


STDOUT = "standard output"


def _outcome(run: Callable[[], int], verbose: bool, hint: Callable[[UserError], str]) -> int:
    stdout, sys.stdout = sys.stdout, _NamedStream(sys.stdout, STDOUT)
    try:
        code = run() or 0
        sys.stdout.flush()  # here, not at exit: a full device is named like any other output
        return code
    except UserError as err:
        if verbose:
            traceback.print_exc()
        first, newline, rest = str(err).partition("\n")  # the hint ends the first line, before any row list
        print_error(f"{first}{hint(err)}{newline}{rest}")
        return USER_ERROR_EXIT
    except KeyboardInterrupt:
        if verbose:
            traceback.print_exc()
        print_error("interrupted (Ctrl-C); files already written are complete")
        return INTERRUPTED_EXIT
    except Exception as err:  # noqa: BLE001 - the boundary: a bug gets its traceback and its own exit code
        code = write_errno(err)
        on_stdout = getattr(err, "filename", None) == STDOUT
        if on_stdout:
            _silence(stdout)  # no second error at exit's flush
            if isinstance(err, BrokenPipeError):  # `| head`: the reader has what it wanted
                return 0
        if code is not None:
            if verbose:
                traceback.print_exc()
            where = getattr(err, "filename", None) or "the output"
            print_error(f"cannot write {where}: {os.strerror(code)}; what was being written there is incomplete")
            return USER_ERROR_EXIT
        traceback.print_exc()
        print_error("internal error (a bug, not your input): please report the traceback above")
        return CRASH_EXIT
    finally:
        sys.stdout = stdout


def _silence(stream) -> None:
    """Point the file descriptor of `stream` (stdout) at /dev/null and drop what its buffer holds."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (OSError, ValueError, AttributeError):  # a stream without a descriptor (a test's capture)
        pass


def add_score_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `score` (both CLIs)."""
    from .gate import GATES
    from .scoring import TASKS
    from .settings import DEFAULT
    from .table import TABLE_BONUS
    from .think import THINK_MODES
    from .postprocess import POSTPROCESS_MODES

    parser.add_argument("--task", choices=TASKS, help="reward to apply (with --pred/--ref)")
    for name, what in (("pred", "prediction"), ("ref", "reference")):
        given = parser.add_mutually_exclusive_group()
        given.add_argument(f"--{name}", metavar="FILE", help=f"the {what}: a UTF-8 text file")
        given.add_argument(f"--{name}-text", metavar="TEXT", help=f"the {what} as literal text")
    parser.add_argument("--pairs", type=Path, metavar="JSONL",
                        help="score every line {pred, ref, task} of this file and print a summary per task; a line "
                             "may add expect (with tol), min and max bounds on its reward, for --check")
    parser.add_argument("--check", action="store_true",
                        help="with --pairs: list the lines whose reward is outside their bounds; exit 1 if any")
    parser.add_argument("--gate", choices=GATES, default=DEFAULT.gate,
                        help=f"degeneration gate (default {DEFAULT.gate})")
    parser.add_argument("--table-bonus", choices=TABLE_BONUS, default=DEFAULT.table_bonus,
                        help=f"reading of the table shape bonus (default {DEFAULT.table_bonus}; docs/spec.md §4)")
    parser.add_argument("--think", choices=THINK_MODES, default=DEFAULT.think,
                        help=f"the prediction's closed <think> blocks: removed before scoring or kept (default "
                             f"{DEFAULT.think}; docs/rewards.md)")
    parser.add_argument("--postprocess", choices=POSTPROCESS_MODES, default=DEFAULT.postprocess,
                        help="the prediction before scoring: as given, or formatted as GravityOCR's evaluation "
                             f"formats a region, 'gravityocr' (default {DEFAULT.postprocess}; docs/rewards.md)")
    parser.add_argument("--explain", action="store_true", help="also print the reward's components")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--workers", type=_positive, default=None, help="worker processes for --pairs (default: CPUs)")


def reward_settings(args: argparse.Namespace):
    """The `RewardSettings` of the command line."""
    from .settings import RewardSettings

    return RewardSettings(gate=args.gate, table_bonus=args.table_bonus, think=args.think,
                          postprocess=args.postprocess)


def _positive(text: str) -> int:
    """An argparse type: a worker count, an integer from 1 to the CPUs here (each worker is a process with
    its own interpreter and scorer: more than the CPUs only adds memory)."""
    cpus = os.cpu_count() or 1
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= cpus:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to {cpus} (the CPUs here), got "
                                         f"{text[:40]!r}")
    return value


def read_text_file(path: str, what: str) -> str:
    """The text of the UTF-8 file `path` (a byte-order mark is accepted); a `UserError` naming the file when it
    is missing, binary or not UTF-8, or, for a reference, longer than the reward takes."""
    from .jsonl import BOM, read_bytes
    from .scoring import MAX_REF_CHARS, check_reference

    label = f"{what} file {path}"
    if what == "reference" and Path(path).is_file() and Path(path).stat().st_size > 4 * MAX_REF_CHARS + len(BOM):
        raise UserError(f"{label}: {Path(path).stat().st_size:,} bytes, over the limit of {MAX_REF_CHARS:,} "
                        "characters")  # 4 bytes per character at most: surely too long, so it is not read
    data = read_bytes(path, f"{what} file")
    data = data[len(BOM):] if data.startswith(BOM) else data
    nul = data.find(b"\0")
    if nul >= 0:
        raise UserError(f"{label}: a binary file (NUL byte at offset {nul}); give a UTF-8 text file, or the text "
                        f"itself with --{'pred' if what == 'prediction' else 'ref'}-text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{label}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})") from None
    if what == "reference":
        try:
            check_reference(text)
        except ValueError as err:
            raise UserError(f"{label}: {err}") from None
    return text


def _single_input(args, name: str, what: str) -> str | None:
    """--NAME read from its file, or --NAME-text as given; None when neither is given."""
    path, text = getattr(args, name), getattr(args, f"{name}_text")
    if text is not None and what == "reference":
        from .scoring import check_reference

        try:
            check_reference(text)
        except ValueError as err:
            raise UserError(f"--ref-text: {err}") from None
    return read_text_file(path, what) if path is not None else text


def _components_table(result):
    from rich.table import Table

    table = Table(title=f"components of the {result.task} reward")
    table.add_column("component")
    table.add_column("value", justify="right")
    for name, value in result.components.items():
        table.add_row(name, f"{value:.6f}")
    return table


def _print_summary(results) -> None:
    from .console import print_table

    rows = [[task, str(summary["n"]), f"{summary['mean']:.4f}", f"{summary['min']:.4f}", f"{summary['max']:.4f}",
             ", ".join(f"{name} {value:.3f}" for name, value in summary["components"].items())]
            for task, summary in summarize(results).items()]
    print_table("OCR rewards per task", ["task", "n", "mean", "min", "max", "component means"], rows)


def summarize(results) -> dict[str, dict]:
    """Per task: count, mean/min/max reward and the mean of each component (over results having it)."""
    out = {}
    for task in sorted({r.task for r in results}):
        group = [r for r in results if r.task == task]
        values = [r.value for r in group]
        names = dict.fromkeys(name for r in group for name in r.components)
        components = {}
        for name in names:
            have = [r.components[name] for r in group if name in r.components]
            components[name] = sum(have) / len(have)
        out[task] = {"n": len(group), "mean": sum(values) / len(values), "min": min(values),
                     "max": max(values), "components": components}
    return out


def _case_line(pair, result) -> str:
    """One scored case of a pairs file, as `Failure` prints a failing one: line, task, reward, bounds,
    components."""
    from .regression import Failure

    if pair.bounds is not None and not pair.bounds.holds(result.value):
        return str(Failure(pair.line, pair.task, result.value, pair.bounds, dict(result.components)))
    verdict = f"within {pair.bounds}" if pair.bounds is not None else "(no bounds)"
    parts = ", ".join(f"{name} {value:.6f}" for name, value in result.components.items())
    return f"line {pair.line} ({pair.task}): reward {result.value:.6f} {verdict}; components: {parts}"


def _check_report(failed, checked: int, path, cases=()) -> None:
    """--check: every failing case with its line and components (with --explain: every case), then the
    count."""
    for line in [_case_line(p, r) for p, r in cases] or [str(f) for f in failed]:
        console.print(line, markup=False)
    verdict = f"{len(failed)} of {checked} case(s) outside their bounds" if failed else \
        f"all {checked} case(s) within their bounds"
    console.print(f"{path}: {verdict}", markup=False)


def _run_pairs(args) -> int:
    from rich.progress import Progress

    from .regression import failures, read_pairs
    from .trl_reward import score_many

    pairs = read_pairs(args.pairs)
    checked = sum(p.bounds is not None for p in pairs)
    if args.check and not checked:
        raise UserError(f"{args.pairs}: no line carries expect, min or max; --check has nothing to check")
    with Progress(console=console, transient=True, disable=args.json) as progress:
        bar = progress.add_task("scoring", total=None)
        results = score_many([p.pred for p in pairs], [p.ref for p in pairs], [p.task for p in pairs],
                             reward_settings(args), workers=args.workers,
                             on_progress=lambda done, total: progress.update(bar, completed=done, total=total))
    failed = failures(pairs, results) if args.check else []
    if args.json:
        report = {"summary": summarize(results),
                  "results": [{"line": p.line, **r.as_dict()} for p, r in zip(pairs, results)]}
        if args.check:
            report["check"] = {"checked": checked, "failures": [{"line": f.line, "task": f.task, "value": f.value,
                                                                  "bounds": str(f.bounds),
                                                                  "components": f.components} for f in failed]}
        print(json.dumps(report))
    elif args.check:
        _check_report(failed, checked, args.pairs, list(zip(pairs, results)) if args.explain else ())
    else:
        _print_summary(results)
    return CHECK_FAILED_EXIT if failed else 0


def run_score(args: argparse.Namespace) -> int:
    """`score`: one pair, or --pairs (with --check)."""
    from .trl_reward import score_many

    single = (args.task, args.pred, args.pred_text, args.ref, args.ref_text)
    if args.pairs is not None:
        if any(v is not None for v in single):
            raise UserError("--pairs cannot be combined with --task/--pred/--ref")
        return _run_pairs(args)
    given = args.task is not None and (args.pred, args.pred_text) != (None, None) and \
        (args.ref, args.ref_text) != (None, None)
    if not given or args.check:
        raise UserError("give --task, --pred FILE (or --pred-text TEXT) and --ref FILE (or --ref-text TEXT), "
                        "or --pairs FILE, which --check needs")
    pred, ref = _single_input(args, "pred", "prediction"), _single_input(args, "ref", "reference")
    # through the batch scorer, so one score has the time limit of --pairs and training
    (result,) = score_many([pred], [ref], [args.task], reward_settings(args), workers=1)
    if args.json:
        print(json.dumps(result.as_dict()))
        return 0
    console.print(f"{result.task} reward: {result.value:.6f}", markup=False)
    if args.explain:
        console.print(_components_table(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .settings import DEFAULT

    parser = argparse.ArgumentParser(prog="ocr-rewards", description="Task-aware OCR rewards in [0, 1].")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    score = sub.add_parser("score", help=HELP, description=HELP)
    add_score_arguments(score)
    score.set_defaults(run=run_score)
    check = sub.add_parser("check", help="check a pairs file's bounds: exit 0 when all hold, 1 when any fails",
                           description="Score every line of PAIRS and check its expect / min / max bounds.")
    check.add_argument("pairs", type=Path, metavar="PAIRS", help="a JSONL file of {pred, ref, task, expect|min|max}")
    check.add_argument("--explain", action="store_true",
                       help="list every case with its reward, bounds and components, not only the failures")
    check.add_argument("--json", action="store_true", help="print JSON instead of the failures")
    check.add_argument("--workers", type=_positive, default=None, help="worker processes (default: CPUs)")
    check.set_defaults(run=run_score, check=True, task=None, pred=None, pred_text=None, ref=None,
                       ref_text=None, gate=DEFAULT.gate,
                       table_bonus=DEFAULT.table_bonus, think=DEFAULT.think, postprocess=DEFAULT.postprocess)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return boundary(lambda: args.run(args), args.verbose)


if __name__ == "__main__":
    sys.exit(main())
