"""Self-speculative decoding (docs/spec.md §5, paper B.2) and its reference, plain AR greedy decoding, at batch 1.

Both run one prompt at a time with a KV cache (`grpo.decoding.kv_session.Session`) and greedy top-1, so under exact
arithmetic they produce the same tokens. They are the references the batched decoders of `grpo.decoding.batched`
(which `gravity-grpo tpf`, the probe and the rollouts use) are tested against, row by row.

Example:
    >>> decoder = SelfSpecDecoder(model, mask_id=bd.mask_id, bd_size=32, stop_ids=stop_token_ids(model, tok))
    >>> result = decoder.generate(encode_prompt(tok, row, is_vlm=False))
    >>> len(result.tokens) / result.forwards   # tokens per forward
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from grpo.decoding.kv_session import DecodeResult, Session, truncate


@torch.inference_mode()
def ar_generate(model: Any, inputs: dict[str, torch.Tensor], stop_ids: Iterable[int],
                max_new_tokens: int = 512) -> DecodeResult:
    """Greedy AR decoding, one token per forward after the prefill (the reference for self-spec)."""
    stops = frozenset(stop_ids)
    session = Session(model)
    tokens = [int(session.prefill(inputs).argmax())]
    while tokens[-1] not in stops and len(tokens) < max_new_tokens:
        tokens.append(int(session.forward(tokens[-1:])[-1].argmax()))
    return DecodeResult(tokens=tokens, forwards=session.forwards, rounds=session.forwards)


class SelfSpecDecoder:
    """Draft B tokens with one block-diffusion forward, verify them with one causal forward, keep the agreement.

    `draft` is the one seam tests replace (a test double for the draft logits); everything else is the
    real round of docs/spec.md §5. When `a0` already ends the output (a stop token, or the last token allowed) the
    round skips its verify forward: one forward, no accepted count. A verified round counts the drafts it
    commits: accepted drafts cut off by EOS or `max_new_tokens` are not committed, so they do not count.
    """

    def __init__(self, model: Any, mask_id: int, bd_size: int, stop_ids: Iterable[int],
                 max_new_tokens: int = 512):
        if bd_size < 1 or max_new_tokens < 1:
            raise ValueError(f"bd_size and max_new_tokens must be >= 1, got {bd_size} and {max_new_tokens}")
        self.model = model
        self.mask_id = mask_id
        self.bd_size = bd_size
        self.stop_ids = frozenset(stop_ids)
        self.max_new_tokens = max_new_tokens
        self.session: Session | None = None
        self.prompt_len = 0
        self.tokens: list[int] = []

    def draft(self, mask_logits: torch.Tensor) -> list[int]:
        """Drafts d1..dB from the logits of the B mask positions (B, vocab): top-1, no threshold."""
        return mask_logits.argmax(-1).tolist()

    @torch.inference_mode()
    def generate(self, inputs: dict[str, torch.Tensor]) -> DecodeResult:
        """Decode one prompt (model inputs from `grpo.prompting.encode_prompt`)."""
        B = self.bd_size
        self.session = session = Session(self.model)
        self.prompt_len = inputs["input_ids"].shape[1]
        self.tokens = [int(session.prefill(inputs).argmax())]   # x0, the first boundary
        result = DecodeResult(tokens=self.tokens)
        finished = self.tokens[0] in self.stop_ids or self.max_new_tokens <= 1
        while not finished:
            x0 = self.tokens[-1]
            logits = session.forward([x0] + [self.mask_id] * B, draft=True)  # (B+1, vocab)
            a0 = int(logits[0].argmax())                    # x0's logits: the AR prediction
            drafts = self.draft(logits[1:])                 # mask j's logits -> d_j
            session.crop_to(self.prompt_len + len(self.tokens))   # keep x0's causal state only
            committed = [a0]
            verified_round = a0 not in self.stop_ids and len(self.tokens) + 1 < self.max_new_tokens
            if verified_round:
                verified = session.forward([a0] + drafts).argmax(-1).tolist()   # a1..a(B+1)
                accepted = 0
                while accepted < B and drafts[accepted] == verified[accepted]:
                    accepted += 1
                committed += drafts[:accepted] + [verified[accepted]]
            committed, finished = truncate(committed, self.stop_ids, self.max_new_tokens - len(self.tokens))
            if verified_round:  # drafts committed: those left after the cut at EOS or max_new_tokens
                result.accepted.append(min(accepted, len(committed) - 1))
            self.tokens += committed
            session.crop_to(self.prompt_len + len(self.tokens) - 1)   # causal states of x0, a0, d1..dA
            result.rounds += 1
        result.forwards = session.forwards
        return result
