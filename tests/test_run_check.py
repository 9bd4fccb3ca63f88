"""Training and `train --dry-run` refuse the same runs: one run check (`grpo.training.preflight.check_run`).

Each row of the table is run both ways: the dry run (`preflight`), and training's own path up to the trainer
(`load_config`, then `prepare_run`, which loads the checkpoint and the pools). Both must give the same verdict,
training's one message must hold every problem the dry run lists, and the row's reason must be among them.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from grpo.block_diffusion import BD_FILE
from grpo.model_source import TINY_MODEL
from grpo.errors import UserError
from grpo.training.config import load_config
from grpo.training.preflight import preflight
from grpo.training.run import prepare_run

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "configs" / "tiny_cpu.yaml"
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A checkpoint without a drafter, a tiny GLM-OCR checkpoint, an image pool, a pool with a bad row and a text
    pool file (a built-in split name is a GLM-OCR policy's crops, a file is read as it is)."""
    from helpers_models import build_glmocr_checkpoint, write_image_pool

    root = tmp_path_factory.mktemp("run_check")
    shutil.copytree(TINY_MODEL, root / "plain", ignore=shutil.ignore_patterns(BD_FILE))
    build_glmocr_checkpoint(root / "glm")
    rows = [{"prompt": "Text Recognition:", "target": "a", "task_type": "text"},
            {"prompt": "Text Recognition:", "target": "b", "task_type": "poetry"}]
    (root / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "text.jsonl").write_text(json.dumps(rows[0]) + "\n")
    return {"plain": str(root / "plain"), "glm": str(root / "glm"), "images": str(write_image_pool(root)),
            "bad": str(root / "bad.jsonl"), "text": str(root / "text.jsonl")}


# (overrides on tiny_cpu.yaml with {name} standing for a file of `files`, the reason it is refused or None)
TABLE = [
    ({}, None),
    ({"use_peft": True, "load_in_4bit": True}, "load_in_4bit (QLoRA) needs CUDA"),
    ({"model": "{plain}", "tpf_every": 0, "drafter_loss_weight": 0.3}, f"{BD_FILE} is missing"),
    ({"model": "{plain}", "tpf_every": 0}, None),
    ({"model": "{glm}", "pool": "{images}", "tpf_every": 0}, "vLLM sizes the vision merger"),
    ({"model": "{glm}", "pool": "{text}", "tpf_every": 0, "use_vllm": False}, "needs an image column"),
    ({"pool": "{bad}"}, "line 2: unknown task_type 'poetry'"),
    ({"pool": "{bad}", "skip_bad": True}, "1 rows make 0 optimizer steps per epoch"),
    ({"max_completion_length": 0}, "max_completion_length must be an integer in [1, 65536]"),
    ({"beta": -0.1}, "beta must be a number >= 0 (the KL coefficient"),
    ({"report_to": ["wandb"]}, "report_to: wandb not installed here"),
    ({"probe_size": 1000}, "rows, fewer than probe_size 1000"),
    ({"pool": "{images}", "tpf_every": 0}, "the pool has images but the policy is text-only"),
    ({"max_completion_length": 2040}, "longer than the context with max_completion_length 2040"),
    ({"num_generations": 7}, "num_generations (7)"),
    ({"use_cpu": False}, None if CUDA else "this machine has no CUDA device"),
]


@pytest.mark.parametrize("overrides, reason", TABLE, ids=[str(i) for i in range(len(TABLE))])
def test_training_refuses_what_the_dry_run_reports(files, tmp_path, overrides, reason):
    values = {k: v.format(**files) if isinstance(v, str) else v for k, v in overrides.items()}
    values["output_dir"] = str(tmp_path / "run")
    report = preflight(TINY, values)
    try:
        prepare_run(load_config(TINY, values))
        refusal = None
    except UserError as err:
        refusal = str(err)
    assert report.ok == (refusal is None), (report.problems, refusal)
    for problem in report.problems:
        assert problem.split(": ", 1)[-1] in refusal, (problem, refusal)
    if reason is None:
        assert report.ok, report.problems
    else:
        assert any(reason in p for p in report.problems), (reason, report.problems)
