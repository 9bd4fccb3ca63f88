"""A reward worker: `python -m ocr_rewards.worker`, scoring chunks sent over its stdin.

Workers are plain subprocesses that run this module, not `multiprocessing` children: a spawned child
imports the caller's `__main__` again (a user's TRL script without an `if __name__ == "__main__":` guard would
run once per worker, without end), and a forked one inherits the caller's torch and vLLM threads. A module
of this package, started by its name, shares nothing with the caller but the messages.

Protocol (`send` / `receive`): length-prefixed pickles. The worker first answers `READY` (after compiling
the tree-edit kernel), then one list of (key, RewardResult) per (chunk, settings) it reads; it exits at the
end of its input. Its real stdout carries only messages (stray prints go to stderr).
"""
from __future__ import annotations

import os
import pickle
import signal
import struct
import sys

READY = "ready"
_LENGTH = struct.Struct("!Q")


def send(stream, message) -> None:
    """Write one message to a binary stream."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def receive(stream):
    """Read one message from a binary stream; EOFError at its end."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    size = _LENGTH.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle; it ends the workers
    messages = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a print anywhere below lands on stderr, not inside a message
    sys.stdout = sys.stderr
    from .trl_reward import _score_chunk, _warm_worker

    _warm_worker()
    send(messages, READY)
    while True:
        try:
            chunk, settings = receive(sys.stdin.buffer)
        except EOFError:
            return
        send(messages, _score_chunk(chunk, settings))


if __name__ == "__main__":
    main()
