"""Paired statistics of a multi-seed A/B (`grpo.compare`): TPF ratios, reward differences, McNemar.

Every arm is evaluated on the same probe prompts with the same seeds, so arm B is compared with the reference
arm A seed by seed and prompt by prompt. Intervals are percentile bootstraps over both seeds and prompts
(each resample draws seeds, and prompts shared by the drawn seeds), so they carry the seed-to-seed spread of
training as well as the choice of probe prompts.

Example:
    >>> a = {0: [{"tokens": 8, "forwards": 4, "reward": 0.5}], 1: [{"tokens": 9, "forwards": 3, "reward": 0.6}]}
    >>> b = {0: [{"tokens": 8, "forwards": 2, "reward": 0.5}], 1: [{"tokens": 9, "forwards": 3, "reward": 0.7}]}
    >>> s = paired_summary(a, b, samples=200)
    >>> round(s["tpf_ratio"], 3), s["tpf_wins"], round(s["reward_diff"], 2)
    (1.414, 1, 0.05)
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

SAMPLES = 4000  # bootstrap resamples


def _arrays(runs: dict[int, list[dict]], seeds: list[int], key: str) -> np.ndarray:
    return np.array([[float(r[key]) for r in runs[s]] for s in seeds])  # (seeds, prompts)


def _check(a: dict[int, list[dict]], b: dict[int, list[dict]]) -> list[int]:
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("no seed evaluated in both arms")
    lengths = {len(a[s]) for s in seeds} | {len(b[s]) for s in seeds}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"every run needs the same probe prompts; got {sorted(lengths)} rows")
    return seeds


def _interval(values: np.ndarray) -> tuple[float, float]:
    return float(np.quantile(values, 0.025)), float(np.quantile(values, 0.975))


def bootstrap(statistic, sizes: tuple[int, ...], samples: int = SAMPLES, seed: int = 0) -> np.ndarray:
    """`statistic(*indices)` on `samples` resamples: for each axis of length `sizes[k]`, indices drawn with
    replacement (seeds, prompts, ...). The package's one bootstrap."""
    rng = np.random.default_rng(seed)
    return np.array([statistic(*(rng.integers(0, n, n) for n in sizes)) for _ in range(samples)])


def paired_interval(before: list[float], after: list[float], samples: int = SAMPLES,
                    seed: int = 0) -> dict[str, float]:
    """Mean of `after - before` over paired items with its 95% bootstrap interval (`low`, `high`)."""
    if len(before) != len(after) or not before:
        raise ValueError(f"need equally many paired values, got {len(before)} and {len(after)}")
    diffs = np.asarray(after, dtype=float) - np.asarray(before, dtype=float)
    low, high = _interval(bootstrap(lambda i: diffs[i].mean(), (len(diffs),), samples, seed))
    return {"before": float(np.mean(before)), "after": float(np.mean(after)), "diff": float(diffs.mean()),
            "low": low, "high": high, "n": len(diffs)}


def paired_summary(a: dict[int, list[dict]], b: dict[int, list[dict]], samples: int = SAMPLES,
                   seed: int = 0) -> dict[str, Any]:
    """Arm `b` against the reference arm `a` ({seed: probe rows in prompt order}, rows with `tokens`,
    `forwards`, `reward`): geometric-mean TPF ratio b/a over seeds (TPF as `tpf_of` counts it), mean reward difference b - a, their
    95% intervals (bootstrap over seeds and prompts), per-seed values and wins (seeds where b is ahead)."""
    seeds = _check(a, b)
    tok_a, fwd_a, rew_a = (_arrays(a, seeds, k) for k in ("tokens", "forwards", "reward"))
    tok_b, fwd_b, rew_b = (_arrays(b, seeds, k) for k in ("tokens", "forwards", "reward"))
    tok_a, tok_b = tok_a - 1, tok_b - 1   # the tokens after x0, as `grpo.decoding.tpf.tpf_of` counts (AR = 1.0)

    def stats(si: np.ndarray, pi: np.ndarray) -> tuple[float, float]:
        ta = tok_a[np.ix_(si, pi)].sum(1) / fwd_a[np.ix_(si, pi)].sum(1)
        tb = tok_b[np.ix_(si, pi)].sum(1) / fwd_b[np.ix_(si, pi)].sum(1)
        return float(np.exp(np.log(tb / ta).mean())), float((rew_b - rew_a)[np.ix_(si, pi)].mean())

    n_seeds, n_prompts = len(seeds), tok_a.shape[1]
    every = np.arange(n_seeds), np.arange(n_prompts)
    ratio, diff = stats(*every)
    boot = bootstrap(stats, (n_seeds, n_prompts), samples, seed)
    per_seed_ratio = (tok_b.sum(1) / fwd_b.sum(1)) / (tok_a.sum(1) / fwd_a.sum(1))
    per_seed_diff = (rew_b - rew_a).mean(1)
    return {"seeds": seeds, "prompts": n_prompts,
            "tpf_ratio": ratio, "tpf_ratio_interval": _interval(boot[:, 0]),
            "reward_diff": diff, "reward_diff_interval": _interval(boot[:, 1]),
            "per_seed_tpf_ratio": per_seed_ratio.tolist(), "per_seed_reward_diff": per_seed_diff.tolist(),
            "tpf_wins": int((per_seed_ratio > 1).sum()), "reward_wins": int((per_seed_diff > 0).sum()),
            "tpf_a": (tok_a.sum(1) / fwd_a.sum(1)).tolist(), "tpf_b": (tok_b.sum(1) / fwd_b.sum(1)).tolist()}


def change_from_start(start: list[dict], runs: dict[int, list[dict]], samples: int = SAMPLES,
                      seed: int = 0) -> dict[str, Any]:
    """Held-out reward of each seed's final checkpoint minus the starting model's, paired by prompt: the mean
    over seeds and prompts, its 95% interval (bootstrap over seeds and prompts) and the per-seed means."""
    return paired_summary({s: start for s in runs}, runs, samples, seed)


def mcnemar(before: list[bool], after: list[bool]) -> dict[str, Any]:
    """Exact two-sided McNemar test of paired outcomes (True: wrong): counts and the binomial p-value of the
    discordant pairs (`fixed`: wrong before, right after; `broken`: right before, wrong after)."""
    if len(before) != len(after):
        raise ValueError(f"need paired outcomes, got {len(before)} and {len(after)}")
    fixed = sum(b and not a for b, a in zip(before, after))
    broken = sum(a and not b for b, a in zip(before, after))
    n = fixed + broken
    tail = sum(math.comb(n, k) for k in range(min(fixed, broken) + 1)) / 2 ** n if n else 1.0
    return {"n": len(before), "wrong_before": sum(before), "wrong_after": sum(after),
            "fixed": fixed, "broken": broken, "p": min(1.0, 2 * tail)}
