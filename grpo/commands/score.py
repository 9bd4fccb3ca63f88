"""`gravity-grpo score`: score one prediction, or a JSONL file of pairs, with the OCR rewards."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "score a prediction against its reference (or a JSONL file of pairs) with the OCR rewards"
PAIR_FIELDS = ("pred", "ref", "task")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rewards import TASKS
    from rewards.gate import GATES
    from rewards.table import TABLE_BONUS

    parser.add_argument("--task", choices=TASKS, help="reward to apply (with --pred/--ref)")
    parser.add_argument("--pred", metavar="FILE_OR_TEXT", help="the prediction: a file path or the text itself")
    parser.add_argument("--ref", metavar="FILE_OR_TEXT", help="the reference: a file path or the text itself")
    parser.add_argument("--pairs", type=Path, metavar="JSONL",
                        help="score every line {pred, ref, task} of this file and print a summary per task")
    parser.add_argument("--gate", choices=GATES, default="relative", help="degeneration gate (default relative)")
    parser.add_argument("--table-bonus", choices=TABLE_BONUS, default="clipped",
                        help="reading of the table shape bonus (default clipped; SPEC §4)")
    parser.add_argument("--explain", action="store_true", help="also print the reward's components")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--workers", type=int, default=None, help="worker processes for --pairs (default: CPUs)")


def file_or_text(value: str) -> str:
    """The content of the file `value` names, or `value` itself when it names no file."""
    try:
        path = Path(value)
        if path.is_file():
            return path.read_text(encoding="utf-8")
    except (OSError, ValueError):  # a long text or one with NUL is not a usable path
        pass
    return value


def read_pairs(path: Path) -> list[dict]:
    """The pairs of a JSONL file; a ValueError lists every bad line by number and reason."""
    from rewards import TASKS

    pairs, errors = [], []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                errors.append(f"line {number}: not JSON ({err.msg})")
                continue
            if not isinstance(row, dict):
                errors.append(f"line {number}: not a JSON object")
                continue
            missing = [f for f in PAIR_FIELDS if not isinstance(row.get(f), str)]
            if missing:
                errors.append(f"line {number}: missing or non-string field(s) {', '.join(missing)}")
            elif row["task"] not in TASKS:
                errors.append(f"line {number}: unknown task {row['task']!r} (valid: {', '.join(TASKS)})")
            else:
                pairs.append({"line": number, **{f: row[f] for f in PAIR_FIELDS}})
    if errors:
        raise ValueError(f"{path}: {len(errors)} bad line(s):\n" + "\n".join(errors))
    return pairs


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


def _run_pairs(args, console) -> int:
    from rich.progress import Progress

    from rewards import score_many

    pairs = read_pairs(args.pairs)
    with Progress(console=console, transient=True, disable=args.json) as progress:
        bar = progress.add_task("scoring", total=None)
        results = score_many([p["pred"] for p in pairs], [p["ref"] for p in pairs], [p["task"] for p in pairs],
                             gate=args.gate, table_bonus=args.table_bonus, workers=args.workers,
                             on_progress=lambda done, total: progress.update(bar, completed=done, total=total))
    if args.json:
        print(json.dumps({"summary": summarize(results),
                          "results": [{"line": p["line"], **r.as_dict()} for p, r in zip(pairs, results)]}))
    else:
        console.print(_summary_table(results))
    return 0


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from rewards import score

    console = Console()
    single = (args.task, args.pred, args.ref)
    try:
        if args.pairs is not None:
            if any(v is not None for v in single):
                raise ValueError("--pairs cannot be combined with --task/--pred/--ref")
            return _run_pairs(args, console)
        if any(v is None for v in single):
            raise ValueError("give --task, --pred and --ref (or --pairs FILE)")
        result = score(file_or_text(args.pred), file_or_text(args.ref), args.task, gate=args.gate,
                       table_bonus=args.table_bonus)
    except (ValueError, OSError) as err:
        Console(stderr=True).print(f"[red]error:[/red] {err}", markup=True, highlight=False)
        return 2
    if args.json:
        print(json.dumps(result.as_dict()))
    elif args.explain:
        console.print(_components_table(result))
    else:
        console.print(f"{result.task} reward: {result.value:.6f}", highlight=False)
    return 0
