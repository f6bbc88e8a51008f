"""Single-stream decode and short-prompt TTFT: Hearth (engine, HTTP) against raw llama-cpp-python, alternating.

Sides, each run once per round in turn so that machine noise hits them all:

- ``raw``: a minimal loop in this process over the same model, settings and context shape as the engine
  (``llama_kwargs``, ``n_parallel`` sequences in a non-unified KV cache): the prompt in one ``llama_decode``,
  then one token per ``llama_decode``, greedy argmax over ``llama_get_logits_ith`` with numpy. The ceiling.
- ``engine``: ``Engine.generate`` (the child process, the pipe, the scheduler), greedy, raw prompt.
- ``http``: the same engine behind ``ServerThread``, ``/v1/completions`` streamed, read with ``httpx``.
- ``spin``: a second engine whose process spins longer at OpenMP barriers (``GOMP_SPINCOUNT`` = ``--spin``,
  libgomp's own default 300,000; the engine's is 1,000, ``app.childhost.threads.tune_openmp``), over HTTP.
- ``--url NAME=URL``: any other Hearth server (a ``hearth serve`` of another checkout, say), a side ``NAME`` read
  like ``http``.
- ``peer``: llama.cpp's ``llama-server`` (``benchmarks.peer``, at its defaults: ``-m -c -np -t`` only, the
  environment as this process got it) with the engine's slots and context, read the same way.

Hearth's sides run with ``speculative`` as ``--speculative`` says (default ``off``: the plain decode path).
Per run: TTFT (ms, call → first token at the caller; cold: each run's prompt starts with a different number, so
no KV is reused) and decode tokens/s ((tokens − 1) / (last token − first token), at the caller). Reported: the
medians and the ratios to ``raw``. Run: ``python -m benchmarks.decode_probe [--tokens 256] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from benchmarks.prefill_probe import Ctx

PROMPT = ("Run {i}. The history of the lighthouse begins in antiquity, when fires on hilltops guided ships along "
          "dangerous coasts, and the keepers who tended them wrote")


class Raw(Ctx):
    """The ceiling: a bare llama-cpp-python decode loop with the engine's context shape (``prefill_probe.Ctx``)."""

    def run(self, prompt: str, n: int) -> dict:
        self.lib.llama_memory_clear(self.mem, True)
        t0 = time.perf_counter()
        toks = self.llm.tokenize(prompt.encode(), add_bos=True, special=False)
        for a in range(0, len(toks), self.n_batch):
            self.decode(toks[a:a + self.n_batch], a)
        tok = self.argmax()
        times, out, pos = [time.perf_counter()], [tok], len(toks)
        for _ in range(n - 1):
            self.decode([tok], pos)
            pos += 1
            tok = self.argmax()
            self.llm._model.detokenize([tok], special=False)
            out.append(tok)
            times.append(time.perf_counter())
        return _result(t0, times, len(toks), out)


def engine_run(engine, prompt: str, n: int, speculative: str | None) -> dict:
    from app.protocol.types import DecodingParams, Delta, GenerateRequest

    req = GenerateRequest(prompt=prompt, decoding=DecodingParams.make(temperature=0.0, max_tokens=n),
                          prefix_cache=False, speculative=speculative)
    t0 = time.perf_counter()
    times, out, done = [], [], None
    for ev in engine.generate(req):
        if isinstance(ev, Delta):
            if ev.token_ids:
                times.append(time.perf_counter())
                out.extend(ev.token_ids)
        else:
            done = ev
    return _result(t0, times, done.metrics.prompt_tokens, out)


def http_run(url: str, model: str, prompt: str, n: int, hearth: dict | None = None) -> dict:
    import httpx

    body = {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": n, "stream": True,
            "stream_options": {"include_usage": True}, **({"hearth": hearth} if hearth else {})}
    t0 = time.perf_counter()
    times, tokens, prompt_tokens, text = [], 0, 0, []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            if obj["choices"] and obj["choices"][0]["text"]:
                times.append(time.perf_counter())
                text.append(obj["choices"][0]["text"])
            elif obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
                prompt_tokens = obj["usage"]["prompt_tokens"]
    res = _result(t0, times, prompt_tokens, [])
    res["tokens"] = tokens  # pieces may merge; the token count comes from usage
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    res["decode_tps"] = (len(times) - 1) / span if span > 0 else 0.0
    res["text"] = "".join(text)
    return res


def _cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system, every thread) used so far by process ``pid`` (0.0 for None)."""
    if pid is None:
        return 0.0
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _result(t0: float, times: list[float], prompt_tokens: int, out: list[int]) -> dict:
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {"ttft_ms": (times[0] - t0) * 1000 if times else 0.0, "tokens": len(times),
            "prompt_tokens": prompt_tokens, "decode_tps": (len(times) - 1) / span if span > 0 else 0.0,
            "ids": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="GGUF path (default: the bundled model)")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sides", default="raw,engine,http,peer", help="any of raw,engine,http,spin,peer")
    p.add_argument("--spin", type=int, default=300000, help="GOMP_SPINCOUNT of the spin side's engine")
    p.add_argument("--speculative", default="off", help="Hearth's requests' speculative mode ('' for the default)")
    p.add_argument("--n-parallel", type=int, default=None, help="slots (default: the engine's choice)")
    p.add_argument("--url", action="append", default=[], metavar="NAME=URL", help="another Hearth server as a side")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    import contextlib

    from app.catalog.registry import resolve_model

    args.urls = dict(u.split("=", 1) for u in args.url)
    sides = [s for s in args.sides.split(",") if s] + list(args.urls)
    path = str(resolve_model(args.model))
    with contextlib.ExitStack() as stack:
        peer = None
        if "peer" in sides:  # started first: it inherits this process's environment before tune_openmp
            from benchmarks.peer import PeerConfig, llama_server

            cfg = PeerConfig(model=path, n_parallel=_parallel(path, args.n_parallel), mode="defaults")
            peer = stack.enter_context(llama_server(cfg))
        return _measure(args, sides, path, peer)


def _parallel(path: str, n_parallel: int | None) -> int:
    """The engine's slot count for ``path`` (``resolve_parallel``, as ``Engine.load`` decides it)."""
    from app.catalog.gguf import inspect_model
    from app.catalog.memory_estimate import resolve_parallel
    from app.protocol.types import LoadSettings

    return int(resolve_parallel(inspect_model(path, require_chat=True), LoadSettings(n_parallel=n_parallel))
               .n_parallel)


def _measure(args, sides: list[str], path: str, peer) -> int:
    import contextlib

    from app.childhost import tune_openmp

    tune_openmp()  # the engine process's OpenMP setting, here too (the raw side)
    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings

    engine = Engine(path, LoadSettings(n_parallel=args.n_parallel))
    info = engine.load()
    spinning = _spinning_engine(path, args) if "spin" in sides else None
    raw = Raw(path, LoadSettings(n_parallel=info["n_parallel"]), info["n_parallel"]) if "raw" in sides else None
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    try:
        with contextlib.ExitStack() as stack:
            one = _runner(args, stack, engine, spinning, raw, peer, info["model"].removesuffix(".gguf"))
            for s in sides:
                one(s, 8)  # warm-up
            for _ in range(args.rounds):
                for s in sides:
                    runs[s].append(one(s, args.tokens))
    finally:
        engine.close()
        if spinning is not None:
            spinning.close()
    _report(args, sides, runs)
    return 0


def _spinning_engine(path: str, args):
    """A second engine whose process inherits ``GOMP_SPINCOUNT=args.spin`` (``tune_openmp`` keeps a set one)."""
    import os

    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings

    own, os.environ["GOMP_SPINCOUNT"] = os.environ["GOMP_SPINCOUNT"], str(args.spin)
    try:
        spinning = Engine(path, LoadSettings(n_parallel=args.n_parallel))
        spinning.load()
    finally:
        os.environ["GOMP_SPINCOUNT"] = own
    return spinning


def _runner(args, stack, engine, spinning, raw, peer, model: str):
    """``one(side, n)``: one run of ``n`` tokens on ``side`` (a fresh prompt each time) with its CPU per token:
    the serving process's (every thread) plus this process's."""
    from app.server import ServerThread, create_app
    from app.settings import ServerSettings

    srv = stack.enter_context(ServerThread(create_app(engine, ServerSettings())))
    spin_srv = stack.enter_context(ServerThread(create_app(spinning, ServerSettings()))) if spinning else None
    spec = args.speculative or None
    hearth = {"speculative": spec} if spec else None
    counter = iter(range(1, 1 << 30))
    pids = {"peer": peer.proc.pid if peer else None, "raw": None, "spin": spinning.pid if spinning else None,
            **dict.fromkeys(args.urls)}

    def one(side: str, n: int) -> dict:
        prompt = PROMPT.format(i=next(counter))
        pid = pids.get(side, engine.pid)
        c0 = _cpu_s(pid) + time.process_time()
        if side == "raw":
            res = raw.run(prompt, n)
        elif side == "engine":
            res = engine_run(engine, prompt, n, spec)
        elif side == "peer":
            res = http_run(peer.url, model, prompt, n)
        elif side in args.urls:
            res = http_run(args.urls[side], model, prompt, n, hearth)
        else:
            res = http_run((spin_srv if side == "spin" else srv).url, model, prompt, n, hearth)
        res["cpu_ms_per_token"] = (_cpu_s(pid) + time.process_time() - c0) * 1000 / max(1, res["tokens"])
        return res
    return one


def _report(args, sides: list[str], runs: dict[str, list[dict]]) -> None:
    summary = {s: {k: statistics.median(r[k] for r in rs) for k in ("decode_tps", "ttft_ms", "tokens",
                                                                     "prompt_tokens", "cpu_ms_per_token")}
               for s, rs in runs.items()}
    if args.json:
        print(json.dumps({"summary": summary, "runs": runs}, indent=1))
        return
    base = summary.get("raw")
    for s in sides:
        m = summary[s]
        rel = (f"  ({m['decode_tps'] / base['decode_tps']:.3f}× raw decode, "
               f"TTFT {m['ttft_ms'] - base['ttft_ms']:+.1f} ms)" if base and s != "raw" else "")
        each = " ".join(f"{r['decode_tps']:.1f}" for r in runs[s])
        ttfts = " ".join(f"{r['ttft_ms']:.0f}" for r in runs[s])
        print(f"{s:7s} decode {m['decode_tps']:6.2f} tok/s  TTFT {m['ttft_ms']:6.1f} ms  "
              f"prompt {m['prompt_tokens']:.0f} tok  CPU {m['cpu_ms_per_token']:5.2f} ms/token{rel}")
        print(f"        per run: decode [{each}]  TTFT ms [{ttfts}]")

if __name__ == "__main__":
    sys.exit(main())
