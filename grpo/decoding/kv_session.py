"""The cache machinery the three decoders share: one prompt, batch size 1, a DynamicCache, greedy top-1.

Invariant between rounds (docs/spec.md §5): the cache holds the causal states of the prompt and of every committed
output token except the last one, the boundary token `x0`, which the next forward feeds.

Positions: a text model puts token `i` of the sequence at position `i`; GLM-OCR (3D M-RoPE) puts the prompt
at the positions of its rope index and every later token `i` at `i + rope_delta` on all three axes, as
`generate` does.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class DecodeResult:
    """What one decode produced and what it cost (prefill excluded from `forwards`)."""

    tokens: list[int]                                  # committed output ids, stop token included
    forwards: int = 0                                  # draft + verify (or AR steps, or denoise + cache-write)
    rounds: int = 0                                    # self-spec rounds / diffusion blocks / AR steps
    accepted: list[int] = field(default_factory=list)  # drafts committed per verified self-spec round


@functools.lru_cache(maxsize=32)
def window_mask(size: int, dtype: torch.dtype, device: str, boundary: bool = True) -> torch.Tensor:
    """Additive mask (1, 1, size, size) of the draft window `[x0, M×(size-1)]` over itself.

    Row 0 (x0) is causal: it sees none of the masks. Mask rows see the whole window. Without `boundary` the
    window is masks only, all seeing each other (the first round of GravityOCR's layout). The cache columns,
    all visible, are prepended by `Session.forward`.
    """
    mask = torch.zeros(1, 1, size, size, dtype=dtype, device=device)
    if boundary:
        mask[0, 0, 0, 1:] = torch.finfo(dtype).min
    return mask


def stop_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """EOS ids from the generation config and the tokenizer (the ids `generate` stops at)."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for value in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(v) for v in value)
    if not ids:
        raise ValueError("no EOS token: set generation_config.eos_token_id or the tokenizer's eos_token")
    return frozenset(ids)


def truncate(run: list[int], stop_ids: frozenset[int], room: int) -> tuple[list[int], bool]:
    """Cut a newly committed run at its first stop token (kept) or after `room` tokens; return (run, finished)."""
    for i, tok in enumerate(run[:room]):
        if tok in stop_ids:
            return run[: i + 1], True
    return run[:room], len(run) >= room


def base_model(model: Any) -> Any:
    """The transformers model under peft's wrappers (`PeftModel` -> `LoraModel` -> model), else `model`."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def rope_model(model: Any) -> Any:
    """The module holding GLM-OCR's rope index (`get_rope_index`: the inner `model` of the transformers class,
    under peft's wrappers too), or None for a model with 1-D positions."""
    inner = getattr(base_model(model), "model", None)
    return inner if hasattr(inner, "get_rope_index") else None


def prompt_positions(rope: Any, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """The one decision of a GLM-OCR prompt's M-RoPE positions: (3, 1, T) positions of the prompt `inputs`
    (batch of one, with its image inputs) from `rope` (`rope_model`), and the offset every later token `i` adds
    (`i + delta` on all three axes)."""
    positions, delta = rope.get_rope_index(inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                                           image_grid_thw=inputs["image_grid_thw"])
    return positions, int(delta.reshape(-1)[0])


def check_attention(model: Any) -> None:
    """Refuse attention kernels that ignore the decoders' float 4D masks."""
    attention = getattr(model.config, "_attn_implementation", None) or "eager"
    if attention not in ("eager", "sdpa"):
        raise ValueError(f"the decoders pass float 4D attention masks, which need eager or sdpa attention; "
                         f"the model uses {attention!r} (load it with attn_implementation='sdpa')")


class Session:
    """One prompt's KV cache, with position bookkeeping and a forward counter."""

    def __init__(self, model: Any):
        from transformers import DynamicCache

        check_attention(model)
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.device = model.device
        self.dtype = model.get_input_embeddings().weight.dtype
        # a peft wrapper (LoRA) hides the rope index one level down: 1-D positions would decode wrong tokens
        self.rope_model = rope_model(model)
        self.mrope = self.rope_model is not None
        self.rope_delta = 0
        self.forwards = 0

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def prefill(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Run the prompt (with image inputs, if any); return the last position's logits (vocab,)."""
        # batch of one, no padding: the attention mask is all ones; token_type_ids are not model inputs here
        inputs = {k: v.to(self.device) for k, v in inputs.items() if k not in ("attention_mask", "token_type_ids")}
        ids = inputs["input_ids"]
        if ids.shape[0] != 1:
            raise ValueError(f"decoders take one prompt at a time, got a batch of {ids.shape[0]}")
        if self.mrope and "image_grid_thw" in inputs:
            positions, self.rope_delta = prompt_positions(self.rope_model, inputs)
        else:
            positions = self._positions(0, ids.shape[1])
        out = self.model(**inputs, position_ids=positions, past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[0, -1]

    def forward(self, ids: list[int], draft: bool = False, boundary: bool = True) -> torch.Tensor:
        """Feed `ids` after the cache: causal, or as a draft window `[x0, masks]` (`[masks]` without
        `boundary`); return logits (len(ids), vocab)."""
        n, past = len(ids), self.length
        mask = None
        if draft:
            mask = torch.nn.functional.pad(window_mask(n, self.dtype, str(self.device), boundary), (past, 0))
        out = self.model(input_ids=torch.tensor([ids], device=self.device), attention_mask=mask,
                         position_ids=self._positions(past, n), past_key_values=self.cache, use_cache=True)
        self.forwards += 1
        return out.logits[0]

    def crop_to(self, length: int) -> None:
        """Drop cached states beyond the first `length` (DynamicCache.crop takes minus the count to drop)."""
        extra = self.length - length
        if extra < 0:
            raise RuntimeError(f"cache holds {self.length} states, cannot crop to {length}")
        if extra:
            self.cache.crop(-extra)

    def _positions(self, start: int, n: int) -> torch.Tensor:
        pos = torch.arange(start, start + n, device=self.device).unsqueeze(0)  # (1, n)
        if self.mrope:
            return (pos + self.rope_delta).unsqueeze(0).expand(3, 1, n)       # (3 axes, 1, n)
        return pos
