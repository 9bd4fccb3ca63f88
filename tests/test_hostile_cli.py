"""Hostile inputs through `grpo.cli.main` (issue 17): each ends in exit 2 with one message naming the culprit
and no traceback, or exit 0 where the input was valid after all; no command changes a byte of its inputs.

Every case runs at `COLUMNS=40` under a folder named `[exp1]` (rich markup would eat the brackets). Mining
shards are built without a model: the real `assemble` on made-up rollout statistics. The readers of pools
and pairs are also fed arbitrary bytes (hypothesis): they give rows or one `UserError`, nothing else.
"""
from __future__ import annotations

import json
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo.cli import main
from helpers_cli import refused, snapshot
from grpo.errors import UserError

GOOD_ROW = {"prompt": "read the text", "target": "hello", "task_type": "text"}
PAIR = {"pred": "a", "ref": "a", "task": "text"}
BOM = b"\xef\xbb\xbf"


def _lines(path: Path, rows, prefix: bytes = b"") -> Path:
    """A jsonl file: dicts as JSON, str and bytes lines as given."""
    data = b"".join((r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r)).encode()) + b"\n"
                    for r in rows)
    path.write_bytes(prefix + data)
    return path


def _accepted(capsys, argv: list[str], inputs: tuple[Path, ...] = ()) -> str:
    before = snapshot(*inputs)
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    assert "error:" not in err and "Traceback" not in err
    assert snapshot(*inputs) == before
    return out


# ------------------------------------------------------------------------------------- mining shards

def _shards(folder: Path, n: int = 2, rows: int = 6) -> list[Path]:
    """Finished `mine --shard I/N` outputs of the first `rows` rows of the tiny pool, without a model."""
    from grpo.pool import load_pool
    from grpo.mining.miner import assemble
    from grpo.mining.selection import RankRule
    from grpo.rollouts.sampling import INDEX
    from grpo.mining.store import MiningStore

    pool = load_pool("tiny", index_column=INDEX).select(range(rows))
    outs = []
    for i in range(n):
        ds = pool.select(range(i, rows, n))
        run = MiningStore(folder / f"s{i}")
        run.parts.mkdir(parents=True)
        records = [{INDEX: index, "task_type": task, "ref_chars": len(target), "reward_mean": 0.1 * (index % 5),
                    "reward_std": 0.2, "reward_min": 0.0, "reward_max": 0.9, "rewards": [0.0, 0.9],
                    "completion_tokens_mean": 5.0, "truncated": 0}
                   for index, task, target in zip(ds[INDEX], ds["task_type"], ds["target"])]
        run.write_part(records)
        assemble(ds, run.read_parts(), run, RankRule(), 0.0, None, {"model": "m", "data": "tiny", "shard": [i, n]})
        outs.append(run.out)
    return outs


@pytest.fixture
def shards(here):
    return _shards(here)


def test_merge_refuses_an_input_as_its_output(here, shards, capsys):
    s0, s1 = map(str, shards)
    refused(capsys, ["mine-merge", s0, s1, "--out", s0], f"output {s0} is the input {s0}", "(flag --out)",
             inputs=tuple(shards))
    refused(capsys, ["mine-merge", s0, s1, "--out", f"{s1}/merged"], f"lies inside the input {s1}",
             inputs=tuple(shards))
    refused(capsys, ["mine-merge", s0, s1, "--out", str(here)], "holds the input", inputs=tuple(shards))
    assert not (shards[1] / "merged").exists()


def test_merge_replaces_only_its_own_output_and_only_with_overwrite(here, shards, capsys):
    from datasets import Dataset, load_from_disk

    s0, s1 = map(str, shards)
    Dataset.from_dict({"prompt": ["mine"], "target": ["t"], "task_type": ["text"]}).save_to_disk("mypool")
    (here / "notes").mkdir()
    (here / "notes" / "todo.txt").write_text("my notes")
    for folder in ("mypool", "notes"):
        for extra in ([], ["--overwrite"]):
            refused(capsys, ["mine-merge", s0, s1, "--out", folder, *extra],
                    f"output {folder} is not empty and holds no mining output", "(flag --out)", inputs=(here,))
    assert load_from_disk("mypool")["prompt"] == ["mine"]
    _accepted(capsys, ["mine-merge", s0, s1, "--out", "merged"], inputs=tuple(shards))
    refused(capsys, ["mine-merge", s0, s1, "--out", "merged"], "output merged exists and is not empty",
            "(flag --overwrite)", inputs=(here,))
    before = load_from_disk("merged")["pool_index"]
    _accepted(capsys, ["mine-merge", s0, s1, "--out", "merged", "--overwrite"], inputs=tuple(shards))
    assert load_from_disk("merged")["pool_index"] == before and sorted(before) == list(range(6))
    assert not [p for p in here.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def _damage_done(s0: Path) -> str:
    (s0 / "mining" / "done.json").write_text("{half")
    return f"{s0 / 'mining' / 'done.json'}: not JSON"


def _damage_part(s0: Path) -> str:
    (part,) = (s0 / "mining" / "parts").glob("part-*.jsonl")
    with part.open("ab") as f:
        f.write(b"\xff\xfe\n")
    return f"{part} is damaged: line 4: not UTF-8 text"


def _damage_arrow(s0: Path) -> str:
    (arrow,) = s0.glob("data-*.arrow")
    arrow.write_bytes(b"junk")
    return f"{arrow} is damaged"


def _damage_state(s0: Path) -> str:
    (s0 / "state.json").unlink()
    (s0 / "dataset_info.json").unlink()
    return f"mining output {s0}: a folder without state.json"


@pytest.mark.parametrize("damage", [_damage_done, _damage_part, _damage_arrow, _damage_state],
                         ids=lambda f: f.__name__[len("_damage_"):])
def test_merge_names_the_damaged_file(here, shards, capsys, damage):
    culprit = damage(shards[0])
    refused(capsys, ["mine-merge", *map(str, shards), "--out", "merged"], culprit, inputs=tuple(shards))
    assert not (here / "merged").exists()


def test_a_failed_rebuild_puts_the_old_folder_back(here):
    from grpo.outputs import set_aside

    old = here / "out"
    old.mkdir()
    (old / "data.bin").write_bytes(b"\x00old")
    with pytest.raises(RuntimeError), set_aside(old):
        old.mkdir()
        (old / "half.bin").write_bytes(b"new")
        raise RuntimeError("interrupted")
    assert snapshot(old) == {str(old / "data.bin"): b"\x00old"}
    assert [p.name for p in here.iterdir()] == ["out"]


def test_mine_refuses_a_folder_it_did_not_create(here, capsys):
    from datasets import Dataset

    Dataset.from_dict({k: [v] for k, v in GOOD_ROW.items()}).save_to_disk("mypool")
    refused(capsys, ["mine", "--data", "tiny", "--out", "mypool"], "output mypool is not empty and holds no "
             "mining run", inputs=(here,))
    refused(capsys, ["mine", "--data", "mypool", "--out", "mypool"], "output mypool is the input mypool",
             inputs=(here,))


# ------------------------------------------------------------------------------------- score

def test_score_never_scores_a_path(here, capsys):
    """The README's example with files that do not exist, are binary or are not UTF-8."""
    (here / "bin.html").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (here / "latin.html").write_bytes("<table><tr><td>\xe9</td></tr></table>".encode("latin-1"))
    for pred, culprit in (("pred.html", "prediction file pred.html: no such file"),
                          ("bin.html", "prediction file bin.html: a binary file (NUL byte at offset 8)"),
                          ("latin.html", "prediction file latin.html: not UTF-8 text (byte 0xe9 at offset 15)"),
                          (str(here), f"prediction file {here}: not a file")):
        refused(capsys, ["score", "--task", "table", "--pred", pred, "--ref-text", "<table></table>"], culprit,
                 inputs=(here,))
    refused(capsys, ["score", "--task", "table", "--pred-text", "x", "--ref", "ref.html"],
             "reference file ref.html: no such file")


def test_score_reads_files_with_a_byte_order_mark(here, capsys):
    (here / "ref.txt").write_bytes(BOM + b"hello world")
    out = _accepted(capsys, ["score", "--task", "text", "--pred-text", "hello world", "--ref", "ref.txt", "--json"],
                    inputs=(here,))
    assert json.loads(out)["value"] == 1.0


def test_references_have_a_size_cap(here, capsys):
    from ocr_rewards.scoring import MAX_REF_CHARS

    (here / "big.txt").write_text("x" * (MAX_REF_CHARS + 1))
    refused(capsys, ["score", "--task", "text", "--pred-text", "x", "--ref", "big.txt"],
             f"reference file big.txt: reference of {MAX_REF_CHARS + 1:,} characters is over the limit")
    pairs = _lines(here / "pairs.jsonl", [PAIR, {**PAIR, "ref": "x" * (MAX_REF_CHARS + 1)}])
    refused(capsys, ["score", "--pairs", str(pairs)], "line 2: field 'ref': reference of", inputs=(pairs,))
    pool = _lines(here / "pool.jsonl", [GOOD_ROW, {**GOOD_ROW, "target": "t" * (MAX_REF_CHARS + 1)}])
    refused(capsys, ["pool-stats", str(pool)], "line 2: target: reference of", inputs=(pool,))


def test_pairs_lines(here, capsys):
    typo = _lines(here / "typo.jsonl", [PAIR, {**PAIR, "expected": 0.5}])
    refused(capsys, ["score", "--pairs", str(typo), "--check"],
             "line 2: unknown field(s) 'expected' (did you mean 'expect'?)", inputs=(typo,))
    broken = _lines(here / "broken.jsonl", [PAIR, b'{"pred": "\xff", "ref": "a", "task": "text"}', "", "[1"])
    refused(capsys, ["score", "--pairs", str(broken)], "2 bad line(s)",
             "line 2: not UTF-8 text (byte 0xff at column 11)", "line 4: not JSON", inputs=(broken,))
    bom = _lines(here / "bom.jsonl", [PAIR, "", PAIR], prefix=BOM)
    out = _accepted(capsys, ["score", "--pairs", str(bom), "--json", "--workers", "1"], inputs=(bom,))
    assert [r["line"] for r in json.loads(out)["results"]] == [1, 3]  # file lines, blank ones counted
    with pytest.raises(SystemExit) as info:  # argparse's own usage error
        main(["score", "--pairs", str(bom), "--workers", "0"])
    assert info.value.code == 2 and "argument --workers: expected an integer from 1 to" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- pools

def test_pool_rows_are_named_where_the_user_finds_them(here, capsys):
    from datasets import Dataset

    pool = _lines(here / "pool.jsonl", [GOOD_ROW, "", {**GOOD_ROW, "task_type": "chart"}, b"\xc3("])
    refused(capsys, ["pool-stats", str(pool)], "2 bad row(s) of 3", "line 3: unknown task_type 'chart'",
             "line 4: not UTF-8 text (byte 0xc3 at column 1)", inputs=(pool,))
    Dataset.from_dict({k: [v, v] for k, v in GOOD_ROW.items()} | {"task_type": ["text", "chart"]}) \
        .to_parquet(str(here / "pool.parquet"))
    refused(capsys, ["pool-stats", "pool.parquet"], "row 1: unknown task_type 'chart'", inputs=(here,))


def test_unreadable_pools_name_the_file(here, capsys):
    (here / "bad.parquet").write_bytes(b"PAR1 not really")
    refused(capsys, ["pool-stats", "bad.parquet"], "prompt pool bad.parquet: not a readable parquet file",
             inputs=(here,))
    (here / "empty").mkdir()
    refused(capsys, ["pool-stats", "empty"], "prompt pool empty: a folder without state.json",
             "expected a save_to_disk folder, .parquet, .jsonl", inputs=(here,))
    (here / "shards").mkdir()
    (here / "bad.parquet").rename(here / "shards" / "part-0.parquet")
    refused(capsys, ["pool-stats", "shards"], "prompt pool shards: a folder of parquet files", inputs=(here,))


def test_reading_a_dataset_folder_adds_no_file_to_it(here, capsys):
    import io

    from datasets import Dataset
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (4, 3)).save(png, format="PNG")
    Dataset.from_dict({**{k: [v, v] for k, v in GOOD_ROW.items()}, "image": [png.getvalue()] * 2}) \
        .save_to_disk("pool")
    _accepted(capsys, ["pool-stats", "pool"], inputs=(here / "pool",))
    assert sorted(p.name for p in (here / "pool").iterdir()) == ["data-00000-of-00001.arrow", "dataset_info.json",
                                                                 "state.json"]


def test_mixed_value_types_name_line_and_column(here, capsys):
    pool = _lines(here / "pool.jsonl", [{**GOOD_ROW, "meta": 1}, "", {**GOOD_ROW, "meta": "one"}])
    refused(capsys, ["pool-stats", str(pool)], "line 3: column 'meta' holds str ('one') where the lines before "
             "hold int", inputs=(pool,))
    huge = _lines(here / "huge.jsonl", [{**GOOD_ROW, "n": 10 ** 30}])
    refused(capsys, ["pool-stats", str(huge)], "line 1: column 'n' holds int", inputs=(huge,))


def test_a_byte_order_mark_is_accepted(here, capsys):
    pool = _lines(here / "pool.jsonl", [GOOD_ROW], prefix=BOM)
    _accepted(capsys, ["pool-stats", str(pool)], inputs=(pool,))
    assert sorted(p.name for p in here.iterdir()) == ["pool.jsonl"]  # and no PNG unless asked


def test_pool_stats_writes_only_where_asked(here, capsys):
    pool = _lines(here / "pool.jsonl", [GOOD_ROW])
    for png, culprit in (("", "--png '': give a file path"), ("lengths.jpg", "must end in .png"),
                         ("no/such/dir/l.png", "the folder no/such/dir does not exist (none is created)"),
                         (str(here), "is a folder")):
        refused(capsys, ["pool-stats", str(pool), "--png", png], culprit, inputs=(here,))
    refused(capsys, ["pool-stats", str(pool), "--json", str(pool)], f"--json {pool} is the input {pool}",
             inputs=(pool,))
    assert sorted(p.name for p in here.iterdir()) == ["pool.jsonl"]
    _accepted(capsys, ["pool-stats", str(pool), "--png", "l.png", "--json", "s.json"], inputs=(pool,))
    assert sorted(p.name for p in here.iterdir()) == ["l.png", "pool.jsonl", "s.json"]  # no temporary left


def test_no_writer_replaces_a_special_file(here, capsys):
    import os
    import stat

    from grpo.outputs import atomic_write

    os.mkfifo(here / "pipe.json")
    refused(capsys, ["pool-stats", "tiny-probe", "--json", "pipe.json"], "--json pipe.json exists and is not a "
             "regular file")
    with pytest.raises(UserError, match="is not a regular file; refusing to replace it"):
        atomic_write(here / "pipe.json", "{}")
    assert stat.S_ISFIFO(os.stat(here / "pipe.json").st_mode)


def test_a_damaged_checkpoint_config_is_named(here, capsys):
    (here / "ckpt").mkdir()
    (here / "ckpt" / "config.json").write_text("{half")
    refused(capsys, ["mine", "--model", "ckpt", "--data", "tiny", "--out", "out"], "ckpt/config.json: not JSON",
             inputs=(here,))
    assert not (here / "out").exists()


def test_narrow_terminal_gets_readable_rows(here, capsys, monkeypatch):
    from grpo.console import console

    monkeypatch.setattr(type(console), "is_terminal", property(lambda self: True))
    monkeypatch.setattr(console, "_width", 40)
    lines = _accepted(capsys, ["pool-stats", "tiny-probe"]).splitlines()
    assert "…" not in "".join(lines)
    assert any(line.startswith("all: rows 60, share 100.0%, p10 ") for line in lines), lines


# ------------------------------------------------------------------------------------- train, the CLI itself

def test_accelerate_config_that_is_a_list(here, capsys):
    (here / "acc.yaml").write_text("- num_processes\n- 2\n")
    refused(capsys, ["train", "--dry-run", "--accelerate-config", "acc.yaml"],
             "accelerate config acc.yaml: a list, expected a mapping", inputs=(here,))


def test_a_yaml_syntax_error_comes_alone(here, capsys):
    (here / "run.yaml").write_text("max_steps: [1, 2\n")
    message = refused(capsys, ["train", "--dry-run", "--config", "run.yaml"], "run.yaml: not valid YAML",
                       "(1 problem(s))", inputs=(here,))
    assert "bf16" not in message


def test_version_and_verbose_anywhere(here, capsys):
    import grpo

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"gravity-grpo {grpo.__version__}"
    for argv in (["-v", "pool-stats", "missing.jsonl"], ["pool-stats", "missing.jsonl", "-v"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" in err and err.rstrip().endswith("error: prompt pool missing.jsonl: no such file")


# ------------------------------------------------------------------------------------- outputs (issue 25)

TINY = str(Path(__file__).resolve().parents[1] / "data" / "tiny" / "model")


def _checkpoint_copy(folder: Path, **bd_changes) -> Path:
    """A copy of the tiny joint checkpoint with `block_diffusion.json` fields changed."""
    import shutil

    shutil.copytree(TINY, folder)
    bd = json.loads((folder / "block_diffusion.json").read_text())
    (folder / "block_diffusion.json").write_text(json.dumps({**bd, **bd_changes}))
    return folder


def test_tpf_writes_only_its_own_files(here, capsys):
    """Every --out that is an input, inside a dataset or checkpoint, a folder or someone's file: refused before
    the checkpoint is even loaded; nothing changes."""
    from datasets import Dataset

    pool = _lines(here / "pool.jsonl", [GOOD_ROW])
    Dataset.from_dict({k: [v] for k, v in GOOD_ROW.items()}).save_to_disk("ds")
    ckpt = _checkpoint_copy(here / "ckpt")
    (here / "notes.txt").write_text("mine")
    base = ["tpf", "--model", str(ckpt), "--pool", str(pool), "--max-new-tokens", "16"]
    for out, culprit in ((str(pool), f"--out {pool} is the input {pool}"),
                         ("ds/state.json", "lies inside the dataset folder"),
                         ("ds/extra.json", "lies inside the dataset folder"),
                         ("ckpt/config.json", f"--out ckpt/config.json lies inside the input {ckpt}"),
                         ("/", "--out '/': give a file path"),
                         ("notes.txt", "--out notes.txt exists and was not written by gravity-grpo tpf"),
                         ("no/such/t.json", "the folder no/such does not exist")):
        refused(capsys, [*base, "--out", out], culprit, inputs=(here,))
    refused(capsys, ["tpf", "--pool", str(pool), "--out", f"{TINY}/stats.json"], "lies inside the checkpoint "
            "folder", inputs=(Path(TINY),))
    _accepted(capsys, [*base, "--out", "t.json"], inputs=(pool, ckpt))
    assert json.loads(Path("t.json").read_text())["written_by"] == "gravity-grpo tpf"
    refused(capsys, [*base, "--out", "t.json"], "--out t.json exists (an earlier output)", "(flag --overwrite)",
            inputs=(here,))
    _accepted(capsys, [*base, "--out", "t.json", "--overwrite"], inputs=(pool, ckpt))
    assert sorted(p.name for p in here.iterdir()) == ["ckpt", "ds", "notes.txt", "pool.jsonl", "t.json"]


@pytest.mark.parametrize("flags, culprit", [
    (["--max-new-tokens", "0"], "--max-new-tokens must be an integer in [1, 65536], got 0"),
    (["--bd-size", "0"], "--bd-size must be an integer in [1, 4096], got 0"),
    (["--bd-size", "100", "--max-new-tokens", "64"], "--bd-size 100: a draft block longer than --max-new-tokens 64"),
    (["--max-new-tokens", "5000"], "--max-new-tokens 5000: the model has 2048 positions"),
    (["--device", "gpu0"], "device 'gpu0': not a torch device"),
    (["--device", "cuda:7"], "device 'cuda:7': no such CUDA device here"),
    (["--tau", "2"], "--tau must be a confidence threshold in [0, 1], got 2.0"),
])
def test_tpf_sizes_and_devices_are_checked_before_decoding(here, capsys, flags, culprit):
    pool = _lines(here / "pool.jsonl", [GOOD_ROW])
    refused(capsys, ["tpf", "--pool", str(pool), *flags], culprit, inputs=(here,))


def test_tpf_names_rows_longer_than_the_context(here, capsys):
    long_row = {**GOOD_ROW, "prompt": "word " * 800}  # ~2,400 tokens: over 2,048, under the tokenizer's own 4,096
    pool = _lines(here / "pool.jsonl", [GOOD_ROW, long_row])
    refused(capsys, ["tpf", "--pool", str(pool), "--max-new-tokens", "16"], "1 row(s) longer than the model's "
            "context", "row 1: ", "+ 16 new > 2048 positions", inputs=(here,))


def test_a_mask_id_that_is_not_the_mask_token_is_refused(here, capsys):
    pool = _lines(here / "pool.jsonl", [GOOD_ROW])
    ckpt = _checkpoint_copy(here / "eos_mask", mask_id=0)  # the tiny tokenizer's EOS
    refused(capsys, ["tpf", "--model", str(ckpt), "--pool", str(pool)], "field 'mask_id' = 0 is not the id of "
            "the tokenizer's <|mask|> (2)", inputs=(here,))


def test_pool_stats_replaces_only_its_own_files(here, capsys):
    pool = _lines(here / "pool.jsonl", [GOOD_ROW])
    (here / "other.json").write_text('{"mine": 1}')
    (here / "other.png").write_bytes(b"\x89PNG\r\n\x1a\n someone else's")
    for flag, name in (("--json", "other.json"), ("--png", "other.png")):
        for extra in ([], ["--overwrite"]):
            refused(capsys, ["pool-stats", str(pool), flag, name, *extra],
                    f"{flag} {name} exists and was not written by gravity-grpo pool-stats", inputs=(here,))
    _accepted(capsys, ["pool-stats", str(pool), "--json", "s.json", "--png", "s.png"], inputs=(pool,))
    refused(capsys, ["pool-stats", str(pool), "--png", "s.png"], "--png s.png exists (an earlier output)",
            inputs=(here,))
    _accepted(capsys, ["pool-stats", str(pool), "--json", "s.json", "--png", "s.png", "--overwrite"], inputs=(pool,))


def test_a_key_given_twice_is_named_with_its_line(here, capsys):
    (here / "run.yaml").write_text("learning_rate: 1.0e-4\nbeta: 0.0\nlearning_rate: 5.0\n")
    refused(capsys, ["train", "--config", "run.yaml", "--dry-run"], "run.yaml: line 3: key 'learning_rate' "
            "appears twice", inputs=(here,))
    pool = _lines(here / "pool.jsonl", [GOOD_ROW, '{"prompt": "p", "target": "t", "task_type": "text", '
                                                  '"task_type": "table"}'])
    refused(capsys, ["pool-stats", str(pool)], "line 2: key 'task_type' appears twice", inputs=(here,))
    pairs = _lines(here / "pairs.jsonl", ['{"pred": "a", "ref": "a", "ref": "b", "task": "text"}'])
    refused(capsys, ["score", "--pairs", str(pairs)], "line 1", "key 'ref' appears twice", inputs=(here,))


def test_the_dry_run_names_an_output_dir_that_is_a_file_or_inside_a_checkpoint(here, capsys):
    recipe = str(Path(__file__).resolve().parents[1] / "configs" / "tiny_cpu.yaml")
    (here / "notes.txt").write_text("mine")
    refused(capsys, ["train", "--config", recipe, "--dry-run", "--output-dir", "notes.txt"],
            "output_dir notes.txt is a file, not a folder", inputs=(here,))
    refused(capsys, ["train", "--config", recipe, "--dry-run", "--output-dir", f"{TINY}/run"],
            f"output_dir {TINY}/run lies inside the checkpoint folder", inputs=(Path(TINY),))


def test_damaged_run_files_are_named_by_tpf_drift(here, capsys):
    run = here / "run"
    run.mkdir()
    (run / "run_config.json").write_text("{half")
    refused(capsys, ["tpf-drift", "run"], "run_config.json", inputs=(here,))
    (run / "run_config.json").write_text('{"model": "tiny", "model": "other"}')
    refused(capsys, ["tpf-drift", "run"], "key 'model' appears twice", inputs=(here,))
    (run / "run_config.json").write_text('{"model": "tiny", "probe_set": "tiny-probe"}')
    (run / "metrics.jsonl").write_text('{"step": 1}\n{half\n')
    refused(capsys, ["tpf-drift", "run"], "metrics.jsonl is damaged: line 2", inputs=(here,))
    refused(capsys, ["tpf-drift", "run", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0",
            inputs=(here,))
    refused(capsys, ["tpf-drift", "run", "--out", "run/metrics.jsonl"], "is a file, not a folder", inputs=(here,))


def test_row_images_that_would_hang_or_explode_are_named(here, capsys):
    import os
    import struct
    import zlib

    os.mkfifo(here / "pipe.png")
    header = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)  # a PNG header claiming 20000 x 20000 pixels
    chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data  # noqa: E731
                                + struct.pack(">I", zlib.crc32(kind + data)))
    (here / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
    pool = _lines(here / "pool.jsonl", [{**GOOD_ROW, "image": "pipe.png"}, {**GOOD_ROW, "image": "bomb.png"}])
    refused(capsys, ["pool-stats", str(pool)], "line 1: image is not a regular file: pipe.png",
            "line 2: image too large (bomb.png)", inputs=(pool,))


# ------------------------------------------------------------------------------------- any bytes

LINE_PIECES = st.sampled_from([b"{", b"}", b'"prompt": "p"', b'"target": "t"', b'"task_type": "text"',
                               b'"task": "text"', b'"pred": "a"', b'"ref": "a"', b'"expect": 1', b'"min": "x"',
                               b'"image": 5', b'"meta": [1, "a"]', b",", b"\n", b"\r\n", b"\xff", b"\xef\xbb\xbf",
                               b"null", b"[", b"1e999", b'"\\ud800"', b" "])
HOSTILE_BYTES = st.one_of(st.binary(max_size=300), st.lists(LINE_PIECES, max_size=40).map(b"".join))
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextmanager
def hostile_file(name: str, data: bytes):
    """A file `name` holding `data` in a fresh folder; after the block, its bytes must be unchanged."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        yield path
        assert path.read_bytes() == data


@SETTINGS
@given(HOSTILE_BYTES)
def test_any_bytes_give_pairs_or_one_user_error(data):
    from ocr_rewards.regression import read_pairs

    with hostile_file("pairs.jsonl", data) as path:
        try:
            pairs = read_pairs(path)
        except UserError as err:
            assert str(err).startswith(f"{path}")
        else:
            assert pairs and all(isinstance(p.pred, str) and p.line >= 1 for p in pairs)


@SETTINGS
@given(HOSTILE_BYTES)
def test_any_bytes_give_a_pool_or_one_user_error(data):
    from grpo.pool import load_pool

    with hostile_file("pool.jsonl", data) as path:
        try:
            ds = load_pool(str(path), skip_bad=True)
        except UserError as err:
            assert str(err).startswith(f"prompt pool {path}")
        else:
            assert len(ds) >= 1 and all(isinstance(t, str) and t.strip() for t in ds["target"])


# ------------------------------------------------------------------------------------- round 3 (issue 34)

RECIPE = str(Path(__file__).resolve().parents[1] / "configs" / "tiny_cpu.yaml")
JOINT_RECIPE = str(Path(__file__).resolve().parents[1] / "configs" / "joint_tiny.yaml")


def _tree(folder: Path) -> dict[str, object]:
    """Every path under `folder` (files by bytes, folders and links by kind): what a refused command must
    leave exactly as it was, nothing added (no temporary, no empty folder), nothing changed."""
    out = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        out[key] = (f"link -> {path.readlink()}" if path.is_symlink() else "folder" if path.is_dir()
                    else path.read_bytes() if path.is_file() else "special file")  # a FIFO is never read
    return out


def _refused_untouched(capsys, folder: Path, argv: list[str], *culprits: str) -> str:
    """`refused`, and the whole tree under `folder` exactly as before."""
    before = _tree(folder)
    message = refused(capsys, argv, *culprits)
    assert _tree(folder) == before
    return message


def _earlier_run(folder: Path) -> Path:
    """A user's earlier run folder: a run config, a checkpoint and the user's notes."""
    folder.mkdir()
    (folder / "run_config.json").write_text(json.dumps({"output_dir": str(folder), "model": "tiny"}))
    (folder / "checkpoint-2").mkdir()
    (folder / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (folder / "notes.md").write_text("what I tried")
    return folder


@pytest.mark.parametrize("flags, culprit", [
    (["--learning-rate", "inf"], "learning_rate must be a finite number, got inf"),
    (["--set", "temperature=-1"], "temperature must be 0 (greedy) or a finite number >= 0.01"),
    (["--set", "temperature=.nan"], "temperature must be 0 (greedy) or a finite number >= 0.01 (less overflows the "
                                    "softmax), got nan"),
    (["--max-steps", "-5"], "max_steps must be an integer >= 1 (or -1: by epochs), got -5"),
    (["--seed", str(10 ** 23)], "seed must be an integer in [0, 4294967295]"),
    (["--set", "epsilon_high=-1"], "epsilon_high must be a number >= 0, got -1.0"),
    (["--set", "num_generations=2048", "--set", "generation_batch_size=2048"],
     "num_generations must be an integer in [2, 1024], got 2048"),
    (["--set", "num_generations=1000000000"], "num_generations must be an integer in [2, 1024], got 1000000000"),
    (["--resume", "no/checkpoint-3"], "resume: no checkpoint folder no/checkpoint-3"),
    (["--set", "beta=0.1", "--set", "beta=0.2"], "command line: key 'beta' is set twice"),
])
def test_the_dry_run_refuses_what_the_run_would(here, capsys, flags, culprit):
    """Each of these passed the dry run before ("the run would start"); training then failed or ran wrong."""
    _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--dry-run", *flags], culprit)


def test_training_refuses_what_the_dry_run_refuses(here, capsys):
    """The real run asks the same function: refused before any model or engine is loaded, nothing written."""
    _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--learning-rate", "inf", "--out", "run"],
                       "learning_rate must be a finite number, got inf")


def test_an_earlier_run_folder_is_refused_unless_resumed_or_overwritten(here, capsys):
    _earlier_run(here / "run")
    for extra in ([], ["--dry-run"]):
        _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--out", "run", *extra],
                           "output_dir run holds an earlier run: resume it, overwrite it")
    (here / "mine").mkdir()
    (here / "mine" / "notes.md").write_text("not a run")
    _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--out", "mine", "--overwrite"],
                       "output_dir mine is not empty and holds no GRPO run")
    _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--out", "run", "--resume", "--overwrite",
                                      "--dry-run"], "resume continues the run in output_dir and overwrite "
                                                    "replaces it: choose one")
    _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--out", "mine", "--resume", "--dry-run"],
                       "holds no checkpoint-N folder to resume from")


def test_demo_checks_everything_before_it_touches_an_earlier_run(here, capsys):
    """`demo` replaced runs/demo before reading its recipe: a failed start had deleted a user's run."""
    _earlier_run(here / "old")
    _refused_untouched(capsys, here, ["demo", "--out", "old", "--config", "nope.yaml"],
                       "config file nope.yaml does not exist")
    (here / "bad.yaml").write_text(f"extends: {RECIPE}\npool: missing.jsonl\n")
    _refused_untouched(capsys, here, ["demo", "--out", "old", "--config", "bad.yaml"],
                       "prompt pool missing.jsonl: no such file")
    (here / "user").mkdir()
    (here / "user" / "config.json").write_text("{}")
    _refused_untouched(capsys, here, ["demo", "--out", "user"], "output_dir user is not empty and holds no GRPO run")


@pytest.mark.parametrize("make", ["dangling", "to_folder"])
def test_symlinked_outputs_are_refused(here, capsys, make):
    target = here / "elsewhere"
    if make == "to_folder":
        target.mkdir()
    (here / "link").symlink_to(target)
    for argv in (["demo", "--out", "link"], ["pool-stats", "tiny-probe", "--json", "link"],
                 ["tpf", "--pool", "tiny-probe", "--out", "link"], ["mine", "--pool", "tiny", "--out", "link"],
                 ["train", "--config", RECIPE, "--dry-run", "--out", "link"]):
        _refused_untouched(capsys, here, argv, "link is a symbolic link")


def test_ownership_is_parsed_never_searched_for(here, capsys):
    """Files that mention the command (notes, a script, a JSON with the stamp as a value) are not its own."""
    pool = _lines(here / "pool.jsonl", [GOOD_ROW])
    (here / "notes.json").write_text('{"text": "gravity-grpo pool-stats wrote this", "written_by": "me"}')
    (here / "run.sh").write_text("#!/bin/sh\ngravity-grpo pool-stats tiny --json s.json  # written_by\n")
    (here / "fake.png").write_bytes(b"\x89PNG\r\n\x1a\n gravity-grpo pool-stats Software")
    for flag, name in (("--json", "notes.json"), ("--json", "run.sh"), ("--png", "fake.png")):
        _refused_untouched(capsys, here, ["pool-stats", str(pool), flag, name, "--overwrite"],
                           f"{flag} {name} exists and was not written by gravity-grpo pool-stats")


def test_an_output_that_appears_while_the_command_runs_is_kept(here):
    """The final move of a new output never replaces a file made meanwhile; an own file only with overwrite."""
    from grpo.outputs import atomic_write

    out = here / "stats.json"
    out.write_text("the user's file, made while the command ran")
    for replace in (False, "gravity-grpo tpf"):
        with pytest.raises(UserError, match="appeared while the command ran"):
            atomic_write(out, '{"written_by": "gravity-grpo tpf"}\n', replace=replace)
    assert out.read_text() == "the user's file, made while the command ran"
    out.write_text('{"written_by": "gravity-grpo tpf", "n": 1}')
    atomic_write(out, '{"written_by": "gravity-grpo tpf", "n": 2}\n', replace="gravity-grpo tpf")
    assert json.loads(out.read_text())["n"] == 2
    assert sorted(p.name for p in here.iterdir()) == ["stats.json"]


def test_joint_never_writes_over_its_input_or_a_user_folder(here, capsys):
    import shutil

    shutil.copytree(TINY, here / "m")
    (here / "u").mkdir()
    (here / "u" / "config.json").write_text("{}")
    base = ["joint", "--config", JOINT_RECIPE, "--ar-steps", "0", "--joint-steps", "1", "--stop-at-step", "0"]
    _refused_untouched(capsys, here, [*base, "--model", "m", "--out", "m"], "output_dir m is the input m")
    _refused_untouched(capsys, here, [*base, "--model", "m", "--out", "m/inner"], "lies inside the input m")
    _refused_untouched(capsys, here, [*base, "--out", "u"], "output_dir u is not empty and holds no joint checkpoint")
    _refused_untouched(capsys, here, [*base, "--out", str(TINY)], f"output_dir {TINY} exists and is not empty",
                       "(flag --overwrite)")


def test_tpf_drift_writes_only_into_its_own_places(here, capsys):
    import shutil

    run = _earlier_run(here / "run")
    (run / "run_config.json").write_text(json.dumps({"model": "tiny", "probe_set": "tiny-probe",
                                                     "output_dir": str(run)}))
    shutil.copytree(TINY, run / "checkpoint-4")
    (here / "mine").mkdir()
    (here / "mine" / "a.txt").write_text("mine")
    for out, culprit in (("run/checkpoint-4", "--out run/checkpoint-4 is the input"),
                         ("run/checkpoint-4/x", "--out run/checkpoint-4/x lies inside the input"),
                         (str(TINY), f"--out {TINY} is not empty and holds no tpf_drift_checkpoints"),
                         ("mine", "--out mine is not empty and holds no tpf_drift_checkpoints output"),
                         (".", "holds the input")):
        _refused_untouched(capsys, here, ["tpf-drift", "run", "--out", out], culprit)
    (run / "tpf_drift_checkpoints.jsonl").write_text("{}\n")
    _refused_untouched(capsys, here, ["tpf-drift", "run"], "tpf_drift_checkpoints.jsonl exists (an earlier "
                                                           "tpf-drift output)", "(flag --overwrite)")


@pytest.mark.parametrize("config, culprit", [
    ({"probe_size": -5}, "probe_size must be an integer in [1, 100000], got -5"),
    ({"tpf_max_new_tokens": 0}, "tpf_max_new_tokens must be an integer in [1, 65536], got 0"),
    ({"temperature": "hot"}, "temperature must be a number, got 'hot'"),
])
def test_values_read_back_from_a_run_are_checked_as_train_checks_them(here, capsys, config, culprit):
    """tpf-drift checks a run's saved config by the config's own checks: the line train gives for the value."""
    (here / "run").mkdir()
    (here / "run" / "run_config.json").write_text(json.dumps({"model": "tiny", "probe_set": "tiny-probe", **config}))
    _refused_untouched(capsys, here, ["tpf-drift", "run"], f"run_config.json: {culprit}")
    [(key, value)] = config.items()
    _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--dry-run", "--set", f"{key}={value}"],
                       f"command line: {culprit}" if isinstance(value, str) else f"{RECIPE}: {culprit}")


def test_compare_checks_its_arms_and_output_first(here, capsys):
    (here / "c").write_text("a file")
    arms = ["--arm", "a", RECIPE, "--arm", "b", RECIPE]
    _refused_untouched(capsys, here, ["compare", *arms, "--seeds", "1", "--out", "c"], "--out c is a file")
    _refused_untouched(capsys, here, ["compare", "--arm", "a", RECIPE, "beta=[1", "--arm", "b", RECIPE,
                                      "--seeds", "1", "--out", "new"], "--arm a: beta: not a YAML value")
    _refused_untouched(capsys, here, ["compare", "--arm", "a", RECIPE, "beta=", "--arm", "b", RECIPE,
                                      "--seeds", "1", "--out", "new"], "--arm a: beta has an empty value")
    _refused_untouched(capsys, here, ["compare", "--arm", "a", RECIPE, "beta=1", "beta=2", "--arm", "b", RECIPE,
                                      "--seeds", "1", "--out", "new"], "--arm a: key 'beta' is set twice")
    _refused_untouched(capsys, here, ["compare", *arms, "--seeds", "1", "1", "--out", "new"],
                       "--seeds must be distinct integers")
    _refused_untouched(capsys, here, ["compare", *arms, "--set", "learning_rate=fast", "--seeds", "1", "--out",
                                      "new"], "learning_rate must be a number, got 'fast'")


@pytest.mark.parametrize("flags, culprit", [
    (["--samples", "1000000000", "--temperature", "1"], "--samples must be an integer in [1, 64]"),
    (["--batch-size", "100000"], "--batch-size must be an integer in [1, 256]"),
    (["--temperature", "inf"], "--temperature must be 0 (greedy) or a finite number >= 0.01"),
    (["--temperature", "nan"], "--temperature must be 0 (greedy) or a finite number >= 0.01"),
    (["--tau", "nan"], "--tau must be a confidence threshold in [0, 1]"),
    (["--seed", str(10 ** 23)], "--seed must be an integer in [0, 4294967295]"),
])
def test_tpf_counts_and_numbers_are_bounded_before_any_work(here, capsys, flags, culprit):
    _refused_untouched(capsys, here, ["tpf", "--pool", "tiny-probe", *flags], culprit)


@pytest.mark.parametrize("flags, culprit", [
    (["--num-generations", "1000000000"], "at most 1024 are sampled"),
    (["--hard-weight", "nan"], "ranking: hard_weight must be a finite number, got nan"),
    (["--length-scale", "0"], "ranking: length_scale is a length in characters (> 0)"),
    (["--temperature", "inf"], "temperature must be 0 (greedy) or a finite number >= 0.01"),
    (["--temperature", "1e-30"], "temperature must be 0 (greedy) or a finite number >= 0.01 (less overflows the "
                                "softmax), got 1e-30"),
    (["--chunk-size", "100000"], "rollouts per engine call is over 65,536"),
])
def test_mine_numbers_are_bounded_before_any_work(here, capsys, flags, culprit):
    _refused_untouched(capsys, here, ["mine", "--pool", "tiny", "--out", "o", *flags], culprit)


def test_an_image_pool_with_a_text_only_model_is_refused_everywhere(here, capsys):
    from PIL import Image

    Image.new("RGB", (8, 8)).save(here / "a.png")
    pool = _lines(here / "pool.jsonl", [{**GOOD_ROW, "image": "a.png"}])
    for argv in (["tpf", "--pool", str(pool)], ["mine", "--pool", str(pool), "--out", "o", "--hf-generate"],
                 ["train", "--config", RECIPE, "--dry-run", "--pool", str(pool)]):
        _refused_untouched(capsys, here, argv, "the pool has images but the policy is text-only")


def test_score_workers_are_bounded_by_the_cpus(here, capsys):
    import os

    with pytest.raises(SystemExit) as info:
        main(["score", "--pairs", "p.jsonl", "--workers", str((os.cpu_count() or 1) + 1)])
    assert info.value.code == 2
    assert f"expected an integer from 1 to {os.cpu_count() or 1} (the CPUs here)" in capsys.readouterr().err


def _truncated_weights(folder: Path) -> str:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:len(data) // 2])
    return f"{folder / 'model.safetensors'}: damaged weights file"


def _nan_config(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rms_norm_eps": float("nan")}))
    return f"{folder / 'config.json'}: field 'rms_norm_eps' is not a finite number"


def _self_adapter(folder: Path) -> str:
    import shutil

    shutil.rmtree(folder)
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(folder)}))
    return "is this adapter folder itself"


def _adapter_cycle(folder: Path) -> str:
    import shutil

    shutil.rmtree(folder)
    other = folder.with_name("other")
    for a, b in ((folder, other), (other, folder)):
        a.mkdir()
        (a / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(b)}))
    return "is itself a LoRA checkpoint"



def test_deeply_nested_yaml_and_huge_values_come_in_one_short_line(here, capsys):
    (here / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    _refused_untouched(capsys, here, ["train", "--config", "deep.yaml", "--dry-run"],
                       "deep.yaml: not valid YAML (nested too deeply)")
    _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--dry-run", "--accelerate-config", "deep.yaml"],
                       "accelerate config deep.yaml: not readable (nested too deeply)")
    _refused_untouched(capsys, here, ["mine", "--config", "deep.yaml", "--pool", "tiny", "--out", "o"],
                       "deep.yaml: not valid YAML (nested too deeply)")
    (here / "big.yaml").write_text(f"extends: {RECIPE}\nlearning_rate: {'x' * 1_000_000}\n")
    message = _refused_untouched(capsys, here, ["train", "--config", "big.yaml", "--dry-run"],
                                 "learning_rate must be a number, got 'xxx", "(1,000,002 characters)")
    assert len(message) < 1000


def test_a_config_that_is_a_device_is_named_as_such(here, capsys):
    import os

    os.symlink("/dev/null", here / "dev.yaml")
    _refused_untouched(capsys, here, ["train", "--config", "dev.yaml", "--dry-run"],
                       "config file dev.yaml is not a regular file (a folder or a device)")


def test_a_damaged_done_marker_is_named(here, shards, capsys):
    done = shards[0] / "mining" / "done.json"
    record = json.loads(done.read_text())
    done.write_text(json.dumps({**record, "selection": {**record["selection"], "min_std": "x"}}))
    _refused_untouched(capsys, here, ["mine-merge", *map(str, shards), "--out", "merged"],
                       f"{done} is damaged (selection needs rank, a finite min_std")


def test_a_huge_prompt_is_named_by_line_before_any_tokenizer(here, capsys):
    from grpo.limits import MAX_PROMPT_CHARS

    pool = _lines(here / "pool.jsonl", [GOOD_ROW, {**GOOD_ROW, "prompt": "w" * (MAX_PROMPT_CHARS + 1)}])
    _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--dry-run", "--pool", str(pool)],
                       "line 2: prompt of 1,048,577 characters is over the limit")


def test_a_lone_surrogate_is_a_bad_line_that_skip_bad_leaves_out(here, capsys):
    pool = _lines(here / "pool.jsonl", [GOOD_ROW, '{"prompt": "\\ud800", "target": "t", "task_type": "text"}'])
    _refused_untouched(capsys, here, ["pool-stats", str(pool)], "line 2: a lone surrogate escape (\\ud800)")
    out = _accepted(capsys, ["pool-stats", str(pool), "--skip-bad"], inputs=(pool,))
    assert "all: rows 1" in out or "1 rows" in out


def test_a_pairs_bound_too_large_for_a_float_is_named(here, capsys):
    pairs = _lines(here / "pairs.jsonl", ['{"pred": "a", "ref": "a", "task": "text", "min": 1' + "0" * 400 + "}"])
    _refused_untouched(capsys, here, ["score", "--pairs", str(pairs)], "line 1: field 'min' must be a finite number")


def test_library_warnings_never_print_before_the_error_line(here, capsys):
    import warnings

    def noisy(args):
        warnings.warn("a library's remark", UserWarning)
        raise UserError("the one problem")

    from grpo.cli import boundary

    assert boundary(lambda: noisy(None), verbose=False) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: the one problem"


# ------------------------------------------------------------------------- names, ownership, temp files

@pytest.mark.parametrize("name, culprit", [
    ("../victim", "--arm name '../victim' holds a path separator"),
    ("/abs", "--arm name '/abs' holds a path separator"),
    ("..", "--arm name '..' is . or .."),
    ("a" * 101, "is over 100 characters"),
    ("a\0b", "holds a NUL byte"),
])
def test_a_name_that_becomes_a_folder_is_never_a_path(here, capsys, name, culprit):
    (here / "victim").mkdir()
    (here / "victim" / "thesis.txt").write_text("years of work")
    _refused_untouched(capsys, here, ["compare", "--arm", name, RECIPE, "--arm", "b", RECIPE, "--seeds", "0",
                                      "--out", "cmp"], culprit)


def test_compare_never_removes_a_run_folder_train_did_not_make(here, capsys):
    from grpo.compare import STAMP
    from grpo.outputs import mark

    mark(here / "cmp", STAMP)
    (here / "cmp" / "a" / "seed-0").mkdir(parents=True)
    (here / "cmp" / "a" / "seed-0" / "thesis.txt").write_text("years of work")
    _refused_untouched(capsys, here, ["compare", "--arm", "a", RECIPE, "--arm", "b", RECIPE, "--seeds", "0",
                                      "--out", "cmp"], "seed-0 holds no finished run and was not made by "
                                                       "gravity-grpo train; it is kept")


def test_temporary_names_never_take_a_users_file(here):
    from grpo.evaluation.run_dir import RunDir
    from grpo.outputs import atomic_write

    users = {name: f"the user's {name}" for name in ("tpf_drift_checkpoints.jsonl.tmp", "eval.tmp", "x.json.tmp",
                                                     ".x.json.tmp", f".x.json.tmp{__import__('os').getpid()}")}
    for name, text in users.items():
        (here / name).write_text(text)
    atomic_write(here / "x.json", "{}\n")
    RunDir(here).write_drift([], "tpf_drift_checkpoints")
    assert {name: (here / name).read_text() for name in users} == users
    assert sorted(p.name for p in here.iterdir()) == sorted([*users, "x.json", "tpf_drift_checkpoints.jsonl",
                                                             "tpf_drift_checkpoints.png"])


# ------------------------------------------------------------------------------ special files, bounds

def test_a_fifo_inside_a_dataset_folder_is_refused_before_any_read(here, capsys):
    import os

    from datasets import Dataset

    Dataset.from_dict({"prompt": ["p"], "target": ["t"], "task_type": ["text"]}).save_to_disk("pool")
    (arrow,) = (here / "pool").glob("*.arrow")
    arrow.unlink()
    os.mkfifo(arrow)
    for argv in (["pool-stats", "pool"], ["train", "--config", RECIPE, "--dry-run", "--set", "probe_set=pool"]):
        _refused_untouched(capsys, here, argv, f"{arrow.name} is a FIFO, not a regular file")


@pytest.mark.parametrize("argv", [["pool-stats", "pipe.jsonl"], ["score", "--pairs", "pipe.jsonl"],
                                  ["tpf", "--pool", "pipe.jsonl"], ["train", "--config", "pipe.jsonl", "--dry-run"]])
def test_a_fifo_given_as_an_input_is_refused(here, capsys, argv):
    import os

    os.mkfifo(here / "pipe.jsonl")
    message = _refused_untouched(capsys, here, argv, "pipe.jsonl")
    assert "FIFO" in message or "not a regular file" in message


@pytest.mark.parametrize("argv, culprit", [
    (["pool-stats", "x\0y.jsonl"], "holds a NUL byte"),
    (["train", "--config", RECIPE, "--dry-run", "--output-dir", "r\0un"], "'r\\x00un' holds a NUL byte"),
    (["pool-stats", "p" * 300 + ".jsonl"], "holds a name over 255 bytes"),
    (["score", "--pairs", "p" * 300 + ".jsonl"], "--pairs"),
    (["tpf", "--pool", "p/" * 2100 + "x.jsonl"], "is a path over 4,096 bytes"),
    (["tpf", "--pool", "tiny-probe", "--out", "o" * 256 + ".json"], "--out"),
])
def test_nul_bytes_and_over_long_names_are_refused_by_flag(here, capsys, argv, culprit):
    _refused_untouched(capsys, here, argv, culprit)


def test_a_name_over_255_bytes_read_from_a_recipe_is_named(here, capsys):
    (here / "r.yaml").write_text(f"extends: {RECIPE}\npool: {'p' * 300}.jsonl\n")
    _refused_untouched(capsys, here, ["train", "--config", "r.yaml", "--dry-run"], "a name over 255 bytes")


@pytest.mark.parametrize("argv, culprit", [
    (["compare", "--arm", "a", RECIPE, "--arm", "b", RECIPE, "--seeds", "0", "--out", "cmp", "--report-only",
      "--probe-size", "-5"], "--probe-size must be >= 1, got -5"),
    (["compare", "--arm", "a", RECIPE, "--arm", "b", RECIPE, "--seeds", "0", "--out", "cmp", "--max-new-tokens",
      "100000000"], "--max-new-tokens must be at most 65,536, got 100000000"),
    (["mine", "--pool", "tiny", "--out", "o", "--seed", "-1"], "seed must be an integer in [0, 4294967295], got -1"),
    (["mine", "--pool", "tiny", "--out", "o", "--max-completion-length", "100000000"],
     "max_completion_length must be at most 65,536"),
])
def test_counts_and_caps_of_flags_are_bounded_before_any_output(here, capsys, argv, culprit):
    _refused_untouched(capsys, here, argv, culprit)


def _run_folder(here: Path, **config) -> Path:
    import shutil

    run = here / "run"
    run.mkdir()
    (run / "run_config.json").write_text(json.dumps({"model": "tiny", "probe_set": "tiny-probe", **config}))
    shutil.copytree(TINY, run / "checkpoint-2")
    return run


@pytest.mark.parametrize("config, culprit", [
    ({"tpf_samples": 10 ** 9}, "tpf_samples must be an integer in [0, 64] (0: greedy only), got 1000000000"),
    ({"tpf_max_new_tokens": 10 ** 9}, "tpf_max_new_tokens must be an integer in [1, 65536], got 1000000000"),
    ({"tpf_batch_size": 10 ** 6}, "tpf_batch_size must be an integer in [1, "),
    ({"probe_size": 10 ** 9}, "probe_size must be an integer in [1, 100000], got 1000000000"),
    ({"image_long_side": "huge"}, "image_long_side must be one of full, 768, 1344 or a number of pixels"),
    ({"tpf_preset": "fastest"}, "tpf_preset must be one of cpu, gravityocr, gravityocr-bench, got 'fastest'"),
    ({"probe_set": 7}, "probe_set = 7 is not a pool name or path"),
    ({"model": 3}, "model = 3 is not a checkpoint name"),
    ({"tpf_floor": "high"}, "tpf_floor must be a number, got 'high'"),
])
def test_values_of_a_run_config_are_bounded_and_typed_where_read(here, capsys, config, culprit):
    _run_folder(here, **config)
    _refused_untouched(capsys, here, ["tpf-drift", "run"], f"run_config.json: {culprit}")


def test_tpf_drift_flags_are_bounded_and_a_string_step_is_named(here, capsys):
    run = _run_folder(here)
    for flag in ("--max-new-tokens", "--probe-size"):
        _refused_untouched(capsys, here, ["tpf-drift", "run", flag, "100000000"], f"{flag} must be at most ")
    (run / "metrics.jsonl").write_text('{"step": "3", "reward": 0.5}\n')
    _refused_untouched(capsys, here, ["tpf-drift", "run"], "metrics.jsonl is damaged: line 1: step '3' is not an "
                                                           "integer")


# ------------------------------------------------------------------------------------ damaged inputs

def _config_edit(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def _unknown_model_type(folder: Path) -> str:
    _config_edit(folder, model_type="no_such_architecture")
    return "config.json: model_type 'no_such_architecture' is no architecture this transformers knows"


def _no_tokenizer(folder: Path) -> str:
    for path in folder.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template", "added_tokens")):
            path.unlink()
    return "no usable tokenizer files"


def _wider_config(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    _config_edit(folder, intermediate_size=config["intermediate_size"] + 8)
    return "has shape [384, 128] but config.json describes [392, 128]"


def _more_layers_in_config(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    _config_edit(folder, num_hidden_layers=config["num_hidden_layers"] + 2)
    return "config.json lists 6 layers under model.layers, the weights hold 4"


def _huge_block(folder: Path) -> str:
    bd = json.loads((folder / "block_diffusion.json").read_text())
    (folder / "block_diffusion.json").write_text(json.dumps({**bd, "bd_size": 10 ** 9}))
    return f"{folder / 'block_diffusion.json'}: block_diffusion.json: field 'bd_size' must be in [1, 4,096]"


@pytest.mark.parametrize("damage", [_truncated_weights, _nan_config, _self_adapter, _adapter_cycle,
                                    _unknown_model_type, _no_tokenizer, _wider_config, _more_layers_in_config,
                                    _huge_block], ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_checkpoint_is_named(here, capsys, damage):
    import shutil

    ckpt = here / "ckpt"
    shutil.copytree(TINY, ckpt)
    culprit = damage(ckpt)
    for argv in (["tpf", "--model", str(ckpt), "--pool", "tiny-probe"],
                 ["train", "--config", RECIPE, "--dry-run", "--model", str(ckpt), "--out", "run"]):
        message = _refused_untouched(capsys, here, argv, culprit)
        assert "--bd-size" not in message


@pytest.mark.parametrize("recipe, culprit", [
    ("model: [a, b]\n", "model must be a string, got ['a', 'b']"),
    ("tpf_preset: {a: 1}\n", "tpf_preset must be"),
    ("learning_rate: " + "1" + "0" * 400 + "\n", "learning_rate must be a number, got an integer past the float range"),
])
def test_recipe_values_of_the_wrong_type_are_named(here, capsys, recipe, culprit):
    (here / "r.yaml").write_text(f"extends: {RECIPE}\n{recipe}")
    _refused_untouched(capsys, here, ["train", "--config", "r.yaml", "--dry-run"], culprit)


def test_a_recipe_with_yaml_merge_keys_is_read_as_yaml(here, capsys):
    (here / "r.yaml").write_text(f"extends: {RECIPE}\n<<: {{beta: 0.002, max_steps: 3}}\nmax_steps: 4\n")
    out = _accepted(capsys, ["train", "--config", "r.yaml", "--dry-run"], inputs=(here / "r.yaml",))
    assert "dry run: the run would start" in out


@pytest.mark.parametrize("flags, culprit", [
    (["--learning-rate", "nan"], "learning_rate must be a finite number > 0, got nan"),
    (["--hidden-size", "0"], "hidden_size must be an integer in [1, 1,048,576], got 0"),
    (["--num-layers", "0"], "num_layers must be an integer in [1, 1,048,576], got 0"),
    (["--grad-clip", "inf"], "grad_clip must be a finite number >= 0, got inf"),
])
def test_joint_numbers_are_checked_before_any_checkpoint(here, capsys, flags, culprit):
    _refused_untouched(capsys, here, ["joint", "--ar-steps", "0", "--joint-steps", "1", "--stop-at-step", "0",
                                      "--out", "j", *flags],
                       culprit)


def test_joint_takes_the_built_in_model_name_and_refuses_rows_without_target_tokens(here, capsys):
    base = ["joint", "--ar-steps", "0", "--joint-steps", "1", "--stop-at-step", "0", "--batch-size", "2",
            "--cpu-threads", "1", "--save-every", "0"]
    _refused_untouched(capsys, here, [*base, "--model", "tiny", "--out", str(TINY)], f"output_dir {TINY}")
    pool = _lines(here / "pool.jsonl", [{**GOOD_ROW, "target": ""}, {**GOOD_ROW, "target": " "}])
    _refused_untouched(capsys, here, [*base, "--model", "tiny", "--pool", str(pool), "--out", "j"],
                       "line 1: empty target", "line 2: empty target")


# -------------------------------------------------------------------------------- the output and resume

@pytest.mark.parametrize("out, culprit", [
    ("/proc/nope/run", "output_dir /proc/nope/run lies under /proc, a file system of the kernel"),
    ("/sys/run", "output_dir /sys/run lies under /sys"),
    ("notes.txt/run", "output_dir notes.txt/run cannot be created: "),
])
def test_the_dry_run_refuses_an_output_the_run_cannot_write(here, capsys, out, culprit):
    (here / "notes.txt").write_text("mine")
    _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--dry-run", "--output-dir", out], culprit)


def test_resume_needs_a_complete_checkpoint(here, capsys):
    _earlier_run(here / "run")  # its checkpoint-2 holds a trainer state but no weights: a save cut short
    (here / "notrun").mkdir()
    for extra, culprit in ((["--resume"], "resume: output_dir run holds no checkpoint-N folder to resume from "
                                          "(only incomplete ones: checkpoint-2)"),
                           (["--resume", "notrun"], "resume: notrun is not a complete checkpoint"),
                           (["--resume", "nowhere"], "resume: no checkpoint folder nowhere")):
        _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--dry-run", "--out", "run", *extra], culprit)


def test_a_failed_arm_names_the_arm_and_its_log(here, capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)  # what an in-process engine of an earlier test may have left
    (here / "bad.yaml").write_text(f"extends: {RECIPE}\nmodel: missing_model\n")
    message = refused(capsys, ["compare", "--arm", "a", "bad.yaml", "--arm", "b", RECIPE, "--seeds", "0", "--out",
                               "cmp"], "arm a seed 0: training failed (exit 2): the run would not start",
                      "missing_model",
                      "see its log cmp/a/seed-0.train.log")
    assert (here / "cmp" / "a" / "seed-0.train.log").is_file(), message


def test_a_fifo_among_a_checkpoints_files_is_refused_before_any_loader(here, capsys):
    import os
    import shutil

    shutil.copytree(TINY, here / "ckpt")
    (here / "ckpt" / "model.safetensors").unlink()
    os.mkfifo(here / "ckpt" / "model.safetensors")
    _refused_untouched(capsys, here, ["tpf", "--model", "ckpt", "--pool", "tiny-probe"],
                       "model ckpt: ckpt/model.safetensors is a FIFO, not a regular file")


# ------------------------------------------------------------------------------------- round 5 (issue 54)

def test_two_runs_into_one_new_folder_cannot_both_start(here, capsys, monkeypatch):
    """The folder check and the first write raced: two runs started at once both passed the check, both exited
    0, and the folder held only the second's files. The run now takes its folder atomically (its marker, made
    with O_EXCL) before any model loads; the second run ends with exit 2 naming the folder."""
    import grpo.training.run as training

    inner = {}

    def first_run(config, resume, pools, recipe):  # the first run, still starting when the second one comes
        if not inner:
            inner["code"] = main(["train", "--config", RECIPE, "--out", "run"])
            inner["err"] = capsys.readouterr().err
        return {"main_process": False, "stopped_at": None}

    monkeypatch.setattr(training, "_train", first_run)
    assert main(["train", "--config", RECIPE, "--out", "run"]) == 0
    assert inner["code"] == 2 and "output_dir run" in inner["err"], inner
    assert "Traceback" not in inner["err"]

    def failing(config, resume, pools, recipe):
        raise UserError("the engine would not start")

    monkeypatch.setattr(training, "_train", failing)
    refused(capsys, ["train", "--config", RECIPE, "--out", "other"], "the engine would not start")
    assert not (here / "other").exists()  # a run that wrote nothing gives its folder back


@pytest.mark.parametrize("flags, culprit", [
    (["--set", "vllm_mode=Server"], "vllm_mode must be one of ('colocate', 'server') (as written: case counts), "
                                    "got 'Server'"),
    (["--set", "loss_type=ppo"], "loss_type must be one of ('dapo', 'grpo'"),
    (["--set", "scale_rewards=Group"], "scale_rewards must be one of ('group', 'batch', 'none')"),
    (["--set", "importance_sampling_level=seq"], "importance_sampling_level must be one of ('token', 'sequence')"),
    (["--set", "vllm_importance_sampling_mode=token"], "vllm_importance_sampling_mode must be one of"),
    (["--set", "vllm_self_speculation=true", "--set", "vllm_draft_length=1000"],
     "vllm_draft_length: 1000 drafted tokens per round do not fit in the context of 384 positions"),
])
def test_values_trl_or_vllm_refuse_late_are_refused_by_the_dry_run(here, capsys, flags, culprit):
    """TRL checks its word-valued fields only where it uses them (the engine's start, the first loss), and vLLM
    a draft longer than the context 36 s into the start: the dry run said "would start", the run crashed."""
    _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--dry-run", *flags], culprit)


def _cut_state(checkpoint: Path) -> str:
    state = checkpoint / "trainer_state.json"
    state.write_bytes(state.read_bytes()[:40])
    return "trainer_state.json does not load"


def _cut_optimizer(checkpoint: Path) -> str:
    optimizer = checkpoint / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    return "optimizer.pt is not a whole torch file"


@pytest.mark.parametrize("damage", [_cut_state, _cut_optimizer])
def test_a_checkpoint_is_complete_only_when_what_resume_reads_parses(here, capsys, damage):
    """A checkpoint whose trainer state was cut short counted as complete: the dry run accepted it and the resume
    crashed with JSONDecodeError."""
    import shutil

    import torch

    from grpo.training.checkpoints import is_complete

    run = _earlier_run(here / "run")
    ckpt = run / "checkpoint-2"
    shutil.copy(Path(TINY) / "model.safetensors", ckpt / "model.safetensors")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": [{"step": 1}] * 20}))
    torch.save({"state": {}, "param_groups": []}, ckpt / "optimizer.pt")
    assert is_complete(ckpt)
    culprit = damage(ckpt)
    assert not is_complete(ckpt)
    for extra, message in ((["--resume"], "resume: output_dir run holds no checkpoint-N folder to resume from "
                                          "(only incomplete ones: checkpoint-2)"),
                           (["--resume", "run/checkpoint-2"], f"resume: run/checkpoint-2 is not a complete "
                                                              f"checkpoint (its {culprit}" if "trainer" in culprit
                            else f"resume: run/checkpoint-2 is not a complete checkpoint ({culprit}")):
        _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--dry-run", "--out", "run", *extra], message)


def _png(path: Path, size: tuple[int, int]) -> str:
    from PIL import Image

    Image.new("RGB", size, "white").save(path)
    return path.name


def test_crops_and_prompts_the_image_processor_would_crash_on_are_named_by_row(here, capsys):
    """A valid PNG with an aspect ratio over 200, `image_long_side: 1` (a side rounded down to 0) and a prompt
    holding the template's image token reached GLM-OCR's processor and crashed there."""
    from grpo.crop_size import fitted_size

    row = {**GOOD_ROW, "prompt": "Text Recognition:", "image": _png(here / "ok.png", (64, 32))}
    _lines(here / "wide.jsonl", [row, {**row, "image": _png(here / "wide.png", (402, 2))}])
    _refused_untouched(capsys, here, ["pool-stats", "wide.jsonl"],
                       "line 2: image of 402x2 pixels has an aspect ratio over 200, which the image processor refuses")
    _lines(here / "token.jsonl", [row, {**row, "prompt": "<|image|>Text Recognition:"}])
    _refused_untouched(capsys, here, ["train", "--config", "tiny_vlm_cpu", "--dry-run", "--set", "pool=token.jsonl"],
                       "pool: 1 row(s) the model's processor cannot take: row 1: the prompt holds the chat "
                       "template's image token <|image|>")
    assert fitted_size((1536, 400), "1") == (1, 1) and fitted_size((1536, 400), "768") == (768, 200)


@pytest.mark.parametrize("argv, culprit", [
    (["tpf", "--pool", "tiny-probe", "--device", "meta"], "device 'meta': a torch device that holds no data here"),
    (["tpf", "--pool", "tiny-probe", "--temperature", "1e-30", "--samples", "2"],
     "--temperature must be 0 (greedy) or a finite number >= 0.01 (less overflows the softmax), got 1e-30"),
    (["train", "--config", RECIPE, "--dry-run", "--set", "temperature=1e-300"],
     "temperature must be 0 (greedy) or a finite number >= 0.01"),
    (["train", "--config", RECIPE, "--dry-run", "--set", "vllm_mode=server", "--set",
      "vllm_server_host=exa mple"], "engine: vllm_server_host: 'http://exa mple:8000' is not a server URL"),
    (["train", "--config", RECIPE, "--dry-run", "--set", "vllm_mode=server", "--set",
      "vllm_server_base_url=http://[::1:8000"], "engine: vllm_server_base_url: 'http://[::1:8000' is not a server URL"),
    (["joint", "--ar-steps", "0", "--joint-steps", "1", "--stop-at-step", "0", "--out", "j", "--num-heads", "4",
      "--num-kv-heads", "3"], "num_heads 4 must be a multiple of num_kv_heads 3"),
    (["joint", "--ar-steps", "0", "--joint-steps", "1", "--stop-at-step", "0", "--out", "j", "--head-dim", "33"],
     "head_dim must be even"),
])
def test_values_that_passed_the_checks_then_crashed_are_refused_before_any_work(here, capsys, argv, culprit):
    """A device that holds no data, a temperature whose softmax overflows, a server host that is no URL
    (`InvalidURL` is no OSError) and head counts that do not divide (18 s into `joint`) passed every check."""
    _refused_untouched(capsys, here, argv, culprit)


def test_a_full_disk_under_train_or_joint_is_named(here, capsys, monkeypatch):
    """`train` and `joint` on a full disk ended in a SafetensorError traceback (exit 70)."""
    import errno

    import grpo.joint.train as joint
    import grpo.training.run as training
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: No space left on device (os error 28)")

    monkeypatch.setattr(training, "_train", full)
    refused(capsys, ["train", "--config", RECIPE, "--out", "run"],
            "cannot write into output_dir run: No space left on device")

    def failing_device(cfg):
        raise OSError(errno.EIO, "Input/output error", str(Path(cfg.output_dir) / "model.safetensors"))

    monkeypatch.setattr(joint, "train_joint", failing_device)
    refused(capsys, ["joint", "--ar-steps", "0", "--joint-steps", "1", "--stop-at-step", "0", "--out", "j"],
            "cannot write j/model.safetensors: Input/output error")
    assert not (here / "j").exists()  # nothing half-written is left to be trusted


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [["-m", "grpo.cli", "env"],
                                  ["-m", "ocr_rewards.cli", "score", "--pred-text", "a", "--ref-text", "a",
                                   "--task", "text"]])
def test_stdout_on_a_full_device_is_named(argv):
    """`env` and `ocr-rewards score` with stdout on a full device ended in OSError tracebacks."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, *argv], stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "error: cannot write standard output: No space left on device" in done.stderr
    assert "Traceback" not in done.stderr


def test_env_reports_a_torch_that_does_not_import(tmp_path):
    """`env`, the bug-report command, crashed when torch itself failed to import."""
    import os
    import subprocess
    import sys

    (tmp_path / "torch.py").write_text("raise ImportError('libtorch_cpu.so: cannot open shared object file')\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "grpo.cli", "env"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr
    assert "- device: unknown: torch does not import (ImportError: libtorch_cpu.so: cannot open shared object " \
           "file)" in done.stdout
    assert "- huggingface_hub: " in done.stdout and "- accelerate config: " in done.stdout


def test_a_pool_column_nested_500_deep_is_a_bad_line(here, capsys):
    """500 levels passed `json` and ended in a RecursionError inside `datasets` (100,000 were refused)."""
    deep = {**GOOD_ROW, "meta": json.loads("[" * 500 + "]" * 500)}
    _lines(here / "pool.jsonl", [GOOD_ROW, deep, {**GOOD_ROW, "meta": json.loads("[" * 50 + "]" * 50)}])
    _refused_untouched(capsys, here, ["pool-stats", "pool.jsonl"],
                       "line 2: nested too deeply (arrays and objects more than 100 levels deep)")
    message = _refused_untouched(capsys, here, ["score", "--pairs", "pool.jsonl"], "line 2: nested too deeply")
    assert "line 3: nested" not in message


def _numbers_table(seed: int, rows: int, cols: int) -> str:
    import random

    rng = random.Random(seed)
    body = "".join("<tr>" + "".join(f"<td>{rng.randint(0, 9999)}</td>" for _ in range(cols)) + "</tr>"
                   for _ in range(rows))
    return f"<table>{body}</table>"


@pytest.mark.parametrize("shape", [(70, 70), (70, 69), (60, 60)])
def test_two_large_tables_score_within_two_seconds(shape):
    """Two 70x70 tables of 64 KB each, under both size caps, took 2.4–5.1 s to score; a call has 2 s."""
    import time

    from ocr_rewards import score

    small = _numbers_table(0, 2, 2)
    assert score(small, _numbers_table(1, 2, 3), "table").value < 1  # compiled (or read from numba's cache)
    ref = _numbers_table(1, 70, 70)
    pred = _numbers_table(2, *shape)
    assert 60_000 < len(ref) <= 65_536
    start = time.perf_counter()
    result = score(pred, ref, "table")
    assert time.perf_counter() - start <= 2.0
    assert 0 < result.value < 1


def test_compare_with_a_missing_pool_creates_nothing(here, capsys):
    """`compare` created its --out folder before it refused an arm whose pool is missing."""
    (here / "bad.yaml").write_text(f"extends: {RECIPE}\npool: missing.jsonl\n")
    _refused_untouched(capsys, here, ["compare", "--arm", "a", "bad.yaml", "--arm", "b", RECIPE, "--seeds", "0",
                                      "--out", "cmp"], "--arm a: prompt pool missing.jsonl")
    _refused_untouched(capsys, here, ["compare", "--arm", "a", RECIPE, "--arm", "b", RECIPE, "--seeds", "0",
                                      "--probe-set", "nope.jsonl", "--out", "cmp"], "prompt pool nope.jsonl")


def test_damage_is_named_not_copied(here, capsys):
    """A `metrics.jsonl` whose `reward` is a list was copied into the drift log; a pairs bound that no reward in
    [0, 1] meets exited 1 (cases outside their bounds), not 2."""
    from ocr_rewards.cli import main as rewards_main

    run = _run_folder(here)
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": [0.5, 0.7]}\n')
    _refused_untouched(capsys, here, ["tpf-drift", "run"],
                       "metrics.jsonl is damaged: line 2: reward [0.5, 0.7] is not a number")
    _lines(here / "pairs.jsonl", [{**PAIR, "expect": 2}, {**PAIR, "min": 1.5}, {**PAIR, "expect": 1}])
    assert rewards_main(["check", "pairs.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "line 1: field 'expect' 2 can never be met: every reward lies in [0, 1]" in err
    assert "line 2: field 'min' 1.5 can never be met" in err and "line 3" not in err


def test_a_server_whose_context_cannot_hold_the_completions_is_refused(here, capsys):
    """docs/grpo.md served with --max_model_len 4096 for the recipe's 8,448 completion tokens: vLLM lowers the
    cap silently and cuts every completion short. The run check reads the server's limit."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": TINY, "max_model_len": 128}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _refused_untouched(capsys, here, ["train", "--config", RECIPE, "--dry-run", "--set", "vllm_mode=server",
                                          "--set", f"vllm_server_base_url=http://127.0.0.1:{server.server_port}"],
                           "holds 128 tokens per sequence (its --max_model_len), which max_completion_length 192")
    finally:
        server.shutdown()


def test_a_mask_token_in_a_spare_embedding_row_gets_the_mean(tmp_path):
    """A model with spare embedding rows past its tokenizer (GLM-OCR: 59,392) gave `<|mask|>` one of them as it
    was, not the mean of the rows the docs describe."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo.block_diffusion import MASK_TOKEN
    from grpo.joint.mask_token import add_mask_token
    from helpers_models import build_char_tokenizer

    tokenizer = build_char_tokenizer(tmp_path)
    n = len(tokenizer)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=n + 8, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, tie_word_embeddings=False))
    before = model.get_input_embeddings().weight.detach().clone()
    mask_id = add_mask_token(model, tokenizer)
    assert mask_id == n and tokenizer.convert_ids_to_tokens(mask_id) == MASK_TOKEN
    weight = model.get_input_embeddings().weight.detach()
    assert weight.shape[0] == n + 8  # a spare row taken, none added
    assert torch.allclose(weight[mask_id], before[:n].double().mean(0).float(), atol=1e-6)
    assert torch.equal(weight[:n], before[:n]) and torch.equal(weight[n + 1:], before[n + 1:])
    head = model.get_output_embeddings().weight.detach()
    assert torch.allclose(head[mask_id], head[:n].double().mean(0).float(), atol=1e-6)
    assert add_mask_token(model, tokenizer) == mask_id and torch.equal(model.get_input_embeddings().weight, weight)


def test_a_lone_surrogate_in_a_long_text_is_scored(here):
    """The loop search of the `gravityocr` scoring mode raised UnicodeEncodeError on a lone surrogate."""
    from ocr_rewards import score

    text = "".join(f"word{i} " for i in range(400)) + "\ud800" + " tail"  # over 2,048: the loop search runs
    result = score(text, text[:-1], "text", postprocess="gravityocr")
    assert 0 < result.value <= 1
    looped = "\ud800" + "0123456789" * 300
    assert score(looped, "0123456789", "text", postprocess="gravityocr").components.get("postprocessed") == 1.0


def test_a_dtype_the_engine_refuses_is_named_before_vllm(here):
    """`mine --dtype float64` passed (the HF path takes any dtype) and vLLM's config refused it at start."""
    from grpo.rollouts.engine import make_llm

    with pytest.raises(UserError, match="dtype 'float64': the vLLM engine runs one of auto, float32"):
        make_llm(TINY, dtype="float64")
