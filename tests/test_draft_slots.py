"""The draft-slot rule (`grpo.rollouts.draft_slots`): full length at batch 1, fewer slots as the batch grows, plain
decoding where drafting cannot pay, in the ranges vLLM's dynamic speculative decoding takes."""
import pytest
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

from grpo.rollouts.draft_slots import DEFAULT_TOKEN_COST, default_acceptance, slot_schedule


def _per_batch(schedule, k_max, up_to=512):
    """K at batch sizes 1..up_to, as vLLM's scheduler looks it up."""
    return build_dynamic_sd_schedule_lookup(schedule, up_to, k_max)[1:]


@pytest.mark.parametrize("k_max", [2, 5, 17, 33])
@pytest.mark.parametrize("token_cost", [0.001, DEFAULT_TOKEN_COST, 0.05])
def test_full_length_at_batch_one_then_never_more_down_to_plain(k_max, token_cost):
    schedule = slot_schedule(k_max, default_acceptance(k_max), token_cost)
    ks = _per_batch(schedule, k_max)
    if token_cost <= DEFAULT_TOKEN_COST and k_max <= 17:  # the tiny checkpoints' B + 1 = 17
        assert ks[0] == k_max
    assert all(a >= b for a, b in zip(ks, ks[1:]))
    assert ks[-1] == 0 and schedule[-1][2] == 0
    assert schedule[0][0] == 1 and all(end + 1 == nxt[0] for (_, end, _), nxt in zip(schedule, schedule[1:]))


def test_each_slot_is_kept_exactly_where_it_pays():
    """At every batch the chosen K gives more tokens per unit of cost than one slot more or one less."""
    k_max, cost = 9, 0.02
    shares = [0.9, 0.8, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05]
    tokens = [1 + sum(shares[:k]) for k in range(k_max + 1)]

    def rate(b, k):
        return tokens[k] / ((2 if k else 1) + cost * b * (2 * k + 1))

    for b, k in enumerate(_per_batch(slot_schedule(k_max, shares, cost), k_max, 200), start=1):
        assert all(rate(b, k) >= rate(b, other) for other in range(k_max + 1)), (b, k)


def test_slots_past_what_pays_are_left_out_at_batch_one():
    """At K = 33 the last shares of the default decay (0.87^33: 1%) cost more than they bring, even at batch 1."""
    assert 17 <= slot_schedule(33, default_acceptance(33), DEFAULT_TOKEN_COST)[0][2] < 33


def test_no_draft_where_no_draft_is_accepted():
    """Drafts never accepted cost a forward and bring nothing: plain decoding from batch 1."""
    assert slot_schedule(17, [0.0], DEFAULT_TOKEN_COST) == [(1, 1, 0)]


def test_measured_shares_are_cut_padded_and_never_rise():
    """A share above an earlier one (a token is accepted only after every one before it) is read as the earlier;
    a position past the measured ones is never accepted, so never drafted."""
    assert slot_schedule(4, [0.9, 0.95], 0.01) == slot_schedule(4, [0.9, 0.9, 0.0, 0.0], 0.01)
    assert slot_schedule(4, [0.9, 0.95], 0.01)[0][2] == 2
    assert slot_schedule(2, [0.9, 0.8, 0.7, 0.6], 0.01) == slot_schedule(2, [0.9, 0.8], 0.01)


@pytest.mark.parametrize("k_max, shares, cost", [(0, [0.5], 0.01), (4, [], 0.01), (4, [1.5], 0.01),
                                                 (4, [0.5], 0.0)])
def test_refuses_what_has_no_schedule(k_max, shares, cost):
    with pytest.raises(ValueError, match="slot_schedule needs"):
        slot_schedule(k_max, shares, cost)
