"""The steps of the GPU check; one runs per process: `python3 -m grpo.gpu_check.steps NAME --device cuda --work DIR`.

A step fills `run.figures` and raises `StepFailed` when a check fails; what it measured before is reported
either way, in `DIR/NAME.json`. Steps that run the package do it as a user would, `python3 -m grpo.cli ...`
from the checkout, so these runs are the commands docs/gpu.md shows. Heavy imports stay inside the steps:
the runner imports this module with the standard library alone.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

VLM_DATA = {"model": "tiny-vlm", "pool": "tiny-vlm", "probe_set": "tiny-vlm-probe"}  # built-in names (grpo.builtin)
# CUDA fp32 against CPU fp32, TF32 off: only the order of summation differs (the tiny GLM-OCR's logits are O(1))
FP32_LOGIT_TOL = 1e-3
# Per device: steps run at once (tiny models leave the H200 mostly idle; 2 CPU cores do not) and the seconds
# one step may take before it is killed (a hang must not eat the lease: ~4 minutes in all on one H200).
SETTINGS = {"cuda": {"jobs": 4, "timeout": 150}, "cpu": {"jobs": 1, "timeout": 900}}


class StepFailed(Exception):
    """A check of a step did not hold; the message says which."""


@dataclass
class Run:
    """One step's run: its device, its work folder and the figures it reports."""

    name: str
    device: str
    work: Path
    figures: dict = field(default_factory=dict)

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            raise StepFailed(message)

    def cli(self, *argv: str) -> None:
        """`python3 -m grpo.cli ARGV` from the work folder; its output goes to this step's log."""
        print("$ python3 -m grpo.cli " + " ".join(argv), flush=True)
        code = subprocess.run([sys.executable, "-m", "grpo.cli", *argv], cwd=self.work).returncode
        self.check(code == 0, f"`gravity-grpo {argv[0]}` exited with {code} (the log says why)")

    def train(self, config: str, name: str | None = None, resume: bool = False, **values) -> Path:
        """`gravity-grpo train` of the shipped recipe `config` through TRL's own generation (no vLLM), bf16, gradient
        checkpointing, with `values` on top; its output folder."""
        out = self.work / (name or self.name)
        values = {"use_vllm": False, "bf16": True, "gradient_checkpointing": True, "use_cpu": self.device == "cpu",
                  "output_dir": str(out), "report_to": "none", **values}
        sets = [arg for key, value in values.items() for arg in ("--set", f"{key}={json.dumps(value)}")]
        self.cli("train", "--config", config, *sets, *(["--resume"] if resume else []))
        return out

    def history(self, out: Path, steps: int, probes: bool) -> None:
        """Figures of a run folder; checks: steps 1..`steps` logged once each with a finite loss, the probe at
        every step from 0 (when `probes`), the last checkpoint saved."""
        from grpo.evaluation.run_dir import DRIFT_JSONL, RunDir

        run = RunDir(out)
        trained = [e for e in run.read_metrics() if "reward" in e]
        self.figures.update({key: [e.get(key) for e in trained] for key in ("step", "reward", "loss", "grad_norm")})
        self.check(self.figures["step"] == list(range(1, steps + 1)), f"steps logged {self.figures['step']}")
        self.check(all(math.isfinite(e["loss"]) for e in trained), f"loss {self.figures['loss']}")
        if probes:
            drift = [json.loads(line) for line in run.file(DRIFT_JSONL).read_text().splitlines()]
            self.figures["probe"] = {d["step"]: {"tpf": d["tpf"], "ar_equal_rate": d.get("ar_equal_rate")}
                                     for d in drift}
            self.check(sorted(self.figures["probe"]) == list(range(steps + 1)),
                       f"probes at {sorted(self.figures['probe'])}")
        self.check((out / f"checkpoint-{steps}").is_dir(), f"no checkpoint-{steps} in {out}")


def environment(run: Run) -> None:
    """Versions, the device, bf16, and where the carried packages were imported from."""
    import importlib
    import platform

    import torch

    run.figures["python"] = platform.python_version()
    for name in ("torch", "transformers", "trl", "datasets", "accelerate", "peft", "numpy", "numba", "rapidfuzz",
                 "pylatexenc", "ocr_rewards", "grpo"):
        module = importlib.import_module(name)
        run.figures[name] = {"version": getattr(module, "__version__", None), "from": str(Path(module.__file__).parent)}
    run.figures["cuda"] = torch.version.cuda
    if run.device == "cuda":
        run.check(torch.cuda.is_available(), "torch sees no CUDA device")
        props = torch.cuda.get_device_properties(0)
        run.figures.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                           memory_gib=round(props.total_memory / 2**30, 1), bf16=torch.cuda.is_bf16_supported())
        run.check(run.figures["bf16"], "the GPU does not support bf16")
    from grpo.cli import build_parser

    build_parser(["train"])  # the CLI builds its flags from TRL's config classes


def vlm_forward(run: Run) -> None:
    """The tiny GLM-OCR with an image: logits on the device in fp32 and bf16 against CPU fp32."""
    import torch

    from grpo.checkpoint import load_checkpoint
    from grpo.pool import load_pool
    from grpo.prompting import encode_prompt

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32 here
    ckpt = load_checkpoint(VLM_DATA["model"])
    inputs = encode_prompt(ckpt.processor, load_pool(VLM_DATA["probe_set"])[0], is_vlm=True)
    inputs.pop("token_type_ids", None)
    with torch.inference_mode():
        reference = ckpt.model(**inputs).logits[0].float()  # (tokens, vocab)
        for dtype in (torch.float32, torch.bfloat16):
            model = ckpt.model.to(run.device, dtype)
            moved = {k: v.to(run.device, dtype) if v.is_floating_point() else v.to(run.device) for k, v in inputs.items()}
            logits = model(**moved).logits[0].float().cpu()
            run.figures[str(dtype).removeprefix("torch.")] = {
                "max_logit_diff": float((logits - reference).abs().max()),
                "argmax_equal": float((logits.argmax(-1) == reference.argmax(-1)).float().mean())}
    run.figures.update(tokens=reference.shape[0], max_abs_logit=float(reference.abs().max()),
                       image_tokens=int((inputs["input_ids"] == ckpt.model.config.image_token_id).sum()))
    run.check(run.figures["image_tokens"] > 0, "the prompt holds no image tokens")
    run.check(run.figures["float32"]["max_logit_diff"] <= FP32_LOGIT_TOL,
              f"fp32 logits differ from CPU fp32 by {run.figures['float32']['max_logit_diff']:.2e} (> {FP32_LOGIT_TOL})")


def _tpf(run: Run, model: str, pool: str, limit: int, max_new_tokens: int) -> None:
    """`gravity-grpo tpf --compare-ar` in fp32 (output must equal AR greedy) and in bf16 (reported)."""
    for dtype in ("float32", "bfloat16"):
        out = run.work / f"{run.name}-{dtype}.json"
        run.cli("tpf", "--model", model, "--pool", pool, "--limit", str(limit), "--max-new-tokens", str(max_new_tokens),
                "--compare-ar", "--dtype", dtype, "--device", run.device, "--out", str(out))
        stats = json.loads(out.read_text())
        run.figures[dtype] = {k: stats[k] for k in ("n", "tpf", "accepted_per_round", "ar_equal_rate", "wall_s")}
        if dtype == "float32":
            run.check(stats["ar_equal_rate"] == 1.0, f"fp32: {stats['ar_equal_rate']:.1%} of outputs equal AR greedy")


def tpf_tiny_default(run: Run) -> None:
    """`tpf --compare-ar` on the tiny default: fp32 100% AR-equal, bf16 reported."""
    _tpf(run, "tiny", "tiny-probe", limit=24, max_new_tokens=128)


def tpf_tiny_glm_ocr(run: Run) -> None:
    """`tpf --compare-ar` on the tiny GLM-OCR with images: fp32 100% AR-equal, bf16 reported."""
    _tpf(run, VLM_DATA["model"], VLM_DATA["probe_set"], limit=6, max_new_tokens=16)


# The tiny default's demo recipe with a smaller probe: its 60 prompts x 192 tokens are sized for a curve
TEXT_PROBE = {"probe_size": 12, "tpf_max_new_tokens": 96, "tpf_compare_ar": "always"}


def grpo_tiny_default(run: Run) -> None:
    """GRPO without vLLM on the tiny default: bf16, gradient checkpointing, 2 steps, probe at steps 0-2."""
    run.history(run.train("tiny_cpu", max_steps=2, save_steps=2, tpf_every=1, **TEXT_PROBE), 2, probes=True)


def grpo_tiny_glm_ocr(run: Run) -> None:
    """GRPO without vLLM on the tiny GLM-OCR with images: bf16, gradient checkpointing, 2 steps, probe 0-2."""
    run.history(run.train("tiny_vlm_smoke", max_steps=2, save_steps=2, tpf_every=1, **VLM_DATA), 2, probes=True)


def selfspec_rollouts(run: Run) -> None:
    """GRPO whose rollouts come from the self-speculative sampler (rollout_decoder selfspec), bf16, 1 step."""
    run.history(run.train("tiny_cpu", rollout_decoder="selfspec", max_steps=1, save_steps=1, tpf_every=0),
                1, probes=False)


def drafter_loss_bf16(run: Run) -> None:
    """GRPO with the drafter loss (weight 1) in bf16, 1 step: the loss and its gradient are finite."""
    out = run.train("tiny_cpu", drafter_loss_weight=1.0, max_steps=1, save_steps=1, tpf_every=0)
    run.history(out, 1, probes=False)
    from grpo.evaluation.run_dir import RunDir

    logged = next(e for e in RunDir(out).read_metrics() if "reward" in e)
    run.figures.update({k: logged.get(k) for k in ("drafter/loss", "drafter/grad_norm", "grpo/grad_norm")})
    run.check(all(isinstance(run.figures[k], float) and math.isfinite(run.figures[k]) and run.figures[k] > 0
                  for k in ("drafter/loss", "drafter/grad_norm")), "drafter loss or its gradient not finite and > 0")


def lora(run: Run) -> None:
    """LoRA GRPO on the tiny GLM-OCR with images (the probe decodes through peft's wrappers), 2 steps."""
    out = run.train("tiny_vlm_smoke", use_peft=True, lora_r=8, lora_alpha=16, lora_dropout=0.0, max_steps=2,
                    save_steps=2, tpf_every=1, **VLM_DATA)
    run.history(out, 2, probes=True)


def checkpoint_resume(run: Run) -> None:
    """A saved GLM-OCR checkpoint reloads with its processor and drafter metadata; `--resume` continues it."""
    from grpo.checkpoint import load_checkpoint

    values = dict(save_steps=1, tpf_every=0, **VLM_DATA)
    out = run.train("tiny_vlm_smoke", max_steps=1, **values)
    ckpt = load_checkpoint(out / "checkpoint-1", need_drafter=True)
    run.figures.update(is_vlm=ckpt.is_vlm, processor=type(ckpt.processor).__name__, bd_size=ckpt.bd.bd_size,
                       mask_id=ckpt.bd.mask_id)
    run.check(ckpt.is_vlm and run.figures["processor"] == "Glm46VProcessor", f"reloaded as {run.figures}")
    run.train("tiny_vlm_smoke", resume=True, max_steps=2, **values)
    run.history(out, 2, probes=False)
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    run.figures["resumed_global_step"] = state["global_step"]
    run.check(state["global_step"] == 2, f"global_step {state['global_step']} after resuming")


def speed_table(run: Run) -> None:
    """AR decode step and self-speculative round (draft + verify, B=32) at GLM-OCR's size, bf16, by batch."""
    from grpo.gpu_check.speed import speed_table as measure

    run.figures.update(measure(run.device))


STEPS = {step.__name__: step for step in (
    environment, vlm_forward, tpf_tiny_default, tpf_tiny_glm_ocr, grpo_tiny_default, grpo_tiny_glm_ocr,
    selfspec_rollouts, drafter_loss_bf16, lora, checkpoint_resume, speed_table)}
ALONE = frozenset({"speed_table"})  # timings: run after the others, with nothing beside them


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one step of the GPU check")
    parser.add_argument("name", choices=tuple(STEPS))
    parser.add_argument("--device", choices=tuple(SETTINGS), required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args(argv)
    run, error = Run(args.name, args.device, args.work), None
    try:
        STEPS[args.name](run)
    except StepFailed as err:
        error = str(err)
    except Exception as err:  # noqa: BLE001 - the report says what broke; the traceback is in the log
        traceback.print_exc()
        error = f"{type(err).__name__}: {err}"
    (args.work / f"{args.name}.json").write_text(json.dumps({"figures": run.figures, "error": error}, indent=2) + "\n")
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
