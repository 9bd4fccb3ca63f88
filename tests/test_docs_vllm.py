"""Every page names only the vLLM release the `gpu` extra pins (issue 42): a page that still says an older one
(or a range) fails here. CHANGELOG.md, the project's history, is the one page left out."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSION = re.compile(r"\bvllm(?:-cpu)?(?:==|\s+)v?(\d+\.\d+(?:\.\d+)?)(?:\s*(?:–|-|to)\s*(\d+\.\d+(?:\.\d+)?))?",
                     re.IGNORECASE)


def pinned() -> str:
    """The vLLM version of the `gpu` extra (`vllm==X`)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return next(dep.split("==")[1] for dep in extras["gpu"] if dep.startswith("vllm=="))


def pages() -> list[Path]:
    skip = {".venv", ".git", "node_modules"}
    return [p for p in sorted(ROOT.rglob("*.md")) if not skip & set(p.relative_to(ROOT).parts)
            and p.name != "CHANGELOG.md"]


def test_pages_name_only_the_pinned_vllm():
    release = pinned()
    named = [(page.relative_to(ROOT).as_posix(), number, version)
             for page in pages() for number, line in enumerate(page.read_text().splitlines(), 1)
             for match in VERSION.finditer(line) for version in match.groups() if version
             and not release.startswith(version) and not version.startswith(release)]
    assert named == [], f"pages naming a vLLM release other than the gpu extra's {release}: {named}"


def test_the_check_catches_a_stale_version_and_a_range():
    assert [m.groups() for m in VERSION.finditer("CUDA vLLM 0.31 and vLLM 0.22–0.31, vllm==0.30.1")] == [
        ("0.31", None), ("0.22", "0.31"), ("0.30.1", None)]
