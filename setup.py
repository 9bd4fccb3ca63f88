"""The packages of the gravity-grpo wheel: `grpo` and its subpackages, and the repo's top-level `data/` and
`configs/` shipped inside it as `grpo.data` and `grpo.configs` (package data, found by `grpo.builtin`).
pyproject.toml holds the rest; a table can give `packages` either found or listed, not both, hence this file."""
from setuptools import find_packages, setup

BUILTIN = {"grpo.data": "data", "grpo.configs": "configs"}

setup(packages=find_packages(include=["grpo", "grpo.*"]) + list(BUILTIN), package_dir=BUILTIN)
