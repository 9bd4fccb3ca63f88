"""The built-in names: the tiny checkpoints, pools, recipes and accelerate configs the package ships.

The repo keeps them in its top-level `data/` and `configs/`; the wheel carries them as the packages `grpo.data`
and `grpo.configs` (setup.py), and they are found with `importlib.resources`, so an installed package reads
its own copy from any folder. A name is tried only where no file or folder of that name exists: paths win.

Example:
    >>> model_folder("tiny").name, pool_folder("tiny-vlm-probe").name, recipe("tiny_cpu").name
    ('model', 'probe', 'tiny_cpu.yaml')
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

MODELS = {"tiny": "tiny/model", "tiny-base": "tiny/model-base", "tiny-vlm": "tiny/vlm/model"}
POOLS = {"tiny-vlm": "tiny/vlm/pool", "tiny-vlm-probe": "tiny/vlm/probe"}
RECIPE_SUFFIX = ".yaml"
ACCELERATE = "accelerate"  # the accelerate launch configs' folder among the recipes


def _shipped(package: str, relative: str = "") -> Path:
    """The file or folder `relative` (`/`-separated) inside the package-data package `package`."""
    return Path(str(files(package))) / relative


def model_folder(name: str) -> Path | None:
    """The folder of the built-in checkpoint `name` (`MODELS`), or None for any other name."""
    return _shipped("grpo.data", MODELS[name]) if name in MODELS else None


def pool_folder(name: str) -> Path | None:
    """The saved dataset of the built-in image pool `name` (`POOLS`), or None for any other name."""
    return _shipped("grpo.data", POOLS[name]) if name in POOLS else None


def recipes(folder: str = "") -> list[str]:
    """The names of the shipped recipes (`folder="accelerate"`: the accelerate configs), sorted."""
    root = _shipped("grpo.configs", folder)
    return sorted(p.name.removesuffix(RECIPE_SUFFIX) for p in root.iterdir() if p.name.endswith(RECIPE_SUFFIX))


def recipe(spec: str | Path, folder: str = "") -> Path:
    """`spec` itself when it names an existing file, else the shipped recipe of that name (`tiny_cpu`, or
    `tiny_cpu.yaml`; `folder="accelerate"`: the accelerate configs, `zero3`); else `spec` unchanged, for the
    reader to report as missing."""
    path = Path(spec)
    if path.exists() or path.name != str(spec):
        return path
    stem = path.name.removesuffix(RECIPE_SUFFIX)
    return _shipped("grpo.configs", f"{folder}/{stem}{RECIPE_SUFFIX}" if folder else stem + RECIPE_SUFFIX) \
        if stem in recipes(folder) else path
