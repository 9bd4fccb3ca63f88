"""`ocr_reward` / `score_many`: same values as `score`, TRL inputs, dedup, metrics, workers, bounds."""
from __future__ import annotations

import pickle

import pytest

from ocr_rewards import OcrReward, ocr_reward, score, score_many
from ocr_rewards.settings import RewardSettings
from ocr_rewards.trl_reward import MIN_PARALLEL, TIMEOUT_SCORE, completion_text

TABLE = "<table><tr><td>a</td><td>b</td></tr><tr><td>1</td><td>2</td></tr></table>"
FORMULA = r"\frac{a}{b} + c"
TEXT = "The quick brown fox."
BATCH = [  # (completion, target, task_type)
    (TABLE, TABLE, "table"),
    ("<table><tr><td>a</td></tr></table>", TABLE, "table"),
    ("<table><tr><td>a</td>", TABLE, "table"),
    (r"\frac{a}{b", FORMULA, "formula"),
    ("The quick brown cat", TEXT, "text"),
    ("The quick brown cat", TEXT, "text"),  # duplicate
]


def test_ocr_reward_equals_score_and_accepts_chat_messages():
    completions = [c for c, _, _ in BATCH]
    targets, tasks = [t for _, t, _ in BATCH], [k for _, _, k in BATCH]
    expected = [score(c, t, k).value for c, t, k in BATCH]
    assert ocr_reward(["p"] * len(BATCH), completions, target=targets, task_type=tasks) == expected
    as_messages = [[{"role": "assistant", "content": c}] for c in completions]
    assert OcrReward(workers=1)([[]] * len(BATCH), as_messages, targets, tasks, trainer_state=None) == expected
    assert ocr_reward.__name__ == "ocr_reward"


def test_completion_text_forms():
    assert completion_text("x") == "x"
    assert completion_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]) == "a"
    parts = [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]
    assert completion_text([{"role": "assistant", "content": parts}]) == "ab"
    assert completion_text([{"role": "assistant", "content": None}]) == ""


def test_component_means_go_to_log_metric():
    logged = {}
    ocr_reward(None, [c for c, _, _ in BATCH], [t for _, t, _ in BATCH], [k for _, _, k in BATCH],
               log_metric=logged.__setitem__)
    table_values = [score(c, t, k) for c, t, k in BATCH if k == "table"]
    assert logged["ocr/table/reward"] == pytest.approx(sum(r.value for r in table_values) / 3)
    assert logged["ocr/table/unclosed"] == 1.0            # only the unclosed one has the component
    assert logged["ocr/table/teds_s"] == pytest.approx((1.0 + table_values[1].components["teds_s"]) / 2)
    assert logged["ocr/formula/v"] == 1.0
    assert logged["ocr/table/saturated"] == 0.0  # two non-identical tables, neither at 1.0
    assert logged["ocr/text/sim"] == pytest.approx(score("The quick brown cat", TEXT, "text").components["sim"])


def test_workers_give_the_same_results_as_in_process():
    preds = [f"<table><tr><td>{i % 7}</td><td>{i}</td></tr></table>" for i in range(MIN_PARALLEL + 8)]
    refs = [TABLE if i % 2 else TABLE.replace("b", "c") for i in range(len(preds))]
    tasks = ["table"] * len(preds)
    seen = []
    pooled = score_many(preds, refs, tasks, workers=2, on_progress=lambda done, total: seen.append((done, total)))
    assert pooled == score_many(preds, refs, tasks, workers=1)
    assert seen[-1] == (len(preds), len(preds))


def test_timeout_gives_the_documented_low_score():
    slow = "$x_1$ " * 8_000   # thousands of inline formulas through pylatexenc: well over 10 ms
    (result,) = score_many([slow], [TEXT], ["text"], workers=1, timeout_s=0.01)
    assert result.value == TIMEOUT_SCORE and result.components == {"timeout": 1.0}
    assert score_many([TEXT], [TEXT], ["text"], workers=1, timeout_s=5.0)[0].value == 1.0


def test_bad_rows_are_named():
    with pytest.raises(ValueError, match=r"row 1: unknown task 'image' \(valid: text, table, formula\)"):
        ocr_reward(None, ["a", "b"], ["a", "b"], ["text", "image"])
    with pytest.raises(ValueError, match="row 0: reference"):
        ocr_reward(None, ["a"], [None], ["text"])
    with pytest.raises(ValueError, match="lengths differ"):
        ocr_reward(None, ["a", "b"], ["a"], ["text", "text"])


def test_reward_is_picklable_with_its_settings():
    reward = pickle.loads(pickle.dumps(OcrReward(gate="absolute", workers=1, table_bonus="scaled")))
    assert (reward.__name__, reward.workers) == ("ocr_reward", 1)
    assert reward.settings == RewardSettings(gate="absolute", table_bonus="scaled")
    with pytest.raises(ValueError, match="valid gates"):
        OcrReward(gate="off")


DROP_IN = '''
from pathlib import Path
from ocr_rewards import OcrReward

with open("runs.txt", "a") as runs:  # one line per run of this top level
    runs.write("run\\n")
reward = OcrReward()
preds = [f"<table><tr><td>{i}</td><td>x</td></tr></table>" for i in range(96)]
scores = reward(None, preds, target=["<table><tr><td>1</td><td>x</td></tr></table>"] * 96, task_type=["table"] * 96)
long_ref = "word " * 20_000
scores += reward(None, [long_ref, "word word"], target=[long_ref] * 2, task_type=["text"] * 2)
Path("scores.txt").write_text(" ".join(map(str, scores)))
'''


def test_an_unguarded_script_runs_once(tmp_path):
    """The README's snippet in a script without `if __name__ == "__main__":`, in workers, with a reference
    over MAX_REF_CHARS: its top level runs once, every score is in [0, 1], it exits 0."""
    import subprocess
    import sys

    (tmp_path / "train.py").write_text(DROP_IN)
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs.txt").read_text() == "run\n"
    scores = [float(x) for x in (tmp_path / "scores.txt").read_text().split()]
    assert len(scores) == 98 and all(0.0 <= s <= 1.0 for s in scores)
    assert scores[1] == 1.0 and scores[96] == 1.0 and 0.0 < scores[97] < 0.01  # "word word" vs 100,000 chars


def test_long_references_get_the_raw_similarity():
    from ocr_rewards.scoring import MAX_LONG_REF_CHARS, MAX_REF_CHARS

    ref, pred = ("<table><tr><td>" + "a" * n + "</td></tr></table>" for n in (MAX_REF_CHARS, 60_000))
    result = score(pred, ref, "table")
    assert result.components == {"long_ref": 1.0} and result.value == pytest.approx(1 - 5_536 / len(ref))
    assert score(ref, ref, "table").value == 1.0
    assert score("a", "a" * (MAX_LONG_REF_CHARS + 1), "text").value == 0.0


def test_a_worker_that_cannot_start_names_its_cause(monkeypatch, tmp_path):
    """A worker that cannot start raises an error with its last stderr line: never zero rewards."""
    from ocr_rewards.trl_reward import RewardWorkerError, _drop_pool

    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'starting' >&2\necho 'no module named numba' >&2\nexit 1\n")
    broken.chmod(0o755)
    _drop_pool(2)
    monkeypatch.setattr("sys.executable", str(broken))
    preds = [f"<table><tr><td>{i}</td></tr></table>" for i in range(MIN_PARALLEL)]
    with pytest.raises(RewardWorkerError, match="reward worker exited with status 1: no module named numba$"):
        score_many(preds, [TABLE] * len(preds), ["table"] * len(preds), workers=2)
    _drop_pool(2)
