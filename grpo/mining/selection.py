"""Which mined prompts to keep (docs/spec.md §8): per-prompt reward statistics, the zero-variance drop, the ranking.

Ranking rule (higher first, ties by pool order), per prompt, independent of the other prompts so shards
rank alike:

    score = hard_weight * (1 - reward_mean)
          + length_weight * min(ref_chars / length_scale, 1)
          + table_bonus * [task_type == "table"]

`ref_chars` is the length of the reference in characters. Presets (`PREFER`): `long-tables` (all three
terms, weight 1, length_scale 1900 = the paper's median mined reference), `hard` (only low mean reward),
`pool-order` (no ranking).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from grpo.rollouts.sampling import Rollout
STAT_COLUMNS = ("reward_mean", "reward_std", "reward_min", "reward_max", "rewards", "completion_tokens_mean",
                "truncated", "ref_chars", "mine_score")
# what decides the sampled rollouts: a resumed run must agree on all of these


@dataclass(frozen=True)
class RankRule:
    """Weights of the ranking score (see the module docstring)."""

    hard_weight: float = 1.0
    length_weight: float = 1.0
    length_scale: float = 1900.0   # characters: the paper's median reference length after mining
    table_bonus: float = 1.0

    def __post_init__(self):
        for name in ("hard_weight", "length_weight", "length_scale", "table_bonus"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.length_scale <= 0:
            raise ValueError(f"length_scale is a length in characters (> 0), got {self.length_scale}")

    def score(self, reward_mean: float, ref_chars: int, task_type: str) -> float:
        return (self.hard_weight * (1.0 - reward_mean)
                + self.length_weight * min(ref_chars / self.length_scale, 1.0)
                + self.table_bonus * (task_type == "table"))


PREFER = {
    "long-tables": RankRule(),
    "hard": RankRule(length_weight=0.0, table_bonus=0.0),
    "pool-order": RankRule(hard_weight=0.0, length_weight=0.0, table_bonus=0.0),
}


def prompt_stats(rewards: list[float], rollouts: list[Rollout]) -> dict:
    """Per-prompt statistics over its k rollouts (std is the population std, as a group sees it)."""
    k = len(rewards)
    mean = sum(rewards) / k
    return {
        "reward_mean": mean,
        "reward_std": (sum((r - mean) ** 2 for r in rewards) / k) ** 0.5,
        "reward_min": min(rewards),
        "reward_max": max(rewards),
        "rewards": list(rewards),
        "completion_tokens_mean": sum(r.n_tokens for r in rollouts) / k,
        "truncated": sum(r.truncated for r in rollouts),
    }


def is_dropped(stats: dict, min_std: float) -> bool:
    """Zero group advantage: all rewards equal, or std at most `min_std`."""
    return stats["reward_max"] == stats["reward_min"] or stats["reward_std"] <= min_std


def select(records: dict[int, dict], rank: RankRule, min_std: float, keep: int | None) -> list[int]:
    """Pool indices kept, best first: drop zero-variance prompts, rank by `rank`, keep the top `keep`."""
    live = [i for i, rec in records.items() if not is_dropped(rec, min_std)]
    live.sort(key=lambda i: (-records[i]["mine_score"], i))
    return live if keep is None else live[:keep]
