"""``RemoteEngine``: a chat engine that answers through another OpenAI-compatible server (vLLM, llama-server,
another Hearth), a drop-in for ``app.engine.local.engine.Engine`` where the turn pipeline and the port use one.
The model, its template, tokenizer and caches are the remote's; Hearth keeps the conversation, the tool loop and
the context budget, and sends every prompt whole. What is forwarded, refused, measured and raised: docs/remote.md.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from collections import OrderedDict
from typing import Any, Iterator, Optional
from urllib.parse import urlsplit

from app.engine.chat.templates import RenderedPrompt
from app.engine.chat.tool_formats import FORMATS, ToolFormat
from app.engine.remote.errors import (
    RemoteAuthError,
    RemoteBadRequest,
    RemoteError,
    RemoteRateLimited,
    RemoteServerError,
    RemoteStreamError,
    RemoteTimeout,
    RemoteUnreachable,
)
from app.engine.remote.http import _Http, _os_reason, _Slots
from app.engine.remote.wire import (
    TOOL_FORMAT,
    StreamState,
    _card_ctx,
    _clip,
    _kind,
    _metrics,
    _model_cards,
    approx_tokens,
    check_name,
    check_supported,
    error_message,
    normalize_url,
    request_body,
    retry_after,
    sse_data,
)
from app.engine.stream import EngineStats, StreamHandle
from app.errors import Cancelled, EngineCrashed, HearthError, InvalidRequest, ModelLoadError
from app.protocol.types import Delta, Done, GenerateRequest, LoadSettings, Metrics
from app.secrets import install_redaction, redact, register_secret

log = logging.getLogger(__name__)  # app.secrets installs log redaction on this logger by name

DEFAULT_N_CTX = 4096  # when the remote does not say (Hearth, a plain OpenAI-compatible server)
TIMING_NOTE = ("timings measured at Hearth's boundary: from sending the request to the chunks arriving here "
               "(network and the remote's queue included); token counts are the remote's usage")
_ERROR_BODY_LIMIT = 65536


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
    """A chat engine answered by the OpenAI-compatible server at ``url`` (docs/remote.md).

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
