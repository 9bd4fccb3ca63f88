"""The committed tiny GLM-OCR reads its crops (docs/vlm.md), so every image path has something to lose. Each test
asserts what a model blind to its crop, or a path that drops, swaps or shrinks crops on their way into the GLM
image processor, fails:

- HF decoding: real crops score above blank ones, and above the same rows shown each other's crops;
- vLLM rollouts in a GRPO step: completions of real crops are rewarded above those of blank ones;
- the loss's forward (TRL's log-probabilities with `pixel_values`): the true transcription is likelier under its
  own crop than under a blank or another row's;
- resolution: a long-side cap that leaves a character under two pixels lowers the reward.

The rows are fresh crops (`tiny-probe@SEED`, seeds no recipe uses), greedy and in fp32; the margins are a third of
what the committed model shows, so another CPU's last bits do not decide them.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo.synthetic.reading import blanked

pytestmark = pytest.mark.slow
pytest.importorskip("torchvision", reason="GLM-OCR's processor needs torchvision: run `make setup`")

ROOT = Path(__file__).resolve().parent.parent
TINY_VLM = ROOT / "data" / "tiny" / "vlm"
SEED, ROWS = 7001, 12     # a fresh probe: 4 text, 4 table, 4 formula crops
MARGIN = 0.15             # reward; the committed model's real - blank is about three times this on these rows


@pytest.fixture(scope="module")
def ckpt():
    from grpo.checkpoint import load_checkpoint

    torch.set_num_threads(1)
    return load_checkpoint(TINY_VLM / "model", need_drafter=True)


@pytest.fixture(scope="module")
def rows():
    from grpo.synthetic.render import build_image_split

    return build_image_split(f"tiny-probe@{SEED}", ROWS)


def _with_images(ds, images):
    return ds.map(lambda row, i: {"image": images[i]}, with_indices=True)


def _swapped(ds):
    """Each row shown the crop of the next row of its task (crops of one task, so only the content differs)."""
    images, tasks = list(ds["image"]), ds["task_type"]
    by_task = {t: [i for i in range(len(ds)) if tasks[i] == t] for t in set(tasks)}
    swapped = list(images)
    for picks in by_task.values():
        for i, j in zip(picks, picks[1:] + picks[:1]):
            swapped[i] = images[j]
    return _with_images(ds, swapped)


def _reward(ckpt, ds, **options) -> float:
    from grpo.decoding.tpf import measure_tpf

    stats = measure_tpf(ckpt.model, ckpt.processor, ds, ckpt.bd, is_vlm=True, max_new_tokens=384, score=True,
                        batch_size=ROWS, **options)
    return sum(r["reward"] for r in stats["rows"]) / len(stats["rows"])


def test_decoding_reads_the_crop_it_is_given(ckpt, rows):
    real = _reward(ckpt, rows)
    assert real > 0.35, real
    assert real > _reward(ckpt, blanked(rows)) + MARGIN
    assert real > _reward(ckpt, _swapped(rows)) + MARGIN


def test_a_cap_that_makes_characters_illegible_lowers_the_reward(ckpt, rows):
    """144 pixels on the long side: a 576-pixel-wide crop shrinks 4x, a character cell to 2 x 2 pixels."""
    assert _reward(ckpt, rows) > _reward(ckpt, rows, image_long_side="144") + MARGIN


def test_the_losss_forward_sees_the_crop(ckpt, rows, tmp_path):
    """TRL's per-token log-probabilities with the crop's `pixel_values` (the loss's forward, on a trainer of the
    package): the true transcription's mean log-probability under its own crop beats a blank crop's and another
    row's by a nat."""
    from grpo.pool import as_prompts
    from grpo.prompting import IMAGE_INPUTS, encode_prompt
    from grpo.training.config import load_config
    from grpo.rollouts.backend import RolloutBackend
    from grpo.training.trainer import GravityGRPOTrainer
    from ocr_rewards import ocr_reward

    config = load_config(None, dict(output_dir=str(tmp_path), use_vllm=False, per_device_train_batch_size=2,
                                    num_generations=2, bf16=False, use_cpu=True, report_to="none", tpf_every=0))
    trainer = GravityGRPOTrainer(model=ckpt.model, reward_funcs=ocr_reward, args=config,
                                 train_dataset=as_prompts(rows, is_vlm=True), processing_class=ckpt.processor,
                                 rollouts=RolloutBackend(config, ckpt), block_diffusion=ckpt.bd)
    tokenizer = ckpt.processor.tokenizer

    def mean_logp(ds):
        means = []
        for row in ds:
            inputs = encode_prompt(ckpt.processor, row, is_vlm=True)
            target = tokenizer(row["target"], add_special_tokens=False, return_tensors="pt").input_ids
            ids = torch.cat([inputs["input_ids"], target], dim=1)
            types = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(target)], dim=1)  # the target is text
            with torch.no_grad():
                logps, _, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.model, ids, torch.ones_like(ids), target.shape[1], num_images=[1], mm_token_type_ids=types,
                    **{key: inputs[key] for key in IMAGE_INPUTS})
            means.append(logps.mean().item())
        return sum(means) / len(means)

    real = mean_logp(rows)
    assert real > mean_logp(blanked(rows)) + 1.0
    assert real > mean_logp(_swapped(rows)) + 1.0


@pytest.mark.timeout(900)  # two runs, each starting vLLM
def test_vllm_rollouts_of_real_crops_are_rewarded_above_blank_ones(tmp_path):
    """A GRPO step on colocated vLLM: the training reward of rollouts from the pool's crops against the same step
    from blank crops of the same sizes."""
    from grpo.pool import load_pool
    from grpo.training.config import load_config
    from grpo.training.run import run_training

    pool = load_pool(str(TINY_VLM / "pool")).select(range(8))
    rewards = {}
    for name, ds in (("real", pool), ("blank", blanked(pool))):
        ds.save_to_disk(str(tmp_path / name))
        out = tmp_path / f"run-{name}"
        run_training(load_config(ROOT / "configs" / "tiny_vlm_smoke.yaml", {
            "output_dir": str(out), "pool": str(tmp_path / name), "max_steps": 1, "save_steps": 1, "tpf_every": 0,
            "per_device_train_batch_size": 8, "num_generations": 2, "max_completion_length": 64}))
        steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        rewards[name] = next(e["reward"] for e in steps if "reward" in e)
    assert rewards["real"] > rewards["blank"] + MARGIN, rewards
