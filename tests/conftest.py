"""Fixtures shared by the test modules that start a vLLM engine (tests/test_engine.py, tests/test_mining.py)."""
from __future__ import annotations

import os

import pytest

import grpo  # noqa: F401  first, as in every process of the package: torchvision's CPU fix (grpo.torchvision_ops)


@pytest.fixture(scope="module")
def text_ckpt(tmp_path_factory):
    """A small text checkpoint vLLM's CPU attention accepts (hidden 128: head_dim 32)."""
    from helpers_models import build_text_checkpoint

    return build_text_checkpoint(tmp_path_factory.mktemp("tiny_lm"), hidden=128)


@pytest.fixture(scope="module")
def engine(text_ckpt):
    """A vLLM engine on `text_ckpt` in float32 (HF's decoding dtype), started as GRPO and mining start it:
    in a process where numba has already compiled the TEDS kernel. One per module: tests may sync new
    weights into it."""
    yield from _started_engine(text_ckpt)


@pytest.fixture(scope="module")
def drafted_engine():
    """As `engine`, on the tiny joint checkpoint, drafting with its own block-diffusion path
    (`vllm_self_speculation`)."""
    from grpo.model_source import resolve_model

    yield from _started_engine(resolve_model("tiny"), self_speculation=True)


def _started_engine(model_dir, **kwargs):
    """The rendezvous variables vLLM writes into the environment go with the engine (a later
    `TrainingArguments` would take the process for a rank of a launch)."""
    from grpo.rollouts.engine import make_llm
    from helpers_env import RENDEZVOUS
    from ocr_rewards import teds

    before = {key: os.environ.get(key) for key in RENDEZVOUS}
    assert teds("<table><tr><td>a</td></tr></table>", "<table><tr><td>b</td></tr></table>") == 1.0
    yield make_llm(model_dir, max_model_len=512, dtype="float32", **kwargs)
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A folder with brackets in its name, a narrow terminal, and no leftovers in the cwd."""
    monkeypatch.setenv("COLUMNS", "40")
    folder = tmp_path / "[exp1]"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder
