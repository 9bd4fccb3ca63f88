"""Check `think-strip` (issue 33): a completion's closed think blocks are removed before scoring, as GravityOCR
removes them from decoded text, in `score` and in `OcrReward` called as TRL calls it; `think="keep"` scores them."""
from __future__ import annotations

import random
import re

import pytest

from ocr_rewards import OcrReward, score
from ocr_rewards.settings import RewardSettings
from ocr_rewards.think import THINK_BLOCK, strip_think

TEXT = "Hello world"
TABLE = "<table><tr><td>a</td><td>b</td></tr><tr><td>1</td><td>2</td></tr></table>"
FORMULA = r"\frac{a}{b} + c"
PREFIX = "<think>\n</think>\n"
CASES = [(TEXT, "text"), (TABLE, "table"), (FORMULA, "formula")]


@pytest.mark.parametrize("ref,task", CASES)
def test_a_leading_think_block_costs_nothing(ref, task):
    result = score(PREFIX + ref, ref, task)
    assert result.value == 1.0
    assert result.components["think_removed"] == 1.0 and result.components["identical"] == 1.0
    assert "think_removed" not in score(ref, ref, task).components


@pytest.mark.parametrize("ref,task", CASES)
def test_a_think_block_costs_nothing_on_an_imperfect_prediction(ref, task):
    pred = ref[:-3]
    bare = score(pred, ref, task)
    assert bare.value < 1.0
    assert score(PREFIX + pred, ref, task).value == bare.value
    assert score("<think>reasoning\nsteps</think>  \n\t" + pred, ref, task).value == bare.value


def test_the_issue_example_and_keep():
    assert score("<think>\n</think>\nHello world", "Hello world", "text").value == 1.0
    kept = score("<think>\n</think>\nHello world", "Hello world", "text", think="keep")
    assert kept.value == pytest.approx(10 / 19)  # the tags scored as text (the issue's 0.53)
    assert "think_removed" not in kept.components
    assert score(PREFIX + FORMULA, FORMULA, "formula", think="keep").value < 0.5


def test_ocr_reward_as_trl_calls_it():
    """TRL passes prompts, conversational completions and the dataset's columns as keywords, and collects the
    per-task means and the per-completion components."""
    completions = [[{"role": "assistant", "content": PREFIX + ref}] for ref, _ in CASES]
    metrics, extras = {}, {}
    reward = OcrReward(workers=1)
    values = reward(prompts=[[{"role": "user", "content": "p"}]] * 3, completions=completions,
                    target=[ref for ref, _ in CASES], task_type=[task for _, task in CASES],
                    completion_ids=[[1]] * 3, trainer_state=None,
                    log_metric=metrics.__setitem__, log_extra=extras.__setitem__)
    assert values == [1.0, 1.0, 1.0]
    assert extras["ocr/think_removed"] == [1.0, 1.0, 1.0]
    assert metrics["ocr/table/think_removed"] == 1.0 and metrics["ocr/text/reward"] == 1.0
    kept = OcrReward(RewardSettings(think="keep"), workers=1)(
        None, completions, target=[r for r, _ in CASES], task_type=[t for _, t in CASES])
    assert kept[0] == pytest.approx(10 / 19) and kept[2] < 0.5
    assert kept[1] == 1.0  # a table is read from its first <table to its last </table> (docs/spec.md §4)


def test_only_closed_blocks_go_with_the_whitespace_after_them():
    assert strip_think("a <think>x</think>\n\n b") == ("a b", True)
    assert strip_think("A<think>1</think>B<think>2</think>\tC") == ("ABC", True)
    assert strip_think("<think>unclosed\nHello") == ("<think>unclosed\nHello", False)
    assert strip_think("</think>Hello<think>") == ("</think>Hello<think>", False)
    assert strip_think("<think><think>x</think></think>y") == ("</think>y", True)
    assert strip_think("Hello") == ("Hello", False)


def test_strip_think_equals_gravityocrs_regex_on_random_text():
    rng = random.Random(0)
    pieces = ["<think>", "</think>", "<think", "think>", " ", "\n", "\t", "\u3000", "a", "b", "<", ">"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(12)))
        want = THINK_BLOCK.sub("", text)
        assert strip_think(text) == (want, want != text)
    assert THINK_BLOCK.pattern == r"<think>.*?</think>\s*" and THINK_BLOCK.flags & re.DOTALL


def test_an_unknown_think_mode_is_refused():
    with pytest.raises(ValueError, match="unknown think mode 'drop'; valid modes: strip, keep"):
        RewardSettings(think="drop")
