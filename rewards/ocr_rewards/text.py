"""Text reward: `1 - NED` of the OmniDocBench-normalized strings."""
from __future__ import annotations

from .normalize import normalize_text
from .similarity import similarity


def score_text(pred: str, ref: str) -> tuple[float, dict[str, float]]:
    """Base reward (before the gate) and its components.

    >>> score_text("Hello, world!", "hello world")
    (0.9, {'sim': 0.9})
    """
    sim = similarity(normalize_text(pred), normalize_text(ref))
    return sim, {"sim": sim}
