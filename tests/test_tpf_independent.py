"""An independent self-speculative loop, written from docs/spec.md §5 without a KV cache (every forward re-reads the
whole sequence under an explicit additive mask), reproduces the per-row records of `gravity-grpo tpf` on the
tiny default: output ids, forwards, rounds and the drafts committed in each round; at batch size 1 and 16.
The reported `tpf` is the convention under which the same loop's plain AR decoding scores exactly 1.0."""
from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.slow

MAX_NEW = 192


def _forward(model, ids: list[int], draft_from: int | None = None) -> torch.Tensor:
    """Logits (T, vocab) of the whole sequence: causal, except that positions >= `draft_from` (the masks)
    see every position up to the end, and no earlier position sees them."""
    n = len(ids)
    allow = torch.tril(torch.ones(n, n, dtype=torch.bool))
    if draft_from is not None:
        allow[draft_from:, :] = True
    mask = torch.zeros(1, 1, n, n).masked_fill(~allow, torch.finfo(torch.float32).min)
    return model(input_ids=torch.tensor([ids]), attention_mask=mask).logits[0]


@torch.inference_mode()
def _self_speculative(model, prompt: list[int], mask_id: int, B: int, stops: set[int]) -> dict:
    out = [int(_forward(model, prompt)[-1].argmax())]  # prefill: x0 (not counted)
    forwards = rounds = 0
    accepted = []
    while out[-1] not in stops and len(out) < MAX_NEW:
        seq = prompt + out                              # ... x0
        logits = _forward(model, seq + [mask_id] * B, draft_from=len(seq))
        forwards += 1
        a0 = int(logits[len(seq) - 1].argmax())         # x0's logits
        drafts = [int(logits[len(seq) - 1 + j].argmax()) for j in range(1, B + 1)]  # mask j's logits -> d_j
        run = [a0]
        verify = a0 not in stops and len(out) + 1 < MAX_NEW
        if verify:
            check = _forward(model, seq + [a0] + drafts)
            forwards += 1
            verified = [int(check[len(seq) + j].argmax()) for j in range(B + 1)]  # a1 .. a(B+1)
            a = 0
            while a < B and drafts[a] == verified[a]:
                a += 1
            run += drafts[:a] + [verified[a]]
        room = MAX_NEW - len(out)
        cut = next((i + 1 for i, t in enumerate(run[:room]) if t in stops), min(room, len(run)))
        run = run[:cut]
        if verify:  # the drafts that survived the cut
            accepted.append(min(a, len(run) - 1))
        out += run
        rounds += 1
    return {"output_ids": out, "forwards": forwards, "rounds": rounds, "accepted": accepted}


@torch.inference_mode()
def _autoregressive(model, prompt: list[int], stops: set[int]) -> dict:
    out = [int(_forward(model, prompt)[-1].argmax())]  # prefill: x0 (not counted)
    forwards = 0
    while out[-1] not in stops and len(out) < MAX_NEW:
        out.append(int(_forward(model, prompt + out)[-1].argmax()))
        forwards += 1
    return {"output_ids": out, "forwards": forwards}


def _tpf(rows) -> float:
    """Output tokens after x0 over draft + verify forwards, summed over the rows."""
    return sum(len(r["output_ids"]) - 1 for r in rows) / sum(r["forwards"] for r in rows)


@pytest.mark.parametrize("batch_size", [1, 16])
def test_independent_loop_reproduces_the_tpf_rows(tmp_path, batch_size):
    from grpo.checkpoint import load_checkpoint
    from grpo.cli import main
    from grpo.decoding.kv_session import stop_token_ids

    out = tmp_path / "tpf.json"
    assert main(["tpf", "--model", "tiny", "--data", "tiny-probe", "--max-new-tokens", str(MAX_NEW),
                 "--batch-size", str(batch_size), "--out", str(out)]) == 0
    stats = json.loads(out.read_text())
    rows = stats["rows"]
    ckpt = load_checkpoint("tiny", need_drafter=True)
    stops = set(stop_token_ids(ckpt.model, ckpt.processor))
    assert len(rows) == 60
    for row in rows:
        mine = _self_speculative(ckpt.model, row["prompt_ids"], ckpt.bd.mask_id, ckpt.bd.bd_size, stops)
        assert {k: row[k] for k in mine} == mine, row["index"]
        assert row["tokens"] == len(row["output_ids"])
    assert stats["tpf"] == pytest.approx(_tpf(rows), rel=1e-12)
    text = [len(ckpt.processor.encode(ckpt.processor.decode(r["output_ids"], skip_special_tokens=True),
                                      add_special_tokens=False)) for r in rows]
    assert stats["tpf_bench"] == pytest.approx(sum(text) / sum(r["forwards"] + 1 for r in rows), rel=1e-12)
    ar = [_autoregressive(ckpt.model, row["prompt_ids"], stops) for row in rows[::6]]
    assert [a["output_ids"] for a in ar] == [row["output_ids"] for row in rows[::6]]
    assert _tpf(ar) == 1.0
