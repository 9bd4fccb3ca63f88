"""The check `your-model-cpu`: a newcomer's GRPO on their own checkpoint, on a CPU, from a folder outside the
checkout whose path holds a space, with the tiny recipe given by name (docs/your-model.md)."""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_env import child_env

ROOT = Path(__file__).resolve().parents[1]
LOADER_NOISE = ("gemm_4bit_forward", "kernels-community", "cannot be preloaded", "Setting accelerator to CPU")
TRL_VLLM_VERSION = "TRL currently supports vLLM versions"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = child_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", HF_HUB_OFFLINE="1")
    return subprocess.run(["gravity-grpo", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_grpo_on_your_model_on_a_cpu(tmp_path):
    from grpo.model_source import resolve_model

    here = tmp_path / "my work"
    here.mkdir()
    shutil.copytree(resolve_model("tiny"), here / "my_model")
    train = ("train", "--config", "tiny_cpu", "--model", "my_model", "--pool", "tiny", "--probe-set", "tiny-probe",
             "--probe-size", "4", "--max-steps", "2", "--tpf-every", "2", "--out", "run")
    done = _cli(*train, cwd=here)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]

    # quiet: no loader noise, TRL's version warning at most once, nothing from the libraries at INFO
    assert not [noise for noise in LOADER_NOISE if noise in log], log
    assert log.count(TRL_VLLM_VERSION) <= 1, log
    assert not re.search(r"^INFO (?!grpo)", log, flags=re.MULTILINE), log

    # the run folder is a checkpoint: the final model, its drafter metadata and a card naming its source
    run = here / "run"
    for name in ("config.json", "model.safetensors", "block_diffusion.json", "generation_config.json",
                 "tokenizer_config.json", "README.md"):
        assert (run / name).is_file(), name
    assert (run / "block_diffusion.json").read_bytes() == (here / "my_model" / "block_diffusion.json").read_bytes()
    card = (run / "README.md").read_text()
    assert "my_model" in card and "tiny_cpu" in card and "OcrReward(" in card
    assert "step 0 → step 2" in card and "None" not in card
    modes = {stat.S_IMODE(p.stat().st_mode) for p in run.rglob("*") if p.is_file()}
    assert len(modes) == 1, modes

    measured = _cli("tpf", "--model", "run", "--pool", "tiny-probe", "--limit", "4", "--out", "tpf_run.json", cwd=here)
    assert measured.returncode == 0, measured.stderr[-4000:]
    assert (here / "tpf_run.json").is_file()

    again = _cli(*train, cwd=here)
    assert again.returncode == 2, again.stderr[-4000:]
    assert len(re.findall(r"^error: ", again.stderr, flags=re.MULTILINE)) == 1 and "run" in again.stderr


def test_your_model_page_names_the_cpu_recipe():
    page = (ROOT / "docs" / "your-model.md").read_text(encoding="utf-8")
    assert "--config tiny_cpu" in page and "--config gravityocr_grpo" in page
    assert page.index("--config tiny_cpu") < page.index("--config gravityocr_grpo")  # the laptop path first
