"""Exact AR sampling distributions of models small enough to enumerate every output, and the chi-square tests the
sampling tests fit samples with."""
from __future__ import annotations

import torch


@torch.inference_mode()
def exact_ar_distribution(model, prompt: list[int], temperature: float, max_new: int, eos: int) -> dict[tuple, float]:
    """Probability of every possible output of AR sampling from HF `model` after `prompt` at `temperature` (stop at
    `eos` or `max_new` tokens), from its causal probabilities in float64."""
    def next_probs(prefix):
        logits = model(input_ids=torch.tensor([prompt + list(prefix)])).logits[0, -1]
        return (logits.double() / temperature).softmax(-1)

    dist, frontier = {}, {(): 1.0}
    while frontier:
        grown = {}
        for prefix, mass in frontier.items():
            for token, p in enumerate(next_probs(prefix).tolist()):
                out = prefix + (token,)
                target = dist if token == eos or len(out) == max_new else grown
                target[out] = target.get(out, 0.0) + mass * p
        frontier = grown
    return dist


def tally_outputs(outputs) -> dict[tuple, int]:
    """How often each output (a sequence of token ids) occurs."""
    counts: dict[tuple, int] = {}
    for tokens in outputs:
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    return counts


def _p_value(stat: float, dof: int) -> float:
    """Chi-square survival function: the regularized upper incomplete gamma function."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def chi_square_p(counts: dict, dist: dict, n: int) -> float:
    """Goodness-of-fit p-value of `counts` (n samples) against `dist`, cells with expected count < 5 pooled."""
    stat, cells, rare_obs, rare_exp = 0.0, 0, 0, 0.0
    assert set(counts) <= set(dist), "a sample the AR distribution cannot produce"
    for out, p in dist.items():
        expected, observed = n * p, counts.get(out, 0)
        if expected < 5:
            rare_obs, rare_exp = rare_obs + observed, rare_exp + expected
            continue
        stat += (observed - expected) ** 2 / expected
        cells += 1
    if rare_exp > 0:
        stat += (rare_obs - rare_exp) ** 2 / rare_exp
        cells += 1
    return _p_value(stat, cells - 1)


def two_sample_chi_square_p(first: dict, second: dict) -> float:
    """Homogeneity p-value of two tallies of the same number of samples, cells with fewer than 10 samples in all
    pooled: with equal totals the statistic is the sum of (a - b)^2 / (a + b)."""
    assert sum(first.values()) == sum(second.values())
    stat, cells, rare = 0.0, 0, [0, 0]
    for out in set(first) | set(second):
        a, b = first.get(out, 0), second.get(out, 0)
        if a + b < 10:
            rare = [rare[0] + a, rare[1] + b]
            continue
        stat += (a - b) ** 2 / (a + b)
        cells += 1
    if sum(rare) > 0:
        stat += (rare[0] - rare[1]) ** 2 / sum(rare)
        cells += 1
    return _p_value(stat, cells - 1)
