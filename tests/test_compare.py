"""`gravity-grpo compare`: paired statistics, McNemar, the null control's shuffle, resuming and the report."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from grpo.decoding.tpf import tpf_of
from grpo import compare
from grpo.evaluation import stats as compare_stats
from grpo.training.trainer import shuffle_within_groups


def _on_training(monkeypatch, handler):
    """`handler(command, **kwargs)` in place of the training subprocesses `compare` starts; any other
    `subprocess.run` (a library's probe of its tools on first use) runs as it is."""
    import subprocess
    import sys

    real = subprocess.run

    def run(command, *args, **kwargs):
        if list(command[:4]) == [sys.executable, "-m", "grpo.cli", "train"]:
            return handler(command, *args, **kwargs)
        return real(command, *args, **kwargs)

    monkeypatch.setattr(compare.subprocess, "run", run)


def _rows(tpf_pairs, rewards):
    return [{"tokens": t, "forwards": f, "reward": r} for (t, f), r in zip(tpf_pairs, rewards)]


def test_paired_summary_geometric_mean_wins_and_intervals():
    a = {0: _rows([(8, 4), (8, 4)], [0.5, 0.5]), 1: _rows([(9, 3), (9, 3)], [0.6, 0.6])}
    b = {0: _rows([(8, 2), (8, 2)], [0.5, 0.7]), 1: _rows([(9, 3), (9, 3)], [0.6, 0.6])}
    s = compare_stats.paired_summary(a, b, samples=500)
    assert s["per_seed_tpf_ratio"] == [2.0, 1.0]
    assert s["tpf_a"] == pytest.approx([tpf_of(a[0]), tpf_of(a[1])])   # the TPF convention of `gravity-grpo tpf`
    assert s["tpf_a"] == pytest.approx([7 / 4, 8 / 3])                    # x0 not counted
    assert s["tpf_ratio"] == pytest.approx(math.sqrt(2.0))
    assert (s["tpf_wins"], s["reward_wins"]) == (1, 1)
    assert s["reward_diff"] == pytest.approx(0.05)
    low, high = s["tpf_ratio_interval"]
    assert 1.0 <= low <= s["tpf_ratio"] <= high <= 2.0
    assert s["per_seed_reward_diff"] == pytest.approx([0.1, 0.0])
    same = compare_stats.paired_summary(a, a, samples=50)
    assert same["tpf_ratio"] == 1.0 and same["tpf_ratio_interval"] == (1.0, 1.0) and same["tpf_wins"] == 0


def test_paired_summary_rejects_unpaired_runs():
    a = {0: _rows([(1, 1)], [0.0])}
    with pytest.raises(ValueError, match="no seed"):
        compare_stats.paired_summary(a, {1: a[0]})
    with pytest.raises(ValueError, match="same probe prompts"):
        compare_stats.paired_summary(a, {0: a[0] * 2})


def test_change_from_start_pairs_every_seed_with_the_start():
    start = _rows([(4, 2)] * 2, [0.5, 0.5])
    runs = {3: _rows([(4, 2)] * 2, [0.7, 0.5]), 4: _rows([(4, 2)] * 2, [0.6, 0.6])}
    change = compare_stats.change_from_start(start, runs, samples=200)
    assert change["reward_diff"] == pytest.approx(0.1) and change["per_seed_reward_diff"] == pytest.approx([0.1, 0.1])
    assert change["reward_diff_interval"][0] >= 0.0


def test_mcnemar_exact_counts_and_p_value():
    result = compare_stats.mcnemar([True] * 5 + [False] * 3, [False] * 5 + [False] * 3)
    assert (result["wrong_before"], result["wrong_after"], result["fixed"], result["broken"]) == (5, 0, 5, 0)
    assert result["p"] == pytest.approx(2 / 32)
    assert compare_stats.mcnemar([True, False], [False, True])["p"] == 1.0
    assert compare_stats.mcnemar([], [])["p"] == 1.0
    with pytest.raises(ValueError, match="paired"):
        compare_stats.mcnemar([True], [])


def test_shuffle_within_groups_permutes_each_group_and_is_seeded():
    rewards = torch.arange(12, dtype=torch.float32).reshape(12, 1)
    out = shuffle_within_groups(rewards, 4, seed=7)
    for g in range(3):
        assert sorted(out[4 * g: 4 * g + 4, 0].tolist()) == list(range(4 * g, 4 * g + 4))
    assert torch.equal(out, shuffle_within_groups(rewards, 4, seed=7))
    seeds = {tuple(shuffle_within_groups(rewards, 4, seed=s)[:, 0].tolist()) for s in range(6)}
    assert len(seeds) > 1 and any(s != tuple(range(12)) for s in seeds)   # it does move rewards


def test_train_command_layers_common_arm_and_seed(tmp_path):
    arm = compare.Arm("b", "configs/tiny_cpu.yaml", {"drafter_loss_weight": 0, "probe_set": "tiny"})
    cmd = compare.train_command(arm, 5, tmp_path / "r", {"tpf_every": 0, "drafter_loss_weight": 1})
    sets = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--set"]
    assert cmd[cmd.index("--config") + 1] == "configs/tiny_cpu.yaml"
    assert sets == ["tpf_every=0", "drafter_loss_weight=0", "probe_set=tiny", "seed=5", f"output_dir={tmp_path / 'r'}"]


def test_finished_runs_are_skipped_and_interrupted_ones_restart(tmp_path, monkeypatch):
    from grpo.outputs import mark
    from grpo.evaluation.run_dir import RUN_STAMP

    arm = compare.Arm("a", "configs/tiny_cpu.yaml")
    done = tmp_path / "a" / "seed-1"
    done.mkdir(parents=True)
    (done / compare.EVAL_FILE).write_text(json.dumps([{"tokens": 1}]))
    calls = []
    _on_training(monkeypatch, lambda *a, **k: calls.append(a) or type("R", (), {"returncode": 3}))
    assert compare.run_one(arm, 1, tmp_path, {}, compare.DEFAULT_PROBE, log=lambda _: None) == [{"tokens": 1}]
    assert not calls
    partial = tmp_path / "a" / "seed-2"
    partial.mkdir()
    (partial / "thesis.txt").write_text("the user's")  # not made by train: kept, and the run refused
    with pytest.raises(compare.CompareError, match="was not made by gravity-grpo train; it is kept"):
        compare.run_one(arm, 2, tmp_path, {}, compare.DEFAULT_PROBE, log=lambda _: None)
    assert not calls and (partial / "thesis.txt").read_text() == "the user's"
    (partial / "thesis.txt").unlink()
    mark(partial, RUN_STAMP)  # an interrupted run of train's own: trained again from scratch
    (partial / "stale").write_text("x")
    with pytest.raises(compare.CompareError, match=r"arm a seed 2: training failed \(exit 3\); see its log "):
        compare.run_one(arm, 2, tmp_path, {}, compare.DEFAULT_PROBE, log=lambda _: None)
    assert len(calls) == 1 and not (partial / "stale").exists()


def test_a_start_model_rebuilt_between_runs_is_refused_not_mixed(tmp_path, monkeypatch, capsys):
    """The comparison keeps the digest of its start model from the first run it trains; once the model's files
    change (a built-in name's folder rebuilt in place), the next call is refused before it trains or reports."""
    import shutil

    from safetensors.torch import load_file, save_file

    from grpo.cli import main
    from grpo.model_source import locate

    model = tmp_path / "m"
    shutil.copytree(locate("tiny").folder, model)
    trained = []

    def train(command, **_):
        folder = Path(command[-1].removeprefix("output_dir="))
        (folder / "checkpoint-1").mkdir(parents=True)
        (folder / compare.TRAINED_FILE).write_text("{}")
        trained.append(folder.name)
        return type("R", (), {"returncode": 0})

    _on_training(monkeypatch, train)
    monkeypatch.setattr(compare, "evaluate", lambda model, **probe: [
        {"index": 0, "task": "text", "tokens": 4, "forwards": 2, "reward": 0.5, "ar_equal": True, "text": ""}])
    out, probe = tmp_path / "cmp", tmp_path / "probe.jsonl"
    probe.write_text(json.dumps({"prompt": "p", "target": "t", "task_type": "text"}) + "\n")

    def run(seed):
        return main(["compare", "--arm", "a", "configs/tiny_cpu.yaml", "--arm", "b", "configs/tiny_cpu.yaml",
                     "--set", f"model={model}", "--seeds", str(seed), "--out", str(out), "--probe-set", str(probe)])

    assert run(1) == 0 and trained == ["seed-1", "seed-1"]
    kept = json.loads((out / compare.START_MODELS_FILE).read_text())
    assert list(kept) == [str(model)] and len(kept[str(model)]["sha256"]) == 64
    assert run(2) == 0 and len(trained) == 4   # the same files: the runs go on
    weights = load_file(model / "model.safetensors")
    name = sorted(weights)[0]
    save_file({**weights, name: weights[name] + 1e-3}, model / "model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()
    assert run(3) == 2 and len(trained) == 4
    assert "is not the one this comparison's runs in" in capsys.readouterr().err
    assert json.loads((out / compare.START_MODELS_FILE).read_text()) == kept


def test_error_kinds_count_the_noisy_labels_greedy_writes():
    """Outputs that are the noisy labels err at every decision point they carry; the truth errs at none."""
    import random

    from grpo.synthetic.crops import Example
    from grpo.synthetic.mislabels import MISLABELS, mislabel
    from grpo.synthetic.splits import generate

    rows = generate("tiny-probe", 30)
    noisy = [mislabel(random.Random(i), Example(r["task_type"], r["prompt"].split("\n", 1)[1], r["target"]), 1.0)
             for i, r in enumerate(rows)]
    start = [{"text": e.target} for e in noisy]
    after = {0: [{"text": r["target"]} for r in rows]}
    report = compare.error_kinds(rows, start, after)
    assert set(report["kinds"]) == {f"{t}/{k}" for t in MISLABELS for k in MISLABELS[t]}
    for name, result in report["kinds"].items():
        assert result["wrong_after"] == 0 and result["broken"] == 0, name
        assert result["wrong_before"] >= result["n"] - 2, name   # a dropped last line can take a content point
    assert report["over_generated_after"] == {0: 0} and report["over_generated_start"] > 0
    scored = {"reward": 1.0, "tokens": 4, "forwards": 2, "ar_equal": True}   # a probe that is not built in: no kinds
    summary = compare.summarize([compare.Arm("a", "configs/tiny_cpu.yaml")],
                                {"a": {0: [{**o, **scored} for o in after[0]]}}, [{**o, **scored} for o in start],
                                {"probe_set": "some/folder", "probe_size": 30})
    assert summary["arms"]["a"]["errors"] is None and summary["arms"]["a"]["by_group"] is None


def test_a_finished_training_without_eval_is_only_evaluated(tmp_path, monkeypatch):
    arm = compare.Arm("a", "configs/tiny_cpu.yaml")
    folder = tmp_path / "a" / "seed-4"
    (folder / "checkpoint-40").mkdir(parents=True)
    (folder / "checkpoint-80").mkdir()
    (folder / compare.TRAINED_FILE).write_text("{}")
    _on_training(monkeypatch, lambda *a, **k: pytest.fail("retrained a finished run"))
    seen = []
    monkeypatch.setattr(compare, "evaluate", lambda model, **probe: seen.append(model) or [{"tokens": 2}])
    assert compare.run_one(arm, 4, tmp_path, {}, compare.DEFAULT_PROBE, log=lambda _: None) == [{"tokens": 2}]
    assert seen == [folder / "checkpoint-80"]
    assert json.loads((folder / compare.EVAL_FILE).read_text()) == [{"tokens": 2}]


def test_report_only_pairs_the_finished_seeds_and_writes_the_report(tmp_path, monkeypatch, capsys):
    from grpo.synthetic.splits import generate
    from grpo.cli import main
    from grpo.outputs import mark

    rows = generate("tiny-probe", 6)
    mark(tmp_path, compare.STAMP)  # a comparison folder of compare's own (grpo.outputs), as it leaves one

    def evals(forwards, good):
        return [{"index": i, "task": r["task_type"], "tokens": 12, "forwards": forwards, "ar_equal": True,
                 "truncated": False, "reward": 1.0 if good else 0.5, "text": r["target"] if good else ""}
                for i, r in enumerate(rows)]

    probe = {**compare.DEFAULT_PROBE, "probe_size": 6}
    (tmp_path / compare.probe_named(compare.START_FILE, probe)).write_text(json.dumps(evals(4, False)))
    for arm, forwards in (("a", 4), ("b", 3)):
        for seed in (1, 2):
            folder = tmp_path / arm / f"seed-{seed}"
            folder.mkdir(parents=True)
            (folder / compare.probe_named(compare.EVAL_FILE, probe)).write_text(json.dumps(evals(forwards, True)))
    (tmp_path / "b" / "seed-3").mkdir()            # unfinished in b: left out of the report
    _on_training(monkeypatch, lambda *a, **k: pytest.fail("report-only trained"))
    assert main(["compare", "--arm", "a", "configs/tiny_cpu.yaml", "--arm", "b", "configs/tiny_drafter.yaml",
                 "--seeds", "1", "2", "3", "--out", str(tmp_path), "--probe-size", "6", "--report-only"]) == 0
    report = json.loads((tmp_path / compare.probe_named(compare.REPORT_FILE, probe)).read_text())
    pair = report["arms"]["b"]["vs_reference"]
    assert pair["seeds"] == [1, 2] and pair["tpf_ratio"] == pytest.approx(4 / 3) and pair["tpf_wins"] == 2
    assert report["arms"]["a"]["vs_start"]["reward_diff"] == pytest.approx(0.5)
    assert (tmp_path / compare.probe_named(compare.PLOT_FILE, probe)).stat().st_size > 0
    groups = report["arms"]["a"]["by_group"]           # by task and lines: every prompt moved 0.5 -> 1.0
    tasks = {r["task_type"] for r in rows}
    assert groups["all"]["prompts"] == 6 and set(groups) >= tasks | {"all"}
    assert sum(groups[t]["prompts"] for t in tasks) == 6
    assert sum(g["prompts"] for name, g in groups.items() if "/" in name) == 6
    assert all(g["start"] == pytest.approx(0.5) and g["change"] == pytest.approx(0.5) for g in groups.values())
    printed = capsys.readouterr().out
    assert "decision points wrong" in printed and "by task and lines" in printed   # a built-in synthetic probe
    assert main(["compare", "--arm", "a", "configs/tiny_cpu.yaml", "--arm", "b", "configs/tiny_drafter.yaml",
                 "--seeds", "3", "--out", str(tmp_path), "--report-only"]) == 2


def test_the_default_probe_is_the_reference_recipes_own(tmp_path, monkeypatch):
    """Without probe flags, the final checkpoints are probed as the reference recipe probes its runs: its
    probe_set, probe_size and tpf_max_new_tokens (a GLM-OCR recipe's 352 tokens, not the text demo's 192)."""
    from grpo.cli import main
    from grpo.outputs import mark
    from grpo.synthetic.splits import generate

    rows = generate("tiny-probe", 6)
    reference = tmp_path / "reference.yaml"
    root = Path(__file__).resolve().parents[1]
    reference.write_text(f"extends: {root / 'configs' / 'tiny_cpu.yaml'}\nprobe_size: 6\ntpf_max_new_tokens: 99\n")
    out = tmp_path / "out"
    mark(out, compare.STAMP)
    probe = {**compare.DEFAULT_PROBE, "probe_size": 6, "max_new_tokens": 99}
    evals = [{"index": i, "task": r["task_type"], "tokens": 12, "forwards": 4, "ar_equal": True, "truncated": False,
              "reward": 0.5, "text": ""} for i, r in enumerate(rows)]
    (out / compare.probe_named(compare.START_FILE, probe)).write_text(json.dumps(evals))
    for arm in ("a", "b"):
        (out / arm / "seed-1").mkdir(parents=True)
        (out / arm / "seed-1" / compare.probe_named(compare.EVAL_FILE, probe)).write_text(json.dumps(evals))
    _on_training(monkeypatch, lambda *a, **k: pytest.fail("report-only trained"))
    assert main(["compare", "--arm", "a", str(reference), "--arm", "b", "configs/tiny_drafter.yaml",
                 "--seeds", "1", "--out", str(out), "--report-only"]) == 0
    report = json.loads((out / "compare.tiny-probe-6-99.json").read_text())
    assert report["probe"] == probe


def test_another_probe_reevaluates_finished_runs_into_files_named_after_it(tmp_path, monkeypatch, capsys):
    from grpo.cli import main
    from grpo.outputs import mark
    from grpo.synthetic.splits import generate

    rows = generate("tiny-probe@5", 6)
    mark(tmp_path, compare.STAMP)  # a comparison folder of compare's own (grpo.outputs), as it leaves one
    probe = tmp_path / "my probe.jsonl"
    probe.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for arm in ("a", "b"):
        folder = tmp_path / arm / "seed-1"
        (folder / "checkpoint-80").mkdir(parents=True)
        (folder / compare.TRAINED_FILE).write_text("{}")
        (folder / compare.EVAL_FILE).write_text("[]")          # the default probe's evaluation: kept as it is
    _on_training(monkeypatch, lambda *a, **k: pytest.fail("retrained a finished run"))
    monkeypatch.setattr(compare.RunDir, "read_config", lambda self: {"model": "tiny"})
    seen = []

    def evaluate(model, probe_set, probe_size, max_new_tokens, postprocess="none"):
        seen.append((str(model), probe_set, probe_size))
        forwards = 2 if Path(model).parts[-3:-2] == ("b",) else 3   # arm b's checkpoint drafts better
        return [{"index": i, "task": r["task_type"], "tokens": 9, "forwards": forwards, "ar_equal": True,
                 "truncated": False, "reward": 0.5, "text": r["target"]} for i, r in enumerate(rows)]

    monkeypatch.setattr(compare, "evaluate", evaluate)
    assert main(["compare", "--arm", "a", "configs/tiny_cpu.yaml", "--arm", "b", "configs/tiny_drafter.yaml",
                 "--seeds", "1", "--out", str(tmp_path), "--probe-set", str(probe), "--probe-size", "6"]) == 0
    probe_dict = {"probe_set": str(probe), "probe_size": 6, "max_new_tokens": 192, "postprocess": "none"}
    name = compare.probe_named(compare.EVAL_FILE, probe_dict)
    assert name.startswith("eval.") and name.endswith("my_probe.jsonl-6-192.json") and " " not in name
    assert [s[1:] for s in seen] == [(str(probe), 6)] * 3          # the start model and each arm's last checkpoint
    for arm in ("a", "b"):
        assert (tmp_path / arm / "seed-1" / compare.EVAL_FILE).read_text() == "[]"
        assert len(json.loads((tmp_path / arm / "seed-1" / name).read_text())) == 6
    report = json.loads((tmp_path / compare.probe_named(compare.REPORT_FILE, probe_dict)).read_text())
    assert report["probe"] == probe_dict and report["arms"]["b"]["vs_reference"]["tpf_ratio"] == pytest.approx(1.5)
    assert not (tmp_path / compare.REPORT_FILE).exists()
    out = capsys.readouterr().out
    assert "arms vs a" in out and "decision points" not in out   # not a built-in probe: no error-kind table
    assert compare.probe_named(compare.EVAL_FILE, dict(compare.DEFAULT_PROBE)) == compare.EVAL_FILE


def test_another_scoring_mode_gets_its_own_files():
    """Issue 42: `compare --postprocess gravityocr` re-scores into files named after the mode."""
    from grpo import compare

    default = compare.DEFAULT_PROBE
    assert compare.probe_named(compare.EVAL_FILE, default) == "eval.json"
    assert compare.probe_named(compare.EVAL_FILE, {**default, "postprocess": "gravityocr"}) == \
        "eval.tiny-probe-60-192-gravityocr.json"
    assert compare.probe_named(compare.EVAL_FILE, {**default, "probe_size": 6}) == "eval.tiny-probe-6-192.json"
