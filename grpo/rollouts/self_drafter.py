"""vLLM 0.32's parallel draft-model proposer turned into the policy drafting with its own weights in the engine.

`SelfDraftProposer` is vLLM's `DraftModelProposer` with two changes:
- **One copy.** The draft is the target model itself, on the target's KV cache: no second
  load, no second KV cache, and a weight sync of the target is one of the drafter. Each draft forward writes
  the tokens it re-runs into the cache slots where the target's states of the same tokens already are (the
  same weights compute the same states), and its mask slots lie among those that the next verify forward
  writes before it reads them (which needs the right positions: see `window_positions`).
- **M-RoPE and images.** vLLM refuses M-RoPE under draft-model or parallel drafting (`llm_base_proposer.py::
  _raise_if_mrope`): its input expansion (`_copy_and_expand_eagle_inputs`) writes one position per token, the
  query's first position + j. Here the expansion runs on the tokens' sequence indices, from which vLLM computes
  the KV cache places, and `window_positions` gives the M-RoPE positions: the re-run tokens keep the target's,
  and slot j after a request's last token gets that token's position + j on every axis (GLM-OCR's rule for
  text after the image). The image features go to the
  draft input's image tokens.

`install` makes the engines started after it in this process build this proposer where vLLM builds
`DraftModelProposer` (vLLM has no hook for it).
"""
from __future__ import annotations

import torch
from vllm.config import get_layers_from_vllm_config
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.spec_decode.draft_model import DraftModelProposer


class SelfDraftProposer(DraftModelProposer):
    """`DraftModelProposer` that drafts with the target model and its KV cache, M-RoPE and images included."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.uses_mrope:  # the 1-D buffer the expansion writes (vLLM makes it only without M-RoPE)
            self.positions = torch.zeros(self.max_positions, dtype=torch.int64, device=self.device)

    def _raise_if_mrope(self) -> None:
        """M-RoPE is handled in `set_inputs_first_pass`."""

    def load_model(self, target_model: torch.nn.Module) -> None:
        drafts_itself = self.speculative_config.draft_model_config.model == self.vllm_config.model_config.model
        self._target = target_model if drafts_itself else None  # another draft model: vLLM's own way
        super().load_model(target_model)
        if self._target is not None:  # it found no attention layers of its own: it runs the target's
            layers = get_layers_from_vllm_config(self.vllm_config, AttentionLayerBase)  # type: ignore[type-abstract]
            self._draft_attn_layer_names = {name for name, layer in layers.items()
                                            if layer.get_kv_cache_spec(self.vllm_config) is not None}

    def _get_model(self) -> torch.nn.Module:
        return self._target if self._target is not None else super()._get_model()

    def build_model_inputs_first_pass(self, num_tokens, num_input_tokens, mm_embed_inputs):
        """Image features at the draft input's image tokens (vLLM lays the mask out for the target's tokens)."""
        if mm_embed_inputs is not None:
            mm_embeds, _ = mm_embed_inputs
            mm_embed_inputs = (mm_embeds, self.input_ids[:num_tokens] == self.model.config.image_token_id)
        return super().build_model_inputs_first_pass(num_tokens, num_input_tokens, mm_embed_inputs)

    def set_inputs_first_pass(self, target_token_ids, next_token_ids, target_positions, target_hidden_states,
                              token_indices_to_sample, cad, num_rejected_tokens_gpu):
        rest = (target_hidden_states, token_indices_to_sample, cad, num_rejected_tokens_gpu)
        if not self.uses_mrope:
            return super().set_inputs_first_pass(target_token_ids, next_token_ids, target_positions, *rest)
        indices = sequence_indices(cad, target_token_ids.shape[0])
        out = super().set_inputs_first_pass(target_token_ids, next_token_ids, indices, *rest)
        n = out[0]
        self.mrope_positions[:, :n] = window_positions(target_positions, cad.query_start_loc,
                                                       num_rejected_tokens_gpu, self.extra_slots_per_request, n)
        return out


def sequence_indices(cad, num_tokens: int) -> torch.Tensor:
    """Each scheduled token's index in its request's sequence: request r's query tokens are the last
    `query_len[r]` of its `seq_lens[r]` (padding after the last request: 0)."""
    starts = cad.query_start_loc
    lengths = starts[1:] - starts[:-1]
    request = torch.repeat_interleave(torch.arange(len(lengths), device=starts.device), lengths)
    index = (cad.seq_lens - lengths)[request] + torch.arange(len(request), device=starts.device) - starts[request]
    out = torch.zeros(num_tokens, dtype=torch.int64, device=starts.device)
    out[: len(index)] = index
    return out


def window_positions(target_positions: torch.Tensor, starts: torch.Tensor, rejected: torch.Tensor | None,
                     slots: int, num_out: int) -> torch.Tensor:
    """M-RoPE positions (axes, `num_out`) of the draft input vLLM's expansion lays out: per request, its valid
    query tokens at their own positions, then `slots` new tokens (x0, masks) at the last valid token's position
    + 1, + 2, ... on every axis, then its rejected tokens (0). vLLM's kernel writes first position + j instead,
    which is right only where a query's positions are consecutive (not over an image)."""
    out = torch.zeros(target_positions.shape[0], num_out, dtype=target_positions.dtype,
                      device=target_positions.device)
    starts = starts.tolist()
    rejected = rejected.tolist() if rejected is not None else [0] * (len(starts) - 1)
    for r, (start, end) in enumerate(zip(starts[:-1], starts[1:])):
        valid = end - start - rejected[r]
        at = start + r * slots
        out[:, at:at + valid] = target_positions[:, start:start + valid]
        step = torch.arange(1, slots + 1, device=out.device)
        out[:, at + valid:at + valid + slots] = target_positions[:, start + valid - 1, None] + step
    return out


def install() -> None:
    """Engines started from now on in this process draft with `SelfDraftProposer` (one whose draft model is
    another checkpoint keeps that model, and gets only the M-RoPE and image handling)."""
    from vllm.v1.worker import gpu_model_runner

    gpu_model_runner.DraftModelProposer = SelfDraftProposer
