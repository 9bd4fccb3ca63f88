"""What a dry run reports: `PreflightReport` (facts, notes, problems, the pools as read) and the facts of a run
from its config alone: the batch geometry (TRL's sampler arithmetic) and the cost of the TPF probe.

Example:
    >>> batch_facts(cfg, num_processes=8, pool_rows=None)["per optimizer step"]      # doctest: +SKIP
    '24 prompts x 28 generations = 672 completions (3 per device x 8 processes x 28 accumulation steps)'
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from grpo.decoding.presets import PAPER_TPF
from grpo.training.config import ConfigProblems


@dataclass
class PreflightReport:
    """What a run would do (`facts`, label -> text, in print order), what is skipped and why (`notes`),
    what stops it from starting (`problems`), and the pools as read (`pools`, by label: training reads
    them from here, so each is loaded once)."""

    facts: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    pools: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_for_problems(self) -> None:
        """One `ConfigProblems` listing every problem (`grpo.training.config.refusal`), as the run refuses."""
        if self.problems:
            raise ConfigProblems(self.problems)


def steps_per_epoch(cfg: Any, num_processes: int, pool_rows: int) -> int:
    """Optimizer steps in one pass over `pool_rows` prompts (TRL's sampler arithmetic)."""
    # TRL's RepeatSampler: whole groups of generation_batch_size / g prompts, each seen num_iterations x
    # steps_per_generation times over micro-batches of per_device x processes completions.
    g = cfg.num_generations
    prompts = cfg.generation_batch_size // g
    samples = (pool_rows // prompts) * prompts * g * cfg.num_iterations * cfg.steps_per_generation
    return samples // (cfg.per_device_train_batch_size * num_processes * cfg.gradient_accumulation_steps)


def batch_facts(cfg: Any, num_processes: int, pool_rows: int | None) -> dict[str, str]:
    """Completions per optimizer step and per generation, steps per epoch (TRL's sampler arithmetic)."""
    g = cfg.num_generations
    per_step = cfg.per_device_train_batch_size * num_processes * cfg.gradient_accumulation_steps
    facts = {"processes": str(num_processes),
             "per optimizer step": f"{per_step // g} prompts x {g} generations = {per_step} completions "
                                   f"({cfg.per_device_train_batch_size} per device x {num_processes} processes "
                                   f"x {cfg.gradient_accumulation_steps} accumulation steps)"}
    if cfg.generation_batch_size != per_step:
        facts["per generation"] = (f"{cfg.generation_batch_size // g} prompts x {g} = {cfg.generation_batch_size} "
                                   f"completions, every {cfg.steps_per_generation} micro-batches")
    if pool_rows is not None:
        steps = steps_per_epoch(cfg, num_processes, pool_rows)
        facts["steps per epoch"] = f"{steps} ({pool_rows} pool rows)"
        if cfg.max_steps > 0:
            facts["epochs"] = f"{cfg.max_steps / max(steps, 1):.2f} for max_steps {cfg.max_steps}"
    return facts


def probe_facts(cfg: Any, num_processes: int, tpf: float = PAPER_TPF) -> dict[str, str]:
    """Forwards per TPF probe, upper bound (every output runs to `tpf_max_new_tokens`) at `tpf` tokens per
    forward: greedy self-spec, sampled self-spec (`tpf_samples` per prompt), and one forward per token of the
    prompts compared with AR greedy (`tpf_compare_ar`); batched forwards decode `tpf_batch_size` rows each."""
    if not cfg.probe_on:
        return {"TPF probe": "off (tpf_every 0)"}
    tokens = cfg.probe_size * cfg.tpf_max_new_tokens
    selfspec = math.ceil(tokens / tpf) * (1 + cfg.tpf_samples)
    first, later = (selfspec + cfg.ar_compared_prompts(step, cfg.probe_size) * cfg.tpf_max_new_tokens
                    for step in (0, cfg.tpf_every))
    probes = cfg.probe_count(cfg.max_steps)
    rows = min(cfg.tpf_batch_size, math.ceil(cfg.probe_size / num_processes))  # a rank's shard fills no more
    batched = math.ceil(later / num_processes / rows)
    return {"TPF probe cost": (f"<= {first:,} batch-1 forwards at step 0 and {later:,} per later probe "
                               f"({cfg.probe_size} prompts x {cfg.tpf_max_new_tokens} tokens / TPF {tpf}, the "
                               f"paper's at B = 32, greedy + {cfg.tpf_samples} sampled = {selfspec:,} self-spec, + "
                               f"one per token where AR greedy is compared: tpf_compare_ar {cfg.tpf_compare_ar}), "
                               f"~{batched:,} batched forwards per rank ({rows} row(s) per forward: tpf_batch_size "
                               f"{cfg.tpf_batch_size}, {cfg.probe_size} prompts over {num_processes}); {probes} probes in {cfg.max_steps} steps")}
