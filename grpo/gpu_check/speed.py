"""The GPU check's speed table: what an AR decode step and a self-speculative round cost at GLM-OCR's size.

A randomly initialised GLM-OCR language decoder with the published dimensions (`GLM_OCR_TEXT`) in bf16 holds
`CONTEXT` cached tokens per row (random keys and values: the cost of attention depends on their number, not
their values) in the batched decoder's cache (`grpo.decoding.batch_session`). Timed, synchronised, per batch
size N: one AR decode step (a 1-token causal forward of every row, argmax) and one self-speculative round (the
draft forward over `[x0, M x B]` and the verify forward over `[a0, d1..dB]`, B = 32, argmax of each); the cache
keeps its length from one repeat to the next.

Cost model (not a measured speed-up): a rollout of T tokens costs T AR steps, or T / (2 TPF) rounds, since TPF
counts both forwards of a round; at the paper's TPF the self-speculative rollout would be
`2 TPF x t_AR / t_round` times faster, if every row of the batch drafted as well as the paper's average.
"""
from __future__ import annotations

import time

import torch

from grpo.decoding.batch_session import BatchSession, Prefill
from grpo.decoding.presets import PAPER_TPF

BD_SIZE = 32      # the published checkpoint's block
WARMUP = 3        # untimed repeats first: kernel selection, allocator
# GLM-OCR's language decoder as published (text_config of its config.json); the vision encoder runs once per
# prompt, in the prefill, and is not timed here.
GLM_OCR_TEXT = {"vocab_size": 59392, "hidden_size": 1536, "intermediate_size": 4608, "num_hidden_layers": 16,
                "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                "rope_parameters": {"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 10000.0}}
SIZES = {
    # CONTEXT 1024: an image crop's prompt plus part of a long table; 20 repeats of a ~10 ms forward
    "cuda": {"text": GLM_OCR_TEXT, "batches": (1, 8, 32, 64), "context": 1024, "repeats": 20},
    # the rehearsal on 2 CPU cores: the same code at a size that runs in seconds (real vocabulary, 2 layers)
    "cpu": {"text": {**GLM_OCR_TEXT, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                     "rope_parameters": {"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 10000.0}},
            "batches": (1, 8), "context": 128, "repeats": 3},
}


def build_model(text: dict, device: str) -> torch.nn.Module:
    """A random GLM-OCR with language decoder `text` in bf16 on `device` (a minimal vision encoder: unused)."""
    from transformers import GlmOcrConfig, GlmOcrForConditionalGeneration

    config = GlmOcrConfig(text_config=dict(text), vision_config={
        "depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "out_hidden_size": text["hidden_size"]})
    with torch.device(device):
        model = GlmOcrForConditionalGeneration._from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.eval()


def timed(step, repeats: int, device: str) -> float:
    """Seconds per call of `step`, after `WARMUP` calls, the device synchronised before and after."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(WARMUP):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    sync()
    return (time.perf_counter() - start) / repeats


def measure_batch(model: torch.nn.Module, n: int, context: int, repeats: int, device: str) -> dict:
    """One row of the table: AR step and self-speculative round at batch `n`, `context` tokens cached per row."""
    text = model.config.text_config
    shape = (n, text.num_key_value_heads, context, text.head_dim)
    states = [torch.randn(shape, device=device, dtype=torch.bfloat16) for _ in range(2 * text.num_hidden_layers)]
    prefill = Prefill(states[::2], states[1::2], torch.full((n,), context, device=device),
                      torch.zeros(n, dtype=torch.long, device=device), logits=None)
    session = BatchSession(model, capacity=n)
    session.admit(prefill, list(range(n)), list(range(n)))
    del prefill, states
    keep_none = torch.zeros(n, dtype=torch.long, device=device)  # the cache keeps its length between repeats
    token = torch.randint(text.vocab_size, (n, 1), device=device)
    window = torch.randint(text.vocab_size, (n, BD_SIZE + 1), device=device)

    def ar_step() -> None:
        session.forward(token).argmax(-1)
        session.keep(keep_none)

    def spec_round() -> None:
        for draft in (True, False):  # draft [x0, M x B], then verify [a0, d1..dB] in the same slots
            session.forward(window, draft=draft).argmax(-1)
            session.keep(keep_none)

    with torch.inference_mode():
        t_ar, t_round = timed(ar_step, repeats, device), timed(spec_round, repeats, device)
    return {"batch": n, "ar_step_ms": round(1e3 * t_ar, 3), "round_ms": round(1e3 * t_round, 3),
            "round_over_ar_step": round(t_round / t_ar, 2),
            "ar_tokens_per_s": round(n / t_ar, 1),
            "modelled_speedup_at_paper_tpf": round(2 * PAPER_TPF * t_ar / t_round, 2)}


def speed_table(device: str) -> dict:
    """The table's figures on `device` ("cuda": GLM-OCR's size; "cpu": the rehearsal's)."""
    size = SIZES[device]
    model = build_model(size["text"], device)
    rows = []
    for n in size["batches"]:
        rows.append(measure_batch(model, n, size["context"], size["repeats"], device))
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"text_decoder": size["text"], "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": "bfloat16", "context": size["context"], "bd_size": BD_SIZE, "repeats": size["repeats"],
            "paper_tpf": PAPER_TPF, "rows": rows,
            "cost_model": "speed-up = 2 x TPF x t_AR / t_round at the paper's TPF: modelled from measured step "
                          "costs, not a measured rollout speed-up"}
