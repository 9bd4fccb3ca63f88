"""The `gravityocr` decode preset (issue 24, check `tpf-preset`): GravityOCR's published decode settings, named in
a `settings` object of every tpf JSON and drift record."""
from __future__ import annotations

import json

from PIL import Image

from grpo.cli import main
from grpo.decoding.presets import PRESETS

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
    assert settings["stop_token_ids"] == [0] and settings["bd_size"] == 16  # the tokenizer's EOS; the checkpoint's B
    assert settings["image_resize"] == "long side <= 768 (LANCZOS)"
    assert set(settings["tpf_convention"]) == {"tpf", "tpf_bench"} and stats["tpf_bench"] is not None


def test_default_preset_stays_the_cpu_one(tmp_path):
    out = tmp_path / "tpf.json"
    assert main(["tpf", "--model", "tiny", "--pool", "tiny-probe", "--limit", "2", "--max-new-tokens", "64",
                 "--out", str(out)]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["preset"] == "cpu" and settings["dtype"] == "float32" and settings["image_resize"] == "none"
    assert set(settings["max_new_tokens"].values()) == {64}


def test_crops_are_resized_as_gravityocr_feeds_them():
    fit = PRESETS["gravityocr"].fit
    assert fit(Image.new("RGB", (1536, 400))).size == (768, 200)
    assert fit(Image.new("RGB", (300, 1000))).size == (230, 768)  # int() of the scaled side, as GravityOCR
    small = Image.new("RGB", (700, 500))
    assert fit(small) is small and PRESETS["cpu"].fit(Image.new("RGB", (2000, 10))).size == (2000, 10)


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
