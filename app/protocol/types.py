"""Value types that cross the engine boundary: load settings, decoding parameters, requests, stream events
and metrics. All are plain, picklable dataclasses; validation raises ``InvalidRequest`` naming the parameter,
its range and the value received (the habit of mlx-lm ``sample_utils.make_sampler``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Union

from app.errors import InvalidRequest
from app.protocol.reasoning import ReasoningBudget
from app.protocol.tools import ToolCall, ToolChoice, ToolSpec

KV_TYPES = ("f16", "q8_0", "q4_0")


def _check_range(name: str, value: Any, lo: float | None, hi: float | None, *, integer: bool = False,
                 lo_open: bool = False) -> None:
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise InvalidRequest(f"{name} must be {kind}, got {value!r}", param=name)
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest(f"{name} must be finite, got {value!r}", param=name)
    if lo is not None and (value <= lo if lo_open else value < lo):
        rng = f"> {lo}" if lo_open else f">= {lo}"
        raise InvalidRequest(f"{name} must be {rng}" + (f" and <= {hi}" if hi is not None else "")
                             + f", got {value!r}", param=name)
    if hi is not None and value > hi:
        raise InvalidRequest(f"{name} must be <= {hi}" + (f" and >= {lo}" if lo is not None else "")
                             + f", got {value!r}", param=name)


@dataclass(frozen=True)
class LoadSettings:
    """How a model is loaded into llama.cpp (llama-cpp-python ``Llama(...)`` arguments).

    n_ctx: context window in tokens. n_batch: the canonical prefill chunk in tokens (prefix-cache reuse ends at a
    cut of the canonical layout, app.engine.local.layout: every n_batch tokens and before each turn). n_ubatch:
    the physical batch in tokens: consecutive chunks of one prompt share one llama_decode up to this many tokens
    where that leaves their bits unchanged (layout.merged_end; 512: two 256-token chunks per pass over the
    weights, ~7 % faster long prefill here, docs/prefix-cache.md). n_threads: CPU threads (None: llama.cpp's
    default). n_gpu_layers: layers offloaded to the GPU (-1 all; ignored by a CPU build). type_k / type_v: KV
    cache element type (f16, q8_0, q4_0; a quantized V needs flash attention). flash_attn: flash attention on/off.
    offload_kqv: keep the KV cache on the GPU. use_mmap / use_mlock: map / lock the weights. swa_full: keep a
    full-size sliding-window cache (needed so prefixes are reusable exactly on Gemma 3; see docs/prefix-cache.md).
    n_parallel: sequences served at once (continuous batching; each has its own n_ctx tokens of KV, so the KV
    cache is n_parallel × n_ctx tokens); None: chosen from the memory estimate when the engine loads
    (``memory_estimate.choose_parallel``: 4 where it fits).
    """

    n_ctx: int = 4096
    n_batch: int = 256
    n_ubatch: int = 512
    n_threads: int | None = None
    n_gpu_layers: int = 0
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = True
    offload_kqv: bool = True
    use_mmap: bool = True
    use_mlock: bool = False
    swa_full: bool = True
    seed: int = 0xFFFFFFFF
    n_parallel: int | None = None

    def validate(self) -> "LoadSettings":
        """Raise ``InvalidRequest`` for a value out of range; return self."""
        _check_range("n_ctx", self.n_ctx, 16, 1 << 20, integer=True)
        _check_range("n_batch", self.n_batch, 1, 1 << 16, integer=True)
        _check_range("n_ubatch", self.n_ubatch, 1, 1 << 16, integer=True)
        if self.n_threads is not None:
            _check_range("n_threads", self.n_threads, 1, 1024, integer=True)
        _check_range("n_gpu_layers", self.n_gpu_layers, -1, 100000, integer=True)
        if self.n_parallel is not None:
            _check_range("n_parallel", self.n_parallel, 1, MAX_PARALLEL, integer=True)
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_TYPES:
                raise InvalidRequest(f"{name} must be one of {', '.join(KV_TYPES)}, got {getattr(self, name)!r}",
                                     param=name)
        if self.type_v != "f16" and not self.flash_attn:
            raise InvalidRequest(
                f"type_v={self.type_v} (a quantized V cache) needs flash attention; enable flash_attn "
                "or use type_v=f16", param="type_v")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


MAX_PARALLEL = 64  # sequences in one context (llama.cpp allows 256; each needs its own n_ctx of KV)


@dataclass(frozen=True)
class DecodingParams:
    """How tokens are chosen (sampling parameters of llama.cpp's sampler chain).

    temperature 0 is greedy. top_k 0 disables top-k; top_p / min_p / typical_p 1.0 / 0.0 / 1.0 disable theirs.
    repeat_penalty 1.0, presence_penalty 0, frequency_penalty 0 disable penalties. seed None: random.
    stop: strings that end the answer (never emitted, not even partly). logit_bias: token id -> bias added to
    its logit. max_tokens: answer length cap in tokens (None: until stop or the context is full).
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    max_tokens: int | None = 256
    grammar: str | None = None  # GBNF text, validated before it reaches llama.cpp

    def validate(self) -> "DecodingParams":
        """Raise ``InvalidRequest`` naming the first bad parameter; return self."""
        _check_range("temperature", self.temperature, 0.0, 100.0)
        _check_range("top_k", self.top_k, 0, 1 << 30, integer=True)
        _check_range("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        _check_range("min_p", self.min_p, 0.0, 1.0)
        _check_range("typical_p", self.typical_p, 0.0, 1.0, lo_open=True)
        _check_range("repeat_penalty", self.repeat_penalty, 0.0, 10.0, lo_open=True)
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.seed is not None:
            _check_range("seed", self.seed, 0, 2**32 - 1, integer=True)
        if self.max_tokens is not None:
            _check_range("max_tokens", self.max_tokens, 1, None, integer=True)
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) for s in self.stop):
            raise InvalidRequest(f"stop must be a list of strings, got {self.stop!r}", param="stop")
        if any(s == "" for s in self.stop):
            raise InvalidRequest("stop strings must not be empty", param="stop")
        if len(self.stop) > 16:
            raise InvalidRequest(f"at most 16 stop strings, got {len(self.stop)}", param="stop")
        for tok, bias in self.logit_bias:
            _check_range("logit_bias", tok, 0, None, integer=True)
            _check_range("logit_bias", bias, -100.0, 100.0)
        return self

    def updated(self, **changes: Any) -> "DecodingParams":
        """A validated copy with ``changes`` applied (loose values accepted, as in ``make``)."""
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        kw["logit_bias"] = dict(self.logit_bias)
        kw.update(changes)
        return DecodingParams.make(**kw)

    @classmethod
    def make(cls, **kw: Any) -> "DecodingParams":
        """Build and validate from loose values (a str stop becomes a 1-tuple, a dict logit_bias a tuple)."""
        stop = kw.get("stop")
        if stop is None:
            kw["stop"] = ()
        elif isinstance(stop, str):
            kw["stop"] = (stop,)
        elif isinstance(stop, (list, tuple)):
            kw["stop"] = tuple(stop)
        lb = kw.get("logit_bias")
        if lb is None:
            kw["logit_bias"] = ()
        elif isinstance(lb, dict):
            try:
                kw["logit_bias"] = tuple((int(k), float(v)) for k, v in lb.items())
            except (TypeError, ValueError):
                raise InvalidRequest(f"logit_bias must map token ids to numbers, got {lb!r}",
                                     param="logit_bias") from None
        return cls(**kw).validate()


@dataclass(frozen=True)
class ChatMessage:
    """One chat message. ``role``: system | user | assistant | tool; ``content``: plain text ("" allowed for
    an assistant turn that only made calls). ``tool_calls``: the calls an assistant turn made (OpenAI's
    ``message.tool_calls``); ``tool_call_id``: on a ``tool`` message, the id of the call whose result
    ``content`` is; ``name``: optional name of the author (a tool message may carry its function's name)."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages: tuple[ChatMessage, ...]) -> None:
    """Raise ``InvalidRequest`` naming the first bad message field (``messages[i].role``, ``.content``,
    ``.tool_calls``, ``.tool_call_id``): roles in ``ROLES``, text content, calls only on assistant turns,
    and every tool message answering a call made by an earlier assistant turn."""
    if not messages:
        raise InvalidRequest("messages must not be empty", param="messages")
    calls: set[str] = set()
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if m.role not in ROLES:
            raise InvalidRequest(f"{at}.role must be system, user, assistant or tool, got {m.role!r}",
                                 param=f"{at}.role")
        if not isinstance(m.content, str):
            raise InvalidRequest(f"{at}.content must be text", param=f"{at}.content")
        if m.tool_calls and (m.role != "assistant" or not all(isinstance(c, ToolCall) for c in m.tool_calls)):
            raise InvalidRequest(f"{at}.tool_calls: only assistant messages carry tool calls",
                                 param=f"{at}.tool_calls")
        calls.update(c.id for c in m.tool_calls)
        if m.role == "tool":
            _check_tool_message(m, at, calls)


def _check_tool_message(m: ChatMessage, at: str, calls: set[str]) -> None:
    if not isinstance(m.tool_call_id, str) or not m.tool_call_id:
        raise InvalidRequest(f"{at}.tool_call_id is required on a tool message", param=f"{at}.tool_call_id")
    if m.tool_call_id not in calls:
        raise InvalidRequest(f"{at}.tool_call_id {m.tool_call_id!r} answers no tool call of an earlier "
                             "assistant message", param=f"{at}.tool_call_id")


# docs/speculative.md: "auto" (adaptive prompt lookup) is what None means when no setting names a mode
SPECULATIVE_MODES = ("auto", "prompt_lookup", "draft", "off")


@dataclass(frozen=True)
class ReasoningRequest:
    """How one request may think (docs/reasoning.md).

    ``budget``: the request's budget as ``reasoning_budget.resolve_budget`` resolved it over the request,
    conversation and model layers (not yet fitted: the engine fits it to the context with
    ``ReasoningBudget.fit``). ``answer_now``: a line inserted after a forced end of thinking (s1's
    "Final Answer:"), None for none. A request without one (``GenerateRequest.reasoning`` None) still has
    a native thinker's thinking split off, with the unset budget (half the context left)."""

    budget: ReasoningBudget = field(default_factory=ReasoningBudget)
    answer_now: str | None = None

    def validate(self) -> "ReasoningRequest":
        if not isinstance(self.budget, ReasoningBudget):
            raise InvalidRequest("reasoning.budget must be a ReasoningBudget (reasoning_budget.resolve_budget)",
                                 param="hearth.reasoning_budget")
        if self.answer_now is not None and (not isinstance(self.answer_now, str) or len(self.answer_now) > 200):
            raise InvalidRequest(f"hearth.answer_now must be text of at most 200 characters, got "
                                 f"{self.answer_now!r}", param="hearth.answer_now")
        return self


@dataclass(frozen=True)
class GenerateRequest:
    """One generation. Exactly one of ``prompt`` (raw text, no template) or ``messages`` (templated).

    ``template``: a template name to force (None: the model's own or the one chosen by architecture).
    ``prefix_cache``: allow reuse/saving of KV state for this request.
    ``want_logprobs``: top-N alternatives per generated token (0: none).
    ``priority``: the scheduler admits higher first (the desktop window sends 1, the port 0); equal
    priorities in arrival order. ``deadline_s``: seconds from the engine receiving the request to its end;
    when it passes the answer so far is returned with finish_reason "length" and ``info["stopped_by"] ==
    "deadline"`` (None: no deadline). ``speculative`` (docs/speculative.md): one of ``SPECULATIVE_MODES``;
    None: the model's ``per_model`` setting, else "auto" (prompt lookup where it pays).

    Tools (docs/tools.md): ``tools`` are rendered into the prompt (the GGUF template's ``tools`` or the
    model's ``ToolFormat``), and the format's stop strings are added; ``tool_choice`` None means "auto" with
    tools; "required" or a named function decodes through the format's grammar (one call, or several when
    ``parallel_tool_calls``), which cannot be combined with ``decoding.grammar``. The answer's text is read
    by ``app.engine.chat.tool_stream`` in the caller's process.
    """

    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    decoding: DecodingParams = field(default_factory=DecodingParams)
    template: str | None = None
    add_bos: bool = True
    prefix_cache: bool = True
    want_logprobs: int = 0
    priority: int = 0
    deadline_s: float | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    reasoning: ReasoningRequest | None = None
    speculative: str | None = None

    @property
    def choice(self) -> ToolChoice:
        """``tool_choice`` with its default filled in: "auto" with tools, "none" without."""
        if self.tool_choice is not None:
            return self.tool_choice
        return ToolChoice("auto" if self.tools else "none")

    def validate(self) -> "GenerateRequest":
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequest("give exactly one of prompt or messages", param="messages")
        if self.messages is not None:
            check_messages(self.messages)
        self._check_tools()
        if self.reasoning is not None:
            if not isinstance(self.reasoning, ReasoningRequest):
                raise InvalidRequest("reasoning must be a ReasoningRequest", param="reasoning_effort")
            self.reasoning.validate()
        if self.speculative is not None and self.speculative not in SPECULATIVE_MODES:
            raise InvalidRequest(f"hearth.speculative must be one of {', '.join(SPECULATIVE_MODES)} or null, "
                                 f"got {self.speculative!r}", param="hearth.speculative")
        _check_range("priority", self.priority, -100, 100, integer=True)
        if self.deadline_s is not None:
            _check_range("deadline_s", self.deadline_s, 0.0, 1e6, lo_open=True)
        self.decoding.validate()
        return self

    def _check_tools(self) -> None:
        if not isinstance(self.tools, tuple) or not all(isinstance(t, ToolSpec) for t in self.tools):
            raise InvalidRequest("tools must be a tuple of ToolSpec (app.engine.chat.tools.parse_tools)",
                                 param="tools")
        if self.tools and self.prompt is not None:
            raise InvalidRequest("tools need messages (a chat), not a raw prompt", param="tools")
        choice = self.choice
        if choice.forces_call:
            if choice.mode == "function" and choice.name not in {t.name for t in self.tools}:
                raise InvalidRequest(f"tool_choice names function {choice.name!r}, which is not in tools",
                                     param="tool_choice")
            if not self.tools:
                raise InvalidRequest("tool_choice is 'required' but the request has no tools", param="tool_choice")
            if self.decoding.grammar:
                raise InvalidRequest("tool_choice forces a tool call through a grammar, and the request already "
                                     "has one (response_format): use one or the other", param="tool_choice")


@dataclass
class Metrics:
    """Timings and counts of one generation. Clocks (``time.perf_counter`` in the caller's process):

    - ``ttft_s``: the request entered its slot (admitted by the scheduler, after any queue wait) → the first
      token's text was available to the caller. Includes template, tokenization, cache restore and prefill
      (and, under load, the other requests' decode steps interleaved with its prefill chunks).
    - ``queue_s``: the stream began (first ``next`` on ``Engine.generate``'s stream) → the request entered its
      slot (waiting for a free slot).
    - ``prefill_s``: engine process began evaluating prompt tokens → last prompt token evaluated
      (``prefill_tps`` = (prompt_tokens − cached_tokens) / prefill_s).
    - ``tpot_s``: mean time per output token after the first (= mean of the inter-token latencies).
    - ``itl_*``: inter-token latency, time between successive tokens arriving at the caller (P50, P95, max).
    - ``decode_tps``: (completion_tokens − 1) / (last token time − first token time).
    - ``total_s``: accepted → done.
    - ``restore_s``: time to load a prefix-cache entry from disk (0 if none).
    - ``save_s``: time this request's path spent saving KV state to the disk prefix cache (0: the engine
      saves a slot's chunks while idle, after the answer; docs/prefix-cache.md).
    - ``cache_reuse``: ``"exact"`` when ``cached_tokens`` were reused (live KV or a disk entry; every reuse
      path gives the cold prefill's KV bits in the cold prefill's cells, docs/prefix-cache.md), ``"cold"``
      when none were; ``cache_reuse_reason`` names the path or why none was taken.
    - ``peak_rss_bytes``: peak resident memory of the engine process (``ru_maxrss``).
    - ``batch_peak``: the most sequences decoded in one step while this request decoded (1: it ran alone, and
      its tokens are exactly the solo run's).
    - ``prefill_shared``: the prompt (shorter than one chunk) arrived with others and was prefilled in one
      ``llama_decode`` with theirs: its KV, and so even its first token, may differ in the last bits from a
      solo run (every other prompt is prefilled alone, in the canonical layout).

    Thinking (``reasoning_budget.ReasoningMetrics``): ``reasoning_tokens`` / ``answer_tokens`` split
    ``completion_tokens`` (sampled tokens; inserted end-of-thinking text is in neither);
    ``ttfat_s``: the request entered its slot → the first *answer* text was available to the caller (None:
    no answer text); ``thinking_s``: first thinking token → end of thinking (engine clock);
    ``reasoning_budget``: the thinking tokens allowed after fitting (None: no thinking split for this
    model and request); ``reasoning_forced`` / ``reasoning_stopped_by`` ("budget", "deadline", "user"):
    Hearth ended thinking, and why; ``reasoning_unclosed``: the output ended inside thinking.

    Speculative decoding (docs/speculative.md): ``spec_mode`` ("prompt_lookup", "draft", "auto" once the
    default guessed, or None), ``spec_drafted`` draft tokens proposed, ``spec_accepted`` of them accepted,
    ``spec_steps`` verification steps with guesses (``acceptance_rate`` = accepted / drafted).
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    itl_p50_s: float = 0.0
    itl_p95_s: float = 0.0
    itl_max_s: float = 0.0
    prefill_s: float = 0.0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    total_s: float = 0.0
    queue_s: float = 0.0
    restore_s: float = 0.0
    save_s: float = 0.0
    cache_source: str = "none"  # none | memory | disk
    cache_error: str = ""  # why a prefix-cache entry was rejected (then the prompt was prefilled cold)
    cache_reuse: str = "cold"  # exact (a prefix was reused, bit for bit a cold prefill's) | cold
    cache_reuse_reason: str = ""  # which reuse path, or why none was taken
    peak_rss_bytes: int = 0
    batch_peak: int = 1
    prefill_shared: bool = False
    reasoning_tokens: int = 0
    answer_tokens: int = 0
    ttfat_s: float | None = None
    thinking_s: float = 0.0
    reasoning_budget: int | None = None
    reasoning_forced: bool = False
    reasoning_stopped_by: str | None = None
    reasoning_unclosed: bool = False
    spec_mode: str | None = None
    spec_drafted: int = 0
    spec_accepted: int = 0
    spec_steps: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted ÷ drafted speculative tokens (None when nothing was drafted)."""
        return self.spec_accepted / self.spec_drafted if self.spec_drafted else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Delta:
    """New answer text. ``text`` never splits a UTF-8 character nor holds part of a stop string;
    ``token_ids`` are the tokens whose text completed in this delta; ``logprobs`` per token when asked.
    ``reasoning``: new thinking text (kept apart from the answer: never part of ``text`` nor of
    ``Done.text``; markers removed)."""

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[Any, ...] = ()
    reasoning: str = ""


@dataclass(frozen=True)
class Done:
    """The generation ended. finish_reason: "stop" (end-of-turn token or stop string) or "length"
    (max_tokens or context full). ``info``: template used, model id, etc. ``reasoning``: the whole thinking
    text (markers removed; "" when the model did not think)."""

    finish_reason: str
    metrics: Metrics
    text: str = ""
    info: dict = field(default_factory=dict)
    reasoning: str = ""


Event = Union[Delta, Done]
