"""vLLM 0.32's parallel draft-model proposer turned into the policy drafting with its own weights in the engine,
over the window it was trained on.

`SelfDraftProposer` is vLLM's `DraftModelProposer` where the draft model is the target's own checkpoint:
- **One copy.** The draft is the target model itself, on the target's KV cache: no second load, no second KV
  cache, and a weight sync of the target is one of the drafter.
- **The trained window, one forward, new slots only.** Each request's draft input is `[x0, M x (K-1)]` (x0 the
  token the target just sampled), on the K slots after its last accepted token, as DFlash lays out its query
  (`vllm/v1/spec_decode/dflash.py`, `set_inputs_first_pass`). The accepted tokens are not run again: the verify
  forward already wrote their states. The window is two attention rows of the request's block-table row: x0
  causal (it sees the prefix and itself) and the masks with causal off (they see the prefix, x0 and each other),
  through the per-request `causal` tensor of `CommonAttentionMetadata` (`vllm/v1/attention/backend.py:414`).
  All K slots lie where the next verify forward writes before it reads, so the target's states stay its own.
- **M-RoPE and images.** Slot j of a request sits at its last accepted token's position + 1 + j on every axis
  (GLM-OCR's rule for text after the image, so it holds for a 1-D rope too); the window has no image token, so
  no image feature enters it.

`install` (also vLLM's general plugin of this package, so engines in other processes get it) makes vLLM build
this proposer where it builds `DraftModelProposer` (vLLM has no hook for it), and turns vLLM's fallback from
recorded draft probabilities to deterministic rejection into an error. `check_engine` asserts, once an engine has
started, that its runner is the V1 one and drafts with this proposer on one copy and a backend that honours the
window.
"""
from __future__ import annotations

import torch
from vllm.config import get_layers_from_vllm_config
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.spec_decode.draft_model import DraftModelProposer

# What each attention backend does with the window's per-request `causal` tensor (vLLM 0.32, as installed):
# - CPU_ATTN honours it: `vllm/v1/attention/backends/cpu_attn.py`, `CPUAttentionMetadataBuilder.build`, passes it on
#   as `dynamic_causal`;
# - TRITON_ATTN honours it: `vllm/v1/attention/ops/triton_unified_attention.py`, `unified_attention`, reads it per
#   sequence (`per_seq_causal_ptr`);
# - FLASH_ATTN honours it on FA4 only: `vllm/v1/attention/backends/flash_attn.py`, `FlashAttentionImpl.forward`,
#   raises NotImplementedError ("Per-sequence causal requires FA4") on FA2 and FA3, and the backend's name does not
#   say which version runs (`fa_utils.py::get_flash_attn_version` moves FA3 to FA4 for diffusion models only);
# - the others are refused untried (`check_backend`).
WINDOW_BACKENDS = ("CPU_ATTN", "TRITON_ATTN")
# vLLM's V1 model runners (CUDA, CPU), where `install` puts the proposer; the V2 runner (vllm/v1/worker/gpu/) builds
# its drafters elsewhere.
V1_RUNNERS = ("vllm.v1.worker.gpu_model_runner.GPUModelRunner", "vllm.v1.worker.cpu_model_runner.CPUModelRunner")


class SelfDraftProposer(DraftModelProposer):
    """`DraftModelProposer` that drafts with the target model, its KV cache and the trained window."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.drafts_itself:
            # rows (x0, masks) per request; x0's row is causal, the masks' is not
            self.window_causal = torch.tensor([1, 0], dtype=torch.int32, device=self.device)
            self.window_offsets = torch.arange(self.num_speculative_tokens, device=self.device)

    @property
    def drafts_itself(self) -> bool:
        return self.speculative_config.draft_model_config.model == self.vllm_config.model_config.model

    def _raise_if_mrope(self) -> None:
        """vLLM's check for other draft models; the window carries its own M-RoPE positions."""
        if not self.drafts_itself:
            super()._raise_if_mrope()

    def load_model(self, target_model: torch.nn.Module) -> None:
        if not self.drafts_itself:
            return super().load_model(target_model)
        self.model = target_model
        layers = get_layers_from_vllm_config(self.vllm_config, AttentionLayerBase)  # type: ignore[type-abstract]
        self._draft_attn_layer_names = {name for name, layer in layers.items()
                                        if layer.get_kv_cache_spec(self.vllm_config) is not None}

    def propose(self, num_speculative_tokens, *args, **kwargs):
        """vLLM's proposal at the step's K (`num_speculative_tokens`, which dynamic drafting chooses per step; the
        window is the first K of the configured slots). At K = 0 no draft forward runs: vLLM's base class runs one
        to fill a separate drafter's KV cache (`llm_base_proposer.py`, `propose`, before "No draft tokens
        requested"), and this drafter's cache is the target's, which the verify forward fills."""
        if num_speculative_tokens == 0 and self.drafts_itself:
            self.num_speculative_tokens, self._last_draft_probs = 0, None
            return torch.empty(kwargs["common_attn_metadata"].batch_size(), 0, dtype=torch.int64,
                               device=self.device)
        return super().propose(num_speculative_tokens, *args, **kwargs)

    def build_model_inputs_first_pass(self, num_tokens, num_input_tokens, mm_embed_inputs):
        """The window's embeddings: x0 and mask tokens, no image feature."""
        return super().build_model_inputs_first_pass(num_tokens, num_input_tokens,
                                                     None if self.drafts_itself else mm_embed_inputs)

    def set_inputs_first_pass(self, target_token_ids, next_token_ids, target_positions, target_hidden_states,
                              token_indices_to_sample, cad, num_rejected_tokens_gpu):
        if not self.drafts_itself:
            return super().set_inputs_first_pass(target_token_ids, next_token_ids, target_positions,
                                                 target_hidden_states, token_indices_to_sample, cad,
                                                 num_rejected_tokens_gpu)
        batch, k = cad.batch_size(), self.num_speculative_tokens
        n = batch * k
        rejected = num_rejected_tokens_gpu if num_rejected_tokens_gpu is not None else torch.zeros_like(cad.seq_lens)
        ids = self.input_ids[:n].view(batch, k)
        ids[:, 0] = next_token_ids
        ids[:, 1:] = self.parallel_drafting_token_id
        last = (cad.query_start_loc[1:] - 1 - rejected).long()
        if self.uses_mrope:
            self.mrope_positions[:, :n] = window_positions(target_positions, last, self.window_offsets[:k])
        else:
            self.positions[:n] = window_positions(target_positions[None], last, self.window_offsets[:k])[0]
        accepted = cad.seq_lens - rejected  # x0's index in its sequence
        window = window_metadata(cad, accepted, k, self.block_size, self.window_causal)
        return n, torch.arange(n, device=self.device), window


def window_positions(target_positions: torch.Tensor, last: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Positions (axes, batch x K) of the windows: request r's slot j at the position of its last accepted token
    (`target_positions[:, last[r]]`) + 1 + j on every axis."""
    base = target_positions[:, last]                                  # (axes, batch)
    return (base[:, :, None] + 1 + offsets).flatten(1)


def window_metadata(cad: CommonAttentionMetadata, accepted: torch.Tensor, k: int, block_size: int,
                    causal_pattern: torch.Tensor) -> CommonAttentionMetadata:
    """Attention metadata of the windows: two rows per request on its block-table row, x0 (1 query token, seeing
    `accepted + 1` keys, causal) and the K - 1 masks (seeing `accepted + K` keys, causal off); the slots are the
    K after the `accepted` tokens. Built without reading a device value on the host."""
    batch = cad.batch_size()
    index = accepted[:, None].long() + torch.arange(k, device=accepted.device)        # (batch, K) sequence indices
    blocks = torch.gather(cad.block_table_tensor, 1, index // block_size).long()
    slots = (blocks * block_size + index % block_size).flatten()
    row_lens = torch.tensor([1, k - 1], dtype=torch.int32).repeat(batch)
    starts_cpu = torch.zeros(2 * batch + 1, dtype=torch.int32)
    torch.cumsum(row_lens, 0, out=starts_cpu[1:])
    seq_lens = torch.stack([accepted + 1, accepted + k], dim=1).flatten().to(cad.seq_lens.dtype)
    upper = cad.seq_lens_cpu_upper_bound
    return CommonAttentionMetadata(
        query_start_loc=starts_cpu.to(cad.query_start_loc.device, non_blocking=True),
        query_start_loc_cpu=starts_cpu,
        seq_lens=seq_lens,
        seq_lens_cpu_upper_bound=None if upper is None else (upper + k).repeat_interleave(2),
        num_reqs=2 * batch,
        num_actual_tokens=batch * k,
        max_query_len=max(1, k - 1),
        max_seq_len=cad.max_seq_len + k,
        block_table_tensor=cad.block_table_tensor.repeat_interleave(2, dim=0),
        slot_mapping=slots,
        causal=causal_pattern.repeat(batch),
    )


def check_backend(name: str) -> None:
    """Refuse an attention backend not known to honour the window's per-request causal flags (RuntimeError)."""
    if name not in WINDOW_BACKENDS:
        raise RuntimeError(f"the self-drafted window needs an attention backend that honours per-request causal "
                           f"flags ({', '.join(WINDOW_BACKENDS)}); this engine runs {name}, which is not known to: "
                           "start it with attention_config={'backend': 'TRITON_ATTN'}")


class SelfDraftWorker:
    """vLLM worker extension (`worker_extension_cls`): what a worker's runner drafts with, asked for by name
    through `collective_rpc`, which reaches workers in other processes too."""

    def self_draft_report(self) -> dict:
        runner = self.model_runner
        drafter = getattr(runner, "drafter", None)
        groups = getattr(drafter, "draft_attn_groups", None) or []
        return {"runner": f"{type(runner).__module__}.{type(runner).__name__}",
                "drafter": type(drafter).__name__, "one_copy": _unwrapped(getattr(drafter, "model", None))
                is runner.get_model(),
                "backends": sorted({g.backend.get_name() for g in groups})}


def _unwrapped(model):
    """`model` out of vLLM's CUDA-graph wrapper, as `GPUModelRunner.get_model` unwraps the runner's (under
    `VLLM_USE_BREAKABLE_CUDAGRAPH` the drafter's model is wrapped too: `gpu_model_runner.py`, `load_model`)."""
    return model.unwrap() if hasattr(model, "unwrap") else model


def check_report(report: dict) -> None:
    """Refuse (RuntimeError) a worker's report (`SelfDraftWorker.self_draft_report`) that does not draft with
    `SelfDraftProposer` on the V1 runner, on the target's own weights, with a backend that honours the window."""
    if report["runner"] not in V1_RUNNERS:
        raise RuntimeError(f"the engine runs {report['runner']}, not vLLM's V1 model runner, where the "
                           "self-drafter is installed")
    if report["drafter"] != SelfDraftProposer.__name__ or not report["one_copy"]:
        raise RuntimeError(f"the engine drafts with {report['drafter']} (one copy of the weights: "
                           f"{report['one_copy']}), not with the target model itself; is grpo installed "
                           "(its vLLM plugin entry point installs the drafter)?")
    for name in report["backends"]:
        check_backend(name)


def check_engine(llm) -> None:
    """`check_report` on every worker of a started engine: a silent fallback to vLLM's own proposer, a second
    weight copy or a causal window would otherwise go unnoticed."""
    for report in llm.collective_rpc("self_draft_report"):
        check_report(report)


def _exact_draft_probs(original):
    """vLLM's `_get_spec_decode_draft_probs`, with its fallback to deterministic rejection (a warning: 'Missing
    cached draft probabilities') an error where draft probabilities were recorded: for sampled drafts that
    fallback is not exact."""

    def draft_probs(self, spec_decode_metadata):
        probs = original(self, spec_decode_metadata)
        if probs is None and self._draft_probs is not None and sum(spec_decode_metadata.num_draft_tokens) > 0:
            raise RuntimeError("vLLM lost the draft probabilities of a sampled draft and would fall back to "
                               "deterministic rejection, which is not exact for sampled drafts")
        return probs

    draft_probs.exact = True
    return draft_probs


def _plain_when_undrafted(original):
    """vLLM's `_sample`, with a step in which no request verifies a draft (the slot schedule's K = 0) sampled by the
    plain sampler. vLLM's runner builds spec-decode metadata for every step of an engine with a speculative config
    (`gpu_model_runner.py`, `_prepare_inputs`, `use_spec_decode`) and runs the rejection sampler on zero drafts: it
    samples the bonus tokens with that same sampler (`rejection_sampler.py`, `forward`) and then does the rejection
    work on nothing (a batch x vocabulary exponential draw, the target probabilities), which made a K = 0 step 30%
    slower than a plain engine's at batch 32 on CPU."""

    def sample(self, logits, spec_decode_metadata):
        if spec_decode_metadata is not None and spec_decode_metadata.max_spec_len == 0:
            spec_decode_metadata = None
        return original(self, logits, spec_decode_metadata)

    sample.plain_when_undrafted = True
    return sample


def install() -> None:
    """Engines started from now on in this process draft with `SelfDraftProposer` (one whose draft model is
    another checkpoint keeps vLLM's own behaviour), never fall back to deterministic rejection silently, and sample
    a step without drafts with the plain sampler."""
    from vllm.v1.worker import gpu_model_runner

    from grpo.rollouts.cpu_expand import repair_cpu_expand

    gpu_model_runner.DraftModelProposer = SelfDraftProposer
    runner = gpu_model_runner.GPUModelRunner
    if not getattr(runner._get_spec_decode_draft_probs, "exact", False):
        runner._get_spec_decode_draft_probs = _exact_draft_probs(runner._get_spec_decode_draft_probs)
    if not getattr(runner._sample, "plain_when_undrafted", False):
        runner._sample = _plain_when_undrafted(runner._sample)
    repair_cpu_expand()


def vllm_plugin() -> None:
    """vLLM's general plugin (entry point `vllm.general_plugins`): `install()` in every vLLM process."""
    install()
