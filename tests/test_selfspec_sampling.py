"""Exact self-speculative sampling: on a model small enough to enumerate every output (vocabulary 5, at most 6
new tokens), the distribution of 10^5 self-speculative samples is the AR sampling distribution, computed
exactly from the model's own causal probabilities (chi-square goodness of fit). Six tokens with blocks of 2
reach a second verified round and commit bonus tokens (every draft accepted). The same test rejects
a distribution only slightly off (another temperature) and a decoder whose bonus draw alone is wrong, so it
has the power to see a wrong acceptance rule or bonus."""
from __future__ import annotations

import pytest
import torch

from grpo.decoding.batched import BatchARDecoder, BatchDecoder, Sampler
from helpers_sampling import chi_square_p, exact_ar_distribution, tally_outputs

VOCAB, EOS, MASK = 5, 0, 1
PROMPT = [2, 3, 4, 2]
MAX_NEW, BD_SIZE, SAMPLES = 6, 2, 100_000


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, initializer_range=0.6,
                         max_position_embeddings=64, eos_token_id=EOS, bos_token_id=None)
    return LlamaForCausalLM(config).eval()


def ar_distribution(model, temperature: float) -> dict[tuple[int, ...], float]:
    return exact_ar_distribution(model, PROMPT, temperature, MAX_NEW, EOS)


def sample(decoder_cls, model, temperature: float, seed: int, **kwargs):
    decoder = decoder_cls(model, stop_ids={EOS}, max_new_tokens=MAX_NEW,
                          sampler=Sampler(temperature, torch.Generator().manual_seed(seed)), **kwargs)
    inputs = [{"input_ids": torch.tensor([PROMPT])}] * SAMPLES
    return decoder.generate(inputs)


def tally(results) -> dict[tuple[int, ...], int]:
    return tally_outputs(r.tokens for r in results)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_selfspec_samples_follow_the_ar_distribution(model, temperature):
    exact = ar_distribution(model, temperature)
    # every output: EOS after n - 1 other tokens (n < MAX_NEW), or MAX_NEW tokens
    assert len(exact) == sum((VOCAB - 1) ** (n - 1) for n in range(1, MAX_NEW)) + (VOCAB - 1) ** (MAX_NEW - 1) * VOCAB
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-12)
    results = sample(BatchDecoder, model, temperature, seed=0, mask_id=MASK, bd_size=BD_SIZE)
    accepted = [a for r in results for a in r.accepted]
    assert 0.2 < sum(accepted) / len(accepted) / BD_SIZE < 0.95  # drafts are both accepted and rejected
    # whole blocks accepted (a bonus token drawn: `test_the_test_sees_a_wrong_bonus_draw`), and second rounds
    assert sum(BD_SIZE in r.accepted for r in results) > SAMPLES // 10
    assert sum(len(r.accepted) >= 2 for r in results) > SAMPLES // 10
    assert chi_square_p(tally(results), exact, SAMPLES) > 1e-3
    # the same test tells a distribution a little off apart: AR's at another temperature
    assert chi_square_p(tally(results), ar_distribution(model, temperature * 1.15), SAMPLES) < 1e-6


def test_batched_ar_sampler_follows_the_ar_distribution(model):
    """The reference sampler itself (one token per forward) passes the same test."""
    results = sample(BatchARDecoder, model, 1.0, seed=1)
    assert chi_square_p(tally(results), ar_distribution(model, 1.0), SAMPLES) > 1e-3


def test_sampling_is_deterministic_for_a_seed(model):
    def run(seed):
        decoder = BatchDecoder(model, MASK, BD_SIZE, {EOS}, MAX_NEW, Sampler(1.0, torch.Generator().manual_seed(seed)))
        return [r.tokens for r in decoder.generate([{"input_ids": torch.tensor([PROMPT])}] * 50, 7)]

    assert run(4) == run(4) and run(4) != run(5)
    assert len({tuple(t) for t in run(4)}) > 5


class BrokenBonus(BatchDecoder):
    """A deliberate bug: after a whole accepted block the bonus token is uniform, not drawn from p_(B+1)."""

    def _accept(self, logits, drafts, q):
        accepted, nexts = super()._accept(logits, drafts, q)
        bonus = accepted == self.bd_size
        uniform = torch.randint(VOCAB, (int(bonus.sum()),), generator=self.sampler.generator)
        return accepted, nexts.masked_scatter(bonus, uniform)


def test_the_test_sees_a_wrong_bonus_draw(model):
    results = sample(BrokenBonus, model, 1.0, seed=0, mask_id=MASK, bd_size=BD_SIZE)
    assert chi_square_p(tally(results), ar_distribution(model, 1.0), SAMPLES) < 1e-6
