"""Self-speculative and AR decoding of N prompts at once, greedy or sampled at a temperature (docs/spec.md §5).

Each row runs its own rounds on a shared `BatchSession`: one draft forward and one verify forward per
round for the whole batch, each row accepting its own number of drafts. A row whose `a0` ends its output
leaves before the verify forward (its round costs one forward, as at batch 1); a finished row leaves the
batch. Greedy output ids and per-row forward counts are those of the batch-1 `SelfSpecDecoder`.

Sampling at temperature T (`temperature > 0`) is exact speculative sampling, no top-k / top-p:
- `a0` is drawn from x0's logits, which are causal: the AR distribution p0 itself.
- draft d_j is drawn from the diffusion's distribution q_j = softmax(mask logits_j / T);
- the verifier gives p_j; d_j is accepted with probability min(1, p_j(d_j) / q_j(d_j)), in order;
- at the first rejection the token is drawn from max(0, p_j - q_j), normalized; when every draft is
  accepted a bonus token is drawn from p_(B+1).
Every committed token is then distributed as AR sampling at T would draw it. At T = 0 each draw becomes an
argmax and the round is the greedy one.

Example:
    >>> decoder = BatchDecoder(model, mask_id=bd.mask_id, bd_size=16, stop_ids=stops,
    ...                        sampler=Sampler(1.0, torch.Generator().manual_seed(0)))  # doctest: +SKIP
    >>> results = decoder.generate([encode_prompt(tok, row, False) for row in rows])  # doctest: +SKIP
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from grpo.decoding.batch_session import BatchSession
from grpo.decoding.kv_session import DecodeResult, truncate


class Sampler:
    """Greedy (temperature 0) or temperature sampling from logits, with one random generator per device
    (seeded from `generator`, the CPU one), so draws stay on the device the logits are on."""

    def __init__(self, temperature: float = 0.0, generator: torch.Generator | None = None):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
        self.temperature = temperature
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self._generators = {"cpu": self.generator}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """softmax(logits / T) in fp32, on the logits' device."""
        return (logits.float() / self.temperature).softmax(-1)

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        """One index per row of `probs` (..., vocab), on the CPU."""
        flat = probs.reshape(-1, probs.shape[-1])
        drawn = torch.multinomial(flat, 1, generator=self._on(probs.device))
        return drawn.reshape(probs.shape[:-1]).cpu()

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """Argmax, or a draw at the temperature, for every row of `logits` (..., vocab); on the CPU."""
        return logits.argmax(-1).cpu() if self.greedy else self.draw(self.probs(logits))

    def uniform(self, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        return torch.rand(shape, generator=self._on(device), device=device)

    def _on(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self.generator.initial_seed())
        return self._generators[key]


def _open(tokens: list[int], stops: frozenset[int], max_new_tokens: int) -> bool:
    """Whether an output may still grow: no stop token at its end and room left."""
    return tokens[-1] not in stops and len(tokens) < max_new_tokens


class _Batched:
    """The loop both batched decoders share: up to `batch_size` rows decode at once, and a finished row's
    place goes to the next waiting prompt before the next round (continuous batching). Waiting prompts are
    prefilled `batch_size` at a time, in one forward, and admitted as places free up."""

    def __init__(self, model: Any, stop_ids: Iterable[int], max_new_tokens: int = 512,
                 sampler: Sampler | None = None):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model = model
        self.stop_ids = frozenset(stop_ids)
        self.max_new_tokens = max_new_tokens
        self.sampler = sampler or Sampler()

    @torch.inference_mode()
    def generate(self, inputs: list[dict[str, torch.Tensor]], batch_size: int | None = None) -> list[DecodeResult]:
        """Decode every prompt (model inputs from `grpo.prompting.encode_prompt`, one dict per prompt).

        Longer prompts start first (their outputs tend to be longer: the batch drains on short ones); the
        results come back in the order of `inputs`.
        """
        batch_size = batch_size or len(inputs)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        order = sorted(range(len(inputs)), key=lambda i: -inputs[i]["input_ids"].shape[1])
        self.session = session = BatchSession(self.model, min(batch_size, len(inputs)))
        self.results: list[DecodeResult | None] = [None] * len(inputs)
        waiting, staged, prefill = 0, [], None   # staged: (place in `prefill`, row) of open prompts not admitted
        while waiting < len(order) or staged or len(session.rows):
            room = batch_size - len(session.rows)
            if room and not staged and waiting < len(order):   # prefill the next prompts in one forward
                group = order[waiting:waiting + batch_size]
                waiting += len(group)
                prefill = session.prefill([inputs[i] for i in group])
                for j, (i, token) in enumerate(zip(group, self.sampler.pick(prefill.logits).tolist())):
                    self.results[i] = DecodeResult(tokens=[token])
                    if _open(self.results[i].tokens, self.stop_ids, self.max_new_tokens):
                        staged.append((j, i))
            elif room and staged:
                admitted, staged = staged[:room], staged[room:]
                session.admit(prefill, [j for j, _ in admitted], [i for _, i in admitted])
            else:
                self._round()
        return self.results

    def _round(self) -> None:
        raise NotImplementedError


class BatchARDecoder(_Batched):
    """AR decoding (greedy by default): one token per row per forward after the prefill."""

    def _round(self) -> None:
        rows = self.session.rows.tolist()
        last = torch.tensor([[self.results[i].tokens[-1]] for i in rows])
        alive = []
        for i, token in zip(rows, self.sampler.pick(self.session.forward(last)[:, -1]).tolist()):
            res = self.results[i]
            res.tokens.append(token)
            res.forwards += 1
            res.rounds += 1
            alive.append(_open(res.tokens, self.stop_ids, self.max_new_tokens))
        self.session.keep(torch.ones(len(rows), dtype=torch.long), torch.tensor(alive, dtype=torch.bool))


class BatchDecoder(_Batched):
    """Self-speculative decoding of a batch of prompts (module docstring); greedy unless `sampler` says otherwise."""

    def __init__(self, model: Any, mask_id: int, bd_size: int, stop_ids: Iterable[int], max_new_tokens: int = 512,
                 sampler: Sampler | None = None):
        super().__init__(model, stop_ids, max_new_tokens, sampler)
        if bd_size < 1:
            raise ValueError(f"bd_size must be >= 1, got {bd_size}")
        self.mask_id = mask_id
        self.bd_size = bd_size

    def draft(self, mask_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Drafts (n, B) from the mask positions' logits (n, B, vocab), and their distributions q (None if greedy)."""
        if self.sampler.greedy:
            return mask_logits.argmax(-1).cpu(), None
        q = self.sampler.probs(mask_logits)
        return self.sampler.draw(q), q

    def _round(self) -> None:
        B, session, results = self.bd_size, self.session, self.results
        rows = session.rows.tolist()
        x0 = torch.tensor([[results[i].tokens[-1]] for i in rows])
        logits = session.forward(torch.cat([x0, torch.full((len(rows), B), self.mask_id)], dim=1), draft=True)
        a0 = self.sampler.pick(logits[:, 0])              # x0's logits: the AR distribution
        drafts, q = self.draft(logits[:, 1:])             # mask j's logits -> d_j
        verify = []
        for i, token in zip(rows, a0.tolist()):
            results[i].forwards += 1
            results[i].rounds += 1
            verify.append(token not in self.stop_ids and len(results[i].tokens) + 1 < self.max_new_tokens)
            if not verify[-1]:
                results[i].tokens += truncate([token], self.stop_ids, self.max_new_tokens - len(results[i].tokens))[0]
        verify = torch.tensor(verify, dtype=torch.bool)
        order = session.keep(torch.ones(len(rows), dtype=torch.long), verify)   # x0's causal state; done rows leave
        if not len(order):
            return
        a0, drafts = a0[order], drafts[order]
        q = None if q is None else q[order.to(q.device)]
        checked = session.forward(torch.cat([a0.unsqueeze(1), drafts], dim=1))   # (n', B+1, vocab)
        accepted, nexts = self._accept(checked, drafts, q)
        rows = session.rows.tolist()
        alive = []
        for r, i in enumerate(rows):
            res, a = results[i], int(accepted[r])
            run = [int(a0[r])] + drafts[r, :a].tolist() + [int(nexts[r])]
            run, finished = truncate(run, self.stop_ids, self.max_new_tokens - len(res.tokens))
            res.accepted.append(min(a, len(run) - 1))    # drafts left after the cut at EOS or max_new_tokens
            res.tokens += run
            res.forwards += 1
            alive.append(not finished)
        session.keep(accepted + 1, torch.tensor(alive, dtype=torch.bool))   # causal states of a0, d1..dA

    def _accept(self, logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None):
        """(accepted count A per row, the token after the accepted drafts) from the verifier's logits (n, B+1, V)."""
        B = self.bd_size
        if self.sampler.greedy:
            verified = logits.argmax(-1).cpu()                            # a1 .. a(B+1)
            ok = drafts == verified[:, :B]
            accepted = ok.long().cumprod(1).sum(1)
            return accepted, verified.gather(1, accepted.unsqueeze(1)).squeeze(1)
        p = self.sampler.probs(logits)                                    # (n, B+1, V)
        device = p.device
        drafts = drafts.to(device)
        p_d = p[:, :B].gather(2, drafts.unsqueeze(2)).squeeze(2)
        q_d = q.gather(2, drafts.unsqueeze(2)).squeeze(2)
        ok = self.sampler.uniform(tuple(drafts.shape), device) * q_d < p_d   # u < p/q, without dividing by q
        accepted = ok.long().cumprod(1).sum(1)
        rows = torch.arange(len(drafts), device=device)
        target = p[rows, accepted]                                        # p_(A+1): bonus when A = B
        residual = torch.zeros_like(target)
        rejected = accepted < B
        residual[rejected] = (target[rejected] - q[rows[rejected], accepted[rejected]]).clamp(min=0)
        mass = residual.sum(1, keepdim=True)
        target = torch.where(rejected.unsqueeze(1) & (mass > 0), residual / mass.clamp(min=1e-30), target)
        return accepted.cpu(), self.sampler.draw(target)
