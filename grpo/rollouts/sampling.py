"""k rollouts per prompt for mining: from a vLLM engine, or from HF `generate` where vLLM cannot serve the model."""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Protocol

INDEX = "pool_index"   # the prompt id: the row's index in the pool as read


class SamplingSettings(Protocol):
    """What decides a prompt's k rollouts (the mining config has these fields)."""

    num_generations: int
    temperature: float
    max_completion_length: int
    seed: int


class Rollout(NamedTuple):
    text: str
    n_tokens: int     # completion tokens, EOS included
    truncated: bool   # stopped by max_tokens


def _prompt_seed(seed: int, pool_index: int, k: int) -> int:
    """A per-prompt seed (vLLM seeds the k samples seed, seed+1, ...), so a prompt's rollouts do not depend
    on which chunk or run samples it."""
    return seed * 2 ** 32 + pool_index * k


class VllmSampler:
    """k rollouts per row from a vLLM engine (`grpo.rollouts.engine.make_llm`)."""

    def __init__(self, llm, is_vlm: bool):
        self.llm, self.is_vlm = llm, is_vlm

    def sample(self, rows: list[dict], cfg: SamplingSettings) -> list[list[Rollout]]:
        from vllm import SamplingParams

        from grpo.prompting import user_turn

        greedy = cfg.temperature == 0  # vLLM samples greedy requests once (n=1); the k copies are equal
        params = [SamplingParams(n=1 if greedy else cfg.num_generations, temperature=cfg.temperature, top_p=1.0,
                                 max_tokens=cfg.max_completion_length, seed=_prompt_seed(cfg.seed, row[INDEX], cfg.num_generations))
                  for row in rows]
        if self.is_vlm:
            messages = [user_turn(row["prompt"], row["image"], image_part="image_pil") for row in rows]
            outputs = self.llm.chat(messages, params, use_tqdm=False)
        else:
            outputs = self.llm.generate([row["prompt"] for row in rows], params, use_tqdm=False)
        return [[Rollout(o.text, len(o.token_ids), o.finish_reason == "length") for o in out.outputs]
                * (cfg.num_generations if greedy else 1) for out in outputs]


class HfSampler:
    """k rollouts per row with HF `generate` (fallback where vLLM cannot serve the model)."""

    def __init__(self, model: str | Path):
        from grpo.checkpoint import load_checkpoint, tokenizer_of
        from grpo.decoding.kv_session import stop_token_ids

        self.ckpt = load_checkpoint(model)
        self.tok = tokenizer_of(self.ckpt.processor)
        self.stop_ids = stop_token_ids(self.ckpt.model, self.tok)

    def sample(self, rows: list[dict], cfg: SamplingSettings) -> list[list[Rollout]]:
        return [self._sample_one(row, cfg) for row in rows]

    def _sample_one(self, row: dict, cfg: SamplingSettings) -> list[Rollout]:
        import torch
        from transformers import GenerationConfig

        from grpo.prompting import encode_prompt

        inputs = encode_prompt(self.ckpt.processor, row, self.ckpt.is_vlm)
        greedy = cfg.temperature == 0
        # an explicit config: plain temperature sampling as vLLM does, whatever the checkpoint's defaults
        gen = GenerationConfig(max_new_tokens=cfg.max_completion_length, do_sample=not greedy,
                               num_return_sequences=1 if greedy else cfg.num_generations, eos_token_id=sorted(self.stop_ids),
                               pad_token_id=self.tok.pad_token_id if self.tok.pad_token_id is not None
                               else self.tok.eos_token_id,
                               **({} if greedy else {"temperature": cfg.temperature, "top_p": 1.0, "top_k": 0}))
        torch.manual_seed(_prompt_seed(cfg.seed, row[INDEX], cfg.num_generations))
        with torch.no_grad():
            out = self.ckpt.model.generate(**inputs, generation_config=gen)
        rollouts = []
        for seq in out[:, inputs["input_ids"].shape[1]:].tolist():
            stop = next((j for j, t in enumerate(seq) if t in self.stop_ids), None)
            n = len(seq) if stop is None else stop + 1  # EOS counted, as vLLM counts it
            rollouts.append(Rollout(self.tok.decode(seq[:n], skip_special_tokens=True), n, stop is None))
        return rollouts * cfg.num_generations if greedy else rollouts
