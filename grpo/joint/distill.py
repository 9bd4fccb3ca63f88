"""Self-distillation targets for joint training (`targets: greedy`): the start model's own AR greedy outputs
replace the rows' targets, so the drafter learns to predict what the verifier writes and the AR path keeps
writing it. Where a model cannot read its crops (the tiny GLM-OCR, docs/vlm.md), the pool's targets are
unpredictable to both paths; its own greedy outputs are not.
"""
from __future__ import annotations

from typing import Any


def greedy_targets(model: Any, processor: Any, rows: Any, is_vlm: bool, max_tokens: int,
                   batch_size: int = 32) -> list[list[int] | None]:
    """Per row, the model's AR greedy output ids (batched decoding, the prompt as rollouts encode it) without its
    stop token; None where the output reaches `max_tokens` tokens without stopping."""
    from grpo.checkpoint import tokenizer_of
    from grpo.decoding.batched import BatchARDecoder
    from grpo.decoding.kv_session import stop_token_ids
    from grpo.prompting import encode_prompt

    model.eval()
    stops = stop_token_ids(model, tokenizer_of(processor))
    inputs = [encode_prompt(processor, row, is_vlm) for row in rows]
    results = BatchARDecoder(model, stops, max_new_tokens=max_tokens + 1).generate(inputs, batch_size)
    return [r.tokens[:-1] if r.tokens[-1] in stops else None for r in results]
