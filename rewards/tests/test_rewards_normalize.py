"""OmniDocBench normalization: reference values from the anchors and the documented quirks."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import Levenshtein

from helpers_anchors import omnidoc_elements
from ocr_rewards.normalize import normalize_formula, normalize_table_html, normalize_text

# anchors README: NED after upstream normalized_formula on both sides, keyed by (page, anno_id)
FORMULA_NED = {
    ("physletb", 15): 0.0333, ("physletb", 31): 0.0, ("physletb", 10): 0.0882, ("physletb", 29): 0.0508,
    ("physletb", 19): 0.0811, ("physletb", 12): 0.1013, ("physletb", 1): 0.2982, ("physletb", 20): 0.0612,
    ("physletb", 4): 0.3684, ("physletb", 16): 0.1716, ("physletb", 35): 0.2273, ("physletb", 26): 0.2414,
    ("Evans_PDE", 5): 0.0225, ("Evans_PDE", 13): 0.3096, ("Evans_PDE", 15): 0.2646, ("Evans_PDE", 10): 0.1447,
    ("Evans_PDE", 8): 0.2857,
}


def test_formula_ned_matches_omnidocbench():
    elements = omnidoc_elements("OmniDocBench_demo_formula.json", "equation_isolated")
    assert len(elements) == len(FORMULA_NED)
    for image, anno_id, det in elements:
        (expected,) = [v for (page, a), v in FORMULA_NED.items() if page in image and a == anno_id]
        ned = Levenshtein.normalized_distance(normalize_formula(det["latex"]), normalize_formula(det["pred"]))
        assert round(ned, 4) == expected, (image, anno_id)


def test_table_normalization_steps():
    raw = ('<table class="t"><thead><tr><th colspan="2" style="x">Head</th></tr></thead>\n<tbody>'
           '<tr><td>a &amp; b</td><td><span>c</span>\nd</td></tr></tbody></table>')
    assert normalize_table_html(raw) == ('<html><body><table border="1" ><tr><td colspan="2">Head</td></tr>'
                                         '<tr><td>a & b</td><td>cd</td></tr></table></body></html>')


def test_table_normalization_quirks():
    wrap = '<html><body><table border="1" >{}</table></body></html>'
    assert normalize_table_html("no table here") == ""
    assert normalize_table_html("< table><tr><td>x</td></tr></ table>") == wrap.format("")  # gate passes
    # <math> becomes $alttext$, "$$" without alttext
    assert normalize_table_html('<table><tr><td><math alttext="x^2"><mi>x</mi></math></td>'
                                '<td><math><mi>y</mi></math></td></tr></table>') == \
        wrap.format("<tr><td>$x^2$</td><td>$$</td></tr>")
    # two tables merge: everything from the first <table> to the last </table> is kept
    assert normalize_table_html("<table><tr><td>1</td></tr></table>mid<table><tr><td>2</td></tr></table>") == \
        wrap.format("<tr><td>1</td></tr></table>mid<table><tr><td>2</td></tr>")
    # tbody is removed as a bare tag after the attribute clean-up: other attributes keep it
    assert normalize_table_html('<table><tbody class="b"><tr><td>1</td></tr></tbody></table>') == \
        wrap.format("<tr><td>1</td></tr>")
    assert normalize_table_html('<table><tbody id="b"><tr><td>1</td></tr></tbody></table>') == \
        wrap.format('<tbody id="b"><tr><td>1</td></tr>')
    # only bare <sup>/<sub>/<p>/<div> go (class is removed first); NFKC folds full-width characters
    assert normalize_table_html('<table><tr><td><sup>1</sup><p class="c">Ａ</p><p id="k">B</p></td></tr>'
                                '</table>') == wrap.format('<tr><td>1A<p id="k">B</td></tr>')


def test_text_normalization():
    assert normalize_text("Hello, World!\n  42") == "HelloWorld42"
    assert normalize_text("energy $E=m c^2$ here") == "energyEmc2here"
    assert normalize_text("price $5 and $6") == "price5and6"          # no \\ ^ _ inside: left as is
    assert normalize_text(r"a $x\_1^2$ b") == "ax12b"                   # `\_` is deleted outright
    assert normalize_text("and/not or\\never") == "andotorever"          # "/n" and "\\n" are dropped
    assert normalize_text("中文，文本") == "中文文本"


@pytest.mark.parametrize("latex, expected", [
    (r"\[ \mathbf{X} \quad \tag{1} \]", "{x}"),
    ("$$\nA \\leftarrow B\n$$", "aarrowb"),   # upstream deletes "\left" as a substring
    (r"\begin{aligned} a &= b \end{aligned}", "a&=b"),
])
def test_formula_normalization(latex, expected):
    assert normalize_formula(latex) == expected


# ---------------------------------------------------------------- the linear scans are the upstream regexes

PIECES = ["\\[", "\\]", "\\", "[", "]", "\\tag{", "\\begin{", "\\arraycolsep", "}", "{", "\n", " ", "$", "\\(",
          "\\)", "x^2", "a", "<table>", "</table>", "<TABLE x>", "</TaBle>", "<table", "<tablex>", '<math alttext="q">',
          "<math>", "</math>", "</math >", "<MATH>", ' style="', '"', "<colgroup>", "</colgroup>", "<span>", "<span ",
          "</span>", ">", "<", "İ"]
MARKUP = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)


@settings(max_examples=400, deadline=None)
@given(MARKUP)
def test_scans_match_the_upstream_regexes(text):
    from ocr_rewards import normalize as n

    display = re.search(r"\\\[(.+?)(?<!\\)\\\]", text)
    assert n._display_body(text) == (display.group(1) if display else None)
    for prefix in n._FORMULA_DROPPED_PREFIXES:
        assert n._drop_to_brace(text, prefix) == re.sub(re.escape(prefix) + r".*?\}", "", text)
    inline = [(m.start(), m.end(), m.group(1) if m.group(1) is not None else m.group(2))
              for m in re.finditer(r"\$(.*?)\$|\\\((.*?)\\\)", text)]
    assert list(n._inline_math(text)) == inline
    math = re.compile(r"<math\b([^>]*)>.*?</math\s*>", re.IGNORECASE | re.DOTALL)
    assert n._math_to_alttext(text) == math.sub(lambda m: n._alttext(m.group(1)), text)
    body = re.compile(r"<table\b[^>]*>(.*)</table>", re.IGNORECASE | re.DOTALL)
    assert n._table_body(text) == "".join(body.findall(text))
    for pattern, closing in ((n._UNWRAPPED, ">"), (n._DROPPED_ATTRS[0], '"'), (n._COLGROUP, "</colgroup>")):
        assert n._sub_before_last(pattern, closing, text) == pattern.sub("", text)


def test_only_the_first_inline_formulas_are_rendered():
    from ocr_rewards.normalize import MAX_INLINE_FORMULAS

    assert normalize_text("$\\alpha$ " * (MAX_INLINE_FORMULAS + 1)) == "α" * MAX_INLINE_FORMULAS + "alpha"
