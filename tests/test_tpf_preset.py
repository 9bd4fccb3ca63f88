"""The `gravityocr` decode preset (issue 24, check `tpf-preset`): GravityOCR's published decode settings, named in
a `settings` object of every tpf JSON and drift record."""
from __future__ import annotations

import json

from PIL import Image

import pytest

from grpo.cli import main
from grpo.decoding.presets import PRESETS
from grpo.crop_size import fit_long_side, long_side

GRAVITYOCR_CAPS = {"text": 512, "table": 4096, "formula": 4096}  # MAX_NEW_TOKENS of GravityOCR's inference


def test_tpf_preset_gravityocr_writes_its_settings(tmp_path):
    out = tmp_path / "tpf.json"
    assert main(["tpf", "--model", "tiny", "--pool", "tiny-probe", "--limit", "4", "--preset", "gravityocr",
                 "--out", str(out)]) == 0
    stats = json.loads(out.read_text())
    settings = stats["settings"]
    assert settings["preset"] == "gravityocr" and settings["dtype"] == "bfloat16"
    assert all(settings["max_new_tokens"][task] >= cap for task, cap in GRAVITYOCR_CAPS.items()
               if task in settings["max_new_tokens"])
    assert set(settings["max_new_tokens"]) == {r["task"] for r in stats["rows"]}
    assert settings["stop_token_ids"] == [0] and settings["bd_size"] == 16  # the EOS ids; the checkpoint's B
    assert settings["gravityocr_path"].startswith("slurm/eval_omnidocbench.slurm defaults")
    assert settings["image_long_side"] == "full"  # GravityOCR's published evaluation passes 99999
    assert set(settings["tpf_convention"]) == {"tpf", "tpf_bench"} and stats["tpf_bench"] is not None


class _Eos:
    """A model's generation config and a tokenizer with GLM-OCR's EOS ids (generation_config.json: 59246, 59253)."""

    generation_config = type("GenerationConfig", (), {"eos_token_id": [59246, 59253]})()
    eos_token_id = 59246


def test_each_preset_follows_one_gravityocr_path_with_its_stop_set_and_caps():
    """Issue 42: the published evaluation's batched path (fast_sampling_batched.py:117-123) stops on the
    generation config's EOS and the tokenizer's; the bench's natcache path on the tokenizer's alone. An unknown
    task gets 512 in the evaluation (MAX_NEW_TOKENS.get(task, 512)) and 256 in the bench."""
    evaluation, bench, cpu = PRESETS["gravityocr"], PRESETS["gravityocr-bench"], PRESETS["cpu"]
    assert evaluation.stop_ids(_Eos(), _Eos()) == {59246, 59253} == cpu.stop_ids(_Eos(), _Eos())
    assert bench.stop_ids(_Eos(), _Eos()) == {59246}
    assert [evaluation.cap(t, 64) for t in ("text", "table", "formula", "caption")] == [512, 4096, 4096, 512]
    assert [bench.cap(t, 64) for t in ("text", "table", "formula", "caption")] == [256, 768, 256, 256]
    assert [cpu.cap(t, 64) for t in ("text", "caption")] == [64, 64]
    assert (evaluation.image_long_side, bench.image_long_side) == ("full", "1344")
    assert (evaluation.round, bench.round) == ("package", "gravityocr")
    assert "generate_cached_batched" in evaluation.path and "generate_speculative_natcache" in bench.path


def test_the_probe_can_decode_as_the_bench_and_the_recipe_does(tmp_path):
    from grpo.training.config import load_config
    from grpo.yaml_config import ConfigError

    cpu = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False}
    config = load_config(None, {**cpu, "tpf_preset": "gravityocr-bench", "tpf_samples": 0})
    assert config.tpf_preset == "gravityocr-bench"
    with pytest.raises(ConfigError, match="GravityOCR's round layout decodes at batch 1: tpf_batch_size must be 1, "
                                          "got 8"):
        load_config(None, {**cpu, "tpf_preset": "gravityocr-bench", "tpf_batch_size": 8, "tpf_samples": 0})
    recipe = load_config("configs/gravityocr_grpo.yaml", {"output_dir": str(tmp_path), "use_cpu": True})
    assert (recipe.tpf_preset, recipe.tpf_batch_size, recipe.tpf_samples) == ("gravityocr-bench", 1, 0)
    assert (recipe.eval_postprocess, recipe.reward_postprocess) == ("gravityocr", "none")


def test_default_preset_stays_the_cpu_one(tmp_path):
    out = tmp_path / "tpf.json"
    assert main(["tpf", "--model", "tiny", "--pool", "tiny-probe", "--limit", "2", "--max-new-tokens", "64",
                 "--out", str(out)]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["preset"] == "cpu" and settings["dtype"] == "float32" and settings["image_long_side"] == "full"
    assert set(settings["max_new_tokens"].values()) == {64}


def test_crops_are_resized_as_gravityocr_feeds_them():
    assert PRESETS["gravityocr"].image_long_side == PRESETS["cpu"].image_long_side == "full"
    assert fit_long_side(Image.new("RGB", (1536, 400)), "768").size == (768, 200)
    assert fit_long_side(Image.new("RGB", (300, 1000)), "768").size == (230, 768)  # int() of the scaled side
    assert fit_long_side(Image.new("RGB", (4000, 1000)), "1344").size == (1344, 336)
    assert fit_long_side(Image.new("RGB", (40, 10)), 20).size == (20, 5)
    small = Image.new("RGB", (700, 500))
    assert fit_long_side(small, "768") is small
    assert fit_long_side(Image.new("RGB", (99999, 10)), "full").size == (99999, 10)
    for bad in ("0", "-5", "big", "76.8"):
        with pytest.raises(ValueError, match="image_long_side must be one of full, 768, 1344 or a number"):
            long_side(bad)


def test_probe_metrics_carry_the_held_out_reward_interval_into_the_drift_plot(tmp_path):
    from grpo.decoding.tpf import mean_interval
    from grpo.evaluation.drift import drift_records, probe_metrics
    from grpo.evaluation.plots import plot_drift

    low, high = mean_interval([0.2, 0.4, 0.6, 0.8])
    assert abs((low + high) / 2 - 0.5) < 1e-12 and abs(high - low - 2 * 1.96 * (0.2 / 3) ** 0.5 / 2) < 1e-12
    assert mean_interval([0.5]) is None
    stats = {"tpf": 3.0, "ar_equal_rate": 0.75, "truncated": 0, "n": 4, "reward": 0.5, "exact_rate": 0.25,
             "accepted_per_round": 4.0, "reward_interval": (low, high),
             "by_task": {"text": {"tpf": 3.5, "reward": 0.6}, "table": {"tpf": 2.5, "reward": 0.4}}}
    records = drift_records([{"step": 0, **probe_metrics(stats)}, {"step": 5, **probe_metrics(stats)}],
                            {"preset": "cpu"})
    assert records[0]["eval_reward_low"] == low and records[0]["eval_reward_high"] == high
    assert records[0]["settings"] == {"preset": "cpu"}
    png = plot_drift(records, tmp_path / "drift.png", tpf_floor=0.1)  # floor line, interval, AR-equal 75% marked
    assert png.stat().st_size > 10_000


def test_one_image_preparation_for_rollouts_mining_probe_and_tpf(tmp_path, capsys):
    """Setting `image_long_side` (issue 33): the training pool TRL and the vLLM rollouts read, the rows mining
    samples, and the crops the probe and `tpf` encode are all fitted by `fit_long_side`; the value is recorded."""
    from grpo.evaluation.drift import ProbeSettings
    from grpo.pool import load_pool
    from grpo.prompting import encode_prompt
    from grpo.crop_size import with_long_side
    from grpo.training.config import load_config
    from grpo.checkpoint import load_checkpoint
    from grpo.yaml_config import ConfigError

    pool = load_pool("data/tiny/vlm/probe").select(range(2))
    fitted = with_long_side(pool, "16")
    assert [max(row["image"].size) for row in fitted] == [16, 16] and max(pool[0]["image"].size) > 16
    assert with_long_side(pool, "full") is pool
    ckpt = load_checkpoint("data/tiny/vlm/model", need_drafter=True)
    full, small = (encode_prompt(ckpt.processor, pool[0], True, side)["input_ids"].shape[1] for side in ("full", 16))
    assert small < full  # fewer image tokens
    assert small == encode_prompt(ckpt.processor, fitted[0], True)["input_ids"].shape[1]

    cpu = {"output_dir": str(tmp_path / "run"), "use_cpu": True, "bf16": False}
    config = load_config(None, {**cpu, "image_long_side": "768"})
    assert config.image_long_side == "768" and config.to_dict()["image_long_side"] == "768"  # run_config.json
    assert ProbeSettings.of(lambda name: getattr(config, name)).image_long_side == "768"
    with pytest.raises(ConfigError, match="image_long_side must be one of full, 768, 1344"):
        load_config(None, {**cpu, "image_long_side": "huge"})

    out = tmp_path / "tpf.json"
    assert main(["tpf", "--model", "data/tiny/vlm/model", "--pool", "data/tiny/vlm/probe", "--limit", "2",
                 "--max-new-tokens", "16", "--image-long-side", "16", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["settings"]["image_long_side"] == "16"
    assert main(["tpf", "--pool", "tiny-probe", "--image-long-side", "0"]) == 2
    assert "error: --image-long-side must be one of" in capsys.readouterr().err


def test_tpf_scores_in_the_gravityocr_mode(tmp_path, capsys):
    """`tpf --score --postprocess gravityocr`: each row's reward is the reward of its decoded text formatted as
    GravityOCR's evaluation formats it (ocr_rewards.postprocess), and the mode is recorded."""
    from grpo.checkpoint import load_checkpoint, tokenizer_of
    from grpo.pool import load_pool
    from ocr_rewards.scoring import score

    out = tmp_path / "tpf.json"
    assert main(["tpf", "--model", "tiny", "--pool", "tiny-probe", "--limit", "4", "--max-new-tokens", "24",
                 "--score", "--postprocess", "gravityocr", "--out", str(out)]) == 0
    stats = json.loads(out.read_text())
    assert stats["settings"]["eval_postprocess"] == "gravityocr"
    tokenizer = tokenizer_of(load_checkpoint("tiny").processor)
    pool = load_pool("tiny-probe")
    for row in stats["rows"]:
        text = tokenizer.decode(row["output_ids"], skip_special_tokens=True)
        target, task = pool[row["index"]]["target"], pool[row["index"]]["task_type"]
        assert row["reward"] == score(text, target, task, postprocess="gravityocr").value
    assert main(["tpf", "--pool", "tiny-probe", "--postprocess", "gravityocr"]) == 2
    assert "error: --postprocess is the scoring mode of --score: add --score" in capsys.readouterr().err


def test_the_probe_scores_in_its_eval_postprocess_mode():
    """`eval_postprocess: gravityocr`: the probe's held-out reward of each output is the reward of its text as
    GravityOCR's evaluation formats it; the probe's settings record the mode; a mode no scorer knows is refused
    where the run's config is read."""
    from grpo.checkpoint import load_checkpoint, tokenizer_of
    from grpo.evaluation.drift import ProbeSettings, probe_decode, probe_settings
    from grpo.pool import load_pool
    from grpo.yaml_config import ConfigError
    from ocr_rewards.scoring import score

    ckpt = load_checkpoint("tiny", need_drafter=True)
    rows = list(load_pool("tiny-probe").select(range(3)))
    settings = ProbeSettings(max_new_tokens=24, batch_size=1, temperature=1.0, samples=0, postprocess="gravityocr")
    greedy, sampled = probe_decode(ckpt.model, ckpt.processor, rows, ckpt.bd, settings, step=0, is_vlm=False,
                                   compare_ar=False)
    tokenizer = tokenizer_of(ckpt.processor)
    assert sampled == [] and [r["reward"] for r in greedy] == [
        score(tokenizer.decode(r["output_ids"], skip_special_tokens=True), rows[r["index"]]["target"],
              rows[r["index"]]["task_type"], postprocess="gravityocr").value for r in greedy]
    record = probe_settings(settings, ckpt.model, ckpt.processor, ckpt.bd, ["text"])
    assert record["eval_postprocess"] == "gravityocr" and "weights_dtype" not in record
    with pytest.raises(ConfigError, match="eval_postprocess must be one of none, gravityocr, got 'omni'"):
        ProbeSettings(max_new_tokens=24, batch_size=1, temperature=1.0, samples=0, postprocess="omni")
