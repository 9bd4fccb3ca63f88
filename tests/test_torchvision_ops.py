"""torchvision's CPU fix (grpo/torchvision_ops.py). Carried by the wheel, without any .pth (children run with
`-S`, so no .pth file of this environment runs): a new process that imports `grpo`, and one that loads vLLM's
general plugins, import the PyPI torchvision beside torch+cpu with its real transforms (without the hook it does
not), and vLLM inspects GLM-OCR in its own process. A VLM engine starts with an empty vLLM cache:
tests/test_wheel_install.py. For processes that import neither first: the environment's .pth
(`grpo.torchvision_ops.write_pth`, which `make setup` runs)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers_env import child_env

ROOT = Path(__file__).resolve().parent.parent
PURELIB = sysconfig.get_paths()["purelib"]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                                reason="torchvision is not installed here: run `make setup`")
CPU_TORCH = "import torch\nif torch.version.cuda is not None: raise SystemExit(3)\n"


def _python(code: str, site: bool = False) -> subprocess.CompletedProcess:
    """`code` in a new interpreter; without `site`, no .pth file runs (`-S`, site-packages on PYTHONPATH)."""
    flags, path = ([], str(ROOT)) if site else (["-S"], os.pathsep.join([str(ROOT), PURELIB]))
    done = subprocess.run([sys.executable, *flags, "-c", code], cwd=ROOT, env=child_env(PYTHONPATH=path),
                          capture_output=True, text=True, timeout=300)
    if done.returncode == 3:
        pytest.skip("a CUDA torch: the fix does nothing there")
    return done


def test_the_environments_pth_lets_a_script_import_transformers_first():
    """A user's own TRL script imports transformers (and with it torchvision) before anything of `grpo`."""
    from grpo.torchvision_ops import PTH_LINE, PTH_NAME

    assert (Path(PURELIB) / PTH_NAME).read_text() == PTH_LINE  # `make setup` wrote it
    done = _python(CPU_TORCH + "from transformers.image_utils import load_image\nimport sys, torchvision\n"
                   "print(sys.modules['grpo.torchvision_ops']._library is not None)", site=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "True"


def test_importing_grpo_lets_torchvision_and_its_transforms_import():
    done = _python(CPU_TORCH + "import grpo, torchvision, grpo.torchvision_ops as t\n"
                   "from torchvision.transforms.v2 import functional as F\n"
                   "print(t._library is not None, tuple(F.resize(torch.zeros(3, 8, 8), [4, 4]).shape))")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split(maxsplit=1) == ["True", "(3, 4, 4)\n"]


def test_vllm_plugin_registers_glm_ocr_for_inspection_in_process():
    """vLLM's general plugins, ours among them, in a process that has imported nothing of `grpo`: torchvision
    then imports, and vLLM's GLM-OCR class is registered as imported, so vLLM does not inspect it in the
    subprocess that imports torchvision before any plugin (grpo/torchvision_ops.py)."""
    done = _python(CPU_TORCH + "import sys\n"
                   "from vllm.plugins import load_general_plugins, load_plugins_by_group\n"
                   "assert 'grpo' not in sys.modules and 'torchvision' not in sys.modules\n"
                   "print(sorted(load_plugins_by_group('vllm.general_plugins')))\n"
                   "load_general_plugins()\n"
                   "from vllm import ModelRegistry\n"
                   "import torchvision\n"
                   "print(type(ModelRegistry.models['GlmOcrForConditionalGeneration']).__name__)")
    assert done.returncode == 0, done.stderr[-2000:]
    plugins, registered = done.stdout.splitlines()[-2:]
    assert "gravity_grpo_torchvision" in plugins and registered == "_RegisteredModel"


def test_without_the_hook_torchvision_fails_beside_a_cpu_torch():
    done = _python(CPU_TORCH + "import sys, grpo.torchvision_ops as t\n"
                   "sys.meta_path.remove(t._BeforeTorchvision)\n"
                   "import torchvision")
    assert done.returncode != 0 and "torchvision::nms" in done.stderr, done.stderr[-2000:]
