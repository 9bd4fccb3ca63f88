"""Joint AR / block-diffusion training (docs/spec.md §6): layout, masking, labels, EOS rule, alignment with decoding."""
from __future__ import annotations

import pytest
import torch

from grpo.joint.streams import (IGNORE, build_example, collate, combine, complementary_masks, greedy_relabel,
                                joint_layout, joint_losses)
from grpo.joint.train import JointConfig, build_tiny_model, load_config

MASK, EOS, PAD = 2, 0, 1


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_layout_visibility_prompt_clean_and_corrupted_blocks():
    P, R, B = 3, 5, 2          # blocks of the response: [0, 1], [2, 3], [4]
    allow = joint_layout(P, R, B)
    c1, c2 = P + R, P + 2 * R  # offsets of corrupted streams 1 and 2
    assert allow.shape == (P + 3 * R, P + 3 * R)
    # prompt and clean stream: causal, and blind to both corrupted streams
    assert torch.equal(allow[: P + R, : P + R], torch.tril(torch.ones(P + R, P + R, dtype=torch.bool)))
    assert not allow[: P + R, P + R:].any()
    for offset, other in ((c1, c2), (c2, c1)):
        row = offset + 2                                  # stream token 2: first of block 1
        visible = set(torch.nonzero(allow[row]).flatten().tolist())
        expected = {0, 1, 2, P + 0, P + 1, offset + 2, offset + 3}  # prompt, clean block 0, own block 1
        assert visible == expected
        assert not allow[row, P + 2] and not allow[row, P + 3]    # never the current clean block
        assert not allow[row, other: other + R].any()               # never the other stream
        assert allow[offset + 3, offset + 2]                        # bidirectional inside the block
        last = offset + 4                                           # partial last block [4]
        assert set(torch.nonzero(allow[last]).flatten().tolist()) == {0, 1, 2, P, P + 1, P + 2, P + 3, last}
        first = offset                                              # block 0: prompt + own block only
        assert set(torch.nonzero(allow[first]).flatten().tolist()) == {0, 1, 2, offset, offset + 1}


def test_complementary_masking_every_response_token_masked_in_exactly_one_stream():
    prompt, target, B = [5, 6, 7], [10, 11, 12, 13, 14, 15, 16], 4
    for seed in range(20):
        ex = build_example(prompt, target, bd_size=B, mask_id=MASK, eos_id=EOS, gen=_gen(seed))
        P, R = len(prompt), len(target) + B
        s1, s2 = ex["input_ids"][P + R: P + 2 * R], ex["input_ids"][P + 2 * R:]
        clean = ex["input_ids"][P: P + R]
        assert ((s1 == MASK) ^ (s2 == MASK)).all()
        assert torch.equal(torch.where(s1 == MASK, s2, s1), clean)
        # every response token is a diffusion target exactly once, read one position before it
        labelled = ex["labels_diff"] != IGNORE
        assert int(labelled.sum()) == R
        for k in range(1, R):
            stream = P + R if s1[k] == MASK else P + 2 * R
            assert ex["labels_diff"][stream + k - 1] == clean[k]
        assert ex["labels_diff"][P - 1] == clean[0]   # token 0 is read from the last prompt token
        assert torch.equal(ex["position_ids"][P + R: P + 2 * R], torch.arange(P, P + R))


def test_per_block_noise_level_is_shared_inside_a_block():
    # t = U(0,1) per block: with many tokens per block the masked share tracks one t per block
    masks = complementary_masks(4 * 4000, 4000, _gen(3)).view(4, 4000).float().mean(1)
    assert masks.std() > 0.05                    # blocks differ
    assert complementary_masks(10, 4, _gen(1)).shape == (10,)


def test_full_mask_share_masks_whole_blocks_in_stream_one_and_zero_keeps_the_uniform_draws():
    n, B = 40 * 8, 8
    whole = complementary_masks(n, B, _gen(4), full_share=1.0)
    assert whole.all()                           # t = 1 on every block: stream 1 is the draft window, stream 2 empty
    half = complementary_masks(n, B, _gen(4), full_share=0.5).view(-1, B)
    full_blocks = int(half.all(1).sum())
    assert 10 <= full_blocks <= 32               # about half of the 40 blocks (a uniform t rarely masks all 8)
    assert torch.equal(complementary_masks(n, B, _gen(4), full_share=0.0), complementary_masks(n, B, _gen(4)))
    prompt, target = [5, 6, 7], [10, 11, 12, 13, 14]
    ex = build_example(prompt, target, bd_size=4, mask_id=MASK, eos_id=EOS, gen=_gen(), full_share=1.0)
    P, R = len(prompt), len(target) + 4
    assert (ex["input_ids"][P + R: P + 2 * R] == MASK).all() and not (ex["input_ids"][P + 2 * R:] == MASK).any()
    assert int((ex["labels_diff"] != IGNORE).sum()) == R   # every response token a target once, in stream 1


def test_eos_rule_ar_counts_first_eos_diffusion_all():
    prompt, target, B = [5, 6], [10, 11, 12], 4
    ex = build_example(prompt, target, bd_size=B, mask_id=MASK, eos_id=EOS, gen=_gen())
    P = len(prompt)
    assert ex["input_ids"][P: P + len(target) + B].tolist() == target + [EOS] * B
    ar = ex["labels_ar"][ex["labels_ar"] != IGNORE].tolist()
    assert ar == target + [EOS]                  # exactly one EOS in the AR targets
    assert torch.nonzero(ex["labels_ar"] != IGNORE).flatten().tolist() == list(range(P - 1, P + len(target)))
    diff = ex["labels_diff"][ex["labels_diff"] != IGNORE].tolist()
    assert diff.count(EOS) == B                  # all B EOS are denoising targets
    ar_only = build_example(prompt, target, bd_size=B, mask_id=MASK, eos_id=EOS, gen=_gen(), ar_only=True)
    assert ar_only["input_ids"].tolist() == prompt + target + [EOS]
    assert (ar_only["labels_diff"] == IGNORE).all()


def test_collate_builds_float_additive_mask_and_pads():
    a = build_example([5, 6], [10, 11], bd_size=2, mask_id=MASK, eos_id=EOS, gen=_gen())
    b = build_example([5], [10], bd_size=2, mask_id=MASK, eos_id=EOS, gen=_gen())
    batch = collate([a, b], PAD)
    mask = batch["attention_mask"]
    T = len(a["input_ids"])
    assert mask.shape == (2, 1, T, T) and mask.dtype == torch.float32
    assert set(mask.unique().tolist()) == {0.0, torch.finfo(torch.float32).min}
    n = len(b["input_ids"])
    assert (batch["input_ids"][1, n:] == PAD).all() and (batch["labels_ar"][1, n:] == IGNORE).all()
    assert mask[1, 0, n, n] == 0 and (mask[1, 0, n, :n] < 0).all()   # a padding row sees itself only


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="empty prompt"):
        build_example([], [1], bd_size=2, mask_id=MASK, eos_id=EOS, gen=_gen())


def test_config_rejects_unknown_yaml_field_and_bad_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("bd_size: 8\nblock: 3\n")
    with pytest.raises(ValueError, match="block"):
        load_config(path)
    path.write_text("bd_size: 8\n")
    assert load_config(path, joint_steps=3).bd_size == 8
    with pytest.raises(ValueError, match="bd_size"):
        JointConfig(bd_size=0)
    with pytest.raises(ValueError, match="ar_steps"):
        JointConfig(ar_steps=0, joint_steps=0)
    with pytest.raises(ValueError, match="stop_at_step"):
        JointConfig(ar_steps=2, joint_steps=3, stop_at_step=6)
    with pytest.raises(ValueError, match="full_mask_share"):
        JointConfig(full_mask_share=1.5)


def test_combine_weights_losses():
    l_ar, l_diff = torch.tensor(2.0), torch.tensor(4.0)
    assert combine(l_ar, l_diff, 1.0).item() == pytest.approx(3.0)
    assert combine(l_ar, l_diff, 3.0).item() == pytest.approx((4.0 + 6.0) / 4)
    assert combine(l_ar, None, 1.0).item() == 2.0


# ------------------------------------------------------------------------------------- with a model


@pytest.fixture(scope="module")
def tokenizer():
    from grpo.synthetic.splits import generate
    from grpo.synthetic.tokenizer import build_tokenizer

    rows = generate("tiny-train", 300)
    return build_tokenizer([t for r in rows for t in (r["prompt"], r["target"])])


def _tiny(tokenizer, seed=0):
    torch.set_num_threads(1)
    cfg = JointConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, head_dim=32,
                      intermediate_size=128, seed=seed)
    model = build_tiny_model(cfg, tokenizer)
    model.config._attn_implementation = "sdpa"
    return model


def test_training_logits_match_inference_streams(tokenizer):
    """Clean stream == plain causal forward; a fully masked block == the draft window `[x0, M×B]`."""
    from grpo.decoding.kv_session import Session

    model = _tiny(tokenizer).eval()
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    prompt = tokenizer("Text Recognition:\nThe model shows a high rate").input_ids
    target = tokenizer("The model shows a high rate", add_special_tokens=False).input_ids
    B = 4
    ex = build_example(prompt, target, bd_size=B, mask_id=mask_id, eos_id=tokenizer.eos_token_id, gen=_gen())
    P, R = len(prompt), len(target) + B
    b = 1                                                   # block 1 of stream 1, fully masked
    ex["input_ids"][P + R + b * B: P + R + (b + 1) * B] = mask_id
    batch = collate([ex], tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[0]
        plain = model(input_ids=torch.tensor([prompt + ex["input_ids"][P: P + R].tolist()])).logits[0]
    torch.testing.assert_close(logits[: P + R], plain, atol=1e-5, rtol=1e-5)
    clean = ex["input_ids"][P: P + R].tolist()
    session = Session(model)
    with torch.no_grad():
        session.prefill({"input_ids": torch.tensor([prompt + clean[: b * B - 1]])})
        window = session.forward([clean[b * B - 1]] + [mask_id] * B, draft=True)   # (B+1, V)
    # mask j of the window (j = 1..B) <-> stream-1 position b*B + j - 1, which predicts response[b*B + j]
    torch.testing.assert_close(window[1:], logits[P + R + b * B: P + R + (b + 1) * B], atol=1e-5, rtol=1e-5)


def test_greedy_drafter_targets_are_the_verifiers_argmax_and_the_ar_targets_stay(tokenizer):
    """`drafter_targets: greedy`: each masked target k >= 1 of the target and its first EOS becomes the causal
    argmax at P+k-1 of prompt + response; token 0, the EOS padding and the AR labels keep the row's tokens."""
    from grpo.joint.train import _example

    model = _tiny(tokenizer, seed=2).eval()
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    prompt = tokenizer("Text Recognition:\nThe model shows").input_ids
    target = tokenizer("The model shows", add_special_tokens=False).input_ids
    B, eos = 4, tokenizer.eos_token_id
    cfg = JointConfig(bd_size=B, drafter_targets="greedy")
    ex = _example(prompt, target, None, cfg, mask_id, eos, _gen(), ar_only=False)
    batch = collate([ex], tokenizer.pad_token_id)
    with torch.no_grad():
        hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             position_ids=batch["position_ids"]).last_hidden_state
        labels = greedy_relabel(batch, batch["greedy_src"])(hidden, model.get_output_embeddings())[0]
        plain = model(input_ids=torch.tensor([prompt + target + [eos] * B])).logits[0].argmax(-1)
    P, R, N = len(prompt), len(target) + B, len(target)
    response = target + [eos] * B
    assert (labels != IGNORE).sum() == (batch["labels_diff"] != IGNORE).sum()
    assert plain[P - 1: P + N].tolist() != response[: N + 1]   # an untrained verifier: relabelling changes targets
    for offset in (P + R, P + 2 * R):
        for k in range(1, R):
            if labels[offset + k - 1] != IGNORE:
                expected = plain[P + k - 1] if k <= N else eos
                assert labels[offset + k - 1] == expected, (offset, k)
    assert labels[P - 1] == batch["labels_diff"][0, P - 1]
    assert torch.equal(batch["labels_ar"][0], ex["labels_ar"])
    assert "greedy_src" not in _example(prompt, target, None, JointConfig(bd_size=B), mask_id, eos, _gen(), False)


@pytest.mark.slow
def test_a_few_steps_reduce_both_losses(tokenizer):
    from grpo.synthetic.splits import generate

    model = _tiny(tokenizer, seed=1)
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    rows = generate("tiny-train", 8)
    examples = [build_example(tokenizer(r["prompt"]).input_ids,
                              tokenizer(r["target"], add_special_tokens=False).input_ids, bd_size=8,
                              mask_id=mask_id, eos_id=tokenizer.eos_token_id, gen=_gen(i))
                for i, r in enumerate(rows)]
    batch = collate(examples, tokenizer.pad_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(15):
        l_ar, l_diff = joint_losses(model, batch)
        first = first or (l_ar.item(), l_diff.item())
        opt.zero_grad()
        combine(l_ar, l_diff, 1.0).backward()
        opt.step()
    l_ar, l_diff = joint_losses(model, batch)
    assert l_ar.item() < 0.8 * first[0] and l_diff.item() < 0.8 * first[1]


@pytest.mark.slow
def test_joint_training_aligns_drafter_with_decoding(tokenizer):
    """Overfit two examples jointly, then self-speculative decoding must accept most of each draft."""
    from grpo.decoding.kv_session import stop_token_ids
    from grpo.decoding.selfspec import SelfSpecDecoder, ar_generate

    B = 4
    model = _tiny(tokenizer, seed=2)
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    pairs = [("Text Recognition:\nAlpha", "the cost of water rises in the north region"),
             ("Text Recognition:\nBeta", "a new model shows the annual sales trend")]
    encoded = [(tokenizer(p).input_ids, tokenizer(t, add_special_tokens=False).input_ids) for p, t in pairs]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = _gen(5)
    for _ in range(150):
        batch = collate([build_example(p, t, bd_size=B, mask_id=mask_id, eos_id=tokenizer.eos_token_id, gen=gen)
                         for p, t in encoded for _ in range(4)], tokenizer.pad_token_id)
        l_ar, l_diff = joint_losses(model, batch)
        opt.zero_grad()
        combine(l_ar, l_diff, 1.0).backward()
        opt.step()
    model.eval()
    stops = stop_token_ids(model, tokenizer)
    decoder = SelfSpecDecoder(model, mask_id, B, stops, max_new_tokens=64)
    for prompt, target in encoded:
        inputs = {"input_ids": torch.tensor([prompt])}
        result = decoder.generate(inputs)
        assert result.tokens == target + [tokenizer.eos_token_id]
        assert result.tokens == ar_generate(model, inputs, stops, 64).tokens
        # a misaligned drafter (off by one position) would accept almost nothing
        assert sum(result.accepted) / len(result.accepted) >= B / 2


def test_saved_checkpoint_reloads_with_the_same_tokenization(tokenizer, tmp_path):
    """A saved tiny checkpoint keeps its own tokenizer (no architecture-specific tokenizer class on reload)."""
    from transformers import AutoTokenizer

    from grpo.synthetic.splits import generate
    from grpo.checkpoint import load_checkpoint
    from grpo.joint.train import save

    model = _tiny(tokenizer).eval()
    save(model, tokenizer, tmp_path, JointConfig(bd_size=4, full_mask_share=0.5))
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for row in generate("tiny-probe", 9):
        assert reloaded(row["prompt"]).input_ids == tokenizer(row["prompt"]).input_ids
        assert reloaded(row["target"], add_special_tokens=False).input_ids == \
            tokenizer(row["target"], add_special_tokens=False).input_ids
    ckpt = load_checkpoint(tmp_path, need_drafter=True)
    assert ckpt.bd.bd_size == 4 and ckpt.bd.mask_id == tokenizer.convert_tokens_to_ids("<|mask|>")
    assert ckpt.bd.mask_schedule == "uniform, 0.5 of blocks full"   # the schedule it was trained with, recorded
    assert ckpt.model.config.head_dim == 32 and ckpt.model.generation_config.bos_token_id is None
