"""Direct block-diffusion decoding with a confidence threshold (paper B.1; a diagnostic, no verification).

Each block is B slots after the boundary token `x0`: the window `[x0, M×B]` is denoised in steps, slot j's
token read from the logits at slot j-1 (x0's logits for slot 1). A step reveals every still-masked slot whose
top-1 probability exceeds `tau` (at least the single most confident one); revealed tokens stay fixed. A
finished block gets one causal cache-write forward over `[x0, t1..t(B-1)]`, and `tB` becomes the next
boundary. Forwards counted: denoising steps + cache writes; generation stops after the block holding EOS.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from grpo.decoding.kv_session import DecodeResult, Session, truncate


@torch.inference_mode()
def diffusion_generate(model: Any, inputs: dict[str, torch.Tensor], *, mask_id: int, bd_size: int,
                       stop_ids: Iterable[int], max_new_tokens: int = 512, tau: float = 0.9) -> DecodeResult:
    """Decode one prompt block by block; `rounds` counts blocks."""
    stops = frozenset(stop_ids)
    session = Session(model)
    prompt_len = inputs["input_ids"].shape[1]
    tokens = [int(session.prefill(inputs).argmax())]
    result = DecodeResult(tokens=tokens)
    finished = tokens[0] in stops or max_new_tokens <= 1
    while not finished:
        block = torch.full((bd_size,), mask_id, dtype=torch.long)
        hidden = torch.ones(bd_size, dtype=torch.bool)          # slots still masked
        while hidden.any():
            logits = session.forward([tokens[-1]] + block.tolist(), draft=True)[:bd_size]  # (B, vocab)
            session.crop_to(prompt_len + len(tokens) - 1)       # bidirectional states never stay
            confidence, prediction = logits.float().softmax(-1).max(-1)
            confidence = confidence.cpu().masked_fill(~hidden, -1.0)
            reveal = confidence > tau
            if not reveal.any():
                reveal[confidence.argmax()] = True
            block[reveal] = prediction.cpu()[reveal]
            hidden &= ~reveal
        run, finished = truncate(block.tolist(), stops, max_new_tokens - len(tokens))
        result.rounds += 1
        if not finished:
            session.forward([tokens[-1]] + run[:-1])             # cache write: causal states of x0, t1..t(B-1)
        tokens += run
    result.forwards = session.forwards
    return result
