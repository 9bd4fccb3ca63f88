"""TPF statistics (docs/spec.md §5) and the `gravity-grpo tpf` command, on tiny random checkpoints."""
from __future__ import annotations

import json
import shutil

import pytest
from PIL import Image

from grpo.block_diffusion import BD_FILE
from grpo.checkpoint import load_checkpoint
from grpo.errors import CheckpointError
from grpo.cli import main
from grpo.decoding.tpf import length_bin, measure_tpf, summarize
from helpers_models import build_glm_processor, build_glmocr_checkpoint, build_text_checkpoint

# transformers' Glm46VProcessor calls np.array on a tensor row; numpy 2 warns about the copy keyword
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")

TASKS = ("text", "table", "formula")
PROMPTS = {"text": "Text Recognition:\n", "table": "Table Recognition:\n", "formula": "Formula Recognition:\n"}


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    return build_text_checkpoint(tmp_path_factory.mktemp("tpf"), bd_size=4)


@pytest.fixture(scope="module")
def rows():
    return [{"prompt": PROMPTS[TASKS[i % 3]] + "ab|c{d}" * (i + 1), "target": "x", "task_type": TASKS[i % 3]}
            for i in range(9)]


@pytest.mark.parametrize("n, label", [(0, "<128"), (127, "<128"), (128, "128-511"), (511, "128-511"),
                                      (512, "512-1023"), (1023, "512-1023"), (1024, ">=1024"), (10**5, ">=1024")])
def test_length_bins(n, label):
    assert length_bin(n) == label


def test_summary_is_a_ratio_of_sums_without_x0():
    records = [dict(tokens=10, text_tokens=8, forwards=2, rounds=1, accepted=[8], wall_s=1.0, ar_equal=True,
                    truncated=True),
               dict(tokens=3, text_tokens=2, forwards=3, rounds=2, accepted=[0, 1], wall_s=0.5, ar_equal=False,
                    truncated=False)]
    s = summarize(records)
    assert s["tpf"] == pytest.approx((9 + 2) / 5) and s["tpf_bench"] == pytest.approx(10 / 7)
    assert s["accepted_per_round"] == pytest.approx(3)
    assert s["ar_equal_rate"] == 0.5 and (s["n"], s["tokens"], s["forwards"], s["rounds"]) == (2, 13, 5, 3)
    assert s["truncated"] == 1 and s["wall_s"] == 1.5 and s["ar_compared"] == 2
    assert summarize([])["tpf"] is None


def test_plain_ar_decoding_scores_exactly_one(text_dir, rows):
    """Both conventions give AR decoding 1.0: one token per forward after the prefill's x0 (`tpf`), and every
    token over every forward, prefill included (`tpf_bench` when the text re-tokenizes to the same ids)."""
    from grpo.decoding.batched import BatchARDecoder
    from grpo.decoding.kv_session import stop_token_ids
    from grpo.decoding.tpf import tpf_of
    from grpo.prompting import encode_prompt

    ckpt = load_checkpoint(text_dir, need_drafter=True)
    stops = stop_token_ids(ckpt.model, ckpt.processor)
    results = BatchARDecoder(ckpt.model, stops, 40).generate([encode_prompt(ckpt.processor, r, False) for r in rows])
    records = [{"tokens": len(r.tokens), "forwards": r.forwards} for r in results]
    assert tpf_of(records) == 1.0
    assert sum(r["tokens"] for r in records) == sum(r["forwards"] + 1 for r in records)


def test_measure_tpf_selfspec(text_dir, rows):
    ckpt = load_checkpoint(text_dir, need_drafter=True)
    ckpt.model.train()
    stats = measure_tpf(ckpt.model, ckpt.processor, rows, ckpt.bd, max_new_tokens=40, compare_ar=True,
                        progress=False)
    assert ckpt.model.training  # mode restored for the trainer
    assert stats["n"] == 9 and stats["ar_equal_rate"] == 1.0 and stats["bd_size"] == 4
    assert stats["tpf"] == pytest.approx((stats["tokens"] - stats["n"]) / stats["forwards"])
    assert list(stats["by_task"]) == ["formula", "table", "text"]
    assert all(s["n"] == 3 for s in stats["by_task"].values())
    assert sum(s["tokens"] for s in stats["by_task"].values()) == stats["tokens"]
    assert sum(s["forwards"] for s in stats["by_length"].values()) == stats["forwards"]
    assert list(stats["by_length"]) == ["<128"]
    assert 0 <= stats["accepted_per_round"] <= 4
    json.dumps(stats)  # serialisable as is


def test_rows_are_the_per_prompt_records(text_dir, rows):
    """`rows` re-derive every figure: the prompt ids are the tokenizer's, the output is AR greedy's, the
    forwards are 2 per verified round and 1 per round whose a0 ends the output; the tokens are x0, then a0 +
    the committed drafts + the verifier's token per verified round (the last one's cut at EOS or the cap)."""
    from grpo.decoding.kv_session import stop_token_ids
    from grpo.decoding.selfspec import ar_generate
    from grpo.prompting import encode_prompt

    ckpt = load_checkpoint(text_dir, need_drafter=True)
    stats = measure_tpf(ckpt.model, ckpt.processor, rows, ckpt.bd, max_new_tokens=40, progress=False)
    stops = stop_token_ids(ckpt.model, ckpt.processor)
    assert [r["index"] for r in stats["rows"]] == list(range(9))
    for row, rec in zip(rows, stats["rows"]):
        inputs = encode_prompt(ckpt.processor, row, False)
        assert rec["task"] == row["task_type"] and rec["prompt_ids"] == inputs["input_ids"][0].tolist()
        assert rec["output_ids"] == ar_generate(ckpt.model, inputs, stops, 40).tokens
        assert rec["tokens"] == len(rec["output_ids"]) and rec["truncated"] == (rec["output_ids"][-1] not in stops)
        text = ckpt.processor.decode(rec["output_ids"], skip_special_tokens=True)
        assert rec["text_tokens"] == len(ckpt.processor.encode(text, add_special_tokens=False))
        verified = len(rec["accepted"])
        assert rec["forwards"] == 2 * verified + (rec["rounds"] - verified)
        assert all(0 <= a <= 4 for a in rec["accepted"])
        most = 1 + sum(rec["accepted"]) + 2 * verified + (rec["rounds"] - verified)
        assert most - 1 <= rec["tokens"] <= most
    assert stats["tokens"] == sum(r["tokens"] for r in stats["rows"])
    assert stats["tpf_bench"] == pytest.approx(sum(r["text_tokens"] for r in stats["rows"])
                                               / sum(r["forwards"] + 1 for r in stats["rows"]))


def test_measure_tpf_scores_outputs_against_targets(text_dir, rows):
    """With score, each output gets the GRPO reward against its target; a target equal to the output scores 1."""
    import ocr_rewards as rewards
    from grpo.decoding.kv_session import stop_token_ids
    from grpo.prompting import encode_prompt
    from grpo.decoding.selfspec import ar_generate

    ckpt = load_checkpoint(text_dir, need_drafter=True)
    stops = stop_token_ids(ckpt.model, ckpt.processor)
    outputs = [ckpt.processor.decode(ar_generate(ckpt.model, encode_prompt(ckpt.processor, row, False), stops, 40).tokens,
                                     skip_special_tokens=True) for row in rows]
    scored = [dict(row, target=out if i % 2 else "a different target") for i, (row, out) in enumerate(zip(rows, outputs))]
    stats = measure_tpf(ckpt.model, ckpt.processor, scored, ckpt.bd, max_new_tokens=40, score=True, progress=False)
    expected = [1.0 if i % 2 else rewards.score(out, "a different target", row["task_type"]).value
                for i, (row, out) in enumerate(zip(rows, outputs))]
    assert stats["reward"] == pytest.approx(sum(expected) / len(expected))
    assert stats["exact_rate"] == pytest.approx(4 / 9)
    text = [e for e, row in zip(expected, rows) if row["task_type"] == "text"]
    assert stats["by_task"]["text"]["reward"] == pytest.approx(sum(text) / len(text))
    assert measure_tpf(ckpt.model, ckpt.processor, rows[:1], ckpt.bd, max_new_tokens=8, progress=False)["reward"] is None


def test_measure_tpf_diffusion_and_bd_size_override(text_dir, rows):
    ckpt = load_checkpoint(text_dir, need_drafter=True)
    stats = measure_tpf(ckpt.model, ckpt.processor, rows[:3], ckpt.bd, bd_size=2, max_new_tokens=21,
                        mode="diffusion", tau=1.0, progress=False)
    assert stats["bd_size"] == 2 and stats["accepted_per_round"] is None and stats["ar_equal_rate"] is None
    # tau 1.0 reveals one slot per step: a block of 2 costs 2 steps + 1 cache write, each prompt's last block
    # no write
    assert stats["forwards"] == stats["rounds"] * (2 + 1) - 3 and stats["tau"] == 1.0


def test_measure_tpf_refuses_without_drafter(text_dir, rows):
    ckpt = load_checkpoint(text_dir)
    with pytest.raises(CheckpointError, match="block_diffusion.json"):
        measure_tpf(ckpt.model, ckpt.processor, rows, None, progress=False)
    with pytest.raises(ValueError, match="mode must be one of"):
        measure_tpf(ckpt.model, ckpt.processor, rows, ckpt.bd, mode="beam", progress=False)


def test_measure_tpf_glmocr_with_images(tmp_path):
    ckpt = load_checkpoint(build_glmocr_checkpoint(tmp_path, bd_size=4), need_drafter=True)
    processor = build_glm_processor(ckpt.processor)
    images = [Image.new("RGB", (8 + 4 * i, 12), (40 * i, 90, 200)) for i in range(3)]
    vlm_rows = [{"prompt": PROMPTS[t], "image": img, "target": "x", "task_type": t} for t, img in zip(TASKS, images)]
    stats = measure_tpf(ckpt.model, processor, vlm_rows, ckpt.bd, is_vlm=True, max_new_tokens=24,
                        compare_ar=True, progress=False)
    assert stats["n"] == 3 and stats["ar_equal_rate"] == 1.0 and set(stats["by_task"]) == set(TASKS)
    batched = measure_tpf(ckpt.model, processor, vlm_rows, ckpt.bd, is_vlm=True, max_new_tokens=24,
                          compare_ar=True, progress=False, batch_size=3)
    keys = ("output_ids", "forwards", "rounds", "accepted", "ar_equal")
    assert [[r[k] for k in keys] for r in batched["rows"]] == [[r[k] for k in keys] for r in stats["rows"]]


def _write_pool(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_writes_json(text_dir, rows, tmp_path, capsys):
    pool = _write_pool(tmp_path / "pool.jsonl", rows)
    out = tmp_path / "stats" / "tpf.json"
    out.parent.mkdir()  # tpf creates no folder (grpo.outputs)
    code = main(["tpf", "--model", str(text_dir), "--data", str(pool), "--limit", "4", "--compare-ar",
                 "--max-new-tokens", "24", "--out", str(out)])
    assert code == 0
    stats = json.loads(out.read_text())
    assert {"tpf", "accepted_per_round", "ar_equal_rate", "by_task", "by_length", "n", "rows"} <= set(stats)
    assert [r["index"] for r in stats["rows"]] == [0, 1, 2, 3]
    assert set(stats["rows"][0]) >= {"index", "task", "prompt_ids", "output_ids", "tokens", "forwards", "rounds",
                                     "accepted", "ar_equal", "reward", "exact"}
    assert stats["n"] == 4 and stats["ar_equal_rate"] == 1.0
    assert "TPF (selfspec, B=4, n=4)" in capsys.readouterr().out


def test_cli_refuses_checkpoint_without_drafter(text_dir, rows, tmp_path, capsys):
    plain = tmp_path / "plain"
    shutil.copytree(text_dir, plain)
    (plain / BD_FILE).unlink()
    pool = _write_pool(tmp_path / "pool.jsonl", rows)
    assert main(["tpf", "--model", str(plain), "--data", str(pool)]) == 2
    assert "block_diffusion.json is missing" in capsys.readouterr().err


def test_cli_batch_size_gives_the_same_rows(text_dir, rows, tmp_path):
    pool = _write_pool(tmp_path / "pool.jsonl", rows)
    stats = {}
    for size in (1, 4):
        out = tmp_path / f"b{size}.json"
        assert main(["tpf", "--model", str(text_dir), "--data", str(pool), "--max-new-tokens", "30",
                     "--batch-size", str(size), "--out", str(out)]) == 0
        stats[size] = json.loads(out.read_text())
    keys = ("index", "output_ids", "forwards", "rounds", "accepted")
    assert [{k: r[k] for k in keys} for r in stats[1]["rows"]] == [{k: r[k] for k in keys} for r in stats[4]["rows"]]
    assert stats[4]["batch_size"] == 4 and stats[4]["wall_s"] > 0


def test_cli_sampling_rows_per_prompt_and_sample_deterministic(text_dir, rows, tmp_path):
    pool = _write_pool(tmp_path / "pool.jsonl", rows[:3])
    outs = []
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        out = tmp_path / f"{name}.json"
        assert main(["tpf", "--model", str(text_dir), "--data", str(pool), "--max-new-tokens", "30",
                     "--temperature", "1.0", "--samples", "4", "--seed", str(seed), "--batch-size", "5",
                     "--out", str(out)]) == 0
        outs.append(json.loads(out.read_text()))
    first = outs[0]["rows"]
    assert [(r["index"], r["sample"]) for r in first] == [(i, k) for i in range(3) for k in range(4)]
    assert all(r["prompt_ids"] and r["output_ids"] for r in first)
    assert [r["output_ids"] for r in first] == [r["output_ids"] for r in outs[1]["rows"]]
    assert [r["output_ids"] for r in first] != [r["output_ids"] for r in outs[2]["rows"]]
    assert outs[0]["temperature"] == 1.0 and outs[0]["samples"] == 4 and outs[0]["n"] == 12


@pytest.mark.parametrize("flags, message", [
    (["--samples", "3"], "--samples > 1 needs --temperature"),
    (["--temperature", "1", "--compare-ar"], "--compare-ar checks equality"),
    (["--batch-size", "0"], "--batch-size must be an integer in [1, 256], got 0"),
    (["--temperature", "-1"], "--temperature must be 0 (greedy) or a finite number >= 0.01 (less overflows the "
                              "softmax), got -1.0"),
    (["--mode", "diffusion", "--batch-size", "2"], "--mode diffusion decodes greedily at batch 1")])
def test_cli_refuses_contradicting_decoding_flags(text_dir, rows, tmp_path, capsys, flags, message):
    pool = _write_pool(tmp_path / "pool.jsonl", rows)
    assert main(["tpf", "--model", str(text_dir), "--data", str(pool), *flags]) == 2
    assert message in capsys.readouterr().err
