"""The code that owns a ``llama_cpp.Llama`` inside the engine process.

``Runtime`` loads one model into a context of ``n_parallel`` sequences (slots) and serves the scheduler
(``app.engine.local.scheduler``): per request, template → tokens → reuse of its slot's live KV prefix (and, when
enabled, the persistent prefix cache) → prefill in chunks of ``n_batch`` tokens, one chunk per scheduler step
→ decode with llama.cpp's sampler chain, one token per step, batched with the other slots' decodes in one
``llama_decode``. It does not use ``Llama.eval`` / ``generate`` / ``create_completion``: they drive one
sequence, their prefill cannot be interrupted, ``eval`` copies every logit row into Python, and their
logit-bias path goes through a Python callback; the sampler chain here is llama.cpp's own
(``llama_sampler_init_logit_bias``, ``penalties``, ``top_k``, ``typical``, ``top_p``, ``min_p``, ``temp``,
``dist`` / ``greedy``), in the order llama-cpp-python 0.3.36 ``Llama._init_sampler`` uses.

Everything here runs in the child process (see ``engine.py``); it reports through each ``Seq``'s ``emit``. The
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
from dataclasses import replace
from typing import Any

from app.childhost import default_threads
from app.engine.chat.reasoning_budget import BudgetForcer, plan_prompt, render_kwargs
from app.engine.chat.templates import RenderedPrompt, choose_template_name, render, template_tool_caps, tool_format
from app.engine.chat.thinking import markers_for
from app.engine.local import speculative as spec
from app.engine.local.layout import answer_end_token, layout_bounds, next_bound, turn_break_token, usable
from app.engine.local.scheduler import Seq
from app.errors import ContextLengthExceeded, HearthError, InvalidRequest, ModelLoadError
from app.protocol.reasoning import ReasoningBudget
from app.protocol.types import ChatMessage, GenerateRequest, LoadSettings

log = logging.getLogger(__name__)

GGML_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}  # ggml_type enum values (ggml.h)
# After a forced end of thinking on a model that thinks only when prefilled (no markers of its own), this line
# starts the answer (s1's "Final Answer:"): measured on the bundled base model, without it the model wrote the
# next "User:" turn at once, so the answer was empty; with it, "Answer: France." (docs/reasoning.md).
PREFILL_ANSWER_NOW = "Answer:"
MIN_LIVE_REUSE = 16  # a shorter live prefix (the BOS before the first turn break) is prefilled, not reused
MIN_COPY_TOKENS = 32  # a shorter prefix is prefilled rather than copied from another slot (measured below)
SETTLE_MAX_TOKENS = 2048  # tokens of an answer's turn re-laid out while idle, at most (``Runtime.idle_step``)
SETTLE_PROBE = "\u2026"  # the next user message stand-in whose turn opening ends the settled prefix


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


def _context_with_sequences(n_seq: int):
    """A context manager under which ``llama_cpp.Llama(...)`` creates its context with ``n_seq`` sequences in
    a non-unified KV cache (``n_seq_max``, ``kv_unified=False``: one KV stream of n_ctx / n_seq cells per
    sequence). llama-cpp-python 0.3.36 sets ``n_seq_max`` only for embedding models; its context parameters
    start from ``llama_context_default_params()``, which this wraps for the duration of the load (the engine
    process loads one model, on one thread)."""
    import contextlib

    import llama_cpp.llama_cpp as lib

    @contextlib.contextmanager
    def patched():
        orig = lib.llama_context_default_params

        def params():
            p = orig()
            p.n_seq_max = n_seq
            p.kv_unified = False
            return p

        lib.llama_context_default_params = params
        try:
            yield
        finally:
            lib.llama_context_default_params = orig

    return patched()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process in bytes (``getrusage``; kB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)


class _Slot:
    """One sequence of the context: ``seq_id``, the tokens its KV holds (positions 0 … n−1, in cells 0 … n−1 of
    its own stream), ``bounds``: the positions where its KV ends a chunk of the canonical layout (the KV of
    tokens 0 … b−1 is a cold prefill's for each b in it; ``app.engine.local.layout``), and when it was last used
    (``time.perf_counter`` seconds)."""

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id
        self.tokens: list[int] = []
        self.bounds: set[int] = set()
        self.last_used = 0.0

    def forget(self) -> None:
        self.tokens, self.bounds = [], set()


class LlamaSeq(Seq):
    """A request in a llama.cpp slot: its prompt ``tokens``, the next prompt index to evaluate (``pos``), the
    prefix it reused (``reused`` tokens), its sampler chain (None: plain greedy), ``bounds``: where the chunks
    of its prompt's canonical layout end. The KV length is its slot's ``len(tokens)``."""

    tokens: list[int]
    bounds: list[int]  # where its layout's chunks end (``Runtime.layout``)
    pos: int = 0
    reused: int = 0
    sampler: Any = None
    t_prefill: float | None = None
    spec_mode: str | None = None  # "prompt_lookup" / "draft" when this request speculates (docs/speculative.md)
    spec_d: Any = None  # its DecodingParams (target_dist / greedy_token read them)
    spec_rng: Any = None  # numpy Generator seeded from the request (sampled verification)
    lookup: Any = None  # speculative.PromptLookup over its prompt and answer


class _Settle:
    """An answer's turn being laid out again in its slot while the engine is idle (``Runtime.idle_step``):
    ``tokens``, the next turn's prompt as far as it is known (the chat with the answer and a stand-in user
    message, rendered and tokenized), ``bounds`` its canonical layout, ``pos`` the next position to evaluate,
    ``target`` where it stops (the cut that opens the next user turn), ``started``: the slot was cut back to
    ``pos`` already."""

    __slots__ = ("tokens", "bounds", "pos", "target", "started")

    def __init__(self, tokens: list[int], bounds: list[int], pos: int, target: int) -> None:
        self.tokens, self.bounds, self.pos, self.target, self.started = tokens, bounds, pos, target, False


class Runtime:
    """One loaded model in a context of ``n_slots`` sequences (``settings.n_parallel``; each with its own
    ``settings.n_ctx`` tokens of KV), driven by ``app.engine.local.scheduler.Scheduler`` (``SeqRuntime``)."""

    def __init__(self, model_path: str, settings: LoadSettings, model_meta: dict[str, Any] | None = None,
                 prefix_cache: Any = None) -> None:
        import llama_cpp

        self.settings = settings
        self.model_path = model_path
        self.meta = model_meta or {}
        self.n_slots = settings.n_parallel or 1
        t0 = time.perf_counter()
        route_llama_logs()
        kwargs = llama_kwargs(settings)
        kwargs["n_ctx"] = settings.n_ctx * self.n_slots
        try:
            with _context_with_sequences(self.n_slots):
                self.llm = llama_cpp.Llama(model_path=model_path, **kwargs)
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"llama.cpp could not load the model: {exc}", path=model_path) from None
        self._lib = llama_cpp
        self.ctx = self.llm._ctx.ctx
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.prefill_budget = settings.n_batch
        self.batch = llama_cpp.llama_batch_init(settings.n_batch, 0, 1)  # tokens per llama_decode at most
        self.slots = [_Slot(i) for i in range(self.n_slots)]
        self._settle_wanted: dict[int, LlamaSeq] = {}  # slot -> the request whose answer may be settled
        self._settling: dict[int, _Settle] = {}
        self.settled = {"settled_answers": 0, "settled_tokens": 0}
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
        view = _MetaView(self.meta, md, model_path)
        self.chat_template = view.chat_template
        self.architecture = view.architecture
        self.template_name = choose_template_name(view)
        self.bos_text = self._piece(self.llm.token_bos(), special=True) if self.llm.token_bos() >= 0 else ""
        self.eos_text = self._piece(self.llm.token_eos(), special=True) if self.llm.token_eos() >= 0 else ""
        self.markers = markers_for(self.template_name, self.chat_template, self.architecture,
                                   self.meta.get("thinking_markers"))
        self.turn_breaks = self._turn_breaks()
        self.spec_default = self.meta.get("speculative")  # the model's default mode (a request's own wins)
        self._spec_cap: int | None = None  # guesses per step that keep decoding exact (measured on first use)
        self.draft = None
        if self.meta.get("draft_model"):
            self.draft = DraftModel(self.meta["draft_model"], settings, self.n_slots, self)

    def _warm_up(self) -> None:
        """Evaluate one token and forget it, so that thread start-up and first touches of the weights are
        paid by the load, not by the first request's TTFT."""
        bos = self.llm.token_bos()
        self._decode([(0, 0, [bos if bos >= 0 else 0])])
        self._lib.llama_memory_clear(self.mem, True)

    # -- tokens ---------------------------------------------------------------------------------------
    def _piece(self, token: int, special: bool = False) -> str:
        return self.llm._model.detokenize([token], special=special).decode("utf-8", errors="replace")

    def _turn_breaks(self) -> frozenset[int]:
        """The prefill layout's turn breaks: the assistant turn's opening token (``layout.turn_break_token`` on
        two one-message prompts of the model's template) and, when that token does not also open the user's
        turn, the token that follows an answer (``layout.answer_end_token`` on a user-answer-user chat: the
        transcript's ``User``). Empty when the template has none or does not render."""
        lib, vocab = self._lib, self.llm._model.vocab

        def is_control(t: int) -> bool:
            return bool(lib.llama_vocab_is_control(vocab, t))

        def is_blank(t: int) -> bool:
            return not self._piece(t, special=True).strip()

        try:
            a, b = (self.render(GenerateRequest(messages=(ChatMessage("user", text),)))
                    for text in ("Hello there.", "What is the capital of France?"))
            ta = self.tokenize(a.text, add_bos=a.add_bos, special=True)
            tb = self.tokenize(b.text, add_bos=b.add_bos, special=True)
            found = turn_break_token(ta, tb, is_control, is_blank)
        except Exception:  # noqa: BLE001 - a template that cannot render a plain message: no breaks
            return frozenset()
        if found is None:
            return frozenset()
        try:
            answer, then = "Sure, it is Paris.", "Thanks a lot."
            chat = self.render(GenerateRequest(messages=(ChatMessage("user", "Hello there."),
                                                         ChatMessage("assistant", answer),
                                                         ChatMessage("user", then))))
            full = self.tokenize(chat.text, add_bos=chat.add_bos, special=True)
            at = chat.text.index(answer) + len(answer)
            starts = chat.text.rindex(then)
            end = self._prefix_len(full, chat.text[:at], chat.add_bos)
            start = self._prefix_len(full, chat.text[:starts], chat.add_bos)
            closer = answer_end_token(full, end, start, {found}, is_control, is_blank)
        except Exception:  # noqa: BLE001 - no multi-turn rendering: the assistant break alone
            closer = None
        return frozenset({found} if closer is None else {found, closer})

    def _prefix_len(self, full: list[int], text: str, add_bos: bool) -> int:
        """How many of ``full``'s tokens ``text`` (a prefix of the text ``full`` was tokenized from) covers:
        its own token count, one less when the tokenizer merged its last token with what follows."""
        part = self.tokenize(text, add_bos=add_bos, special=True)
        n = len(part)
        return n if full[:n] == part else max(0, n - 1)

    def layout(self, tokens: list[int]) -> list[int]:
        """Where the canonical chunks of ``tokens`` end (``layout.layout_bounds`` with ``n_batch`` and this
        model's turn break)."""
        return layout_bounds(tokens, self.settings.n_batch, self.turn_breaks)

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

        self._check_ids([token])
        buf = ctypes.create_string_buffer(size)
        n = self._lib.llama_token_to_piece(self.vocab, token, buf, size, 0, False)
        if n < 0:
            return self.piece_bytes(token, -n)
        return buf.raw[:n]

    def ready_info(self) -> dict[str, Any]:
        """What the parent learns once the model is loaded (``load_s`` in seconds)."""
        return {"template": self.template_name, "n_ctx": self.settings.n_ctx, "load_s": self.load_s,
                "n_vocab": self.n_vocab, "n_parallel": self.n_slots, "architecture": self.architecture,
                "thinking": self.markers.to_dict(), **self.tool_info()}

    def tool_info(self) -> dict[str, Any]:
        """``tool_format``: the ``ToolFormat`` name of the model's own template; ``template_tools``: the GGUF
        template renders the tool list itself (``templates.template_tool_caps``)."""
        fmt = tool_format(self.template_name, self.architecture, self.chat_template)
        caps = (template_tool_caps(self.chat_template, self.bos_text, self.eos_text)
                if self.template_name == "gguf" and self.chat_template else None)
        return {"tool_format": fmt.name, "template_tools": bool(caps and caps.tools)}

    def cache_stats(self) -> dict:
        """The disk prefix cache's counters (``PrefixCache.stats``; none without one) and the answers laid
        out again while idle (``settled_answers``, ``settled_tokens``: ``idle_step``)."""
        return {**(self.prefix_cache.stats() if self.prefix_cache else {}), **self.settled}

    def close(self) -> None:
        """Finish the prefix cache's pending writes and close its index (the engine process is ending)."""
        if self.prefix_cache is not None:
            self.prefix_cache.close()

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (<eos>, <end_of_turn>, <|eot_id|>…); called once per token."""
        return bool(self._vocab_is_eog(self.vocab, token))

    def render(self, request: GenerateRequest) -> RenderedPrompt:
        """The prompt text of ``request`` (a raw prompt as given; messages through the template, with the
        thinking switch of ``reasoning_budget.render_kwargs`` for the request's budget)."""
        if request.prompt is not None:
            return RenderedPrompt(request.prompt, "none", request.add_bos, ())
        name = request.template or self.template_name
        budget = request.reasoning.budget if request.reasoning is not None else ReasoningBudget()
        return render(request.messages, name, chat_template=self.chat_template, bos_token=self.bos_text,
                      eos_token=self.eos_text, tools=request.tools, tool_choice=request.tool_choice,
                      parallel_tool_calls=request.parallel_tool_calls, architecture=self.architecture,
                      template_vars=render_kwargs(self.markers, self._budget(request, budget)))

    def _budget(self, request: GenerateRequest, budget: ReasoningBudget) -> ReasoningBudget:
        """A request decoding through a grammar (response_format, a forced tool call) does not think: the
        grammar would bind the thinking text too."""
        grammar = request.decoding.grammar or (request.tools and request.choice.forces_call)
        return replace(budget, tokens=0) if grammar else budget

    def thinking_plan(self, request: GenerateRequest, text: str):
        """``(suffix, budget, started_inside, thinks)`` for ``request``'s rendered prompt ``text``
        (``reasoning_budget.plan_prompt``); ``thinks``: the answer goes through a ``BudgetForcer`` (a model
        that thinks by itself, a budget asked of one that thinks when prefilled, or a prompt that ends inside
        thinking). A raw ``prompt`` thinks only when it ends inside thinking or a budget was asked."""
        budget = self._budget(request, request.reasoning.budget if request.reasoning is not None
                              else ReasoningBudget())
        if request.prompt is not None and not budget.asked and not self.markers.inside_after(text):
            return "", budget, False, False
        plan = plan_prompt(self.markers, text, budget)
        thinks = self.markers.native or plan.thinking or plan.started_inside
        return plan.suffix, budget, plan.started_inside, thinks

    def tools_tokens(self, request: GenerateRequest, prompt_tokens: int) -> int:
        """Tokens the tool definitions add to ``request``'s prompt of ``prompt_tokens`` tokens (its render
        without ``tools``, counted; 0 without tools)."""
        if not request.tools:
            return 0
        rp = self.render(replace(request, tools=(), tool_choice=None))
        return max(0, prompt_tokens - len(self.tokenize(rp.text, add_bos=rp.add_bos, special=True)))

    # -- sampling -------------------------------------------------------------------------------------
    def _sampler(self, d) -> Any:
        """llama.cpp's sampler chain for ``d``, or None for plain greedy decoding (temperature 0 without logit
        bias, penalties or grammar): then ``_sample`` takes the first largest logit itself, which is exactly
        what ``llama_sampler_init_greedy`` selects, in 0.03 ms instead of 0.7 ms (the chain copies all 262,144
        candidates of Gemma 3's vocabulary each token; measured here)."""
        from llama_cpp import _internals as internals

        if (d.temperature == 0.0 and not d.logit_bias and not d.grammar and d.repeat_penalty == 1.0
                and not d.frequency_penalty and not d.presence_penalty):
            return None
        s = internals.LlamaSampler()
        if d.logit_bias:
            bad = [t for t, _ in d.logit_bias if t >= self.n_vocab]
            if bad:
                raise InvalidRequest(f"logit_bias token id {bad[0]} is outside the vocabulary "
                                     f"(0..{self.n_vocab - 1})", param="logit_bias")
            s.add_logit_bias(self.n_vocab, dict(d.logit_bias))
        if d.repeat_penalty != 1.0 or d.frequency_penalty or d.presence_penalty:
            s.add_penalties(self.n_vocab, 64, d.repeat_penalty, d.frequency_penalty, d.presence_penalty)
        if d.grammar:
            from app.engine.structured.grammar import add_grammar_checked

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

    def _sample(self, seq: LlamaSeq, idx: int) -> None:
        """Sample ``seq``'s next token from the logits of batch row ``idx`` of the last ``llama_decode``."""
        if seq.t_first is None and seq.t_prefill is not None:
            seq.metrics["prefill_s"] = time.perf_counter() - seq.t_prefill  # through the last prompt token
        want = seq.request.want_logprobs
        lp = self._logprobs(idx, want) if want else None
        if seq.sampler is None:
            import numpy as np

            row = np.ctypeslib.as_array(self._lib.llama_get_logits_ith(self.ctx, idx), shape=(self.n_vocab,))
            token = int(row.argmax())
        else:
            token = seq.sampler.sample(self.llm._ctx, idx)
        if lp is not None:
            lp = (token, _token_lp(lp, token), [(t, v) for t, v in lp[1]])
        seq.accept(token, self.is_eog(token), self.llm._model.detokenize([token], special=False), lp)

    # -- the batch ------------------------------------------------------------------------------------
    def _decode(self, items: list[tuple[int, int, list[int]]], all_logits: bool = False,
                every: frozenset[int] = frozenset()) -> list[int]:
        """One ``llama_decode`` of ``items`` = ``(seq_id, first position, tokens)``; logits for the last token
        of each item (``all_logits``: for every token; ``every``: indices of the items that get logits at
        every token, a speculative verification). Returns each item's last token's batch index (for
        ``llama_get_logits_ith``; item j's token i is at ``lasts[j] - len(tokens_j) + 1 + i``). Raises
        ``HearthError``."""
        b = self.batch
        n = 0
        lasts = []
        for j, (seq_id, pos0, toks) in enumerate(items):
            last = len(toks) - 1
            each = all_logits or j in every
            for i, t in enumerate(toks):
                b.token[n] = t
                b.pos[n] = pos0 + i
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = seq_id
                b.logits[n] = i == last or each
                n += 1
            lasts.append(n - 1)
        b.n_tokens = n
        rc = self._lib.llama_decode(self.ctx, b)
        if rc != 0:
            why = "no free KV cell" if rc == 1 else "aborted" if rc == 2 else f"error {rc}"
            raise HearthError(f"llama_decode failed ({why}) on a batch of {n} tokens")
        return lasts

    # -- a request's life in its slot -----------------------------------------------------------------
    def live_prefix(self, slot: _Slot, tokens: list[int], bounds: list[int] | None = None) -> int:
        """Tokens of ``tokens`` that ``slot``'s live KV gives back exactly (see ``begin``): the common prefix
        cut down to the last chunk end of ``tokens``' layout (``bounds``, ``layout``) that the slot's KV also
        ends a chunk at (``layout.usable``); all but the last token for a repeat of the same prompt."""
        L = len(tokens)
        have = slot.tokens
        limit = min(len(have), L - 1)
        n = 0
        while n < limit and have[n] == tokens[n]:
            n += 1
        got = usable(self.layout(tokens) if bounds is None else bounds, n, slot.bounds) if n else 0
        return got if got >= MIN_LIVE_REUSE or got == L - 1 else 0

    def begin(self, rid: int, request: GenerateRequest, free: list[int]) -> LlamaSeq:
        """Render and tokenize ``request``, check it fits, pick a slot among ``free`` and make that slot's KV
        hold the longest exactly reusable prefix of the prompt.

        Exactness: llama.cpp's CPU kernels give slightly different numbers for the same row in batches of
        different shapes (measured here: a prompt prefilled as [0,3)+[3,7)+[7] and as [0,8) diverge after a few
        greedy tokens). So every prompt of L tokens is prefilled in one *canonical* layout fixed by absolute
        positions and tokens (``app.engine.local.layout``): cut before each turn break (the template's turn-opening
        control token), every C = n_batch tokens after a cut, and at L−1, then the last token alone, each chunk
        in a ``llama_decode`` of its own (never merged with other slots' tokens). A reused prefix ends where a
        chunk of this layout ends and the reused KV was laid out the same way up to there (a chat's next turn
        reuses its previous prompt up to the turn that now holds the answer); so the KV and the last token's
        logits are bit for bit those of a cold prefill. Each position also sits in the same KV
        cell as in the cold prefill (position p in cell p of the slot's stream, head after the last): attention
        sums cells in cell order (``PrefixCache._set_state``; live reuse frees the tail cells and the head goes
        back to the reuse point). The state saved to the disk cache is the KV after the first L−1 tokens.
        ``request.prefix_cache=False`` prefills cold: no live reuse, no disk lookup, no save."""
        rp = self.render(request)
        d = request.decoding if rp.grammar is None else replace(request.decoding, grammar=rp.grammar)
        suffix, budget, inside, thinks = self.thinking_plan(request, rp.text)
        tokens = self.tokenize(rp.text, add_bos=rp.add_bos, special=request.prompt is None)
        if suffix:
            tokens += self.tokenize(suffix, add_bos=False, special=True)
        if not tokens:
            raise InvalidRequest("the prompt is empty", param="prompt" if request.prompt is not None else "messages")
        n_ctx = self.settings.n_ctx
        reserve = d.max_tokens or 0
        tools_tokens = self.tools_tokens(request, len(tokens))
        if len(tokens) + reserve > n_ctx or len(tokens) >= n_ctx:
            fits_without = len(tokens) - tools_tokens < n_ctx
            raise ContextLengthExceeded(len(tokens), n_ctx, reserve, tools_tokens,
                                        "tools" if tools_tokens and fits_without else "messages")
        sampler = self._sampler(d)
        allowed = request.prefix_cache and self.reuse_ok
        busy = set(range(self.n_slots)) - set(free)
        bounds = self.layout(tokens)
        live = {i: self.live_prefix(self.slots[i], tokens, bounds) if allowed else 0 for i in free}
        slot = max((self.slots[i] for i in free),
                   key=lambda s: (live[s.seq_id], -_runs(busy | {s.seq_id}), -s.last_used))
        self._settle_wanted.pop(slot.seq_id, None)
        self._settling.pop(slot.seq_id, None)  # its KV is consistent after every chunk: reused as it is
        copied = self._copy_longer(slot, tokens, live[slot.seq_id], bounds) if allowed else None
        if copied is not None:
            live[slot.seq_id] = len(slot.tokens)
        seq = LlamaSeq(rid, request, slot.seq_id, rp.stop)
        seq.tokens, seq.sampler, seq.bounds = tokens, sampler, bounds
        seq.max_new = min(d.max_tokens or n_ctx, n_ctx - len(tokens))  # None: until the context is full
        seq.room = n_ctx - len(tokens)
        if thinks:
            fitted = budget.fit(n_ctx, len(tokens), d.max_tokens)
            answer_now = request.reasoning.answer_now if request.reasoning is not None else None
            if answer_now is None and self.markers.prefill_start:
                answer_now = PREFILL_ANSWER_NOW
            seq.forcer = BudgetForcer(self.markers, fitted.tokens, fitted.deadline_s, answer_now,
                                      started_inside=inside, t0=time.perf_counter())
            seq.tokenize_insert = lambda text: self.tokenize(text, add_bos=False, special=True)
        seq.metrics["prompt_tokens"] = len(tokens)
        seq.info = {"template": rp.name, "model": os.path.basename(self.model_path)}
        self._plan_speculation(seq, request, d)
        if request.tools:
            seq.info.update(tool_format=rp.tool_format, tools_tokens=tools_tokens)
        self._reuse(seq, slot, live[slot.seq_id], request.prefix_cache, disk=copied is None)
        if copied is not None:
            seq.metrics["cache_copied_from_slot"] = copied
            seq.metrics["cache_reuse_reason"] += f" (copied from slot {copied})"
        return seq

    def _copy_longer(self, dst: _Slot, tokens: list[int], have: int, bounds: list[int]) -> int | None:
        """Give ``dst`` another slot's live prefix of ``tokens`` when it is longer than ``have`` tokens and
        worth a copy (at least ``MIN_COPY_TOKENS``): llama.cpp copies the whole KV stream of a non-unified
        cache (``llama_memory_seq_cp`` across streams, applied at the next ``llama_decode``), so every cell
        is bit for bit the source's and in the same place; the tail past the prefix is removed. Returns the
        source slot's id, or None. This is how ``n`` samples of one prompt (self-consistency) prefill it
        once: the later ones start after the first has its prompt in."""
        best, src = have, None
        for other in self.slots:
            if other is dst or not other.tokens:
                continue
            n = self.live_prefix(other, tokens, bounds)
            if n > best:
                best, src = n, other
        if src is None or best - have < MIN_COPY_TOKENS:
            return None
        lib = self._lib
        lib.llama_memory_seq_cp(self.mem, src.seq_id, dst.seq_id, -1, -1)
        if best < len(src.tokens):
            lib.llama_memory_seq_rm(self.mem, dst.seq_id, best, -1)
        dst.tokens = src.tokens[:best]
        dst.bounds = {b for b in src.bounds if b <= best}
        return src.seq_id

    def _reuse(self, seq: LlamaSeq, slot: _Slot, reuse: int, allow_reuse: bool, disk: bool = True) -> None:
        """Keep (``reuse`` tokens of the live KV, ``live_prefix``) or restore (disk) the longest exact prefix of
        ``seq.tokens`` in ``slot``; drop the rest. ``disk`` False: no disk lookup (a stream copy into the slot
        is pending until the next ``llama_decode`` and would overwrite a restored state)."""
        tokens, metrics = seq.tokens, seq.metrics
        L = len(tokens)
        allowed = allow_reuse and self.reuse_ok
        cache = self.prefix_cache if allowed and disk else None
        source = "memory" if reuse else "none"
        if cache is not None:
            got = cache.restore_longest(self, slot, tokens, reuse, metrics, seq.bounds)
            if got > reuse:
                reuse, source = got, "disk"
            elif not slot.tokens:  # a rejected entry: the slot was cleared, nothing is reusable
                reuse, source = 0, "none"
        kept = self._keep_prefix(slot, tokens, reuse)
        if kept != reuse:
            reuse, source = kept, "none"
        seq.pos = seq.reused = reuse
        metrics["cached_tokens"] = reuse
        metrics["cache_source"] = source
        metrics["cache_reuse"], metrics["cache_reuse_reason"] = self._reuse_note(reuse, source, L, metrics,
                                                                                 allow_reuse)

    def _keep_prefix(self, slot: _Slot, tokens: list[int], n: int) -> int:
        """Cut ``slot``'s KV back to its first ``n`` tokens (``tokens[:n]``, which it holds) and its cuts to
        those ≤ ``n``. Returns ``n``, or 0 when llama.cpp could not remove the tail: the slot is then emptied."""
        lib = self._lib
        if n < len(slot.tokens) and not lib.llama_memory_seq_rm(self.mem, slot.seq_id, n, -1):
            lib.llama_memory_seq_rm(self.mem, slot.seq_id, -1, -1)
            n = 0
        slot.tokens = tokens[:n]
        slot.bounds = {b for b in slot.bounds if b <= n}
        return n

    def _prefill_chunk(self, slot: _Slot, tokens: list[int], start: int, end: int) -> None:
        """Evaluate the canonical chunk ``tokens[start:end]`` alone in one ``llama_decode`` into ``slot``, whose
        KV then ends a chunk at ``end``."""
        self._decode([(slot.seq_id, start, tokens[start:end])])
        slot.tokens.extend(tokens[start:end])
        slot.bounds.add(end)

    def _reuse_note(self, reuse: int, source: str, L: int, metrics: dict, allow_reuse: bool) -> tuple[str, str]:
        """``("exact", which path)`` when a prefix was reused, else ``("cold", why not)``: every reuse path
        that ``begin`` takes gives the cold run's bits, so a path that could not does not run at all."""
        C = self.settings.n_batch
        if reuse:
            where = "restored from disk" if source == "disk" else "live KV cache"
            part = ("all but the last prompt token" if reuse == L - 1
                    else f"{reuse} tokens, up to a chunk end of the prompt's layout")
            return "exact", f"{where}: {part}"
        if not allow_reuse:
            return "cold", "prefix reuse off for this request"
        if not self.reuse_ok:
            return "cold", ("window-only sliding-window cache (swa_full off): a reused prefix would not "
                            "equal a cold prefill")
        if metrics.get("cache_error"):
            return "cold", f"prefix-cache entry rejected: {metrics['cache_error']}"
        if L - 1 < C and not self.turn_breaks:
            return "cold", f"prompt shorter than one chunk ({C} tokens) and not a repeat of the last prompt"
        return "cold", "no cached prefix of this prompt (live or on disk)"

    def chunk_tokens(self, seq: LlamaSeq) -> int:
        """Prompt tokens the next ``prefill_step`` of ``seq`` evaluates (0 when only the last one is left: it
        joins the next decode step)."""
        return next_bound(seq.bounds, seq.pos) - seq.pos if seq.pos < len(seq.tokens) - 1 else 0

    def prefill_step(self, seqs: list[LlamaSeq]) -> None:
        """Evaluate the next canonical chunk of each of ``seqs``' prompts (at most ``n_batch`` tokens each),
        each chunk alone in its ``llama_decode``, so the KV is a solo cold prefill's. Once a prompt's first
        L−1 tokens are in, the state is saved to the disk cache (if it was not restored from there) and the
        last prompt token becomes ``pending``: the next decode step evaluates it with the other sequences'
        tokens (alone when no other sequence decodes: then exactly the solo computation) and samples the
        first answer token from its logits.

        Short prompts (L−1 < n_batch) of several requests arriving together are evaluated in one
        ``llama_decode`` instead (a burst of chat turns costs one weight pass, not one each): their KV is then
        not a solo prefill's, so their slots do not offer the same-prompt reuse afterwards (their prompts are
        shorter than a chunk, so they hold no reusable chunk and are never saved to disk anyway)."""
        C = self.settings.n_batch
        short = sorted((s for s in seqs if s.pos == 0 and 0 < len(s.tokens) - 1 < C), key=lambda s: s.slot)
        if len(short) < 2:
            short = []
        now = time.perf_counter()
        for seq in seqs:
            if seq.t_prefill is None:
                seq.t_prefill = now
        if short:
            self._decode([(s.slot, 0, s.tokens[:-1]) for s in short])
            for s in short:
                self.slots[s.slot].tokens.extend(s.tokens[:-1])
                s.pos = len(s.tokens) - 1
                self._prompt_in(s, merged=True)
        for seq in seqs:
            if seq in short:
                continue
            slot, tokens = self.slots[seq.slot], seq.tokens
            L = len(tokens)
            if seq.pos < L - 1:
                end = next_bound(seq.bounds, seq.pos)
                self._prefill_chunk(slot, tokens, seq.pos, end)
                seq.pos = end
            if seq.pos == L - 1:
                self._prompt_in(seq)

    def _prompt_in(self, seq: LlamaSeq, merged: bool = False) -> None:
        """``seq``'s first L−1 prompt tokens are in its slot: save them (unless restored or ``merged``) and
        make the last prompt token pending."""
        slot, tokens = self.slots[seq.slot], seq.tokens
        L = len(tokens)
        if merged:
            slot.bounds = set()  # merged with other prompts' tokens: not a cold prefill's KV
            seq.metrics["prefill_shared"] = True
        cache = self.prefix_cache if seq.request.prefix_cache and self.reuse_ok else None
        if seq.reused < L - 1 and cache is not None and not merged:
            cache.maybe_save(self, slot, tokens[:L - 1], seq.metrics)
        seq.pending = tokens[L - 1]
        seq.prompt_done = True

    def decode_step(self, seqs: list[LlamaSeq]) -> None:
        """Evaluate each sequence's pending token, all in one ``llama_decode`` (in groups of at most
        ``n_batch`` tokens), and sample every next token. A speculating sequence (``_plan_speculation``) feeds
        its guesses after the pending token, with logits at every position, and takes the verified tokens
        (``_verify``)."""
        # In sequence-id order: llama.cpp's split of a batch for a non-unified cache (``split_equal`` with
        # ``sequential``) puts only increasing, consecutive sequence ids in one ubatch, so slots 1, 2, 3, 0 in
        # that order were two graph computations instead of one (measured: a 4-sequence step 44 ms in order,
        # 66–74 ms not). Gaps (slots 0, 2, 3) still split; ``begin`` keeps the busy slots contiguous.
        # A sequence whose thinking was just ended by budget forcing also feeds the inserted end-of-thinking
        # tokens after its pending one (``Seq.inserts``): not sampled, logits only after the last of them; it
        # does not speculate in that step.
        seqs = sorted(seqs, key=lambda s: s.slot)
        n = self.settings.n_batch
        drafts = {s.rid: self._propose(s) for s in seqs if s.spec_mode and not s.inserts}
        groups: list[list[LlamaSeq]] = [[]]
        used = 0
        for s in seqs:
            size = 1 + len(s.inserts) + len(drafts.get(s.rid, ()))
            if groups[-1] and used + size > n:
                groups.append([])
                used = 0
            groups[-1].append(s)
            used += size
        for group in groups:
            feeds = [[s.pending] + s.inserts + drafts.get(s.rid, []) for s in group]
            every = frozenset(j for j, s in enumerate(group) if s.rid in drafts)
            kv = [len(self.slots[s.slot].tokens) for s in group]
            lasts = self._decode([(s.slot, k, f) for s, k, f in zip(group, kv, feeds)], every=every)
            for s, k, f, idx in zip(group, kv, feeds, lasts):
                self.slots[s.slot].tokens.extend(f)
                if s.rid in drafts:
                    self._verify(s, k, drafts[s.rid], idx - len(f) + 1)
                    continue
                s.pending, s.inserts = None, []
                self._sample(s, idx)

    # -- speculative decoding (docs/speculative.md) -----------------------------------------------------
    def _plan_speculation(self, seq: LlamaSeq, request: GenerateRequest, d) -> None:
        """Decide whether ``seq`` speculates: the request's ``speculative`` mode, else the model's default;
        only where verification is exact (``speculative.ineligible_reason``) and a draft model is loaded for
        ``"draft"``. A request that asked for it and does not get it says why in ``info["speculative"]``."""
        mode = request.speculative if request.speculative is not None else self.spec_default
        if mode is None or mode == "off":
            return
        why = spec.ineligible_reason(mode, d, request.want_logprobs)
        if why is None and mode == "draft" and self.draft is None:
            why = "no draft model is loaded (the model's draft_model setting)"
        if why is not None:
            seq.info["speculative"] = f"off: {why}"
            return
        seq.spec_mode, seq.spec_d = mode, d
        seq.spec_rng = spec.request_rng(d.seed) if d.temperature > 0 else None
        if mode == "prompt_lookup":
            seq.lookup = spec.PromptLookup(seq.tokens)
        seq.metrics.update(spec_mode=mode, spec_drafted=0, spec_accepted=0, spec_steps=0)

    def spec_cap(self, seq: LlamaSeq) -> int:
        """Guesses per step at most: ``HEARTH_SPEC_MAX_DRAFT`` when set (for measurements; may break exactness),
        else the most that keep the target's logits bit for bit those of one-token steps
        (``_probe_exact_rows`` − 1, measured once on ``seq``'s slot), and at most ``LOOKUP_DRAFT`` /
        ``DRAFT_MODEL_DRAFT``."""
        most = spec.LOOKUP_DRAFT if seq.spec_mode == "prompt_lookup" else spec.DRAFT_MODEL_DRAFT
        env = os.environ.get("HEARTH_SPEC_MAX_DRAFT")
        if env:
            return max(0, int(env))
        if self._spec_cap is None:
            rows = self._probe_exact_rows(seq)
            if rows is None:  # no room in this slot's context: no guesses now, probe on a later step
                return 0
            self._spec_cap = rows - 1
            log.info("speculative decoding: %d guesses per step keep the logits exact", self._spec_cap)
        return min(most, self._spec_cap)

    def _probe_exact_rows(self, seq: LlamaSeq, most: int = 8) -> int | None:
        """The largest batch of one sequence's tokens (≤ ``most``) whose logits equal, bit for bit, those of
        the same tokens evaluated one per ``llama_decode``. llama.cpp's CPU matmuls switch kernels with the
        number of rows: measured on this build with the bundled Q4_K_M model, 2 and 3 rows are exact, 4 rows
        (the repacked Q4_K GEMM) differ by up to 2.6 in a logit, and without flash attention even 2 rows
        differ. Evaluated after ``seq``'s slot's KV (its pending token and its last prompt tokens, repeated to
        ``most`` tokens), then removed: the slot's KV is as before. None when the slot's context has no room
        for them."""
        import numpy as np

        slot = self.slots[seq.slot]
        kv = len(slot.tokens)
        toks = (([seq.pending] + seq.tokens[-(most - 1):]) * most)[:most]
        if kv + len(toks) > self.settings.n_ctx:
            return None
        lib, mem, sid = self._lib, self.mem, slot.seq_id

        def rows(size: int) -> list:
            lib.llama_memory_seq_rm(mem, sid, kv, -1)
            out = []
            for a in range(0, len(toks), size):
                part = toks[a:a + size]
                last = self._decode([(sid, kv + a, part)], all_logits=True)[0]
                out += [np.ctypeslib.as_array(lib.llama_get_logits_ith(self.ctx, last - len(part) + 1 + i),
                                              shape=(self.n_vocab,)).copy() for i in range(len(part))]
            return out

        try:
            one = rows(1)
            exact = 1
            for size in range(2, len(toks) + 1):
                if not all(np.array_equal(a, b) for a, b in zip(one, rows(size))):
                    break
                exact = size
        finally:
            lib.llama_memory_seq_rm(mem, sid, kv, -1)
        return exact

    def _propose(self, seq: LlamaSeq) -> list[int]:
        """``seq``'s guesses for this step (possibly none): within the step's budget, the context, and the
        tokens it may still emit."""
        slot = self.slots[seq.slot]
        kv = len(slot.tokens)
        k = min(self.spec_cap(seq), self.settings.n_ctx - kv - 1, seq.max_new - seq.n_out - 1,
                self.settings.n_batch - 1)
        if seq.room is not None:
            k = min(k, seq.room - seq.n_out - seq.n_inserted - 1)
        if k <= 0:
            return []
        hist = slot.tokens + [seq.pending]
        if seq.spec_mode == "prompt_lookup":
            seq.lookup.extend(hist[len(seq.lookup):])
            return seq.lookup.propose(k)
        return self.draft.propose(seq, hist, k)

    def _row(self, idx: int):
        import numpy as np

        return np.ctypeslib.as_array(self._lib.llama_get_logits_ith(self.ctx, idx), shape=(self.n_vocab,))

    def _verify(self, seq: LlamaSeq, kv: int, drafts: list[int], first: int) -> None:
        """``seq``'s pending token and ``drafts`` were evaluated at positions ``kv`` … (logits from batch index
        ``first``): keep the guesses the target agrees with (``speculative.verify_greedy`` /
        ``verify_sampled``), emit them and the target's own next token through ``Seq.accept`` one by one
        (stopping where the answer ends or thinking is ended by an insert: the rest is discarded), and drop
        the KV of every position past the last emitted token."""
        if seq.t_first is None and seq.t_prefill is not None:
            seq.metrics["prefill_s"] = time.perf_counter() - seq.t_prefill
        d = seq.spec_d
        if d.temperature == 0:
            v = spec.verify_greedy(drafts, lambda i: spec.greedy_token(self._row(first + i), d.logit_bias))
        else:
            q = self.draft.last_q(seq) if seq.spec_mode == "draft" else None
            v = spec.verify_sampled(drafts, lambda i: spec.target_dist(self._row(first + i), d), q, seq.spec_rng)
        spec.add_step(seq.metrics, len(drafts), v.accepted)
        out = drafts[:v.accepted] + [v.token]
        seq.pending, seq.inserts = None, []
        emitted = 0
        for t in out:
            seq.accept(t, self.is_eog(t), self.llm._model.detokenize([t], special=False), None)
            emitted += 1
            if seq.finish is not None or seq.pending is None or seq.inserts:
                break
        keep = kv + emitted  # the pending token and the guesses before the last emitted token
        slot = self.slots[seq.slot]
        if keep < len(slot.tokens):
            self._lib.llama_memory_seq_rm(self.mem, slot.seq_id, keep, -1)
            del slot.tokens[keep:]

    def end(self, seq: LlamaSeq, clean: bool = True) -> None:
        """``seq`` left its slot. Its KV stays for the next request's reuse unless the step that ended it
        failed (``clean=False``): then the slot is emptied. A finished chat answer is remembered for
        ``idle_step``."""
        slot = self.slots[seq.slot]
        slot.last_used = time.perf_counter()
        self._settling.pop(slot.seq_id, None)
        if not clean:
            self._lib.llama_memory_seq_rm(self.mem, slot.seq_id, -1, -1)
            slot.forget()
        if clean and self._may_settle(seq):
            self._settle_wanted[slot.seq_id] = seq
        else:
            self._settle_wanted.pop(slot.seq_id, None)
        seq.metrics["peak_rss_bytes"] = peak_rss_bytes()

    # -- while idle: the last answer laid out for the next turn ---------------------------------------
    def _may_settle(self, seq: LlamaSeq) -> bool:
        """A chat answer that ended normally (not cancelled), without thinking or tools, whose prompt may be
        reused (``prefix_cache`` on, a reusable cache): its next turn will likely begin with it."""
        r = seq.request
        return (seq.finish is not None and r.prompt is None and bool(r.messages) and not r.tools
                and seq.forcer is None and r.prefix_cache and self.reuse_ok and bool(self.turn_breaks))

    def idle_step(self) -> bool:
        """One step of idle work (the scheduler calls it while no request waits or runs): lay the last
        answer's turn out again in the canonical layout, one chunk (at most ``n_batch`` tokens) per call.
        Returns True while more remains.

        Why: a chat's next request is its previous prompt, the answer, and a new user turn. The answer's KV was
        decoded one token at a time, so it is not what a cold prefill of those tokens gives, and the next turn
        could reuse the previous prompt only up to the break that opens the answer (``app.engine.local.layout``).
        Here the chat with the answer and a stand-in user message (``SETTLE_PROBE``) is rendered and
        tokenized exactly as the next request will be, the slot's KV is cut back to the last common cut, and
        the tokens up to the cut that opens the next user turn are prefilled in chunks of the canonical
        layout: the next turn then reuses the answer's turn too, bit for bit as a cold prefill would compute
        it. A request arriving meanwhile waits for at most the chunk in flight; the slot's tokens and bounds
        are right after every chunk. When the next request does not repeat the answer verbatim the work is
        wasted, never wrong (reuse is by token prefix and layout). The cost: a repeat of the same prompt
        (regenerate) reuses the prompt up to its assistant break instead of all but its last token.
        ``cache_stats`` counts ``settled_answers`` and ``settled_tokens``."""
        try:
            if not self._settling:
                while self._settle_wanted and not self._settling:
                    sid, seq = self._settle_wanted.popitem()
                    plan = self._settle_plan(seq)
                    if plan is not None:
                        self._settling[sid] = plan
            if self._settling:
                sid = next(iter(self._settling))
                if self._settle_chunk(sid, self._settling[sid]):
                    self._settling.pop(sid, None)
        except Exception:  # noqa: BLE001 - idle work must never end the engine; its slot starts over
            log.exception("laying out the last answer again failed")
            for sid in list(self._settling):
                self._lib.llama_memory_seq_rm(self.mem, sid, -1, -1)
                self.slots[sid].forget()
            self._settling.clear()
        return bool(self._settling or self._settle_wanted)

    def _settle_plan(self, seq: LlamaSeq) -> _Settle | None:
        """What ``idle_step`` prefills for ``seq``'s answer, or None when nothing would be gained."""
        slot = self.slots[seq.slot]
        messages = tuple(seq.request.messages) + (ChatMessage("assistant", seq.streamer.text),
                                                  ChatMessage("user", SETTLE_PROBE))
        rp = self.render(replace(seq.request, messages=messages))
        tokens = self.tokenize(rp.text, add_bos=rp.add_bos, special=True)
        bounds = self.layout(tokens)
        cuts = [b for b in bounds if tokens[b] in self.turn_breaks]
        if len(cuts) < 2:
            return None
        target = cuts[-2]  # the stand-in's turn opens here; the last cut opens the answer after it
        start = self.live_prefix(slot, tokens, bounds)
        if target - start > SETTLE_MAX_TOKENS:
            target = usable(bounds, start + SETTLE_MAX_TOKENS)
        if start < MIN_LIVE_REUSE or target <= start or target >= self.settings.n_ctx:
            return None
        return _Settle(tokens, bounds, start, target)

    def _settle_chunk(self, sid: int, plan: _Settle) -> bool:
        """Prefill the next chunk of ``plan`` into slot ``sid``; True when it reached its target."""
        slot = self.slots[sid]
        if not plan.started:
            if self._keep_prefix(slot, plan.tokens, plan.pos) != plan.pos:
                return True  # the tail would not go: the slot was emptied, nothing to lay out
            plan.started = True
        start = plan.pos
        end = next_bound(plan.bounds, start)
        self._prefill_chunk(slot, plan.tokens, start, end)
        plan.pos = end
        self.settled["settled_tokens"] += end - start
        if end >= plan.target:
            self.settled["settled_answers"] += 1
            return True
        return False

    def _logprobs(self, idx: int, top_n: int):
        import numpy as np

        ptr = self._lib.llama_get_logits_ith(self.ctx, idx)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64)
        m = logits.max()
        lse = m + math.log(np.exp(logits - m).sum())
        top = np.argpartition(-logits, top_n)[:top_n] if top_n > 0 else []
        top = sorted(((int(t), float(logits[t] - lse)) for t in top), key=lambda x: -x[1])
        return (logits, top, lse)


class DraftModel:
    """The draft model of ``speculative: "draft"``: a second (small) GGUF with the target's vocabulary, in a
    context of its own with the same ``n_slots`` sequences (``_context_with_sequences``) and the target's load
    settings. Per slot it remembers the tokens its KV holds and is brought in line with the target's history
    before each proposal (the common prefix kept, the rest evaluated in chunks of ``n_batch``), so accepted
    guesses are never evaluated twice and rejected ones are dropped. Guesses are its argmax for greedy
    requests, and draws from ``speculative.target_dist`` of its logits under the request's own parameters
    (the same top-k/top-p/min-p/temperature) for sampled ones, whose q the verification needs (``last_q``).
    Leviathan et al. 2023 §3 (a smaller model of the same family as the approximation model).

    Raises ``ModelLoadError`` when the file does not load or its vocabulary differs from the target's (size,
    or the text of any of a spread sample of tokens)."""

    SAMPLE = 256  # token ids compared between the two vocabularies (spread over the whole range)

    def __init__(self, path: str, settings: LoadSettings, n_slots: int, target: "Runtime") -> None:
        import llama_cpp

        kwargs = llama_kwargs(settings)
        kwargs["n_ctx"] = settings.n_ctx * n_slots
        try:
            with _context_with_sequences(n_slots):
                self.llm = llama_cpp.Llama(model_path=path, **kwargs)
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"llama.cpp could not load the draft model: {exc}", path=path) from None
        self.path = path
        self._lib = llama_cpp
        self.ctx = self.llm._ctx.ctx
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_batch = settings.n_batch
        self.n_vocab = self.llm.n_vocab()
        self.batch = llama_cpp.llama_batch_init(settings.n_batch, 0, 1)
        self.tokens: list[list[int]] = [[] for _ in range(n_slots)]
        self._q: dict[int, list] = {}  # rid -> proposal distributions of its last guesses (sampled requests)
        self._check_vocab(target)

    def _check_vocab(self, target: "Runtime") -> None:
        mine, theirs = self.llm._model, target.llm._model
        why = ""
        if self.n_vocab != target.n_vocab:
            why = f"{self.n_vocab} tokens against the target's {target.n_vocab}"
        else:
            step = max(1, self.n_vocab // self.SAMPLE)
            for t in list(range(0, self.n_vocab, step)) + [self.n_vocab - 1]:
                a, b = mine.detokenize([t], special=True), theirs.detokenize([t], special=True)
                if a != b:
                    why = f"token {t} is {a!r} in the draft and {b!r} in the target"
                    break
        if why:
            raise ModelLoadError(f"the draft model {os.path.basename(self.path)} does not share the vocabulary "
                                 f"of {os.path.basename(target.model_path)}: {why}", path=self.path)

    def _decode(self, seq_id: int, pos0: int, toks: list[int]) -> None:
        b = self.batch
        for i, t in enumerate(toks):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + i, 1
            b.seq_id[i][0] = seq_id
            b.logits[i] = i == len(toks) - 1
        b.n_tokens = len(toks)
        rc = self._lib.llama_decode(self.ctx, b)
        if rc != 0:
            raise HearthError(f"llama_decode of the draft model failed (error {rc}) on {len(toks)} tokens")

    def _sync(self, slot: int, hist: list[int]) -> None:
        """Make the draft's KV of ``slot`` hold ``hist`` (the common prefix with what it holds is kept)."""
        have = self.tokens[slot]
        n = 0
        limit = min(len(have), len(hist))
        while n < limit and have[n] == hist[n]:
            n += 1
        if n == len(hist) and n:  # the last token must be evaluated again for its logits
            n -= 1
        if n < len(have):
            self._lib.llama_memory_seq_rm(self.mem, slot, n, -1)
            del have[n:]
        for a in range(n, len(hist), self.n_batch):
            part = hist[a:a + self.n_batch]
            self._decode(slot, a, part)
            have.extend(part)

    def propose(self, seq: LlamaSeq, hist: list[int], k: int) -> list[int]:
        """``k`` guesses after ``hist`` (the target's KV tokens and its pending token), one draft decode each."""
        import numpy as np

        d = seq.spec_d
        self._sync(seq.slot, hist)
        out, qs = [], []
        for i in range(k):
            row = np.ctypeslib.as_array(self._lib.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))
            if d.temperature == 0:
                t = spec.greedy_token(row, d.logit_bias)
            else:
                q = spec.target_dist(row, d)
                qs.append(q)
                t = q.sample(seq.spec_rng)
            out.append(t)
            if i < k - 1:
                self._decode(seq.slot, len(hist) + i, [t])
                self.tokens[seq.slot].append(t)
        self._q[seq.rid] = qs
        return out

    def last_q(self, seq: LlamaSeq) -> list:
        """The proposal distributions of ``seq``'s last guesses (sampled requests)."""
        return self._q.pop(seq.rid, [])


def _runs(ids: set[int]) -> int:
    """Runs of consecutive integers in ``ids`` ({0, 1, 3} → 2). llama.cpp splits a decode batch of a
    non-unified cache into one ubatch per run of consecutive sequence ids (``split_equal``, sequential), so a
    new request takes, among slots that reuse nothing, one that keeps the running ones contiguous."""
    return sum(1 for i in ids if i - 1 not in ids)


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
