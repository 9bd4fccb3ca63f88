"""A clone under a path with spaces and [brackets] runs (docs/paths.md): vLLM gets a glob-safe link to the
checkpoint, and a torch under a path with spaces runs vLLM's compiled helpers eagerly."""
from __future__ import annotations

import glob
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo.paths import glob_safe, is_glob_safe
from grpo.rollouts.engine import free_port
from helpers_env import child_env

REPO = Path(__file__).resolve().parents[1]
CLONE = ("my projects", "ocr [rl] runs", "gg")  # the path of the check `paths-anywhere`


def test_a_plain_path_is_handed_over_as_it_is(tmp_path):
    assert glob_safe(tmp_path) == str(tmp_path)
    assert glob_safe("org/model") == "org/model"  # a hub id


def test_a_bracketed_folder_gets_a_link_that_glob_reads(tmp_path):
    folder = tmp_path / "ocr [rl] runs" / "model"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x")
    assert glob.glob(str(folder / "*.safetensors")) == []  # what vLLM's weight search sees
    link = glob_safe(folder)
    assert is_glob_safe(link) and Path(link).resolve() == folder.resolve()
    assert [Path(p).name for p in glob.glob(str(Path(link) / "*.safetensors"))] == ["model.safetensors"]
    assert glob_safe(folder) == link  # the same link for every call (and every rank)


@pytest.mark.parametrize("site, can", [("site", True), ("site with spaces", False)])
def test_torch_can_compile_only_off_paths_with_spaces(tmp_path, site, can):
    code = "from grpo.paths import torch_can_compile; print(torch_can_compile())"
    env = child_env(PYTHONPATH=f"{_torch_at(tmp_path / site)}:{REPO}")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(can)


def _torch_at(site: Path) -> Path:
    """A site folder whose `torch` is this torch: imported from there, torch lies under `site`."""
    site.mkdir()
    (site / "torch").symlink_to(Path(torch.__file__).parent, target_is_directory=True)
    return site


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_from_a_clone_under_spaces_and_brackets(tmp_path):
    """`gravity-grpo demo` from such a clone, with torch under spaces too: it trains, probes and prints the
    before/after table. Without the link vLLM finds no weights; without the eager fallback inductor's link
    command breaks at the first sampled logprob."""
    root = tmp_path.joinpath(*CLONE)
    for name in ("grpo", "rewards", "data", "configs"):
        shutil.copytree(REPO / name, root / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    site = _torch_at(tmp_path / "site with spaces")
    # its own port: an engine of an earlier test in this process may hold accelerate's default one
    env = child_env(PYTHONPATH=f"{site}:{root}", MASTER_PORT=str(free_port()))
    run = subprocess.run([sys.executable, "-m", "grpo.cli", "demo", "--max-steps", "1"], cwd=root, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = run.stdout.replace("\n", " ")
    assert "held-out greedy reward and TPF: step 0 -> step 1" in printed
    assert "torch.compile is off" in run.stderr  # the torch under spaces was the one imported
    assert (root / "runs" / "demo" / "metrics.jsonl").stat().st_size > 0
