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
