"""GravityOCR's bench count (issue 33): its round layout (`GravityRoundDecoder`) gives AR greedy's output, a
forward hook on decoder layer 0 counts the forwards `tpf_bench` divides by, and the `gravityocr-bench` preset
records its caps, crops and round."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from grpo.checkpoint import load_checkpoint, tokenizer_of
from grpo.cli import main
from grpo.decoding.kv_session import stop_token_ids
from grpo.decoding.presets import PRESETS
from grpo.decoding.selfspec import GravityRoundDecoder, SelfSpecDecoder, ar_generate
from grpo.decoding.tpf import measure_tpf
from grpo.pool import load_pool
from grpo.prompting import encode_prompt


def decoder_layer0(model):
    """The first decoder layer of a text model or of GLM-OCR's language model (where GravityOCR hooks)."""
    inner = model.model
    return getattr(inner, "language_model", inner).layers[0]


@pytest.mark.parametrize("name,pool,is_vlm", [("tiny", "tiny-probe", False),
                                              ("data/tiny/vlm/model", "data/tiny/vlm/probe", True)])
def test_a_hook_on_layer_0_counts_the_bench_forwards(name, pool, is_vlm):
    ckpt = load_checkpoint(name, need_drafter=True)
    model, tok = ckpt.model.eval(), tokenizer_of(ckpt.processor)
    stops = stop_token_ids(model, tok)
    cap = 24
    rows = list(load_pool(pool).select(range(6)))
    count = {"n": 0}
    handle = decoder_layer0(model).register_forward_hook(lambda *a, **k: count.__setitem__("n", count["n"] + 1))
    try:
        for row in rows:
            x = encode_prompt(ckpt.processor, row, is_vlm)
            count["n"] = 0
            ours = SelfSpecDecoder(model, ckpt.bd.mask_id, ckpt.bd.bd_size, stops, cap).generate(x)
            assert count["n"] == ours.forwards + 1
            count["n"] = 0
            bench = GravityRoundDecoder(model, ckpt.bd.mask_id, ckpt.bd.bd_size, stops, cap).generate(x)
            assert count["n"] == bench.forwards + 1  # prefill + draft and verify of every round
            assert bench.forwards == 2 * bench.rounds  # the verify runs in every round, the last one too
            assert bench.tokens[:cap] == ar_generate(model, x, stops, cap).tokens == ours.tokens
            assert len(bench.tokens) <= cap - 1 + ckpt.bd.bd_size + 2  # the last round may run past the cap
    finally:
        handle.remove()
    stats = measure_tpf(model, ckpt.processor, rows, ckpt.bd, is_vlm=is_vlm, max_new_tokens=cap, compare_ar=True,
                        progress=False, preset=dataclasses.replace(PRESETS["cpu"], round="gravityocr"))
    assert stats["ar_equal_rate"] == 1.0
    assert stats["tpf_bench"] == pytest.approx(sum(r["text_tokens"] for r in stats["rows"])
                                               / sum(r["forwards"] + 1 for r in stats["rows"]), rel=1e-12)


def test_the_first_round_drafts_where_x0_stands_and_commits_x0():
    """On an output that ends at x0, GravityOCR's layout still drafts and verifies (3 forwards with the prefill);
    the package's layout stops after the prefill."""
    ckpt = load_checkpoint("tiny", need_drafter=True)
    model, tok = ckpt.model.eval(), tokenizer_of(ckpt.processor)
    eos = tok.eos_token_id
    x = encode_prompt(ckpt.processor, {"prompt": "Text Recognition:\nab"}, False)
    first = int(torch.argmax(model(**x).logits[0, -1]))
    stops = {first, eos}  # the prompt's first output token ends the output
    bench = GravityRoundDecoder(model, ckpt.bd.mask_id, ckpt.bd.bd_size, stops, 16).generate(x)
    ours = SelfSpecDecoder(model, ckpt.bd.mask_id, ckpt.bd.bd_size, stops, 16).generate(x)
    assert bench.tokens == ours.tokens == [first]
    assert (bench.forwards, bench.rounds, bench.accepted) == (2, 1, [0])
    assert (ours.forwards, ours.rounds) == (0, 0)


def test_the_bench_preset_records_its_settings_and_text_without_think(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["tpf", "--model", "tiny", "--pool", "tiny-probe", "--limit", "3", "--preset", "gravityocr-bench",
                 "--dtype", "float32", "--compare-ar", "--out", str(out)]) == 0
    stats = json.loads(out.read_text())
    settings = stats["settings"]
    assert settings["image_long_side"] == "1344" and settings["round"].startswith("full draft")
    assert "every round verified" in settings["round"]
    assert set(settings["max_new_tokens"].values()) <= {256, 768}
    assert stats["ar_equal_rate"] == 1.0
    assert main(["tpf", "--pool", "tiny-probe", "--preset", "gravityocr-bench", "--batch-size", "2"]) == 2


def test_bench_text_tokens_drop_the_think_block():
    from grpo.decoding.kv_session import DecodeResult
    from grpo.decoding.tpf import _record

    ckpt = load_checkpoint("tiny", need_drafter=True)
    tok = tokenizer_of(ckpt.processor)
    ids = tok.encode("<think>\n</think>\nab", add_special_tokens=False) + [tok.eos_token_id]
    row = {"task_type": "text", "prompt": "p", "target": "ab"}
    record = _record(0, 0, row, {}, DecodeResult(tokens=ids, forwards=1), tok, frozenset({tok.eos_token_id}),
                     True, None, None, 0.0)
    assert record["text_tokens"] == len(tok.encode("ab", add_special_tokens=False))
    assert record["tokens"] == len(ids)
