"""GPU smoke test (issue 13), for the first machine with CUDA: `pytest -m gpu` (skipped without a GPU).

Two GRPO steps with CUDA vLLM in colocate mode and TRL's own weight sync (no CPU override), on the tiny
default and on a tiny random GLM-OCR with images (vLLM sampling with the image tokens banned); the TPF probe
at steps 0, 1, 2; and a saved checkpoint loaded back by the self-speculative decoder and by vLLM.
A few minutes on one GPU: two engine starts and four probes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")]

ROOT = Path(__file__).resolve().parent.parent
# Small share of the GPU per engine: the tiny models need little, and two tests start one each.
GPU_SHARE = 0.15


def _config(out: Path, **values):
    from grpo.training.config import load_config

    base = dict(output_dir=str(out), use_cpu=False, bf16=False, max_steps=2, tpf_every=1, save_steps=2,
                vllm_gpu_memory_utilization=GPU_SHARE, cpu_threads=None, report_to="none")
    base.update(values)
    return load_config(ROOT / "configs" / "tiny_cpu.yaml", base)


def _check_run(summary, out: Path):
    trainer = summary["trainer"]
    # TRL's own weight sync: the CPU override is not installed on CUDA
    assert trainer.vllm_generation.sync_weights.__func__ is type(trainer.vllm_generation).sync_weights
    history = trainer.state.log_history
    steps = [e["step"] for e in history if "reward" in e]
    assert steps == [1, 2]
    # rollouts sampled by an engine holding the policy's weights (importance ratios near 1)
    assert all(e["sampling/importance_sampling_ratio/min"] > 0.5 for e in history if "reward" in e)
    drift = [json.loads(line) for line in (out / "tpf_drift.jsonl").read_text().splitlines()]
    assert [d["step"] for d in drift] == [0, 1, 2] and all(d["tpf"] >= 1 for d in drift)
    return out / "checkpoint-2"


def _reload(checkpoint: Path, is_vlm: bool, rows) -> None:
    """The saved checkpoint is again a joint checkpoint: the TPF decoder and vLLM both load it."""
    from grpo.checkpoint import load_checkpoint
    from grpo.decoding.tpf import measure_tpf
    from grpo.vllm_engine import make_llm

    ckpt = load_checkpoint(checkpoint, need_drafter=True)
    assert ckpt.is_vlm == is_vlm
    stats = measure_tpf(ckpt.model, ckpt.processor, rows, ckpt.bd, is_vlm=is_vlm, max_new_tokens=16,
                        compare_ar=True, progress=False)
    assert stats["ar_equal_rate"] == 1.0
    llm = make_llm(checkpoint, max_model_len=384, gpu_memory_utilization=GPU_SHARE)
    del llm


def test_two_grpo_steps_on_cuda_vllm_tiny_default(tmp_path):
    from data.pool import load_pool
    from grpo.training.trainer import run_training

    summary = run_training(_config(tmp_path / "run"))
    checkpoint = _check_run(summary, tmp_path / "run")
    _reload(checkpoint, False, load_pool("tiny-probe").select(range(3)))


@pytest.fixture
def glm_run(tmp_path):
    """A tiny random GLM-OCR with a real processor (torchvision is on the GPU stack) and an image pool."""
    from transformers import AutoTokenizer, Glm46VProcessor
    from transformers.models.glm46v.image_processing_pil_glm46v import Glm46VImageProcessorPil
    from transformers.models.glm46v.video_processing_glm46v import Glm46VVideoProcessor

    from helpers_models import GLM_CHAT_TEMPLATE, build_glmocr_checkpoint, write_image_pool

    ckpt_dir = build_glmocr_checkpoint(tmp_path / "ckpt", head_dim=32)
    tokenizer = AutoTokenizer.from_pretrained(ckpt_dir)
    images = Glm46VImageProcessorPil(patch_size=2, temporal_patch_size=1, merge_size=2,
                                     size={"shortest_edge": 64, "longest_edge": 1024})
    videos = Glm46VVideoProcessor(patch_size=2, temporal_patch_size=1, merge_size=2)
    Glm46VProcessor(image_processor=images, tokenizer=tokenizer, video_processor=videos,
                    chat_template=GLM_CHAT_TEMPLATE).save_pretrained(ckpt_dir)
    pool = write_image_pool(tmp_path)
    return ckpt_dir, pool


def test_two_grpo_steps_on_cuda_vllm_glm_ocr_with_images(glm_run, tmp_path):
    from data.pool import load_pool
    from grpo.training.trainer import run_training

    ckpt_dir, pool = glm_run
    out = tmp_path / "run"
    config = _config(out, model=str(ckpt_dir), pool=str(pool), probe_set=str(pool), probe_size=3,
                     per_device_train_batch_size=6, num_generations=2, max_completion_length=16,
                     tpf_max_new_tokens=16, vllm_max_model_length=512)
    summary = run_training(config)
    assert "<|image|>" in summary["trainer"].args.generation_kwargs["bad_words"]
    checkpoint = _check_run(summary, out)
    _reload(checkpoint, True, load_pool(str(pool)))
