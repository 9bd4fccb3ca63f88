"""How many draft slots a self-drafted engine verifies per step, by the number of requests in the step.

A self-drafted step over b requests at K draft slots runs two forwards of the policy's weights: the draft forward
(K tokens a request: x0 and K - 1 masks) and the verify forward (K + 1 tokens a request). It yields, per request,
the bonus token plus the accepted drafts. At K = 0 it is plain decoding: one forward of one token a request.

With `acceptance[i]` the share of rounds whose draft token i is accepted (`rollout/accepted_at_{i}`; a token is
accepted only after every one before it, so the shares do not rise with i) and a forward of n tokens costing
`fixed + per_token * n`, in units of `fixed` (`token_cost` = per_token / fixed):

    tokens(K)   = b * (1 + acceptance[0] + ... + acceptance[K - 1])
    cost(b, K)  = 2 + token_cost * b * (2K + 1)        (K >= 1)
    cost(b, 0)  = 1 + token_cost * b
    K*(b)       = argmax over 0 <= K <= K_max of tokens(K) / cost(b, K)     (the fewer slots on a tie)

At small b the fixed cost of a forward dominates, so every slot that may be accepted pays: K*(1) is K_max (the
tail of a rollout batch, when few requests are left). As b grows each slot costs 2 * token_cost * b and brings
b * acceptance[K]: K* falls, to plain decoding once drafting costs more than it saves. K* never rises with b,
because tokens(K) / (2K + 1) falls with K when the shares do not rise.
"""
from __future__ import annotations

from itertools import accumulate
from typing import Any

# Shares of rounds accepting draft token i when none are measured: i + 1 draft tokens accepted with probability
# 0.87^(i+1), about 6.1 accepted a round at K = 17 (issue 52: 6.136 on the text recipe).
DEFAULT_DECAY = 0.87
# The per-token cost of a forward over its fixed cost: what issue 52's text-recipe figure at batch 32 (plain over
# self-drafted time per token 0.69 at K = 17, 6.136 accepted a round) gives under the cost model above.
DEFAULT_TOKEN_COST = 0.0106
# The largest batch the schedule spells out; vLLM carries its last K to every larger batch.
MAX_BATCH = 4096


def default_acceptance(k_max: int, decay: float = DEFAULT_DECAY) -> list[float]:
    """`acceptance` when none was measured: draft token i accepted in a share decay^(i+1) of rounds."""
    return [decay ** (i + 1) for i in range(k_max)]


def slot_schedule(k_max: int, acceptance: list[float], token_cost: float,
                  max_batch: int = MAX_BATCH) -> list[tuple[int, int, int]]:
    """vLLM's `num_speculative_tokens_per_batch_size`: inclusive batch ranges `(b_start, b_end, K)` from batch 1,
    K = K*(b) of the module's rule, up to the first batch that decodes plainly (or `max_batch`).

    `acceptance` is cut to `k_max` positions, padded with 0 (a position not measured is never taken as
    accepted) and made non-increasing; ValueError
    on an empty list, a share outside [0, 1] or a `token_cost` <= 0.
    """
    if k_max < 1 or not acceptance or not all(0 <= a <= 1 for a in acceptance) or token_cost <= 0:
        raise ValueError(f"slot_schedule needs k_max >= 1, shares in [0, 1] and token_cost > 0 (got k_max "
                         f"{k_max}, acceptance {acceptance}, token_cost {token_cost})")
    shares = accumulate((list(acceptance) + [0.0] * k_max)[:k_max], min)  # made non-increasing
    tokens = list(accumulate(shares, initial=1.0))  # tokens(K) / b for K = 0 .. k_max

    def best(b: int) -> int:
        rate = [tokens[k] / ((2 if k else 1) + token_cost * b * (2 * k + 1)) for k in range(k_max + 1)]
        return max(range(k_max + 1), key=lambda k: (rate[k], -k))

    schedule: list[tuple[int, int, int]] = []
    for b in range(1, max_batch + 1):
        k = best(b)
        if schedule and schedule[-1][2] == k:
            schedule[-1] = (schedule[-1][0], b, k)
        else:
            schedule.append((b, b, k))
        if k == 0:
            break
    return schedule


def recipe_slots(config: Any, bd_size: int) -> list[tuple[int, int, int]] | None:
    """A self-drafted engine's draft slots by batch size for a recipe and a checkpoint of block size `bd_size`:
    `slot_schedule` up to the recipe's draft length (`vllm_draft_length`, else B + 1) with its
    `vllm_draft_acceptance` and `vllm_draft_token_cost` (None taking `default_acceptance` and
    `DEFAULT_TOKEN_COST`), or None, the full length at every step, where the recipe sets `vllm_fixed_drafting`."""
    if config.vllm_fixed_drafting:
        return None
    from grpo.rollouts.engine_selfspec import draft_length

    k_max = draft_length(bd_size, config.vllm_draft_length)
    return slot_schedule(k_max, config.vllm_draft_acceptance or default_acceptance(k_max),
                         config.vllm_draft_token_cost or DEFAULT_TOKEN_COST)
