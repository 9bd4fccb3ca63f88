"""`gravity-grpo tpf-drift RUN_DIR`: TPF of every saved checkpoint of a GRPO run, and the drift plot."""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

HELP = "measure the drafter's TPF on every saved checkpoint of a GRPO run and draw TPF and reward versus step"

OUT_JSONL = "tpf_drift_checkpoints.jsonl"
OUT_PNG = "tpf_drift_checkpoints.png"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="output folder of `gravity-grpo train` (holds checkpoint-N/)")
    parser.add_argument("--probe-set", help="probe prompts (default: the run's probe_set)")
    parser.add_argument("--probe-size", type=int, help="first N probe prompts (default: the run's probe_size)")
    parser.add_argument("--max-new-tokens", type=int, help="output cap per prompt (default: the run's)")
    parser.add_argument("--no-initial", action="store_true", help="skip step 0 (the run's starting checkpoint)")
    parser.add_argument("--out", type=Path, help=f"folder for {OUT_JSONL} and {OUT_PNG} (default: RUN_DIR)")


def checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of the run's `checkpoint-N` folders, by step."""
    found = [(int(m.group(1)), p) for p in run_dir.iterdir()
             if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))]
    return sorted(found)


def load_policy(folder: Path, base: str | None):
    """A checkpoint of the run as a joint checkpoint; LoRA checkpoints are merged into `base`."""
    from grpo.checkpoint import load_checkpoint
    from grpo.errors import UserError

    if not (folder / "adapter_config.json").is_file():
        return load_checkpoint(folder, need_drafter=True)
    if base is None:
        raise UserError(f"{folder} holds LoRA adapters; the base model is unknown (no run_config.json)")
    from peft import PeftModel

    ckpt = load_checkpoint(base, need_drafter=True)
    ckpt.model = PeftModel.from_pretrained(ckpt.model, folder).merge_and_unload().eval()
    return ckpt


def run(args: argparse.Namespace) -> int:
    from data.pool import load_pool
    from grpo.console import console
    from grpo.errors import MissingFileError, UserError
    from grpo.training.plots import plot_drift
    from grpo.decoding.tpf import measure_tpf
    from grpo.training.tpf_probe import drift_records, probe_metrics, reward_points
    from grpo.training.trainer import METRICS_JSONL, RUN_CONFIG

    run_dir = args.run_dir
    if not run_dir.is_dir():
        raise MissingFileError(f"{run_dir}: no such run folder")
    config = json.loads((run_dir / RUN_CONFIG).read_text()) if (run_dir / RUN_CONFIG).is_file() else {}
    probe_set = args.probe_set or config.get("probe_set")
    if probe_set is None:
        raise UserError(f"{run_dir}: no {RUN_CONFIG}; pass --probe-set")
    size = args.probe_size or config.get("probe_size", 24)
    max_new = args.max_new_tokens or config.get("tpf_max_new_tokens", 512)
    points = checkpoints(run_dir)
    if not args.no_initial and config.get("model"):
        points.insert(0, (0, config["model"]))
    if not points:
        raise UserError(f"{run_dir}: no checkpoint-N folders")
    rows = load_pool(probe_set)
    rows = rows.select(range(min(size, len(rows))))

    history = []
    if (run_dir / METRICS_JSONL).is_file():
        history = [json.loads(line) for line in (run_dir / METRICS_JSONL).open() if line.strip()]
    # the run's rewards first (a step's reward precedes its probe), then one entry per measured checkpoint
    probes = [{"step": e["step"], "reward": e["reward"]} for e in history if "reward" in e]
    for step, folder in points:
        ckpt = load_policy(Path(folder), config.get("model"))
        console.print(f"step {step}: {folder}", markup=False)
        stats = measure_tpf(ckpt.model, ckpt.processor, rows, ckpt.bd, is_vlm=ckpt.is_vlm, max_new_tokens=max_new,
                            compare_ar=True)
        probes.append({"step": step, **probe_metrics(stats)})
        console.print(f"  TPF {stats['tpf']:.3f} on {stats['n']} prompts, AR-equal {stats['ar_equal_rate']:.0%}")
    records = drift_records(probes)
    out = args.out or run_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / OUT_JSONL).write_text("".join(json.dumps(r) + "\n" for r in records))
    png = plot_drift(records, out / OUT_PNG, rewards=reward_points(history),
                     title=f"TPF of the saved checkpoints of {run_dir.name}")
    console.print(f"wrote {out / OUT_JSONL} and {png}", markup=False)
    return 0
