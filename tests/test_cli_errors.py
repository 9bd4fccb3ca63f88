"""User mistakes through `grpo.cli.main`: exit 2, one `error:` message naming the culprit, no traceback.

Every case runs at `COLUMNS=40` under a folder named `[exp1]`: the message must keep the bracketed path whole
(rich markup would eat `[exp1]`) and unbroken (soft wrap). `-v` adds the traceback.
"""
from __future__ import annotations

import json
import shutil

import pytest

from grpo.block_diffusion import BD_FILE
from grpo.model_source import TINY_MODEL
from grpo.cli import main
from helpers_cli import refused

GOOD_ROW = {"prompt": "read the text", "target": "hello", "task_type": "text"}


def _jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


# each case: (name, argv builder(folder) -> (argv, culprits))
def _unknown_key(d):
    return ["train", "--set", "tpf_evry=1"], ["unknown config key 'tpf_evry'", "tpf_every"]


def _broken_yaml(d):
    (d / "run.yaml").write_text("max_steps: [1, 2\n")
    return (["train", "--config", str(d / "run.yaml")],
            [f"{d / 'run.yaml'}: not valid YAML (line 2, column 1: while parsing a flow sequence"])


def _missing_config(d):
    return ["joint", "--config", str(d / "nope.yaml")], [f"config file {d / 'nope.yaml'} does not exist"]


def _pool_stats_missing(d):
    return ["pool-stats", str(d / "missing.jsonl")], [f"prompt pool {d / 'missing.jsonl'}: no such file"]


def _mine_missing(d):
    return (["mine", "--data", str(d / "missing.jsonl"), "--out", str(d / "out")],
            [f"prompt pool {d / 'missing.jsonl'}: no such file"])


def _tpf_missing(d):
    return ["tpf", "--data", str(d / "missing.jsonl")], [f"prompt pool {d / 'missing.jsonl'}: no such file"]


def _bad_row(d):
    pool = _jsonl(d / "pool.jsonl", [GOOD_ROW, {**GOOD_ROW, "task_type": "chart"}])
    return (["pool-stats", pool, "--png", str(d / "h.png")],
            [f"prompt pool {pool}: 1 bad row(s) of 2", "(flag --skip-bad)", "line 2: unknown task_type 'chart'"])


def _no_config_json(d):
    (d / "ckpt").mkdir()
    return (["tpf", "--model", str(d / "ckpt"), "--data", "tiny-probe"],
            [f"no Hugging Face checkpoint at {d / 'ckpt'} (config.json missing)"])


def _no_drafter(d):
    shutil.copytree(TINY_MODEL, d / "plain", ignore=shutil.ignore_patterns(BD_FILE))
    return ["tpf", "--model", str(d / "plain"), "--data", "tiny-probe"], [str(d / "plain"), f"{BD_FILE} is missing"]


def _bad_shard(d):
    return (["mine", "--data", "tiny", "--out", str(d / "out"), "--shard", "3/2"],
            ["shard '3/2': need 0 <= I < N", "(flag --shard)"])


def _bad_pairs(d):
    pairs = _jsonl(d / "pairs.jsonl", [{"pred": "a", "ref": "a", "task": "text"}, "not json"])
    return ["score", "--pairs", pairs], [f"{pairs}: 1 bad line(s)", "line 2: not JSON"]


def _bad_bounds(d):
    pairs = _jsonl(d / "pairs.jsonl", [{"pred": "a", "ref": "a", "task": "text", "min": 0.9, "max": 0.5},
                                       {"pred": "a", "ref": "a", "task": "text", "expect": "1"}])
    return (["score", "--pairs", pairs, "--check"],
            [f"{pairs}: 2 bad line(s)", "line 1: 'min' 0.9 is above 'max' 0.5",
             "line 2: field 'expect' must be a finite number"])


def _missing_pairs(d):
    return ["score", "--pairs", str(d / "none.jsonl")], [f"pairs file {d / 'none.jsonl'}: no such file"]


CASES = [_unknown_key, _broken_yaml, _missing_config, _pool_stats_missing, _mine_missing, _tpf_missing, _bad_row,
         _no_config_json, _no_drafter, _bad_shard, _bad_pairs, _bad_bounds, _missing_pairs]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_user_mistake_is_one_message(case, here, capsys):
    argv, culprits = case(here)  # the culprits that name a file hold its whole path, "[exp1]" included
    refused(capsys, argv, *culprits)


def test_verbose_adds_the_traceback(here, capsys):
    assert main(["-v", "pool-stats", str(here / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "MissingFileError" in err
    assert err.rstrip().splitlines()[-1] == f"error: prompt pool {here / 'missing.jsonl'}: no such file"


# ---------------------------------------------------------------- issue 17 (hostile inputs); more in test_hostile_cli.py

def _missing_pred_file(d):
    return (["score", "--task", "table", "--pred", str(d / "pred.html"), "--ref-text", "<table></table>"],
            [f"prediction file {d / 'pred.html'}: no such file"])


def _pairs_not_utf8(d):
    pairs = d / "pairs.jsonl"
    pairs.write_bytes(b'{"pred": "a", "ref": "a", "task": "text"}\n{"pred": "\xe9", "ref": "a", "task": "text"}\n')
    return ["score", "--pairs", str(pairs)], [f"{pairs}: 1 bad line(s)", "line 2: not UTF-8 text (byte 0xe9"]


def _pairs_unknown_field(d):
    pairs = _jsonl(d / "pairs.jsonl", [{"pred": "a", "ref": "a", "task": "text", "expected": 1}])
    return ["score", "--pairs", pairs, "--check"], ["line 1: unknown field(s) 'expected' (did you mean 'expect'?)"]


def _corrupt_parquet(d):
    (d / "pool.parquet").write_bytes(b"PAR1 nothing else")
    return ["pool-stats", str(d / "pool.parquet")], [f"prompt pool {d / 'pool.parquet'}: not a readable parquet file"]


def _folder_not_a_dataset(d):
    (d / "pool").mkdir()
    return ["pool-stats", str(d / "pool")], [f"prompt pool {d / 'pool'}: a folder without state.json"]


def _empty_png(d):
    return ["pool-stats", "tiny-probe", "--png", ""], ["--png '': give a file path"]


def _accelerate_list(d):
    (d / "acc.yaml").write_text("- 1\n- 2\n")
    return (["train", "--dry-run", "--accelerate-config", str(d / "acc.yaml")],
            [f"accelerate config {d / 'acc.yaml'}: a list, expected a mapping"])


HOSTILE_CASES = [_missing_pred_file, _pairs_not_utf8, _pairs_unknown_field, _corrupt_parquet, _folder_not_a_dataset,
                 _empty_png, _accelerate_list]


@pytest.mark.parametrize("case", HOSTILE_CASES, ids=[c.__name__.strip("_") for c in HOSTILE_CASES])
def test_hostile_input_is_one_message(case, here, capsys):
    argv, culprits = case(here)
    refused(capsys, argv, *culprits)
