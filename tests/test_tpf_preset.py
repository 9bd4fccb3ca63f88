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
