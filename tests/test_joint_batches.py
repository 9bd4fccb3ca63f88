"""`length_buckets`, `curriculum` and `indent` of `gravity-grpo joint`: which rows each batch comes from."""
from __future__ import annotations

import random

import pytest

from grpo.joint.train import JointConfig, _batch, _training_rows, curriculum_pools
from grpo.yaml_config import ConfigError


def test_a_bucketed_batch_comes_from_one_window_of_neighbours():
    pairs = [([0] * n, [1] * n, None) for n in range(100)]  # sorted by length, as train_joint sorts them
    cfg = JointConfig(batch_size=4, length_buckets=2)
    rng = random.Random(0)
    for _ in range(50):
        lengths = [len(p[0]) for p in _batch(pairs, cfg, rng)]
        assert len(lengths) == 4 and max(lengths) - min(lengths) < 8, lengths
    unbucketed = [len(p[0]) for _ in range(50) for p in _batch(pairs, JointConfig(batch_size=4), rng)]
    assert max(unbucketed) - min(unbucketed) > 50


def test_the_default_draws_as_before():
    """Without buckets the draws are `rng.choice` per example, so recipes without the key rebuild the same."""
    pairs = list(range(10))
    ref = random.Random(3)
    expected = [ref.choice(pairs) for _ in range(5)]
    rng = random.Random(3)
    assert _batch(pairs, JointConfig(batch_size=5), rng) == expected


def test_negative_buckets_are_refused():
    with pytest.raises(ConfigError, match="length_buckets must be >= 0"):
        JointConfig(length_buckets=-1)


def test_the_curriculum_draws_short_rows_first_then_all():
    """`curriculum: [a, b]`: the first a steps draw rows of one line, the next b rows of at most two, then all;
    a phase with no row to draw is refused by name, and so are step counts past the run."""
    pairs = ["one", "two", "five", "one'"]
    pools = curriculum_pools(pairs, [1, 2, 5, 1], [3, 2])
    drawn = [next(p for end, p in pools if step < end) for step in range(7)]
    assert drawn == [["one", "one'"]] * 3 + [["one", "two", "one'"]] * 2 + [pairs] * 2
    with pytest.raises(ConfigError, match="curriculum: no training row has at most 1 lines"):
        curriculum_pools(pairs, [2, 2, 5, 3], [1])
    assert curriculum_pools(pairs, [2, 2, 5, 3], [0, 1])[-1] == (float("inf"), pairs)
    with pytest.raises(ConfigError, match="curriculum must be step counts"):
        JointConfig(ar_steps=5, joint_steps=0, curriculum=[4, 2])


def test_indent_is_refused_where_it_cannot_draw_crops():
    with pytest.raises(ConfigError, match=r"indent must be in \[0, 71\] cells, got 72"):
        JointConfig(indent=72)
    with pytest.raises(ConfigError, match="indent draws a built-in split's crops; pool 'rows.jsonl' is a pool path"):
        JointConfig(pool="rows.jsonl", indent=4)
    with pytest.raises(ConfigError, match="indent draws crops: the model is a text model"):
        _training_rows("tiny-train", 4, images=False, indent=4)
