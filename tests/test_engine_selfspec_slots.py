"""The self-drafted engine under a draft-slot schedule (`grpo.rollouts.draft_slots`, vLLM's
`num_speculative_tokens_per_batch_size`): each step drafts the slots its batch size gets, none at all where that is
0, and greedy outputs stay plain vLLM's."""
import pytest

from grpo.rollouts.engine_selfspec import (ACCEPTED, DRAFT_TOKENS, DRAFTS, GENERATED, REQUESTS, rollout_metrics,
                                           spec_counters)

pytestmark = pytest.mark.slow

# 8 requests of different lengths: the batch shrinks from 8 to 1, through every range, and the last request runs
# alone for several rounds
LENGTHS = [12, 20, 28, 36, 44, 52, 60, 200]
SLOTS = [(1, 1, 17), (2, 3, 6), (4, 5, 1), (6, 8, 0)]
K_AT = {b: k for start, end, k in SLOTS for b in range(start, end + 1)}


def _record_proposals(worker):
    """Inside the worker: (K, batch size, draft forwards run) of every proposal."""
    drafter = worker.model_runner.drafter
    drafter.proposals, propose, first_pass = [], drafter.propose, drafter.set_inputs_first_pass

    def counted_first_pass(*args, **kwargs):
        drafter.proposals[-1][2] += 1
        return first_pass(*args, **kwargs)

    def recorded(num_speculative_tokens, *args, **kwargs):
        drafter.proposals.append([num_speculative_tokens, kwargs["common_attn_metadata"].batch_size(), 0])
        return propose(num_speculative_tokens, *args, **kwargs)

    drafter.propose, drafter.set_inputs_first_pass = recorded, counted_first_pass


def _greedy(llm, prompts):
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in LENGTHS]
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def test_slots_follow_the_batch_and_greedy_stays_plain_vllms():
    import torch

    from grpo.model_source import resolve_model
    from grpo.pool import load_pool
    from grpo.rollouts.engine import make_llm

    torch.set_num_threads(1)
    path = resolve_model("tiny")
    prompts = list(load_pool("tiny")["prompt"][:8])
    plain = _greedy(make_llm(path, max_model_len=512, dtype="float32"), prompts)
    llm = make_llm(path, max_model_len=512, dtype="float32", self_speculation=True, slots=SLOTS)
    llm.collective_rpc(_record_proposals)
    before = spec_counters(llm)
    assert _greedy(llm, prompts) == plain
    after = spec_counters(llm)
    proposals = llm.collective_rpc(lambda worker: worker.model_runner.drafter.proposals)[0]

    assert all(k == K_AT[batch] for k, batch, _ in proposals), proposals
    assert {k for k, _, _ in proposals} == {0, 1, 6, 17}
    assert all(forwards == (k > 0) for k, _, forwards in proposals), "a draft forward at K = 0, or none at K > 0"
    # vLLM's counters: rounds verify what the previous step drafted (at most 17 slots), accepted counts fall with
    # the position, and the plain steps (the tokens no prefill or round made, fewer by vLLM's accepted tokens past
    # max_tokens) follow the proposals of K = 0
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    per_pos = [delta[f"vllm:spec_decode_num_accepted_tokens_per_pos[{i}]"] for i in range(17)]
    assert per_pos == sorted(per_pos, reverse=True) and per_pos[0] <= delta[DRAFTS] and per_pos[16] > 0
    assert delta[DRAFTS] < delta[DRAFT_TOKENS] < 17 * delta[DRAFTS]
    plain_steps = delta[GENERATED] - delta[REQUESTS] - delta[DRAFTS] - delta[ACCEPTED]
    assert 0 < plain_steps <= sum(batch for k, batch, _ in proposals if k == 0)
    metrics = rollout_metrics(before, after, drafted=True)
    assert 0 < metrics["rollout/draft_slots"] < 17
    assert metrics["rollout/accepted_at_0"] <= 1.0
