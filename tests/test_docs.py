"""Docs that run: every command block of README.md and docs/*.md, executed exactly as written.

A fenced block's info string says what it is (docs/README.md, "Command blocks"):

- ```bash, ```console (the `$ ` lines) and ```python run on CPU, in order, one page at a time, in a fresh
  folder holding the tiny world (`WORLD`: data/, configs/ and the example files the pages name), with
  `gravity-grpo` and `ocr-rewards` on PATH; every block must succeed;
- ```bash error shows a refusal on purpose: it must exit 2 with one `error:` line;
- ```bash gpu needs a GPU, ```bash long takes longer than CI allows (the tiny checkpoints' rebuilds): not run,
  but each `gravity-grpo` command in them must name a subcommand and only flags its `--help` lists;
- ```bash install installs the package (the test runs where it is installed): not run, pip lines only;
- ```bash make names targets of the checkout's Makefile (`make test` runs this test): each must exist.

A page whose blocks train or start vLLM is marked slow.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_env import child_env

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN, SHOW_ONLY = {"bash", "console", "python"}, {"gpu", "long", "install"}
FENCE = re.compile(r"^```(\S*)[ \t]*(\S*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
HEAVY = re.compile(r"gravity-grpo (train|tpf|tpf-drift|mine|demo|joint|compare)\b|GRPOTrainer")
CASES = [{"pred": "<table><tr><td>1</td></tr></table>", "ref": "<table><tr><td>1</td></tr></table>", "task": "table",
          "expect": 1.0},
         {"pred": "x^2", "ref": "x^{2}", "task": "formula", "min": 0.9},
         {"pred": "hello world", "ref": "hello wrld", "task": "text", "max": 0.99}]


def blocks(page: Path) -> list[tuple[str, str, str]]:
    """(language, marker, body) of every fenced block of `page` whose language is a command language."""
    return [(m.group(1), m.group(2), m.group(3)) for m in FENCE.finditer(page.read_text(encoding="utf-8"))
            if m.group(1) in RUN]


def _world(folder: Path) -> Path:
    """The tiny world the pages' commands run in: data/ and configs/ of the checkout, and the example files
    the pages name (cases.jsonl and pairs.jsonl of reward cases, pred.html and ref.html, my_pool.jsonl: 16 rows
    of the tiny pool)."""
    import json

    from grpo.synthetic.splits import generate

    for name in ("data", "configs"):
        shutil.copytree(ROOT / name, folder / name)
    shutil.copytree(ROOT / "rewards" / "tests" / "fixtures", folder / "tests" / "fixtures")
    lines = "".join(json.dumps(case) + "\n" for case in CASES)
    (folder / "cases.jsonl").write_text(lines, encoding="utf-8")
    (folder / "pairs.jsonl").write_text(lines, encoding="utf-8")
    (folder / "pred.html").write_text(CASES[0]["pred"], encoding="utf-8")
    (folder / "ref.html").write_text(CASES[0]["ref"], encoding="utf-8")
    (folder / "my_pool.jsonl").write_text("".join(json.dumps(row) + "\n" for row in generate("tiny", 16)),
                                          encoding="utf-8")
    return folder


def _runnable(page: Path) -> bool:
    return any(marker not in SHOW_ONLY | {"make"} for _, marker, _ in blocks(page))


def _param(page: Path):
    heavy = any(HEAVY.search(body) for _, marker, body in blocks(page) if marker not in SHOW_ONLY | {"make"})
    return pytest.param(page, id=page.relative_to(ROOT).as_posix(), marks=[pytest.mark.slow] if heavy else [])


def _command(language: str, body: str) -> list[str]:
    if language == "python":
        return [sys.executable, "-c", body]
    if language == "console":
        body = "\n".join(line[2:] for line in body.splitlines() if line.startswith("$ "))
    return ["bash", "-e", "-o", "pipefail", "-c", body]


@pytest.mark.timeout(1200)  # a page runs several commands, each starting vLLM (docs/grpo.md: about 4 minutes)
@pytest.mark.parametrize("page", [_param(p) for p in PAGES if _runnable(p)])
def test_the_pages_commands_run_as_written(page, tmp_path):
    folder = _world(tmp_path / "a folder with a space")
    env = child_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", HF_HUB_OFFLINE="1")
    for number, (language, marker, body) in enumerate(blocks(page), 1):
        if marker in SHOW_ONLY | {"make"}:
            continue
        done = subprocess.run(_command(language, body), cwd=folder, env=env, capture_output=True, text=True,
                              timeout=900)
        where = f"{page.name} block {number} ({language} {marker}):\n{body}\n--- stdout\n{done.stdout[-3000:]}" \
                f"\n--- stderr\n{done.stderr[-3000:]}"
        if marker == "error":
            assert done.returncode == 2, where
            assert len(re.findall(r"^error: ", done.stderr, flags=re.MULTILINE)) == 1, where
            assert "Traceback" not in done.stderr, where
        else:
            assert done.returncode == 0, where


def _commands(body: str) -> list[list[str]]:
    """Each `gravity-grpo SUBCOMMAND ...` (also `-m grpo.cli SUBCOMMAND ...`) of a shell block, as words."""
    found = []
    for line in body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        for i, word in enumerate(words):
            if word == "gravity-grpo" or (word == "grpo.cli" and i and words[i - 1] == "-m"):
                found.append(words[i + 1:])
    return found


def _flags(command: str) -> set[str]:
    """The flags `gravity-grpo COMMAND --help` lists."""
    from grpo.cli import build_parser

    parser = build_parser([command])
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return {flag for action in sub._actions for flag in action.option_strings}


_SHOWN = [pytest.param(page, number, body, id=f"{page.relative_to(ROOT).as_posix()}-{number}")
          for page in PAGES for number, (_, marker, body) in enumerate(blocks(page), 1) if marker in {"gpu", "long"}]


@pytest.mark.parametrize(("page", "number", "body"), _SHOWN)
def test_gpu_and_long_blocks_use_existing_flags(page, number, body):
    from grpo.cli import COMMANDS

    commands = _commands(body)
    assert commands or "trl vllm-serve" in body, f"{page.name} block {number}: no gravity-grpo command"
    for words in commands:
        assert words and words[0] in COMMANDS, (page.name, number, words)
        unknown = {w.split("=")[0] for w in words[1:] if w.startswith("--")} - _flags(words[0])
        assert not unknown, f"{page.name} block {number}: {words[0]} has no flag {sorted(unknown)}"


def test_install_blocks_only_install():
    """```bash install blocks are not run (the test runs in the installed environment): pip installs only."""
    lines = [line.split("#")[0].strip() for page in PAGES for _, marker, body in blocks(page) if marker == "install"
             for line in body.splitlines()]
    lines = [line for line in lines if line]
    assert lines and all(line.startswith("pip install ") for line in lines), lines


def test_make_blocks_name_targets_of_the_makefile():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
    named = [line.split()[1] for page in PAGES for _, marker, body in blocks(page) if marker == "make"
             for line in body.splitlines() if line.startswith("make ")]
    assert named and set(named) <= targets, set(named) - targets


def test_every_block_marker_is_one_of_the_convention():
    markers = {marker for page in PAGES for _, marker, _ in blocks(page)}
    assert markers <= {"", "error", "make"} | SHOW_ONLY, markers
