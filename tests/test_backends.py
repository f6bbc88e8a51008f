"""GPU backends are build configurations: checked here by their configuration (no GPU on this machine)."""

from __future__ import annotations

import inspect
import subprocess
from pathlib import Path

import pytest

from app.engine.local.runtime import GGML_TYPES, llama_kwargs
from app.protocol.types import LoadSettings

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "packaging" / "llama_cmake_args.sh"


def cmake_args(backend: str, portable: str = "0") -> str:
    return subprocess.run(["sh", str(SCRIPT), backend, portable], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_cuda_and_metal_flags():
    assert "-DGGML_CUDA=on" in cmake_args("cuda").split()
    assert cmake_args("metal") == "-DGGML_METAL=on"
    assert "-DGGML_CUDA=on" not in cmake_args("cpu")


def test_cpu_builds_never_use_amx_or_native_on_x86():
    for portable in ("0", "1"):
        args = cmake_args("cpu", portable).split()
        if "-DGGML_NATIVE=ON" in args:  # not x86-64: native has no AMX there
            continue
        assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AMX_INT8=OFF" in args
    assert "-DGGML_AVX2=ON" in cmake_args("cpu", "1").split() or "-DGGML_NATIVE=ON" in cmake_args("cpu", "1")


def test_unknown_backend_is_refused():
    r = subprocess.run(["sh", str(SCRIPT), "rocm"], capture_output=True, text=True)
    assert r.returncode != 0 and "unknown backend" in r.stderr


@pytest.mark.parametrize("backend,flag", [("cuda", "-DGGML_CUDA=on"), ("metal", "-DGGML_METAL=on")])
def test_make_passes_backend_cmake_args(backend, flag):
    out = subprocess.run(["make", "-s", "print-backend", f"BACKEND={backend}"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert f"backend={backend}" in out and flag in out


def test_make_rejects_unknown_backend():
    r = subprocess.run(["make", "-s", "print-backend", "BACKEND=vulkan"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode != 0 and "BACKEND must be" in r.stderr


def test_load_settings_reach_llama_under_their_real_names():
    import llama_cpp

    params = inspect.signature(llama_cpp.Llama.__init__).parameters
    kw = llama_kwargs(LoadSettings(n_gpu_layers=-1, offload_kqv=False, type_k="q8_0", type_v="q4_0",
                                   flash_attn=True, n_threads=3))
    assert set(kw) <= set(params), set(kw) - set(params)  # Llama() silently ignores unknown names
    assert kw["n_gpu_layers"] == -1 and kw["offload_kqv"] is False
    assert (kw["type_k"], kw["type_v"]) == (GGML_TYPES["q8_0"], GGML_TYPES["q4_0"])
    assert kw["n_threads"] == kw["n_threads_batch"] == 3 and kw["logits_all"] is False


def test_ggml_type_ids_match_the_library():
    import llama_cpp

    assert GGML_TYPES == {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0,
                          "q4_0": llama_cpp.GGML_TYPE_Q4_0}
