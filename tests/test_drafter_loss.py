"""The drafter loss during GRPO (`drafter_loss_weight`): the step's gradient is the GRPO gradient plus λ times
the drafter's; its scale does not depend on how the batch is split over micro-batches or processes; it logs
`drafter/loss` and each term's gradient norm, trains LoRA adapters, can detach the clean stream's keys and
values, and self-speculative output still equals AR greedy; its batches are joint training's
(`grpo.joint.streams`): the hand-checked layout and labels of docs/spec.md §6."""
from __future__ import annotations

import json
from unittest import mock

import pytest
import torch

from grpo.joint import streams
from grpo.training import drafter_loss as dl

# plain SGD without clipping: a step moves the weights by -lr x the gradient, so gradients can be read off them
STEP = dict(use_vllm=False, tpf_every=0, max_steps=1, per_device_train_batch_size=8, num_generations=4,
            max_completion_length=128, learning_rate=1e-3, save_strategy="no", logging_steps=1,
            optim="sgd", max_grad_norm=0.0)
PROBE_PROMPTS = 4


# --- selection and batches: no model ---
def test_selection_modes_and_truncation():
    adv = torch.tensor([0.5, -0.5, 1.0, -1.0, 0.0, 0.0])
    finished = torch.tensor([1, 1, 0, 1, 1, 1]).bool()       # completion 2 was cut at the length cap
    assert dl.select_completions(adv, finished, 2, "all").tolist() == [True, True, False, True, True, True]
    assert dl.select_completions(adv, finished, 2, "positive").tolist() == [True, False, False, False, False, False]
    # best: group 1's best (1.0) is truncated, so its best finished one; ties go to the first
    assert dl.select_completions(adv, finished, 2, "best").tolist() == [True, False, False, True, True, False]
    none = torch.zeros(2, dtype=torch.bool)
    assert dl.select_completions(torch.tensor([1.0, 0.0]), none, 2, "best").tolist() == [False, False]
    with pytest.raises(ValueError, match="all"):
        dl.select_completions(adv, finished, 2, "worst")
    ids = torch.tensor([[5, 6, 0, 0], [5, 6, 7, 8], [9, 3, 0, 0]])
    assert dl.finished_mask(ids, [3]).tolist() == [False, False, True]


def test_batch_is_joint_trainings_layout_with_only_corrupted_targets():
    """P=2, completion (a, b) then EOS; B=2: response (a, b, E, E), R=4, streams at 6..9 and 10..13."""
    B, MASK, EOS, PAD = 2, 99, 1, 0  # the prompt keeps its 2 unpadded tokens
    a, b = 11, 12
    inputs = {"prompt_ids": torch.tensor([[PAD, 7, 8]]), "prompt_mask": torch.tensor([[0, 1, 1]]),
              "completion_ids": torch.tensor([[a, b, EOS, PAD, PAD]])}
    with mock.patch.object(streams, "build_example", wraps=streams.build_example) as built:
        (ex,) = dl.drafter_examples(inputs, torch.tensor([True]), bd_size=B, mask_id=MASK, stop_ids=[EOS],
                                    gen=torch.Generator().manual_seed(3))
    assert built.call_count == 1
    assert built.call_args.args == ([7, 8], [a, b])
    masked1 = streams.complementary_masks(4, B, torch.Generator().manual_seed(3))  # the same draw
    resp = torch.tensor([a, b, EOS, EOS])
    s1, s2 = torch.where(masked1, MASK, resp), torch.where(~masked1, MASK, resp)
    assert ex["input_ids"].tolist() == [7, 8, a, b, EOS, EOS, *s1.tolist(), *s2.tolist()]
    assert ex["position_ids"].tolist() == [0, 1] + [2, 3, 4, 5] * 3

    allow = ex["allow"].int().tolist()
    #                  prompt  clean     stream 1    stream 2
    assert allow[6] == [1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0]   # s1 block 0: prompt + own block
    assert allow[8] == [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0]   # s1 block 1: + clean block 0, not clean 1
    assert allow[13] == [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1]  # s2 block 1: never the other stream
    assert allow[4] == [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]   # clean: causal

    # labels: none on the prompt or clean stream (the AR path is GRPO's, a0 included); in each stream the
    # position before every token that stream masks (k >= 1) predicts it; the last position predicts nothing
    assert (ex["labels_ar"] == streams.IGNORE).all()
    expected = torch.full((14,), streams.IGNORE)
    for offset, masked in ((6, masked1), (10, ~masked1)):
        for k in range(1, 4):
            if masked[k]:
                expected[offset + k - 1] = resp[k]
    assert ex["labels_diff"].tolist() == expected.tolist()
    assert (ex["labels_diff"][:6] == streams.IGNORE).all()
    # every response token but the first is a target in exactly one stream
    assert sorted(ex["labels_diff"][ex["labels_diff"] != streams.IGNORE].tolist()) == sorted([b, EOS, EOS])
    # greedy targets: the target b (k=1) and the first EOS (k=2) are read off clean positions 2 and 3 (whose
    # causal logits predict them); the padding EOS (k=3) keeps its label
    src = torch.full((14,), -1)
    for offset, masked in ((6, masked1), (10, ~masked1)):
        for k in (1, 2):
            if masked[k]:
                src[offset + k - 1] = 2 + k - 1
    assert ex["greedy_src"].tolist() == src.tolist()


def test_greedy_relabel_reads_the_clean_streams_argmax():
    V = 6
    head = torch.nn.Linear(V, V, bias=False)
    torch.nn.init.eye_(head.weight)
    hidden = torch.zeros(1, 5, V, requires_grad=True)
    with torch.no_grad():
        hidden[0, 1, 4] = 1.0  # the verifier's argmax at position 1 is token 4
    labels = torch.tensor([[streams.IGNORE, streams.IGNORE, streams.IGNORE, 3, 1]])
    src = torch.tensor([[-1, -1, -1, 1, -1]])  # position 3 predicts what position 1's logits predict
    out = streams.greedy_relabel({"labels_diff": labels}, src)(hidden, head)
    assert out.tolist() == [[streams.IGNORE, streams.IGNORE, streams.IGNORE, 4, 1]]
    assert labels[0, 3] == 3  # the batch's own labels are not overwritten


# --- one GRPO step on the committed tiny default (HF generation) ---
def _step(tmp_path, name, plain=False, **overrides):
    """One optimizer step; (trainer, its log entry). `plain`: TRL's own compute_loss (no hook of ours)."""
    from trl import GRPOTrainer

    from grpo.training.config import load_config
    from grpo.training.run import run_training
    from grpo.training.trainer import GravityGRPOTrainer

    config = load_config("configs/tiny_cpu.yaml", {**STEP, "output_dir": str(tmp_path / name), **overrides})
    patch = mock.patch.object(GravityGRPOTrainer, "compute_loss", GRPOTrainer.compute_loss) if plain else None
    if patch:
        patch.start()
    try:
        summary = run_training(config)
    finally:
        if patch:
            patch.stop()
    trainer = summary["trainer"]
    entry = next(e for e in trainer.state.log_history if "loss" in e)
    return trainer, entry, summary


def _weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafter")
    plain = _step(root, "plain", plain=True)
    on = _step(root, "on", drafter_loss_weight=1.0, drafter_targets="greedy")
    double = _step(root, "double", drafter_loss_weight=2.0, drafter_targets="greedy")
    return plain, on, double


@pytest.fixture(scope="module")
def start():
    """The committed tiny default's parameters, before any step."""
    from grpo.checkpoint import load_checkpoint

    return {k: p.detach().clone() for k, p in load_checkpoint("tiny").model.named_parameters()}


def _delta(trainer, start):
    """The step's change of every parameter (named_parameters: a tied embedding counts once)."""
    return torch.cat([(p.detach().float() - start[k].float()).flatten() for k, p in trainer.model.named_parameters()])


@pytest.mark.slow
def test_step_gradient_is_grpo_plus_lambda_times_drafter(steps, start):
    """One step on the same batch (same seed, same completions): the weight change at λ is the GRPO change
    plus λ times the drafter's, the drafter part is not zero, and the logged norms are those gradients'."""
    (plain, plain_log, _), (on, on_log, _), (double, double_log, _) = steps
    assert plain_log["reward"] == on_log["reward"] == double_log["reward"]
    grpo, with_one, with_two = (_delta(t, start) for t in (plain, on, double))
    drafter = with_one - grpo
    assert drafter.norm() > 0.1 * grpo.norm()
    assert (with_two - grpo - 2 * drafter).norm() < 1e-2 * drafter.norm()
    lr = STEP["learning_rate"]
    assert on_log["drafter/grad_norm"] == pytest.approx(float(drafter.norm()) / lr, rel=1e-2)
    assert double_log["drafter/grad_norm"] == pytest.approx(2 * on_log["drafter/grad_norm"], rel=1e-3)
    assert on_log["grpo/grad_norm"] == pytest.approx(float(grpo.norm()) / lr, rel=1e-2)


@pytest.mark.slow
def test_without_grad_norms_the_step_is_the_same(steps, start, tmp_path):
    """`drafter_grad_norms: false` skips the two norm passes only: the same weight change, no norms logged."""
    _, (on, on_log, _), _ = steps
    quiet, quiet_log, _ = _step(tmp_path, "quiet", drafter_loss_weight=1.0, drafter_targets="greedy",
                                drafter_grad_norms=False)
    change = _delta(on, start)
    assert (_delta(quiet, start) - change).norm() < 1e-5 * change.norm()
    assert quiet_log["drafter/completions"] == on_log["drafter/completions"] > 0
    assert "drafter/grad_norm" not in quiet_log and "grpo/grad_norm" not in quiet_log
    assert on_log["drafter/grad_norm"] > 0


@pytest.mark.slow
def test_weight_on_logs_and_times_the_drafter(steps):
    (_, plain_log, plain_summary), (on, on_log, summary), _ = steps
    assert on_log["drafter/completions"] > 0
    # the trained loss is GRPO's (same completions, same weights: the run without it) plus weight 1 x the
    # drafter loss; the Trainer logs the loss rounded to 4 decimals
    assert on_log["drafter/loss"] > 0
    assert on_log["loss"] == pytest.approx(plain_log["loss"] + on_log["drafter/loss"], abs=2e-4)
    split = summary["wall_time"]
    phases = ("generation", "reward", "logprobs", "backward", "drafter", "tpf_probe", "other")
    assert split["drafter"] > 0 and all(split[p] >= 0 for p in phases), split
    assert plain_summary["wall_time"]["drafter"] == 0  # only the drafter loss is timed as drafter
    assert json.loads((summary["output_dir"] / "wall_time.json").read_text())["drafter"] == split["drafter"]


@pytest.mark.slow
def test_selfspec_still_equals_ar_greedy_after_a_drafter_step(steps):
    from grpo.pool import load_pool
    from grpo.checkpoint import tokenizer_of
    from grpo.decoding.kv_session import stop_token_ids
    from grpo.decoding.selfspec import SelfSpecDecoder, ar_generate
    from grpo.prompting import encode_prompt

    _, (on, _, _), _ = steps
    model = on.model.eval()
    tok = tokenizer_of(on.processing_class)
    bd = on.block_diffusion
    stops = stop_token_ids(model, tok)
    decoder = SelfSpecDecoder(model, bd.mask_id, bd.bd_size, stops, max_new_tokens=128)
    rows = load_pool("tiny-probe").select(range(PROBE_PROMPTS))
    for row in rows:
        inputs = encode_prompt(tok, row, is_vlm=False)
        assert decoder.generate(inputs).tokens == ar_generate(model, inputs, stops, 128).tokens


@pytest.mark.slow
def test_lora_adapters_get_the_drafter_gradient(tmp_path):
    """Same seed with and without the drafter loss: the adapters differ, the base weights stay frozen."""
    kw = dict(use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, learning_rate=1e-2)
    off, _, _ = _step(tmp_path, "lora_off", drafter_loss_weight=0.0, **kw)
    on, log, _ = _step(tmp_path, "lora_on", drafter_loss_weight=1.0, **kw)
    w_off, w_on = _weights(off), _weights(on)
    lora = [k for k in w_on if "lora_" in k]
    assert lora and any(not torch.equal(w_off[k], w_on[k]) for k in lora)
    assert all(torch.equal(w_off[k], w_on[k]) for k in w_on if "lora_" not in k)  # base weights frozen
    assert log["drafter/completions"] > 0


def test_greedy_targets_of_a_greedy_completion_are_its_own_tokens():
    """On the tiny default: for the verifier's own greedy output, the greedy targets read off the clean stream
    are exactly the sampled targets (the alignment of `greedy_src`), and so are the two losses."""
    from grpo.pool import load_pool
    from grpo.checkpoint import load_checkpoint, tokenizer_of
    from grpo.decoding.kv_session import stop_token_ids
    from grpo.decoding.selfspec import ar_generate
    from grpo.prompting import encode_prompt

    ckpt = load_checkpoint("tiny", need_drafter=True)
    tok, model = tokenizer_of(ckpt.processor), ckpt.model.eval()
    stops = list(stop_token_ids(model, tok))
    for row in load_pool("tiny-probe").select(range(3)):
        x = encode_prompt(tok, row, is_vlm=False)
        out = ar_generate(model, x, stops, 192).tokens
        inputs = {"prompt_ids": x["input_ids"], "prompt_mask": torch.ones_like(x["input_ids"]),
                  "completion_ids": torch.tensor([out])}
        examples = dl.drafter_examples(inputs, torch.tensor([True]), bd_size=ckpt.bd.bd_size,
                                       mask_id=ckpt.bd.mask_id, stop_ids=[tok.eos_token_id],
                                       gen=torch.Generator().manual_seed(0))
        batch = streams.collate(examples, tok.pad_token_id)
        relabel = streams.greedy_relabel(batch, examples[0]["greedy_src"][None])
        with torch.no_grad():
            hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                      position_ids=batch["position_ids"]).last_hidden_state
            assert torch.equal(relabel(hidden, model.get_output_embeddings()), batch["labels_diff"])
            sampled = dl.drafter_loss(model, examples, tok.pad_token_id, "sampled")
            greedy = dl.drafter_loss(model, examples, tok.pad_token_id, "greedy")
        assert sampled.item() == pytest.approx(greedy.item())


# --- the scale and the detach, on the tiny default's own greedy outputs ---
@pytest.fixture(scope="module")
def greedy_examples():
    """The tiny default and drafter examples of its greedy outputs on 4 probe prompts (one draw)."""
    from grpo.pool import load_pool
    from grpo.checkpoint import load_checkpoint, tokenizer_of
    from grpo.decoding.kv_session import stop_token_ids
    from grpo.decoding.selfspec import ar_generate
    from grpo.prompting import encode_prompt

    ckpt = load_checkpoint("tiny", need_drafter=True)
    tok, model = tokenizer_of(ckpt.processor), ckpt.model.train()
    stops = list(stop_token_ids(model, tok))
    examples, gen = [], torch.Generator().manual_seed(0)
    for row in load_pool("tiny-probe").select(range(4)):
        x = encode_prompt(tok, row, is_vlm=False)
        with torch.no_grad():
            out = ar_generate(model, x, stops, 192).tokens
        inputs = {"prompt_ids": x["input_ids"], "prompt_mask": torch.ones_like(x["input_ids"]),
                  "completion_ids": torch.tensor([out])}
        examples += dl.drafter_examples(inputs, torch.tensor([True]), bd_size=ckpt.bd.bd_size,
                                        mask_id=ckpt.bd.mask_id, stop_ids=stops, gen=gen)
        count = dl.target_count(inputs["completion_ids"], torch.tensor([True]), stops, ckpt.bd.bd_size)
        assert count == int((examples[-1]["labels_diff"] != streams.IGNORE).sum())
    return model, examples, tok.pad_token_id


def _grad(model, losses):
    model.zero_grad()
    sum(losses).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone()


def _scaled(model, examples, pad, count, processes, accumulation, steps_per_generation):
    n = sum(int((e["labels_diff"] != streams.IGNORE).sum()) for e in examples)
    return dl.drafter_loss(model, examples, pad) * n / dl.normalizer(count, processes, accumulation,
                                                                       steps_per_generation)


def test_drafter_gradient_does_not_depend_on_the_batch_layout(greedy_examples):
    """The whole batch at once, 2 or 4 accumulated micro-batches (one holding no kept completion adds
    nothing), and 2 processes (gradients averaged, as DDP does) give one drafter gradient."""
    model, examples, pad = greedy_examples
    count = sum(int((e["labels_diff"] != streams.IGNORE).sum()) for e in examples)
    whole = _grad(model, [_scaled(model, examples, pad, count, 1, 1, 1)])
    halves = _grad(model, [_scaled(model, examples[i:i + 2], pad, count, 1, 2, 2) for i in (0, 2)])
    uneven = _grad(model, [_scaled(model, part, pad, count, 1, 3, 3) for part in (examples[:1], examples[1:])])
    processes = _grad(model, [_scaled(model, examples[i:i + 2], pad, count, 2, 1, 1) / 2 for i in (0, 2)])
    for other in (halves, uneven, processes):
        assert torch.allclose(other, whole, rtol=1e-4, atol=1e-7)
    unscaled = _grad(model, [dl.drafter_loss(model, part, pad) / 2 for part in (examples[:1], examples[1:])])
    assert not torch.allclose(unscaled, whole, rtol=1e-2)  # the old per-micro-batch mean is layout-dependent


def test_detach_clean_keeps_the_loss_and_cuts_the_clean_streams_gradient(greedy_examples):
    model, examples, pad = greedy_examples
    captured = {}

    def keep_grad(module, args, output):
        output.retain_grad()
        captured["embeddings"] = output

    handle = model.get_input_embeddings().register_forward_hook(keep_grad)
    try:
        grads, values = {}, {}
        for detach in (False, True):
            model.zero_grad()
            loss = dl.drafter_loss(model, examples[:2], pad, "greedy", detach_clean=detach)
            loss.backward()
            values[detach] = loss.item()
            grads[detach] = captured["embeddings"].grad.abs().sum(-1)  # (b, T)
    finally:
        handle.remove()
    clean = dl.clean_positions(examples[:2], grads[True].size(1))
    assert values[True] == pytest.approx(values[False], rel=1e-6)
    assert grads[False][clean].sum() > 0 and grads[True][clean].sum() == 0
    assert grads[True][~clean].sum() > 0
    with pytest.raises(ValueError, match="k_proj"):
        with dl.detached_clean_kv(torch.nn.Linear(2, 2), clean):
            pass


# --- a GLM-OCR policy: the drafter reads the crop of its row ---
def _trl_batch(processor, rows, eos_id, pad_id):
    """The batch TRL hands `compute_loss` for these rows (left-padded prompts, one crop each) with each row's
    true transcription + EOS as its completion."""
    from grpo.prompting import encode_prompt

    prompts = [encode_prompt(processor, row, is_vlm=True) for row in rows]
    targets = [processor.tokenizer(row["target"], add_special_tokens=False).input_ids for row in rows]
    P, C = max(p["input_ids"].size(1) for p in prompts), max(map(len, targets)) + 1

    def left(t):
        return torch.cat([t.new_full((P - t.size(1),), pad_id if t.dtype == torch.long else 0), t[0]])

    return {"prompt_ids": torch.stack([left(p["input_ids"]) for p in prompts]),
            "prompt_mask": torch.stack([left(torch.ones_like(p["input_ids"])).bool().long() for p in prompts]),
            "mm_token_type_ids": torch.stack([torch.cat([left(p["mm_token_type_ids"]), torch.zeros(C).long()])
                                              for p in prompts]),
            "completion_ids": torch.tensor([t + [eos_id] + [pad_id] * (C - 1 - len(t)) for t in targets]),
            "pixel_values": torch.cat([p["pixel_values"] for p in prompts]),
            "image_grid_thw": torch.cat([p["image_grid_thw"] for p in prompts]), "num_images": [1] * len(rows)}


def test_glm_ocr_drafter_batch_is_joint_trainings_image_rows_and_reads_the_crop():
    """Two crops of different sizes: each example is the image row joint training builds for its crop (tokens,
    M-RoPE positions, patches), and the committed reader's drafter loss is lower on its crops than on blank ones."""
    from pathlib import Path

    from grpo.checkpoint import load_checkpoint
    from grpo.decoding.kv_session import rope_model
    from grpo.joint.images import encode_image_rows
    from grpo.pool import load_pool
    from grpo.synthetic.reading import blanked

    pytest.importorskip("torchvision", reason="GLM-OCR's processor needs torchvision: run `make setup`")
    torch.set_num_threads(1)
    tiny_vlm = Path(__file__).parents[1] / "data" / "tiny" / "vlm"
    ckpt = load_checkpoint(tiny_vlm / "model", need_drafter=True)
    model, processor, B = ckpt.model, ckpt.processor, ckpt.bd.bd_size
    pool = load_pool(str(tiny_vlm / "pool"))
    picked = [i for i, row in enumerate(pool) if row["task_type"] == "text"][:1] + \
             [i for i, row in enumerate(pool) if row["task_type"] == "formula"][:1]
    pool = pool.select(picked)
    eos, pad = model.generation_config.eos_token_id, processor.tokenizer.pad_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    inputs = _trl_batch(processor, list(pool), eos, pad)
    assert inputs["image_grid_thw"][0].tolist() != inputs["image_grid_thw"][1].tolist()
    keep = torch.tensor([True, True])

    def examples(batch):
        return dl.drafter_examples(batch, keep, bd_size=B, mask_id=ckpt.bd.mask_id, stop_ids=[eos],
                                   gen=torch.Generator().manual_seed(7), rope=rope_model(model))

    real = examples(inputs)
    gen = torch.Generator().manual_seed(7)
    for ex, row in zip(real, encode_image_rows(list(pool), model, processor, max_target_tokens=512)):
        want = streams.build_example(row.prompt_ids, row.target_ids, bd_size=B, mask_id=ckpt.bd.mask_id,
                                     eos_id=eos, gen=gen, prompt_positions=row.positions)
        assert ex["input_ids"].tolist() == want["input_ids"].tolist()
        assert torch.equal(ex["position_ids"], want["position_ids"])
        assert torch.equal(ex["pixel_values"], row.images["pixel_values"])
        assert torch.equal(ex["image_grid_thw"], row.images["image_grid_thw"])
    blank = examples(_trl_batch(processor, list(blanked(pool)), eos, pad))
    with torch.no_grad():
        l_real, l_blank = (float(dl.drafter_loss(model, e, pad)) for e in (real, blank))
    assert l_real < 0.5 * l_blank, (l_real, l_blank)
