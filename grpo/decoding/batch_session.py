"""A KV cache of N prompts at once, each row with its own length and positions (the batched `Session`).

Layout: every layer keeps its keys and values in one buffer (rows, heads, slots, dim) allocated ahead. Row r
holds its `next_pos[r]` valid states in slots 0 .. next_pos[r]-1; a forward writes each row's new window at
that row's own next slots, so nothing already cached is ever copied, and attends to the first
`max(next_pos) + w` slots with a mask that hides each row's stale slots. `keep` then says how many of the new
slots each row keeps (its length grows by that much; the slots after it are rewritten later) and drops
finished rows, moving rows from the end of the batch into their places. Prompts are prefilled in groups
(`prefill`, left-padded, one forward) and copied into free rows between rounds (`admit`): continuous batching.
Keys carry their rotary position from the time they were written, so where a state sits in the buffer changes
nothing.

Positions follow `grpo.decoding.kv_session`: a text row's token `i` sits at position `i`; a GLM-OCR row
uses the prompt's 3-D rope index (computed per row, unpadded, as at batch 1) and `i + rope_delta` after it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from grpo.decoding.kv_session import check_attention, prompt_positions, rope_model
from grpo.prompting import IMAGE_INPUTS



@dataclass
class Prefill:
    """Prompts run through the model together, left-padded, waiting for rows of a `BatchSession`."""

    keys: list[torch.Tensor]      # per layer (m, heads, width, dim)
    values: list[torch.Tensor]
    lengths: torch.Tensor         # (m,) prompt lengths, on the device
    rope_delta: torch.Tensor      # (m,)
    logits: torch.Tensor          # (m, vocab) at each prompt's last token


class _SlotLayer(DynamicLayer):
    """One layer's buffer; `update` writes the new states where `cache.index` says, in the buffer seen as
    (rows × heads × slots, dim)."""

    def __init__(self, cache: "_SlotCache"):
        super().__init__()
        self.cache = cache

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n, dim, span = key_states.shape[0], key_states.shape[3], self.cache.span
        # under bf16 autocast keys leave the rotary embedding in fp32 and values in bf16: each buffer keeps its own
        self.keys.view(-1, dim).index_copy_(0, self.cache.index, key_states.reshape(-1, dim).to(self.keys.dtype))
        self.values.view(-1, dim).index_copy_(0, self.cache.index, value_states.reshape(-1, dim).to(self.values.dtype))
        return self.keys[:n, :, :span], self.values[:n, :, :span]

    def get_seq_length(self) -> int:
        return self.cache.span


class _SlotCache(Cache):
    """The transformers `Cache` the decode forwards see: `index` (n × heads × w,) is the flat buffer place of
    each new state and `span` the slots attended to, both set by `BatchSession.forward`."""

    def __init__(self, n_layers: int):
        super().__init__(layers=[_SlotLayer(self) for _ in range(n_layers)])
        self.index = torch.zeros(0, dtype=torch.long)
        self.span = 0


class BatchSession:
    """Up to `capacity` rows of KV cache with per-row lengths and positions."""

    def __init__(self, model: Any, capacity: int):
        check_attention(model)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.model = model
        self.capacity = capacity
        self.device = model.device
        self.dtype = model.get_input_embeddings().weight.dtype
        self.rope_model = rope_model(model)
        self.mrope = self.rope_model is not None
        self.cache: _SlotCache | None = None            # allocated at the first `admit`
        self.rows = torch.zeros(0, dtype=torch.long)    # the caller's row number of each cache row
        self.next_pos = torch.zeros(0, dtype=torch.long, device=self.device)   # valid states per row
        self.rope_delta = torch.zeros(0, dtype=torch.long, device=self.device)
        self.last_width = 0                              # slots the last forward appended

    @property
    def length(self) -> int:
        """Slots in use by the longest row."""
        return int(self.next_pos.max()) if len(self.rows) else 0

    def prefill(self, inputs: list[dict[str, torch.Tensor]]) -> Prefill:
        """Run the prompts (each a batch-of-one `encode_prompt` dict) left-padded, in one forward."""
        lengths = [x["input_ids"].shape[1] for x in inputs]
        n, width = len(inputs), max(lengths)
        ids = torch.zeros(n, width, dtype=torch.long)
        valid = torch.zeros(n, width, dtype=torch.bool)
        for i, (x, length) in enumerate(zip(inputs, lengths)):
            ids[i, width - length:] = x["input_ids"][0]
            valid[i, width - length:] = True
        rope_delta = torch.zeros(n, dtype=torch.long)
        extra = {}
        if self.mrope and "image_grid_thw" in inputs[0]:
            positions = torch.zeros(3, n, width, dtype=torch.long)
            types = torch.zeros(n, width, dtype=torch.long)
            for i, (x, length) in enumerate(zip(inputs, lengths)):  # the rope index of each prompt as it is
                pos, rope_delta[i] = prompt_positions(self.rope_model, x)
                positions[:, i, width - length:] = pos[:, 0]
                types[i, width - length:] = x["mm_token_type_ids"][0]
            extra = {k: torch.cat([x[k] for x in inputs]).to(self.device) for k in IMAGE_INPUTS}
            extra["mm_token_type_ids"] = types.to(self.device)
        else:
            positions = (valid.long().cumsum(1) - 1).clamp(min=0)
            if self.mrope:
                positions = positions.unsqueeze(0).expand(3, n, width)
        valid = valid.to(self.device)
        causal = torch.tril(torch.ones(width, width, dtype=torch.bool, device=self.device))
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids.to(self.device), attention_mask=self._additive(causal & valid.unsqueeze(1)),
                         position_ids=positions.to(self.device), past_key_values=cache, use_cache=True,
                         logits_to_keep=1, **extra)
        return Prefill([layer.keys for layer in cache.layers], [layer.values for layer in cache.layers],
                       torch.tensor(lengths, device=self.device), rope_delta.to(self.device), out.logits[:, -1])

    def admit(self, prefill: Prefill, which: list[int], rows: list[int]) -> None:
        """Append prompts `which` of `prefill` as new rows (the caller's row numbers `rows`), their states
        moved to slots 0 .. length-1."""
        n, k = len(self.rows), len(which)
        if n + k > self.capacity:
            raise ValueError(f"{n} rows and {k} more exceed the capacity {self.capacity}")
        pick = torch.tensor(which, device=self.device)
        lengths, width = prefill.lengths[pick], prefill.keys[0].shape[2]
        if self.cache is None:
            self.cache = _SlotCache(len(prefill.keys))
            for layer, keys, values in zip(self.cache.layers, prefill.keys, prefill.values):
                shape = (self.capacity, keys.shape[1], width + 64, keys.shape[3])
                layer.keys = keys.new_zeros(shape)        # zeros: stale slots must stay finite
                layer.values = values.new_zeros(shape)
        self._reserve(width)
        start = (width - lengths).unsqueeze(1) + torch.arange(width, device=self.device)   # (k, width)
        index = start.clamp(max=width - 1)[:, None, :, None]
        for layer, keys, values in zip(self.cache.layers, prefill.keys, prefill.values):
            index_ = index.expand(-1, keys.shape[1], -1, keys.shape[3])
            layer.keys[n:n + k, :, :width] = keys[pick].gather(2, index_)
            layer.values[n:n + k, :, :width] = values[pick].gather(2, index_)
        self.rows = torch.cat([self.rows, torch.tensor(rows, dtype=torch.long)])
        self.next_pos = torch.cat([self.next_pos, lengths])
        self.rope_delta = torch.cat([self.rope_delta, prefill.rope_delta[pick]])
        self.last_width = 0

    def forward(self, ids: torch.Tensor, draft: bool = False) -> torch.Tensor:
        """Feed `ids` (N, w) after each row's cache: causal, or as draft windows `[x0, masks]`; logits (N, w, vocab)."""
        n, w = ids.shape
        span = self.length + w
        self._reserve(span)
        new = torch.arange(w, device=self.device)
        _, heads, slots, _ = self.cache.layers[0].keys.shape
        planes = torch.arange(n * heads, device=self.device).view(n, heads, 1) * slots   # (row, head) starts
        self.cache.index = (planes + (self.next_pos.unsqueeze(1) + new).unsqueeze(1)).reshape(-1)
        self.cache.span = span
        rel = (torch.arange(span, device=self.device) - self.next_pos.unsqueeze(1)).unsqueeze(1)  # (n, 1, span)
        query = new[None, :, None]
        if draft:   # x0 sees itself; the masks see the whole window
            window = (rel == 0) | ((query > 0) & (rel >= 0) & (rel < w))
        else:
            window = (rel >= 0) & (rel <= query)
        positions = self.next_pos.unsqueeze(1) + new   # (n, w)
        if self.mrope:
            positions = (positions + self.rope_delta.unsqueeze(1)).unsqueeze(0).expand(3, n, w)
        out = self.model(input_ids=ids.to(self.device), attention_mask=self._additive((rel < 0) | window),
                         position_ids=positions, past_key_values=self.cache, use_cache=True)
        self.last_width = w
        return out.logits

    def keep(self, counts: torch.Tensor, alive: torch.Tensor | None = None) -> torch.Tensor:
        """Keep the first `counts[r]` slots of the last window in row r, then only the rows where `alive`.

        Returns, for each row left, its row number before the call (rows keep their order unless some leave).
        """
        if len(counts) and int(counts.max()) > self.last_width:
            raise ValueError(f"cannot keep {int(counts.max())} of the {self.last_width} slots last appended")
        self.next_pos = self.next_pos + counts.to(self.device)
        n = len(self.rows)
        order = torch.arange(n)
        if alive is None or bool(alive.all()):
            return order
        alive = alive.cpu()
        left = int(alive.sum())
        holes = (~alive[:left]).nonzero().squeeze(1)        # places of leaving rows among the first `left`
        movers = alive[left:].nonzero().squeeze(1) + left   # rows past them that stay
        order[holes] = movers
        order = order[:left]
        if len(holes):
            span, to, source = self.length, holes.to(self.device), movers.to(self.device)
            for layer in self.cache.layers:
                for buffer in (layer.keys, layer.values):
                    view = buffer[:, :, :span]
                    view.index_copy_(0, to, view.index_select(0, source))
        index = order.to(self.device)
        self.rows, self.next_pos, self.rope_delta = self.rows[order], self.next_pos[index], self.rope_delta[index]
        return order

    def _reserve(self, slots: int) -> None:
        """Grow every buffer (doubling) to hold at least `slots` slots per row."""
        have = self.cache.layers[0].keys.shape[2]
        if slots <= have:
            return
        size = max(slots, 2 * have)
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                old = getattr(layer, name)
                grown = old.new_zeros(old.shape[0], old.shape[1], size, old.shape[3])
                grown[:, :, :have] = old
                setattr(layer, name, grown)

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """Boolean (n, q, k) -> the float additive mask (n, 1, q, k) the models take."""
        return torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill(
            ~allowed, torch.finfo(self.dtype).min).unsqueeze(1)
