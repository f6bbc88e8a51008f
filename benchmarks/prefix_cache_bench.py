"""Prefix-cache and KV-quantization benchmark (one run, real bundled model unless --model).

1. TTFT for a ~3000-token prompt: cold (fresh engine, empty cache), warm in memory (same engine, same prompt
   again: the live KV prefix is reused) and restored from disk in a new engine process. TTFT: from
   ``Engine.generate`` being called to the first token's arrival at the caller. Target: restored ≤ 0.05 × cold.
2. KV-state bytes per token for f16, q8_0 and q4_0 (size of the saved entry / prompt tokens).
3. Agreement of q8_0 and q4_0 with f16 over 256 greedy tokens: (a) free-running: tokens equal up to the first
   divergence and position-wise; (b) teacher-forced top-1: the f16 text is fed to each KV type and the
   argmax at each position compared (a fairer quality measure, docs/llama-cpp-notes.md).
4. With ``--exactness N``: the exactness sweep of ``benchmarks.cache_exactness`` (N generated prompts per KV
   type, cold vs restored vs live-reused, identical/N per path and TTFT ratios) instead of section 3.
Run: ``hearth bench cache [--exactness N]`` or ``python -m benchmarks.prefix_cache_bench``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

UNIT = ("In the archive of the old harbour town, ledgers recorded every ship that came and went, its cargo, "
        "its captain and the weather on the day it sailed. ")


def _ttft(engine, prompt: str) -> tuple[float, dict, str]:
    from app.protocol.types import DecodingParams, Delta, GenerateRequest

    t0 = time.perf_counter()
    first = None
    done = None
    for ev in engine.generate(GenerateRequest(prompt=prompt, decoding=DecodingParams.make(temperature=0.0,
                                                                                         max_tokens=8))):
        if isinstance(ev, Delta) and first is None:
            first = time.perf_counter()
        elif not isinstance(ev, Delta):
            done = ev
    return first - t0, done.metrics.to_dict(), done.text


def ttft_section(path: str, prompt_tokens: int) -> dict:
    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings

    settings = LoadSettings(n_ctx=4096)
    with tempfile.TemporaryDirectory() as d:
        cfg = {"dir": d, "budget_bytes": 4 << 30}
        with Engine(path, settings, prefix_cache=cfg) as e:
            unit = len(e.tokenize(UNIT))
            prompt = UNIT * max(1, prompt_tokens // unit)
            cold, mc, cold_text = _ttft(e, prompt)
            warm, mw, _ = _ttft(e, prompt)
            stats = e.cache_stats()
        with Engine(path, settings, prefix_cache=cfg) as e2:
            restored, mr, restored_text = _ttft(e2, prompt)
    return {"prompt_tokens": mc["prompt_tokens"], "cold_ttft_s": cold, "warm_memory_ttft_s": warm,
            "restored_disk_ttft_s": restored, "restore_s": mr["restore_s"], "restored_cached_tokens":
            mr["cached_tokens"], "restored_source": mr["cache_source"], "ratio_restored_over_cold": restored / cold,
            "ratio_warm_over_cold": warm / cold, "entry_bytes": stats["bytes_on_disk"],
            "restored_equals_cold": restored_text == cold_text}


def kv_sections(path: str, gen_tokens: int) -> dict:
    import llama_cpp
    import numpy as np

    from app.engine.local.prefix_cache import PrefixCache
    from app.engine.local.runtime import GGML_TYPES

    prompt = UNIT * 4 + "The ledger for the winter of that year"
    out: dict = {"bytes_per_token": {}, "agreement_vs_f16": {}}
    llms = {}
    for kv in ("f16", "q8_0", "q4_0"):
        llms[kv] = llama_cpp.Llama(path, n_ctx=2048, flash_attn=True, type_k=GGML_TYPES[kv], type_v=GGML_TYPES[kv],
                                   swa_full=True, logits_all=False, verbose=False)
    toks = llms["f16"].tokenize(prompt.encode(), add_bos=True)

    class _RT:  # what PrefixCache._get_state reads of a runtime: one sequence
        def __init__(self, llm):
            self.ctx, self.n_slots = llm._ctx.ctx, 1

    greedy: dict[str, list[int]] = {}
    for kv, llm in llms.items():
        llm.reset()
        llm.eval(toks)
        out["bytes_per_token"][kv] = len(PrefixCache._get_state(_RT(llm), None)) / len(toks)
        seq = []
        for _ in range(gen_tokens):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))
            t = int(np.argmax(logits))
            seq.append(t)
            llm.eval([t])
        greedy[kv] = seq
    ref = greedy["f16"]
    for kv in ("q8_0", "q4_0"):
        seq = greedy[kv]
        first_div = next((i for i, (a, b) in enumerate(zip(ref, seq)) if a != b), len(ref))
        llm = llms[kv]
        llm.reset()
        llm.eval(toks)
        forced_same = 0
        for t in ref:
            logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))
            forced_same += int(np.argmax(logits)) == t
            llm.eval([t])
        out["agreement_vs_f16"][kv] = {
            "greedy_identical_prefix_tokens": first_div,
            "greedy_positionwise": sum(a == b for a, b in zip(ref, seq)) / len(ref),
            "teacher_forced_top1": forced_same / len(ref)}
    out["gen_tokens"] = gen_tokens
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--prompt-tokens", type=int, default=3000)
    p.add_argument("--gen-tokens", type=int, default=256)
    p.add_argument("--exactness", type=int, default=0, metavar="N",
                   help="run the exactness sweep with N prompts per KV type (lengths 100 … n_ctx−64 tokens) "
                        "instead of the KV agreement section")
    p.add_argument("--n-ctx", type=int, default=4096, help="n_ctx of the exactness sweep (default 4096)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.exactness < 0:
        p.error(f"--exactness must be a number of prompts >= 1, got {a.exactness}")
    if a.exactness:
        from benchmarks.cache_exactness import check_args

        problem = check_args(a.exactness, a.n_ctx)
        if problem:
            p.error(problem)
    from app.catalog.registry import resolve_model

    path = str(resolve_model(a.model))
    res = {"ttft": ttft_section(path, a.prompt_tokens)}
    if a.exactness:
        from benchmarks.cache_exactness import exactness

        res["exactness"] = exactness(path, a.exactness, n_ctx=a.n_ctx)
    else:
        res["kv"] = kv_sections(path, a.gen_tokens)
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    _print_ttft(res["ttft"])
    if a.exactness:
        from benchmarks.cache_exactness import print_report

        print(f"Exactness sweep, {a.exactness} prompts per KV type, n_ctx {a.n_ctx} (greedy tokens vs cold):")
        print_report(res["exactness"])
    else:
        _print_kv(res["kv"])
    return 0


def _print_ttft(t: dict) -> None:
    print(f"TTFT, {t['prompt_tokens']}-token prompt (call -> first token at the caller):")
    print(f"  cold                 {t['cold_ttft_s'] * 1000:8.1f} ms")
    print(f"  warm (live KV)       {t['warm_memory_ttft_s'] * 1000:8.1f} ms   ratio {t['ratio_warm_over_cold']:.3f}")
    print(f"  restored (new proc)  {t['restored_disk_ttft_s'] * 1000:8.1f} ms   "
          f"ratio {t['ratio_restored_over_cold']:.3f}   (disk read + restore {t['restore_s'] * 1000:.1f} ms; "
          "target ratio <= 0.05)")
    print(f"  entry on disk        {t['entry_bytes'] / 1e6:8.1f} MB")
    print(f"  restored answer equals cold: {t['restored_equals_cold']}")


def _print_kv(k: dict) -> None:
    print("KV state bytes per token: " + ", ".join(f"{kv} {v:,.0f}" for kv, v in k["bytes_per_token"].items()))
    print(f"Agreement with f16 over {k['gen_tokens']} greedy tokens:")
    for kv, a_ in k["agreement_vs_f16"].items():
        print(f"  {kv:5} identical prefix {a_['greedy_identical_prefix_tokens']:4d} tokens · position-wise "
              f"{a_['greedy_positionwise']:.3f} · teacher-forced top-1 {a_['teacher_forced_top1']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
