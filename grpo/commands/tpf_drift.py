"""`gravity-grpo tpf-drift RUN_DIR`: TPF and held-out reward of every saved checkpoint of a GRPO run, and the plot."""
from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("re-measure TPF (greedy and sampled) and held-out reward on every saved checkpoint of a GRPO run, in the "
        "run's dtype, and draw them versus step")

OUT_NAME = "tpf_drift_checkpoints"  # OUT/tpf_drift_checkpoints.jsonl and .png
STAMP = "gravity-grpo tpf-drift"  # the marker of an --out folder of its own (grpo.outputs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="output folder of `gravity-grpo train` (holds checkpoint-N/)")
    parser.add_argument("--probe-set", help="probe prompts (default: the run's probe_set)")
    parser.add_argument("--probe-size", type=int, help="first N probe prompts (default: the run's probe_size)")
    parser.add_argument("--max-new-tokens", type=int, help="output cap per prompt (default: the run's)")
    parser.add_argument("--postprocess", choices=("none", "gravityocr"),
                        help="held-out scoring mode (ocr_rewards.postprocess; default: the run's eval_postprocess)")
    parser.add_argument("--no-initial", action="store_true", help="skip step 0 (the run's starting checkpoint)")
    parser.add_argument("--out", type=Path, help=f"folder for {OUT_NAME}.jsonl and .png (default: RUN_DIR)")
    parser.add_argument("--overwrite", action="store_true", help=f"replace the {OUT_NAME} files of an earlier "
                                                                 "tpf-drift run")


def check_out(args: argparse.Namespace, run_dir) -> Path:
    """The folder the drift files go to (`grpo.outputs`): the run folder itself, or a folder of tpf-drift's
    own (inside the run folder or elsewhere), never inside a checkpoint or the run's model, nor a folder
    holding the run; earlier drift files only with --overwrite."""
    from grpo.errors import UserError
    from grpo.outputs import output_folder

    own_run = args.out is None or args.out.resolve() == run_dir.path.resolve()
    if own_run:
        earlier = [p for p in (run_dir.file(f"{OUT_NAME}.jsonl"), run_dir.file(f"{OUT_NAME}.png")) if p.exists()]
        if earlier and not args.overwrite:
            raise UserError(f"{earlier[0]} exists (an earlier tpf-drift output); overwrite it, or choose --out",
                            setting="overwrite")
        return run_dir.path
    model = run_dir.read_config().get("model")
    inputs = [*(folder for _, folder in run_dir.checkpoints()), *([model] if model else [])]
    if run_dir.path.resolve() not in args.out.resolve().parents:  # a folder beside the run may not hold it
        inputs.append(run_dir.path)
    return output_folder(args.out, "--out", kind=f"{OUT_NAME} output", stamp=STAMP, inputs=inputs,
                         overwrite=args.overwrite, within=run_dir.path)


def check_saved_config(run_dir) -> None:
    """The run's saved config holds values a run accepts, by the config's own checks
    (`grpo.training.config.saved_config_problems`); a `ConfigError` lists every problem."""
    from grpo.evaluation.run_dir import RUN_CONFIG
    from grpo.training.config import ConfigError, saved_config_problems

    problems = saved_config_problems(run_dir.read_config(), str(run_dir.file(RUN_CONFIG)))
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"the run's config holds values no run accepts ({len(problems)} problem(s)):\n{lines}")


def run(args: argparse.Namespace) -> int:
    from grpo.console import console
    from grpo.training.config import ConfigError, field_default
    from grpo.evaluation.drift import remeasure_checkpoints
    from grpo.evaluation.run_dir import RunDir
    from grpo.outputs import mark

    from grpo.limits import MAX_NEW_TOKENS, MAX_PROBE_SIZE
    from grpo.paths import check_readable, check_tree_readable

    for flag, value, high in (("--probe-size", args.probe_size, MAX_PROBE_SIZE),
                              ("--max-new-tokens", args.max_new_tokens, MAX_NEW_TOKENS)):
        if value is not None and not 1 <= value <= high:
            raise ConfigError(f"{flag} must be >= 1, got {value}" if value < 1 else
                            f"{flag} must be at most {high:,}, got {value}")
    if not check_readable(args.run_dir, "run folder").is_dir():
        raise ConfigError(f"{args.run_dir}: no such run folder")
    check_tree_readable(args.run_dir, "run folder")
    run_dir = RunDir(args.run_dir)
    check_saved_config(run_dir)
    out = check_out(args, run_dir)
    records = remeasure_checkpoints(
        run_dir, field_default, probe_set=args.probe_set, probe_size=args.probe_size, max_new_tokens=args.max_new_tokens,
        postprocess=args.postprocess, include_initial=not args.no_initial,
        on_checkpoint=lambda step, source: console.print(f"step {step}: {source.describe()}", markup=False))
    for r in records:
        sampled = "-" if r["tpf_sampled"] is None else f"{r['tpf_sampled']:.3f}"
        console.print(f"step {r['step']}: TPF {r['tpf']:.3f} greedy, {sampled} sampled; held-out reward of the "
                      f"self-speculative output {r['eval_reward']:.3f} on {r['n']} prompts, AR-equal "
                      f"{r['ar_equal_rate']:.0%}", markup=False)
    if out != run_dir.path:
        mark(out, STAMP)
    png = RunDir(out).write_drift(records, OUT_NAME,
                                                       title=f"Saved checkpoints of {args.run_dir.name}",
                                                       tpf_floor=run_dir.read_config().get("tpf_floor"))
    console.print(f"wrote {png.with_suffix('.jsonl')} and {png}", markup=False)
    return 0
