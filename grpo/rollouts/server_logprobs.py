"""Log-probs of a `vllm_mode: server` rollout, in both shapes the vLLM server answers with.

TRL's client (`trl.generation.vllm_client.parse_logprobs`, TRL 1.16) reads every position as a `token` string
`"token_id:<id>"`. That is what `/v1/completions` returns; image prompts go through
`/inference/v1/generate` instead, and vLLM 0.32 answers there with integer ids, no string
(`vllm/entrypoints/scale_out/token_in_token_out/protocol.py`, `GenerateLogProb`: `token_id`, `logprob`,
`rank`; `top_logprobs` a list), so TRL stops with `KeyError: 'token'`, and its trainer always asks for log-probs.
`parse_logprobs` here reads either shape into TRL's result: per sequence, per position, the candidates sorted by
descending log-prob, the sampled token always among them, NaN as None. The rollout backend puts it in TRL's
client module, where every request of the client looks it up (`grpo.rollouts.backend.RolloutBackend.install`).

Example:
    >>> parse_logprobs([{"content": [{"token_id": 5, "logprob": -0.1, "rank": 1, "top_logprobs": []}]}])
    ([[[-0.1]]], [[[5]]])
"""
from __future__ import annotations

import math


def _position(entry: dict) -> tuple[list[int], list[float | None]]:
    """One position's candidates (ids, log-probs) by descending log-prob, the sampled token included."""
    if "token_id" in entry:  # /inference/v1/generate: integer ids
        sampled = (int(entry["token_id"]), entry["logprob"])
        top = [(int(t["token_id"]), t["logprob"]) for t in entry.get("top_logprobs") or ()]
    else:  # chat completions and completions asked for ids as "token_id:<id>" strings
        sampled = (int(entry["token"].removeprefix("token_id:")), entry["logprob"])
        top = [(int(t["token"].removeprefix("token_id:")), t["logprob"]) for t in entry.get("top_logprobs") or ()]
    candidates = dict([sampled, *top])  # the sampled token once, whatever its rank
    ranked = sorted(candidates.items(), key=lambda item: -item[1])
    return [t for t, _ in ranked], [None if math.isnan(lp) else lp for _, lp in ranked]


def _completions_positions(logprobs: dict) -> list[dict]:
    """`/v1/completions`' parallel lists as one entry per position."""
    return [{"token": token, "logprob": logprob,
             "top_logprobs": [{"token": t, "logprob": lp} for t, lp in (top or {}).items()]}
            for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"],
                                           strict=True)]


def parse_logprobs(choices_logprobs: list[dict | None]) -> tuple[list | None, list | None]:
    """(logprobs, logprob_token_ids) of a batch of choices, each of shape (sequences, positions, candidates), or
    `(None, None)` when the server returned none (TRL's `parse_logprobs`, with vLLM 0.32's id shape read too)."""
    if not choices_logprobs or choices_logprobs[0] is None:
        return None, None
    all_logprobs, all_ids = [], []
    for logprobs in choices_logprobs:
        entries = logprobs["content"] if "content" in logprobs else _completions_positions(logprobs)
        positions = [_position(entry) for entry in entries or ()]
        all_ids.append([ids for ids, _ in positions])
        all_logprobs.append([values for _, values in positions])
    return all_logprobs, all_ids
