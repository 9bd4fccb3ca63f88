"""`gravity-grpo score` through `grpo.cli.main`."""
from __future__ import annotations

import json

import pytest

from grpo.cli import main
from ocr_rewards import score

PRED = "<table><tr><td>a</td></tr></table>"
REF = "<table><tr><td>a</td><td>b</td></tr></table>"


def test_single_pair_from_text_and_files(tmp_path, capsys):
    assert main(["score", "--task", "table", "--pred-text", PRED, "--ref-text", REF]) == 0
    expected = score(PRED, REF, "table").value
    assert f"{expected:.6f}" in capsys.readouterr().out
    (tmp_path / "pred.html").write_text(PRED, encoding="utf-8")
    (tmp_path / "ref.html").write_text(REF, encoding="utf-8")
    assert main(["score", "--task", "table", "--pred", str(tmp_path / "pred.html"),
                 "--ref", str(tmp_path / "ref.html"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == score(PRED, REF, "table").as_dict()


def test_explain_lists_the_components(capsys):
    assert main(["score", "--task", "table", "--pred-text", PRED, "--ref-text", REF, "--explain"]) == 0
    out = capsys.readouterr().out
    for name in ("teds_s", "s_cell", "p_row", "p_loop", "bonus_rows", "bonus_cols", "g"):
        assert name in out


def test_score_prints_one_reward_line_with_and_without_explain(capsys):
    line = f"table reward: {score(PRED, REF, 'table').value:.6f}"
    assert main(["score", "--task", "table", "--pred-text", PRED, "--ref-text", REF]) == 0
    assert capsys.readouterr().out.splitlines() == [line]
    assert main(["score", "--task", "table", "--pred-text", PRED, "--ref-text", REF, "--explain"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == line


def test_check_explain_lists_every_case(tmp_path, capsys):
    from ocr_rewards.cli import main as ocr_main

    pairs = tmp_path / "cases.jsonl"
    pairs.write_text(json.dumps({"pred": "hello", "ref": "hello", "task": "text", "expect": 1.0}) + "\n" +
                     json.dumps({"pred": "x", "ref": "hello", "task": "text", "min": 0.9}) + "\n" +
                     json.dumps({"pred": "a", "ref": "a", "task": "text"}) + "\n", encoding="utf-8")
    assert ocr_main(["check", str(pairs), "--workers", "1", "--explain"]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if line]  # the progress bar leaves a blank
    assert lines[0].startswith("line 1 (text): reward 1.000000 within expect 1 ± 1e-06; components: ")
    assert lines[1].startswith("line 2 (text): reward ") and " outside min 0.9; components: " in lines[1]
    assert lines[2].startswith("line 3 (text): reward 1.000000 (no bounds); components: ")
    assert lines[3] == f"{pairs}: 1 of 2 case(s) outside their bounds"
    assert ocr_main(["check", str(pairs), "--workers", "1"]) == 1  # without --explain: the failure alone
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line] == \
        ["line 2 (text)", str(pairs)]


def test_pairs_file_summary(tmp_path, capsys):
    rows = [{"pred": PRED, "ref": REF, "task": "table"}, {"pred": REF, "ref": REF, "task": "table"},
            {"pred": "x^2", "ref": "x^{2}", "task": "formula"}, {"pred": "hello", "ref": "hello", "task": "text"}]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    assert main(["score", "--pairs", str(pairs), "--workers", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["line"] for r in report["results"]] == [1, 2, 3, 4]
    table_mean = (score(PRED, REF, "table").value + 1.0) / 2
    assert report["summary"]["table"]["n"] == 2
    assert report["summary"]["table"]["mean"] == pytest.approx(table_mean)
    assert report["summary"]["formula"]["mean"] == 1.0
    assert main(["score", "--pairs", str(pairs), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "table" in out and "formula" in out and f"{table_mean:.4f}" in out


def test_bad_pairs_lines_are_reported_by_number(tmp_path, capsys):
    pairs = tmp_path / "bad.jsonl"
    pairs.write_text('{"pred": "a", "ref": "a", "task": "text"}\nnot json\n{"pred": "a", "task": "text"}\n'
                     '{"pred": "a", "ref": "a", "task": "image"}\n', encoding="utf-8")
    assert main(["score", "--pairs", str(pairs)]) == 2
    err = capsys.readouterr().err
    assert "3 bad line(s)" in err
    assert "line 2: not JSON" in err and "line 3: missing or non-string field(s) ref" in err
    assert "line 4: unknown task 'image'" in err and "line 1" not in err


def test_missing_or_conflicting_arguments(capsys):
    assert main(["score", "--task", "text", "--pred-text", "a"]) == 2
    assert "give --task, --pred FILE (or --pred-text TEXT) and --ref FILE" in capsys.readouterr().err
    assert main(["score", "--pairs", "x.jsonl", "--pred", "a"]) == 2
    assert "cannot be combined" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["score", "--task", "image", "--pred-text", "a", "--ref-text", "a"])
    with pytest.raises(SystemExit):  # a file and a text for one side
        main(["score", "--task", "text", "--pred", "a.txt", "--pred-text", "a", "--ref-text", "a"])


def test_a_file_argument_is_a_file(tmp_path, capsys):
    """--pred/--ref never score the text of a path: a missing, binary or non-UTF-8 file is an error naming it."""
    (tmp_path / "ref.txt").write_bytes(b"\xef\xbb\xbfhello")  # a byte-order mark is accepted
    (tmp_path / "latin1.txt").write_bytes("h\xe9llo".encode("latin-1"))
    (tmp_path / "nul.txt").write_bytes(b"a\0b")
    ref = str(tmp_path / "ref.txt")
    assert main(["score", "--task", "text", "--pred-text", "hello", "--ref", ref, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["value"] == 1.0
    for name, message in (("missing.txt", "no such file"), ("latin1.txt", "not UTF-8 text (byte 0xe9 at offset 1)"),
                          ("nul.txt", "a binary file (NUL byte at offset 1)")):
        assert main(["score", "--task", "text", "--pred", str(tmp_path / name), "--ref", ref]) == 2
        assert f"error: prediction file {tmp_path / name}: {message}" in capsys.readouterr().err


def test_think_blocks_are_removed_unless_kept(capsys):
    """Check `think-strip` through the command: `--explain` says a block was removed; `--think keep` scores it."""
    pair = ["score", "--task", "text", "--pred-text", "<think>\n</think>\nHello world", "--ref-text", "Hello world"]
    assert main(pair + ["--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["value"] == 1.0 and result["components"]["think_removed"] == 1.0
    assert main(pair + ["--explain"]) == 0
    assert "think_removed" in capsys.readouterr().out
    assert main(pair + ["--think", "keep", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["value"] == pytest.approx(10 / 19)
