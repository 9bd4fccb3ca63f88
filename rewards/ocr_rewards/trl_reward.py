"""Batch scoring and `ocr_reward`, the TRL reward function.

`score_many` deduplicates identical (pred, ref, task) triples, groups the rest by reference (so a
worker parses each reference once: `ocr_rewards.table.parse_table` and the gate are cached per process),
and scores the groups in worker processes that run `python -m ocr_rewards.worker`: they never import the
caller's `__main__` (an unguarded script runs once) nor inherit its torch or vLLM threads. A worker that
cannot start or dies raises `RewardWorkerError` with its reason; it never turns into zero rewards.

Bounds, so that a pathological output gets a low score and never hangs the trainer:
- `RewardSettings.max_pred_chars` (`ocr_rewards.settings`) and the tree bounds of `ocr_rewards.zhang_shasha` cap the
  work per completion;
- each completion gets `RewardSettings.timeout_s` seconds (SIGALRM in the scoring process); past it, it scores
  `TIMEOUT_SCORE` with the component `timeout`;
- the parent waits at most `timeout_s * (rounds + 2) + POOL_START_S` for the whole batch; past that the
  workers are killed (and restarted on the next call) and the unfinished completions score `TIMEOUT_SCORE`.
"""
from __future__ import annotations

import atexit
import logging
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from .result import RewardResult
from .scoring import check_task, score
from .settings import RewardSettings, settings_of
from .worker import READY, receive, send

log = logging.getLogger(__name__)

TIMEOUT_SCORE = 0.0   # the reward of a completion that ran out of time
POOL_START_S = 60.0   # slack for spawning workers (imports, numba cache) in the batch deadline
MIN_PARALLEL = 32     # smaller batches are scored in the calling process

_pools: dict[int, list] = {}  # worker count -> its running `_Worker`s, reused across batches


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


def _timed_out(task: str) -> RewardResult:
    return RewardResult(TIMEOUT_SCORE, {"timeout": 1.0}, task)


def _score_chunk(chunk: list[tuple[int, str, str, str]], settings: RewardSettings):
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
            result = _timed_out(task)
        out.append((key, result))
    return out


def _warm_worker() -> None:
    """Compile (or load from numba's disk cache) the tree-edit kernel before the first table."""
    score("<table><tr><td>a</td></tr></table>", "<table><tr><td>b</td></tr></table>", "table")


class RewardWorkerError(RuntimeError):
    """A reward worker process could not start or died; the message says why (its last stderr line)."""


class _Worker:
    """One `python -m ocr_rewards.worker` process (`ocr_rewards.worker` says why not `multiprocessing`)."""

    def __init__(self):
        self.stderr = tempfile.TemporaryFile()
        package_root = str(Path(__file__).resolve().parents[1])  # the folder that holds ocr_rewards
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root,
                                                                           os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen([sys.executable, "-m", "ocr_rewards.worker"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        self.ready = False

    def serve(self, todo: queue.SimpleQueue, done: queue.SimpleQueue, settings: RewardSettings) -> None:
        """Score chunks from `todo` until it is empty, putting each result on `done` (`self` if this dies)."""
        try:
            if not self.ready:
                self.ready = receive(self.process.stdout) == READY
            while True:
                try:
                    chunk = todo.get_nowait()
                except queue.Empty:
                    return
                send(self.process.stdin, (chunk, settings))
                done.put(receive(self.process.stdout))
        except (EOFError, OSError):
            done.put(self)

    def failure(self) -> str:
        """Why this worker ended: its exit status and the last line it wrote to stderr."""
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self.stderr.seek(0)
        lines = [line for line in self.stderr.read().decode(errors="replace").splitlines() if line.strip()]
        status = ("stopped answering" if code is None else f"was killed by signal {-code}" if code < 0
                  else f"exited with status {code}")
        return f"reward worker {status}" + (f": {lines[-1].strip()[:500]}" if lines else "")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.stderr.close()


def _pool(workers: int) -> list[_Worker]:
    if workers not in _pools:
        _pools[workers] = [_Worker() for _ in range(workers)]
    return _pools[workers]


def _drop_pool(workers: int) -> None:
    for worker in _pools.pop(workers, []):
        worker.stop()


@atexit.register
def _drop_pools() -> None:
    for workers in list(_pools):
        _drop_pool(workers)


def _score_in_workers(chunks: list, settings: RewardSettings, workers: int, deadline: float,
                      collect: Callable[[list], None]) -> None:
    """Score `chunks` in the pool of `workers` processes, calling `collect` on each chunk's results.

    Past `deadline` (time.monotonic) the pool is killed and the rest is left unscored (the caller scores it
    `TIMEOUT_SCORE`); a worker that dies, or a pool that never started, raises `RewardWorkerError`.
    """
    pool = _pool(workers)
    todo, done = queue.SimpleQueue(), queue.SimpleQueue()
    for chunk in chunks:
        todo.put(chunk)
    for worker in pool:
        threading.Thread(target=worker.serve, args=(todo, done, settings), daemon=True).start()
    finished = False
    try:
        for _ in chunks:
            result = done.get(timeout=max(0.0, deadline - time.monotonic()))
            if isinstance(result, _Worker):
                raise RewardWorkerError(result.failure())
            collect(result)
        finished = True
    except queue.Empty:
        if not all(worker.ready for worker in pool):
            raise RewardWorkerError(f"reward workers did not start within {POOL_START_S:.0f} s") from None
        log.error("reward batch ran past its deadline; its unscored items score %.1f; workers restarted",
                  TIMEOUT_SCORE)
    finally:
        if not finished:
            _drop_pool(workers)


def default_workers() -> int:
    """Worker processes for batches: the CPUs this process may use, at most 8."""
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, available or 1))


def _chunks(items: list[tuple[int, str, str, str]], size: int) -> list[list[tuple[int, str, str, str]]]:
    """Items grouped by (task, reference), each group cut into pieces of at most `size`."""
    groups = defaultdict(list)
    for item in items:
        groups[(item[3], item[2])].append(item)
    return [group[i:i + size] for group in groups.values() for i in range(0, len(group), size)]


def _validate(preds: Sequence, refs: Sequence, tasks: Sequence) -> None:
    if not len(preds) == len(refs) == len(tasks):
        raise ValueError(f"lengths differ: {len(preds)} predictions, {len(refs)} references (target), "
                         f"{len(tasks)} tasks (task_type)")
    for index, (pred, ref, task) in enumerate(zip(preds, refs, tasks)):
        if not isinstance(pred, str):
            raise ValueError(f"row {index}: prediction is {type(pred).__name__}, not str")
        if not isinstance(ref, str):
            raise ValueError(f"row {index}: reference (target) is {type(ref).__name__}, not str")
        try:
            check_task(task)
        except ValueError as err:
            raise ValueError(f"row {index}: {err}") from None


def score_many(preds: Sequence[str], refs: Sequence[str], tasks: Sequence[str],
               settings: RewardSettings | None = None, *, workers: int | None = None,
               on_progress: Callable[[int, int], None] | None = None, **changes) -> list[RewardResult]:
    """`score` over a batch: deduplicated, grouped by reference, in worker processes when it pays.

    `settings` with `changes` to its fields as in `score`; `on_progress(done, total)` is called as groups
    finish (counts of distinct items).
    """
    _validate(preds, refs, tasks)
    settings = settings_of(settings, **changes)
    timeout_s = settings.timeout_s
    keys: dict[tuple[str, str, str], int] = {}
    index_keys = [keys.setdefault((pred, ref, task), len(keys)) for pred, ref, task in zip(preds, refs, tasks)]
    items = [(key, pred, ref, task) for (pred, ref, task), key in keys.items()]
    workers = default_workers() if workers is None else max(1, workers)
    results: dict[int, RewardResult] = {}

    def collect(done: list[tuple[int, RewardResult]]) -> None:
        results.update(done)
        if on_progress is not None:
            on_progress(len(results), len(items))

    if workers == 1 or len(items) < MIN_PARALLEL:
        for chunk in _chunks(items, size=len(items) or 1):
            collect(_score_chunk(chunk, settings))
    else:
        chunks = _chunks(items, size=math.ceil(len(items) / (4 * workers)))
        deadline = time.monotonic() + timeout_s * (math.ceil(len(items) / workers) + 2) + POOL_START_S
        _score_in_workers(chunks, settings, workers, deadline, collect)
    by_key = {key: results.get(key) or _timed_out(task) for key, _, _, task in items}
    return [by_key[key] for key in index_keys]


def completion_text(completion) -> str:
    """The text of a TRL completion: a string, or chat messages (the last assistant message's text)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    messages = [m for m in completion if isinstance(m, dict)]
    replies = [m for m in messages if m.get("role") == "assistant"] or messages
    content = replies[-1].get("content", "") if replies else ""
    if isinstance(content, list):  # multimodal content parts
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and part.get("type", "text") == "text")
    return "" if content is None else str(content)


def log_means(results: Sequence[RewardResult], log_metric: Callable[[str, float], None]) -> None:
    """Per task: the mean reward (`ocr/<task>/reward`) and each component's mean (`ocr/<task>/<name>`,
    over the completions that have it)."""
    by_task = defaultdict(list)
    for result in results:
        by_task[result.task].append(result)
    for task, group in by_task.items():
        log_metric(f"ocr/{task}/reward", sum(r.value for r in group) / len(group))
        values = defaultdict(list)
        for result in group:
            for name, value in result.components.items():
                values[name].append(value)
        for name, vals in values.items():
            log_metric(f"ocr/{task}/{name}", sum(vals) / len(vals))


def log_columns(results: Sequence[RewardResult], log_extra: Callable[[str, list], None],
                names: Iterable[str] = ()) -> set[str]:
    """One column per component name in TRL's completions table (`ocr/<name>`, None where a completion has no
    such component), and `ocr/task`; returns the names logged. `names` are logged as well: TRL keeps a column
    that a later batch does not log, so every column logged once must be logged (as None) ever after."""
    names = set(names) | {name for result in results for name in result.components}
    log_extra("ocr/task", [result.task for result in results])
    for name in sorted(names):
        log_extra(f"ocr/{name}", [result.components.get(name) for result in results])
    return names


class OcrReward:
    """The task-aware OCR reward with TRL's reward-function signature (picklable, named `ocr_reward`).

    >>> OcrReward(workers=1)(None, ["<table><tr><td>a</td></tr></table>"],
    ...                      target=["<table><tr><td>a</td></tr></table>"], task_type=["table"])
    [1.0]
    """

    def __init__(self, settings: RewardSettings | None = None, *, workers: int | None = None, **changes):
        self.settings, self.workers = settings_of(settings, **changes), workers
        self.logged_columns: set[str] = set()  # component columns logged to TRL so far (`log_columns`)
        self.__name__ = "ocr_reward"

    def __call__(self, prompts, completions, target, task_type, log_metric=None, log_extra=None,
                 **kwargs) -> list[float]:
        """The rewards; under TRL also the per-task means (`log_metric`) and each completion's components
        (`log_extra`: columns of the completions table that `log_completions` prints and saves)."""
        texts = [completion_text(c) for c in completions]
        results = score_many(texts, target, task_type, self.settings, workers=self.workers)
        if log_metric is not None:
            log_means(results, log_metric)
        if log_extra is not None:
            self.logged_columns = log_columns(results, log_extra, self.logged_columns)
        return [result.value for result in results]


ocr_reward = OcrReward()
