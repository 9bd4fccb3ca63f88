"""Joint training on image rows (GLM-OCR, grpo.joint.images): M-RoPE positions of the streams, images batched in
order, the training streams equal to what the decoders compute, and `gravity-grpo joint` on a GLM-OCR checkpoint."""
from __future__ import annotations

import pytest
import torch

from grpo.joint.streams import IGNORE, build_example, collate, joint_losses

MASK, EOS = 2, 0


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_image_prompt_positions_continue_after_the_largest_on_all_three_axes():
    prompt = [5, 6, 7, 8]
    rope = torch.tensor([[0, 1, 1, 2], [0, 1, 2, 2], [0, 1, 2, 3]])  # a prompt whose largest position is 3
    target, B = [10, 11, 12], 2
    R = len(target) + B
    ex = build_example(prompt, target, bd_size=B, mask_id=MASK, eos_id=EOS, gen=_gen(), prompt_positions=rope)
    assert ex["position_ids"].shape == (3, len(prompt) + 3 * R)
    assert torch.equal(ex["position_ids"][:, :4], rope)
    for stream in range(3):                       # clean and both corrupted streams: 4, 5, ... on every axis
        start = 4 + stream * R
        assert torch.equal(ex["position_ids"][:, start: start + R], torch.arange(4, 4 + R).expand(3, R))
    ar_only = build_example(prompt, target, bd_size=B, mask_id=MASK, eos_id=EOS, gen=_gen(), ar_only=True,
                            prompt_positions=rope)
    assert ar_only["position_ids"][:, 4:].tolist() == [[4, 5, 6, 7]] * 3
    with pytest.raises(ValueError, match=r"shape \(3, 4\)"):
        build_example(prompt, target, bd_size=B, mask_id=MASK, eos_id=EOS, gen=_gen(), prompt_positions=rope[:, :3])


def test_collate_stacks_3d_positions_and_concatenates_images_in_batch_order():
    rope = torch.arange(6).view(3, 2)
    a = {**build_example([5, 6], [10], bd_size=2, mask_id=MASK, eos_id=EOS, gen=_gen(), prompt_positions=rope),
         "pixel_values": torch.zeros(4, 3), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    b = {**build_example([5, 6], [10, 11, 12], bd_size=2, mask_id=MASK, eos_id=EOS, gen=_gen(),
                         prompt_positions=rope),
         "pixel_values": torch.ones(8, 3), "image_grid_thw": torch.tensor([[1, 2, 4]])}
    batch = collate([a, b], 1)
    T = len(b["input_ids"])
    assert batch["position_ids"].shape == (3, 2, T)
    assert torch.equal(batch["position_ids"][:, 1], b["position_ids"])
    assert torch.equal(batch["position_ids"][:, 0, : len(a["input_ids"])], a["position_ids"])
    assert batch["pixel_values"].tolist() == [[0.0] * 3] * 4 + [[1.0] * 3] * 8
    assert batch["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 4]]


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    """(tiny GLM-OCR checkpoint, its processor, two encoded rows with crops of different sizes)."""
    from helpers_models import glm_with_image_rows

    from grpo.joint.images import encode_image_rows

    torch.set_num_threads(1)
    ckpt, processor, rows = glm_with_image_rows(tmp_path_factory.mktemp("glm"), ["Text Recognition:"] * 2)
    rows = [{**row, "target": target} for row, target in zip(rows, ("north wind", "x^{2} + 1"))]
    rows[1]["image"] = rows[1]["image"].resize((20, 12))
    ckpt.model.config._attn_implementation = "sdpa"
    return ckpt, processor, encode_image_rows(rows, ckpt.model, processor, max_target_tokens=64), rows


def _example(ckpt, row, gen_seed=0, B=4):
    example = build_example(row.prompt_ids, row.target_ids, bd_size=B, mask_id=ckpt.bd.mask_id,
                            eos_id=ckpt.model.generation_config.eos_token_id, gen=_gen(gen_seed),
                            prompt_positions=row.positions)
    return {**example, **row.images}


def test_image_rows_are_the_prompts_the_decoders_see(glm):
    from grpo.prompting import encode_prompt

    ckpt, processor, rows, raw = glm
    for row, source in zip(rows, raw):
        inputs = encode_prompt(processor, source, is_vlm=True)
        assert row.prompt_ids == inputs["input_ids"][0].tolist()
        assert torch.equal(row.images["pixel_values"], inputs["pixel_values"])
        assert row.positions.shape == (3, len(row.prompt_ids))
        assert row.prompt_ids.count(ckpt.model.config.image_token_id) > 1
        assert int(row.positions.max()) < len(row.prompt_ids) - 1   # M-RoPE: an image spans fewer positions
    assert rows[0].images["image_grid_thw"].tolist() != rows[1].images["image_grid_thw"].tolist()
    assert processor.tokenizer.decode(rows[1].target_ids) == "x^{2} + 1"


def test_image_training_streams_equal_the_decoders_forwards(glm):
    """Clean stream == the AR forward of prompt + response (images in); a fully masked block == the draft window
    after a prefill with the image; two rows in one batch == each alone (images matched to their rows)."""
    from grpo.decoding.kv_session import Session

    ckpt, processor, rows, _ = glm
    model, B, mask_id = ckpt.model, 4, ckpt.bd.mask_id
    examples = [_example(ckpt, row) for row in rows]
    row, ex = rows[0], examples[0]
    P, R = len(row.prompt_ids), len(row.target_ids) + B
    b = 1                                                       # block 1 of stream 1, fully masked
    ex["input_ids"][P + R + b * B: P + R + (b + 1) * B] = mask_id
    batch = collate(examples, processor.tokenizer.pad_token_id)
    alone = collate([examples[1]], processor.tokenizer.pad_token_id)
    clean = ex["input_ids"][P: P + R].tolist()
    inputs = {"input_ids": torch.tensor([row.prompt_ids + clean]), **row.images}
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if not k.startswith("labels")}).logits
        one = model(**{k: v for k, v in alone.items() if not k.startswith("labels")}).logits[0]
        ar = model(**inputs, position_ids=ex["position_ids"][:, None, : P + R]).logits[0]
        session = Session(model)
        prefix = torch.tensor([row.prompt_ids + clean[: b * B - 1]])
        session.prefill({"input_ids": prefix, **row.images,
                         "mm_token_type_ids": (prefix == model.config.image_token_id).int()})
        window = session.forward([clean[b * B - 1]] + [mask_id] * B, draft=True)
    torch.testing.assert_close(logits[0, : P + R], ar, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(window[1:], logits[0, P + R + b * B: P + R + (b + 1) * B], atol=1e-5, rtol=1e-5)
    n = len(examples[1]["input_ids"])
    torch.testing.assert_close(logits[1, :n], one[:n], atol=1e-5, rtol=1e-5)
    l_ar, l_diff = joint_losses(model, batch)
    assert l_ar.isfinite() and l_diff.isfinite()
    assert int((batch["labels_diff"] != IGNORE).sum()) == sum(len(r.target_ids) + B for r in rows)


@pytest.mark.slow
def test_joint_trains_a_glmocr_checkpoint_on_rendered_crops(tmp_path):
    """`train_joint` from a GLM-OCR checkpoint on a built-in split (rendered crops): a joint GLM-OCR checkpoint with
    its processor, B from the recipe; the first N rows only; a negative N refused."""
    from helpers_models import build_vllm_glmocr

    from grpo.checkpoint import load_checkpoint
    from grpo.joint.train import load_config, train_joint
    from grpo.yaml_config import ConfigError

    init = build_vllm_glmocr(tmp_path / "init")
    cfg = load_config(None, model=str(init), output_dir=str(tmp_path / "out"), pool="tiny-probe", pool_rows=3,
                      bd_size=4, ar_steps=1, joint_steps=2, batch_size=2, warmup_steps=1, cpu_threads=1)
    out = train_joint(cfg, progress=False)
    ckpt = load_checkpoint(out, need_drafter=True)
    assert ckpt.is_vlm and ckpt.bd.bd_size == 4 and hasattr(ckpt.processor, "image_processor")
    assert ckpt.bd.mask_id == load_checkpoint(init, need_drafter=True).bd.mask_id
    with pytest.raises(ConfigError, match="pool_rows must be >= 0"):
        load_config(None, pool_rows=-1)
    with pytest.raises(ConfigError, match="targets must be 'pool' or 'greedy', got 'sampled'"):
        load_config(None, targets="sampled")


def test_greedy_targets_are_the_models_own_ar_outputs(glm):
    """`targets: greedy`: per row the AR greedy output without its stop token, None where it reaches the cap."""
    from grpo.decoding.kv_session import stop_token_ids
    from grpo.decoding.selfspec import ar_generate
    from grpo.joint.distill import greedy_targets
    from grpo.prompting import encode_prompt

    ckpt, processor, _, raw = glm
    stops = stop_token_ids(ckpt.model, processor.tokenizer)
    for cap in (3, 40):
        targets = greedy_targets(ckpt.model, processor, raw, True, max_tokens=cap)
        for target, row in zip(targets, raw):
            ar = ar_generate(ckpt.model, encode_prompt(processor, row, is_vlm=True), stops, cap + 1).tokens
            assert target == (ar[:-1] if ar[-1] in stops else None)
    assert any(t is None for t in greedy_targets(ckpt.model, processor, raw, True, max_tokens=1))


def test_a_training_row_without_an_image_is_refused_by_its_index(glm):
    from grpo.joint.images import encode_image_rows
    from grpo.pool import PoolError

    ckpt, processor, _, raw = glm
    rows = [raw[0], {"prompt": "Text Recognition:", "target": "north"}]
    with pytest.raises(PoolError, match=r"prompt pool crops.jsonl: row 1: pool row has no 'image' field"):
        encode_image_rows(rows, ckpt.model, processor, max_target_tokens=64, pool="crops.jsonl")
