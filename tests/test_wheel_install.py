"""Check `wheel-install`: the two wheels built from the repo, installed non-editable into a fresh environment that
borrows the project environment's dependencies but none of its files, run from a folder outside the checkout:
the tiny checkpoints, pools and recipes come from the wheel, torchvision imports beside a CPU torch without a
.pth, and both distributions carry the Apache-2.0 license."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers_env import child_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = {"gravity-grpo": "grpo", "ocr-rewards": "ocr_rewards"}


def _run(argv: list, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = child_env(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The fresh environment's folder: the wheels of the repo's files (git's view: ignored build folders stay
    out) installed with `pip install --no-deps`; its one .pth line adds this environment's site-packages as a
    plain path, so the editable finders there never run."""
    tmp = tmp_path_factory.mktemp("wheel-install")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (tmp / "src" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tmp / "src" / name)
    built = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                  tmp / "wheels", tmp / "src" / "rewards", tmp / "src"], tmp)
    assert built.returncode == 0, built.stderr[-3000:]
    env = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", env], check=True)
    site = Path(_run([env / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     tmp).stdout.strip())
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = _run([sys.executable, "-m", "pip", "--python", env / "bin" / "python", "install", "-q", "--no-deps",
                 "--no-index", *sorted((tmp / "wheels").glob("*.whl"))], tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    (tmp / "elsewhere").mkdir()
    return env


def test_both_packages_and_their_licenses_come_from_the_fresh_environment(installed):
    code = ("import json, importlib.metadata as m, grpo, ocr_rewards\n"
            "from grpo.builtin import model_folder, recipe\n"
            "from grpo.commands.demo import CONFIG\n"
            "print(json.dumps({'files': [grpo.__file__, ocr_rewards.__file__, str(model_folder('tiny')),"
            " str(recipe(CONFIG))], 'licenses': [m.metadata(d)['License-Expression'] for d in "
            f"{list(DISTRIBUTIONS)}]}}))")
    done = _run([installed / "bin" / "python", "-c", code], installed.parent / "elsewhere")
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert all(Path(f).is_relative_to(installed) for f in found["files"]), found["files"]
    assert found["files"][2].endswith("grpo/data/tiny/model") and found["files"][3].endswith("grpo/configs/tiny_cpu.yaml")
    assert found["licenses"] == ["Apache-2.0", "Apache-2.0"]
    assert not any(Path(installed).rglob("*torchvision*.pth"))


@pytest.mark.parametrize("model, pool", [("tiny", "tiny-probe"), ("tiny-vlm", "tiny-vlm-probe")])
def test_tpf_on_a_builtin_checkpoint_measures(installed, model, pool):
    """The tiny default on its probe, and the tiny GLM-OCR on its image probe (torchvision beside a CPU torch)."""
    out = installed.parent / "elsewhere" / f"{model}.json"
    done = _run([installed / "bin" / "gravity-grpo", "tpf", "--model", model, "--pool", pool, "--limit", "2",
                 "--max-new-tokens", "16", "--out", out], out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads(out.read_text())
    assert stats["n"] == 2 and stats["tpf"] >= 1.0 and Path(stats["model"]).is_relative_to(installed)


def test_train_dry_run_of_a_shipped_recipe_by_name_passes(installed):
    done = _run([installed / "bin" / "gravity-grpo", "train", "--config", "tiny_cpu", "--dry-run", "--set",
                 "output_dir=run"], installed.parent / "elsewhere")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "dry run: the run would start" in done.stdout
