"""Self-speculative decoding (docs/spec.md §5, paper B.2) and its reference, plain AR greedy decoding, at batch 1.

`GravityRoundDecoder` is the same decoding in GravityOCR's own round layout (docs/spec.md §5, "Round layouts").
All run one prompt at a time with a KV cache (`grpo.decoding.kv_session.Session`) and greedy top-1, so under exact
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


class GravityRoundDecoder(SelfSpecDecoder):
    """Greedy self-speculative decoding in GravityOCR's round layout (`generate_speculative_natcache` of its
    `src/fast_sampling.py`, the round its forward bench counts), at batch 1.

    The prefill's logits give x0 but commit nothing: the first round drafts over B masks alone, the first one
    standing where x0 will stand (x0 from the prefill, d_j from mask j-1's logits, d_B from the last mask's),
    and verifies `[x0, d1..dB]`. Later rounds are this package's (`[x0 | B masks]`, then `[a0, d1..dB]`).
    Every round runs its verify, also when its first token ends the output; a round that starts under
    `max_new_tokens` commits in full (the output may run past the cap); the output ends at its first stop token.
    `forwards` counts every forward but the prefill: a hook on decoder layer 0 counts `forwards + 1`.
    """

    @torch.inference_mode()
    def generate(self, inputs: dict[str, torch.Tensor]) -> DecodeResult:
        """Decode one prompt (model inputs from `grpo.prompting.encode_prompt`)."""
        B = self.bd_size
        self.session = session = Session(self.model)
        self.prompt_len = inputs["input_ids"].shape[1]
        seed = session.prefill(inputs)                     # predicts x0
        self.tokens = tokens = []
        result = DecodeResult(tokens=tokens)
        while not (tokens and tokens[-1] in self.stop_ids) and len(tokens) < self.max_new_tokens:
            masks = [self.mask_id] * B
            if tokens:  # [x0 | B masks]: x0's logits give a0, mask j's give d_j
                draft = session.forward([tokens[-1]] + masks, draft=True).argmax(-1).tolist()   # a0, d1..dB
            else:       # [B masks]: the prefill gives x0, mask j-1 gives d_j, the last mask d_B
                draft = [int(seed.argmax())] + session.forward(masks, draft=True, boundary=False).argmax(-1).tolist()
            session.crop_to(self.prompt_len + len(tokens))   # the committed tokens' causal states, x0's included
            verified = [draft[0]] + session.forward(draft).argmax(-1).tolist()   # verify [a0 (or x0), d1..dB]
            accepted = 1                                   # draft[0] is the verifier's own token
            while accepted <= B and draft[accepted] == verified[accepted]:
                accepted += 1
            committed = draft[:accepted] + [verified[accepted]]
            kept, _ = truncate(committed, self.stop_ids, len(committed))   # cut at a stop token only
            result.accepted.append(min(accepted - 1, len(kept) - 1))
            tokens += kept
            session.crop_to(self.prompt_len + len(tokens) - 1)
            result.rounds += 1
        result.forwards = session.forwards
        return result
