"""Scoring under a time bound: each completion gets `RewardSettings.timeout_s`, past it `TIMEOUT_SCORE`.

Used in the calling process (small batches) and in the reward workers (`ocr_rewards.worker`) alike.
"""
from __future__ import annotations

import logging
import signal
import threading

from .result import RewardResult
from .scoring import score
from .settings import RewardSettings

log = logging.getLogger(__name__)

TIMEOUT_SCORE = 0.0   # the reward of a completion that ran out of time


class _Timeout(BaseException):
    """Raised by the alarm; a BaseException so that no `except Exception` on the way swallows it."""


class _Alarm:
    """A one-shot SIGALRM timer (main thread only; elsewhere it never rings) that raises `_Timeout`
    once. `expired` stays True even when code on the way swallowed the exception (a gc callback does)."""

    def __init__(self, seconds: float):
        self.seconds, self.expired = seconds, False
        self.usable = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")

    def _ring(self, signum, frame):
        if not self.expired:
            self.expired = True
            raise _Timeout

    def __enter__(self):
        if self.usable:
            self.previous = signal.signal(signal.SIGALRM, self._ring)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc_info):
        if self.usable:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
            finally:
                signal.signal(signal.SIGALRM, self.previous)
        return False


def timed_out(task: str) -> RewardResult:
    return RewardResult(TIMEOUT_SCORE, {"timeout": 1.0}, task)


def score_chunk(chunk: list[tuple[int, str, str, str]], settings: RewardSettings):
    """Score (key, pred, ref, task) items; returns [(key, RewardResult)]."""
    out = []
    for key, pred, ref, task in chunk:
        alarm = _Alarm(settings.timeout_s)
        try:
            with alarm:
                result = score(pred, ref, task, settings)
        except _Timeout:
            pass
        if alarm.expired:
            log.warning("reward of item %d (%s) ran past %.2f s; scored %.1f", key, task, settings.timeout_s,
                        TIMEOUT_SCORE)
            result = timed_out(task)
        out.append((key, result))
    return out


def warm_up() -> None:
    """Compile (or load from numba's disk cache) the tree-edit kernel before the first table."""
    score("<table><tr><td>a</td></tr></table>", "<table><tr><td>b</td></tr></table>", "table")
