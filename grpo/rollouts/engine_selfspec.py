"""Self-speculative rollouts inside the colocated vLLM engine (`vllm_self_speculation`): the policy drafts for itself.

vLLM's parallel-draft path (`method: draft_model`, `parallel_drafting: true`) is given the policy's own checkpoint
as its draft model, and `grpo.rollouts.self_drafter` makes the draft the target model itself (one copy of the
weights and of the KV cache; GLM-OCR's M-RoPE positions included). One draft forward over the window
`[x0, M x (K-1)]` on the request's next K slots proposes K tokens: x0's logits give the AR prediction a0 and mask
j's logits the block-diffusion draft d_j (docs/spec.md §5), so K = B + 1 with B the checkpoint's block size. x0
attends causally and the masks bidirectionally among themselves and to the prefix, as in training. vLLM's
rejection sampler verifies the draft with the target's own logits, so the output distribution is the policy's:
greedy outputs equal plain vLLM's, and sampled drafts (`draft_sample_method: probabilistic`) are accepted with
probability min(1, p/q).

Example:
    >>> llm = start_self_drafted(LLM, model="data/tiny/model", dtype="float32")      # doctest: +SKIP
    >>> before = spec_counters(llm); llm.generate(...)                                     # doctest: +SKIP
    >>> rollout_metrics(before, spec_counters(llm), drafted=True)                          # doctest: +SKIP
    {'rollout/tokens_per_forward': 3.1, 'rollout/accepted_per_round': 10.4, ...}
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

# vLLM's own counters this module reads (`LLM.get_metrics()`, with `disable_log_stats=False`): generated tokens,
# finished requests (one prefill each), and the spec-decode counters: verify rounds (`num_drafts`, one per request
# and step that verified a draft), draft tokens verified, accepted draft tokens (the bonus token excluded), and
# accepted tokens per draft position.
GENERATED = "vllm:generation_tokens"
REQUESTS = "vllm:request_success"
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
COUNTERS = (GENERATED, REQUESTS, DRAFTS, DRAFT_TOKENS, ACCEPTED)
V2_RUNNER = "VLLM_USE_V2_MODEL_RUNNER"
WORKER_EXTENSION = "grpo.rollouts.self_drafter.SelfDraftWorker"  # answers `check_engine` in every worker


def draft_length(bd_size: int, override: int | None = None) -> int:
    """Tokens proposed per draft forward: the block size B plus x0's own prediction (B + 1), or `override`."""
    return override if override is not None else bd_size + 1


# vLLM reads a GLM-OCR checkpoint given as a draft model as GLM-OCR's multi-token-prediction head
# (`vllm/config/speculative.py::hf_config_override`: model type `glm_ocr_mtp`, 0 layers), which GravityOCR does
# not have, and then drafts by MTP. Undone here, so the draft is the checkpoint itself.
_MTP_READINGS = {"glm_ocr_mtp": ("glm_ocr", "GlmOcrForConditionalGeneration")}


def _with_mask_token(mask_id: int, hf_config: Any) -> Any:
    hf_config.mask_token_id = mask_id  # where vLLM's parallel drafting reads the mask id of its draft model
    if hf_config.model_type in _MTP_READINGS:
        hf_config.model_type, architecture = _MTP_READINGS[hf_config.model_type]
        hf_config.architectures = [architecture]
        hf_config.num_hidden_layers = hf_config.text_config.num_hidden_layers
    return hf_config


def speculative_kwargs(model_dir: str | Path, draft_len: int | None = None,
                       slots: list[tuple[int, int, int]] | None = None) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments that make the engine draft with `model_dir` itself.

    `slots`: draft slots by batch size (vLLM's `num_speculative_tokens_per_batch_size`,
    `grpo.rollouts.draft_slots.slot_schedule`); None drafts the full length at every step.
    The mask id goes in through a callable `hf_overrides` (vLLM applies a callable override of the target to its
    draft model config too), so the checkpoint is read as it is. Stats stay on: the counters are the metrics.
    """
    from grpo.block_diffusion import BlockDiffusionConfig

    bd = BlockDiffusionConfig.load(model_dir)  # CheckpointError without block_diffusion.json
    speculative = {"method": "draft_model", "model": str(model_dir), "parallel_drafting": True,
                   "num_speculative_tokens": draft_length(bd.bd_size, draft_len),
                   "draft_sample_method": "probabilistic"}
    if slots is not None:
        speculative["num_speculative_tokens_per_batch_size"] = [tuple(entry) for entry in slots]
    return {
        "speculative_config": speculative,
        "hf_overrides": functools.partial(_with_mask_token, bd.mask_id),
        "disable_log_stats": False,
        "worker_extension_cls": WORKER_EXTENSION,
        **window_backend_kwargs(),
    }


def window_backend_kwargs() -> dict[str, Any]:
    """The attention backend the window needs: vLLM's CPU backend on CPU (the only one there), Triton attention
    on CUDA (`grpo.rollouts.self_drafter.WINDOW_BACKENDS`); `check_engine` refuses any other after the start."""
    from vllm.platforms import current_platform

    return {} if current_platform.is_cpu() else {"attention_backend": "TRITON_ATTN"}


def start_self_drafted(llm_class: Any, draft_len: int | None = None,
                       slots: list[tuple[int, int, int]] | None = None, **kwargs: Any) -> Any:
    """`llm_class(**kwargs)` (a `vllm.LLM` or a partial of it) drafting with its own `model` (`slots`: as in
    `speculative_kwargs`), exact on CPU too, checked once it has started (`self_drafter.check_engine`:
    RuntimeError if it does not draft that way).

    A caller's `max_num_batched_tokens` is raised where it would cap `max_num_seqs` (`batched_tokens`).
    """
    spec = speculative_kwargs(kwargs["model"], draft_len, slots)
    if kwargs.get("worker_extension_cls") not in (None, WORKER_EXTENSION):
        raise ValueError(f"a self-drafted engine takes the worker extension {WORKER_EXTENSION}, not "
                         f"{kwargs['worker_extension_cls']}")
    # A request whose prompt is a prefix-cache hit but for its last token gets draft slots in its first step, and
    # vLLM 0.32 loses their draft probabilities (seen with GRPO's groups of one long image prompt): no prefix cache.
    kwargs = {**kwargs, **spec, "enable_prefix_caching": False}
    if kwargs.get("max_num_batched_tokens") and kwargs.get("max_num_seqs"):
        kwargs["max_num_batched_tokens"] = batched_tokens(kwargs["max_num_batched_tokens"], kwargs["max_num_seqs"],
                                                          spec["speculative_config"]["num_speculative_tokens"])
    from grpo.rollouts.self_drafter import check_engine, install

    install()  # the plugin entry point does it in every vLLM process; here for a process that loaded it already
    pinned = os.environ.get(V2_RUNNER)
    os.environ[V2_RUNNER] = "0"  # the V1 runner, where the proposer is installed (the V2 one builds its own)
    try:
        llm = llm_class(**kwargs)
    finally:
        if pinned is None:
            os.environ.pop(V2_RUNNER)
        else:
            os.environ[V2_RUNNER] = pinned
    check_engine(llm)
    return llm


def batched_tokens(given: int, max_num_seqs: int, draft_len: int) -> int:
    """A `max_num_batched_tokens` at least `given` under which `max_num_seqs` requests all verify in one step.

    The verify forward takes K + 1 tokens a request and the draft forward K (`llm_base_proposer.py`,
    `max_num_tokens` sizes its buffers by `max_num_batched_tokens`): TRL's fixed 4096 caps a step at 227 requests
    at K = 17.
    """
    return max(given, max_num_seqs * (draft_len + 1))


def spec_counters(llm: Any) -> dict[str, float]:
    """vLLM's running totals: generated tokens, finished requests, verify rounds, accepted draft tokens, and
    accepted tokens at each draft position (`PER_POS` + `[i]`)."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    for metric in llm.get_metrics():
        if metric.name == PER_POS:
            for i, value in enumerate(metric.values):
                key = f"{PER_POS}[{i}]"
                totals[key] = totals.get(key, 0.0) + float(value)
        elif metric.name in totals:  # a counter may come once per label set (finish reason, engine)
            totals[metric.name] += float(metric.value)
    return totals


def rollout_metrics(before: dict[str, float], after: dict[str, float], drafted: bool) -> dict[str, float]:
    """What the engine generated between two `spec_counters` snapshots, as per-step metrics.

    Target forwards of a request: its prefill, one per verify round (`num_drafts`) and one per plain step (a step
    drafting 0 slots, `grpo.rollouts.draft_slots`: the tokens neither a prefill nor a round made, fewer by the
    accepted tokens vLLM counts past a stop token), or, for a plain engine, one per generated token.
    `rollout/tokens_per_forward`: generated tokens over every forward of the policy's weights, drafting included,
    as docs/spec.md §5 counts TPF (plain decoding gives exactly 1.0). A `drafted` engine runs one draft forward
    before each round and after a request's last target forward (`gpu_model_runner.py::sample_tokens` drafts for
    the whole batch before finished requests leave): counted as prefills + rounds, the most there can be.
    `rollout/tokens_per_target_forward`: over the target's forwards only.
    `rollout/tpf`: docs/spec.md §5's TPF, Σ (tokens - 1) / Σ forwards: x0, from the prefill, and the prefill's forward
    not counted; a round's draft and verify forwards and a plain step's forward counted; the draft forward vLLM runs
    after a request's last target forward not counted (the package's decoder runs none). Plain decoding: 1.0.
    `rollout/draft_slots` (only drafted): draft tokens verified per target forward after the prefill, the slots a
    step drafts averaged over rounds and plain steps (the full length without a schedule).
    `rollout/accepted_per_round` (only with drafts): draft tokens the rejection sampler accepted per verify round,
    the bonus token excluded, as vLLM counts them (before the cut at a stop token or `max_tokens`);
    `rollout/accepted_at_{i}`: the share of rounds whose draft token i was accepted.
    """
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    if not drafted:
        if delta[GENERATED] <= 0:
            return {}
        return {"rollout/tokens_per_forward": 1.0, "rollout/tokens_per_target_forward": 1.0, "rollout/tpf": 1.0}
    plain = max(0.0, delta[GENERATED] - delta[REQUESTS] - delta[DRAFTS] - delta[ACCEPTED])
    drafts = delta[REQUESTS] + delta[DRAFTS]
    if drafts <= 0:
        return {}
    out = {"rollout/tokens_per_forward": delta[GENERATED] / (2 * drafts + plain),
           "rollout/tokens_per_target_forward": delta[GENERATED] / (drafts + plain)}
    if 2 * delta[DRAFTS] + plain > 0:
        out["rollout/tpf"] = (delta[GENERATED] - delta[REQUESTS]) / (2 * delta[DRAFTS] + plain)
    if delta[DRAFTS] + plain > 0:
        out["rollout/draft_slots"] = delta[DRAFT_TOKENS] / (delta[DRAFTS] + plain)
    if delta[DRAFTS] > 0:
        out["rollout/accepted_per_round"] = delta[ACCEPTED] / delta[DRAFTS]
        for key in sorted((k for k in delta if k.startswith(PER_POS)), key=lambda k: int(k[len(PER_POS) + 1:-1])):
            out[f"rollout/accepted_at_{key[len(PER_POS) + 1:-1]}"] = delta[key] / delta[DRAFTS]
    return out
