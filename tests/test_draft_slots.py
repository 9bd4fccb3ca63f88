"""The draft-slot rule (`grpo.rollouts.draft_slots`): full length at batch 1, fewer slots as the batch grows, plain
decoding where drafting cannot pay, in the ranges vLLM's dynamic speculative decoding takes."""
import pytest
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

from grpo.rollouts.draft_slots import DEFAULT_STEP_COST, StepCost, default_acceptance, slot_schedule


def _per_batch(schedule, k_max, up_to=512):
    """K at batch sizes 1..up_to, as vLLM's scheduler looks it up."""
    return build_dynamic_sd_schedule_lookup(schedule, up_to, k_max)[1:]


CHEAP_SLOTS = StepCost(plain_request=0.02, round_fixed=2.0, round_request=0.02, round_slot=0.004)


@pytest.mark.parametrize("k_max", [2, 5, 17, 33])
@pytest.mark.parametrize("cost", [CHEAP_SLOTS, DEFAULT_STEP_COST])
def test_never_more_slots_as_the_batch_grows(k_max, cost):
    """Fewer slots as the batch grows: with cheap slots (up to) the full length at batch 1 and drafting at any batch
    (a request's slots cost less than they bring), with the measured costs plain decoding from some batch."""
    schedule = slot_schedule(k_max, default_acceptance(k_max), cost)
    ks = _per_batch(schedule, k_max, 4096)
    assert all(a >= b for a, b in zip(ks, ks[1:]))
    if cost is CHEAP_SLOTS:
        assert ks[0] == min(k_max, 30) and ks[-1] > 0  # 0.87^31 = 1.3% of a token does not pay a slot
    else:
        assert ks[-1] == 0
    assert schedule[0][0] == 1 and schedule[-1][1] == 4096
    assert all(end + 1 == nxt[0] for (_, end, _), nxt in zip(schedule, schedule[1:]))


def test_the_measured_cost_drafts_only_where_few_requests_run():
    """On the text recipe's measured costs: nearly the full length at batch 1 (the last of 17 default shares, 0.87^17
    = 9%, do not pay), plain decoding from batch 8."""
    ks = _per_batch(slot_schedule(17, default_acceptance(17), DEFAULT_STEP_COST), 17, 64)
    assert ks[0] >= 15 and ks[6] > 0 and ks[7:] == [0] * 57


def test_each_slot_is_kept_exactly_where_it_pays():
    """At every batch the chosen K gives more tokens per unit of cost than any other."""
    k_max, cost = 9, StepCost(plain_request=0.05, round_fixed=2.5, round_request=0.08, round_slot=0.03)
    shares = [0.9, 0.8, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05]
    tokens = [1 + sum(shares[:k]) for k in range(k_max + 1)]

    def rate(b, k):
        return tokens[k] / (1 + 0.05 * b if k == 0 else 2.5 + b * (0.08 + 0.03 * k))

    ks = _per_batch(slot_schedule(k_max, shares, cost), k_max, 200)
    assert len(set(ks)) > 3  # several lengths, plain decoding among them
    for b, k in enumerate(ks, start=1):
        assert all(rate(b, k) >= rate(b, other) for other in range(k_max + 1)), (b, k)


def test_slots_past_what_pays_are_left_out_at_batch_one():
    """At K = 33 the last shares of the default decay (0.87^33: 1%) cost more than they bring, even at batch 1."""
    assert 10 <= slot_schedule(33, default_acceptance(33), CHEAP_SLOTS)[0][2] < 33


def test_no_draft_where_no_draft_is_accepted():
    """Drafts never accepted cost a forward and bring nothing: plain decoding from batch 1."""
    assert slot_schedule(17, [0.0], DEFAULT_STEP_COST) == [(1, 4096, 0)]


def test_measured_shares_are_cut_padded_and_never_rise():
    """A share above an earlier one (a token is accepted only after every one before it) is read as the earlier;
    a position past the measured ones is never accepted, so never drafted."""
    assert slot_schedule(4, [0.9, 0.95], CHEAP_SLOTS) == slot_schedule(4, [0.9, 0.9, 0.0, 0.0], CHEAP_SLOTS)
    assert slot_schedule(4, [0.9, 0.95], CHEAP_SLOTS)[0][2] == 2
    assert slot_schedule(2, [0.9, 0.8, 0.7, 0.6], CHEAP_SLOTS) == slot_schedule(2, [0.9, 0.8], CHEAP_SLOTS)


@pytest.mark.parametrize("k_max, shares, cost", [(0, [0.5], CHEAP_SLOTS), (4, [], CHEAP_SLOTS),
                                                 (4, [1.5], CHEAP_SLOTS), (4, [0.5], StepCost(0.02, 2.0, 0.02, 0.0))])
def test_refuses_what_has_no_schedule(k_max, shares, cost):
    with pytest.raises(ValueError, match="slot_schedule needs"):
        slot_schedule(k_max, shares, cost)
