"""The think block of a completion, removed before scoring as GravityOCR removes it from decoded text.

GLM-OCR's tokenizer does not mark `<think>` special, so decoding with `skip_special_tokens` keeps the tags.
GravityOCR (`src/models/glm_ocr_dllm.py`, `src/fast_sampling.py`) deletes every closed `<think>…</think>`
block, wherever it stands, with the whitespace after it: the regex `THINK_BLOCK`, applied with `re.sub`; an
unclosed `<think>` stays. `THINK_MODES` names the two readings of `RewardSettings.think`: "strip" (that rule,
the default) and "keep" (score the text as is).

Example:
    >>> strip_think("<think>\\n</think>\\nHello world")
    ('Hello world', True)
    >>> strip_think("a<think>x</think> b <think>unclosed")
    ('ab <think>unclosed', True)
"""
from __future__ import annotations

import re

THINK_MODES = ("strip", "keep")  # the default is `RewardSettings.think`
OPEN, CLOSE = "<think>", "</think>"
THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)  # GravityOCR's rule, restated by `strip_think`
_SPACE = re.compile(r"\s*")


def strip_think(text: str) -> tuple[str, bool]:
    """`text` without its closed think blocks (and the whitespace after each), and whether one was removed.

    The same result as `THINK_BLOCK.sub("", text)`, in linear time: the regex rescans the rest of the text
    from every `<think>` that has no `</think>` after it, which is quadratic on a flood of openings.
    """
    parts, pos = [], 0
    while (start := text.find(OPEN, pos)) >= 0 and (end := text.find(CLOSE, start + len(OPEN))) >= 0:
        parts.append(text[pos:start])
        pos = _SPACE.match(text, end + len(CLOSE)).end()
    if not parts:
        return text, False
    parts.append(text[pos:])
    return "".join(parts), True


def check_think(mode: str) -> None:
    """Raise a ValueError naming the valid modes when `mode` is not one of them."""
    if mode not in THINK_MODES:
        raise ValueError(f"unknown think mode {mode!r}; valid modes: {', '.join(THINK_MODES)}")
