"""`gravity-grpo tpf-drift RUN_DIR`: TPF and held-out reward of every saved checkpoint of a GRPO run, and the plot."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Callable

from grpo.evaluation.run_dir import RUN_CONFIG, RunDir

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
    from grpo.training.config import ConfigError, saved_config_problems

    problems = saved_config_problems(run_dir.read_config(), str(run_dir.file(RUN_CONFIG)))
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"the run's config holds values no run accepts ({len(problems)} problem(s)):\n{lines}")


def run_dtype(config: dict):
    """The torch dtype a run trained in, from its `run_config.json` (`bf16`, `fp16`, else fp32)."""
    import torch

    return torch.bfloat16 if config.get("bf16") else torch.float16 if config.get("fp16") else torch.float32


def remeasure_checkpoints(run: RunDir, default: Callable[[str], Any], *, probe_set: str | None = None,
                          probe_size: int | None = None, max_new_tokens: int | None = None,
                          postprocess: str | None = None, include_initial: bool = True,
                          on_checkpoint: Callable[[int, Any], None] = lambda step, source: None) -> list[dict]:
    """TPF and held-out reward of every saved checkpoint of `run` (and of its starting model), as drift records;
    its saved config is checked already (`check_saved_config`).

    The probe settings default to the run's own (its `run_config.json`; a field it lacks at `default(field)`,
    the config's default; `postprocess` names another held-out scoring mode), and so does the dtype: a bf16 run is
    re-measured in bf16, comparable with its live probe. Every prompt is compared with AR greedy, and TPF at
    the run's `temperature` is measured beside greedy. Records carry the training reward of their step from the
    run's metrics, as the live probe's do. Checkpoints are loaded as every command loads them
    (`grpo.checkpoint.load_checkpoint`: LoRA adapters merged into the base their config names) and decoded on
    the GPU when there is one; `on_checkpoint(step, source)` hears of each (`source.describe()`).
    """
    from grpo.checkpoint import is_vlm_checkpoint, load_checkpoint
    from grpo.decoding.tpf import tpf_stats
    from grpo.evaluation.drift import ProbeSettings, drift_records, probe_decode, probe_metrics, probe_settings
    from grpo.hardware import torch_device
    from grpo.errors import quoted
    from grpo.pool import load_pool
    from grpo.yaml_config import ConfigError

    config = run.read_config()
    history = run.read_metrics()  # damaged files are named before any work
    probe_set = probe_set or config.get("probe_set")
    if probe_set is None:
        raise ConfigError(f"{run.path}: no run_config.json to take the probe set from; name the probe set",
                          setting="probe_set")
    try:  # the values `check_saved_config` does not type: the names read back from the run's config
        settings = ProbeSettings.of(lambda name: config.get(name, default(name)))
        size = probe_size or config.get("probe_size", default("probe_size"))
        if not isinstance(probe_set, str):
            raise ConfigError(f"probe_set = {quoted(probe_set)} is not a pool name or path")
        if include_initial and not isinstance(config.get("model", ""), str):
            raise ConfigError(f"model = {quoted(config['model'])} is not a checkpoint name")
    except ConfigError as err:
        raise ConfigError(f"{run.file(RUN_CONFIG)}: {err}") from None
    if max_new_tokens:
        settings = dataclasses.replace(settings, max_new_tokens=max_new_tokens)
    if postprocess:
        settings = dataclasses.replace(settings, postprocess=postprocess)
    points = run.checkpoints()
    if include_initial and config.get("model"):
        points.insert(0, (0, config["model"]))
    if not points:
        raise ConfigError(f"{run.path}: no checkpoint-N folders to measure")
    rows = load_pool(probe_set, images=is_vlm_checkpoint(points[0][1]))
    rows = rows.select(range(min(size, len(rows))))
    # the run's rewards first (a step's reward precedes its probe), then one entry per measured checkpoint
    entries = [{"step": e["step"], "reward": e["reward"]} for e in history if "reward" in e and "step" in e]
    record = None
    for step, folder in points:
        ckpt = load_checkpoint(folder, need_drafter=True, dtype=run_dtype(config))  # LoRA: merged into its base
        on_checkpoint(step, ckpt.source)
        ckpt.model.to(torch_device())
        greedy, sampled = probe_decode(ckpt.model, ckpt.processor, rows, ckpt.bd, settings, step=step,
                                       is_vlm=ckpt.is_vlm, compare_ar=True)
        metrics = probe_metrics(tpf_stats(greedy), sampled=tpf_stats(sampled) if sampled else None)
        entries.append({"step": step, **metrics})
        record = record or probe_settings(settings, ckpt.model, ckpt.processor, ckpt.bd,
                                          sorted({r["task_type"] for r in rows}))
    return drift_records(entries, record)


def run(args: argparse.Namespace) -> int:
    from grpo.console import console
    from grpo.training.config import ConfigError, field_default
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
