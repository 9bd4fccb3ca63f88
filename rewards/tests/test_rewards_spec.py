"""The reward cases docs/spec.md §4 names, identity on every anchor reference, and the dispatch errors."""
from __future__ import annotations

import pytest

from helpers_anchors import all_references
from ocr_rewards import TASKS, score
from ocr_rewards.formula import canon
from ocr_rewards.gate import degeneration, gate
from ocr_rewards.scoring import MAX_PRED_CHARS


def table(rows, head=None) -> str:
    head_html = "<thead><tr>" + "".join(f"<th>{c}</th>" for c in head) + "</tr></thead>" if head else ""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head_html}<tbody>{body}</tbody></table>"


ROWS = [[f"{name}", f"{i * 7 % 13}.{i}", f"{i * 3}%", f"n={10 + i}"]
        for i, name in enumerate(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"])]
REF = table(ROWS, head=["name", "value", "share", "count"])


@pytest.mark.parametrize("task", TASKS)
def test_identity_scores_one_for_every_anchor_reference(task):
    for ref in all_references():
        result = score(ref, ref, task)
        assert result.value == 1.0, (task, ref[:80])


def test_matching_task_scores_one_on_a_whitespace_variant():
    """Not the identity shortcut: the scorers themselves give 1.0 after normalization."""
    for ref in all_references():
        task = "table" if "<table" in ref else "formula"
        result = score(ref + "\n", ref, task)
        assert result.value == 1.0 and "identical" not in result.components, ref[:80]
        assert score(ref + " ", ref, "text").value == 1.0


def test_table_components_of_a_correct_prediction():
    components = score(REF.replace("<tbody>", "").replace("</tbody>", ""), REF, "table").components
    assert components["teds_s"] == components["s_cell"] == 1.0
    assert components["p_row"] == components["p_loop"] == 0.0
    assert components["bonus_rows"] == components["bonus_cols"] == 0.05


def test_unclosed_table_scores_zero():
    result = score(REF[: -len("</table>")], REF, "table")
    assert result.value == 0.0 and result.components["unclosed"] == 1.0
    # the last <table must be closed even when an earlier one is
    assert score(REF + "<table><tr><td>x</td></tr>", REF, "table").value == 0.0


def test_no_table_scores_015_times_text_similarity():
    pred = "alpha 0.0 0% n=10"
    result = score(pred, REF, "table")
    assert result.components["no_table"] == 1.0
    assert 0 < result.value == pytest.approx(0.15 * result.components["sim"])
    assert score(" ".join(c for row in ROWS for c in row), table(ROWS), "table").value == pytest.approx(0.15)


def test_repeating_one_row_scores_far_below_the_correct_table():
    looping = table(ROWS[:3] + [ROWS[3]] * 10, head=["name", "value", "share", "count"])
    result = score(looping, REF, "table")
    assert result.components["p_loop"] == 1.0   # 9 excess rows of 9 reference rows
    assert result.value < 0.1 < 0.9 < score(REF, REF, "table").value


def test_row_count_penalty_and_bonuses():
    fewer = score(table(ROWS[:4], head=["name", "value", "share", "count"]), REF, "table").components
    assert fewer["p_row"] == pytest.approx(4 / 9) and fewer["bonus_rows"] == 0.0 and fewer["bonus_cols"] == 0.05
    more = table(ROWS + [["iota", "1", "2", "3"], ["kappa", "4", "5", "6"]], head=["name", "value", "share", "count"])
    assert score(more, REF, "table").components["p_row"] == pytest.approx(2 / 9)
    narrow = score(table([row[:3] for row in ROWS], head=["name", "value", "share"]), REF, "table").components
    assert narrow["p_row"] == 0.0 and narrow["bonus_rows"] == 0.05 and narrow["bonus_cols"] == 0.0
    spanned = REF.replace("<th>share</th><th>count</th>", '<th colspan="2">share</th>')
    assert score(spanned, REF, "table").components["bonus_cols"] == 0.05   # still 4 columns
    too_wide = REF.replace("<th>count</th>", '<th colspan="3">count</th>')
    assert score(too_wide, REF, "table").components["bonus_cols"] == 0.0   # 6 columns


def test_table_formula_value():
    pred = table([row if i != 2 else ["gamma", "9.9", "1%", "n=0"] for i, row in enumerate(ROWS)],
                 head=["name", "value", "share", "count"])
    c = score(pred, REF, "table").components
    expected = (0.45 * c["teds_s"] + 0.55 * c["s_cell"]) * (1 - c["p_row"]) * (1 - c["p_loop"]) + 0.1
    assert c["teds_s"] == 1.0 and c["s_cell"] < 1.0
    assert score(pred, REF, "table").value == pytest.approx(min(1.0, expected) * c["g"])


FORMULA = r"\begin{aligned} f(x) &= \frac{a}{b} \\ g &= \left( x + 1 \right) \end{aligned}"


@pytest.mark.parametrize("broken", [
    FORMULA.replace(r"\end{aligned}", ""),          # environment not closed
    FORMULA.replace(r"\frac{a}{b}", r"\frac{a}{b"),  # a brace missing
    FORMULA.replace(r"\right)", ")"),                # \left without \right
])
def test_formula_well_formedness_factor(broken):
    result = score(broken, FORMULA, "formula")
    assert result.components["v"] == 1.0
    assert result.value == pytest.approx(result.components["sim"] * 0.3 * result.components["g"])


def test_formula_penalties_only_where_the_reference_passes():
    interval = r"x \in [0, 1)"   # unbalanced brackets in the reference itself
    assert score(r"x \in [0, 2)", interval, "formula").components["v"] == 0.0
    assert score(r"x^{2", "x^2", "formula").components["v"] == 1.0
    assert score(r"$x", "$x$", "formula").components["v"] == 1.0


def test_canonicalization():
    assert r"\leftarrow" in canon(r"a \leftarrow b")
    assert canon(r"\left( a \right)") == "(a)"
    assert canon(r"\dfrac{1}{2} + \tfrac12") == canon(r"\frac{1}{2} + \frac12") == r"\frac12+\frac12"
    assert canon(r"$$ a \, b \; c \quad d \hspace{2em} e~f $$") == "abcdef"
    assert canon(r"\[ \{ x \} \]") == r"\{x\}"
    assert score(r"\dfrac{a}{b}", r"\frac{a}{b}", "formula").value == 1.0
    assert score(r"a \leftarrow b", r"a \rightarrow b", "formula").value < 1.0


def test_long_run_of_one_character_closes_the_gate():
    assert degeneration("a" * 300) == 0.0
    assert degeneration("x" * 20) == 1.0
    assert degeneration("x" * 120) == pytest.approx(0.5)
    pred = REF.replace("alpha", "alpha" + "-" * 300)
    assert score(pred, REF, "table").value == 0.0
    assert score("word " + "=" * 300, "word", "text").value == 0.0


def test_gate_is_relative_to_the_reference():
    looping_ref = " ".join(["the same words again"] * 12)   # rho8 well below 1
    assert degeneration(looping_ref) < 0.5
    assert gate(looping_ref, looping_ref, "relative") == 1.0
    assert gate(looping_ref, looping_ref, "absolute") == degeneration(looping_ref)
    assert score(looping_ref + " !", looping_ref, "text", gate="absolute").value < 0.5


def test_text_reward():
    assert score("Hello, world!", "hello world", "text").value == pytest.approx(0.9)
    assert score("", "", "text").value == 1.0
    assert score("", "something", "text").value == 0.0


def test_too_long_prediction_scores_zero():
    result = score("a b " * (MAX_PRED_CHARS // 4 + 1), "a b", "text")
    assert result.value == 0.0 and result.components == {"too_long": 1.0}


def test_unknown_task_and_gate_name_the_valid_ones():
    with pytest.raises(ValueError, match=r"\(valid: text, table, formula\)"):
        score("a", "a", "image")
    with pytest.raises(ValueError, match="valid gates: relative, absolute"):
        score("a", "a", "text", gate="none")


def test_scaled_table_bonus_ranks_a_near_perfect_table_below_the_exact_one():
    """One wrong cell of 32: base >= 0.9 with the right shape is 1.0 under `clipped` (a tie with the exact
    table, flagged `saturated`), and (clip01(base) + 0.1) / 1.1 < 1 under `scaled`."""
    pred = table([row if i != 2 else ["gamma", "9.9", "1%", "n=0"] for i, row in enumerate(ROWS)],
                 head=["name", "value", "share", "count"])
    clipped = score(pred, REF, "table")
    scaled = score(pred, REF, "table", table_bonus="scaled")
    c = scaled.components
    base = (0.45 * c["teds_s"] + 0.55 * c["s_cell"]) * (1 - c["p_row"]) * (1 - c["p_loop"])
    assert base >= 0.9 and clipped.value == 1.0 and clipped.components["saturated"] == 1.0
    assert scaled.value == pytest.approx((min(1.0, base) + 0.1) / 1.1 * c["g"]) and scaled.value < 1.0
    assert scaled.components["saturated"] == 0.0
    assert score(REF, REF, "table", table_bonus="scaled").value == 1.0  # identity stays 1.0
    assert "saturated" not in score(REF, REF, "table").components       # only non-identical tables count
    with pytest.raises(ValueError, match="valid: clipped, scaled"):
        score(pred, REF, "table", table_bonus="half")


def test_scaled_bonus_keeps_the_order_of_imperfect_tables():
    """Moving the bonus out of the clip rescales without reordering tables the clip did not reach."""
    worse = table(ROWS[:6], head=["name", "value", "share", "count"])          # two rows missing
    bad = table(ROWS[:3], head=["name", "value", "share", "count"])            # five rows missing
    for reading in ("clipped", "scaled"):
        assert score(bad, REF, "table", table_bonus=reading).value < score(worse, REF, "table",
                                                                            table_bonus=reading).value < 1.0
