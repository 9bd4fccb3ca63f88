"""TEDS: PubTabNet's published values, OmniDocBench's normalized values, and equality with apted."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import Levenshtein

from helpers_anchors import omnidoc_elements, pubtabnet_pairs
from ocr_rewards import teds
from ocr_rewards.normalize import normalize_table_html
from ocr_rewards.zhang_shasha import MAX_NODES, TreeTooLarge
from teds_apted import teds_apted  # rewards/tests/teds_apted.py: the reference

# anchors README: TEDS printed in PubTabNet's demo.ipynb, TEDS-struct computed with upstream metric.py
PUBTABNET = {
    "PMC2094709_004_00.png": (1.0, 1.0),
    "PMC2871264_002_00.png": (1.0, 1.0),
    "PMC2915972_003_00.png": (0.9298260149130074, 0.971831),
    "PMC3160368_005_00.png": (0.994615695248351, 1.0),
    "PMC3568059_003_00.png": (0.9609420535891124, 0.965217),
    "PMC3707453_006_00.png": (0.8538903625110521, 0.901099),
    "PMC3765162_003_01.png": (0.9867342100509474, 1.0),
    "PMC3872294_001_00.png": (0.9863636363636363, 1.0),
    "PMC4196076_004_00.png": (0.9958653089334908, 1.0),
    "PMC4219599_004_00.png": (0.6029978075326913, 0.818605),
    "PMC4297392_007_00.png": (0.8070175438596492, 0.807018),
    "PMC4311460_007_00.png": (0.6576923076923077, 0.9),
    "PMC4357206_002_00.png": (0.9295181638546892, 1.0),
    "PMC4445578_009_01.png": (0.6754965084868096, 0.7),
    "PMC4969833_016_01.png": (1.0, 1.0),
    "PMC5303243_003_00.png": (0.6494374120956399, 0.658228),
    "PMC5451934_004_00.png": (0.9978213507625272, 1.0),
    "PMC5755158_010_01.png": (1.0, 1.0),
    "PMC5849724_006_00.png": (0.9653439200120101, 1.0),
    "PMC6022086_007_00.png": (1.0, 1.0),
}

# anchors README: (page image prefix, anno_id) -> TEDS / TEDS-struct / NED after upstream normalization
OMNIDOC_TABLES = {
    ("docstructbench_llm-raw-scihub-o.O-j.chroma.2005.05.085.pdf_4", 17): (0.8801, 0.9444, 0.0847),
    ("docstructbench_dianzishu_zhongwenzaixian-o.O-61522235.pdf_170", 7): (0.8184, 0.94, 0.1103),
    ("docstructbench_dianzishu_zhongwenzaixian-o.O-61520814.pdf_185", 6): (0.7091, 0.8182, 0.169),
    ("jiaocaineedrop_Chapter9.pdf_46", 15): (1.0, 1.0, 0.0),
    ("jiaocaineedrop_jiaocai_needrop_en_1898", 5): (0.9089, 0.9091, 0.0707),
    ("notes_1ba14cb3", 11): (0.9072, 1.0, 0.0597),
    ("notes_f7f010b7", 16): (0.8885, 0.9032, 0.1038),
    ("eastmoney_62b4", 15): (0.8513, 0.9167, 0.0906),
    ("eastmoney_62b4", 10): (1.0, 1.0, 0.0),
    ("yanbaopptmerge_0c79", 16): (0.5966, 0.7143, 0.4326),
}


@pytest.mark.parametrize("name", sorted(PUBTABNET))
def test_pubtabnet_reference_values(name):
    pred, gt = pubtabnet_pairs()[name]
    full, struct = PUBTABNET[name]
    assert teds(pred, gt, structure_only=False) == pytest.approx(full, abs=1e-6)
    assert teds(pred, gt, structure_only=True) == pytest.approx(struct, abs=1e-6)


@pytest.mark.parametrize("structure_only", [True, False])
def test_pubtabnet_fast_path_equals_apted(structure_only):
    for name, (pred, gt) in pubtabnet_pairs().items():
        assert teds(pred, gt, structure_only) == pytest.approx(teds_apted(pred, gt, structure_only),
                                                               abs=1e-9), name


def test_omnidocbench_tables_after_normalization():
    elements = omnidoc_elements("OmniDocBench_demo_table.json", "table")
    assert len(elements) == len(OMNIDOC_TABLES)
    for image, anno_id, det in elements:
        (expected,) = [v for (prefix, a), v in OMNIDOC_TABLES.items() if image.startswith(prefix) and a == anno_id]
        gt, pred = normalize_table_html(det["html"]), normalize_table_html(det["pred"])
        assert round(teds(pred, gt, structure_only=True), 4) == expected[1], (image, anno_id)
        assert round(teds(pred, gt, structure_only=False), 4) == expected[0], (image, anno_id)
        assert round(Levenshtein.normalized_distance(gt, pred), 4) == expected[2], (image, anno_id)


def test_small_cases():
    one = "<table><tr><td>a</td></tr></table>"
    two = "<table><tr><td>a</td><td>b</td></tr></table>"
    # tree: table > tr > td (> td); 3 elements below <table> in `two`, one td to insert
    assert teds(one, two) == pytest.approx(1 - 1 / 3)
    assert teds(two, two) == 1.0
    # a colspan difference is a rename; text only matters for the full TEDS
    span = '<table><tr><td colspan="2">a</td></tr></table>'
    assert teds(span, one) == pytest.approx(1 - 1 / 2)
    assert teds("<table><tr><td>x</td></tr></table>", one) == 1.0
    assert teds("<table><tr><td>ab</td></tr></table>", "<table><tr><td>ac</td></tr></table>",
                structure_only=False) == pytest.approx(1 - 0.5 / 2)


def test_fragments_and_documents_agree():
    table = "<table><thead><tr><th>h</th></tr></thead><tr><td>a</td><td>b</td></tr></table>"
    other = "<table><tr><td>h</td></tr><tr><td>a</td></tr></table>"
    document = f"<html><body>{table}</body></html>"
    assert teds(table, other) == teds(document, f"<html><body>{other}</body></html>") < 1.0
    assert teds(f"Here it is: {table} done", other) == teds(table, other)


@pytest.mark.parametrize("bad", ["", "   ", "no table at all", "<div><p>x</p></div>", "\x00\x01"])
def test_no_table_scores_zero(bad):
    assert teds(bad, "<table><tr><td>a</td></tr></table>") == 0.0
    assert teds("<table><tr><td>a</td></tr></table>", bad) == 0.0


def test_span_attributes_unparsable_by_int_do_not_raise():
    weird = '<table><tr><td colspan="2x">a</td><td rowspan="">b</td></tr></table>'
    assert teds(weird, weird) == 1.0
    assert teds(weird, "<table><tr><td>a</td><td>b</td></tr></table>") == pytest.approx(1 - 2 / 3)


def test_tree_beyond_bounds_raises():
    huge = "<table><tr>" + "<td></td>" * MAX_NODES + "</tr></table>"
    with pytest.raises(TreeTooLarge):
        teds(huge, "<table><tr><td>a</td></tr></table>")


def _random_table(rng: random.Random) -> str:
    """A random table: optional thead/tbody, th/td, spans, inline markup and text in cells."""
    def cell():
        tag = rng.choice(["td", "td", "th"])
        attrs = "".join(f' {a}="{rng.randint(1, 3)}"' for a in ("colspan", "rowspan") if rng.random() < 0.2)
        text = rng.choice(["", "a", "ab", "1.5", "x y", "<b>b</b>", "<i>q</i>r", "<sup>2</sup>"])
        return f"<{tag}{attrs}>{text}</{tag}>"

    def rows(n):
        return "".join("<tr>" + "".join(cell() for _ in range(rng.randint(0, 4))) + "</tr>" for _ in range(n))

    head = f"<thead>{rows(rng.randint(1, 2))}</thead>" if rng.random() < 0.5 else ""
    body = rows(rng.randint(0, 5))
    return f"<table>{head}{'<tbody>' + body + '</tbody>' if rng.random() < 0.5 else body}</table>"


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1), st.booleans())
def test_random_tables_equal_apted(seed, structure_only):
    rng = random.Random(seed)
    pred, ref = _random_table(rng), _random_table(rng)
    assert teds(pred, ref, structure_only) == pytest.approx(teds_apted(pred, ref, structure_only), abs=1e-9)
