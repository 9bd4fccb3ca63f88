"""Scoring mode `gravityocr` (issue 42): GravityOCR's formatting of a region before the reward, rule by rule."""
from __future__ import annotations

import random
import re

import pytest

from ocr_rewards.postprocess import clean, cut_repetition, gravityocr_postprocess
from ocr_rewards.scoring import score
from ocr_rewards.settings import RewardSettings


def test_runs_of_dots_middle_dots_and_underscores_are_capped_at_three():
    assert clean("a......b··········c_______d") == "a...b···c___d"
    assert clean(r"fill \_\_\_\_\_\_ here") == r"fill \_\_\_ here"
    assert clean("ok.. two__ stay") == "ok.. two__ stay"


def test_leading_and_trailing_tab_escapes_go_but_latex_commands_stay():
    assert clean(r"\t\t  Hello \t") == "Hello"
    assert clean(r"\times 3") == r"\times 3"  # \t before a lower-case letter is a LaTeX command
    assert clean("\\theta = 1\\t") == "\\theta = 1"


def test_inline_formulas_lose_inner_spaces_and_are_spaced_from_words():
    assert clean("area$ x^2 $is") == "area $x^2$ is"
    assert clean("cost $ 5 $.") == "cost $5$."
    assert clean("$$ x $$ stays") == "$$ x $$ stays"


def test_formulas_are_wrapped_in_double_dollars():
    assert gravityocr_postprocess("x^2 + y", "formula") == "$$\nx^2 + y\n$$"
    assert gravityocr_postprocess("\\(a\\)", "formula") == "$$\na\n$$"
    assert gravityocr_postprocess("$$ a......b $$", "formula") == "$$\na......b\n$$"  # wrapped: not cleaned
    assert gravityocr_postprocess("a......b", "formula") == "$$\na...b\n$$"


def test_a_table_in_its_tags_is_only_stripped():
    table = "<table><tr><td>1......</td></tr></table>"
    assert gravityocr_postprocess(table, "table") == table
    assert gravityocr_postprocess(" x......", "table") == "x..."


def test_text_items_bullets_fences_and_newlines():
    assert gravityocr_postprocess("(1)First", "text") == "(1) First"
    assert gravityocr_postprocess("2.Second", "text") == "2. Second"
    assert gravityocr_postprocess("3）Third", "text") == "3) Third"
    assert gravityocr_postprocess("• item", "text") == "- item"
    assert gravityocr_postprocess("* item", "text") == "- item"
    assert gravityocr_postprocess("```py\nx = 1", "text") == "```py\n\nx = 1\n\n```"
    assert gravityocr_postprocess("a\nb\n\nc", "text") == "a\n\nb\n\nc"


def test_a_repetition_loop_is_cut_only_from_2048_characters():
    loop = "the same words " * 200  # 3,000 characters
    assert gravityocr_postprocess("Intro. " + loop, "text") == "Intro. the same words"
    short = "the same words " * 100  # 1,500 characters: kept
    assert gravityocr_postprocess(short, "text") == short.strip()
    lines = "header\n" + "row\n" * 12 + "tail"
    assert cut_repetition(lines) == "header\nrow"  # one line is >= 80% of them: cut after its first
    assert cut_repetition("a\nb\nc") == "a\nb\nc"


def _loop_by_regex(text: str) -> str | None:
    """GravityOCR's rule (`_find_consecutive_repeat`, 10 and 10) as the regex it is written with."""
    n = len(text)
    if n < 100 or n // 10 < 10:
        return None
    match = re.search(r"(.{10,%d}?)\1{9,}" % (n // 10), text, re.DOTALL)
    return text[:match.start()] + match.group(1) if match else None


@pytest.mark.parametrize("seed", range(30))
def test_the_loop_search_finds_what_the_regex_finds(seed):
    rng = random.Random(seed)
    unit = "".join(rng.choice("ab ") for _ in range(rng.randint(10, 14)))
    text = ("".join(rng.choice("abc ") for _ in range(rng.randint(0, 40))) + unit * rng.randint(8, 12)
            + "".join(rng.choice("abc") for _ in range(rng.randint(0, 30))))
    assert cut_repetition(text) == (_loop_by_regex(text.strip()) or text)


def test_the_mode_changes_the_reward_and_is_marked():
    plain = score("Name ______________", "Name ___", "text")
    formatted = score("Name ______________", "Name ___", "text", postprocess="gravityocr")
    assert plain.value < 1.0 and formatted.value == 1.0 and formatted.components["postprocessed"] == 1.0
    assert "postprocessed" not in score("Name", "Name", "text", postprocess="gravityocr").components
    assert score("x^2", "x^{2}", "formula", postprocess="gravityocr").value == 1.0  # $$ is normalized away
    with pytest.raises(ValueError, match="unknown postprocess mode 'omni'; valid modes: none, gravityocr"):
        RewardSettings(postprocess="omni")


def test_the_score_command_takes_the_mode(capsys):
    from ocr_rewards.cli import main

    args = ["score", "--task", "text", "--pred-text", "Name ______________", "--ref-text", "Name ___"]
    assert main(args) == 0 and main([*args, "--postprocess", "gravityocr"]) == 0
    assert capsys.readouterr().out.split() == ["text", "reward:", "0.388889", "text", "reward:", "1.000000"]
