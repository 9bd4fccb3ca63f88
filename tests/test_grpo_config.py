"""The GRPO config: the paper recipe's values, YAML + command-line precedence, cross-field errors."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from grpo.training.config import ConfigError, GravityGRPOConfig, load_config, read_yaml

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "configs" / "gravityocr_grpo.yaml"
TINY = ROOT / "configs" / "tiny_cpu.yaml"


def test_recipe_has_the_paper_values(tmp_path):
    # use_cpu only so that bf16 is accepted on this GPU-less machine; everything else is the file's.
    cfg = load_config(RECIPE, {"output_dir": str(tmp_path), "use_cpu": True})
    assert isinstance(cfg, GravityGRPOConfig)
    # 24 prompts x 28 rollouts = 672 completions per optimizer step on 8 processes
    assert cfg.num_generations == 28
    assert cfg.per_device_train_batch_size * 8 * cfg.gradient_accumulation_steps == 24 * 28
    assert cfg.steps_per_generation == cfg.gradient_accumulation_steps  # one generation batch per step
    assert (cfg.temperature, cfg.top_p, cfg.top_k) == (1.0, 1.0, 0)
    assert cfg.max_completion_length == 8448
    assert cfg.scale_rewards == "group"
    assert cfg.loss_type == "dapo"  # token-level normalisation
    assert (cfg.epsilon, cfg.epsilon_high) == (0.2, 0.28)
    assert cfg.beta == 1e-3
    assert cfg.learning_rate == 3e-6 and cfg.lr_scheduler_type == "cosine"
    assert cfg.optim == "adamw_bnb_8bit"
    assert cfg.bf16 is True
    assert cfg.max_grad_norm == 1.0
    assert cfg.save_steps == 250 and cfg.max_steps == 500
    assert cfg.mask_truncated_completions is True
    assert cfg.vllm_importance_sampling_correction is True
    assert cfg.vllm_importance_sampling_mode == "token_truncate"
    assert cfg.use_vllm is True and cfg.vllm_mode == "colocate"
    assert cfg.model_args.use_peft is False  # full fine-tuning


def test_tiny_config_loads_and_differs_only_in_size(tmp_path):
    cfg = load_config(TINY, {"output_dir": str(tmp_path)})
    recipe = load_config(RECIPE, {"output_dir": str(tmp_path), "use_cpu": True})
    for key in ("epsilon", "epsilon_high", "beta", "loss_type", "temperature", "top_p", "scale_rewards",
                "mask_truncated_completions", "vllm_importance_sampling_mode", "lr_scheduler_type", "use_vllm"):
        assert getattr(cfg, key) == getattr(recipe, key), key
    assert cfg.model == "tiny" and cfg.pool == "tiny" and cfg.probe_set == "tiny-probe"
    assert cfg.bf16 is False
    assert cfg.max_steps // cfg.tpf_every + 1 >= 3  # the demo measures TPF at >= 3 points


def test_command_line_overrides_yaml(tmp_path):
    from grpo.commands import train

    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(["--config", str(TINY), "--max-steps", "7", "--model", "some/ckpt",
                              "--output-dir", str(tmp_path), "--set", "beta=0.01", "--set", "use_peft=true"])
    cfg = load_config(args.config, train.overrides(args))
    assert (cfg.max_steps, cfg.model, cfg.output_dir, cfg.beta, cfg.model_args.use_peft) == (7, "some/ckpt", str(tmp_path),
                                                                                   0.01, True)
    assert cfg.tpf_every == read_yaml(TINY)["tpf_every"]  # untouched keys keep the file's value
    assert args.resume is None
    assert parser.parse_args(["--resume"]).resume is True
    assert parser.parse_args(["--resume", "run/checkpoint-20"]).resume == "run/checkpoint-20"


def test_unknown_key_names_file_and_suggests(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tpf_evry: 5\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: unknown config key 'tpf_evry' \(did you mean tpf_every"):
        load_config(bad)
    with pytest.raises(ConfigError, match="command line: unknown config key 'max_step'"):
        load_config(None, {"max_step": 3})


def test_malformed_yaml(tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("values, message", [
    ({"tpf_floor": 1.5}, r"relative drop in \(0, 1\)"),
    ({"tpf_floor": 0.1, "tpf_every": 0}, "tpf_floor needs the TPF probe"),
    ({"tpf_floor_action": "stop"}, "needs tpf_floor"),
    ({"tpf_floor_action": "halt", "tpf_floor": 0.1}, "must be one of"),
    ({"tpf_every": -1}, r"tpf_every must be an integer in \[0, 10000000\]"),
    ({"probe_size": 0}, r"probe_size must be an integer in \[1, 100000\]"),
    ({"cpu_threads": 0}, r"cpu_threads must be an integer in \[1, 4096\]"),
    ({"load_in_4bit": True}, "set use_peft: true"),
    ({"use_peft": True, "lora_r": 0}, r"lora_r must be an integer in \[1, 65536\], got 0"),
    ({"num_generations": 3, "per_device_train_batch_size": 8}, "divisible by num_generations"),  # TRL's own check
    ({"vllm_self_speculation": True}, "set use_vllm: true and vllm_mode: colocate"),
    ({"vllm_self_speculation": True, "use_vllm": True, "min_p": 0.05}, "refuses min_p and logit_bias"),
    ({"vllm_draft_length": 5}, "needs vllm_self_speculation: true"),
    ({"vllm_fixed_drafting": True}, "vllm_fixed_drafting needs vllm_self_speculation: true"),
    ({"vllm_step_cost": [0.07, 3.3, 0.1, 0.08]}, "vllm_step_cost sets the adaptive draft slots: it needs "
                                                 "vllm_self_speculation: true and vllm_fixed_drafting: false"),
    ({"vllm_self_speculation": True, "use_vllm": True, "vllm_fixed_drafting": True, "vllm_draft_acceptance": [0.9]},
     "vllm_draft_acceptance sets the adaptive draft slots"),
    ({"vllm_self_speculation": True, "use_vllm": True,
      "vllm_draft_acceptance": [0.9, 1.2]}, r"vllm_draft_acceptance must be a non-empty list of shares in \[0, 1\]"),
    ({"vllm_self_speculation": True, "use_vllm": True,
      "vllm_step_cost": [0.07, 3.3, 0.1]}, r"vllm_step_cost must be 4 numbers > 0"),
    ({"vllm_self_speculation": True, "use_vllm": True, "vllm_enable_sleep_mode": True}, "vllm_enable_sleep_mode"),
])
def test_cross_field_errors(tmp_path, values, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, {"output_dir": str(tmp_path), "use_cpu": True, **values})


def test_peft_config_follows_fields(tmp_path):
    cfg = load_config(None, {"output_dir": str(tmp_path), "use_cpu": True, "use_peft": True, "lora_r": 4,
                             "lora_alpha": 8, "lora_target_modules": ["q_proj", "v_proj"]})
    lora = cfg.peft_config()
    assert (lora.r, lora.lora_alpha, set(lora.target_modules)) == (4, 8, {"q_proj", "v_proj"})
    assert load_config(None, {"output_dir": str(tmp_path), "use_cpu": True}).peft_config() is None


@pytest.mark.parametrize("name, per_device", [("zero3.yaml", None), ("zero3_multinode.yaml", 6)])
def test_accelerate_configs_give_672_completions_per_step(name, per_device):
    """Each launch config, with the batch size its header names, keeps 24 prompts x 28 rollouts per step."""
    from accelerate.commands.config.config_args import load_config_from_file

    launch = load_config_from_file(str(ROOT / "configs" / "accelerate" / name))
    assert launch.distributed_type == "DEEPSPEED" and launch.deepspeed_config["zero_stage"] == 3
    assert launch.mixed_precision == "bf16"
    recipe = read_yaml(RECIPE)  # raw values: GRPOConfig's own batch checks see this 1-process machine
    if per_device:
        recipe["per_device_train_batch_size"] = per_device
        assert f"per_device_train_batch_size={per_device}" in (ROOT / "configs" / "accelerate" / name).read_text()
    completions = launch.num_processes * recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"]
    assert completions == 24 * recipe["num_generations"] == 24 * 28


def _bad_value(action, annotated: set) -> object:
    """A value no run accepts for a field parsed by `action`: outside its choices, past every bound, not a
    number, or of another type; None where no value of the YAML kinds is refused by type."""
    kind = getattr(action.type, "__name__", "")
    if action.choices is not None or kind == "string_to_bool":
        return "not-a-choice"
    if action.nargs in ("+", "*"):
        return None if dict in annotated else {"a": 1}
    if action.type is int:
        return 10**12
    if action.type is float:
        return float("nan")
    return None if {dict, list} & annotated else {"a": 1}  # a map where a string (or a choice) stands


def test_every_field_with_a_bad_value_is_refused_alike_by_the_dry_run_and_the_run(tmp_path, capsys):
    """One recipe sets every config field to a bad value: the dry run lists a problem naming each field, and
    the run (refusing before it loads anything) lists the same lines."""
    import yaml

    from grpo.cli import main
    from grpo.training.config import fields

    keys = fields()
    bad = {name: _bad_value(action, keys.annotated.get(name, set())) for name, action in keys.actions.items()}
    # maps (or lists) handed on to the libraries as they are: any map passes; report_to is checked as installed
    free = {name for name, value in bad.items() if value is None}
    assert free == {"accelerator_config", "chat_template_kwargs", "deepspeed", "fsdp_config", "generation_kwargs",
                    "gradient_checkpointing_kwargs", "liger_kernel_config", "lr_scheduler_kwargs",
                    "model_init_kwargs", "optim_target_modules", "report_to", "transformers_continuous_batching_config"}
    recipe = tmp_path / "every_field.yaml"
    recipe.write_text(yaml.safe_dump({k: v for k, v in bad.items() if v is not None}))
    out = tmp_path / "out"

    def problems(*flags: str) -> list[str]:
        assert main(["train", "--config", str(recipe), "--output-dir", str(out), *flags]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.startswith("error: the run would not start"), err[:2000]
        return [line.removeprefix("  - ") for line in err.splitlines()[1:]]

    dry, run = problems("--dry-run"), problems()
    assert run and set(run) <= set(dry), sorted(set(run) - set(dry))
    assert [p for p in dry if p in run] == run  # the same lines, in the same order
    unnamed = [name for name, value in bad.items() if value is not None
               and not any(f": {name} must" in p or f"key {name!r}" in p for p in run)]
    assert not unnamed, (unnamed, run)
    assert not out.exists()
