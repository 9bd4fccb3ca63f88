"""The value a reward returns, with the parts that explain it."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RewardResult:
    """A reward in [0, 1] and its named components (TEDS_s, s_cell, p_row, sim, v, g, …).

    >>> RewardResult(0.5, {"sim": 0.5, "g": 1.0}, "text").value
    0.5
    """

    value: float
    components: dict[str, float] = field(default_factory=dict)
    task: str = ""

    def as_dict(self) -> dict:
        return {"task": self.task, "value": self.value, "components": dict(self.components)}
