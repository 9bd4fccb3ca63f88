"""Synthetic OCR splits (SPEC §3 columns), their disjointness, the tiny tokenizer and the PIL rendering."""
from __future__ import annotations

import re

import pytest

from data.synthetic import SPLITS, TASK_PROMPTS, build_split, gen_table, generate


@pytest.fixture(scope="module")
def tokenizer():
    from data.tokenizer import build_tokenizer

    rows = generate("tiny-train", 600)
    return build_tokenizer([t for r in rows for t in (r["prompt"], r["target"])])


def test_split_columns_prompts_and_task_shares():
    ds = build_split("tiny-probe")
    assert ds.column_names == ["prompt", "target", "task_type"]
    assert len(ds) == SPLITS["tiny-probe"][0]
    assert {t: ds["task_type"].count(t) for t in TASK_PROMPTS} == {"text": 20, "table": 20, "formula": 20}
    for row in ds:
        head, source = row["prompt"].split("\n", 1)
        assert head == TASK_PROMPTS[row["task_type"]]
        assert source and row["target"]
        if row["task_type"] != "table":
            assert source == row["target"]        # text lines and LaTeX are shown as they are written


def test_splits_are_deterministic_and_disjoint():
    assert generate("tiny", 30) == generate("tiny", 30)
    seen = {}
    for name in SPLITS:
        n = 3000 if name == "tiny-train" else None
        keys = {(r["prompt"], r["target"]) for r in generate(name, n)}
        for other, other_keys in seen.items():
            assert not keys & other_keys, f"{name} shares an example with {other}"
        seen[name] = keys


def test_unknown_split_names_the_valid_ones():
    with pytest.raises(ValueError, match="tiny-probe"):
        generate("tiny-test")


def test_table_serialization_matches_html_structure():
    import random

    rng = random.Random(7)
    for _ in range(200):
        ex = gen_table(rng)
        rows = ex.source.split("\n")
        assert ex.target.startswith("<table>") and ex.target.endswith("</table>")
        assert ex.target.count("<tr>") == len(rows)
        for line, tr in zip(rows, re.findall(r"<tr>(.*?)</tr>", ex.target)):
            cells = re.findall(r"<td([^>]*)>(.*?)</td>", tr)
            assert len(cells) == len(line.split("|"))
            for serialized, (attrs, text) in zip(line.split("|"), cells):
                marks = "".join(f"{{{k[0]}{v}}}" for k, v in re.findall(r'(rowspan|colspan)="(\d)"', attrs))
                assert serialized == marks + text


def test_tokenizer_round_trips_and_adds_no_bos(tokenizer):
    assert tokenizer.bos_token is None
    assert tokenizer.convert_tokens_to_ids("<|mask|>") not in (None, tokenizer.unk_token_id)
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token_id != tokenizer.eos_token_id
    for row in generate("tiny-probe"):
        for text in (row["prompt"], row["target"]):
            ids = tokenizer(text).input_ids
            assert tokenizer.eos_token_id not in ids
            assert tokenizer.decode(ids) == text
    ids = tokenizer('<table><tr><td rowspan="2">x</td></tr></table>').input_ids
    assert tokenizer.convert_ids_to_tokens(ids)[:3] == ["<table>", "<tr>", "<td"]


def test_target_tokens_reappear_in_the_prompt(tokenizer):
    """Copy-friendly: the target's content tokens are tokens of the serialized crop."""
    for row in generate("tiny-probe"):
        prompt = set(tokenizer(row["prompt"]).input_ids)
        target = tokenizer(row["target"], add_special_tokens=False).input_ids
        if row["task_type"] != "table":
            assert set(target) <= prompt


def test_tokenizer_loads_with_autotokenizer(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = generate("tiny", 1)[0]["prompt"]
    assert loaded(text).input_ids == tokenizer(text).input_ids
    assert loaded.convert_tokens_to_ids("<|mask|>") == tokenizer.convert_tokens_to_ids("<|mask|>")


def test_vlm_rows_carry_rendered_images_and_bare_prompts():
    ds = build_split("tiny-probe", 6, with_images=True)
    assert set(ds.column_names) == {"prompt", "target", "task_type", "image"}
    for row in ds:
        assert row["prompt"] == TASK_PROMPTS[row["task_type"]]
        image = row["image"]
        assert image.mode == "RGB" and image.width > 20 and image.height > 20
        assert image.convert("L").getextrema()[0] < 128      # something dark was drawn
