"""Paths in a recipe resolve against the recipe file, as `extends:` does (issue 24); paths on the command line
stay relative to the current directory; built-in names and hub ids stay as written."""
from __future__ import annotations

from pathlib import Path

from grpo.training.config import load_config
from grpo.yaml_config import read_recipe

ROOT = Path(__file__).resolve().parent.parent


def test_recipe_paths_are_read_beside_the_recipe(tmp_path, monkeypatch):
    recipes = tmp_path / "recipes"
    (recipes / "sub").mkdir(parents=True)
    (recipes / "ckpt").mkdir()
    (recipes / "sub" / "pool.jsonl").write_text("")
    (recipes / "base.yaml").write_text("model: ckpt\npool: tiny\nprobe_set: acme/probe\n")
    (recipes / "sub" / "run.yaml").write_text("extends: ../base.yaml\npool: pool.jsonl\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert read_recipe(recipes / "sub" / "run.yaml") == {
        "model": str(recipes / "ckpt"), "pool": str(recipes / "sub" / "pool.jsonl"), "probe_set": "acme/probe"}
    (elsewhere / "mine").mkdir()  # a command-line value stays relative to the current directory
    config = load_config(recipes / "sub" / "run.yaml", {"model": "mine", "output_dir": "out", "use_cpu": True,
                                                        "bf16": False})
    assert config.model == "mine" and config.pool == str(recipes / "sub" / "pool.jsonl")


def test_tiny_vlm_recipe_runs_from_another_folder(tmp_path, monkeypatch, capsys):
    """The measured failure of issue 24: configs/tiny_vlm_cpu.yaml from another folder found no checkpoint."""
    from grpo.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", str(ROOT / "configs" / "tiny_vlm_cpu.yaml"), "--dry-run"]) == 0, \
        capsys.readouterr()
    assert "dry run: the run would start" in capsys.readouterr().out
