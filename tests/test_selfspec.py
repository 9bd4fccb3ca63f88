"""Decoders (docs/spec.md §5) on tiny random checkpoints in fp32: self-spec == AR greedy == HF generate, round accounting
with a test double for the draft logits, the draft window against a full-sequence forward, direct diffusion, and
the batched decoders row for row against batch 1 (text and GLM-OCR with images)."""
from __future__ import annotations

import pytest
import torch

from grpo.checkpoint import load_checkpoint
from grpo.decoding.batch_session import BatchSession
from grpo.decoding.batched import BatchARDecoder, BatchDecoder, Sampler
from grpo.decoding.kv_session import Session, stop_token_ids
from grpo.decoding.diffusion import diffusion_generate
from grpo.prompting import encode_prompt
from grpo.decoding.selfspec import SelfSpecDecoder, ar_generate
from helpers_models import build_text_checkpoint, glm_with_image_rows

# transformers' Glm46VProcessor calls np.array on a tensor row; numpy 2 warns about the copy keyword
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")

MAX_NEW = 48
TASK_PROMPTS = ("Text Recognition:", "Table Recognition:", "Formula Recognition:")
N_PROMPTS = 20


class Arch:
    """A loaded tiny checkpoint, its encoded prompts and their AR greedy references (computed once)."""

    def __init__(self, ckpt, processor, rows):
        self.model, self.bd, self.is_vlm = ckpt.model, ckpt.bd, ckpt.is_vlm
        self.tokenizer = ckpt.processor
        self.stops = stop_token_ids(self.model, self.tokenizer)
        self.inputs = [encode_prompt(processor, row, self.is_vlm) for row in rows]
        self.references = [ar_generate(self.model, x, self.stops, MAX_NEW).tokens for x in self.inputs]


def _text(i: int) -> str:
    return TASK_PROMPTS[i % 3] + "\n" + "abc de|fg{hi}<tr>"[: 1 + i % 17] * (1 + i // 4)


@pytest.fixture(scope="module")
def text_arch(tmp_path_factory):
    ckpt = load_checkpoint(build_text_checkpoint(tmp_path_factory.mktemp("text")), need_drafter=True)
    return Arch(ckpt, ckpt.processor, [{"prompt": _text(i)} for i in range(N_PROMPTS)])


@pytest.fixture(scope="module")
def vlm_arch(tmp_path_factory):
    # model seed 5: a random draw whose greedy outputs end at many lengths (EOS inside rounds, as the tests need)
    ckpt, processor, rows = glm_with_image_rows(tmp_path_factory.mktemp("vlm"), [_text(i) for i in range(N_PROMPTS)],
                                                model_seed=5)
    return Arch(ckpt, processor, rows)


@pytest.fixture(params=["text", "vlm"])
def arch(request) -> Arch:
    return request.getfixturevalue(f"{request.param}_arch")


def test_prompts_are_varied(arch):
    lengths = {len(r) for r in arch.references}
    assert len(lengths) >= 4 and max(lengths) == MAX_NEW
    assert len({x["input_ids"].shape[1] for x in arch.inputs}) >= 10
    if arch.is_vlm:
        assert len({tuple(x["image_grid_thw"][0].tolist()) for x in arch.inputs}) >= 5


def test_ar_reference_equals_hf_generate(arch):
    for inputs, reference in list(zip(arch.inputs, arch.references))[:8]:
        out = arch.model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW)
        assert out[0, inputs["input_ids"].shape[1]:].tolist() == reference


@pytest.mark.parametrize("bd_size", [4, 8, 32])
def test_selfspec_equals_ar_greedy(arch, bd_size):
    decoder = SelfSpecDecoder(arch.model, arch.bd.mask_id, bd_size, arch.stops, MAX_NEW)
    for inputs, reference in zip(arch.inputs, arch.references):
        result = decoder.generate(inputs)
        assert result.tokens == reference
        unverified = result.rounds - len(result.accepted)
        assert unverified in (0, 1) and result.forwards == 2 * len(result.accepted) + unverified
        assert decoder.session.length == inputs["input_ids"].shape[1] + len(reference) - 1


def _full_window_mask(prompt_len: int, bd_size: int) -> torch.Tensor:
    """(1, 1, T, T) additive mask of `[prompt, x0, M×B]` without a cache, built row by row from docs/spec.md §5."""
    total = prompt_len + 1 + bd_size
    allowed = torch.zeros(total, total, dtype=torch.bool)
    for q in range(total):
        if q <= prompt_len:                      # prompt tokens and x0: causal
            allowed[q, : q + 1] = True
        else:                                    # masks: everything, the whole window included
            allowed[q, :] = True
    return torch.zeros(1, 1, total, total).masked_fill(~allowed, torch.finfo(torch.float32).min)


@torch.inference_mode()
def test_draft_window_equals_full_sequence_forward(arch):
    bd_size = 8
    for inputs in arch.inputs[:4]:
        session = Session(arch.model)
        x0 = int(session.prefill(inputs).argmax())
        window = [x0] + [arch.bd.mask_id] * bd_size
        cached = session.forward(window, draft=True)
        ids = torch.cat([inputs["input_ids"], torch.tensor([window])], dim=1)
        prompt_len = inputs["input_ids"].shape[1]
        kwargs = {}
        if arch.is_vlm:  # positions from HF's own rope index over the whole sequence
            types = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(window), dtype=torch.long)], 1)
            kwargs = dict(pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
                          position_ids=arch.model.model.get_rope_index(
                              ids, mm_token_type_ids=types, image_grid_thw=inputs["image_grid_thw"])[0])
        full = arch.model(input_ids=ids, attention_mask=_full_window_mask(prompt_len, bd_size), **kwargs)
        torch.testing.assert_close(cached, full.logits[0, prompt_len:], atol=1e-4, rtol=1e-4)


class ScriptedDrafts(SelfSpecDecoder):
    """Test double for the draft logits only: d_j is the AR reference's token where j <= `good`, else a token
    the verifier cannot predict. Checks the cache invariant at the start of every round."""

    def __init__(self, *args, reference: list[int], good: int, vocab: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.reference, self.good, self.vocab = reference, good, vocab
        self.round_starts: list[int] = []

    def draft(self, mask_logits: torch.Tensor) -> list[int]:
        assert mask_logits.shape[0] == self.bd_size
        before_window = self.session.length - (1 + self.bd_size)  # the draft forward appended [x0, M×B]
        assert before_window == self.prompt_len + len(self.tokens) - 1
        self.round_starts.append(len(self.tokens))
        first = len(self.tokens) + 1          # output index of d1 (a0 sits at len(tokens))
        truth = self.reference[first: first + self.bd_size]
        assert len(truth) == self.bd_size, "reference too short for the scripted drafts"
        return [t if j < self.good else (t + 1) % self.vocab for j, t in enumerate(truth)]


def _long_reference(arch: Arch, need: int) -> tuple[dict, list[int]]:
    """A prompt whose greedy output runs at least `need` tokens without EOS, and that output."""
    for inputs in arch.inputs:
        reference = ar_generate(arch.model, inputs, arch.stops, need)
        if len(reference.tokens) == need and reference.tokens[-1] not in arch.stops:
            return inputs, reference.tokens
    raise AssertionError(f"no prompt runs {need} tokens without EOS")


def _scripted(arch, bd_size, good, max_new, stops=None, need=120):
    inputs, reference = _long_reference(arch, need)
    decoder = ScriptedDrafts(arch.model, arch.bd.mask_id, bd_size, stops or arch.stops, max_new,
                             reference=reference, good=good, vocab=arch.model.get_output_embeddings().out_features)
    result = decoder.generate(inputs)
    assert decoder.session.length == decoder.prompt_len + len(result.tokens) - 1
    return decoder, result, reference


@pytest.mark.parametrize("bd_size", [4, 8])
def test_all_match_commits_b_plus_2_per_round(arch, bd_size):
    max_new = 1 + 3 * (bd_size + 2)
    decoder, result, reference = _scripted(arch, bd_size, good=bd_size, max_new=max_new)
    assert result.tokens == reference[:max_new]
    assert decoder.round_starts == [1, 1 + (bd_size + 2), 1 + 2 * (bd_size + 2)]
    assert result.accepted == [bd_size] * 3 and result.rounds == 3 and result.forwards == 6


def test_never_match_commits_2_per_round(arch):
    decoder, result, reference = _scripted(arch, 8, good=0, max_new=11)
    assert result.tokens == reference[:11]
    assert decoder.round_starts == [1, 3, 5, 7, 9]
    assert result.accepted == [0] * 5 and result.forwards == 10


def test_partial_match_accepts_the_matching_prefix(text_arch):
    decoder, result, reference = _scripted(text_arch, 8, good=3, max_new=1 + 4 * 5)
    assert result.tokens == reference[:21]
    assert decoder.round_starts == [1, 6, 11, 16] and result.accepted == [3] * 4


def test_drafts_by_line_walks_the_decoders_rounds(text_arch):
    """`drafts_by_line` finds each verified round's a0 where the decoder put it: with every token a line break,
    a round's line is the number of tokens up to its a0."""
    from grpo.synthetic.reading import drafts_by_line

    decoder, result, _ = _scripted(text_arch, 8, good=3, max_new=1 + 4 * 5)
    walked = drafts_by_line(result.tokens, result.accepted, lambda ids: "\n" * len(ids))
    assert [line - 1 for line, _ in walked] == decoder.round_starts
    assert [a for _, a in walked] == result.accepted


def _first_occurrence(reference: list[int], candidates) -> int:
    for t in candidates:
        if reference[t] not in reference[:t]:
            return t
    raise AssertionError("no token occurs first at the wanted positions")


def test_eos_inside_a_round_truncates_there(text_arch):
    bd_size = 8
    _, reference = _long_reference(text_arch, 120)
    t = _first_occurrence(reference, range(1 + (bd_size + 2) + 1, 2 * (bd_size + 2)))  # inside round 2
    decoder, result, _ = _scripted(text_arch, bd_size, good=bd_size, max_new=100, stops={reference[t]})
    assert result.tokens == reference[: t + 1]
    assert result.rounds == 2 and result.forwards == 4
    # round 2 verifies all 8 drafts, but commits only those up to the EOS (d_j at output index 11 + j)
    assert result.accepted == [bd_size, t - (1 + bd_size + 2)]


def test_eos_as_a0_skips_the_verify_forward(text_arch):
    _, reference = _long_reference(text_arch, 120)
    t = _first_occurrence(reference, range(3, 40, 2))  # a0 of a round when every round commits 2
    decoder, result, _ = _scripted(text_arch, 8, good=0, max_new=100, stops={reference[t]})
    assert result.tokens == reference[: t + 1]
    rounds = (t + 1) // 2
    assert result.rounds == rounds and len(result.accepted) == rounds - 1 and result.forwards == 2 * rounds - 1


def test_max_new_tokens_truncates_mid_round(text_arch):
    decoder, result, reference = _scripted(text_arch, 8, good=8, max_new=14)
    assert result.tokens == reference[:14] and result.rounds == 2
    # round 1 commits x0's successor a0, 8 drafts and a bonus (11 tokens with x0); round 2 has room for 3:
    # a0, d1, d2, so 2 of its 8 agreeing drafts are committed
    assert result.accepted == [8, 2]


def test_diffusion_with_block_size_1_is_ar_greedy(arch):
    for inputs, reference in list(zip(arch.inputs, arch.references))[:6]:
        result = diffusion_generate(arch.model, inputs, mask_id=arch.bd.mask_id, bd_size=1, stop_ids=arch.stops,
                                    max_new_tokens=MAX_NEW, tau=0.9)
        assert result.tokens == reference
        blocks = len(reference) - 1
        assert result.rounds == blocks and result.forwards == 2 * blocks - (blocks > 0)


@pytest.mark.parametrize("tau, steps_per_block", [(1.0, 4), (0.0, 1)])
def test_diffusion_forward_count(text_arch, tau, steps_per_block):
    inputs, _ = _long_reference(text_arch, 60)
    result = diffusion_generate(text_arch.model, inputs, mask_id=text_arch.bd.mask_id, bd_size=4,
                                stop_ids=text_arch.stops, max_new_tokens=1 + 4 * 5, tau=tau)
    assert len(result.tokens) == 21 and result.rounds == 5
    assert result.forwards == 5 * steps_per_block + 4  # a cache write after every block but the last


# --- batched decoding: every row as at batch 1 -------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_batched_selfspec_equals_batch_1_per_row(arch, batch_size):
    """Ragged acceptance, rows leaving and joining (continuous batching), per-row positions: each row's output
    ids, forwards, rounds and accepted drafts are those of the batch-1 decoder."""
    bd_size = 8
    single = SelfSpecDecoder(arch.model, arch.bd.mask_id, bd_size, arch.stops, MAX_NEW)
    expected = [single.generate(x) for x in arch.inputs]
    results = BatchDecoder(arch.model, arch.bd.mask_id, bd_size, arch.stops, MAX_NEW).generate(arch.inputs, batch_size)
    assert [r.tokens for r in results] == arch.references
    for got, want in zip(results, expected):
        assert (got.tokens, got.forwards, got.rounds, got.accepted) == (want.tokens, want.forwards, want.rounds,
                                                                        want.accepted)
    assert len({tuple(r.accepted) for r in results}) > 1  # the rows did accept different numbers of drafts


def test_batched_ar_equals_ar_greedy(arch):
    results = BatchARDecoder(arch.model, arch.stops, MAX_NEW).generate(arch.inputs, 5)
    assert [r.tokens for r in results] == arch.references
    assert [r.forwards for r in results] == [len(t) - 1 for t in arch.references]


def test_batched_decoder_greedy_limit_of_sampling_is_greedy(text_arch):
    """Sampling at a temperature near 0 commits exactly what the greedy decoder commits, at the same cost."""
    greedy = BatchDecoder(text_arch.model, text_arch.bd.mask_id, 8, text_arch.stops, MAX_NEW).generate(text_arch.inputs)
    cold = BatchDecoder(text_arch.model, text_arch.bd.mask_id, 8, text_arch.stops, MAX_NEW,
                        Sampler(1e-4, torch.Generator().manual_seed(3))).generate(text_arch.inputs)
    assert [(r.tokens, r.forwards, r.accepted) for r in cold] == [(r.tokens, r.forwards, r.accepted) for r in greedy]


def test_batch_session_ragged_keep_and_leaving_rows(text_arch):
    """A ragged keep grows each row by its own count; a leaving row's place goes to the last row, whose cached
    states move with it unchanged."""
    session = BatchSession(text_arch.model, 4)
    prefill = session.prefill(text_arch.inputs[:4])
    session.admit(prefill, [0, 1, 2, 3], [10, 11, 12, 13])
    lengths = [x["input_ids"].shape[1] for x in text_arch.inputs[:4]]
    assert session.next_pos.tolist() == lengths and session.length == max(lengths)
    session.forward(torch.full((4, 5), 7))
    layer = session.cache.layers[0]
    last = layer.keys[3, :, : lengths[3] + 1].clone()
    order = session.keep(torch.tensor([5, 0, 2, 1]), torch.tensor([False, True, True, True]))
    assert order.tolist() == [3, 1, 2] and session.rows.tolist() == [13, 11, 12]
    assert session.next_pos.tolist() == [lengths[3] + 1, lengths[1], lengths[2] + 2]
    assert torch.equal(layer.keys[0, :, : lengths[3] + 1], last)
    with pytest.raises(ValueError, match="cannot keep 6 of the 5 slots"):
        session.keep(torch.tensor([6, 0, 0]))
    with pytest.raises(ValueError, match="exceed the capacity 4"):
        session.admit(prefill, [0, 1], [20, 21])


def test_batch_session_states_equal_a_single_prompt_session(text_arch):
    """A row's logits after prefill, admission among others and a ragged keep equal those of the prompt alone."""
    inputs = text_arch.inputs[:3]
    session = BatchSession(text_arch.model, 3)
    session.admit(session.prefill(inputs), [0, 1, 2], [0, 1, 2])
    session.forward(torch.full((3, 4), 5))
    session.keep(torch.tensor([4, 1, 3]))
    batched = session.forward(torch.full((3, 2), 9))
    for r, (x, kept) in enumerate(zip(inputs, (4, 1, 3))):
        alone = Session(text_arch.model)
        alone.prefill(x)
        alone.forward([5] * kept)
        torch.testing.assert_close(batched[r], alone.forward([9, 9]), rtol=1e-4, atol=1e-4)


def test_batched_decoder_under_bf16_autocast(text_arch):
    """Under bf16 mixed precision (how accelerate wraps a bf16 run's model, and so the TPF probe sees it) keys
    leave the rotary embedding in fp32 and values in bf16; the cache buffers take each as it comes."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        results = BatchDecoder(text_arch.model, text_arch.bd.mask_id, 8, text_arch.stops, MAX_NEW).generate(
            text_arch.inputs[:4], 2)
    assert [len(r.tokens) > 0 and r.forwards > 0 for r in results] == [True] * 4
