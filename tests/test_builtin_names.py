"""The built-in names (grpo/builtin.py): checkpoints, pools, recipes and accelerate configs read from the
installed package by name, a path that exists winning over a name, and an unknown name reported with the
shipped ones."""
from __future__ import annotations

import pytest
import yaml

from grpo.builtin import ACCELERATE, MODELS, POOLS, model_folder, pool_folder, recipe, recipes
from grpo.model_source import locate
from grpo.training.machine_check import read_accelerate_config
from grpo.yaml_config import ConfigError, read_recipe


def test_every_builtin_name_is_a_shipped_folder():
    assert all((model_folder(name) / "config.json").is_file() for name in MODELS)
    assert all((pool_folder(name) / "state.json").is_file() for name in POOLS)
    assert model_folder("nope") is None and pool_folder("tiny") is None  # `tiny` the pool: a synthetic split
    assert {"tiny_cpu", "tiny_vlm_cpu", "tiny_vlm_null", "tiny_vlm_smoke", "gravityocr_grpo"} <= set(recipes())
    assert {"zero3", "cpu_2proc"} <= set(recipes(ACCELERATE))


def test_recipes_by_name_or_file_name_and_paths_win(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = recipe("tiny_cpu")
    assert shipped.parent.name == "configs" and recipe("tiny_cpu.yaml") == shipped
    assert read_recipe("tiny_vlm_cpu")["model"] == "tiny-vlm"
    (tmp_path / "tiny_cpu").write_text("max_steps: 3\n")
    assert recipe("tiny_cpu") == tmp_path.joinpath("tiny_cpu").relative_to(tmp_path)
    assert read_recipe("tiny_cpu") == {"max_steps": 3}
    with pytest.raises(ConfigError, match=r"config file nope does not exist \(the shipped recipes: .*tiny_cpu"):
        read_recipe("nope")


def test_accelerate_config_by_name():
    assert read_accelerate_config("zero3") == yaml.safe_load(recipe("zero3", ACCELERATE).read_text())
    with pytest.raises(ConfigError, match=r"accelerate config zero9 does not exist \(the shipped ones: .*zero3"):
        read_accelerate_config("zero9")


def test_models_by_name_unless_a_folder_has_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert locate("tiny-vlm").folder == model_folder("tiny-vlm")
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text("{}")
    assert locate("tiny").folder.resolve() == (tmp_path / "tiny").resolve()


def test_the_tiny_vlm_probe_by_name_has_its_images():
    from grpo.pool import load_pool

    probe = load_pool("tiny-vlm-probe")
    assert len(probe) == 6 and all(row["image"].size[0] > 0 for row in probe)


def test_a_builtin_split_comes_as_its_crops_for_a_glm_ocr_policy():
    """`images=True` (a GLM-OCR policy's pool or probe): the split's rows rendered as the tiny world's crops, the
    prompt bare; without it the same rows as text."""
    from PIL import ImageChops

    from grpo.pool import load_pool
    from grpo.synthetic.render import render_row

    text, crops = load_pool("tiny-probe@5"), load_pool("tiny-probe@5", images=True)
    assert "image" not in text.column_names and crops["target"] == text["target"]
    for row, crop in zip(text, crops):
        assert crop["prompt"] == row["prompt"].split("\n", 1)[0]
        assert not ImageChops.difference(crop["image"].convert("RGB"), render_row(row)).getbbox()
