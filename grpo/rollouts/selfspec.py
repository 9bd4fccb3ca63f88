"""Self-speculative rollouts on TRL's HF generation path (`rollout_decoder: selfspec`, `use_vllm: false`).

TRL's `_generate_single_turn` hands over one prompt per completion (each prompt repeated `num_generations`
times); the batched self-speculative sampler decodes them all at the rollout `temperature` with the policy's
current weights, drafting with its own block-diffusion path. The completions follow the AR sampler's
distribution exactly (`grpo.decoding.batched`), so GRPO sees the same rollouts in distribution as with
`generate`; only the forwards spent on them change, logged as `selfspec/tpf` beside TRL's metrics
(`grpo.rollouts.backend`).
Text policies only: a GLM-OCR policy keeps TRL's `generate` (it also bans image tokens there).
"""
from __future__ import annotations

from typing import Any

import torch

from grpo.decoding.batched import BatchDecoder, Sampler


def rollout_seed(seed: int, step: int, rank: int, call: int) -> int:
    """The sampler seed of one generation call: distinct for each (run seed, step, rank, call number).

    >>> rollout_seed(0, 3, 0, 1) != rollout_seed(0, 3, 0, 2)
    True
    """
    return hash((seed, step, rank, call)) % 2**63


def selfspec_rollouts(trainer: Any, prompt_ids: list[list[int]], call: int) -> tuple[list[list[int]], float | None]:
    """Completion ids (stop token included) for every prompt, sampled self-speculatively by `trainer`'s policy in
    its generation call number `call` (it seeds the sampler), and their tokens per forward (None without tokens)."""
    from trl.models.utils import unwrap_model_for_generation

    from grpo.decoding.tpf import tpf_of

    args, bd = trainer.args, trainer.block_diffusion
    seed = rollout_seed(args.seed, trainer.state.global_step, trainer.accelerator.process_index, call)
    sampler = Sampler(args.temperature, torch.Generator().manual_seed(seed))
    inputs = [{"input_ids": torch.tensor([ids])} for ids in prompt_ids]   # the session moves them
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                     gather_deepspeed3_params=args.ds3_gather_for_generation,
                                     gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs) as model:
        was_training = model.training
        model.eval()
        try:
            decoder = BatchDecoder(model, bd.mask_id, bd.bd_size, trainer.eos_token_ids, args.max_completion_length,
                                   sampler)
            results = decoder.generate(inputs)
        finally:
            model.train(was_training)
    tpf = tpf_of({"tokens": len(r.tokens), "forwards": r.forwards} for r in results)
    return [r.tokens for r in results], tpf
