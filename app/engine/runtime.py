"""The code that owns a ``llama_cpp.Llama`` inside the engine process.

``Runtime`` loads one model and runs one generation at a time: template → tokens → reuse of the live KV
prefix (and, when enabled, the persistent prefix cache) → prefill in chunks of ``n_batch`` tokens (a cancel
is honoured between chunks) → decode with llama.cpp's sampler chain (a cancel is honoured between tokens).
It does not use ``Llama.generate`` / ``create_completion``: their prefill cannot be interrupted and their
logit-bias path goes through a Python callback; the sampler chain here is llama.cpp's own
(``llama_sampler_init_logit_bias``, ``penalties``, ``top_k``, ``typical``, ``top_p``, ``min_p``, ``temp``,
``dist`` / ``greedy``), in the order llama-cpp-python 0.3.36 ``Llama._init_sampler`` uses.

Everything here runs in the child process (see ``engine.py``); it reports through an ``emit`` callable. The
vocabulary methods (``tokenize``, ``detokenize``, ``piece_bytes``, ``render``) are served on the child's side
lane, on another thread, possibly while ``generate`` runs: they only read the vocabulary and the template.
"""

from __future__ import annotations

import logging
import math
import os
import random
import resource
import sys
import time
from typing import Any, Callable

from app.engine.process import default_threads
from app.engine.templates import RenderedPrompt, choose_template_name, render
from app.engine.textstream import StopStreamer
from app.engine.types import GenerateRequest, LoadSettings
from app.errors import Cancelled, ContextLengthExceeded, InvalidRequest, ModelLoadError

log = logging.getLogger(__name__)

GGML_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}  # ggml_type enum values (ggml.h)


_LOG_CALLBACK = None  # keep the ctypes callback alive for the life of the process


def route_llama_logs() -> None:
    """Send llama.cpp's log lines to Python logging (logger ``llama.cpp``) instead of stderr: errors as
    warnings, everything else at debug level (``hearth -v`` shows them). llama-cpp-python 0.3.36 maps ggml's log
    levels with an old enum (DEBUG=1, INFO=2, WARN=3, ERROR=4 in this llama.cpp) and prints informational
    warnings such as "using full-size SWA cache" on every load."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is not None:
        return
    import ctypes

    import llama_cpp

    llog = logging.getLogger("llama.cpp")

    @llama_cpp.llama_log_callback
    def _cb(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        msg = text.decode("utf-8", "replace").rstrip()
        if msg:
            llog.log(logging.WARNING if level == 4 else logging.DEBUG, "%s", msg)

    _LOG_CALLBACK = _cb
    llama_cpp.llama_log_set(_cb, ctypes.c_void_p(0))


def llama_kwargs(settings: LoadSettings) -> dict[str, Any]:
    """``Llama(...)`` keyword arguments for ``settings`` (llama-cpp-python 0.3.36 names; it silently ignores
    unknown ones, so every name here is checked by a test). ``n_gpu_layers`` and ``offload_kqv`` take effect in a
    CUDA or Metal build (``make run BACKEND=cuda|metal``) and are ignored by a CPU build."""
    threads = settings.n_threads or default_threads()
    return dict(n_ctx=settings.n_ctx, n_batch=settings.n_batch, n_ubatch=settings.n_ubatch, n_threads=threads,
                n_threads_batch=threads, n_gpu_layers=settings.n_gpu_layers, type_k=GGML_TYPES[settings.type_k],
                type_v=GGML_TYPES[settings.type_v], flash_attn=settings.flash_attn, offload_kqv=settings.offload_kqv,
                use_mmap=settings.use_mmap, use_mlock=settings.use_mlock, swa_full=settings.swa_full,
                logits_all=False, verbose=False, seed=settings.seed)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process in bytes (``getrusage``; kB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)


class Runtime:
    """One loaded model. ``emit(kind, *payload)`` receives ``("delta", text, token_ids, logprobs)`` events;
    ``generate`` returns the final ``(finish_reason, text, child_metrics, info)``."""

    def __init__(self, model_path: str, settings: LoadSettings, model_meta: dict[str, Any] | None = None,
                 prefix_cache: Any = None) -> None:
        import llama_cpp

        self.settings = settings
        self.model_path = model_path
        self.meta = model_meta or {}
        t0 = time.perf_counter()
        route_llama_logs()
        try:
            self.llm = llama_cpp.Llama(model_path=model_path, **llama_kwargs(settings))
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"llama.cpp could not load the model: {exc}", path=model_path) from None
        self._warm_up()
        self.load_s = time.perf_counter() - t0
        self.vocab = self.llm._model.vocab
        self._vocab_is_eog = llama_cpp.llama_vocab_is_eog  # looked up once, not per decoded token
        self.n_vocab = self.llm.n_vocab()
        self.prefix_cache = prefix_cache
        md = self.llm.metadata
        arch = md.get("general.architecture", "")
        self.sliding_window = int(md.get(f"{arch}.attention.sliding_window", 0) or 0)
        # With a window-only SWA cache a reused shorter prefix gives wrong logits: reuse nothing then.
        self.reuse_ok = settings.swa_full or not self.sliding_window
        self.canonical_upto = 0  # KV positions below this were computed in whole canonical chunks
        self.layout_len = 0  # length of the prompt whose first L-1 tokens the live KV holds in its layout
        view = _MetaView(self.meta, md, model_path)
        self.chat_template = view.chat_template
        self.template_name = choose_template_name(view)
        self.bos_text = self._piece(self.llm.token_bos(), special=True) if self.llm.token_bos() >= 0 else ""
        self.eos_text = self._piece(self.llm.token_eos(), special=True) if self.llm.token_eos() >= 0 else ""

    def _warm_up(self) -> None:
        """Evaluate one token and forget it, so that thread start-up and first touches of the weights are
        paid by the load, not by the first request's TTFT."""
        bos = self.llm.token_bos()
        self.llm.eval([bos if bos >= 0 else 0])
        self.llm._ctx.kv_cache_clear()
        self.llm.n_tokens = 0

    # -- tokens ---------------------------------------------------------------------------------------
    def _piece(self, token: int, special: bool = False) -> str:
        return self.llm._model.detokenize([token], special=special).decode("utf-8", errors="replace")

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def detokenize(self, tokens: list[int]) -> str:
        self._check_ids(tokens)
        return self.llm.detokenize(tokens).decode("utf-8", errors="replace")

    def _check_ids(self, tokens: list[int]) -> None:
        """llama.cpp aborts on a token id outside the vocabulary: refuse it first."""
        bad = [t for t in tokens if not 0 <= t < self.n_vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})",
                                 param="tokens")

    def piece_bytes(self, token: int, size: int = 64) -> bytes:
        """The exact bytes of one token's text (``llama_token_to_piece``, control tokens as ``b""``), whatever
        its length (llama-cpp-python's own ``detokenize`` assumes at most 32 bytes)."""
        import ctypes

        import llama_cpp

        self._check_ids([token])
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, size, 0, False)
        if n < 0:
            return self.piece_bytes(token, -n)
        return buf.raw[:n]

    def ready_info(self) -> dict[str, Any]:
        """What the parent learns once the model is loaded (``load_s`` in seconds)."""
        return {"template": self.template_name, "n_ctx": self.settings.n_ctx, "load_s": self.load_s,
                "n_vocab": self.n_vocab}

    def cache_stats(self) -> dict:
        return self.prefix_cache.stats() if self.prefix_cache else {}

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (<eos>, <end_of_turn>, <|eot_id|>…); called once per token."""
        return bool(self._vocab_is_eog(self.vocab, token))

    def render(self, request: GenerateRequest) -> RenderedPrompt:
        if request.prompt is not None:
            return RenderedPrompt(request.prompt, "none", request.add_bos, ())
        name = request.template or self.template_name
        return render(request.messages, name, chat_template=self.chat_template, bos_token=self.bos_text,
                      eos_token=self.eos_text)

    # -- sampling -------------------------------------------------------------------------------------
    def _sampler(self, d) -> Any:
        from llama_cpp import _internals as internals

        s = internals.LlamaSampler()
        if d.logit_bias:
            bad = [t for t, _ in d.logit_bias if t >= self.n_vocab]
            if bad:
                raise InvalidRequest(f"logit_bias token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})",
                                     param="logit_bias")
            s.add_logit_bias(self.n_vocab, dict(d.logit_bias))
        if d.repeat_penalty != 1.0 or d.frequency_penalty or d.presence_penalty:
            s.add_penalties(self.n_vocab, 64, d.repeat_penalty, d.frequency_penalty, d.presence_penalty)
        if d.grammar:
            from app.engine.grammar import add_grammar_checked

            add_grammar_checked(s, self.llm._model, d.grammar)
        if d.temperature == 0.0:
            s.add_greedy()
        else:
            seed = d.seed if d.seed is not None else random.randrange(0, 2**32 - 1)
            if d.top_k > 0:
                s.add_top_k(d.top_k)
            s.add_typical(d.typical_p, 1)
            s.add_top_p(d.top_p, 1)
            s.add_min_p(d.min_p, 1)
            s.add_temp(d.temperature)
            s.add_dist(seed)
        return s

    # -- prefill --------------------------------------------------------------------------------------
    def live_prefix(self, tokens: list[int]) -> int:
        """Tokens of ``tokens`` that the live KV cache gives back exactly (see ``prefill`` for the layout):
        all but the last token when the previous prompt had the same length and the same tokens up to its
        last one; otherwise the common prefix cut down to whole canonical chunks."""
        llm = self.llm
        L = len(tokens)
        limit = min(llm.n_tokens, L - 1)
        ids = llm.input_ids
        n = 0
        while n < limit and ids[n] == tokens[n]:
            n += 1
        if n == L - 1 and self.layout_len == L:
            return n
        n = min(n, self.canonical_upto)
        return n - n % self.settings.n_batch

    def prefill(self, tokens: list[int], cancelled: Callable[[], bool], metrics: dict,
                allow_reuse: bool = True) -> None:
        """Make the KV cache hold exactly ``tokens`` with logits for the last one.

        Exactness: llama.cpp's CPU kernels give slightly different numbers for the same row in batches of
        different shapes (measured here: a prompt prefilled as [0,3)+[3,7)+[7] and as [0,8) diverge after a few
        greedy tokens). So every prompt of L tokens is prefilled in one *canonical* layout fixed by absolute
        positions: chunks [0,C), [C,2C), … (C = n_batch) cut at L−1, then the last token alone. A reused
        prefix is either whole chunks, or all L−1 tokens when they were laid out for a prompt of the same
        length; so the KV and the last token's logits are bit for bit those of a cold prefill, and the answer
        equals the cold run's. Each position also sits in the same KV cell as in the cold prefill (position p in
        cell p, head after the last): attention sums cells in cell order, so a moved cell changes the rounding
        (``PrefixCache._set_state``; live reuse frees the tail cells and the head goes back to the reuse point).
        The state saved to the disk cache is the KV after the first L−1 tokens. A cancel
        is honoured between chunks. ``allow_reuse=False`` (the request's ``prefix_cache``) prefills cold: no live
        reuse, no disk lookup, no save."""
        llm = self.llm
        C = self.settings.n_batch
        L = len(tokens)
        allowed = allow_reuse and self.reuse_ok
        cache = self.prefix_cache if allowed else None
        reuse = self.live_prefix(tokens) if allowed else 0
        source = "memory" if reuse else "none"
        if cache is not None:
            got = cache.restore_longest(self, tokens, reuse, metrics)
            if got > reuse:
                reuse, source = got, "disk"
            elif llm.n_tokens == 0:  # a rejected entry: the KV cache was cleared, nothing is reusable
                reuse, source = 0, "none"
        if reuse < llm.n_tokens and not llm._ctx.kv_cache_seq_rm(-1, reuse, -1):
            llm._ctx.kv_cache_clear()
            reuse, source = 0, "none"
        llm.n_tokens = reuse
        self.canonical_upto = min(self.canonical_upto, reuse - reuse % C)
        self.layout_len = L if reuse == L - 1 else 0
        metrics["cached_tokens"] = reuse
        metrics["cache_source"] = source
        note = self._reuse_note(reuse, source, L, metrics, allow_reuse)
        metrics["cache_reuse"], metrics["cache_reuse_reason"] = note
        t0 = time.perf_counter()
        for start in range(reuse, L - 1, C):
            if cancelled():
                raise Cancelled("cancelled during prefill")
            end = min(start + C, L - 1)
            llm.eval(tokens[start:end])
            if end - start == C:
                self.canonical_upto = end
        self.layout_len = L
        if reuse < L - 1 and cache is not None:
            cache.maybe_save(self, tokens[:L - 1], metrics)
        if cancelled():
            raise Cancelled("cancelled during prefill")
        llm.eval(tokens[L - 1:])
        metrics["prefill_s"] = time.perf_counter() - t0

    def _reuse_note(self, reuse: int, source: str, L: int, metrics: dict, allow_reuse: bool) -> tuple[str, str]:
        """``("exact", which path)`` when a prefix was reused, else ``("cold", why not)``: every reuse path
        that ``prefill`` takes gives the cold run's bits, so a path that could not does not run at all."""
        C = self.settings.n_batch
        if reuse:
            where = "restored from disk" if source == "disk" else "live KV cache"
            part = ("all but the last prompt token" if reuse == L - 1
                    else f"{reuse // C} whole chunk(s) of {C} tokens")
            return "exact", f"{where}: {part}"
        if not allow_reuse:
            return "cold", "prefix reuse off for this request"
        if not self.reuse_ok:
            return "cold", ("window-only sliding-window cache (swa_full off): a reused prefix would not "
                            "equal a cold prefill")
        if metrics.get("cache_error"):
            return "cold", f"prefix-cache entry rejected: {metrics['cache_error']}"
        if L - 1 < C:
            return "cold", f"prompt shorter than one chunk ({C} tokens) and not a repeat of the last prompt"
        return "cold", "no cached prefix of this prompt (live or on disk)"

    # -- generation -----------------------------------------------------------------------------------
    def generate(self, request: GenerateRequest, emit: Callable[..., None],
                 cancelled: Callable[[], bool]) -> tuple[str, str, dict, dict]:
        d = request.decoding
        rp = self.render(request)
        tokens = self.tokenize(rp.text, add_bos=rp.add_bos, special=request.prompt is None)
        if not tokens:
            raise InvalidRequest("the prompt is empty", param="prompt" if request.prompt is not None else "messages")
        n_ctx = self.settings.n_ctx
        reserve = d.max_tokens or 0
        if len(tokens) + reserve > n_ctx or len(tokens) >= n_ctx:
            raise ContextLengthExceeded(len(tokens), n_ctx, reserve)
        metrics: dict[str, Any] = {"prompt_tokens": len(tokens)}
        sampler = self._sampler(d)
        self.prefill(tokens, cancelled, metrics, allow_reuse=request.prefix_cache)
        streamer = StopStreamer(tuple(d.stop) + rp.stop)
        llm = self.llm
        max_new = min(d.max_tokens or n_ctx, n_ctx - len(tokens))  # None: until the context is full
        finish = "length"
        n_out = 0
        t_first = None
        while n_out < max_new:
            if cancelled():
                raise Cancelled("cancelled during decode")
            lp = self._logprobs(request.want_logprobs) if request.want_logprobs else None
            token = sampler.sample(llm._ctx, -1)
            n_out += 1
            if t_first is None:
                t_first = time.perf_counter()
            if self.is_eog(token):
                n_out -= 1  # the end-of-turn token is not part of the answer
                finish = "stop"
                break
            text, stopped = streamer.feed(llm._model.detokenize([token], special=False))
            if lp is not None:
                lp = (token, _token_lp(lp, token), [(t, v) for t, v in lp[1]])
            # One event per token (even when its text is held back) so that ITL is measured per token.
            emit("delta", text, (token,), (lp,) if lp is not None else ())
            if stopped:
                finish = "stop"
                break
            if n_out >= max_new:
                break
            llm.eval([token])
        tail = streamer.flush()
        if tail:
            emit("delta", tail, (), ())
        metrics["completion_tokens"] = n_out
        metrics["decode_s"] = time.perf_counter() - t_first if t_first else 0.0
        metrics["peak_rss_bytes"] = peak_rss_bytes()
        info = {"template": rp.name, "model": os.path.basename(self.model_path)}
        return finish, streamer.text, metrics, info

    def _logprobs(self, top_n: int):
        import numpy as np

        ptr = self.llm._ctx.get_logits_ith(-1)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64)
        m = logits.max()
        lse = m + math.log(np.exp(logits - m).sum())
        top = np.argpartition(-logits, top_n)[:top_n] if top_n > 0 else []
        top = sorted(((int(t), float(logits[t] - lse)) for t in top), key=lambda x: -x[1])
        return (logits, top, lse)


def _token_lp(lp, token: int) -> float:
    logits, _top, lse = lp
    return float(logits[token] - lse)


class _MetaView:
    """Adapter giving ``choose_template_name`` the fields it reads from GGUF metadata."""

    def __init__(self, meta: dict, md: dict, path: str) -> None:
        self.chat_template = meta.get("chat_template", md.get("tokenizer.chat_template"))
        self.architecture = meta.get("architecture", md.get("general.architecture", ""))
        self.name = meta.get("name", md.get("general.name", ""))
        self.finetune = md.get("general.finetune", "")
        self.file_name = os.path.basename(path)
