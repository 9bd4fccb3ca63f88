"""Configs through transformers' HfArgumentParser (grpo.yaml_config.Fields): values typed by their fields at the
boundary, `extends`, renamed keys as aliases, and the errors that name the key."""
from __future__ import annotations

import logging
import re

import pytest

from grpo.cli import main
from grpo.yaml_config import ConfigError, read_recipe


def _write(path, text):
    path.write_text(text)
    return path


def test_yaml_strings_are_typed_by_the_field(tmp_path):
    from grpo.training.config import load_config

    recipe = _write(tmp_path / "r.yaml", "learning_rate: 3e-6\ntpf_every: '5'\nuse_cpu: 'true'\n"
                                          "lora_target_modules: q_proj\n")
    assert read_recipe(recipe)["learning_rate"] == "3e-6"  # what PyYAML reads: a string
    cfg = load_config(recipe, {"output_dir": str(tmp_path / "run")})
    assert (cfg.learning_rate, cfg.tpf_every, cfg.use_cpu) == (3e-6, 5, True)
    assert cfg.model_args.lora_target_modules == "q_proj"  # trl.ModelConfig holds LoRA


@pytest.mark.parametrize("text, message", [
    ("learning_rate: fast", r"r\.yaml: learning_rate must be a number, got 'fast'"),
    ("tpf_every: 2.5", "tpf_every must be an integer, got 2.5"),
    ("tpf_every: often", "tpf_every must be an integer, got 'often'"),
    ("max_steps: true", "max_steps must be an integer, got True"),
    ("table_bonus: half", "table_bonus must be one of clipped, scaled, got 'half'"),
    ("model: null", "model must be a string, got nothing"),
    ("per_device_train_batch_size: 0", r"per_device_train_batch_size must be an integer in \[1, 65536\], got 0"),
    ("num_generations: 0", r"num_generations must be an integer in \[2, 1024\], got 0"),
    ("lora_rr: 4", r"unknown config key 'lora_rr' \(did you mean lora_r"),
])
def test_a_value_that_does_not_fit_names_the_key(tmp_path, text, message):
    from grpo.training.config import load_config

    recipe = _write(tmp_path / "r.yaml", text + "\n")
    with pytest.raises(ConfigError, match=message):
        load_config(recipe, {"output_dir": str(tmp_path / "run"), "use_cpu": True})


def test_extends_starts_from_the_other_recipe(tmp_path):
    from grpo.training.config import read_yaml

    _write(tmp_path / "base.yaml", "max_steps: 5\nbeta: 0.1\n")
    (tmp_path / "sub").mkdir()
    child = _write(tmp_path / "sub" / "child.yaml", "extends: ../base.yaml\nbeta: 0.2\n")
    assert read_yaml(child) == {"max_steps": 5, "beta": 0.2}
    _write(tmp_path / "a.yaml", "extends: b.yaml\n")
    _write(tmp_path / "b.yaml", "extends: a.yaml\n")
    with pytest.raises(ConfigError, match="'extends' makes a loop"):
        read_recipe(tmp_path / "a.yaml")
    bad = _write(tmp_path / "bad.yaml", "extends: missing.yaml\n")
    with pytest.raises(ConfigError, match=f"config file {re.escape(str(tmp_path / 'missing.yaml'))} does not exist"):
        read_recipe(bad)


def test_the_drafter_recipe_is_tiny_cpu_plus_its_own_keys():
    from grpo.training.config import read_yaml

    base, drafter = read_yaml("configs/tiny_cpu.yaml"), read_yaml("configs/tiny_drafter.yaml")
    assert {k: v for k, v in drafter.items() if base.get(k) != v} == {
        "drafter_loss_weight": 0.1, "drafter_completions": "best", "drafter_targets": "greedy"}
    assert base.items() <= drafter.items()


def test_old_joint_names_are_aliases_with_one_deprecation_line(tmp_path, caplog):
    from grpo.joint.train import load_config

    recipe = _write(tmp_path / "j.yaml", "lr: '2e-3'\nthreads: 1\ninit: some/model\ndata: tiny-noisy\n"
                                         "out_dir: out\n")
    with caplog.at_level(logging.WARNING):
        cfg = load_config(recipe)
    assert (cfg.learning_rate, cfg.cpu_threads, cfg.model, cfg.pool, cfg.output_dir) == (
        2e-3, 1, "some/model", "tiny-noisy", "out")
    lines = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(lines) == 5 and "'lr' is deprecated; use 'learning_rate'" in lines[0]


def _mine_config(argv):
    import argparse

    from grpo.commands import mine
    from grpo.mining.miner import MineConfig, fields
    from grpo.yaml_config import build

    parser = argparse.ArgumentParser()
    mine.add_arguments(parser)
    args = parser.parse_args(argv)
    mine._rank_bonus_alias(args)
    return build(MineConfig, fields().load(args.config, fields().command_line(args)), "command line")


def test_mine_flags_come_from_the_fields_and_old_flags_still_work():
    old = _mine_config(["--data", "tiny", "--out", "o", "--k", "4", "--max-tokens", "32", "--table-bonus", "0.5",
                        "--no-progress"])
    new = _mine_config(["--pool", "tiny", "--output-dir", "o", "--num-generations", "4",
                        "--max-completion-length", "32", "--rank-table-bonus", "0.5", "--progress", "false"])
    assert old == new
    assert (new.pool, new.num_generations, new.max_completion_length, new.rank.table_bonus, new.progress) == (
        "tiny", 4, 32, 0.5, False)
    assert new.reward_settings.table_bonus == "clipped"  # the reward's reading keeps its default
    assert _mine_config(["--pool", "p", "--output-dir", "o", "--table-bonus", "scaled"]).table_bonus == "scaled"
    assert new.reward_settings.think == "strip"
    assert _mine_config(["--pool", "p", "--output-dir", "o", "--think", "keep"]).reward_settings.think == "keep"
    with pytest.raises(ConfigError, match="output_dir must be set"):
        _mine_config(["--pool", "p"])


def _one_error(capsys, argv, *culprits):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(re.findall(r"^error: ", err, flags=re.MULTILINE)) == 1 and "Traceback" not in err, err
    for culprit in culprits:
        assert culprit in err, (culprit, err)


@pytest.mark.parametrize("argv, culprits", [
    (["train", "--set", "beta=", "--dry-run"], ["beta has an empty value"]),
    (["train", "--set", "tpf_every=often", "--dry-run"], ["tpf_every must be an integer, got 'often'"]),
    (["train", "--learning-rate", "fast", "--dry-run"], ["learning_rate must be a number, got 'fast'"]),
    (["train", "--dry-run", "--num-processes", "-2"], ["num_processes must be an integer in [1, 65536], got -2"]),
    (["train", "--dry-run", "--num-processes", "0"], ["num_processes must be an integer in [1, 65536], got 0"]),
    (["joint", "--lr", "quick"], ["learning_rate must be a number, got 'quick'"]),
    (["joint", "--batch-size", "0"], ["batch_size must be >= 1, got 0"]),
])
def test_cli_values_are_typed_at_the_boundary(capsys, argv, culprits):
    _one_error(capsys, argv, *culprits)


def test_set_types_by_the_field(tmp_path):
    import argparse

    from grpo.commands import train

    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(["--set", "learning_rate=1e-4", "--set", "lora_r=8", "--max-steps", "3"])
    assert train.overrides(args) == {"max_steps": 3, "learning_rate": 1e-4, "lora_r": 8}


def test_no_and_yes_are_words_and_only_true_and_false_are_booleans(tmp_path):
    """YAML 1.1 reads `no` as False, so `save_strategy: no` (TRL's own spelling) would be refused as a bool."""
    import argparse

    from grpo.commands import train
    from grpo.training.config import load_config

    recipe = _write(tmp_path / "r.yaml", "save_strategy: no\nuse_vllm: yes\nbf16: off\nuse_cpu: true\n")
    assert {k: read_recipe(recipe)[k] for k in ("save_strategy", "use_vllm", "use_cpu")} == \
        {"save_strategy": "no", "use_vllm": "yes", "use_cpu": True}
    cfg = load_config(recipe, {"output_dir": str(tmp_path / "run")})
    assert (cfg.save_strategy, cfg.use_vllm, cfg.bf16, cfg.use_cpu) == ("no", True, False, True)
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(["--set", "save_strategy=no", "--set", "use_vllm=off"])
    assert train.overrides(args) == {"save_strategy": "no", "use_vllm": False}


def test_tpf_names_its_pool_as_the_other_commands(caplog):
    import argparse

    from grpo.commands import tpf

    parser = argparse.ArgumentParser()
    tpf.add_arguments(parser)
    with caplog.at_level(logging.WARNING):
        old = parser.parse_args(["--data", "tiny-probe"])
    assert old.pool == parser.parse_args(["--pool", "tiny-probe"]).pool == "tiny-probe"
    assert [r.getMessage() for r in caplog.records] == ["--data is deprecated; use --pool (same meaning)"]
