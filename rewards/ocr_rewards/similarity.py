"""Normalized edit similarity, the building block of every reward."""
from __future__ import annotations

from rapidfuzz.distance import Levenshtein


def similarity(a: str, b: str) -> float:
    """`1 - Levenshtein(a, b) / max(len(a), len(b))`; 1.0 when both are empty.

    >>> similarity("kitten", "sitting")
    0.5714285714285714
    """
    return 1.0 - Levenshtein.normalized_distance(a, b)
