"""The self-drafted engine samples exactly (issue 52, item 3): on a random 1-layer Llama with a vocabulary of 4,
prompted alike and sampled at temperature 1 up to 6 new tokens, SAMPLES outputs of the self-drafted vLLM engine
and as many of plain vLLM fit AR sampling's distribution, computed exactly from the model's causal probabilities
(`helpers_sampling`), and each other (chi-square on the 1,093 possible outputs, rare ones pooled). About 25 s.

Blocks of 2 (K = 3 draft slots: x0's prediction and 2 masks) within 6 tokens give rounds that reject, rounds that
accept every draft and draw the bonus token, and second rounds. The same samples are rejected against AR's
distribution at 1.15 x T (measured p ~ 1e-21), so the test has the power to see a distribution slightly off.
Checked to fail when the engine's sampling is wrong: with the rejection sampler handed uniform draft probabilities
(`self_drafter._exact_draft_probs` returning `torch.full_like(probs, 1 / probs.shape[-1])`) the self-drafted
samples' fit to the exact distribution fell to p = 0.0 and to plain vLLM's to p ~ 1e-212 (passing: 0.63 and 0.93).
"""
from __future__ import annotations

import json

import pytest
import torch

from helpers_sampling import chi_square_p, exact_ar_distribution, tally_outputs, two_sample_chi_square_p

pytestmark = pytest.mark.slow

VOCAB, EOS, MASK = 4, 0, 1
PROMPT = [2, 3, 2, 3]
MAX_NEW, BD_SIZE, SAMPLES = 6, 2, 20_000


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The model (head size 32, which vLLM's CPU attention takes) saved as a joint checkpoint for vLLM."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, initializer_range=0.15,
                         max_position_embeddings=64, eos_token_id=EOS, bos_token_id=None)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[EOS] = 0  # EOS's logit 0 among logits of std ~1: outputs that run to a second round
    path = tmp_path_factory.mktemp("vocab4")
    model.save_pretrained(path)
    (path / "block_diffusion.json").write_text(json.dumps({"bd_size": BD_SIZE, "mask_id": MASK}))
    return model, path


def _samples(llm, count: int = SAMPLES) -> list[tuple[int, ...]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=1.0, max_tokens=MAX_NEW, stop_token_ids=[EOS], detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": PROMPT}] * count, params, use_tqdm=False)
    return [tuple(o.outputs[0].token_ids) for o in outputs]


def test_self_drafted_samples_follow_the_ar_distribution_as_plain_vllms_do(checkpoint):
    from vllm import LLM

    from grpo.rollouts.engine import device_kwargs, engine_start_guard, set_engine_env
    from grpo.rollouts.engine_selfspec import ACCEPTED, DRAFTS, PER_POS, spec_counters, start_self_drafted

    model, path = checkpoint
    torch.set_num_threads(1)
    exact = exact_ar_distribution(model, PROMPT, 1.0, MAX_NEW, EOS)
    assert len(exact) == sum(3 ** n for n in range(MAX_NEW - 1)) + 3 ** (MAX_NEW - 1) * VOCAB == 1093
    assert sum(p * SAMPLES >= 5 for p in exact.values()) > 40  # spread over tens of outputs, not a few
    set_engine_env()
    kwargs = dict(model=str(path), seed=0, max_model_len=64, skip_tokenizer_init=True, enable_chunked_prefill=False,
                  max_num_seqs=256, max_num_batched_tokens=4096, **device_kwargs("float32"))
    with engine_start_guard():  # after earlier tests' numba kernels, as every engine of the package starts
        plain_llm = LLM(**kwargs)
        llm = start_self_drafted(LLM, **kwargs)
    plain = tally_outputs(_samples(plain_llm))
    before = spec_counters(llm)
    drafted = tally_outputs(_samples(llm))
    delta = {key: value - before.get(key, 0.0) for key, value in spec_counters(llm).items()}

    rounds = delta[DRAFTS]
    assert 0.2 < delta[ACCEPTED] / rounds / (BD_SIZE + 1) < 0.95  # drafts are both accepted and rejected
    assert delta[f"{PER_POS}[{BD_SIZE}]"] > SAMPLES // 20  # whole windows accepted: a bonus token drawn
    # second rounds: a prefill and one round make at most 1 + K + 1 = 5 tokens
    assert sum(n for out, n in drafted.items() if len(out) == MAX_NEW) > SAMPLES // 20
    assert chi_square_p(plain, exact, SAMPLES) > 1e-3
    assert chi_square_p(drafted, exact, SAMPLES) > 1e-3
    assert two_sample_chi_square_p(drafted, plain) > 1e-3
    # the same test tells a distribution a little off apart: AR's at another temperature
    assert chi_square_p(drafted, exact_ar_distribution(model, PROMPT, 1.15, MAX_NEW, EOS), SAMPLES) < 1e-6


def test_steps_without_drafts_sample_as_plain_vllm_does(checkpoint):
    """Under a slot schedule that drafts nothing while more than 64 requests run (`draft_slots`), those steps go to
    vLLM's plain sampler (`self_drafter._plain_when_undrafted`), the others to the rejection sampler: half the
    samples come in one call (256 requests a step, plain), half in calls of 64 (drafted). Together they fit AR
    sampling's distribution. Checked to fail with the plain steps' logits scaled by 1.5 (p ~ 1e-186)."""
    from vllm import LLM

    from grpo.rollouts.engine import device_kwargs, engine_start_guard, set_engine_env
    from grpo.rollouts.engine_selfspec import (ACCEPTED, DRAFTS, GENERATED, REQUESTS, spec_counters,
                                               start_self_drafted)

    model, path = checkpoint
    torch.set_num_threads(1)
    set_engine_env()
    with engine_start_guard():
        llm = start_self_drafted(LLM, None, [(1, 64, BD_SIZE + 1), (65, 4096, 0)], model=str(path), seed=1,
                                 max_model_len=64, skip_tokenizer_init=True, enable_chunked_prefill=False,
                                 max_num_seqs=256, max_num_batched_tokens=4096, **device_kwargs("float32"))
    before = spec_counters(llm)
    drafted = tally_outputs(_samples(llm, SAMPLES // 2) + [out for _ in range(SAMPLES // 128)
                                                           for out in _samples(llm, 64)])
    delta = {key: value - before.get(key, 0.0) for key, value in spec_counters(llm).items()}
    plain_steps = delta[GENERATED] - delta[REQUESTS] - delta[DRAFTS] - delta[ACCEPTED]
    assert plain_steps > SAMPLES // 20 and delta[DRAFTS] > SAMPLES // 10  # both kinds of step, many of each
    exact = exact_ar_distribution(model, PROMPT, 1.0, MAX_NEW, EOS)
    assert chi_square_p(drafted, exact, SAMPLES) > 1e-3
    assert chi_square_p(drafted, exact_ar_distribution(model, PROMPT, 1.15, MAX_NEW, EOS), SAMPLES) < 1e-6
