"""The drafter loss during GRPO (docs/spec.md §7, "beyond the paper"): L_diff of docs/spec.md §6 on the step's own completions.

GRPO trains the verifier (the causal AR path); the block-diffusion drafter then moves only through the shared
weights. With `drafter_loss_weight` λ > 0 the trainer adds λ·L_diff to each micro-batch's loss, where L_diff
is the diffusion loss of joint training over the completions the policy has just written, so the drafter
learns to predict what the updated verifier now writes. The batch is built by `grpo.joint.streams` (the code
joint training uses: response = completion + B EOS, two complementary corrupted streams, one t per block):

- one extra forward per micro-batch over `[prompt | clean completion | corrupted 1 | corrupted 2]`. TRL's
  GRPO forward already runs prompt + clean completion, but it is called with `fused_lm_head=True` and keeps
  only log-probs; reusing its keys/values would need a grad-carrying KV cache out of TRL's forward (which
  gradient checkpointing turns off). The prompt + clean segment costs (P + R) of the (P + 3R) tokens.
- only the corrupted-stream targets are kept: joint training also labels the last prompt token with the first
  response token (a0), but a0 is the causal AR prediction, i.e. the verifier's, and that is GRPO's to train;
  the clean stream's AR labels are dropped for the same reason. The AR-path GRPO loss itself is untouched.
- truncated completions (no stop token) are left out: padding them with B EOS would teach the drafter to end
  outputs at the length cap.
- the scale: L_diff is the sum of the cross-entropies of a micro-batch divided by the global count of drafter
  targets of the whole generation batch (all micro-batches, all processes), rescaled to one accumulation
  window exactly as TRL normalizes its token-level loss (`target_count`, counted when the batch is generated).
  So λ weighs one target the same whatever the batch layout, and micro-batches without a kept completion
  add nothing without shrinking the others' weight.
- the clean stream's keys and values: the corrupted rows attend to them, so without
  `drafter_detach_clean` the drafter term's gradient also reaches the AR path's activations there (through
  the shared weights in any case); with it, the keys and values of the prompt and clean segment are detached
  for this forward (`detached_clean_kv`).
- `drafter/grad_norm` and `grpo/grad_norm`: the gradient norm of each term (λ·L_diff and the GRPO loss) of
  the micro-batch, from separate autograd passes (not under ZeRO-3, where parameters are sharded).
- which completions count (`drafter_completions`): `all` finished ones, those with a `positive` advantage,
  or the `best` finished one of each group (highest advantage). `best` is picked where the groups are still
  in order (before TRL shuffles the generation batch), so `select_completions` sees whole groups.
- which targets (`drafter_targets`): `sampled` (the completion's own tokens, as joint training) or `greedy`
  (the verifier's argmax at each place, read off the clean stream of the same forward): drafts are accepted
  when they equal the verifier's greedy tokens, while rollouts are sampled at temperature 1.0.

Example:
    >>> keep = select_completions(torch.tensor([0.5, -0.5, 1.0, -1.0]), torch.tensor([1, 1, 0, 1]).bool(),
    ...                           num_generations=2, mode="best")
    >>> keep.tolist()
    [True, False, False, True]
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch

from grpo.decoding.kv_session import prompt_positions, rope_model
from grpo.joint import streams

DRAFTER_COMPLETIONS = ("all", "positive", "best")
DRAFTER_TARGETS = ("sampled", "greedy")
KEEP_KEY = "drafter_keep"  # (N,) bool added to TRL's generation batch: completions the drafter trains on
COUNT_KEY = "drafter_targets"  # (N,) the generation batch's global count of drafter targets, on every row
KV_MODULES = ("k_proj", "v_proj")  # attention projections whose clean-segment outputs `detached_clean_kv` cuts


def finished_mask(completion_ids: torch.Tensor, stop_ids: list[int]) -> torch.Tensor:
    """(N,) bool: the completion holds a stop token (it ended; it was not cut at `max_completion_length`)."""
    return torch.isin(completion_ids, torch.tensor(stop_ids, device=completion_ids.device)).any(dim=1)


def select_completions(advantages: torch.Tensor, finished: torch.Tensor, num_generations: int,
                       mode: str) -> torch.Tensor:
    """(N,) bool over a group-ordered batch (N = groups x `num_generations`): which completions to train on.

    `all`: every finished one; `positive`: finished with advantage > 0; `best`: the finished one of highest
    advantage in each group (the first on ties; none if no completion of the group finished).
    """
    if mode == "all":
        return finished.clone()
    if mode == "positive":
        return finished & (advantages > 0)
    if mode == "best":
        scores = torch.where(finished, advantages.float(), torch.tensor(float("-inf"), device=advantages.device))
        groups = scores.view(-1, num_generations)  # (groups, G)
        keep = torch.zeros_like(groups, dtype=torch.bool)
        keep[torch.arange(groups.size(0), device=groups.device), groups.argmax(dim=1)] = True
        return (keep & torch.isfinite(groups)).view(-1)
    raise ValueError(f"drafter_completions must be one of {DRAFTER_COMPLETIONS}, got {mode!r}")


def target_count(completion_ids: torch.Tensor, keep: torch.Tensor, stop_ids: list[int], bd_size: int) -> int:
    """Drafter targets of the kept completions: the response is target + `bd_size` EOS (R tokens), and every
    response token but the first is a target in exactly one corrupted stream, so R - 1 each."""
    stops = torch.isin(completion_ids, torch.tensor(stop_ids, device=completion_ids.device))
    ends = stops.int().argmax(dim=1)  # first stop token
    return int((ends[keep] + bd_size - 1).sum())


def row_images(inputs: dict[str, Any], i: int) -> dict[str, torch.Tensor]:
    """Row `i`'s image inputs out of TRL's batch: its `num_images` grids and their patches, sliced as TRL's
    forward slices them (`image_grid_thw` rows of patches per image, images in row order)."""
    grids, counts = inputs["image_grid_thw"], inputs["num_images"]
    first, last = sum(counts[:i]), sum(counts[:i + 1])
    patches = grids.prod(dim=-1)
    start = int(patches[:first].sum())
    return {"pixel_values": inputs["pixel_values"][start: start + int(patches[first:last].sum())],
            "image_grid_thw": grids[first:last]}


def drafter_examples(inputs: dict[str, Any], keep: torch.Tensor, *, bd_size: int, mask_id: int,
                     stop_ids: list[int], gen: torch.Generator, rope: Any = None) -> list[dict[str, torch.Tensor]]:
    """`streams.build_example` for each kept completion, with only the corrupted-stream targets labelled.

    TRL's prompts are left-padded (`prompt_mask`); a completion's target is its tokens before the first stop
    token, and the response is that target + `bd_size` copies of `stop_ids[0]` (the tokenizer's EOS).
    `rope` (`grpo.decoding.kv_session.rope_model` of a GLM-OCR policy): each example carries its row's image
    inputs (`row_images`) and its prompt's M-RoPE positions, as joint training's image rows do.
    `greedy_src` (T,): `streams.verifier_sources`, where `drafter_targets: greedy` reads each target.
    """
    examples = []
    stops = torch.tensor(stop_ids)
    for i in torch.nonzero(keep.cpu()).flatten().tolist():
        in_prompt = inputs["prompt_mask"][i].bool()
        prompt_ids = inputs["prompt_ids"][i][in_prompt]
        prompt = prompt_ids.tolist()
        completion = inputs["completion_ids"][i].cpu()
        end = int(torch.isin(completion, stops).int().argmax())  # first stop token (kept rows have one)
        images, positions = {}, None
        if rope is not None:
            images = row_images(inputs, i)
            kinds = inputs["mm_token_type_ids"][i][: in_prompt.numel()][in_prompt]
            with torch.no_grad():
                positions = prompt_positions(rope, {"input_ids": prompt_ids[None], "mm_token_type_ids": kinds[None],
                                                    **images})[0][:, 0].cpu()
        ex = streams.build_example(prompt, completion[:end].tolist(), bd_size=bd_size, mask_id=mask_id,
                                   eos_id=stop_ids[0], gen=gen, prompt_positions=positions)
        ex.update(images)
        P, R = len(prompt), end + bd_size
        ex["labels_diff"][:P + R] = streams.IGNORE  # a0 (read at the last prompt token) is the verifier's: GRPO's
        ex["labels_ar"][:] = streams.IGNORE         # the AR path is trained by GRPO alone
        ex["greedy_src"] = streams.verifier_sources(ex, P, end, bd_size)
        ex["clean_end"] = P + R
        examples.append(ex)
    return examples


def causal_lm(model: Any) -> Any:
    """The causal LM under a PeftModel (LoRA layers stay in place, so the adapters get the gradient)."""
    from peft import PeftModel

    return model.get_base_model() if isinstance(model, PeftModel) else model


@contextmanager
def detached_clean_kv(model: Any, clean: torch.Tensor):
    """Within the block, the key/value projections (`KV_MODULES`) of `model` return detached values at the
    positions where `clean` (b, T) bool is True: attention there passes no gradient back to those rows."""
    keep = clean[..., None]

    def hook(module, args, output):
        return torch.where(keep, output.detach(), output)

    handles = [m.register_forward_hook(hook) for name, m in model.named_modules() if name.endswith(KV_MODULES)]
    if not handles:
        raise ValueError(f"no {' / '.join(KV_MODULES)} modules in {type(model).__name__}: cannot detach the "
                         "clean stream's keys and values")
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def clean_positions(examples: list[dict[str, torch.Tensor]], length: int) -> torch.Tensor:
    """(b, `length`) bool: the prompt and clean segment of each example (the positions before its first
    corrupted stream, `clean_end`), right-padded as `streams.collate` pads."""
    clean = torch.zeros(len(examples), length, dtype=torch.bool)
    for i, e in enumerate(examples):
        clean[i, :e["clean_end"]] = True
    return clean


def drafter_loss(model: Any, examples: list[dict[str, torch.Tensor]], pad_id: int,
                 targets: str = "sampled", detach_clean: bool = False) -> torch.Tensor | None:
    """L_diff: token-mean cross-entropy over the masked targets of both corrupted streams of `examples`.

    `targets`: `sampled` (the completion's own tokens, docs/spec.md §6 as in joint training) or `greedy` (what the
    verifier would write at each place: the acceptance test of self-speculative decoding is d_j = a_j).
    `detach_clean`: the corrupted streams read detached keys/values of the prompt and clean segment.
    """
    if targets not in DRAFTER_TARGETS:
        raise ValueError(f"drafter_targets must be one of {DRAFTER_TARGETS}, got {targets!r}")
    lm = causal_lm(model)
    emb = lm.get_input_embeddings().weight
    batch = streams.collate(examples, pad_id, dtype=emb.dtype)
    batch = {k: v.to(emb.device) for k, v in batch.items()}
    relabel = streams.greedy_relabel(batch, batch["greedy_src"]) if targets == "greedy" else None
    if not detach_clean:
        return streams.joint_losses(lm, batch, relabel=relabel)[1]
    with detached_clean_kv(lm, clean_positions(examples, batch["input_ids"].size(1)).to(emb.device)):
        return streams.joint_losses(lm, batch, relabel=relabel)[1]


# --- the trainer's side (called from GravityGRPOTrainer's hooks; `trainer` is a TRL GRPOTrainer) ---
def keep_for_batch(trainer: Any, output: dict) -> dict[str, torch.Tensor]:
    """Columns for TRL's generation batch: `KEEP_KEY` (N,) bool, this process's completions the drafter trains
    on (chosen while the groups are in order), and `COUNT_KEY` (N,), the global count of their targets."""
    finished = finished_mask(output["completion_ids"], trainer.eos_token_ids)
    advantages = output["advantages"]
    acc = trainer.accelerator
    # groups may span processes: select on the gathered batch (TRL's order) and keep this process's slice
    keep = select_completions(acc.gather(advantages), acc.gather(finished.int()).bool(),
                              trainer.num_generations, trainer.args.drafter_completions)
    start = acc.process_index * len(advantages)
    keep = keep[start: start + len(advantages)]
    local = target_count(output["completion_ids"], keep, trainer.eos_token_ids, trainer.block_diffusion.bd_size)
    total = acc.gather(torch.tensor([local], device=acc.device)).sum()
    return {KEEP_KEY: keep, COUNT_KEY: total.repeat(len(keep))}


def normalizer(count: int, processes: int, accumulation: int, steps_per_generation: int) -> float:
    """What a micro-batch's summed drafter loss is divided by: TRL's token-level normalizer (dapo) for a
    generation batch of `count` targets, so the optimizer step sees (sum over all its targets) / count."""
    return max(count, 1) / processes * accumulation / steps_per_generation


def grad_norm(loss: torch.Tensor, params: list[torch.Tensor]) -> float:
    """The L2 norm of d`loss`/d`params` (a separate autograd pass; the graph is kept for the real backward)."""
    if not loss.requires_grad:
        return 0.0
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads if g is not None)))


def trainer_loss(trainer: Any, model: Any, inputs: dict) -> torch.Tensor:
    """L_diff on a micro-batch's kept completions, summed and divided by `normalizer` (logged as
    `drafter/loss`, the token mean of the micro-batch, and `drafter/completions`)."""
    acc = trainer.accelerator
    keep = inputs[KEEP_KEY]
    used = int(keep.sum())
    if not used:  # still one forward (weight 0): under ZeRO-3 every rank must run the same layers
        keep = torch.zeros_like(keep)
        keep[0] = True
    # one corruption draw per micro-step: reproducible from the seed, distinct per process
    gen = torch.Generator().manual_seed((trainer.args.seed * 1_000_003 + trainer._step) * 1009 + acc.process_index)
    bd = trainer.block_diffusion
    policy = acc.unwrap_model(model)
    examples = drafter_examples(inputs, keep, bd_size=bd.bd_size, mask_id=bd.mask_id,
                                stop_ids=trainer.eos_token_ids, gen=gen, rope=rope_model(policy))
    with acc.autocast():
        l_diff = drafter_loss(policy, examples, trainer._tokenizer.pad_token_id,
                              trainer.args.drafter_targets, detach_clean=trainer.args.drafter_detach_clean)
    if l_diff is None:  # no masked target at all (bd_size 1 and an empty response)
        l_diff, used = next(p for p in model.parameters() if p.requires_grad).sum() * 0.0, 0
    value = l_diff.detach() if used else torch.tensor(float("nan"), device=acc.device)
    metrics = trainer._metrics["train"]
    metrics["drafter/loss"].append(acc.gather(value.reshape(1)).nanmean().item())
    metrics["drafter/completions"].append(acc.gather(torch.tensor([used], device=acc.device)).sum().item())
    n_local = sum(int((e["labels_diff"] != streams.IGNORE).sum()) for e in examples) if used else 0
    scale = normalizer(int(inputs[COUNT_KEY][0]), acc.num_processes, trainer.current_gradient_accumulation_steps,
                       trainer.args.steps_per_generation)
    return l_diff * (n_local / scale)


def log_grad_norms(trainer: Any, model: Any, grpo_loss: torch.Tensor, drafter_term: torch.Tensor) -> None:
    """`grpo/grad_norm` and `drafter/grad_norm` (of λ·L_diff) of this micro-batch; skipped under ZeRO-3."""
    from trl.distributed import DistributedBackend

    if DistributedBackend(trainer.accelerator).is_zero3:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    metrics = trainer._metrics["train"]
    metrics["grpo/grad_norm"].append(grad_norm(grpo_loss, params))
    metrics["drafter/grad_norm"].append(grad_norm(drafter_term, params))
