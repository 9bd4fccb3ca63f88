"""Loading of the held-out anchors vendored in `tests/fixtures/anchors/` (sources and licenses in its README)."""
from __future__ import annotations

import json
from pathlib import Path

ANCHORS = Path(__file__).resolve().parent / "fixtures" / "anchors"


def load(name: str):
    return json.loads((ANCHORS / name).read_text(encoding="utf-8"))


def pubtabnet_pairs() -> dict[str, tuple[str, str]]:
    """filename -> (prediction HTML, ground-truth HTML), as given."""
    gt, pred = load("pubtabnet_sample_gt.json"), load("pubtabnet_sample_pred.json")
    return {name: (pred[name], gt[name]["html"]) for name in gt}


def omnidoc_elements(name: str, category: str) -> list[tuple[str, int, dict]]:
    """(page image, anno_id, layout element) of one category in an OmniDocBench demo file."""
    return [(page["page_info"]["image_path"], det["anno_id"], det) for page in load(name)
            for det in page["layout_dets"] if det["category_type"] == category]


def all_references() -> list[str]:
    """Every reference string of the anchors: PubTabNet and OmniDocBench tables, display formulas."""
    refs = [gt for _, gt in pubtabnet_pairs().values()]
    refs += [det["html"] for _, _, det in omnidoc_elements("OmniDocBench_demo_table.json", "table")]
    refs += [det["latex"] for _, _, det in
             omnidoc_elements("OmniDocBench_demo_formula.json", "equation_isolated")]
    return refs
