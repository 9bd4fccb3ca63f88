"""Reward regression cases: `ocr_rewards.regression`, `ocr-rewards check` and `score --pairs FILE --check`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ocr_rewards.cli import main
from ocr_rewards.regression import Bounds, PairsError, assert_pairs, check_pairs, read_pairs

CASES = Path(__file__).resolve().parent / "fixtures" / "reward_cases.jsonl"  # hand-written, one per behaviour
PRED, REF = "<table><tr><td>a</td></tr></table>", "<table><tr><td>a</td><td>b</td></tr></table>"


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_committed_cases_hold():
    assert_pairs(CASES)


def test_bounds():
    assert Bounds(expect=0.5).interval == (0.5 - 1e-6, 0.5 + 1e-6)
    assert Bounds(expect=0.5, tol=0.1, min=0.45).interval == (0.45, 0.6)
    assert Bounds(max=0.2).holds(0.0) and not Bounds(min=0.3).holds(0.29)
    assert str(Bounds(expect=0.9, tol=0.01, max=1)) == "expect 0.9 ± 0.01, max 1"


def test_check_passes_and_fails_by_line(tmp_path, capsys):
    good = _write(tmp_path / "good.jsonl", [{"pred": PRED, "ref": REF, "task": "table", "min": 0.5, "max": 0.6},
                                            {"pred": "a", "ref": "a", "task": "text"}])  # no bounds: not checked
    assert main(["score", "--pairs", str(good), "--check", "--workers", "1"]) == 0
    assert "all 1 case(s) within their bounds" in capsys.readouterr().out

    bad = _write(tmp_path / "bad.jsonl", [{"pred": "a", "ref": "a", "task": "text", "expect": 1},
                                          {"pred": PRED, "ref": REF, "task": "table", "expect": 0.9, "tol": 0.01}])
    assert main(["score", "--pairs", str(bad), "--check", "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "line 2 (table): reward 0.533333 outside expect 0.9 ± 0.01; components: teds_s" in out
    assert "line 1" not in out and "1 of 2 case(s) outside their bounds" in out
    (failure,) = check_pairs(bad)
    assert failure.line == 2 and failure.components["teds_s"] < 1

    assert main(["score", "--pairs", str(bad), "--check", "--workers", "1", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)["check"]
    assert report["checked"] == 2 and [f["line"] for f in report["failures"]] == [2]
    with pytest.raises(AssertionError, match="line 2 \\(table\\)"):
        assert_pairs(bad)


@pytest.mark.parametrize("fields, reason", [
    ({"min": 0.9, "max": 0.5}, "'min' 0.9 is above 'max' 0.5"),
    ({"expect": "high"}, "field 'expect' must be a finite number"),
    ({"max": True}, "field 'max' must be a finite number"),
    ({"expect": 1, "tol": -0.1}, "field 'tol' must be >= 0"),
    ({"tol": 0.1}, "field 'tol' needs 'expect'"),
])
def test_bad_expectations_name_the_line(tmp_path, fields, reason):
    path = _write(tmp_path / "cases.jsonl", [{"pred": "a", "ref": "a", "task": "text"},
                                             {"pred": "a", "ref": "a", "task": "text", **fields}])
    with pytest.raises(PairsError, match="1 bad line") as info:
        read_pairs(path)
    assert f"line 2: {reason}" in str(info.value)


def test_check_needs_bounds(tmp_path, capsys):
    path = _write(tmp_path / "plain.jsonl", [{"pred": "a", "ref": "a", "task": "text"}])
    assert main(["score", "--pairs", str(path), "--check"]) == 2
    assert "no line carries expect, min or max" in capsys.readouterr().err


def test_check_command_exit_codes(tmp_path, capsys):
    good = _write(tmp_path / "good.jsonl", [{"pred": PRED, "ref": REF, "task": "table", "min": 0.5, "max": 0.6}])
    bad = _write(tmp_path / "bad.jsonl", [{"pred": PRED, "ref": REF, "task": "table", "expect": 1}])
    assert main(["check", str(good), "--workers", "1"]) == 0
    assert main(["check", str(bad), "--workers", "1"]) == 1
    assert "line 1 (table)" in capsys.readouterr().out
    assert main(["check", str(tmp_path / "missing.jsonl")]) == 2


def test_a_crash_is_never_the_failed_check_code(monkeypatch, tmp_path, capsys):
    import ocr_rewards.trl_reward

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(ocr_rewards.trl_reward, "score_many", broken)
    good = _write(tmp_path / "good.jsonl", [{"pred": "a", "ref": "a", "task": "text", "expect": 1}])
    assert main(["check", str(good)]) == 70
    err = capsys.readouterr().err
    assert "RuntimeError: a bug" in err and "internal error" in err
