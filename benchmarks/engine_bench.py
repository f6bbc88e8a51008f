"""Engine overhead benchmark: Hearth's engine (child process + streaming) vs a plain llama-cpp-python loop.

Both run in one invocation, on the same model file, the same prompt, the same load settings and greedy
decoding, alternating A/B/A/B so that machine noise hits both. Reported per side (median over rounds):

- prefill tokens/s = prompt tokens / TTFT, where TTFT runs from the call (``create_completion`` for the plain
  loop, ``Engine.generate`` for Hearth) to the first token's arrival at the caller — so it includes every
  cost the caller sees (for Hearth: the pipe to and from the engine process).
- decode tokens/s = (tokens − 1) / (last token time − first token time), at the caller.

Both sides use the same library settings: threads (``default_threads``) and OpenMP spin-waiting
(``GOMP_SPINCOUNT=1000``, set by ``tune_openmp`` before llama.cpp loads, as the engine process does), so the
ratio isolates what Hearth adds: the process boundary, the pipe and streaming.

Target: Hearth ≥ 0.95 × plain for both. Run: ``hearth bench engine`` or ``python -m benchmarks.engine_bench``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

PROMPT_UNIT = ("The history of the lighthouse begins in antiquity, when fires on hilltops guided ships "
               "along dangerous coasts. ")


def _plain_run(llm, prompt: str, n: int) -> dict:
    llm.reset()
    llm._ctx.kv_cache_clear()
    t0 = time.perf_counter()
    times = []
    for _chunk in llm.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1, stream=True):
        times.append(time.perf_counter())
    return {"ttft_s": times[0] - t0, "tokens": len(times),
            "decode_tps": (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0}


def _hearth_run(engine, prompt: str, n: int) -> dict:
    from app.protocol.types import DecodingParams, Delta, GenerateRequest

    # Reset the live KV so that every run is a cold prefill (same as the plain side).
    engine.complete(GenerateRequest(prompt="x", decoding=DecodingParams.make(temperature=0.0, max_tokens=1)))
    req = GenerateRequest(prompt=prompt, decoding=DecodingParams.make(temperature=0.0, max_tokens=n),
                          prefix_cache=False)
    t0 = time.perf_counter()
    times = []
    done = None
    for ev in engine.generate(req):
        if isinstance(ev, Delta):
            times.append(time.perf_counter())
        else:
            done = ev
    return {"ttft_s": times[0] - t0, "tokens": len(times),
            "decode_tps": (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0,
            "engine_prefill_tps": done.metrics.prefill_tps}


def run(model: str | None = None, prompt_tokens: int = 1000, gen_tokens: int = 128, rounds: int = 3,
        n_ctx: int = 4096, n_threads: int | None = None) -> dict:
    from app.childhost import default_threads, tune_openmp

    tune_openmp()  # the same OpenMP spin setting on both sides (Hearth's engine sets it in its process)
    import llama_cpp

    from app.catalog.registry import resolve_model
    from app.engine.local.engine import Engine
    from app.engine.local.runtime import GGML_TYPES
    from app.protocol.types import LoadSettings

    path = str(resolve_model(model))
    n_threads = n_threads or default_threads()  # the same thread count on both sides
    settings = LoadSettings(n_ctx=n_ctx, n_threads=n_threads)
    plain = llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=settings.n_batch, n_ubatch=settings.n_ubatch,
                            n_threads=n_threads, n_threads_batch=n_threads, flash_attn=settings.flash_attn,
                            type_k=GGML_TYPES[settings.type_k], type_v=GGML_TYPES[settings.type_v],
                            swa_full=settings.swa_full, logits_all=False, verbose=False)
    unit = len(plain.tokenize(PROMPT_UNIT.encode(), add_bos=False))
    prompt = PROMPT_UNIT * max(1, prompt_tokens // unit)
    n_prompt = len(plain.tokenize(prompt.encode(), add_bos=True))
    engine = Engine(path, settings)
    engine.load()
    res = {"plain": [], "hearth": []}
    try:
        _plain_run(plain, "warm up", 4)
        _hearth_run(engine, "warm up", 4)
        for _ in range(rounds):
            res["plain"].append(_plain_run(plain, prompt, gen_tokens))
            res["hearth"].append(_hearth_run(engine, prompt, gen_tokens))
    finally:
        engine.close()

    def med(side, key):
        return statistics.median(r[key] for r in res[side])

    out = {"model": Path(path).name, "prompt_tokens": n_prompt, "gen_tokens": gen_tokens, "rounds": rounds}
    for side in ("plain", "hearth"):
        out[side] = {"prefill_tps": n_prompt / med(side, "ttft_s"), "ttft_s": med(side, "ttft_s"),
                     "decode_tps": med(side, "decode_tps"), "tokens": med(side, "tokens")}
    out["ratio"] = {"prefill": out["hearth"]["prefill_tps"] / out["plain"]["prefill_tps"],
                    "decode": out["hearth"]["decode_tps"] / out["plain"]["decode_tps"]}
    return out


def report(out: dict) -> str:
    lines = [f"model {out['model']}, prompt {out['prompt_tokens']} tokens, {out['gen_tokens']} generated, "
             f"median of {out['rounds']} alternating rounds",
             f"{'':10}{'prefill tok/s':>15}{'TTFT s':>10}{'decode tok/s':>15}"]
    for side in ("plain", "hearth"):
        s = out[side]
        lines.append(f"{side:10}{s['prefill_tps']:>15.1f}{s['ttft_s']:>10.3f}{s['decode_tps']:>15.1f}")
    r = out["ratio"]
    lines.append(f"{'ratio':10}{r['prefill']:>15.3f}{'':>10}{r['decode']:>15.3f}   (hearth / plain; target >= 0.95)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--prompt-tokens", type=int, default=1000)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n-threads", type=int, default=None)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    out = run(a.model, a.prompt_tokens, a.gen_tokens, a.rounds, n_threads=a.n_threads)
    print(json.dumps(out, indent=2) if a.json else report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
