"""`gravity-grpo train`: GRPO through the causal AR path from a YAML config, with command-line overrides."""
from __future__ import annotations

import argparse

HELP = "GRPO from a joint checkpoint: colocated vLLM rollouts, OCR rewards, periodic TPF probe"



def _fields():
    from grpo.training.config import fields

    return fields()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    import dataclasses

    from grpo.training.config import SHOWN_TRL_FIELDS, GravityModelConfig, GravityGRPOConfig
    from trl import GRPOConfig

    parser.add_argument("--config", help="YAML recipe of config keys: TRL GRPOConfig fields, ours and TRL "
                                         "ModelConfig's LoRA/quantization fields (grpo/training/config.py); "
                                         "'extends: other.yaml' starts from another recipe; a shipped recipe "
                                         "by name: tiny_cpu, gravityocr_grpo, ...")
    trl_only = {f.name for f in dataclasses.fields(GRPOConfig)}
    ours = {f.name for t in (GravityGRPOConfig, GravityModelConfig) for f in dataclasses.fields(t)} - trl_only
    _fields().add_flags(parser, shown=ours | SHOWN_TRL_FIELDS)
    parser.add_argument("--dry-run", action="store_true",
                        help="check config, pool, checkpoint, engine, launcher and hardware, then stop (exit 2 "
                             "listing every problem)")
    parser.add_argument("--num-processes", type=int, default=None, metavar="N",
                        help="with --dry-run: check the batch geometry for N processes on another cluster "
                             "(skips this machine's GPU checks)")
    parser.add_argument("--accelerate-config", default=None, metavar="FILE",
                        help="with --dry-run: the accelerate launch config, a file or a shipped one's name "
                             "(zero3, ...; default: the launcher's own)")
    parser.add_argument("--resume", nargs="?", const=True, default=None, metavar="CHECKPOINT",
                        help="continue from the last checkpoint in the output dir (or from CHECKPOINT): "
                             "weights, optimizer, scheduler, RNG and TPF history")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier run in the output folder (kept aside until the new run is "
                             "complete, then removed: nothing of it is left)")


def overrides(args: argparse.Namespace, problems: list[str] | None = None) -> dict:
    """Config keys set on the command line, typed by their fields: the flags, then every --set KEY=VALUE (with
    `problems`, each bad one is listed there and left out)."""
    return _fields().command_line(args, problems)


def held_out_table(change: dict):
    """Before/after of the held-out greedy reward and TPF, with the paired difference and its 95% interval."""
    from rich.table import Table

    first, last = change["steps"]
    table = Table(title=f"held-out greedy reward and TPF: step {first} -> step {last} (paired over prompts)")
    for column in ("group", "n", "reward before", "reward after", "difference [95% CI]", "TPF before", "TPF after"):
        table.add_column(column, justify="left" if column == "group" else "right")
    for name, c in change.items():
        if name == "steps":
            continue
        table.add_row(name, str(c["n"]), f"{c['before']:.3f}", f"{c['after']:.3f}",
                      f"{c['diff']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]", f"{c['tpf'][0]:.2f}",
                      f"{c['tpf'][1]:.2f}")
    return table


def print_summary(summary: dict) -> None:
    """The run's outcome (main process only): held-out before/after, TPF per probe, wall-time split, files."""
    from rich.table import Table

    from grpo.console import console
    from grpo.training.trainer import PHASES

    if not summary["main_process"]:
        return
    if summary["held_out"] is not None:
        console.print(held_out_table(summary["held_out"]))
    if summary["tpf"]:
        console.print("TPF by step: " + ", ".join(f"{r['step']}: {r['tpf']:.2f}" for r in summary["tpf"]))
    if summary["stopped_at"] is not None:
        console.print(f"[red]stopped at step {summary['stopped_at']}: TPF fell below tpf_floor "
                      "(checkpoint saved)[/red]")
    split = summary["wall_time"]
    table = Table(title=f"wall time of this run ({split['total']:.0f} s)")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for phase in PHASES:
        table.add_row(phase, f"{split[phase]:.1f}", f"{split[phase] / split['total']:.0%}" if split["total"] else "-")
    console.print(table)
    for name, path in summary["files"].items():
        console.print(f"{name}: {path}", markup=False)


def print_preflight(report) -> None:
    """The facts of a dry run, then its notes; problems are raised by the caller."""
    from grpo.console import console

    for label, text in report.facts.items():
        console.print(f"{label}: {text}", markup=False, highlight=False)
    for note in report.notes:
        console.print(f"note: {note}", style="yellow", markup=False, highlight=False)


def dry_run(args: argparse.Namespace) -> int:
    from grpo.console import console
    from grpo.training.preflight import preflight

    problems: list[str] = []
    given = overrides(args, problems)
    report = preflight(args.config, given, num_processes=args.num_processes, accelerate_config=args.accelerate_config,
                       resume=args.resume, overwrite=args.overwrite, problems=problems)
    print_preflight(report)
    report.raise_for_problems()
    console.print("dry run: the run would start", style="green")
    return 0


def run(args: argparse.Namespace) -> int:
    from grpo.training.config import ConfigProblems, load_config
    from grpo.training.preflight import preflight

    if args.dry_run:
        return dry_run(args)
    from grpo.paths import compile_where_possible

    compile_where_possible()  # before the config: building it starts DeepSpeed's process group under a launcher
    problems: list[str] = []
    given = overrides(args, problems)
    try:
        config = load_config(args.config, given, problems)  # every value's problem stops here, before vLLM is imported
    except ConfigProblems:  # refused with every problem the dry run lists, the checks of the world's among them
        preflight(args.config, given, resume=args.resume, overwrite=args.overwrite,
                  problems=problems).raise_for_problems()
        raise
    from grpo.training.run import run_training

    summary = run_training(config, resume=args.resume, overwrite=args.overwrite, recipe=args.config)
    print_summary(summary)
    return 0 if summary["stopped_at"] is None else 3
