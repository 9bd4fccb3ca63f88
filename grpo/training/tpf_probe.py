"""The TPF probe: how well the block-diffusion drafter still agrees with the AR path while GRPO trains it.

At step 0, every `tpf_every` optimizer steps and at the last step, the self-speculative decoder runs on a
fixed probe set with the current weights (LoRA adapters included). Each probe is logged (`tpf/mean`,
`tpf/<task>`, `tpf/accepted_per_round`, `tpf/ar_equal_rate`), so it lives in the trainer's log history and
in every checkpoint's `trainer_state.json`; `OUTPUT/tpf_drift.jsonl` and `OUTPUT/tpf_drift.png` are redrawn
from that history, which is why the TPF history survives `--resume`.

`tpf_floor` guards the drafter: a TPF below (1 - tpf_floor) x the step-0 TPF logs a warning, or with
`tpf_floor_action: stop` saves a checkpoint and stops training.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger(__name__)

DRIFT_JSONL = "tpf_drift.jsonl"
DRIFT_PNG = "tpf_drift.png"
# Logged probe keys that are not per-task TPF.
_SUMMARY_KEYS = ("tpf/mean", "tpf/accepted_per_round", "tpf/ar_equal_rate")


def probe_metrics(stats: dict) -> dict[str, float]:
    """The logged `tpf/*` metrics of one `grpo.decoding.tpf.measure_tpf` result (None values left out)."""
    metrics = {"tpf/mean": stats["tpf"], "tpf/accepted_per_round": stats["accepted_per_round"],
               "tpf/ar_equal_rate": stats["ar_equal_rate"]}
    metrics.update({f"tpf/{task}": s["tpf"] for task, s in stats["by_task"].items()})
    return {k: float(v) for k, v in metrics.items() if v is not None}


def drift_records(log_history: list[dict]) -> list[dict]:
    """One record per probe in a trainer log history, with the mean reward of the last logged step.

    Keys: `step`, `tpf`, `accepted_per_round`, `ar_equal_rate`, `tpf_by_task`, `reward` (None before the
    first reward).
    """
    records, reward = [], None
    for entry in sorted(log_history, key=lambda e: e.get("step", 0)):  # stable: a step's reward log comes first
        if "reward" in entry:
            reward = entry["reward"]
        if "tpf/mean" in entry:
            records.append({
                "step": entry["step"], "tpf": entry["tpf/mean"],
                "accepted_per_round": entry.get("tpf/accepted_per_round"),
                "ar_equal_rate": entry.get("tpf/ar_equal_rate"),
                "tpf_by_task": {k.removeprefix("tpf/"): v for k, v in entry.items()
                                if k.startswith("tpf/") and k not in _SUMMARY_KEYS},
                "reward": reward})
    return records


def reward_points(log_history: list[dict], key: str = "reward") -> list[tuple[int, float]]:
    """(step, value) of every log entry holding `key`."""
    return [(e["step"], e[key]) for e in log_history if e.get(key) is not None]


def write_drift(records: list[dict], log_history: list[dict], output_dir: str | Path) -> Path:
    """Rewrite `tpf_drift.jsonl` from `records` and redraw `tpf_drift.png`; return the PNG path."""
    from grpo.training.plots import plot_drift

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = output_dir / (DRIFT_JSONL + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(output_dir / DRIFT_JSONL)
    return plot_drift(records, output_dir / DRIFT_PNG, rewards=reward_points(log_history))


class TpfProbeCallback(TrainerCallback):
    """Measures TPF on `rows` with the trainer's current weights; see the module docstring."""

    def __init__(self, trainer: Any, rows: Any, bd: Any, is_vlm: bool = False):
        self.trainer = trainer
        self.rows = list(rows)
        self.bd = bd
        self.is_vlm = is_vlm
        self.stopped_at: int | None = None  # step at which tpf_floor stopped training

    # --- TrainerCallback hooks ---
    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0 and not drift_records(state.log_history):
            self.trainer.log(self._measure(args))  # the step-0 baseline, a log entry of its own
        elif state.is_world_process_zero:  # resumed: redraw from the history restored with the checkpoint
            write_drift(drift_records(state.log_history), state.log_history, args.output_dir)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.tpf_every == 0 or state.global_step >= state.max_steps:
            self.trainer.add_to_next_log(self._measure(args))
            control.should_log = True  # so the probe is logged with this step's reward
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The probe's log entry is in the history now: redraw, then act on the floor before the trainer
        # decides whether to save (a stop sets should_save, so the checkpoint of this step is written).
        if "tpf/mean" in (logs or {}):
            records = drift_records(state.log_history)
            if state.is_world_process_zero:
                write_drift(records, state.log_history, args.output_dir)
            self._check_floor(args, control, records)
        return control

    # --- the probe ---
    def _measure(self, args) -> dict[str, float]:
        """Run the decoder on the main process (weights gathered under ZeRO-3); every rank gets the metrics."""
        from accelerate.utils import broadcast_object_list
        from trl.models.utils import unwrap_model_for_generation

        from grpo.decoding.tpf import measure_tpf

        trainer = self.trainer
        start = time.perf_counter()
        metrics = None
        with trainer.timed("tpf_probe"), unwrap_model_for_generation(
                trainer.model_wrapped, trainer.accelerator,
                gather_deepspeed3_params=args.ds3_gather_for_generation) as model:
            if trainer.accelerator.is_main_process:
                stats = measure_tpf(model, trainer.processing_class, self.rows, self.bd, is_vlm=self.is_vlm,
                                    max_new_tokens=args.tpf_max_new_tokens, compare_ar=args.tpf_compare_ar,
                                    progress=False)
                metrics = probe_metrics(stats)
        [metrics] = broadcast_object_list([metrics])
        if "tpf/mean" not in metrics:  # no draft/verify forward at all: every output ended at its first token
            log.warning("TPF probe at step %d: no forwards to count (every output was one token)",
                        trainer.state.global_step)
        else:
            log.info("TPF probe at step %d: %.3f tokens/forward on %d prompts (%.1f s)", trainer.state.global_step,
                     metrics["tpf/mean"], len(self.rows), time.perf_counter() - start)
        return metrics

    def _check_floor(self, args, control, records: list[dict]) -> None:
        if args.tpf_floor is None or len(records) < 2:
            return
        baseline, current = records[0], records[-1]
        limit = (1 - args.tpf_floor) * baseline["tpf"]
        if current["tpf"] >= limit:
            return
        message = (f"TPF {current['tpf']:.3f} at step {current['step']} is below the floor {limit:.3f} "
                   f"({1 - args.tpf_floor:.0%} of the step-{baseline['step']} TPF {baseline['tpf']:.3f})")
        if args.tpf_floor_action == "stop":
            log.error("%s: saving a checkpoint and stopping", message)
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = current["step"]
        else:
            log.warning(message)
