"""The package's layers (docs/paths.md): `grpo.rewards` imports nothing else of `grpo` (the error base sits
below both), importing `grpo` loads nothing else, `grpo.__version__` is the distribution's version, and the
wheel installs `grpo` alone."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from grpo import rewards
from helpers_env import child_env

REPO = Path(__file__).resolve().parents[1]


def _absolute_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}
    return names


def _grpo_modules(code: str) -> set[str]:
    probe = f"{code}\nimport sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'grpo'))"
    out = subprocess.run([sys.executable, "-c", probe], env=child_env(PYTHONPATH=str(REPO)), capture_output=True,
                         text=True, check=True).stdout
    return set(ast.literal_eval(out.strip().splitlines()[-1]))


def _loaded_after(code: str) -> list[str]:
    """The `grpo` modules a fresh interpreter holds after running `code`, less those it holds at start (the
    torchvision hook that `make setup`'s .pth file installs, `grpo.torchvision_ops`)."""
    return sorted(_grpo_modules(code) - (_grpo_modules("") - {"grpo"}))


def test_rewards_source_imports_nothing_from_grpo():
    for path in sorted((REPO / "rewards").glob("*.py")):
        outside = {name for name in _absolute_imports(path) if name.split(".")[0] == "grpo"}
        outside -= {rewards.__name__} | {n for n in outside if n.startswith(rewards.__name__ + ".")}
        assert not outside, f"{path.name} imports {sorted(outside)}"


def test_importing_all_of_rewards_loads_no_grpo_module():
    modules = [f"{rewards.__name__}.{p.stem}" for p in sorted((REPO / "rewards").glob("*.py")) if p.stem != "__init__"]
    loaded = _loaded_after("\n".join(f"import {m}" for m in modules))
    assert [m for m in loaded if m != "grpo" and not m.startswith(rewards.__name__)] == []


def test_grpo_alone_loads_nothing_and_has_the_version():
    assert _loaded_after("import grpo; print(grpo.__version__)") == ["grpo"]
    import grpo

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["dynamic"] == ["version"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "grpo.__version__"}
    assert grpo.__version__.count(".") == 2 and all(part.isdigit() for part in grpo.__version__.split("."))


def test_one_user_error_class_for_every_layer():
    from grpo.errors import MissingFileError, UserError

    assert UserError.__module__ == MissingFileError.__module__ == f"{rewards.__name__}.errors"


@pytest.mark.slow
def test_the_wheel_installs_grpo_alone(tmp_path):
    """No bare `rewards` or `data` module: the wheel's one top-level package is `grpo`, with the folders
    rewards/ and data/ (the tiny checkpoint included) inside it."""
    src = tmp_path / "src"
    for name in ("grpo", "rewards", "data"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "wheel"), str(src)], check=True, capture_output=True, env=child_env())
    (wheel,) = (tmp_path / "wheel").glob("gravity_grpo-*.whl")
    import grpo

    assert wheel.name.startswith(f"gravity_grpo-{grpo.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"grpo"}
    for path in ("grpo/rewards/trl_reward.py", "grpo/data/pool.py", "grpo/data/tiny/model/model.safetensors"):
        assert path in names, path
