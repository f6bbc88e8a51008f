"""Memory estimates: KV cache sizes as llama.cpp allocates them, GPU split, verdicts, memory probes.

Reference numbers come from llama.cpp's own load log for the bundled Gemma 3 270M Q4_K_M (llama-cpp-python
0.3.36, this machine):
  n_ctx 4096 f16 swa_full=True : non-SWA 4096 cells 3 layers 12.00 MiB; SWA 4096 cells 15 layers 60.00 MiB
  n_ctx 4096 f16 swa_full=False: SWA 1024 cells 15.00 MiB;   n_ctx 1000 swa_full=False: 1024 + 1024 cells
  plain context: compute buffer 514.50 MiB at n_ubatch 512, 128.63 MiB at n_ubatch 128; output buffer 1.00 MiB
  the engine's context (n_outputs_max = logit_rows): 45.87 MiB at n_ubatch 256 and 4 sequences, 45.36 at 512
  and 4, 25.77 at 512 and 1, 51.54 at 1024 and 4; output buffer 1.00 MiB per sequence
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from app.catalog import memory_estimate as me
from app.catalog.gguf import ModelInfo, inspect_model
from app.catalog.memory_estimate import estimate_memory, kv_bytes_per_element
from app.errors import InvalidRequest
from app.protocol.types import LoadSettings

MiB = 1 << 20
GiB = 1 << 30


_A, _B = 3_995_648, 3_596_288  # bytes of the two block layouts (mixed Q5_0 / Q4_K / Q6_K / Q8_0)
_LAYER_BYTES = (_A, _A, _B, _B, _A, _B, _B, _A, _B, _B, _A, _B, _B, _A, _B, _A, _A, _A)


def gemma_like(**changes) -> ModelInfo:
    """A ModelInfo with the bundled model's numbers (no file needed)."""
    swa = tuple(il % 6 < 5 for il in range(18))
    info = ModelInfo(
        path="/x/gemma.gguf", file_name="gemma.gguf", size_bytes=253_113_024, architecture="gemma3",
        name="Gemma 3 270m", general_type="model", gguf_version=3, parameter_count=268_098_176,
        tensor_count=236, tensor_bytes=246_587_904, file_type=15, quantization="Q4_K_M", n_layer=18,
        n_embd=640, n_ff=2048, n_head=4, n_head_kv=1, head_dim_k=256, head_dim_v=256, sliding_window=512,
        swa_pattern=6, swa_layers=swa, context_length=32768, n_vocab=262144, chat_template=None,
        bos_token_id=2, eos_token_id=1, pooling_type=None, is_embedding_model=False,
        layer_bytes=_LAYER_BYTES, output_bytes=2560, output_tied=True, token_embd_bytes=178_257_920,
    )
    return replace(info, **changes)


def test_bytes_per_element() -> None:
    assert kv_bytes_per_element("f16") == 2.0
    assert kv_bytes_per_element("q8_0") == 34 / 32
    assert kv_bytes_per_element("q4_0") == 18 / 32


@pytest.mark.parametrize("kv_type, per_token, state_per_token", [
    ("f16", 18_432, 18_458), ("q8_0", 9_792, 9_818), ("q4_0", 5_184, 5_210)])
def test_kv_per_token_matches_measured_state(kv_type: str, per_token: int, state_per_token: int) -> None:
    s = LoadSettings(type_k=kv_type, type_v=kv_type, flash_attn=True)
    est = estimate_memory(gemma_like(), s, available_ram_bytes=8 * GiB)
    assert est.kv_bytes_per_token == per_token  # 18 layers × 1 KV head × 256 dims × (K + V)
    # llama_state_get_size adds ~26 bytes of per-cell metadata (docs/llama-cpp-notes.md)
    assert 0 < state_per_token - est.kv_bytes_per_token < 0.01 * state_per_token


def test_kv_swa_full_matches_llama_cpp() -> None:
    est = estimate_memory(gemma_like(), LoadSettings(n_ctx=4096, swa_full=True), available_ram_bytes=8 * GiB)
    assert (est.kv_cells, est.swa_cells, est.n_swa_layers) == (4096, 4096, 15)
    assert est.kv_bytes == 72 * MiB and est.kv_k_bytes == est.kv_v_bytes == 36 * MiB


def test_kv_window_only_matches_llama_cpp() -> None:
    est = estimate_memory(gemma_like(), LoadSettings(n_ctx=4096, swa_full=False, n_ubatch=512),
                          available_ram_bytes=8 * GiB)
    assert (est.kv_cells, est.swa_cells) == (4096, 1024)  # GGML_PAD(min(4096, 512 + 512), 256)
    assert est.kv_bytes == 12 * MiB + 15 * MiB
    assert any("swa_full=False" in n for n in est.notes)


def test_n_ctx_is_padded_to_256() -> None:
    est = estimate_memory(gemma_like(), LoadSettings(n_ctx=1000, swa_full=False, n_ubatch=512),
                          available_ram_bytes=8 * GiB)
    assert (est.kv_cells, est.swa_cells) == (1024, 1024)
    assert est.kv_bytes == 3 * MiB + 15 * MiB


def test_quantized_kv() -> None:
    s = LoadSettings(type_k="q8_0", type_v="q4_0", flash_attn=True)
    est = estimate_memory(gemma_like(), s, available_ram_bytes=8 * GiB)
    assert est.kv_k_bytes == int(18 * 4096 * 256 * 34 / 32)
    assert est.kv_v_bytes == int(18 * 4096 * 256 * 18 / 32)


def test_compute_buffer_close_to_measured() -> None:
    """The engine's own context (logit rows reserved for what one decode asks for, ``logit_rows``), as
    llama.cpp's load log gave it for the bundled model at n_ctx 4096 (compute buffer + 1 MiB output buffer per
    sequence)."""
    for n_ubatch, n_parallel, measured in ((256, 4, 45.87), (512, 4, 45.36), (512, 1, 25.77), (1024, 4, 51.54)):
        s = LoadSettings(n_ubatch=n_ubatch, n_parallel=n_parallel)
        got = estimate_memory(gemma_like(), s, available_ram_bytes=8 * GiB).compute_bytes / MiB - n_parallel
        assert 0.95 * measured <= got <= measured * 1.3, (n_ubatch, n_parallel, got)


def test_total_and_verdicts() -> None:
    info, s = gemma_like(), LoadSettings()
    total = estimate_memory(info, s, available_ram_bytes=64 * GiB).total_bytes
    assert total == info.tensor_bytes + 72 * MiB + me.compute_buffer_bytes(info, s) + me.OVERHEAD_BYTES
    assert estimate_memory(info, s, available_ram_bytes=int(total / 0.8)).verdict == "fits"
    assert estimate_memory(info, s, available_ram_bytes=int(total / 0.8) - 1).verdict == "tight"
    assert estimate_memory(info, s, available_ram_bytes=total).verdict == "tight"
    assert estimate_memory(info, s, available_ram_bytes=total - 1).verdict == "won't fit"
    assert estimate_memory(info, s, detect_ram=False).verdict == "unknown"


def test_gpu_offload_split() -> None:
    info = gemma_like()
    full = estimate_memory(info, LoadSettings(n_gpu_layers=-1), available_ram_bytes=8 * GiB,
                           available_vram_bytes=8 * GiB)
    assert full.gpu_layers == 19  # n_layer + 1 (the output layer)
    # every block + output norm on the GPU, plus the tied head's copy of token_embd
    assert full.weights_gpu_bytes == sum(_LAYER_BYTES) + 2560 + info.token_embd_bytes
    assert full.weights_cpu_bytes == info.tensor_bytes - sum(_LAYER_BYTES) - 2560 == info.token_embd_bytes
    assert full.kv_gpu_bytes == full.kv_bytes and full.vram_bytes > full.ram_bytes
    part = estimate_memory(info, LoadSettings(n_gpu_layers=5), available_ram_bytes=8 * GiB,
                           available_vram_bytes=8 * GiB)
    assert part.weights_gpu_bytes == sum(_LAYER_BYTES[14:]) + 2560 + info.token_embd_bytes  # blocks 14-17 + output
    # blocks 14-16 are SWA, 17 is global: all full-size with swa_full
    assert part.kv_gpu_bytes == 4 * 4096 * 256 * 2 * 2
    tight_gpu = estimate_memory(info, LoadSettings(n_gpu_layers=-1), available_ram_bytes=8 * GiB,
                                available_vram_bytes=full.vram_bytes - 1)
    assert tight_gpu.vram_verdict == "won't fit" and tight_gpu.verdict == "won't fit"


def test_no_vram_figure_counts_all_in_ram() -> None:
    est = estimate_memory(gemma_like(), LoadSettings(n_gpu_layers=-1), available_ram_bytes=8 * GiB)
    assert est.ram_bytes == est.total_bytes and est.vram_bytes == 0 and est.vram_verdict == "unknown"


def test_hybrid_layers_without_kv() -> None:
    info = gemma_like(n_head_kv=(1, 0) * 9, swa_layers=(), sliding_window=None)
    est = estimate_memory(info, LoadSettings(), available_ram_bytes=8 * GiB)
    assert est.kv_bytes == 9 * 4096 * 256 * 2 * 2


def test_embedding_model_has_no_kv() -> None:
    est = estimate_memory(gemma_like(is_embedding_model=True), LoadSettings(), available_ram_bytes=8 * GiB)
    assert est.kv_bytes == 0


def test_unknown_swa_pattern_counts_full_context() -> None:
    info = gemma_like(swa_layers=(), swa_pattern=None)
    est = estimate_memory(info, LoadSettings(swa_full=False), available_ram_bytes=8 * GiB)
    assert est.kv_bytes == 72 * MiB and any("pattern unknown" in n for n in est.notes)


def test_context_above_trained_is_noted() -> None:
    est = estimate_memory(gemma_like(context_length=2048), LoadSettings(n_ctx=4096), available_ram_bytes=GiB)
    assert any("trained context" in n for n in est.notes)


def test_invalid_settings() -> None:
    with pytest.raises(InvalidRequest) as exc_info:
        estimate_memory(gemma_like(), LoadSettings(type_k="q5_1"), available_ram_bytes=GiB)
    assert exc_info.value.param == "type_k"


def test_to_dict_is_json_ready() -> None:
    import json

    d = estimate_memory(gemma_like(), LoadSettings(), available_ram_bytes=GiB).to_dict()
    assert json.loads(json.dumps(d))["kv_bytes"] == 72 * MiB


# ------------------------------------------------------------------------------------ memory probes


def test_detect_available_ram() -> None:
    ram = me.detect_available_ram()
    assert ram is None or ram > 64 * MiB


def test_available_ram_detected_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(me, "detect_available_ram", lambda: 123 * GiB)
    assert estimate_memory(gemma_like(), LoadSettings()).available_ram_bytes == 123 * GiB


def test_vram_none_without_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(me.shutil, "which", lambda name: None)
    assert me.available_vram_bytes() is None


def test_vram_parses_and_never_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(me.shutil, "which", lambda name: "/usr/bin/nvidia-smi")

    def fake_run(out: str | None = None, exc: Exception | None = None):
        def run(*a, **kw):
            if exc:
                raise exc
            return subprocess.CompletedProcess(a, 0, stdout=out, stderr="")
        return run

    monkeypatch.setattr(me.subprocess, "run", fake_run("1000\n2000\n"))
    assert me.available_vram_bytes() == 3000 * MiB
    monkeypatch.setattr(me.subprocess, "run", fake_run("[N/A]\n"))
    assert me.available_vram_bytes() is None
    monkeypatch.setattr(me.subprocess, "run", fake_run(exc=subprocess.TimeoutExpired("nvidia-smi", 3)))
    assert me.available_vram_bytes() is None
    monkeypatch.setattr(me.subprocess, "run", fake_run(exc=FileNotFoundError("nvidia-smi")))
    assert me.available_vram_bytes() is None


@pytest.mark.model
def test_bundled_model_estimate(bundled_model: Path) -> None:
    info = inspect_model(bundled_model)
    assert replace(info, path="/x/gemma.gguf", file_name="gemma.gguf") == gemma_like()
    est = estimate_memory(info, LoadSettings(), available_ram_bytes=8 * GiB)
    assert est.kv_bytes == 72 * MiB and est.verdict == "fits"
