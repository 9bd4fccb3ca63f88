"""`RewardSettings`: how a reward is computed (the gate, the table bonus's reading, the think block) and its
limits, in one value.

Every scorer takes one (`score`, `score_many`, `OcrReward`), and so do the commands and runs built on them
(`gravity-grpo score`, `mine`, `train` and its TPF probe). The defaults live here only.

Example:
    >>> RewardSettings(table_bonus="scaled").gate
    'relative'
    >>> RewardSettings(gate="off")
    Traceback (most recent call last):
    ValueError: unknown gate 'off'; valid gates: relative, absolute
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from .gate import GATES, check_gate
from .postprocess import POSTPROCESS_MODES, check_postprocess
from .table import TABLE_BONUS, check_table_bonus
from .think import THINK_MODES, check_think

# A prediction longer than this scores 0 without being parsed (flag `too_long`). The policy's completions
# stop at 8,448 tokens (docs/spec.md §7), a few characters each, so only a runaway output comes near it.
MAX_PRED_CHARS = 65_536
TIMEOUT_S = 10.0  # per completion in a batch; a 100x10 table scores in well under 0.1 s


@dataclass(frozen=True)
class RewardSettings:
    """The reading of the reward (`gate`, `table_bonus`, `think`, `postprocess`) and its bounds (`max_pred_chars`,
    `timeout_s`)."""

    gate: str = "relative"               # degeneration gate (ocr_rewards.gate): relative to the reference's
    table_bonus: str = "clipped"         # the table shape bonus inside the clip, as published (ocr_rewards.table)
    think: str = "strip"                 # closed think blocks removed before scoring, as GravityOCR (ocr_rewards.think)
    postprocess: str = "none"            # "gravityocr": GravityOCR's formatting first (ocr_rewards.postprocess)
    max_pred_chars: int = MAX_PRED_CHARS  # longer predictions score 0 unparsed
    timeout_s: float = TIMEOUT_S         # per completion in a batch (ocr_rewards.trl_reward)

    def __post_init__(self) -> None:
        check_gate(self.gate)
        check_table_bonus(self.table_bonus)
        check_think(self.think)
        check_postprocess(self.postprocess)
        if not self.max_pred_chars >= 1:
            raise ValueError(f"max_pred_chars must be >= 1, got {self.max_pred_chars}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")

    def replace(self, **changes) -> "RewardSettings":
        """These settings with `changes` (field names) applied."""
        return dataclasses.replace(self, **changes) if changes else self


DEFAULT = RewardSettings()
# The TPF probe's held-out reward is always read the published way (whatever reading the run trains on), so
# held-out rewards of runs with different `table_bonus` or `gate` compare on one scale.
HELD_OUT = DEFAULT


def settings_of(settings: RewardSettings | None = None, **changes) -> RewardSettings:
    """`settings` (default `DEFAULT`) with `changes`: what the scorers accept as `settings=` or field keywords."""
    return (settings or DEFAULT).replace(**changes)


@dataclass(kw_only=True)  # keyword-only: a config's own fields without defaults may come after them
class RewardFields:
    """The reward's reading as config fields (`gate`, `table_bonus`, `think`, `reward_postprocess`), shared by the
    configs of train and mine."""

    table_bonus: Literal[TABLE_BONUS] = field(default=DEFAULT.table_bonus, metadata={
        "help": "Reading of the table reward's shape bonus (docs/spec.md §4): 'clipped' (inside the clip, as published) "
                "or 'scaled' (outside it, divided by 1.1, so only an exact table scores 1.0)."})
    gate: Literal[GATES] = field(default=DEFAULT.gate, metadata={
        "help": "Degeneration gate of the reward (ocr_rewards.gate): 'relative' (to the reference's) or 'absolute'. "
                "The TPF probe's held-out reward keeps the published reading (ocr_rewards.settings.HELD_OUT)."})
    think: Literal[THINK_MODES] = field(default=DEFAULT.think, metadata={
        "help": "The completion's think block (ocr_rewards.think): 'strip' (closed <think>...</think> blocks and the "
                "whitespace after them removed before scoring, as GravityOCR does) or 'keep' (scored as text)."})

    reward_postprocess: Literal[POSTPROCESS_MODES] = field(default=DEFAULT.postprocess, metadata={
        "help": "The completion before scoring (ocr_rewards.postprocess): 'none' (as decoded) or 'gravityocr' "
                "(GravityOCR's formatting of a region first: runs of dots and underscores capped at 3, a repetition "
                "loop cut, formulas wrapped in $$)."})

    @property
    def reward_settings(self) -> RewardSettings:
        """The `RewardSettings` these fields name."""
        return RewardSettings(gate=self.gate, table_bonus=self.table_bonus, think=self.think,
                              postprocess=self.reward_postprocess)
