"""``RemoteEngine``: a chat engine that answers through another OpenAI-compatible server (vLLM, llama-server,
another Hearth), a drop-in for ``app.engine.local.engine.Engine`` where the turn pipeline and the port use one.

What stays here and what runs there (docs/remote.md): the model, its template, its tokenizer, its KV cache and
its prefix cache are the remote's (vLLM's automatic prefix caching, llama-server's slot cache, the other
Hearth's disk cache). Hearth keeps the conversation store, documents and citations, the tool loop and the
context budget; every prompt is sent whole (messages, tools) on every request.

The HTTP client is the standard library's ``http.client`` on a thread per generation, not ``httpx``: httpx is
only a test dependency of this project, and what a stream needs here is one blocking reader whose socket
another thread can shut down (``cancel()``): ``socket.shutdown`` wakes a blocked ``recv`` at once, and the
remote sees the disconnect (vLLM aborts the request, llama-server frees the slot, Hearth cancels the
generation). No proxy support (``HTTP(S)_PROXY`` is not read).

- Requests: ``messages`` → ``POST {url}/chat/completions`` (tools, tool_choice, parallel_tool_calls,
  temperature, top_p, max_tokens, stop, seed, penalties, logit_bias, ``reasoning_effort`` when the request's
  reasoning budget names an effort; top_k / min_p / typical_p / repeat_penalty only to servers known to take
  them); ``prompt`` → ``POST {url}/completions``. Always streamed with ``stream_options.include_usage``.
- Thinking arrives as ``delta.reasoning_content`` (vLLM's reasoning parsers, llama-server, Hearth) or
  ``delta.reasoning``, and becomes ``Delta.reasoning``. Hearth cannot end a remote's thinking early:
  ``stop_thinking()`` returns False.
- Tool calls arrive structured (``delta.tool_calls``). They are written into the answer's text in the
  ``hermes`` format (``tool_format()`` returns it), so ``app.engine.chat.tool_stream.ToolStream``, which every
  adapter reads tool answers with, gets the same calls back: no adapter has to know the answer came from far.
- Metrics are measured at Hearth's boundary (``time.perf_counter`` here): ``ttft_s`` from sending the request
  to the first chunk with text (answer or thinking), ``ttfat_s`` to the first answer text, ITL between chunks
  (a chunk is usually one token on vLLM, llama-server and Hearth), ``queue_s`` the wait for one of
  ``n_parallel`` slots here. Token counts come from the remote's ``usage`` (``prompt_tokens_details.
  cached_tokens`` as ``cached_tokens``); when it sends none they stay 0 and ``Done.info["remote"]["usage"]``
  says ``"unknown"``. ``Done.info["remote"]`` names the remote (``name``, ``url``, ``model``, ``kind``) and
  carries the note that the timings are Hearth's, plus the remote's own timings when it sends them.
- Errors become ``RemoteError`` subclasses (``HearthError``) naming the remote and the status: 401/403
  ``RemoteAuthError``, 429 ``RemoteRateLimited`` (a ``QueueFull`` with the Retry-After), other 4xx
  ``RemoteBadRequest`` (an ``InvalidRequest``), 5xx and in-band error events ``RemoteServerError``, refused
  connections and connect timeouts ``RemoteUnreachable``, a silent remote ``RemoteTimeout``, a malformed
  line, a lost connection or a stream that ends without ``[DONE]`` ``RemoteStreamError``. A failure after
  text arrived carries it (``partial_text``, ``partial_reasoning``); the caller has already been given that
  text as ``Delta`` events, so ``ChatSession`` stores it as the answer with status ``error``.
- Vocabulary: the remote's ``/tokenize`` when it has one (llama-server, vLLM); otherwise an approximation
  (``approx_tokens``: UTF-8 bytes / 3, rounded up, deliberately high so the context budget errs towards
  fitting). ``render`` is a best-effort text of the messages (the remote applies its own template), good for
  counting only.

Not supported (refused with ``InvalidRequest`` naming the parameter, never silently dropped): logprobs,
speculative decoding, and a GBNF grammar (``response_format``, a schema-forced answer) except to a
llama-server, which takes ``grammar``. ``prefix_cache``, ``add_bos`` and ``template`` are the remote's
business and are ignored. The API key is sent as ``Authorization: Bearer``; it is never logged or shown
(``app.secrets``).
"""

from __future__ import annotations

import email.utils
import heapq
import http.client
import itertools
import json
import logging
import math
import re
import socket
import ssl
import statistics
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional
from urllib.parse import urlsplit, urlunsplit

from app.engine.chat.templates import RenderedPrompt
from app.engine.chat.tool_formats import FORMATS, ToolFormat
from app.engine.stream import EngineStats, StreamHandle, percentile
from app.errors import Cancelled, EngineCrashed, HearthError, InvalidRequest, ModelLoadError, QueueFull
from app.protocol.tools import ToolCall
from app.protocol.types import ChatMessage, DecodingParams, Delta, Done, GenerateRequest, LoadSettings, Metrics
from app.secrets import install_redaction, redact, register_secret

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
DEFAULT_N_CTX = 4096  # when the remote does not say (Hearth, a plain OpenAI-compatible server)
TOOL_FORMAT = "hermes"  # how a remote's structured calls are written into the answer text (module docstring)
TIMING_NOTE = ("timings measured at Hearth's boundary: from sending the request to the chunks arriving here "
               "(network and the remote's queue included); token counts are the remote's usage")
KINDS = ("hearth", "llama-server", "vllm", "openai")
_EXTENDED_SAMPLING = {"hearth", "llama-server", "vllm"}  # take top_k, min_p, ... besides OpenAI's parameters
_ERROR_BODY_LIMIT = 65536


# ------------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------------
class RemoteError(EngineCrashed):
    """The remote engine failed. ``remote``: ``"name (url)"``; ``status``: the HTTP status when one came;
    ``partial_text`` / ``partial_reasoning``: what it had said before it failed (already streamed to the
    caller as ``Delta`` events). A subclass of ``EngineCrashed``: like a dead engine process, the next request
    tries again (the port answers 503 with Retry-After)."""

    def __init__(self, message: str, remote: str = "", status: Optional[int] = None, partial_text: str = "",
                 partial_reasoning: str = "") -> None:
        super().__init__(message)
        self.remote, self.status = remote, status
        self.partial_text, self.partial_reasoning = partial_text, partial_reasoning

    def __reduce__(self):
        return (self.__class__, (self.message, self.remote, self.status, self.partial_text,
                                 self.partial_reasoning))


class RemoteUnreachable(RemoteError):
    """No connection: refused, no such host, or no answer within the connect timeout."""


class RemoteTimeout(RemoteError):
    """The remote sent nothing for ``read_timeout_s`` seconds (before the answer or in the middle of it)."""


class RemoteAuthError(RemoteError):
    """401 / 403: the remote refused the API key (or wants one and none is set)."""


class RemoteServerError(RemoteError):
    """A 5xx answer, or an error event inside the stream; the message is the remote's."""


class RemoteStreamError(RemoteError):
    """The stream broke: a malformed line, the connection lost mid-answer, or no ``[DONE]`` at its end."""


class RemoteRateLimited(QueueFull):
    """429 from the remote; ``retry_after_s`` from its Retry-After header (1 s when it sent none)."""

    def __init__(self, message: str, retry_after_s: float = 1.0, remote: str = "") -> None:
        super().__init__(message, retry_after_s)
        self.remote = remote

    def __reduce__(self):
        return (self.__class__, (self.message, self.retry_after_s, self.remote))


class RemoteBadRequest(InvalidRequest):
    """The remote refused the request (400, 404, 413, 422): ``param`` as the remote named it, ``status``."""

    def __init__(self, message: str, param: Optional[str] = None, remote: str = "",
                 status: Optional[int] = None) -> None:
        super().__init__(message, param)
        self.remote, self.status = remote, status

    def __reduce__(self):
        return (self.__class__, (self.message, self.param, self.remote, self.status))


# ------------------------------------------------------------------------------------------------------
# pure helpers: names, URLs, request bodies, the stream
# ------------------------------------------------------------------------------------------------------
def check_name(name: str) -> str:
    """``name`` if it can be a remote's name (it is the model id Hearth shows: letters, digits, ``-`` and
    ``_``, at most 64, no dots so that ``registry.model_id`` keeps it whole); else ``InvalidRequest``."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidRequest(f"a remote's name must be 1-64 letters, digits, '-' or '_' (starting with a letter "
                             f"or digit), got {name!r}", param="name")
    return name


def normalize_url(url: str) -> str:
    """The base URL of an OpenAI-compatible API: ``http(s)://host[:port]/path`` without a trailing slash;
    an empty path becomes ``/v1``. Credentials in the URL are refused (a key goes in an environment variable
    or the keyring, never in settings.json). Raises ``InvalidRequest(param="url")``."""
    if not isinstance(url, str):
        raise InvalidRequest(f"url must be text, got {url!r}", param="url")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"url must be http://HOST[:PORT]/v1 or https://..., got {url!r}", param="url")
    if parts.username or parts.password:
        raise InvalidRequest("the url must not hold a user name or password; give the API key with "
                             "--api-key-env VAR or --api-key-keyring", param="url")
    if parts.query or parts.fragment:
        raise InvalidRequest(f"the url must not have a query or fragment, got {url!r}", param="url")
    try:
        parts.port
    except ValueError:
        raise InvalidRequest(f"the url's port is not a number from 1 to 65535: {url!r}", param="url") from None
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def approx_tokens(text: str) -> int:
    """Tokens of ``text`` estimated without a tokenizer: UTF-8 bytes / 3, rounded up. English runs about 4
    bytes per token and CJK 3, so this errs high: a prompt counted this way fits the remote's context."""
    return math.ceil(len(text.encode("utf-8", "surrogatepass")) / 3)


def _message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [c.to_openai() for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _tool_choice(req: GenerateRequest) -> Any:
    c = req.choice
    if c.mode == "function":
        return {"type": "function", "function": {"name": c.name}}
    return c.mode


def _sampling(d: DecodingParams, kind: str) -> dict[str, Any]:
    out: dict[str, Any] = {"temperature": d.temperature, "top_p": d.top_p}
    if d.max_tokens is not None:
        out["max_tokens"] = d.max_tokens
    if d.stop:
        out["stop"] = list(d.stop)
    if d.seed is not None:
        out["seed"] = d.seed
    if d.presence_penalty:
        out["presence_penalty"] = d.presence_penalty
    if d.frequency_penalty:
        out["frequency_penalty"] = d.frequency_penalty
    if d.logit_bias:
        out["logit_bias"] = {str(t): b for t, b in d.logit_bias}
    if kind in _EXTENDED_SAMPLING:
        out.update(top_k=d.top_k, min_p=d.min_p)
        if d.typical_p != 1.0:
            out["typical_p"] = d.typical_p
        if d.repeat_penalty != 1.0:
            out["repetition_penalty" if kind == "vllm" else "repeat_penalty"] = d.repeat_penalty
    return out


def check_supported(req: GenerateRequest, kind: str, remote: str) -> None:
    """Refuse, naming the parameter, what a remote cannot be asked for (module docstring)."""
    if req.want_logprobs:
        raise InvalidRequest(f"logprobs are not available from the remote model {remote}", param="logprobs")
    if req.speculative is not None:
        raise InvalidRequest(f"speculative decoding is the remote's own setting ({remote}); send "
                             "hearth.speculative null", param="hearth.speculative")
    if req.decoding.grammar and kind != "llama-server":
        raise InvalidRequest(f"a grammar-constrained answer (response_format, a schema) cannot be forwarded to "
                             f"the remote {remote} (only a llama-server takes a grammar)", param="response_format")


def request_body(req: GenerateRequest, model: str, kind: str) -> tuple[str, dict[str, Any]]:
    """``(path, JSON body)`` of ``req`` for an OpenAI-compatible server of ``kind`` (``KINDS``)."""
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                            **_sampling(req.decoding, kind)}
    if req.decoding.grammar:
        body["grammar"] = req.decoding.grammar
    if req.prompt is not None:
        return "/completions", {**body, "prompt": req.prompt}
    body["messages"] = [_message(m) for m in req.messages or ()]
    if req.tools:
        body["tools"] = [t.to_openai() for t in req.tools]
        body["tool_choice"] = _tool_choice(req)
        body["parallel_tool_calls"] = req.parallel_tool_calls
    budget = req.reasoning.budget if req.reasoning is not None else None
    if budget is not None and budget.effort:
        body["reasoning_effort"] = budget.effort
    elif budget is not None and budget.tokens is not None and kind == "hearth":
        body["hearth"] = {"reasoning_budget": budget.tokens}  # another Hearth takes a budget in tokens
    return "/chat/completions", body


def _clip(text: str, n: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def error_message(raw: bytes) -> tuple[str, Optional[str]]:
    """``(message, param)`` of an error body: OpenAI's ``{"error": {...}}`` (vLLM, llama-server, Hearth),
    vLLM's older ``{"object": "error", "message": ...}``, FastAPI's ``{"detail": ...}``, or the text."""
    try:
        obj = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return _clip(raw.decode("utf-8", "replace")) or "(no message)", None
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        msg = err.get("message") or err.get("detail") or json.dumps(err)[:300]
        param = err.get("param") if isinstance(err.get("param"), str) else None
        return _clip(msg), param
    return _clip(str(err)), None


def retry_after(value: Optional[str], default: float = 1.0) -> float:
    """Seconds from a Retry-After header (a number, or an HTTP date); ``default`` when absent or unreadable."""
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    return max(0.0, when.timestamp() - time.time())


@dataclass
class StreamState:
    """What one answer's chunks said so far. ``feed(obj)`` reads one parsed ``data:`` object and returns
    ``(answer_text, thinking_text)`` to hand on now; tool calls are collected by index and written out by
    ``calls_text()`` at the end (the ``hermes`` format)."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish: Optional[str] = None
    usage: Optional[dict] = None
    remote_timings: Optional[dict] = None
    remote_meta: Optional[dict] = None
    response_id: Optional[str] = None

    def feed(self, obj: dict) -> tuple[str, str]:
        self.response_id = self.response_id or obj.get("id")
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        if isinstance(obj.get("timings"), dict):  # llama-server's own clocks
            self.remote_timings = obj["timings"]
        if isinstance(obj.get("hearth"), dict) and isinstance(obj["hearth"].get("metrics"), dict):
            self.remote_meta = obj["hearth"]["metrics"]  # another Hearth's metrics, on its own clocks
        choices = obj.get("choices") or []
        if not isinstance(choices, list):
            raise ValueError("choices is not a list")
        text, thought = "", ""
        for ch in choices:
            if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                continue
            if ch.get("finish_reason"):
                self.finish = ch["finish_reason"]
            delta = ch.get("delta")
            if isinstance(delta, dict):
                text += delta.get("content") or ""
                thought += delta.get("reasoning_content") or delta.get("reasoning") or ""
                self._calls(delta.get("tool_calls"))
            else:
                text += ch.get("text") or ""
                thought += ch.get("reasoning_content") or ""
        if not isinstance(text, str) or not isinstance(thought, str):
            raise ValueError("content is not text")
        self.text.append(text)
        self.reasoning.append(thought)
        return text, thought

    def _calls(self, items: Any) -> None:
        for item in items or ():
            if not isinstance(item, dict):
                raise ValueError("a tool_calls item is not an object")
            slot = self.calls.setdefault(int(item.get("index", len(self.calls))), {"name": "", "arguments": ""})
            fn = item.get("function") or {}
            slot["name"] += fn.get("name") or ""
            slot["arguments"] += fn.get("arguments") or ""

    def calls_text(self) -> str:
        """The collected calls as ``hermes`` call text ("" when none); the answer's own text comes before."""
        if not self.calls:
            return ""
        calls = [ToolCall(f"call_{i}", c["name"], c["arguments"] or "{}") for i, c in sorted(self.calls.items())]
        body = FORMATS[TOOL_FORMAT].render_calls(calls)
        return ("\n" if "".join(self.text) else "") + body

    def finish_reason(self) -> str:
        """Hearth's finish reason: "length" when the remote ran out of tokens, else "stop" (calls are read
        from the text by ``ToolStream``, which says "tool_calls" itself)."""
        return "length" if self.finish == "length" else "stop"


_SSE_FIELDS = ("event", "id", "retry")


def sse_data(line: bytes) -> Optional[str]:
    """The payload of one SSE line: the text after ``data:``, None for a line that carries none (blank,
    comment, ``event:`` / ``id:`` / ``retry:``). ``error: {...}`` (llama-server's in-band error) is returned
    as ``{"error": ...}`` text. Raises ``ValueError`` for anything else."""
    s = line.decode("utf-8").rstrip("\r\n")
    if not s or s.startswith(":"):
        return None
    name, sep, value = s.partition(":")
    value = value[1:] if value.startswith(" ") else value
    if sep and name == "data":
        return value
    if sep and name == "error":
        return json.dumps({"error": _json_or_text(value)})
    if sep and name in _SSE_FIELDS:
        return None
    raise ValueError(f"not a server-sent event line: {_clip(s, 80)!r}")


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return {"message": value}


# ------------------------------------------------------------------------------------------------------
# the connection
# ------------------------------------------------------------------------------------------------------
class _Http:
    """One HTTP exchange with the remote whose socket another thread may shut down (``abort``)."""

    def __init__(self, base: str, connect_timeout_s: float, read_timeout_s: float) -> None:
        p = urlsplit(base)
        self.https = p.scheme == "https"
        self.host, self.port = p.hostname or "", p.port or (443 if self.https else 80)
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.conn: Optional[http.client.HTTPConnection] = None
        self.sock: Optional[socket.socket] = None
        self.aborted = False

    def open(self, method: str, path: str, body: Optional[bytes],
             headers: dict[str, str]) -> http.client.HTTPResponse:
        """Connect and send; returns the response (headers read). Raises ``OSError`` kinds (classified by the
        caller): ``ConnectionRefusedError``, ``socket.gaierror``, ``TimeoutError``..."""
        if self.https:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.connect_timeout_s, context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout_s)
        self.conn = conn
        conn.connect()
        if self.aborted:
            raise ConnectionAbortedError("cancelled")
        assert conn.sock is not None
        # Kept here: http.client drops conn.sock once a response that ends at close (HTTP/1.0) is read.
        self.sock = conn.sock
        self.sock.settimeout(self.read_timeout_s)
        conn.request(method, path, body=body, headers=headers)
        return conn.getresponse()

    def abort(self) -> None:
        """Shut the socket down now (any thread): a blocked read returns, and the remote sees the client
        leave."""
        self.aborted = True
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.sock is not None:
            self.sock.close()


# ------------------------------------------------------------------------------------------------------
# slots: n_parallel requests forwarded at once, the rest wait here, highest priority first
# ------------------------------------------------------------------------------------------------------
class _Slots:
    def __init__(self, n: int, max_queue: int) -> None:
        self.n, self.max_queue = n, max_queue
        self.busy = 0
        self._waiting: list[tuple[int, int]] = []  # heap of (-priority, ticket)
        self._tickets = itertools.count()
        self._cond = threading.Condition()

    def enter(self) -> int:
        """A ticket, or ``QueueFull`` when every slot is busy and ``max_queue`` requests already wait."""
        with self._cond:
            if self.busy >= self.n and len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are already waiting for the remote engine "
                                f"({self.busy} running)", 2.0)
            return next(self._tickets)

    def acquire(self, ticket: int, priority: int, cancelled: Any) -> bool:
        """Wait for a slot (False when ``cancelled()`` became true first)."""
        key = (-priority, ticket)
        with self._cond:
            heapq.heappush(self._waiting, key)
            try:
                while not (self.busy < self.n and self._waiting[0] == key):
                    if cancelled():
                        return False
                    self._cond.wait(0.05)
                self.busy += 1
                return True
            finally:
                self._waiting.remove(key)
                heapq.heapify(self._waiting)
                self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self.busy -= 1
            self._cond.notify_all()

    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)


# ------------------------------------------------------------------------------------------------------
# the stream handle
# ------------------------------------------------------------------------------------------------------
class RemoteGeneration(StreamHandle):
    """One request's stream from the remote, shaped like ``Generation``: iterate for ``Delta`` events and a
    final ``Done``; ``cancel()`` (any thread) closes the HTTP stream; ``result()`` drains it. Raises
    ``InvalidRequest`` at once for what the remote cannot be asked (``check_supported``)."""

    def __init__(self, engine: "RemoteEngine", request: GenerateRequest) -> None:
        self._engine = engine
        self.request = request.validate()
        self.cancelled = False
        self.done: Optional[Done] = None
        self.thinks: Optional[bool] = None
        self.thought_closed = False
        self._http: Optional[_Http] = None
        self._deadline_hit = False
        self._iter = engine._run(self)

    def stop_thinking(self) -> bool:
        """Always False: a remote's thinking cannot be ended early from here (it runs to its own end)."""
        return False

    def cancel(self) -> None:
        """Stop this request: the HTTP stream is closed, so the remote sees the client leave."""
        self.cancelled = True
        h = self._http
        if h is not None:
            h.abort()

    def close(self) -> None:
        """Cancel it if it still runs, and release its slot."""
        if self.done is None:
            self.cancel()
        self._iter.close()

    def _hit_deadline(self) -> None:
        self._deadline_hit = True
        h = self._http
        if h is not None:
            h.abort()


# ------------------------------------------------------------------------------------------------------
# the engine
# ------------------------------------------------------------------------------------------------------
class RemoteEngine:
    """A chat engine answered by the OpenAI-compatible server at ``url`` (module docstring).

    ``name``: Hearth's name for it (``check_name``; also its model id, ``model_path``). ``model``: the
    remote's model id (None: the only one it serves). ``api_key``: sent as a Bearer token (``app.secrets``
    resolves it from an environment variable or the keyring; ``key_hint`` says where it came from, for the
    401 message). ``n_ctx``: the context in tokens (None: what the remote reports on ``load``, vLLM's
    ``max_model_len`` or llama-server's slot context, else ``DEFAULT_N_CTX``). ``n_parallel``: requests
    forwarded at once (the rest wait here, window first); ``max_queue``: how many may wait, then
    ``QueueFull``. ``connect_timeout_s`` / ``read_timeout_s``: seconds to connect / with no data."""

    def __init__(self, name: str, url: str, *, model: Optional[str] = None, api_key: Optional[str] = None,
                 key_hint: str = "", n_ctx: Optional[int] = None, n_parallel: int = 4, max_queue: int = 16,
                 connect_timeout_s: float = 10.0, read_timeout_s: float = 300.0) -> None:
        self.name = check_name(name)
        self.url = normalize_url(url)
        self.model = model
        self._api_key = api_key or None
        if self._api_key:
            register_secret(self._api_key)
            install_redaction()
        self.key_hint = key_hint
        self._n_ctx = n_ctx
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.kind = "openai"
        self.stats = EngineStats()
        self.info: dict[str, Any] = {}
        self.model_info: Any = None
        self._slots = _Slots(max(1, int(n_parallel)), max_queue)
        self._running: set[RemoteGeneration] = set()
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._tokenizer: Optional[str] = None  # "llama-server" | "vllm" | None (approximate)
        self._counts: OrderedDict[tuple, list[int]] = OrderedDict()
        self._loaded = False
        self._down = False
        self._closed = False

    @property
    def max_queue(self) -> int:
        """Requests allowed to wait here while every slot is busy (then ``QueueFull``)."""
        return self._slots.max_queue

    @max_queue.setter
    def max_queue(self, n: int) -> None:
        self._slots.max_queue = int(n)

    def __repr__(self) -> str:  # never the key
        return f"<RemoteEngine {self.name} {self.url} model={self.model!r}>"

    @classmethod
    def from_settings(cls, name: str, remote: Any, api_key: Optional[str] = None, key_hint: str = "",
                      **kw: Any) -> "RemoteEngine":
        """The engine for ``settings.json``'s ``remotes[name]`` (an ``app.settings.RemoteSettings``);
        ``api_key`` from ``app.secrets.api_key_for(name, remote)``."""
        return cls(name, remote.url, model=remote.model, api_key=api_key, key_hint=key_hint,
                   n_ctx=remote.n_ctx, n_parallel=remote.n_parallel, connect_timeout_s=remote.connect_timeout_s,
                   read_timeout_s=remote.read_timeout_s, **kw)

    # -- what the turn pipeline and the port read ------------------------------------------------------
    @property
    def model_path(self) -> str:
        """The remote's name: ``registry.model_id`` of it is the name, the id Hearth shows and stores."""
        return self.name

    @property
    def label(self) -> str:
        """``'name' (url)``: how messages name this remote."""
        return f"{self.name!r} ({self.url})"

    @property
    def n_ctx(self) -> int:
        return int(self._n_ctx or self.info.get("n_ctx") or DEFAULT_N_CTX)

    @property
    def settings(self) -> LoadSettings:
        """``LoadSettings`` with the remote's context and slots (the context budget reads ``n_ctx``)."""
        return LoadSettings(n_ctx=max(16, min(self.n_ctx, 1 << 20)), n_parallel=min(self.n_parallel, 64))

    @property
    def n_parallel(self) -> int:
        """Requests forwarded to the remote at once."""
        return self._slots.n

    @property
    def alive(self) -> bool:
        """Loaded, not closed, and the last exchange reached the remote."""
        return self._loaded and not self._closed and not self._down

    @property
    def pid(self) -> None:
        """No local process."""
        return None

    def queue_depth(self) -> int:
        """Requests waiting here for a slot."""
        return self._slots.waiting()

    def active(self) -> int:
        """Requests forwarded to the remote now."""
        return self._slots.busy

    def cache_stats(self) -> dict:
        """Empty: the prefix cache is the remote's (its ``usage.prompt_tokens_details.cached_tokens`` is in
        each answer's metrics)."""
        return {}

    # -- lifecycle ------------------------------------------------------------------------------------
    def load(self) -> dict:
        """Probe ``GET {url}/models``: the remote answers, the model exists (None: the only one served).
        Learns the kind of server and its context. Returns ``info``. Raises ``ModelLoadError`` naming the
        models it serves, or the ``RemoteError`` of a failed exchange."""
        if self._closed:
            raise ModelLoadError(f"the remote engine {self.label} was closed", path=self.url)
        listing = self._get_json("/models")
        models = _model_cards(listing)
        ids = [str(m["id"]) for m in models]
        chosen = self._choose(ids, models)
        card = next(m for m in models if m["id"] == chosen)
        self.model = chosen
        self.kind = "hearth" if isinstance(listing.get("hearth"), dict) else _kind(card)
        n_ctx = self._n_ctx or _card_ctx(card) or self._props_ctx() or DEFAULT_N_CTX
        self._tokenizer = self._probe_tokenizer()
        self.info = {"model": self.name, "model_path": self.name, "template": "remote", "n_ctx": int(n_ctx),
                     "n_parallel": self.n_parallel, "tool_format": TOOL_FORMAT,
                     "remote": {"name": self.name, "url": self.url, "model": chosen, "kind": self.kind,
                                "models": ids, "tokenizer": self._tokenizer or "approximate"}}
        self._loaded, self._down = True, False
        return self.info

    def _choose(self, ids: list[str], models: list[dict]) -> str:
        if self.model:
            if self.model in ids:
                return self.model
            raise ModelLoadError(f"the remote {self.label} has no model {self.model!r}; it serves: "
                                 f"{', '.join(ids) or '(none)'}", path=self.url)
        if len(ids) == 1:
            return ids[0]
        loaded = [m["id"] for m in models if isinstance(m.get("hearth"), dict) and m["hearth"].get("loaded")]
        if len(loaded) == 1:  # another Hearth lists every installed model; the one it has loaded answers soonest
            return str(loaded[0])
        raise ModelLoadError(f"the remote {self.label} serves {len(ids)} models ({', '.join(ids) or 'none'}); "
                             "name one with --model", path=self.url)

    def _props_ctx(self) -> Optional[int]:
        """llama-server's per-slot context from ``GET /props`` (None elsewhere)."""
        if self.kind != "llama-server":
            return None
        try:
            props = self._get_json("/props", root=True)
        except HearthError:
            return None
        n = (props.get("default_generation_settings") or {}).get("n_ctx")
        return int(n) if isinstance(n, int) and n > 0 else None

    def _probe_tokenizer(self) -> Optional[str]:
        if self.kind not in ("llama-server", "vllm"):
            return None
        try:
            self._remote_tokenize("Hello", False, False, self.kind)
            return self.kind
        except (HearthError, ValueError, KeyError, TypeError):
            log.info("remote %s: no usable /tokenize; token counts are approximate", self.name)
            return None

    def _ensure_loaded(self) -> None:
        if self._closed:
            raise EngineCrashed(f"the remote engine {self.label} was closed")
        if not self._loaded:
            with self._load_lock:
                if not self._loaded:
                    self.load()

    def close(self) -> None:
        """Stop every running request (their streams are closed)."""
        self._closed = True
        with self._lock:
            running = list(self._running)
        for g in running:
            g.cancel()

    def __enter__(self) -> "RemoteEngine":
        if not self._loaded:
            self.load()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- generation -----------------------------------------------------------------------------------
    def generate(self, request: GenerateRequest) -> RemoteGeneration:
        """The stream of ``request`` (nothing is sent until it is iterated). Raises ``InvalidRequest`` at once
        for bad parameters or what a remote cannot do (a grammar: the remote is probed first, only a
        llama-server takes one)."""
        if request.decoding.grammar and not self._loaded:
            self._ensure_loaded()
        check_supported(request, self.kind, self.label)
        return RemoteGeneration(self, request)

    def complete(self, request: GenerateRequest) -> Done:
        """Run ``request`` to its end; its ``Done`` (``text``: the whole answer)."""
        return self.generate(request).result()

    def tool_format(self, template: Optional[str] = None) -> ToolFormat:
        """The format the remote's calls are written in within the answer text (``hermes``)."""
        return FORMATS[TOOL_FORMAT]

    # -- vocabulary -----------------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = False, special: bool = False) -> list[int]:
        """Token ids of ``text``: the remote's own (``/tokenize`` of llama-server or vLLM) when it has one;
        otherwise *approximate*: ``approx_tokens(text)`` zeros (a count, not ids). Cached per text."""
        key = (text, add_bos, special)
        with self._lock:
            got = self._counts.get(key)
            if got is not None:
                self._counts.move_to_end(key)
                return got
        self._ensure_loaded()
        ids = self._remote_tokenize(text, add_bos, special, self._tokenizer) if self._tokenizer else None
        if ids is None:
            ids = [0] * approx_tokens(text)
        with self._lock:
            self._counts[key] = ids
            while len(self._counts) > 4096:
                self._counts.popitem(last=False)
        return ids

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` (exact with a remote tokenizer, else approximate; see ``tokenize``)."""
        return len(self.tokenize(text))

    def detokenize(self, tokens: list[int]) -> str:
        """Not available from a remote: raises ``HearthError``."""
        raise HearthError(f"the remote engine {self.label} cannot turn token ids back into text")

    def token_piece_bytes(self, token_id: int) -> bytes:
        """Not available (logprobs are refused for remote models): raises ``InvalidRequest``."""
        raise InvalidRequest(f"logprobs are not available from the remote model {self.label}", param="logprobs")

    def render(self, request: GenerateRequest) -> RenderedPrompt:
        """A best-effort text of ``request`` for counting tokens only: the remote applies its own template,
        which Hearth does not know. Each message is ``<|role|>\\ncontent\\n``; tools as their JSON."""
        if request.prompt is not None:
            return RenderedPrompt(request.prompt, "remote", add_bos=False)
        parts = [json.dumps(t.to_openai(), ensure_ascii=False) for t in request.tools]
        for m in request.messages or ():
            calls = "".join(json.dumps(c.to_openai(), ensure_ascii=False) for c in m.tool_calls)
            parts.append(f"<|{m.role}|>\n{m.content}{calls}\n")
        return RenderedPrompt("\n".join(parts) + "<|assistant|>\n", "remote", add_bos=False,
                              tool_format=TOOL_FORMAT if request.tools else "")

    def _remote_tokenize(self, text: str, add_bos: bool, special: bool, kind: Optional[str]) -> list[int]:
        if kind == "vllm":
            body = {"model": self.model, "prompt": text, "add_special_tokens": add_bos}
        else:
            body = {"content": text, "add_special": add_bos, "parse_special": special}
        got = self._post_json("/tokenize", body, root=True)
        tokens = got["tokens"]
        return [int(t if not isinstance(t, dict) else t["id"]) for t in tokens]

    # -- HTTP -----------------------------------------------------------------------------------------
    def _headers(self, sse: bool = False) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream" if sse else "application/json",
             "User-Agent": "hearth-remote"}
        if self._api_key:
            h["Authorization"] = f"Bearer {self._api_key}"
        return h

    def _path(self, path: str, root: bool = False) -> str:
        base = urlsplit(self.url).path
        if root and base.endswith("/v1"):
            base = base[: -len("/v1")]
        return base + path

    def _get_json(self, path: str, root: bool = False) -> dict:
        return self._exchange("GET", path, None, root)

    def _post_json(self, path: str, body: dict, root: bool = False) -> dict:
        return self._exchange("POST", path, json.dumps(body).encode(), root)

    def _exchange(self, method: str, path: str, body: Optional[bytes], root: bool) -> dict:
        h = _Http(self.url, self.connect_timeout_s, min(self.read_timeout_s, 60.0))
        try:
            resp = self._open(h, method, self._path(path, root), body, sse=False)
            try:
                raw = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                raise self._stream_error(exc, "", "") from None
            try:
                obj = json.loads(raw)
            except ValueError:
                raise RemoteStreamError(f"the remote {self.label} answered {method} {path} with something that "
                                        f"is not JSON: {_clip(raw.decode('utf-8', 'replace'), 80)!r}",
                                        self.label, resp.status) from None
            if not isinstance(obj, dict):
                raise RemoteStreamError(f"the remote {self.label} answered {method} {path} with JSON that is "
                                        "not an object", self.label, resp.status)
            return obj
        finally:
            h.close()

    def _open(self, h: _Http, method: str, path: str, body: Optional[bytes], sse: bool) -> http.client.HTTPResponse:
        """Send and read the status; a non-2xx answer raises its typed error."""
        log.debug("remote %s: %s %s", self.name, method, path)
        try:
            resp = h.open(method, path, body, self._headers(sse))
        except (TimeoutError, socket.timeout) as exc:
            self._down = True
            if h.sock is not None:
                raise RemoteTimeout(f"the remote {self.label} did not answer within {self.read_timeout_s:g} s",
                                    self.label) from None
            raise RemoteUnreachable(f"cannot reach the remote {self.label}: no connection within "
                                    f"{self.connect_timeout_s:g} s ({exc or 'timed out'})", self.label) from None
        except (OSError, http.client.HTTPException) as exc:
            if h.aborted:
                raise Cancelled("cancelled while connecting to the remote") from None
            self._down = True
            raise RemoteUnreachable(f"cannot reach the remote {self.label}: {_os_reason(exc)}", self.label) from None
        self._down = False
        if resp.status >= 300:
            raise self._status_error(resp)
        return resp

    def _status_error(self, resp: http.client.HTTPResponse) -> HearthError:
        try:
            raw = resp.read(_ERROR_BODY_LIMIT)
        except (OSError, http.client.HTTPException):
            raw = b""
        msg, param = error_message(raw)
        msg = redact(msg)  # a remote may echo the key it refused
        st = f"{resp.status} {resp.reason}".strip()
        if resp.status in (401, 403):
            where = f" (the key from {self.key_hint})" if self.key_hint and self._api_key else ""
            hint = ("" if self._api_key else
                    "; none is set: add one with `hearth remote add NAME URL --api-key-env VAR`")
            return RemoteAuthError(f"the remote {self.label} refused the API key{where}: {st}: {msg}{hint}",
                                   self.label, resp.status)
        if resp.status == 429:
            after = retry_after(resp.getheader("Retry-After"))
            return RemoteRateLimited(f"the remote {self.label} is rate limiting requests (429): {msg}; retry after "
                                     f"{after:g} s", after, self.label)
        if 400 <= resp.status < 500:
            return RemoteBadRequest(f"the remote {self.label} refused the request: {st}: {msg}", param or None,
                                    self.label, resp.status)
        self._down = resp.status in (502, 503, 504)
        return RemoteServerError(f"the remote {self.label} failed: {st}: {msg}", self.label, resp.status)

    def _stream_error(self, exc: BaseException, text: str, thought: str) -> RemoteError:
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return RemoteTimeout(f"the remote {self.label} sent nothing for {self.read_timeout_s:g} s in the "
                                 "middle of the answer", self.label, None, text, thought)
        self._down = True
        return RemoteStreamError(f"the connection to the remote {self.label} was lost in the middle of the answer "
                                 f"({_os_reason(exc)})", self.label, None, text, thought)

    # -- the stream -----------------------------------------------------------------------------------
    def _run(self, gen: RemoteGeneration) -> Iterator[Delta | Done]:
        """Wait for a slot, forward ``gen.request`` and relay its chunks (see ``_relay``)."""
        t_call = time.perf_counter()
        self.stats.requests += 1
        ticket = self._slots.enter()
        if not self._slots.acquire(ticket, gen.request.priority, lambda: gen.cancelled or self._closed):
            self.stats.cancelled += 1
            raise Cancelled("cancelled before it started")
        with self._lock:
            self._running.add(gen)
        timer = None
        try:
            self._ensure_loaded()
            if gen.cancelled:
                raise Cancelled("cancelled before it started")
            path, body = request_body(gen.request, str(self.model), self.kind)
            gen._http = h = _Http(self.url, self.connect_timeout_s, self.read_timeout_s)
            if gen.request.deadline_s is not None:
                timer = threading.Timer(max(0.0, gen.request.deadline_s - (time.perf_counter() - t_call)),
                                        gen._hit_deadline)
                timer.daemon = True
                timer.start()
            yield from self._relay(gen, h, path, json.dumps(body).encode(), t_call)
        except (Cancelled, GeneratorExit):  # cancel(), or the consumer closed the stream early
            if gen.done is None:
                self.stats.cancelled += 1
            raise
        except Exception:
            self.stats.failed += 1
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if gen._http is not None:
                if gen.done is None:  # left early (closed, failed): the remote sees the client leave
                    gen._http.abort()
                gen._http.close()
            with self._lock:
                self._running.discard(gen)
            self._slots.release()

    def _relay(self, gen: RemoteGeneration, h: _Http, path: str, body: bytes,
               t_call: float) -> Iterator[Delta | Done]:
        t_send = time.perf_counter()
        try:
            resp = self._open(h, "POST", self._path(path), body, sse=True)
        except RemoteTimeout:
            if gen._deadline_hit:
                yield self._done(gen, StreamState(), t_call, t_send, [], None, stopped_by="deadline")
                return
            raise
        except (RemoteError, Cancelled):
            if gen.cancelled:
                raise Cancelled("cancelled while waiting for the remote") from None
            if gen._deadline_hit:
                yield self._done(gen, StreamState(), t_call, t_send, [], None, stopped_by="deadline")
                return
            raise
        ctype = resp.getheader("Content-Type") or ""
        if "text/event-stream" not in ctype:
            raise RemoteStreamError(f"the remote {self.label} answered {resp.status} but not with an event stream "
                                    f"(Content-Type {ctype or 'none'})", self.label, resp.status)
        st = StreamState()
        times: list[float] = []
        t_answer: Optional[float] = None
        for obj in self._events(gen, resp, st):
            if "error" in obj and not obj.get("choices"):
                msg, _param = error_message(json.dumps(obj).encode())
                raise RemoteServerError(f"the remote {self.label} failed in the middle of the answer: {msg}",
                                        self.label, None, "".join(st.text), "".join(st.reasoning))
            try:
                text, thought = st.feed(obj)
            except (ValueError, TypeError, AttributeError) as exc:
                raise RemoteStreamError(f"the remote {self.label} sent a chunk Hearth cannot read ({exc})",
                                        self.label, None, "".join(st.text), "".join(st.reasoning)) from None
            if not (text or thought):
                continue
            now = time.perf_counter()
            times.append(now)
            if text and t_answer is None:
                t_answer, gen.thought_closed = now, bool("".join(st.reasoning))
            yield Delta(text, reasoning=thought)
        if gen._deadline_hit:
            yield self._done(gen, st, t_call, t_send, times, t_answer, stopped_by="deadline")
            return
        calls = st.calls_text()
        if calls:
            yield Delta(calls)
        yield self._done(gen, st, t_call, t_send, times, t_answer)

    def _events(self, gen: RemoteGeneration, resp: http.client.HTTPResponse, st: StreamState) -> Iterator[dict]:
        """The parsed ``data:`` objects until ``[DONE]``; the stream's failures as typed errors."""
        while True:
            try:
                line = resp.readline()
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if gen.cancelled:
                    raise Cancelled("cancelled during the answer") from None
                if gen._deadline_hit:
                    return
                raise self._stream_error(exc, "".join(st.text), "".join(st.reasoning)) from None
            if not line:
                if gen.cancelled:
                    raise Cancelled("cancelled during the answer")
                if gen._deadline_hit:
                    return
                self._down = True
                raise RemoteStreamError(f"the remote {self.label} ended the stream without [DONE] (the answer is "
                                        "incomplete)", self.label, None, "".join(st.text), "".join(st.reasoning))
            try:
                data = sse_data(line)
                if data is None:
                    continue
                if data.strip() == "[DONE]":
                    return
                obj = json.loads(data)
                if not isinstance(obj, dict):
                    raise ValueError("an event is not a JSON object")
            except (ValueError, UnicodeDecodeError) as exc:
                raise RemoteStreamError(f"the remote {self.label} sent a malformed event line ({exc}): "
                                        f"{_clip(line.decode('utf-8', 'replace'), 80)!r}", self.label, None,
                                        "".join(st.text), "".join(st.reasoning)) from None
            yield obj

    def _done(self, gen: RemoteGeneration, st: StreamState, t_call: float, t_send: float, times: list[float],
              t_answer: Optional[float], stopped_by: Optional[str] = None) -> Done:
        m = _metrics(st, t_call, t_send, times, t_answer)
        self._count(m)
        usage = "remote" if st.usage else "unknown"
        remote: dict[str, Any] = {"name": self.name, "url": self.url, "model": self.model, "kind": self.kind,
                                  "usage": usage, "note": TIMING_NOTE, "finish_reason": st.finish,
                                  "response_id": st.response_id}
        if st.remote_timings:
            remote["timings"] = st.remote_timings
        if st.remote_meta:
            remote["metrics"] = st.remote_meta
        info: dict[str, Any] = {"model": self.name, "template": "remote", "n_ctx": self.n_ctx, "remote": remote,
                                "stopped_by": stopped_by}
        if gen.request.tools:
            info["tool_format"] = TOOL_FORMAT
        finish = "length" if stopped_by == "deadline" else st.finish_reason()
        gen.done = Done(finish, m, "".join(st.text) + st.calls_text(), info, "".join(st.reasoning))
        return gen.done

    def _count(self, m: Metrics) -> None:
        with self._lock:
            s = self.stats
            s.completed += 1
            s.prompt_tokens += m.prompt_tokens
            s.cached_tokens += m.cached_tokens
            s.completion_tokens += m.completion_tokens


def _model_cards(listing: dict) -> list[dict]:
    """The entries of a ``/v1/models`` answer that have an id. Another Hearth whose loaded model lives outside
    its models folder lists ``data: []`` and names its loaded models in ``hearth.pool.models``: those."""
    cards = [m for m in (listing.get("data") or []) if isinstance(m, dict) and m.get("id")]
    hearth = listing.get("hearth")
    if not cards and isinstance(hearth, dict):
        pool = (hearth.get("pool") or {}).get("models") or {}
        cards = [{"id": str(k), "owned_by": "hearth", "hearth": {"loaded": True}} for k in pool]
    return cards


def _kind(card: dict) -> str:
    """Which server a ``/v1/models`` entry comes from (``KINDS``)."""
    owner = str(card.get("owned_by") or "").lower()
    if owner == "hearth" or isinstance(card.get("hearth"), dict):
        return "hearth"
    if owner in ("llamacpp", "llama.cpp") or isinstance(card.get("meta"), dict) and "n_ctx_train" in card["meta"]:
        return "llama-server"
    if owner == "vllm" or "max_model_len" in card:
        return "vllm"
    return "openai"


def _card_ctx(card: dict) -> Optional[int]:
    n = card.get("max_model_len")
    return int(n) if isinstance(n, int) and n > 0 else None


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is the server running, and on that port?)"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror or exc})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({exc.reason or exc})"
    if isinstance(exc, http.client.IncompleteRead):
        return "the connection closed before the chunk ended"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the remote closed the connection"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _metrics(st: StreamState, t_call: float, t_send: float, times: list[float], t_answer: Optional[float]) -> Metrics:
    """Hearth-boundary clocks (module docstring) and the remote's usage."""
    end = time.perf_counter()
    itl = [b - a for a, b in zip(times, times[1:])]
    u = st.usage or {}
    prompt, completion = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    if not cached and st.remote_timings:
        cached = int(st.remote_timings.get("cache_n") or 0)
    reasoning = int((u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return Metrics(
        prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion,
        ttft_s=(times[0] - t_send) if times else (end - t_send),
        tpot_s=statistics.fmean(itl) if itl else 0.0,
        itl_p50_s=percentile(itl, 0.5), itl_p95_s=percentile(itl, 0.95), itl_max_s=max(itl) if itl else 0.0,
        decode_tps=(len(itl) / span) if span > 0 else 0.0, total_s=end - t_send, queue_s=t_send - t_call,
        cache_source="remote" if cached else "none", cache_reuse="remote" if cached else "cold",
        cache_reuse_reason="the remote's own prefix cache" if cached else "remote: no cached tokens reported",
        reasoning_tokens=reasoning, answer_tokens=max(0, completion - reasoning),
        ttfat_s=(t_answer - t_send) if t_answer is not None else None,
    )
