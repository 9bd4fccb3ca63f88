"""The degeneration gate that multiplies every reward (docs/spec.md §4).

`g(x) = min(rho8(x), max(0, 1 - (L_run(x) - 20) / 200))`: `rho8` is the share of distinct 8-grams among
the 8-grams of x's tokens (tags, LaTeX commands, words, single symbols; 1.0 below 8 tokens) and `L_run`
the longest run of one repeated character. The relative gate `min(1, g(pred) / g(ref))` (`g(pred)` when
`g(ref) == 0`) spares outputs exactly as repetitive as their reference; the absolute gate is `g(pred)`.
"""
from __future__ import annotations

import functools
import re

import numpy as np

GATES = ("relative", "absolute")  # the default is `RewardSettings.gate`
NGRAM = 8
RUN_FREE = 20     # runs up to this length cost nothing (rules, dotted leaders)
RUN_SPAN = 200    # each character beyond RUN_FREE lowers the gate by 1/RUN_SPAN: 220 or more gives 0

_TOKEN = re.compile(r"</?[A-Za-z][^<>]{0,100}>|\\[A-Za-z]+|\\.|\w+|\S", re.DOTALL)


def distinct_ngram_share(text: str, n: int = NGRAM) -> float:
    """Distinct n-grams / all n-grams of the tokens of `text`; 1.0 when there are fewer than n tokens."""
    tokens = _TOKEN.findall(text)
    total = len(tokens) - n + 1
    if total <= 0:
        return 1.0
    return len({tuple(tokens[i:i + n]) for i in range(total)}) / total


def longest_run(text: str) -> int:
    """Length of the longest run of one repeated character (0 for the empty string)."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    if codes.size == 0:
        return 0
    run_ends = np.flatnonzero(codes[1:] != codes[:-1])  # last index of every run but the final one
    return int(np.diff(np.concatenate(([-1], run_ends, [codes.size - 1]))).max())


@functools.lru_cache(maxsize=4096)
def degeneration(text: str) -> float:
    """`g(x)` in [0, 1]: 1 for ordinary text, near 0 for loops and long runs of one character.

    >>> degeneration("a" * 300)
    0.0
    """
    run_factor = max(0.0, 1.0 - (longest_run(text) - RUN_FREE) / RUN_SPAN)
    return min(1.0, distinct_ngram_share(text), run_factor)


def check_gate(mode: str) -> None:
    """Raise a ValueError naming the valid gates when `mode` is not one of them."""
    if mode not in GATES:
        raise ValueError(f"unknown gate {mode!r}; valid gates: {', '.join(GATES)}")


def gate(pred: str, ref: str, mode: str) -> float:
    """The gate factor for a prediction: `mode` "relative" (to its reference) or "absolute"."""
    check_gate(mode)
    g_pred = degeneration(pred)
    if mode == "absolute":
        return g_pred
    g_ref = degeneration(ref)
    return g_pred if g_ref == 0 else min(1.0, g_pred / g_ref)
