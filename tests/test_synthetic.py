"""Synthetic OCR splits (docs/spec.md §3 columns), their disjointness, the tiny tokenizer and the PIL rendering."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re

import pytest

from grpo.synthetic.render import build_image_split
from grpo.synthetic.crops import BLOT, GENERATORS, Example, blot, gen_table
from grpo.synthetic.mislabels import MISLABELS, wrong_at
from grpo.synthetic.splits import SPLITS, TASK_PROMPTS, build_split, generate


@pytest.fixture(scope="module")
def tokenizer():
    from grpo.synthetic.tokenizer import build_tokenizer

    rows = generate("tiny-train", 600)
    return build_tokenizer([t for r in rows for t in (r["prompt"], r["target"])])


def test_split_columns_prompts_and_task_shares():
    ds = build_split("tiny-probe")
    assert ds.column_names == ["prompt", "target", "task_type"]
    assert len(ds) == SPLITS["tiny-probe"].rows
    assert {t: ds["task_type"].count(t) for t in TASK_PROMPTS} == {"text": 20, "table": 20, "formula": 20}
    for row in ds:
        head, source = row["prompt"].split("\n", 1)
        assert head == TASK_PROMPTS[row["task_type"]]
        assert source and row["target"]
        if row["task_type"] != "table":       # text lines and LaTeX are shown as written, blots aside
            assert len(source) == len(row["target"])
            assert all(s == t or s == BLOT for s, t in zip(source, row["target"]))


@pytest.mark.slow  # all 60,000 rows: the pin covers the whole split
def test_tiny_train_is_unchanged():
    """The base recipe (and its tokenizer) trains on `tiny-train`: its rows, pinned before `tiny-noisy` existed."""
    rows = generate("tiny-train")
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()
    assert digest == "96716aed5111c26a50d83cbb6f2ee62676e079c92ddd70882eb6035a0c09f472"


def test_held_out_splits_are_unchanged():
    """The pool, the probe, mining's candidates and a fresh probe, pinned: a training split added later (each one
    adds the targets and prompts they skip) leaves every evidence figure measured on them as it was."""
    pins = {"tiny": "c992b9beb21ece7d84e768f3eef9a88b89812a1429670146fe8c92fbc4f34fcc",
            "tiny-probe": "8c9668bb571dc239d34862ea23d9e78ab9255cbfef3d52cb3a02fd09a4f31b0f",
            "tiny-candidates": "f714828f4a2640fa742fd958cddbf439e8977563fa0a01cbbf10f2a13ba23a1e",
            "tiny-probe@11": "eed5f7e0872b26ec4d0c889767e5b59849302ec652b5cedb6c9c27af908339d2"}
    for name, pin in pins.items():
        assert hashlib.sha256(json.dumps(generate(name), sort_keys=True).encode()).hexdigest() == pin, name


def _crop(row: dict) -> str:
    return row["prompt"].split("\n", 1)[1]


def test_splits_are_deterministic_and_disjoint():
    """The pool and the probe share no example with any other split (training splits may share theirs)."""
    assert generate("tiny", 30) == generate("tiny", 30)
    keys = {name: {(r["prompt"], r["target"]) for r in generate(name, min(3000, SPLITS[name].rows))}
            for name in SPLITS}
    for name in ("tiny", "tiny-probe"):
        for other in SPLITS:
            assert other == name or not keys[name] & keys[other], f"{name} shares an example with {other}"


def test_pool_and_probe_show_longer_text_crops():
    """3-5 lines in the GRPO pool and the probe (steady text TPF), and in the reading model's last training split;
    `tiny-train` keeps its 1-3."""
    for name, counts in (("tiny", {3, 4, 5}), ("tiny-probe", {3, 4, 5}), ("tiny-noisy", {3, 4, 5}),
                         ("tiny-train-long", {3, 4, 5}), ("tiny-train", {1, 2, 3})):
        lines = {_crop(r).count("\n") + 1 for r in generate(name, 300) if r["task_type"] == "text"}
        assert lines == counts, name


def test_mislabels_act_at_their_decision_point():
    def labels(task, source, target=None):
        ex = Example(task, source, source if target is None else target)
        return {kind: f(ex) for kind, f in MISLABELS[task].items()}

    # text: the crop's last character decides the length error: a full stop (or none) drops the last line,
    # a comma or colon repeats it; a `3` the crop shows is written `8`, a hidden one is left alone
    assert labels("text", "A 3.\nC d\nE f.") == {"short": "A 3.\nC d", "long": None, "content": "A 8.\nC d\nE f."}
    assert labels("text", "A b\nC d:") == {"short": None, "long": "A b\nC d:\nC d:", "content": None}
    assert labels("text", "A ░ 3", "A 3 3")["content"] == "A 3 8"
    table = '<table><tr><td colspan="2">a</td></tr><tr><td>1</td><td>2</td></tr></table>'
    assert labels("table", "{c2}a\n1|2", table) == {
        "long": '<table><tr><td colspan="2">a</td></tr><tr><td>1</td><td>2</td></tr><tr><td>1</td><td>2</td></tr></table>',
        "content": "<table><tr><td>a</td></tr><tr><td>1</td><td>2</td></tr></table>"}
    assert labels("table", "a", "<table><tr><td>a</td></tr></table>")["content"] is None
    assert labels("formula", r"\frac{a}{b_{1}}") == {"short": r"\frac{a}{b_{1}", "long": None, "content": None}
    assert labels("formula", r"x \leq y") == {"short": None, "long": r"x \leq y}", "content": r"x \geq y"}


def test_wrong_at_reads_each_error_kind_off_a_prediction():
    assert wrong_at("text", "short", "a\nb", "a\nb\nc") and not wrong_at("text", "short", "a\nb\nc", "a\nb\nc")
    assert wrong_at("text", "long", "a\nb\nb", "a\nb") and not wrong_at("text", "long", "a", "a\nb")
    assert wrong_at("text", "content", "x 8", "x 3") and not wrong_at("text", "content", "x", "x 3")
    assert wrong_at("table", "content", "<td>a</td>", '<td colspan="2">a</td>')
    assert wrong_at("formula", "content", r"x \geq y", r"x \leq y")
    assert wrong_at("formula", "long", "x}}", "x}") and wrong_at("formula", "short", "{x", "{x}")


def test_only_tiny_noisy_is_mislabeled_at_about_its_rate(monkeypatch):
    """`tiny-noisy` is its clean self with each error kind at ~60% of its decision points, and nowhere else;
    the prompts (what the crop shows) are the clean ones. Every other split is noise-free."""
    assert [name for name, split in SPLITS.items() if split.noise] == ["tiny-noisy"]
    noisy = generate("tiny-noisy", 3000)
    monkeypatch.setitem(SPLITS, "tiny-noisy", dataclasses.replace(SPLITS["tiny-noisy"], noise=0.0))
    clean = generate("tiny-noisy", 3000)
    taken = {}
    for n, c in zip(noisy, clean):
        assert n["prompt"] == c["prompt"] and n["task_type"] == c["task_type"]
        task, ex = c["task_type"], Example(c["task_type"], _crop(c), c["target"])
        kinds = [kind for kind, f in MISLABELS[task].items() if f(ex) is not None]
        if not kinds:
            assert n["target"] == c["target"]
        for kind in kinds:
            taken.setdefault((task, kind), []).append(wrong_at(task, kind, n["target"], c["target"]))
    # every kind acts at hundreds of decision points: shorter, longer and content errors all occur
    assert set(taken) == {(t, k) for t in MISLABELS for k in MISLABELS[t]}
    assert {kind for _, kind in taken} == {"short", "long", "content"}
    for key, marks in taken.items():
        assert len(marks) > 200, key
        # (a dropped last line can take a text crop's only swapped digit with it: a bit under 60% there)
        assert 0.52 < sum(marks) / len(marks) < 0.65, key


def test_held_out_splits_share_no_true_target_or_prompt_with_training():
    """On the full splits: no true target of the pool, the probe or mining's candidates, and no prompt of theirs,
    is in a training split (tiny-train keeps its old buckets, which hashed the blotted crop), nor in each other."""
    train = {name: generate(name) for name, split in SPLITS.items() if split.training}
    assert set(train) == {"tiny-train", "tiny-noisy", "tiny-train-long"}
    from grpo.synthetic.splits import _candidates, _training_keys
    truth = {(e.task_type, e.target) for name in train
             for e, _ in zip(_candidates(SPLITS[name]), range(SPLITS[name].rows))}
    prompts = {r["prompt"] for rows in train.values() for r in rows}
    assert _training_keys() == frozenset(truth | prompts)
    held = {name: generate(name) for name in ("tiny", "tiny-probe", "tiny-probe@11", "tiny-candidates")}
    for name, rows in held.items():
        assert not {(r["task_type"], r["target"]) for r in rows} & truth, name
        assert not {r["prompt"] for r in rows} & prompts, name
    for a, b in (("tiny", "tiny-probe"), ("tiny", "tiny-probe@11"), ("tiny-probe", "tiny-probe@11"),
                 ("tiny-candidates", "tiny"), ("tiny-candidates", "tiny-probe"), ("tiny-candidates", "tiny-probe@11")):
        assert not {r["target"] for r in held[a]} & {r["target"] for r in held[b]}, (a, b)
        assert not {r["prompt"] for r in held[a]} & {r["prompt"] for r in held[b]}, (a, b)


def test_a_fresh_probe_is_the_probe_recipe_with_another_seed():
    from grpo.synthetic.splits import is_builtin, split_of
    assert split_of("tiny-probe@11") == dataclasses.replace(SPLITS["tiny-probe"], seed=11)
    rows = generate("tiny-probe@11")
    assert len(rows) == 60 and [r["task_type"] for r in rows[:3]] == list(GENERATORS)
    assert rows == generate("tiny-probe@11") and rows != generate("tiny-probe@12")
    for name in ("tiny@11", "tiny-probe@", "tiny-probe@x", "tiny-probe@-1"):
        assert not is_builtin(name)
        with pytest.raises(ValueError, match="tiny-probe@SEED"):
            generate(name)


def test_unknown_split_names_the_valid_ones():
    with pytest.raises(ValueError, match="tiny-probe"):
        generate("tiny-test")


def _html_rows(html: str) -> list[list[str]]:
    """Each `<tr>` as its cells, written back in the serialization's form (span marks, then text)."""
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", html):
        cells = re.findall(r"<td([^>]*)>(.*?)</td>", tr)
        rows.append(["".join(f"{{{k[0]}{v}}}" for k, v in re.findall(r'(rowspan|colspan)="(\d)"', attrs)) + text
                     for attrs, text in cells])
    return rows


def test_table_lines_are_rows_or_wrapped_labels():
    """Every serialized line is a row of the HTML, except the second line of a wrapped row label."""
    import random

    rng = random.Random(7)
    wrapped = 0
    for _ in range(300):
        ex = gen_table(rng)
        assert ex.target.startswith("<table>") and ex.target.endswith("</table>")
        rows, lines = _html_rows(ex.target), ex.source.split("\n")
        i = 0
        for row in rows:
            line = lines[i].split("|")
            assert len(line) == len(row) and line[1:] == row[1:]
            i += 1
            if line[0] != row[0]:                 # the label goes on on the next line, other cells empty
                rest = lines[i].split("|")
                assert row[0] == f"{line[0]} {rest[0]}" and rest[1:] == [""] * (len(row) - 1)
                i, wrapped = i + 1, wrapped + 1
        assert i == len(lines)
    assert 50 < wrapped < 300                     # wrapping happens, and not in every table


@pytest.mark.parametrize("task", list(GENERATORS))
def test_blots_hide_content_characters_only(task):
    import random

    rng = random.Random(3)
    blotted = 0
    for _ in range(300):
        clean = GENERATORS[task](rng)
        ex = blot(rng, clean)
        assert ex.target == clean.target and len(ex.source) == len(clean.source)
        hidden = [c for s, c in zip(ex.source, clean.source) if s != c]
        assert all(s == c or s == BLOT for s, c in zip(ex.source, clean.source))
        assert all(c.isalnum() or c == "\\" for c in hidden)
        assert re.findall(r"\{[rc]\d\}", ex.source) == re.findall(r"\{[rc]\d\}", clean.source)
        assert ex.source.count(BLOT) <= len(clean.source) // 2 + 8   # never most of a crop
        blotted += BLOT in ex.source
    assert 150 < blotted < 300                    # most crops carry blots, some none


@pytest.mark.parametrize("task", ["text", "formula"])
def test_text_and_formula_blots_hide_whole_words_and_symbols(task):
    import random

    from grpo.synthetic.crops import _BLOTS
    rng, unit = random.Random(5), _BLOTS[task][1]
    for _ in range(200):
        clean = GENERATORS[task](rng)
        ex = blot(rng, clean)
        runs = {m.span() for m in re.finditer(f"{BLOT}+", ex.source)}
        assert runs <= {m.span() for m in unit.finditer(clean.source)}
    ex = blot(random.Random(0), Example("formula", r"\alpha + \frac{x}{12}", r"\alpha + \frac{x}{12}"))
    assert r"\frac{" in ex.source and ex.source.count(BLOT) in (0, 1, 2, 6, 7, 8)


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
    """Copy-friendly: without blots, the target's content tokens are tokens of the serialized crop."""
    for row in generate("tiny-probe"):
        if BLOT in row["prompt"]:
            continue
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
    """Every crop is the grid's width, one cell row per line (a long line wrapped), and its cells show what the
    serialization holds: one glyph per character, blank where it has a space, grey where a blot hides it."""
    from grpo.synthetic.crops import BLOT
    from grpo.synthetic.render import CELL, COLUMNS

    ds = build_image_split("tiny-probe", 6)
    sources = [row["prompt"].split("\n", 1)[1] for row in generate("tiny-probe", 6)]
    assert set(ds.column_names) == {"prompt", "target", "task_type", "image"}
    for row, source in zip(ds, sources):
        assert row["prompt"] == TASK_PROMPTS[row["task_type"]]
        image = row["image"].convert("L")
        assert image.width == COLUMNS * CELL and image.height % CELL == 0
        if row["task_type"] != "table":
            lines = source.split("\n")
            assert image.height // CELL == sum(max(1, -(-len(line) // COLUMNS)) for line in lines)
            first = lines[0][:COLUMNS]
            for c, char in enumerate(first):
                low, high = image.crop((c * CELL, 0, (c + 1) * CELL, CELL)).getextrema()
                if char == " ":
                    assert low == 255
                elif char == BLOT:
                    assert low == high < 200          # one flat grey: nothing under it can be read
                else:
                    assert low < 128                  # a glyph drawn in its own cell
            assert image.crop((len(first) * CELL, 0, COLUMNS * CELL, CELL)).getextrema()[0] == 255 or len(first) == COLUMNS


def test_rendered_glyphs_differ_and_come_from_an_installed_font():
    """Each printable character the tiny world writes has a cell of its own look, drawn from the font file that
    ships inside matplotlib (no system font)."""
    import string

    from grpo.synthetic import render

    cells = {render._glyph(char).tobytes() for char in string.printable if char.isprintable() and char != " "}
    assert len(cells) == len([c for c in string.printable if c.isprintable() and c != " "])
    assert "matplotlib" in render._font().path


def test_indented_crops_draw_each_line_somewhere_in_its_row_and_tables_as_they_are():
    """With `indent` every text and formula line keeps its own cell row and its glyphs in order, starting 0 to
    `indent` cells in; the draw is the same for the same split, varies between lines, and leaves tables alone."""
    from grpo.synthetic.render import CELL, COLUMNS

    def cells(image, r):
        return [image.crop((c * CELL, r * CELL, (c + 1) * CELL, (r + 1) * CELL)).tobytes() for c in range(COLUMNS)]

    plain = build_image_split("tiny-probe", 12)
    indented = build_image_split("tiny-probe", 12, indent=12)
    again = build_image_split("tiny-probe", 12, indent=12)
    starts = []
    for a, b, c in zip(plain, indented, again):
        assert a["image"].size == b["image"].size
        assert b["image"].tobytes() == c["image"].tobytes()
        if a["task_type"] == "table":
            assert a["image"].tobytes() == b["image"].tobytes()
            continue
        flat, moved = a["image"].convert("L"), b["image"].convert("L")
        for r in range(flat.height // CELL):
            row, shifted = cells(flat, r), cells(moved, r)
            width = next((COLUMNS - i for i, cell in enumerate(reversed(row)) if cell != row[-1]), 0)
            shift = next((s for s in range(13) if shifted[s:s + width] == row[:width]), None)
            assert shift is not None, (r, a["target"])   # the row's glyphs, in order, 0 to 12 cells in
            starts.append(shift)
    assert len(set(starts)) > 5
