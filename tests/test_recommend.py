"""The recommended-models data file and its memory fit (app/catalog/recommended.py, Qt-free)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import tomllib

from app.catalog.recommended import (
    CATALOG,
    Recommendation,
    bits_per_weight,
    fit,
    load_catalog,
    quantization_from_name,
    recommend,
)

REPO = Path(__file__).resolve().parents[1]
SHAPE_KEYS = {"n_layer", "n_embd", "n_ff", "n_head", "n_head_kv", "head_dim", "n_vocab"}


def test_every_entry_states_what_it_knows():
    raw = json.loads(CATALOG.read_text(encoding="utf-8"))["models"]
    assert len(raw) >= 8 and len({m["id"] for m in raw}) == len(raw)
    for m in raw:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", m["repo"]) and m["file"].endswith(".gguf"), m
        assert m["license"] and m["blurb"] and m["params"] > 0
        assert m["size_bytes"] is None or (isinstance(m["size_bytes"], int) and m["size_bytes"] > 0)
        assert SHAPE_KEYS <= set(m["shape"]), m["id"]
        assert "quantization" not in m  # read from the file name, never stated
    names = " ".join(m["name"] for m in raw)
    assert "Llama 3.1" not in names and "Qwen2.5" not in names  # the issue: a generation old
    for current in ("Qwen3 4B Instruct 2507", "Gemma 3 12B", "gpt-oss 20B", "Mistral Small 3.2", "Phi-4-mini"):
        assert current in names


@pytest.mark.parametrize("name,quant", [
    ("Qwen3-4B-Instruct-2507-Q4_K_M.gguf", "Q4_K_M"), ("gpt-oss-20b-mxfp4.gguf", "MXFP4"),
    ("gemma-3-4b-it-q4_0.gguf", "Q4_0"), ("Qwen3-0.6B-Q8_0.gguf", "Q8_0"), ("model.IQ4_XS.gguf", "IQ4_XS"),
    ("m-bf16.gguf", "BF16"), ("x-UD-Q4_K_XL.gguf", "unknown"), ("model-q4km.gguf", "unknown"),
    ("Qwen3-4B-Q4_K_M-imatrix.gguf", "unknown"), ("plain.gguf", "unknown"),
])
def test_quantization_only_from_the_standard_pattern(name: str, quant: str):
    assert quantization_from_name(name) == quant


def test_catalog_quantizations_are_all_read_and_unlisted_sizes_say_estimated():
    cat = load_catalog()
    assert all(r.quantization != "unknown" for r in cat)
    unknown = [r for r in cat if r.size_bytes is None]
    assert unknown and all(r.size_estimated and re.fullmatch(r"about \d+\.\d GiB \(estimated from parameters\)",
                                                             r.size_text()) for r in unknown)
    qwen8 = next(r for r in cat if r.id == "qwen3-8b-q4_k_m")
    assert qwen8.size_text() == "about 4.7 GiB (estimated from parameters)"  # not "≈4.7 GiB (size unknown)"
    known = next(r for r in cat if r.size_bytes)
    assert not known.size_estimated and re.fullmatch(r"\d+\.\d GiB", known.size_text())


def test_unknown_quantization_and_size_is_unknown_not_guessed():
    r = replace(load_catalog()[0], size_bytes=None, file="odd-name.gguf", quantization="unknown")
    assert r.weights_bytes() is None and bits_per_weight("unknown") is None
    judged = fit(r, 64 << 30)
    assert judged.verdict == "unknown" and judged.min_memory_bytes is None
    assert r.size_text() == "size not listed" and "quantization unknown" in judged.label()
    assert judged.fit_text() == "Fit on this machine not known"


def test_fit_per_machine():
    cat = {r.id: r for r in load_catalog()}
    small = fit(cat["gemma-3-1b-it-q4_k_m"], ram_bytes=2_000_000_000)
    assert small.verdict == "fits" and small.where == "CPU"
    big = fit(cat["mistral-small-3.2-24b-instruct-2506-q4_k_m"], ram_bytes=8 << 30)
    assert big.verdict == "won't fit"
    gpu = fit(cat["gpt-oss-20b-mxfp4"], ram_bytes=8 << 30, vram_bytes=24 << 30)
    assert gpu.verdict == "fits" and gpu.where == "GPU"
    assert fit(cat["gpt-oss-20b-mxfp4"], ram_bytes=None).verdict == "unknown"


def test_recommendations_by_machine():
    cat = load_catalog()
    laptop = recommend(cat, ram_bytes=2_000_000_000)
    assert laptop and laptop[0].verdict == "fits" and laptop[0].min_memory_bytes <= 1_600_000_000
    cpu = recommend(cat, ram_bytes=64 << 30)
    assert all((r.weights_bytes() or 0) <= 5_500_000_000 for r in cpu) and cpu[0].verdict == "fits"
    gpu = recommend(cat, ram_bytes=16 << 30, vram_bytes=24 << 30)
    assert gpu[0].where == "GPU" and gpu[0].min_memory_bytes > cpu[0].min_memory_bytes
    tiny = recommend(cat, ram_bytes=100 << 20)
    assert tiny and tiny[0].verdict == "won't fit"


def test_label_names_quantization_size_licence_and_verdict():
    r = fit(next(r for r in load_catalog() if r.id == "llama-3.2-3b-instruct-q4_k_m"), ram_bytes=16 << 30)
    assert r.label().startswith(
        "Llama 3.2 3B Instruct · Q4_K_M · 1.9 GiB · Llama 3.2 Community License · fits on CPU — ")


def test_licences_are_named_in_full():
    licences = {r.license for r in load_catalog()}
    assert licences == {"Apache-2.0", "MIT", "Gemma Terms of Use", "Llama 3.2 Community License"}


def test_for_machine_lists_every_model_those_that_fit_first_too_large_marked():
    from app.catalog.recommended import for_machine

    cat = load_catalog()
    laptop = for_machine(cat, ram_bytes=8 << 30)  # no GPU
    assert {r.id for r in laptop} == {r.id for r in cat}  # every model, not only those that fit
    verdicts = [r.verdict for r in laptop]
    n_fit = verdicts.count("fits")
    assert n_fit >= 4 and verdicts[:n_fit] == ["fits"] * n_fit and set(verdicts[n_fit:]) == {"won't fit"}
    needs = [r.min_memory_bytes for r in laptop]
    assert needs[:n_fit] == sorted(needs[:n_fit], reverse=True)  # the largest that fits first
    assert needs[n_fit:] == sorted(needs[n_fit:])  # the nearest to fitting first
    assert [r.id for r in laptop[:4]] == [r.id for r in recommend(cat, ram_bytes=8 << 30)]
    assert laptop[0].fit_text().startswith("Fits in RAM: needs about ")
    assert laptop[-1].fit_text().startswith("Too large for this machine: needs about ")
    big_cpu = for_machine(cat, ram_bytes=64 << 30)  # fits in RAM, but too slow on a CPU: after the rest
    slow = [r for r in big_cpu if r.slow]
    assert slow and big_cpu[-len(slow):] == slow
    assert all(r.fit_text().startswith("Fits in RAM, but slow without a GPU") for r in slow)
    gpu = for_machine(cat, ram_bytes=16 << 30, vram_bytes=24 << 30)
    assert not any(r.slow for r in gpu) and gpu[0].fit_text().startswith("Fits in GPU memory: needs about ")
    unknown = for_machine(cat, ram_bytes=None)
    assert [r.id for r in unknown] == [r.id for r in cat]  # nothing to judge by: the data file's order


def test_a_recommendation_is_a_value():
    r = Recommendation("id", "n", "r", "f.gguf", 1, 2, "b", "l")
    assert r.verdict == "unknown" and r == Recommendation("id", "n", "r", "f.gguf", 1, 2, "b", "l")


@pytest.mark.model
def test_shape_estimate_matches_the_real_header(bundled_model: Path):
    """The catalog's header-less estimate agrees with the estimate from a real GGUF header (the bundled
    Gemma 3 270M), so a shape in the data file means what the engine will allocate."""
    from app.catalog.gguf import inspect_model
    from app.catalog.memory_estimate import estimate_memory
    from app.protocol.types import LoadSettings

    info = inspect_model(bundled_model)
    r = Recommendation("g", "Gemma 3 270M", "x/y", bundled_model.name, info.size_bytes, None, "b", "Gemma",
                       params=info.parameter_count, quantization="Q4_K_M",
                       shape={"n_layer": info.n_layer, "n_embd": info.n_embd, "n_ff": info.n_ff,
                              "n_head": info.n_head, "n_head_kv": info.n_head_kv, "head_dim": info.head_dim_k,
                              "n_vocab": info.n_vocab})
    ours = fit(r, ram_bytes=64 << 30)
    real = estimate_memory(info, LoadSettings(n_ctx=4096, n_parallel=1), 64 << 30, None, detect_ram=False)
    assert abs(ours.min_memory_bytes - real.ram_bytes) / real.ram_bytes < 0.05, (ours.min_memory_bytes,
                                                                                  real.ram_bytes)


def test_the_data_file_ships_as_package_data():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert "data/*.json" in cfg["tool"]["setuptools"]["package-data"]["app"]
    assert 'collect_data_files("app")' in (REPO / "packaging" / "hearth.spec").read_text(encoding="utf-8")
    assert CATALOG == REPO / "app" / "data" / "recommended_models.json"
