"""The torchvision shim of `make setup` (grpo/torchvision_ops.py): in every new process of the venv the PyPI
torchvision imports beside torch+cpu, with its real transforms; without the hook it does not."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_env import child_env

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                                reason="torchvision is not installed here: run `make setup`")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=300)


def test_a_new_process_imports_torchvision_and_its_transforms():
    done = _python("import torch, torchvision, grpo.torchvision_ops as t\n"
                   "from torchvision.transforms.v2 import functional as F\n"
                   "x = F.resize(torch.zeros(3, 8, 8), [4, 4])\n"
                   "print(torch.version.cuda is None, t._library is not None, tuple(x.shape))")
    assert done.returncode == 0, done.stderr[-2000:]
    cpu_torch, defined, shape = done.stdout.split(maxsplit=2)
    assert shape.strip() == "(3, 4, 4)"
    assert defined == cpu_torch  # the schemas are defined exactly where torch is a CPU build


def test_without_the_hook_torchvision_fails_beside_a_cpu_torch():
    done = _python("import sys, torch, grpo.torchvision_ops as t\n"
                   "sys.meta_path.remove(t._BeforeTorchvision)\n"
                   "if torch.version.cuda is not None: raise SystemExit(3)\n"
                   "import torchvision")
    if done.returncode == 3:
        pytest.skip("a CUDA torch: the shim does nothing there")
    assert done.returncode != 0 and "torchvision::nms" in done.stderr, done.stderr[-2000:]
