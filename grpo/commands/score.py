"""`gravity-grpo score`: score one prediction, or a JSONL file of pairs, with the OCR rewards."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "score a prediction against its reference (or a JSONL file of pairs) with the OCR rewards"
CHECK_FAILED_EXIT = 1  # --check: some case is outside its bounds (2 stays a user mistake)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rewards import TASKS
    from rewards.gate import GATES
    from rewards.settings import DEFAULT
    from rewards.table import TABLE_BONUS

    parser.add_argument("--task", choices=TASKS, help="reward to apply (with --pred/--ref)")
    parser.add_argument("--pred", metavar="FILE_OR_TEXT", help="the prediction: a file path or the text itself")
    parser.add_argument("--ref", metavar="FILE_OR_TEXT", help="the reference: a file path or the text itself")
    parser.add_argument("--pairs", type=Path, metavar="JSONL",
                        help="score every line {pred, ref, task} of this file and print a summary per task; a line "
                             "may add expect (with tol), min and max bounds on its reward, for --check")
    parser.add_argument("--check", action="store_true",
                        help="with --pairs: list the lines whose reward is outside their bounds; exit 1 if any")
    parser.add_argument("--gate", choices=GATES, default=DEFAULT.gate,
                        help=f"degeneration gate (default {DEFAULT.gate})")
    parser.add_argument("--table-bonus", choices=TABLE_BONUS, default=DEFAULT.table_bonus,
                        help=f"reading of the table shape bonus (default {DEFAULT.table_bonus}; SPEC §4)")
    parser.add_argument("--explain", action="store_true", help="also print the reward's components")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--workers", type=int, default=None, help="worker processes for --pairs (default: CPUs)")


def reward_settings(args: argparse.Namespace):
    """The `RewardSettings` of the command line."""
    from rewards.settings import RewardSettings

    return RewardSettings(gate=args.gate, table_bonus=args.table_bonus)


def file_or_text(value: str) -> str:
    """The content of the file `value` names, or `value` itself when it names no file."""
    try:
        path = Path(value)
        if path.is_file():
            return path.read_text(encoding="utf-8")
    except (OSError, ValueError):  # a long text or one with NUL is not a usable path
        pass
    return value


def _components_table(result):
    from rich.table import Table

    table = Table(title=f"{result.task} reward = {result.value:.6f}")
    table.add_column("component")
    table.add_column("value", justify="right")
    for name, value in result.components.items():
        table.add_row(name, f"{value:.6f}")
    return table


def _summary_table(results):
    from rich.table import Table

    table = Table(title="OCR rewards per task")
    for column in ("task", "n", "mean", "min", "max", "component means"):
        table.add_column(column, justify="left" if column in ("task", "component means") else "right")
    for task, summary in summarize(results).items():
        parts = ", ".join(f"{name} {value:.3f}" for name, value in summary["components"].items())
        table.add_row(task, str(summary["n"]), f"{summary['mean']:.4f}", f"{summary['min']:.4f}",
                      f"{summary['max']:.4f}", parts)
    return table


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


def _check_report(failed, checked: int, path) -> None:
    """--check: every failing case with its line and components, then the count."""
    from grpo.console import console

    for failure in failed:
        console.print(str(failure), markup=False)
    verdict = f"{len(failed)} of {checked} case(s) outside their bounds" if failed else \
        f"all {checked} case(s) within their bounds"
    console.print(f"{path}: {verdict}", markup=False)


def _run_pairs(args) -> int:
    from rich.progress import Progress

    from grpo.console import console
    from grpo.errors import UserError
    from rewards import score_many
    from rewards.regression import failures, read_pairs

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
        _check_report(failed, checked, args.pairs)
    else:
        console.print(_summary_table(results))
    return CHECK_FAILED_EXIT if failed else 0


def run(args: argparse.Namespace) -> int:
    from grpo.console import console
    from grpo.errors import UserError
    from rewards import score

    single = (args.task, args.pred, args.ref)
    if args.pairs is not None:
        if any(v is not None for v in single):
            raise UserError("--pairs cannot be combined with --task/--pred/--ref")
        return _run_pairs(args)
    if any(v is None for v in single) or args.check:
        raise UserError("give --task, --pred and --ref (or --pairs FILE, which --check needs)")
    result = score(file_or_text(args.pred), file_or_text(args.ref), args.task, reward_settings(args))
    if args.json:
        print(json.dumps(result.as_dict()))
    elif args.explain:
        console.print(_components_table(result))
    else:
        console.print(f"{result.task} reward: {result.value:.6f}", markup=False)
    return 0
