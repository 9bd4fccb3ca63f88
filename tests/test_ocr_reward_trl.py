"""The snippet of docs/ocr_reward.md, run as it stands: plain `trl.GRPOTrainer` with `OcrReward` trains, and
each completion's reward components reach TRL's completions table."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "ocr_reward.md"

pytestmark = pytest.mark.slow


def snippet() -> str:
    """The first Python block of the doc."""
    return re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)


def test_the_documented_snippet_trains_and_logs_each_completion(tmp_path, monkeypatch):
    import pandas as pd

    from grpo.pool import load_pool
    from ocr_rewards import score

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(REPO / "data", target_is_directory=True)
    rows = load_pool("tiny").select(range(16))  # all three tasks
    rows.to_json("my_pool.jsonl")
    namespace: dict = {}
    exec(compile(snippet(), str(DOC), "exec"), namespace)

    assert namespace["trainer"].state.global_step == 2
    target = dict(zip(rows["prompt"], zip(rows["target"], rows["task_type"])))
    tables = sorted(Path("runs/ocr_reward/completions").glob("completions_*.parquet"))
    assert [t.name for t in tables] == ["completions_00001.parquet", "completions_00002.parquet"]
    logged = pd.concat([pd.read_parquet(t) for t in tables])
    assert len(logged) == 16 and {"ocr/task", "ocr/g"} <= set(logged.columns)
    for row in logged.to_dict("records"):
        ref, task = target[row["prompt"]]
        expected = score(row["completion"], ref, task, table_bonus="scaled")
        assert row["ocr/task"] == task
        assert row["ocr_reward"] == pytest.approx(expected.value, abs=1e-6)  # TRL logs float32
        for column, value in row.items():
            if column.startswith("ocr/") and column != "ocr/task":
                name = column.removeprefix("ocr/")
                if name in expected.components:
                    assert value == pytest.approx(expected.components[name])
                else:
                    assert value is None or math.isnan(value)  # parquet stores a missing float as NaN
