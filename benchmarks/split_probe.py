"""Does a token's KV depend on the batch it was evaluated in? Raw llama-cpp-python, bit for bit.

Two probes, each per KV configuration (flash attention on/off, f16 / q8_0 / q4_0 KV; the engine's context shape
of ``--seqs`` sequences in a non-unified cache):

- **split**: a 700-token prompt evaluated as 256 + 444 tokens, then as 256 + (444 − m) + m for a last batch of
  m tokens, and in a few other splits; reported: how many bytes of the whole-context state (every KV cell) and
  how much of the last token's logits differ from the reference split 256 + 256 + 188. On this build with f16
  KV a split gives the reference's bits when every batch holds at least 64 tokens and every batch starts a
  multiple of 4 tokens after the reference chunk it falls in (so each batch's last (size mod 4) tokens are the
  reference's): ggml's CPU flash attention is tiled from ``GGML_FA_TILE_Q`` = 64 query rows on, and the
  repacked matmuls take 4 rows at a time and the rest one by one (``repack.cpp``).
- **rows**: after d tokens of KV, 6 more tokens evaluated one per ``llama_decode`` and in batches of 2, 3 and
  4 (logits for every row); reported: the largest logit difference against one-token steps. With f16 KV a
  lone row takes a split-KV attention path once the padded KV reaches 512 cells, so verification batches stop
  being exact past ~256 tokens (what ``speculation.depth_bucket`` follows).

Nothing here is used by the app; it informs docs/prefix-cache.md and docs/speculative.md. Run:
``python -m benchmarks.split_probe [--configs fa-f16,nofa-f16,fa-q8_0,fa-q4_0] [--json]`` (a few minutes).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys

from benchmarks.prefill_probe import UNIT, Ctx

CONFIGS = {  # name: (flash_attn, KV type)
    "fa-f16": (True, "f16"),
    "nofa-f16": (False, "f16"),
    "fa-q8_0": (True, "q8_0"),
    "fa-q4_0": (True, "q4_0"),
}
LAST = (16, 32, 48, 56, 63, 64, 65, 72, 100, 131)
ODD = ([100, 256, 332, 512, 700], [68, 256, 444, 700], [97, 256, 333, 512, 700], [130, 260, 390, 520, 700],
       [69, 200, 700])
DEPTHS = (40, 100, 255, 300, 484, 700, 1000)


def probe(path: str, name: str, n_seq: int) -> dict:
    """Both probes for one configuration (see the module docstring). Returns ``{"split": [...], "odd": [...],
    "rows": [...]}``."""
    import llama_cpp
    import numpy as np

    from app.protocol.types import LoadSettings

    fa, kv = CONFIGS[name]
    settings = LoadSettings(n_ctx=4096, n_batch=512, n_ubatch=512, flash_attn=fa, swa_full=True,
                            n_parallel=n_seq, type_k=kv, type_v=kv)
    c = Ctx(path, settings, n_seq)
    toks = c.llm.tokenize((UNIT * 60).encode(), add_bos=True, special=False)

    def decode(ts: list[int], pos0: int, every: bool = False) -> None:
        b = c.batch
        for i, t in enumerate(ts):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = every or i == len(ts) - 1
        b.n_tokens = len(ts)
        if llama_cpp.llama_decode(c.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def row(i: int):
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(c.ctx, i), shape=(c.n_vocab,)).copy()

    def state():
        n = llama_cpp.llama_state_get_size(c.ctx)
        buf = (ctypes.c_uint8 * n)()
        m = llama_cpp.llama_state_get_data(c.ctx, buf, n)
        return np.frombuffer(bytes(buf[:m]), np.uint8)

    def run(splits: list[int]):
        llama_cpp.llama_memory_clear(c.mem, True)
        a = 0
        for b in splits:
            decode(toks[a:b], a)
            a = b
        return state(), row(-1)

    ref_s, ref_l = run([256, 512, 700])

    def diff(splits: list[int]) -> dict:
        s, lg = run(splits)
        return {"splits": splits, "state_bytes_differing": int((s != ref_s).sum()) if len(s) == len(ref_s) else -1,
                "logit_max_diff": float(np.abs(lg - ref_l).max())}

    out = {"split": [dict(diff([256, 700 - m, 700]), last_batch=m) for m in LAST],
           "odd": [diff(list(sp)) for sp in ODD], "rows": []}
    for d in DEPTHS:
        llama_cpp.llama_memory_clear(c.mem, True)
        for a in range(0, d, 256):
            decode(toks[a:min(d, a + 256)], a)
        extra = toks[d:d + 6]

        def rows(size: int) -> list:
            llama_cpp.llama_memory_seq_rm(c.mem, 0, d, -1)
            got = []
            for a in range(0, len(extra), size):
                part = extra[a:a + size]
                decode(part, d + a, every=True)
                got += [row(i) for i in range(len(part))]
            return got

        one = rows(1)
        out["rows"].append({"kv": d, **{str(s): max(float(np.abs(x - y).max()) for x, y in zip(one, rows(s)))
                                        for s in (2, 3, 4)}})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="GGUF path (default: the bundled model)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"any of {','.join(CONFIGS)}")
    parser.add_argument("--seqs", type=int, default=4, help="sequences of the context (the engine's default: 4)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from app.childhost import tune_openmp

    tune_openmp()  # the engine process's OpenMP setting
    from app.catalog.registry import resolve_model

    path = str(resolve_model(args.model))
    names = [n for n in args.configs.split(",") if n]
    bad = [n for n in names if n not in CONFIGS]
    if bad:
        parser.error(f"unknown configuration {bad[0]!r}; choose from {', '.join(CONFIGS)}")
    results = {n: probe(path, n, args.seqs) for n in names}
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        return 0
    for n, r in results.items():
        print(f"{n}: last batch of m tokens after 256 + (444 - m) -> state bytes differing / logit max diff")
        print("  " + "  ".join(f"m={x['last_batch']}: {x['state_bytes_differing']}/{x['logit_max_diff']:.2f}"
                               for x in r["split"]))
        print("  odd splits: " + "  ".join(f"{x['splits']}: {x['state_bytes_differing']}" for x in r["odd"]))
        print("  rows per batch vs one per decode, by KV depth (max logit diff): " + "  ".join(
            f"kv={x['kv']}: 2={x['2']:.2f} 3={x['3']:.2f} 4={x['4']:.2f}" for x in r["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
