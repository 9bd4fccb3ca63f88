"""The three response streams of joint AR / block-diffusion training (docs/spec.md §6): layout, labels, losses.

One forward per example over `[prompt | clean response | corrupted stream 1 | corrupted stream 2]`:
- the response is the target followed by exactly B EOS tokens (B = `bd_size`);
- the clean stream is causal and gives the AR next-token loss (targets: the response up to its first EOS);
- for every block of B response tokens a noise level t ~ U(0,1) is drawn, stream 1 masks each token with
  probability t and stream 2 masks exactly the other tokens of the block; with `full_share` p, a block is
  drawn at t = 1 with probability p instead (stream 1 masks it whole: the draft window at inference);
- a corrupted token of block b sees the prompt, the clean blocks before b and its own stream's block b
  (bidirectionally), never the clean block b or later, never the other stream;
- every stream is shifted: the logits at response index k-1 predict token k, so the last position of block b
  predicts the first token of block b+1 (the draft's last token d_B at inference) and token 0 is read from the
  last prompt token; the diffusion loss counts a token in the one stream where it is masked (all B EOS included).
Loss = (L_diff + w * L_AR) / (1 + w).

Joint training (`grpo.joint.train`) and the drafter loss during GRPO both build their batches here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from grpo.prompting import IMAGE_INPUTS

IGNORE = -100


def _response(target_ids: list[int], eos_id: int, bd_size: int) -> list[int]:
    return list(target_ids) + [eos_id] * bd_size


def complementary_masks(n: int, bd_size: int, gen: torch.Generator, full_share: float = 0.0) -> torch.Tensor:
    """(n,) bool: stream 1's mask; stream 2 masks the complement. One t ~ U(0,1) per block of `bd_size`, or
    t = 1 (the whole block) with probability `full_share`."""
    n_blocks = -(-n // bd_size)
    t = torch.rand(n_blocks, generator=gen)
    if full_share:
        t = torch.where(torch.rand(n_blocks, generator=gen) < full_share, 1.0, t)
    return torch.rand(n, generator=gen) < t.repeat_interleave(bd_size)[:n]


def joint_layout(prompt_len: int, resp_len: int, bd_size: int) -> torch.Tensor:
    """(T, T) bool "row may attend to column" for `[prompt | clean | corrupted 1 | corrupted 2]`, T = P + 3R."""
    P, R = prompt_len, resp_len
    T = P + 3 * R
    allow = torch.zeros(T, T, dtype=torch.bool)
    allow[: P + R, : P + R] = torch.tril(torch.ones(P + R, P + R, dtype=torch.bool))  # prompt + clean: causal
    for offset in (P + R, P + 2 * R):
        for start in range(0, R, bd_size):
            end = min(start + bd_size, R)
            rows = slice(offset + start, offset + end)
            allow[rows, :P] = True                           # the prompt
            allow[rows, P: P + start] = True                 # earlier clean blocks
            allow[rows, offset + start: offset + end] = True  # own block, bidirectional
    return allow


def _positions(prompt_positions: torch.Tensor | None, P: int, R: int, copies: int) -> torch.Tensor:
    """The prompt's positions, then `copies` times the response's: 1-D (P + copies R,) for a text prompt; for an
    image prompt its 3-D M-RoPE positions (3, P), and the response on all three axes after the largest of them."""
    if prompt_positions is None:
        return torch.cat([torch.arange(P), *[torch.arange(P, P + R)] * copies])
    start = int(prompt_positions.max()) + 1
    response = torch.arange(start, start + R).expand(3, R)
    return torch.cat([prompt_positions, *[response] * copies], dim=1)


def build_example(prompt_ids: list[int], target_ids: list[int], *, bd_size: int, mask_id: int, eos_id: int,
                  gen: torch.Generator, ar_only: bool = False, full_share: float = 0.0,
                  prompt_positions: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One example's tokens, positions, (T, T) allow-matrix and AR / diffusion labels (IGNORE elsewhere).

    AR-only: `[prompt | target EOS]` under causal attention. Joint: the four-segment layout of `joint_layout`,
    its blocks masked by `complementary_masks(..., full_share)`.
    `prompt_positions` (3, P): an image prompt's M-RoPE positions (`grpo.joint.images`); positions are then 3-D.
    """
    P = len(prompt_ids)
    if P == 0:
        raise ValueError("empty prompt: the first response token is predicted from the last prompt token")
    if prompt_positions is not None and prompt_positions.shape != (3, P):
        raise ValueError(f"prompt_positions must have shape (3, {P}), got {tuple(prompt_positions.shape)}")
    response = _response(target_ids, eos_id, 1 if ar_only else bd_size)
    R, N = len(response), len(target_ids)
    resp = torch.tensor(response)
    ar_labels = torch.full((P + R,), IGNORE)
    ar_labels[P - 1: P + N] = resp[: N + 1]  # logits at P-1+k predict response[k]; only the first EOS counts
    if ar_only:
        ids = torch.cat([torch.tensor(prompt_ids), resp])
        return {"input_ids": ids, "position_ids": _positions(prompt_positions, P, R, 1), "labels_ar": ar_labels,
                "labels_diff": torch.full((P + R,), IGNORE),
                "allow": torch.tril(torch.ones(P + R, P + R, dtype=torch.bool))}
    masked1 = complementary_masks(R, bd_size, gen, full_share)
    streams, diff_labels = [], torch.full((P + 3 * R,), IGNORE)
    for s, masked in enumerate((masked1, ~masked1)):
        streams.append(torch.where(masked, mask_id, resp))
        offset = P + (s + 1) * R
        # stream position k-1 predicts response[k] where this stream masks it (k >= 1)
        k = torch.nonzero(masked[1:]).flatten() + 1
        diff_labels[offset + k - 1] = resp[k]
        if masked[0]:  # token 0 is read from the last prompt token, as a0 is read from x0 at inference
            diff_labels[P - 1] = resp[0]
    ids = torch.cat([torch.tensor(prompt_ids), resp, *streams])
    return {"input_ids": ids, "position_ids": _positions(prompt_positions, P, R, 3),
            "labels_ar": torch.cat([ar_labels, torch.full((2 * R,), IGNORE)]), "labels_diff": diff_labels,
            "allow": joint_layout(P, R, bd_size)}


def verifier_sources(example: dict[str, torch.Tensor], prompt_len: int, target_len: int,
                     bd_size: int) -> torch.Tensor:
    """(T,) for each corrupted-stream position labelled with response token k in 1..N (the target and its first
    EOS; N = `target_len`), the clean-stream position P+k-1 whose causal logits predict the same token; -1
    elsewhere (token 0, read at the last prompt token, and the EOS padding after the first EOS keep their labels)."""
    P, R, N = prompt_len, target_len + bd_size, target_len
    src = torch.full_like(example["labels_diff"], -1)
    for offset in (P + R, P + 2 * R):
        src[offset: offset + N] = torch.arange(P, P + N)  # position offset+k-1 predicts token k (1..N)
    return torch.where(example["labels_diff"] != IGNORE, src, -1)


def greedy_relabel(batch: dict[str, torch.Tensor], src: torch.Tensor):
    """`joint_losses`' relabel: the target of a masked token is the verifier's greedy token at its place (the
    argmax of the clean stream's causal logits at `src` (b, T), detached), not the response's own token."""
    def relabel(hidden: torch.Tensor, head) -> torch.Tensor:
        labels = batch["labels_diff"].clone()
        rows, cols = torch.nonzero(src >= 0, as_tuple=True)
        with torch.no_grad():
            labels[rows, cols] = head(hidden[rows, src[rows, cols]].detach()).argmax(-1)
        return labels
    return relabel


def collate(examples: list[dict[str, torch.Tensor]], pad_id: int, dtype: torch.dtype = torch.float32) -> dict:
    """Right-pad to one length; the (b, 1, T, T) float additive mask (0 allowed, dtype-min blocked).

    Image examples (3-D positions and `IMAGE_INPUTS`) give (3, b, T) positions and their images concatenated
    in batch order, as GLM-OCR's forward takes them."""
    T = max(len(e["input_ids"]) for e in examples)
    b = len(examples)
    axes = examples[0]["position_ids"].shape[:-1]  # () text, (3,) M-RoPE
    batch = {"input_ids": torch.full((b, T), pad_id), "position_ids": torch.zeros(*axes, b, T, dtype=torch.long),
             "labels_ar": torch.full((b, T), IGNORE), "labels_diff": torch.full((b, T), IGNORE)}
    allow = torch.eye(T, dtype=torch.bool).repeat(b, 1, 1)  # padding rows see themselves (no NaN rows)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        for key in ("input_ids", "labels_ar", "labels_diff"):
            batch[key][i, :n] = e[key]
        batch["position_ids"][..., i, :n] = e["position_ids"]
        allow[i, :n, :n] = e["allow"]
    for key in IMAGE_INPUTS:
        if key in examples[0]:
            batch[key] = torch.cat([e[key] for e in examples])
    if "greedy_src" in examples[0]:  # `verifier_sources`, right-padded with -1
        batch["greedy_src"] = torch.full((b, T), -1)
        for i, e in enumerate(examples):
            batch["greedy_src"][i, :len(e["greedy_src"])] = e["greedy_src"]
    mask = torch.zeros(b, 1, T, T, dtype=dtype)
    mask.masked_fill_(~allow[:, None], torch.finfo(dtype).min)
    batch["attention_mask"] = mask
    return batch


def joint_losses(model, batch: dict, relabel=None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(L_AR, L_diff): token-mean cross-entropies over the labelled positions (None when a kind has none).

    `relabel(hidden, head) -> labels_diff`, if given, replaces the diffusion targets after the forward (the
    drafter loss during GRPO reads greedy targets off the clean stream's logits; `grpo.training.drafter_loss`).
    """
    images = {key: batch[key] for key in IMAGE_INPUTS if key in batch}
    hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              position_ids=batch["position_ids"], **images).last_hidden_state  # (b, T, d)
    head = model.get_output_embeddings()
    if relabel is not None:
        batch = {**batch, "labels_diff": relabel(hidden, head)}
    losses = []
    for key in ("labels_ar", "labels_diff"):
        labels = batch[key]
        sel = labels != IGNORE
        if not sel.any():
            losses.append(None)
            continue
        logits = head(hidden[sel]).float()  # (n_labelled, V): the head only where a loss is taken
        losses.append(F.cross_entropy(logits, labels[sel]))
    return losses[0], losses[1]


def combine(l_ar: torch.Tensor | None, l_diff: torch.Tensor | None, w: float) -> torch.Tensor:
    """(L_diff + w L_AR) / (1 + w); a stage without diffusion targets is the AR loss alone."""
    if l_diff is None:
        return l_ar
    if l_ar is None:
        return l_diff
    return (l_diff + w * l_ar) / (1 + w)
