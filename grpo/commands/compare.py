"""`gravity-grpo compare`: a multi-seed A/B of GRPO recipes, paired on a probe set (`grpo.compare`)."""
from __future__ import annotations

import argparse

HELP = "multi-seed A/B of GRPO recipes: arms x seeds, final checkpoints paired on a probe set (resumable)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from grpo.compare import DEFAULT_PROBE

    parser.add_argument("--arm", dest="arms", action="append", nargs="+", required=True,
                        metavar="NAME CONFIG [KEY=VALUE ...]",
                        help="one recipe: a name, a GRPO config file and config overrides; repeatable, at least "
                             "two; the first is the reference")
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="training seeds (each arm runs each)")
    parser.add_argument("--out", required=True, help="folder of the runs and the report (resumable)")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for every arm (e.g. --set tpf_every=0); repeatable")
    parser.add_argument("--probe-set", default=None,
                        help="prompts the final checkpoints are evaluated on (a pool; tiny-probe@SEED: a fresh "
                             "synthetic probe; default: the reference arm's probe_set). On another probe than "
                             "the default, a finished comparison is only re-evaluated, into files named after "
                             "the probe")
    parser.add_argument("--probe-size", type=int, default=None,
                        help="first N prompts of the probe set (default: the reference arm's probe_size)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="output cap per probe prompt (default: the reference arm's tpf_max_new_tokens)")
    parser.add_argument("--postprocess", choices=("none", "gravityocr"), default=DEFAULT_PROBE["postprocess"],
                        help="scoring mode of the held-out reward (ocr_rewards.postprocess); another than 'none' "
                             "re-evaluates a finished comparison into files named after it")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: report the seeds every arm has finished (while a comparison runs)")


def _pairs(assignments: list[str], where: str) -> dict:
    from grpo.errors import UserError, quoted
    from grpo.yaml_config import assignment

    values = {}
    for text in assignments:
        key, value = assignment(text, where)
        if key in values:
            raise UserError(f"{where}: key {quoted(key)} is set twice; give each key once")
        values[key] = value
    return values


def _table(report: dict):
    from rich.table import Table

    table = Table(title=f"compare: arms vs {report['reference']} (paired, 95% bootstrap over seeds and prompts)")
    for column in ("arm", "seeds", "held-out reward change vs start", "TPF ratio vs reference", "TPF wins",
                   "reward diff vs reference", "AR-equal"):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for name, entry in report["arms"].items():
        start = entry["vs_start"]
        pair = entry.get("vs_reference")
        lo, hi = start["reward_diff_interval"]
        cells = [name, str(len(entry["seeds"])), f"{start['reward_diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]"]
        if pair:
            (rl, rh), (dl, dh) = pair["tpf_ratio_interval"], pair["reward_diff_interval"]
            cells += [f"{pair['tpf_ratio']:.3f} [{rl:.3f}, {rh:.3f}]", f"{pair['tpf_wins']}/{len(pair['seeds'])}",
                      f"{pair['reward_diff']:+.3f} [{dl:+.3f}, {dh:+.3f}]"]
        else:
            cells += ["-", "-", "-"]
        table.add_row(*cells, f"{entry['ar_equal_rate']:.1%}")
    return table


def _groups_table(report: dict):
    """Per group of probe prompts (all, each task, each task by its crop's lines): the start's mean reward and
    each arm's change from it."""
    from rich.table import Table

    table = Table(title="held-out reward by task and lines: start, and each arm's change (95%)")
    for column in ("group", "prompts", "start", *report["arms"]):
        table.add_column(column, justify="left" if column == "group" else "right")
    arms = list(report["arms"].values())
    for name, first in arms[0]["by_group"].items():
        cells = [name, str(first["prompts"]), f"{first['start']:.3f}"]
        for entry in arms:
            group = entry["by_group"][name]
            lo, hi = group["interval"]
            cells.append(f"{group['change']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        table.add_row(*cells)
    return table


def _errors_table(report: dict):
    """Per arm and error kind: probe decision points greedy gets wrong at the start and after (pooled over
    seeds), McNemar's p, and the outputs with more units than their target."""
    from rich.table import Table

    table = Table(title="decision points wrong, start -> after (pooled over seeds; McNemar exact p)")
    for column in ("arm", "kind", "points", "wrong start", "wrong after", "fixed", "broken", "p"):
        table.add_column(column, justify="left" if column in ("arm", "kind") else "right")
    for name, entry in report["arms"].items():
        errors = entry["errors"]
        if not errors:
            continue
        for kind, m in errors["kinds"].items():
            table.add_row(name, kind, str(m["n"]), str(m["wrong_before"]), str(m["wrong_after"]), str(m["fixed"]),
                          str(m["broken"]), f"{m['p']:.2g}")
        after = sum(errors["over_generated_after"].values())
        table.add_row(name, "over-generated outputs", str(errors["prompts"] * errors["seeds"]),
                      str(errors["over_generated_start"] * errors["seeds"]), str(after), "", "", "")
    return table


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from grpo.console import console
    from grpo.errors import UserError
    from grpo.compare import DEFAULT_PROBE, REPORT_FILE, STAMP, Arm, probe_named, run_comparison
    from grpo.outputs import output_folder
    from grpo.training.config import load_config
    from grpo.limits import MAX_SEED

    from grpo.limits import MAX_NEW_TOKENS, MAX_PROBE_SIZE
    from grpo.paths import check_name, check_readable

    for flag, value, high in (("--probe-size", args.probe_size, MAX_PROBE_SIZE),
                              ("--max-new-tokens", args.max_new_tokens, MAX_NEW_TOKENS)):
        if value is not None and not 1 <= value <= high:
            raise UserError(f"{flag} must be >= 1, got {value}" if value < 1 else
                            f"{flag} must be at most {high:,}, got {value}")
    arms = []
    for spec in args.arms:
        if len(spec) < 2:
            raise UserError(f"--arm needs NAME CONFIG [KEY=VALUE ...], got {' '.join(spec)!r}")
        check_name(spec[0], "--arm name")
        if not check_readable(spec[1], f"--arm {spec[0]}: config file").is_file():
            raise UserError(f"--arm {spec[0]}: no config file {spec[1]}")
        arms.append(Arm(spec[0], spec[1], _pairs(spec[2:], f"--arm {spec[0]}")))
    if len(arms) < 2 or len({a.name for a in arms}) != len(arms):
        raise UserError("compare needs at least two --arm with distinct names")
    bad_seeds = [s for s in args.seeds if not 0 <= s <= MAX_SEED]
    if bad_seeds or len(set(args.seeds)) != len(args.seeds):
        raise UserError(f"--seeds must be distinct integers in [0, {MAX_SEED}], got {args.seeds}")
    common = _pairs(args.assignments, "--set")
    from grpo.pool import load_pool

    configs = []
    for arm in arms:  # every recipe builds, and its pool reads, before anything is written (the runs check the rest)
        config = load_config(arm.config, {**common, **arm.overrides})
        configs.append(config)
        try:
            load_pool(config.pool, skip_bad=config.skip_bad)
        except UserError as err:
            raise UserError(f"--arm {arm.name}: {err}") from None
    reference = configs[0]  # the probe the reference recipe's own runs are probed on, unless the flags say otherwise
    probe = {"probe_set": args.probe_set or reference.probe_set or DEFAULT_PROBE["probe_set"],
             "probe_size": args.probe_size or reference.probe_size,
             "max_new_tokens": args.max_new_tokens or reference.tpf_max_new_tokens, "postprocess": args.postprocess}
    load_pool(probe["probe_set"])
    output_folder(args.out, "--out", kind="comparison", stamp=STAMP, inputs=[a.config for a in arms],
                  overwrite=None)
    try:
        report = run_comparison(arms, args.seeds, args.out, common=common, probe=probe,
                                report_only=args.report_only, log=lambda text: console.print(text, markup=False))
    except ValueError as err:  # unpaired or unfinished runs
        raise UserError(f"{args.out}: {err}") from err
    console.print(_table(report))
    if any(entry["errors"] for entry in report["arms"].values()):  # only on a built-in synthetic probe set
        console.print(_groups_table(report))
        console.print(_errors_table(report))
    console.print(f"wrote {Path(args.out) / probe_named(REPORT_FILE, report['probe'])}", markup=False)
    return 0
