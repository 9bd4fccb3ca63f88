"""Prompt pool loading (docs/spec.md §3): formats, validation naming every bad row, skip_bad, TRL prompts."""
import base64
import io
import json

import pytest
from PIL import Image

from grpo.pool import PoolError, as_prompts, load_pool


def _png(size=(12, 7), color=(200, 10, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def _write_jsonl(path, rows):
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD_TEXT = [
    {"prompt": "Text Recognition:\nhello", "target": "hello", "task_type": "text"},
    {"prompt": "Table Recognition:\na|b", "target": "<table><tr><td>a</td><td>b</td></tr></table>",
     "task_type": "table"},
    {"prompt": "Formula Recognition:\nx^2", "target": "x^2", "task_type": "formula"},
]


def test_jsonl_text_only_loads_as_written(tmp_path):
    ds = load_pool(str(_write_jsonl(tmp_path / "pool.jsonl", GOOD_TEXT)))
    assert ds.column_names == ["prompt", "target", "task_type"]
    assert ds.to_list() == GOOD_TEXT


def test_every_bad_row_is_named_with_its_reason(tmp_path):
    (tmp_path / "crops").mkdir()
    (tmp_path / "crops" / "ok.png").write_bytes(_png())
    (tmp_path / "crops" / "junk.png").write_bytes(b"not a png at all")
    ok = {"prompt": "Text Recognition:", "target": "t", "task_type": "text", "image": "crops/ok.png"}
    rows = [
        ok,
        {**ok, "task_type": "tabel"},
        {**ok, "target": None},
        "{not json",
        {**ok, "image": "crops/missing.png"},
        {**ok, "image": "crops/junk.png"},
        {**ok, "prompt": "  "},
        {**ok, "target": 7},
        ok,
    ]
    with pytest.raises(PoolError) as info:
        load_pool(str(_write_jsonl(tmp_path / "pool.jsonl", rows)))
    err = info.value
    assert [b.index for b in err.bad] == [1, 2, 3, 4, 5, 6, 7]
    reasons = {b.index: b.reason for b in err.bad}
    assert reasons[1] == "unknown task_type 'tabel' (valid: text, table, formula)"
    assert reasons[2] == "missing target"
    assert reasons[3].startswith("not JSON")
    assert reasons[4] == "image file not found: crops/missing.png"
    assert reasons[5].startswith("unreadable image (crops/junk.png)")
    assert reasons[6] == "empty prompt"
    assert reasons[7] == "target is not a string (7)"
    assert [b.line for b in err.bad] == [2, 3, 4, 5, 6, 7, 8]  # jsonl rows are named by their file line
    assert "7 bad row(s) of 9" in str(err) and "line 2: unknown task_type 'tabel'" in str(err)


def test_skip_bad_keeps_good_rows_with_their_source_index(tmp_path):
    rows = [GOOD_TEXT[0], {**GOOD_TEXT[1], "task_type": None}, GOOD_TEXT[2]]
    ds = load_pool(str(_write_jsonl(tmp_path / "pool.jsonl", rows)), skip_bad=True, index_column="pool_index")
    assert ds["pool_index"] == [0, 2]
    assert ds["target"] == [GOOD_TEXT[0]["target"], GOOD_TEXT[2]["target"]]


def test_images_by_relative_path_and_base64_decode_to_pil(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.png").write_bytes(_png((12, 7)))
    rows = [
        {**GOOD_TEXT[0], "image": "sub/a.png"},
        {**GOOD_TEXT[1], "image": {"bytes": base64.b64encode(_png((5, 9))).decode()}},
    ]
    ds = load_pool(str(_write_jsonl(tmp_path / "pool.jsonl", rows)))
    assert [ds[i]["image"].size for i in range(2)] == [(12, 7), (5, 9)]


def test_parquet_and_save_to_disk_match_jsonl(tmp_path):
    (tmp_path / "a.png").write_bytes(_png((3, 4)))
    rows = [{**r, "image": "a.png"} for r in GOOD_TEXT]
    ds = load_pool(str(_write_jsonl(tmp_path / "pool.jsonl", rows)))
    ds.to_parquet(str(tmp_path / "pool.parquet"))
    ds.save_to_disk(str(tmp_path / "pool_ds"))
    for spec in ("pool.parquet", "pool_ds"):
        other = load_pool(str(tmp_path / spec))
        assert other["target"] == ds["target"] and other["task_type"] == ds["task_type"]
        assert [im.size for im in other["image"]] == [(3, 4)] * 3


def test_missing_column_and_unknown_spec_are_refused(tmp_path):
    path = _write_jsonl(tmp_path / "pool.jsonl", [{"prompt": "p", "task_type": "text"}])
    with pytest.raises(PoolError, match="missing column"):
        load_pool(str(path))
    with pytest.raises(PoolError, match="tiny-probe"):  # lists the built-in names
        load_pool("no-such-pool")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_pool(str(tmp_path / "nope.jsonl"))


def test_all_null_image_column_means_text_only(tmp_path):
    ds = load_pool(str(_write_jsonl(tmp_path / "pool.jsonl", [{**r, "image": None} for r in GOOD_TEXT])))
    assert "image" not in ds.column_names


def test_builtin_split_validates():
    ds = load_pool("tiny-probe")
    assert len(ds) > 0 and {"prompt", "target", "task_type"} <= set(ds.column_names)


def test_as_prompts_gives_trl_prompts(tmp_path):
    from trl.data_utils import prepare_multimodal_messages

    text = load_pool(str(_write_jsonl(tmp_path / "t.jsonl", GOOD_TEXT)))
    assert as_prompts(text, is_vlm=False)["prompt"] == [r["prompt"] for r in GOOD_TEXT]
    with pytest.raises(PoolError, match="needs an image column"):
        as_prompts(text, is_vlm=True)

    (tmp_path / "a.png").write_bytes(_png((3, 4)))
    vlm = as_prompts(load_pool(str(_write_jsonl(tmp_path / "v.jsonl", [{**GOOD_TEXT[1], "image": "a.png"}]))),
                     is_vlm=True)
    row = vlm[0]
    assert row["target"] == GOOD_TEXT[1]["target"] and row["task_type"] == "table"
    # what TRL's GRPO trainer builds from the row: the image, then the task prompt
    messages = prepare_multimodal_messages(row["prompt"], images=[row["image"]])
    content = messages[0]["content"]
    assert [part["type"] for part in content] == ["image", "text"]
    assert content[0]["image"].size == (3, 4) and content[1]["text"] == GOOD_TEXT[1]["prompt"]


def test_pool_stats_command(tmp_path, capsys):
    from grpo.cli import main

    rows = [{"prompt": "p", "target": "x" * n, "task_type": t}
            for n, t in [(1, "text"), (2, "text"), (3, "text"), (4, "text"), (10, "table")]]
    path = _write_jsonl(tmp_path / "pool.jsonl", rows)
    assert main(["pool-stats", str(path), "--png", str(tmp_path / "h.png"), "--json", str(tmp_path / "s.json")]) == 0
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["tasks"]["text"]["rows"] == 4 and stats["tasks"]["text"]["p50_chars"] == 2.5
    assert stats["tasks"]["table"]["share"] == 0.2 and stats["all"]["max_chars"] == 10
    assert (tmp_path / "h.png").stat().st_size > 0

    _write_jsonl(path, rows + [{"prompt": "p", "target": "t", "task_type": "chart"}])
    capsys.readouterr()
    assert main(["pool-stats", str(path), "--png", str(tmp_path / "h.png"), "--overwrite"]) == 2
    assert "line 6: unknown task_type 'chart'" in capsys.readouterr().err


def test_bad_rows_in_a_parquet_pool_with_image_bytes(tmp_path):
    from datasets import Dataset

    Dataset.from_dict({"prompt": ["p"] * 3, "target": ["t"] * 3, "task_type": ["text", "table", "math"],
                       "image": [_png(), b"junk", _png()]}).to_parquet(str(tmp_path / "pool.parquet"))
    with pytest.raises(PoolError) as info:
        load_pool(str(tmp_path / "pool.parquet"))
    assert [b.index for b in info.value.bad] == [1, 2]
    assert "  row 1: unreadable image" in str(info.value)  # dataset rows are named by their index
    assert info.value.bad[1].reason.startswith("unknown task_type 'math'")
    assert load_pool(str(tmp_path / "pool.parquet"), skip_bad=True)[0]["image"].size == (12, 7)
