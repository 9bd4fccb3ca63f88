"""The tree-edit kernel's disk cache cannot be poisoned by the same file imported under a second name."""
from __future__ import annotations

import importlib.util

import ocr_rewards.zhang_shasha as zs


def _under_another_name(name: str):
    spec = importlib.util.spec_from_file_location(name, zs.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_installed_name_caches():
    assert zs.__name__ == zs.CANONICAL_NAME
    assert zs._compiled()._cache.__class__.__name__ == "FunctionCache"
    other = _under_another_name("rewards_copy_zhang_shasha")
    assert other._compiled()._cache.__class__.__name__ == "NullCache"

