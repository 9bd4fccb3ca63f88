"""One place validates decode settings (issue 53): `DecodeSettings`. The `tpf` command, the probe's settings (a
run's `run_config.json` read back) and a run's config each build one and word its problem with their own name
for the setting: the flag, the config key."""
from __future__ import annotations

import pytest

from grpo.cli import main
from grpo.decoding.presets import PRESETS
from grpo.decoding.tpf import DecodeSettings, DecodeSettingsError
from grpo.evaluation.drift import ProbeSettings
from grpo.training.config import ConfigProblems, load_config
from grpo.yaml_config import ConfigError

# A value out of bounds for each bounded field (`mode` and `preset` are choices of the command's parser).
OUT_OF_BOUNDS = {"max_new_tokens": 0, "bd_size": 0, "batch_size": 0, "temperature": 0.001, "samples": 65,
                 "seed": -1, "tau": 2.0, "image_long_side": "huge"}
PROBE = {"max_new_tokens": 24, "batch_size": 1, "temperature": 1.0, "samples": 1}
# Where a run's config words a bound its own way: its tpf_samples may be 0 (the probe then only decodes greedily).
CONFIG_WORDING = {"samples": "tpf_samples must be an integer in [0, 64] (0: greedy only), got 65"}


def _problem(**fields) -> str:
    with pytest.raises(DecodeSettingsError) as caught:
        DecodeSettings(**fields)
    return str(caught.value)


def _refusals(capsys, tmp_path, field: str, message: str, argv: list[str], config: dict) -> None:
    """`tpf argv` exits 2 with `message` naming the flag of `field`; where a run's config has the field, the
    probe's settings and the run's config refuse `config` with `message` naming its key."""
    flag = "--" + field.replace("_", "-")
    assert main(["tpf", "--pool", "tiny-probe", *argv]) == 2
    assert f"error: {message.replace(field, flag, 1)}\n" in capsys.readouterr().err
    key = ProbeSettings.CONFIG_FIELDS.get(field)
    if key is None:  # a setting of the command alone
        return
    keyed = CONFIG_WORDING.get(field) or message.replace(field, key, 1)
    with pytest.raises(ConfigError) as caught:
        ProbeSettings(**{**PROBE, **{name: config[k] for name, k in ProbeSettings.CONFIG_FIELDS.items()
                                     if k in config}})
    assert str(caught.value) == keyed
    with pytest.raises(ConfigProblems) as caught:
        load_config(None, {"output_dir": str(tmp_path / "run"), "use_cpu": True, **config})
    assert caught.value.problems == [f"config: {keyed}"]


@pytest.mark.parametrize("field, value", OUT_OF_BOUNDS.items())
def test_each_decode_setting_out_of_bounds_gets_one_message_everywhere(capsys, tmp_path, field, value):
    message = _problem(**{field: value})
    assert message.startswith(f"{field} must be ") and message.endswith(f"got {value!r}")
    key = ProbeSettings.CONFIG_FIELDS.get(field)
    _refusals(capsys, tmp_path, field, message, ["--" + field.replace("_", "-"), str(value)],
              {key: value} if key else {})


def test_settings_that_exclude_each_other_get_one_message_everywhere(capsys, tmp_path):
    message = _problem(preset=PRESETS["gravityocr-bench"], batch_size=8)
    assert message == "GravityOCR's round layout decodes at batch 1: batch_size must be 1, got 8"
    _refusals(capsys, tmp_path, "batch_size", message, ["--preset", "gravityocr-bench", "--batch-size", "8"],
              {"tpf_preset": "gravityocr-bench", "tpf_batch_size": 8, "tpf_samples": 0})


def test_every_value_out_of_bounds_is_named_at_once():
    with pytest.raises(DecodeSettingsError) as caught:
        DecodeSettings(max_new_tokens=0, batch_size=0)
    assert caught.value.worded({"max_new_tokens": "--max-new-tokens", "batch_size": "--batch-size"}) == [
        "--max-new-tokens must be an integer in [1, 65536], got 0", "--batch-size must be an integer in [1, 256], got 0"]
