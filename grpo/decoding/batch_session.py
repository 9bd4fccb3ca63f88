"""A KV cache of N prompts at once, each row with its own length and positions (the batched `Session`).

Layout: rows are left-padded; `valid` (N, L) marks the cache slots each row attends to. Every forward
appends the same window width to every row; `add` prefills new prompts into free rows between rounds
(continuous batching); `keep` then says how many of the new slots each row keeps,
drops finished rows, and packs each row's valid slots to the right again (one gather per layer), so the
cache stays as long as the longest row. Keys carry their rotary position from the time they were written,
so moving them inside the cache changes nothing.

Positions follow `grpo.decoding.kv_session`: a text row's token `i` sits at position `i`; a GLM-OCR row
uses the prompt's 3-D rope index (computed per row, unpadded, as at batch 1) and `i + rope_delta` after it.
"""
from __future__ import annotations

from typing import Any

import torch

from grpo.decoding.kv_session import base_model, check_attention, window_mask

IMAGE_KEYS = ("pixel_values", "image_grid_thw")  # concatenated over rows; everything else is per token


class BatchSession:
    """N rows of KV cache with per-row validity and positions."""

    def __init__(self, model: Any):
        from transformers import DynamicCache

        check_attention(model)
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.device = model.device
        self.dtype = model.get_input_embeddings().weight.dtype
        self.rope_model = getattr(base_model(model), "model", None)
        self.mrope = hasattr(self.rope_model, "get_rope_index")
        self.rows = torch.zeros(0, dtype=torch.long)    # the caller's row number of each cache row
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)
        self.next_pos = torch.zeros(0, dtype=torch.long, device=self.device)   # valid tokens per row
        self.rope_delta = torch.zeros(0, dtype=torch.long, device=self.device)
        self.last_width = 0                              # slots the last forward appended

    def add(self, inputs: list[dict[str, torch.Tensor]], rows: list[int] | None = None) -> torch.Tensor:
        """Prefill new prompts (the caller's row numbers `rows`, default 0, 1, ...) and append them to the
        batch; return their last logits (N, vocab)."""
        new = BatchSession(self.model)
        logits = new._prefill(inputs)
        new.rows = torch.tensor(list(range(len(inputs))) if rows is None else rows, dtype=torch.long)
        if not len(self.rows):
            self.cache, self.valid, self.rows = new.cache, new.valid, new.rows
            self.next_pos, self.rope_delta = new.next_pos, new.rope_delta
        else:
            pad = self.valid.shape[1] - new.valid.shape[1]
            mine, theirs = (max(0, -pad), max(0, pad))   # left padding that brings both to one length
            self.valid = torch.cat([_pad(self.valid, mine, 1), _pad(new.valid, theirs, 1)])
            for layer, other in zip(self.cache.layers, new.cache.layers):
                layer.keys = torch.cat([_pad(layer.keys, mine, 2), _pad(other.keys, theirs, 2)])
                layer.values = torch.cat([_pad(layer.values, mine, 2), _pad(other.values, theirs, 2)])
            self.rows = torch.cat([self.rows, new.rows])
            self.next_pos = torch.cat([self.next_pos, new.next_pos])
            self.rope_delta = torch.cat([self.rope_delta, new.rope_delta])
        self.last_width = 0
        return logits

    def _prefill(self, inputs: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """Run the prompts (each a batch-of-one `encode_prompt` dict) left-padded; return last logits (N, vocab)."""
        lengths = [x["input_ids"].shape[1] for x in inputs]
        n, width = len(inputs), max(lengths)
        ids = torch.zeros(n, width, dtype=torch.long)
        self.valid = torch.zeros(n, width, dtype=torch.bool)
        for i, (x, length) in enumerate(zip(inputs, lengths)):
            ids[i, width - length:] = x["input_ids"][0]
            self.valid[i, width - length:] = True
        self.rows = torch.arange(n)
        self.next_pos = torch.tensor(lengths)
        self.rope_delta = torch.zeros(n, dtype=torch.long)
        extra = {}
        if self.mrope and "image_grid_thw" in inputs[0]:
            positions = torch.zeros(3, n, width, dtype=torch.long)
            for i, (x, length) in enumerate(zip(inputs, lengths)):  # the rope index of each prompt as it is
                pos, delta = self.rope_model.get_rope_index(x["input_ids"], mm_token_type_ids=x["mm_token_type_ids"],
                                                            image_grid_thw=x["image_grid_thw"])
                positions[:, i, width - length:] = pos[:, 0]
                self.rope_delta[i] = int(delta.reshape(-1)[0])
            extra = {k: torch.cat([x[k] for x in inputs]).to(self.device) for k in IMAGE_KEYS}
            types = torch.zeros(n, width, dtype=torch.long)
            for i, (x, length) in enumerate(zip(inputs, lengths)):
                types[i, width - length:] = x["mm_token_type_ids"][0]
            extra["mm_token_type_ids"] = types.to(self.device)
        else:
            positions = (self.valid.long().cumsum(1) - 1).clamp(min=0)
            if self.mrope:
                positions = positions.unsqueeze(0).expand(3, n, width)
        self.valid, self.next_pos = self.valid.to(self.device), self.next_pos.to(self.device)
        self.rope_delta = self.rope_delta.to(self.device)
        causal = torch.tril(torch.ones(width, width, dtype=torch.bool, device=self.device))
        allowed = causal.unsqueeze(0) & self.valid.unsqueeze(1)                       # (n, q, k)
        out = self.model(input_ids=ids.to(self.device), attention_mask=self._additive(allowed),
                         position_ids=positions.to(self.device), past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1, **extra)
        return out.logits[:, -1]

    def forward(self, ids: torch.Tensor, draft: bool = False) -> torch.Tensor:
        """Feed `ids` (N, w) after each row's cache: causal, or as draft windows `[x0, masks]`; logits (N, w, vocab)."""
        n, w = ids.shape
        if draft:
            window = window_mask(w, self.dtype, str(self.device))[0, 0] == 0
        else:
            window = torch.tril(torch.ones(w, w, dtype=torch.bool, device=self.device))
        allowed = torch.cat([self.valid.unsqueeze(1).expand(n, w, -1), window.unsqueeze(0).expand(n, w, w)], dim=2)
        positions = self.next_pos.unsqueeze(1) + torch.arange(w, device=self.device)   # (n, w)
        if self.mrope:
            positions = (positions + self.rope_delta.unsqueeze(1)).unsqueeze(0).expand(3, n, w)
        out = self.model(input_ids=ids.to(self.device), attention_mask=self._additive(allowed),
                         position_ids=positions, past_key_values=self.cache, use_cache=True)
        self.valid = torch.cat([self.valid, torch.zeros(n, w, dtype=torch.bool, device=self.device)], dim=1)
        self.last_width = w
        return out.logits

    def keep(self, counts: torch.Tensor, alive: torch.Tensor | None = None) -> None:
        """Keep the first `counts[r]` slots of the last window in row r, then only the rows where `alive`."""
        w = self.last_width
        counts = counts.to(self.device)
        if w:
            self.valid[:, -w:] = torch.arange(w, device=self.device) < counts.unsqueeze(1)
        self.next_pos = self.next_pos + counts
        if alive is not None and not bool(alive.all()):
            alive = alive.to(self.device)
            self.rows, counts = self.rows[alive.cpu()], counts[alive]
            self.valid, self.next_pos, self.rope_delta = self.valid[alive], self.next_pos[alive], self.rope_delta[alive]
            self._apply(lambda t: t[alive])
        if not len(counts):
            return
        if bool((counts == counts[0]).all()):   # no holes: cut the dropped tail and the padding no row needs
            start = int(self.valid.any(0).long().argmax())
            end = self.valid.shape[1] - (w - int(counts[0]))
            self.valid = self.valid[:, start:end]
            self._apply(lambda t: t[:, :, start:end])
        else:
            self._pack()

    def _pack(self) -> None:
        """Move each row's valid slots to the right end and cut the cache to the longest row (one gather)."""
        width = self.valid.shape[1]
        length = int(self.valid.sum(1).max())
        slots = torch.arange(width, device=self.device).expand_as(self.valid)
        order = torch.where(self.valid, slots, -1).sort(dim=1).values[:, width - length:]
        self.valid = order >= 0
        index = order.clamp(min=0)[:, None, :, None]
        self._apply(lambda t: t.gather(2, index.expand(-1, t.shape[1], -1, t.shape[3])))

    def _apply(self, fn) -> None:
        """Replace every layer's keys and values (batch, heads, slots, dim) by `fn` of them."""
        for layer in self.cache.layers:
            layer.keys, layer.values = fn(layer.keys), fn(layer.values)

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """Boolean (n, q, k) -> the float additive mask (n, 1, q, k) the models take."""
        return torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill(
            ~allowed, torch.finfo(self.dtype).min).unsqueeze(1)


def _pad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """`t` with `n` zero (invalid) slots prepended along `dim`."""
    if not n:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)
