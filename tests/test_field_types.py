"""Config values of the wrong type are the user's mistake (exit 2 naming the key); a TypeError raised while
the config is built is a bug and keeps its traceback."""
from __future__ import annotations

from typing import Any, Literal

import pytest

from grpo.training.config import ConfigError, GravityGRPOConfig, load_config
from grpo.training.field_types import fits


@pytest.mark.parametrize("value, hint, ok", [
    (3, int, True), (True, int, False), ("3", int, False), (3, float, True), (1.5, float | None, True),
    ("1e-4", float, False), (None, str | None, True), (None, str, False), (["a"], list[str], True),
    ("a", list[str] | str, True), ({"a": 1}, dict[str, Any] | str | None, True), (False, Literal[False], True),
    ("cosine", Literal["linear"], False), (object(), Any, True),
])
def test_fits(value, hint, ok):
    assert fits(value, hint) is ok


def test_a_wrong_typed_value_names_its_key(tmp_path):
    recipe = tmp_path / "run.yaml"
    recipe.write_text('tpf_every: "3"\n')
    with pytest.raises(ConfigError, match=r"run.yaml: key 'tpf_every' must be int, got '3' \(str\)") as err:
        load_config(recipe, {"output_dir": str(tmp_path)})
    assert err.value.setting == "tpf_every"  # the CLI names its flag


def test_a_type_error_from_a_bug_is_not_a_user_error(tmp_path, monkeypatch):
    def broken(self):
        raise TypeError("a bug")

    monkeypatch.setattr(GravityGRPOConfig, "__post_init__", broken)
    with pytest.raises(TypeError, match="a bug"):
        load_config(None, {"output_dir": str(tmp_path)})


def test_the_cli_exits_2_on_a_wrong_typed_value(tmp_path, capsys):
    from grpo.cli import main

    recipe = tmp_path / "run.yaml"
    recipe.write_text("learning_rate: 1e-4\n")  # YAML 1.1 reads this as a string
    assert main(["train", "--config", str(recipe), "--output-dir", str(tmp_path / "out")]) == 2
    assert "key 'learning_rate' must be float, got '1e-4' (str)" in capsys.readouterr().err
