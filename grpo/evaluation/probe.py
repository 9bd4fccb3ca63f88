"""The TPF probe: does the block-diffusion drafter still agree with the AR path, and did the greedy policy
get better, while GRPO trains the shared weights?

At step 0, every `tpf_every` optimizer steps and at the last step, the greedy self-speculative decoder runs on
a fixed probe set with the current weights (LoRA adapters included), `tpf_batch_size` prompts at once, and
its outputs are scored against their targets: the held-out reward is the self-speculative output's. That
output equals AR greedy in exact arithmetic; in bf16 it can differ, and `tpf/ar_equal_rate` says on how many
of the prompts compared (`tpf/ar_compared`) it did not. With `tpf_samples`, the probe also samples at the
rollout `temperature` (exact self-speculative sampling) and logs `tpf/sampled` and `tpf_sampled/<task>`:
what self-speculative rollouts would save, and how RL moves it.
Every process decodes its shard of the probe (rows i, i + W, ...), the
records are gathered, and every process logs the same metrics (`grpo.evaluation.drift.probe_metrics`), so
they live in the trainer's log history and in every checkpoint's `trainer_state.json`; the main process
redraws `tpf_drift.jsonl` / `tpf_drift.png` from that history (so the history survives `--resume`) and
keeps the per-prompt records in `probe_rows.jsonl`.

`tpf_compare_ar` chooses when the probe also decodes AR greedy to check equality (it costs about TPF times
the self-speculative decode): `always`, `first` (step 0 only), `never`, or `sample` (every probe, on the same
`tpf_compare_ar_k` prompts, a seeded sample of the probe set). `tpf_max_new_tokens` is the
per-prompt token budget; outputs that reach it are counted (`tpf/truncated`) and logged.

`tpf_floor` guards the drafter: a TPF below (1 - tpf_floor) x the step-0 TPF logs a warning, or with
`tpf_floor_action: stop` saves a checkpoint and stops training.
"""
from __future__ import annotations

import logging
import random
import time
import traceback
from typing import Any

from transformers import TrainerCallback

from grpo.evaluation.drift import ProbeSettings, drift_records, probe_decode, probe_metrics, probe_settings
from grpo.evaluation.run_dir import RunDir
from ocr_rewards.settings import HELD_OUT, RewardSettings

log = logging.getLogger(__name__)
COMPARE_SEED = 0  # seeds the fixed prompt sample that `tpf_compare_ar: sample` compares


class TpfProbeCallback(TrainerCallback):
    """Measures TPF and held-out greedy reward on `rows` with the trainer's current weights (module docstring)."""

    def __init__(self, trainer: Any, rows: Any, bd: Any, is_vlm: bool = False,
                 reward_settings: RewardSettings = HELD_OUT):
        self.trainer = trainer
        self.reward_settings = reward_settings  # the held-out reading, whatever the run trains on
        self.rows = list(rows)
        self.bd = bd
        self.is_vlm = is_vlm
        self.stopped_at: int | None = None  # step at which tpf_floor stopped training
        self._settings: dict | None = None  # the probe's settings object, in every drift record

    # --- TrainerCallback hooks ---
    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0 and not drift_records(state.log_history):
            self.trainer.log(self._measure(args, state))  # the step-0 baseline, a log entry of its own
        elif state.is_world_process_zero:  # resumed: redraw from the history restored with the checkpoint
            RunDir(args.output_dir).write_drift(drift_records(state.log_history, self.settings()),
                                                tpf_floor=args.tpf_floor)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if args.probe_due(state.global_step, state.max_steps):
            self.trainer.add_to_next_log(self._measure(args, state))
            control.should_log = True  # so the probe is logged with this step's reward
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The probe's log entry is in the history now: redraw, then act on the floor before the trainer
        # decides whether to save (a stop sets should_save, so the checkpoint of this step is written).
        if "tpf/mean" in (logs or {}):
            records = drift_records(state.log_history, self.settings())
            if state.is_world_process_zero:
                RunDir(args.output_dir).write_drift(records, tpf_floor=args.tpf_floor)
            self._check_floor(args, control, records)
        return control

    def settings(self) -> dict:
        """What shapes the probe's figures (`grpo.evaluation.drift.probe_settings`), worked out once."""
        if self._settings is None:
            trainer = self.trainer
            tasks = sorted({row.get("task_type", "unknown") for row in self.rows})
            args = trainer.args
            autocast = "bfloat16" if args.bf16 else "float16" if args.fp16 else None  # accelerate's autocast
            self._settings = probe_settings(ProbeSettings.of(lambda name: getattr(args, name)),
                                            trainer.model, trainer.processing_class, self.bd, tasks, autocast)
        return self._settings

    # --- the probe ---
    def _measure(self, args, state) -> dict[str, float]:
        """Decode this process's shard (weights gathered under ZeRO-3), gather every shard, return the metrics."""
        from accelerate.utils import gather_object
        from trl.models.utils import unwrap_model_for_generation

        from grpo.decoding.tpf import tpf_stats

        trainer = self.trainer
        rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
        compared = self._compared(args, state.global_step)
        start = time.perf_counter()
        records, sampled, error, failure = [], [], None, None
        with trainer.timed("tpf_probe"), unwrap_model_for_generation(
                trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs) as model:
            try:
                records, sampled = probe_decode(model, trainer.processing_class, self.rows[rank::world], self.bd,
                                                ProbeSettings.of(lambda name: getattr(args, name)),
                                                step=state.global_step, is_vlm=self.is_vlm,
                                                compare_ar=compared, indices=range(rank, len(self.rows), world),
                                                reward_settings=self.reward_settings)
            except Exception as err:  # noqa: BLE001 - every rank must reach the gather, or the others hang
                error, failure = f"rank {rank}:\n{traceback.format_exc()}", err
            shards = gather_object([(rank, error, (records, sampled))])
        errors = [e for _, e, _ in shards if e]
        if errors:
            raise RuntimeError(f"TPF probe at step {state.global_step} failed on " + "\n".join(errors)) from failure
        records = [r for _, _, (shard, _) in shards for r in shard]
        stats = tpf_stats(records)
        sampled = [r for _, _, (_, shard) in shards for r in shard]
        ranks = sum(1 for _, _, (shard, _) in shards if shard)
        if state.is_world_process_zero:
            RunDir(args.output_dir).write_probe_rows(state.global_step, _compact(stats["rows"]))
        if stats["truncated"] and state.is_world_process_zero:
            log.warning("TPF probe at step %d: %d of %d outputs reached tpf_max_new_tokens (%d)", state.global_step,
                        stats["truncated"], stats["n"], args.tpf_max_new_tokens)
        metrics = probe_metrics(stats, ranks=ranks, sampled=tpf_stats(sampled) if sampled else None)
        if not state.is_world_process_zero:  # every process holds the same figures; one reports them
            return metrics
        if "tpf/mean" not in metrics:  # no draft/verify forward at all: every output ended at its first token
            log.warning("TPF probe at step %d: no forwards to count (every output was one token)", state.global_step)
        else:
            log.info("TPF probe at step %d: %.3f tokens/forward greedy, %s sampled at T=%g; held-out reward of "
                     "the self-speculative output %.3f on %d prompts over %d process(es); AR-equal %s of %d "
                     "compared (%.1f s)", state.global_step, metrics["tpf/mean"],
                     _fmt(metrics.get("tpf/sampled")), args.temperature, metrics["eval/reward"], stats["n"], ranks,
                     _fmt(metrics.get("tpf/ar_equal_rate"), ".0%"), stats["ar_compared"], time.perf_counter() - start)
        return metrics

    def _compared(self, args, step: int) -> bool | list[int]:
        """What the probe at `step` compares with AR greedy: every prompt, none, or the fixed sample's indices."""
        if args.tpf_compare_ar != "sample":
            return args.compares_ar_at(step)
        k = args.ar_compared_prompts(step, len(self.rows))
        return sorted(random.Random(COMPARE_SEED).sample(range(len(self.rows)), k))

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


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


_ROW_KEYS = ("index", "task", "tokens", "forwards", "rounds", "accepted", "truncated", "ar_equal", "reward", "exact")


def _compact(rows: list[dict]) -> list[dict]:
    """The per-prompt figures worth keeping for every probe (ids and timings left out)."""
    return [{k: r[k] for k in _ROW_KEYS} for r in rows]
