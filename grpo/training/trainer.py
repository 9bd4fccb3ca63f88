"""The GRPO trainer: TRL's `GRPOTrainer` with a colocated vLLM engine on GPU or CPU (the run around it, from
config to final model, is `grpo.training.run`).

What this adds to TRL (hooks only, no copied TRL code):
- rollouts as the run's `grpo.rollouts.backend.RolloutBackend` samples them: the engine TRL builds is started with
  its arguments, and every change to TRL's generation is its `install` (self-drafted engines, the CPU weight sync
  `sync_engine_weights`, image prompts, server log-probs); its metrics reach the log through `record_metrics`;
- wall-time accounting of the phases of a step: generation, reward, logprobs (old/reference policy
  forwards), backward (loss forward + backward), drafter (the drafter loss's selection and forward) and the
  TPF probe;
- the optional drafter loss (`drafter_loss_weight`, `grpo.training.drafter_loss`) added in `compute_loss`;
- the null control (`reward_shuffle`, `shuffle_within_groups`): rewards permuted within each group.

Example:
    >>> trainer = grpo.training.run.build_trainer(load_config("configs/tiny_cpu.yaml"))  # doctest: +SKIP
    >>> trainer.train()                                                    # doctest: +SKIP
    >>> trainer.phase_seconds["generation"]                                # doctest: +SKIP
"""
from __future__ import annotations

import copy
import functools
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any

from trl import GRPOTrainer

from grpo.rollouts.backend import RolloutBackend
from grpo.training import drafter_loss as dl
from grpo.training.config import GravityGRPOConfig
from grpo.evaluation.run_dir import RunDir

# Phases of the wall-time split, in the order they are reported.
PHASES = ("generation", "reward", "logprobs", "backward", "drafter", "tpf_probe", "other")


def shuffle_within_groups(rewards: Any, group_size: int, seed: int) -> Any:
    """`rewards` (N, ...) with rows permuted within each consecutive group of `group_size` (the null control):
    each group keeps its rewards, so means and spreads stay, but which completion earned which is random."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    groups = rewards.shape[0] // group_size
    order = torch.argsort(torch.rand(groups, group_size, generator=gen), dim=1)
    index = (order + torch.arange(groups)[:, None] * group_size).flatten().to(rewards.device)
    return rewards[index]


class GravityGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose colocated vLLM engine also works on CPU, and which times its phases.

    `rollouts` is the run's `RolloutBackend`; `block_diffusion` is the checkpoint's `BlockDiffusionConfig` (the
    drafter loss and self-speculative rollouts read it); every saved checkpoint carries the metadata of
    `model_source` (a `ModelSource`, or a folder): `block_diffusion.json` as written, generation config, chat
    template, processor and tokenizer files (`grpo.model_source.copy_metadata`), so each one is again a joint
    checkpoint (docs/spec.md §2).
    """

    def __init__(self, model: Any, reward_funcs: Any = None, args: GravityGRPOConfig | None = None, *,
                 rollouts: RolloutBackend, block_diffusion: Any = None, model_source: Any = None, **kwargs: Any):
        self.rollouts = rollouts
        self.block_diffusion = block_diffusion
        self.model_source = model_source
        processor = kwargs.get("processing_class")
        if processor is not None:
            # TRL left-pads prompt ids itself; per-token image fields (mm_token_type_ids) that it takes from
            # the processor must be padded on the same side (TRL does this only for processors it loads).
            getattr(processor, "tokenizer", processor).padding_side = "left"
        self._raw_seconds: dict[str, float] = defaultdict(float)
        self._next_log: dict[str, float] = {}
        self._entries_written = -1  # log entries in OUTPUT/metrics.jsonl; -1: not written by this process yet
        with rollouts.starting():
            super().__init__(model, reward_funcs, args, **kwargs)
        rollouts.install(self)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kwargs):
        """One generation call, as the rollout backend samples it (`RolloutBackend.generate`)."""
        trl_generate = functools.partial(super()._generate_single_turn, prompt_ids, images, multimodal_fields,
                                         num_generations, **kwargs)
        return self.rollouts.generate(self, trl_generate, prompt_ids)

    def record_metrics(self, metrics: dict[str, float]) -> None:
        """Add one value per metric to this step's log, under the mode (train or eval) the model is in now."""
        mode = "train" if self.model.training else "eval"
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)

    def sync_engine_weights(self) -> None:
        """Push the current policy weights into the colocated vLLM engine (CPU path)."""
        from peft import PeftModel

        from grpo.rollouts.engine import sync_weights

        model = self.accelerator.unwrap_model(self.model)
        with self._gathered_weights(model):
            if isinstance(model, PeftModel):
                # vLLM serves the merged weights; a merged copy leaves the adapters being trained untouched.
                model = copy.deepcopy(model).merge_and_unload()
            sync_weights(self.vllm_generation.llm, model)

    def _gathered_weights(self, model: Any):
        """Whole parameters for the length of the block: under ZeRO-3 each rank holds a shard (an empty
        placeholder tensor per parameter) until they are gathered; a collective, so every rank enters it."""
        from contextlib import nullcontext

        from trl.distributed import DistributedBackend

        if not DistributedBackend(self.accelerator).is_zero3:
            return nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(model.parameters()))

    @contextmanager
    def timed(self, phase: str):
        """Add the wall time of the block to `phase`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._raw_seconds[phase] += time.perf_counter() - start

    # --- timers around TRL's hooks; each only times and delegates ---
    def _generate(self, prompts):
        with self.timed("generation"):
            return super()._generate(prompts)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        with self.timed("reward"):
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.args.reward_shuffle and self.model.training:  # gathered: every process permutes alike
            rewards = shuffle_within_groups(rewards, self.num_generations, self.args.seed * 1_000_003 + self._step)
        return rewards

    def _generate_and_score_completions(self, inputs):
        with self.timed("score"):
            output = super()._generate_and_score_completions(inputs)
        if self.args.drafter_loss_weight > 0 and self.model.training:
            with self.timed("drafter"):
                output.update(dl.keep_for_batch(self, output))
        return output

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.args.drafter_loss_weight > 0 and model.training:  # one loss, one backward (ZeRO-3 steps per call)
            with self.timed("drafter"):
                term = self.args.drafter_loss_weight * dl.trainer_loss(self, model, inputs)
                if self.args.drafter_grad_norms:
                    dl.log_grad_norms(self, model, loss, term)
                loss = loss + term
        return loss

    def training_step(self, model, inputs, num_items_in_batch):
        with self.timed("step"):
            return super().training_step(model, inputs, num_items_in_batch)

    save_root: str | None = None  # where a checkpoint is being written (grpo.training.checkpoints.save_aside)

    def _get_output_dir(self, trial):
        return self.save_root or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        from grpo.training.checkpoints import save_aside

        save_aside(self, lambda: super(GravityGRPOTrainer, self)._save_checkpoint(model, trial))

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            from grpo.model_source import copy_metadata
            from grpo.evaluation.run_dir import settle_modes
            from grpo.training.checkpoints import inside_save

            if self.model_source is not None:
                copy_metadata(self.model_source, output_dir or self.args.output_dir)
            settle_modes(output_dir or self.args.output_dir)
            if self.save_root:
                inside_save(output_dir)

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """No card per checkpoint: TRL's names no source and shows a generic example; `grpo.training.run` writes
        the run's own card (`grpo.evaluation.model_card`) beside the final model."""

    def add_to_next_log(self, metrics: dict[str, float]) -> None:
        """Metrics to report in the next log entry (e.g. a probe run at the end of a step, logged with it)."""
        self._next_log.update(metrics)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        logs.update(self._next_log)
        self._next_log.clear()
        super().log(logs, start_time)
        if not self.state.is_world_process_zero:
            return
        self._entries_written = RunDir(self.args.output_dir).write_metrics(self.state.log_history,
                                                                           self._entries_written)

    def train(self, *args: Any, **kwargs: Any):
        with self.timed("train"):
            return super().train(*args, **kwargs)

    @property
    def phase_seconds(self) -> dict[str, float]:
        """Seconds per phase of `PHASES` (+ `total`): nested timers turned into a split that sums to the total.

        `generation` includes pushing weights into the engine; `logprobs` is scoring minus generation and
        reward (old/reference policy forwards); `drafter` is the drafter loss's selection, batch building and
        forward (its backward shares the one backward call); `backward` is the training step minus scoring and
        drafter; `other` is the rest of `train()` (optimizer step, logging, checkpoints).
        """
        raw = self._raw_seconds
        split = {
            "generation": raw["generation"],
            "reward": raw["reward"],
            "logprobs": raw["score"] - raw["generation"] - raw["reward"],
            "backward": raw["step"] - raw["score"] - raw["drafter"],
            "drafter": raw["drafter"],
            "tpf_probe": raw["tpf_probe"],
        }
        split["other"] = raw["train"] - sum(split.values())
        split["total"] = raw["train"]
        return split
