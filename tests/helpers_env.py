"""The environment for a test's child process.

TRL's colocated vLLM engine writes `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` into
the test process's environment, and its engine holds that port. A child that inherited them would take itself
for rank 0 of a launched group and try to listen on the parent's port (EADDRINUSE), so they are dropped.
"""
from __future__ import annotations

import os

RENDEZVOUS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment without the rendezvous variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    env.update(extra)
    return env
