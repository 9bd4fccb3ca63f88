"""Property tests: any input string gives a reward in [0, 1] for every task, never an exception."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ocr_rewards import TASKS, score
from ocr_rewards.scoring import MAX_PRED_CHARS

REFS = {
    "text": "The quick brown fox, $x^2$ jumps.",
    "table": "<table><tr><td>a</td><td>b</td></tr><tr><td>1</td><td>2</td></tr></table>",
    "formula": r"\begin{aligned} f(x) &= \frac{a}{b} \end{aligned}",
}
MARKUP = ["<table>", "</table>", "<tr>", "</tr>", "<td>", "</td>", '<td colspan="2">', "<th>", "<thead>",
          "<b>", "</b>", "<math alttext='x'>", "$", "$$", "\\(", "\\)", "\\[", "\\]", "{", "}", "\\left(",
          "\\right)", "\\begin{x}", "\\end{x}", "\\frac", "^", "_", "&amp;", "&#0;", "<!--", "-->", "<?x?>",
          " ", "\n", "a", "7", "中", "\x00", "\udc80"]

markup_soup = st.lists(st.sampled_from(MARKUP), max_size=60).map("".join)
binary_junk = st.binary(max_size=300).map(lambda b: b.decode("utf-8", "surrogateescape"))
any_string = st.one_of(st.text(max_size=300), binary_junk, markup_soup)


def check(pred: str, ref: str, task: str) -> None:
    value = score(pred, ref, task).value
    assert isinstance(value, float) and 0.0 <= value <= 1.0


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(pred=any_string, task=st.sampled_from(TASKS))
def test_any_prediction_against_a_real_reference(pred, task):
    check(pred, REFS[task], task)


@SETTINGS
@given(pred=any_string, ref=any_string, task=st.sampled_from(TASKS))
def test_any_prediction_against_any_reference(pred, ref, task):
    check(pred, ref, task)
    check(ref, ref, task)


def _nested(depth: int) -> str:
    return "<table><tr><td>" + "<div><b>" * depth + "x" + "</b></div>" * depth + "</td></tr></table>"


PATHOLOGICAL = {
    "empty": "",
    "one char 1e5": "a" * 100_000,
    "one char just under the size limit": "-" * (MAX_PRED_CHARS - 1),
    "cells just under the size limit": "<table>" + "<tr><td>1</td></tr>" * ((MAX_PRED_CHARS - 20) // 18) + "</table>",
    "unclosed cells": "<table><tr>" + "<td>" * 10_000 + "</table>",
    "nested tables": "<table><tr><td>" * 3_000 + "</td></tr></table>" * 3_000,
    "nested inline tags": _nested(5_000),
    "nested divs before a table": "<div>" * 10_000 + REFS["table"],
    "nested braces": "{" * 30_000 + "}" * 30_000,
    "inline math": "$x_1$ " * 2_000,
    "environments": "\\begin{a}" * 5_000,
    "binary": bytes(range(256)).decode("latin-1") * 200,
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
@pytest.mark.parametrize("task", TASKS)
def test_pathological_outputs(name, task):
    check(PATHOLOGICAL[name], REFS[task], task)
