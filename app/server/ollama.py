"""Ollama's native API (``/api/*``) on the same port and the same models, pool and metrics as ``/v1``.

One mechanism, as ``messages`` and ``responses``: an Ollama body is mapped onto a chat-completions (or, for
``/api/generate`` with ``raw``, a completions) body and runs through ``convert`` and ``Service``;
``OllamaAnswer`` writes the result as Ollama's objects and NDJSON lines. Errors are Ollama's
``{"error": "..."}`` (``OllamaRoute``).

The reasoning: docs/server.md, 'Ollama API (`/api/*`)'.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Optional, Union

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse

from app.engine.chat.tool_parser import TextPiece
from app.errors import InvalidRequest, ModelNotFound
from app.server import convert, embeddings, limits
from app.server import format as fmt
from app.server.convert import Plan
from app.server.errors import ApiError, from_exception, from_http, from_validation
from app.server.models import loaded_id
from app.server.openai_schema import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from app.server.service import ChoiceStart, Thought
from app.server.source import parse_keep_alive

VERSION = "0.6.0"  # the Ollama API version Hearth answers like (clients gate features on it)
NDJSON = "application/x-ndjson"
# options Hearth honours per request -> the chat-completions field they become
SAMPLING = {**{k: k for k in ("temperature", "top_k", "top_p", "min_p", "typical_p", "seed", "stop", "repeat_penalty",
                              "presence_penalty", "frequency_penalty")}, "num_predict": "max_tokens"}
# chat-completions parameter names -> the Ollama names errors give
NAMES = {**{v: f"options.{k}" for k, v in SAMPLING.items()}, "response_format": "format", "reasoning_effort": "think",
         "max_completion_tokens": "options.num_predict"}
THINK = {True: "medium", False: "none", "low": "low", "medium": "medium", "high": "high"}
CAPABILITIES = {"chat": "completion", "tools": "tools", "thinking": "thinking", "embeddings": "embedding"}
SAMPLING_DEFAULTS = "temperature 0.8\ntop_k 40\ntop_p 0.95\nmin_p 0.05"  # Hearth's (docs/server.md)
FOREVER = "9999-12-31T23:59:59Z"  # expires_at of a model that is never unloaded while idle


# -- request bodies ------------------------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # Ollama ignores fields it does not know; so does Hearth


class ModelRequest(_Body):
    """``/api/show`` and ``/api/delete``: ``model`` (``name`` is its older spelling)."""

    model: Optional[str] = None
    name: Optional[str] = None


class _Generating(_Body):
    model: Optional[str] = None
    stream: StrictBool = True  # Ollama's default
    options: Optional[dict[str, Any]] = None
    format: Optional[Union[str, dict[str, Any]]] = None
    keep_alive: Any = None
    think: Optional[Union[bool, str]] = None


class ChatRequest(_Generating):
    """``POST /api/chat``'s body (docs/server.md, 'Ollama API (`/api/*`)')."""

    messages: Optional[list[dict[str, Any]]] = None
    tools: Optional[list[Any]] = None


class GenerateRequest(_Generating):
    """``POST /api/generate``'s body (docs/server.md, 'Ollama API (`/api/*`)')."""

    prompt: Optional[str] = None
    system: Optional[str] = None
    suffix: Optional[str] = None
    template: Optional[str] = None
    raw: StrictBool = False
    images: Optional[list[Any]] = None
    context: Optional[list[int]] = None


class EmbedRequest(_Body):
    """``POST /api/embed`` (``input``: a string or a list) and ``/api/embeddings`` (``prompt``)."""

    model: Optional[str] = None
    input: Optional[Union[str, list[Any]]] = None
    prompt: Optional[str] = None
    truncate: Optional[StrictBool] = None
    dimensions: Optional[StrictInt] = None
    options: Optional[dict[str, Any]] = None


async def read_body(request: Request, cls: type[BaseModel]) -> Any:
    """The JSON body as ``cls``, whatever the Content-Type (``curl -d`` sends a form type; Ollama reads JSON
    anyway), parsed and validated in a worker thread (``limits.read_model``). Raises ``InvalidJson`` (not
    JSON), ``InvalidRequest`` or ``RequestValidationError`` naming the field."""
    return await limits.read_model(request, cls)


def model_name(name: Optional[str]) -> Optional[str]:
    """A request's model name as Hearth knows it: Ollama's default tag ``:latest`` dropped."""
    return (name[: -len(":latest")] if name.endswith(":latest") else name) if name else None


# -- mapping onto the chat machinery -------------------------------------------------------------------------
def sampling(options: Optional[dict[str, Any]], n_ctx: Optional[int] = None,
             trained: Callable[[], Optional[int]] = lambda: None) -> dict[str, Any]:
    """Ollama ``options`` as chat-completions fields. ``num_predict`` -1 / -2 (no limit / fill the context)
    means no ``max_tokens``; ``mirostat`` 0 (off) and a ``num_ctx`` within ``n_ctx`` (the loaded context, in
    tokens; None: not checked yet; ``trained()``: the model's trained context, for the hint) are accepted;
    every other option is refused, since it would be ignored.
    Raises ``InvalidRequest`` naming ``options.<key>``."""
    out: dict[str, Any] = {}
    for key, value in (options or {}).items():
        at = f"options.{key}"
        if key in SAMPLING:
            if key == "num_predict" and isinstance(value, int) and value in (-1, -2):
                continue
            out[SAMPLING[key]] = value
        elif key == "mirostat" and value in (0, None):
            continue
        elif key == "num_ctx":
            _check_num_ctx(value, n_ctx, trained)
        else:
            raise InvalidRequest(f"{at} is not supported by Hearth (per request it honours "
                                 f"{', '.join(SAMPLING)}, num_ctx and mirostat 0); load-time settings such as "
                                 "the context size, threads and GPU layers are set with `hearth serve` flags or in "
                                 "Settings", param=at)
    if isinstance(out.get("max_tokens"), int) and out["max_tokens"] < 1:
        raise InvalidRequest(f"options.num_predict must be at least 1, or -1 for no limit, got {out['max_tokens']}",
                             param="options.num_predict")
    return out


def _check_num_ctx(value: Any, n_ctx: Optional[int], trained: Callable[[], Optional[int]]) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(f"options.num_ctx must be a whole number of tokens >= 1, got {value!r:.40}",
                             param="options.num_ctx")
    if n_ctx is not None and value > n_ctx:  # the hint: at most the trained context (else LoadSettings' most)
        top = min(trained() or 1 << 20, 1 << 20)
        more = (f"load it with a larger context (`hearth serve --n-ctx {min(value, top)}`, or Settings)"
                if top > n_ctx else f"use a model trained on a longer context than its {top} tokens")
        raise InvalidRequest(f"options.num_ctx {value} is larger than the model's loaded context of {n_ctx} tokens; "
                             f"Hearth does not reload a model per request: send num_ctx <= {n_ctx}, or {more}",
                             param="options.num_ctx")


def response_format(value: Any) -> Optional[dict[str, Any]]:
    """Ollama ``format`` as ``response_format``: "json" → any JSON object, a schema → ``json_schema`` (not
    strict: keywords the grammar cannot enforce are accepted, as Ollama does), "" / None → text."""
    if value in (None, ""):
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": value}}
    raise InvalidRequest(f'format must be "json" or a JSON schema (an object), got {value!r:.60}', param="format")


def reasoning_effort(think: Any) -> Optional[str]:
    """Ollama ``think`` as ``reasoning_effort``: true → medium, false → none, "low" / "medium" / "high"."""
    if think is None:
        return None
    if isinstance(think, (bool, str)) and think in THINK:
        return THINK[think]
    raise InvalidRequest(f'think must be true, false, "low", "medium" or "high", got {think!r:.40}', param="think")


def chat_messages(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ollama messages as chat-completions messages. An assistant's ``tool_calls`` (arguments an object) get
    ids; a ``tool`` message answers the first unanswered call with its ``tool_name`` (else the first
    unanswered). Raises ``InvalidRequest`` naming ``messages[i]...`` (``images``: no vision yet)."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (call id, name) not answered yet
    for i, m in enumerate(raw):
        at = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidRequest(f"{at} must be an object with a role", param=f"{at}.role")
        if m.get("images"):
            raise InvalidRequest(f"{at}.images: images are not supported (Hearth has no vision model yet); send "
                                 "text only", param=f"{at}.images")
        content = m.get("content") or ""
        if not isinstance(content, str):
            raise InvalidRequest(f"{at}.content must be a string", param=f"{at}.content")
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [_call(c, f"{at}.tool_calls[{j}]", i, j) for j, c in enumerate(m["tool_calls"])]
            pending.extend((c["id"], c["function"]["name"]) for c in calls)
            out.append({"role": "assistant", "content": content or None, "tool_calls": calls})
        elif m["role"] == "tool":
            out.append({"role": "tool", "content": content, "tool_call_id": _answered(pending, m, at)})
        else:
            out.append({"role": m["role"], "content": content})
    return out


def _call(c: Any, at: str, i: int, j: int) -> dict[str, Any]:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidRequest(f'{at} must be {{"function": {{"name", "arguments"}}}}', param=at)
    args = fn.get("arguments", {})
    if not isinstance(args, dict):
        raise InvalidRequest(f"{at}.function.arguments must be an object", param=f"{at}.function.arguments")
    return {"id": c.get("id") or f"call_{i}_{j}", "type": "function",
            "function": {"name": fn["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def _answered(pending: list[tuple[str, str]], m: dict[str, Any], at: str) -> str:
    if m.get("tool_call_id"):
        return str(m["tool_call_id"])
    if not pending:
        raise InvalidRequest(f"{at}: a tool message must follow an assistant message with tool_calls",
                             param=f"{at}.role")
    name = m.get("tool_name") or m.get("name")
    k = next((k for k, (_, n) in enumerate(pending) if n == name), 0)
    return pending.pop(k)[0]


def chat_body(body: ChatRequest) -> ChatCompletionRequest:
    """The chat-completions request an ``/api/chat`` body means. Raises ``InvalidRequest``."""
    return _validated(ChatCompletionRequest, {
        "model": model_name(body.model), "messages": chat_messages(body.messages or []), "stream": body.stream,
        "response_format": response_format(body.format), "tools": body.tools or None,
        "reasoning_effort": reasoning_effort(body.think), "keep_alive": body.keep_alive,
        **sampling(body.options)})


def generate_body(body: GenerateRequest) -> Union[ChatCompletionRequest, CompletionRequest]:
    """``/api/generate``: with ``raw`` a completions request (the prompt as is), else a chat request of
    ``system`` and ``prompt`` through the model's template. Raises ``InvalidRequest`` for ``images``,
    ``suffix``, ``template``, ``context`` and ``system`` with ``raw``."""
    for field, why in (("images", "Hearth has no vision model yet"), ("suffix", "fill-in-the-middle is not "
                       "supported"), ("template", "a per-request template is not supported"),
                       ("context", "the deprecated context is not supported; send the conversation to /api/chat")):
        if getattr(body, field):
            raise InvalidRequest(f"{field}: {why}", param=field)
    if body.raw and body.system:
        raise InvalidRequest("system cannot be combined with raw: true (a raw prompt is sent as is)", param="system")
    common = {"model": model_name(body.model), "stream": body.stream, "keep_alive": body.keep_alive,
              "response_format": response_format(body.format), "reasoning_effort": reasoning_effort(body.think),
              **sampling(body.options)}
    if body.raw:
        return _validated(CompletionRequest, {**common, "prompt": body.prompt or ""})
    system = [{"role": "system", "content": body.system}] if body.system else []
    return _validated(ChatCompletionRequest, {**common, "messages": [*system,
                                                                      {"role": "user", "content": body.prompt}]})


def _validated(cls: type[BaseModel], data: dict[str, Any]) -> Any:
    try:
        return cls.model_validate({k: v for k, v in data.items() if v is not None})
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None


# -- answers -------------------------------------------------------------------------------------------------
def now_iso(t: Optional[float] = None) -> str:
    """RFC 3339 UTC time with nanosecond-free microseconds and ``Z`` (Ollama's ``created_at``)."""
    d = datetime.fromtimestamp(time.time() if t is None else t, tz=timezone.utc)
    return d.isoformat().replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return max(0, int(round(seconds * 1e9)))


def tool_calls(choice: fmt.Choice) -> list[dict[str, Any]]:
    """The choice's calls in Ollama's shape: ``[{"function": {"name", "arguments": {...}}}]``."""
    calls = choice.tools.calls if choice.tools is not None else ()
    return [{"function": {"name": c.name, "arguments": _args(c.arguments)}} for c in calls]


def _args(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {}


class OllamaAnswer:
    """Writes one ``/api/chat`` (``kind`` "chat") or ``/api/generate`` ("generate") answer: the ``Answer`` of
    ``Service``. ``t0``: when the request arrived (``time.perf_counter``); ``load_s``: seconds spent getting
    the model held (loading it when the pool had to)."""

    def __init__(self, kind: str, t0: float, load_s: float) -> None:
        self.kind, self.t0, self.load_s = kind, t0, load_s

    def frame(self, plan: Plan) -> fmt.Frame:
        """An id for the registry of running requests (Ollama's objects carry none)."""
        return fmt.Frame.new(plan)

    def piece(self, frame: fmt.Frame, text: str = "", thinking: str = "",
              calls: Optional[list] = None) -> dict[str, Any]:
        """One object (``model``, ``created_at``, ``done: false``): a chat ``message`` or a generate
        ``response``, with ``thinking`` / ``tool_calls`` when there are any."""
        head = {"model": frame.plan.model, "created_at": now_iso()}
        extra = {"thinking": thinking} if thinking else {}
        if self.kind == "chat":
            msg = {"role": "assistant", "content": text, **extra, **({"tool_calls": calls} if calls else {})}
            return {**head, "message": msg, "done": False}
        return {**head, "response": text, **extra, "done": False}

    def final(self, obj: dict[str, Any], choice: fmt.Choice) -> dict[str, Any]:
        """``obj`` made the last one: ``done``, ``done_reason`` and the durations (nanoseconds, from the
        generation's ``Metrics``: docs/server.md)."""
        m = choice.done.metrics
        return {**obj, "done": True, "done_reason": "length" if choice.finish_reason == "length" else "stop",
                "total_duration": _ns(time.perf_counter() - self.t0), "load_duration": _ns(self.load_s),
                "prompt_eval_count": m.prompt_tokens, "prompt_eval_duration": _ns(m.ttft_s),
                "eval_count": m.completion_tokens, "eval_duration": _ns(m.total_s - m.ttft_s)}

    async def whole(self, frame: fmt.Frame, choices: list[fmt.Choice], piece: Any) -> dict:
        """The one object of ``stream: false``."""
        c = choices[0]
        return self.final(self.piece(frame, c.text, c.reasoning, tool_calls(c)), c)

    async def stream(self, frame: fmt.Frame, pieces: AsyncIterator[Any], piece: Any) -> AsyncIterator[bytes]:
        """One line per piece of thinking or text; the calls in one line once read whole; the last line
        ``done: true`` with the durations."""
        async for p in pieces:
            if isinstance(p, ChoiceStart):
                continue
            if isinstance(p, Thought):
                yield _line(self.piece(frame, thinking=p.text))
            elif isinstance(p, TextPiece) and p.text:
                yield _line(self.piece(frame, p.text))
            elif isinstance(p, fmt.Choice):
                calls = tool_calls(p)
                if calls:
                    yield _line(self.piece(frame, calls=calls))
                yield _line(self.final(self.piece(frame), p))

    def error_event(self, err: ApiError) -> bytes:
        """``{"error": "..."}`` as a line: the ``ollama`` client raises ``ResponseError`` on it."""
        return _line({"error": message(err)})


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


# -- errors --------------------------------------------------------------------------------------------------
def message(err: ApiError) -> str:
    """An ``ApiError``'s message with its parameter under the Ollama name (``temperature`` →
    ``options.temperature``, ``response_format`` → ``format``), added as ``(param: ...)`` when the text
    does not name it."""
    if not err.param:
        return err.message
    head = err.param.split(".")[0].split("[")[0]
    name = NAMES.get(head)
    param = err.param.replace(head, name, 1) if name else err.param
    word = re.compile(rf"\b{re.escape(head)}\b")
    if word.search(err.message):
        return word.sub(name, err.message, count=1) if name else err.message
    return f"{err.message} (param: {param})"


def api_error(exc: BaseException) -> ApiError:
    """The ``ApiError`` for an exception raised while answering an ``/api/*`` request."""
    if isinstance(exc, RequestValidationError):
        return from_validation(exc)
    if isinstance(exc, StarletteHTTPException):
        return from_http(exc)
    return from_exception(exc)


class OllamaRoute(APIRoute):
    """A route whose errors are answered in Ollama's shape (and counted in ``/metrics`` like the others),
    before the app's handlers (which answer OpenAI's shape) see them."""

    def get_route_handler(self) -> Callable:
        """The handler, wrapped."""
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # noqa: BLE001 - every error becomes an answer (bugs are logged)
                err = api_error(exc)
                request.app.state.hearth.metrics.error(err.type, err.code)
                return JSONResponse({"error": message(err)}, status_code=err.status, headers=err.headers)
        return run


# -- models --------------------------------------------------------------------------------------------------
def parameter_size(n: int) -> str:
    """``268.1M``, ``8.0B``: Ollama's ``parameter_size``."""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def details(info: Any) -> dict[str, Any]:
    """``details`` from a ``ModelInfo`` (None: the file could not be read)."""
    arch = info.architecture if info is not None else ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": parameter_size(info.parameter_count) if info is not None else "",
            "quantization_level": info.quantization if info is not None else ""}


def digest(path: str, mid: str) -> str:
    """A 64-hex identity of the file: sha256 of its path, size and mtime (hashing gigabytes per listing would
    be too slow; docs/server.md)."""
    try:
        st = Path(path).stat()
        key = f"{path}\0{st.st_size}\0{st.st_mtime_ns}"
    except OSError:
        key = f"{path}\0{mid}"
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def model_info(info: Any) -> dict[str, Any]:
    """``model_info``: the GGUF header keys Ollama reports (``general.*`` and ``<arch>.*``)."""
    if info is None:
        return {}
    a = info.architecture
    out = {"general.architecture": a, "general.name": info.name, "general.parameter_count": info.parameter_count,
           "general.file_type": info.file_type, f"{a}.block_count": info.n_layer,
           f"{a}.embedding_length": info.n_embd, f"{a}.feed_forward_length": info.n_ff,
           f"{a}.attention.head_count": info.n_head, f"{a}.attention.head_count_kv": info.n_head_kv,
           f"{a}.vocab_size": info.n_vocab}
    if info.context_length:
        out[f"{a}.context_length"] = info.context_length
    return out


class Models:
    """The models of ``st`` (the app's ``State``) as Ollama lists them: ``/v1/models``' listing
    (``st.source.listing``) with each file's path and ``ModelInfo`` from the catalog."""

    def __init__(self, st: Any) -> None:
        self.st = st

    def rows(self) -> list[tuple[dict[str, Any], str, Any]]:
        """Blocking: ``(listing entry, path, ModelInfo | None)`` per model."""
        st = self.st
        data = st.source.listing(st.embedder)
        paths = {mid: path for mid, path, _ in st.catalog.entries(st.provider(), st.embedder)}
        rows = [(m, paths.get(m["id"], "")) for m in data]
        return [(m, path, st.catalog.info(path) if path else None) for m, path in rows]

    def find(self, name: Optional[str]) -> tuple[dict[str, Any], str, Any]:
        """Blocking: the row ``name`` names (id or file name, ``:latest`` allowed; none: the default chat model,
        the first chat model listed); ``ModelNotFound``."""
        rows = self.rows()
        want = model_name(name)
        for m, path, info in rows:
            if want in (m["id"], m["hearth"].get("file")) if want else m["hearth"]["kind"] == "chat":
                return m, path, info
        raise ModelNotFound(name or "", [r[0]["id"] for r in rows])

    @staticmethod
    def tag(m: dict[str, Any], path: str, info: Any) -> dict[str, Any]:
        """One ``/api/tags`` entry."""
        size = info.size_bytes if info is not None else 0
        return {"name": m["id"], "model": m["id"], "modified_at": now_iso(m["created"]), "size": size,
                "digest": digest(path, m["id"]), "details": details(info)}

    def show(self, name: Optional[str]) -> dict[str, Any]:
        """Blocking: ``/api/show``'s answer for ``name``."""
        m, path, info = self.find(name)
        template = (info.chat_template or "") if info is not None else ""
        return {"modelfile": f"# Modelfile generated by Hearth\nFROM {path or m['id']}\n",
                "parameters": SAMPLING_DEFAULTS if m["hearth"]["kind"] == "chat" else "",
                "template": template, "details": details(info), "model_info": model_info(info),
                "capabilities": [CAPABILITIES[c] for c in m["hearth"].get("capabilities", []) if c in CAPABILITIES],
                "modified_at": now_iso(m["created"])}

    def running(self) -> list[dict[str, Any]]:
        """Blocking: ``/api/ps``' models: the loaded ones, ``size`` their memory (the pool's figure, else the
        estimate, else the file's size, bytes), when they unload (``expires_at``) and the loaded context
        (``context_length``, tokens) where known."""
        pool = self.st.source.pool_status() or {}
        out = []
        for m, path, info in self.rows():
            if not m["hearth"].get("loaded"):
                continue
            slot = (pool.get("models") or {}).get(m["id"])
            size = ((slot or {}).get("memory_bytes") or m["hearth"].get("memory_estimate_bytes")
                    or (info.size_bytes if info is not None else 0))
            out.append({**self.tag(m, path, info), "size": size, "size_vram": 0, "expires_at": _expires(slot),
                        "context_length": self._n_ctx(m["id"])})
        return out

    def _n_ctx(self, mid: str) -> Optional[int]:
        eng = self.st.provider()
        return eng.settings.n_ctx if eng is not None and loaded_id(eng) == mid else None


def _expires(slot: Optional[dict[str, Any]]) -> str:
    if not slot or slot.get("ttl_s") is None or slot.get("idle_s") is None:
        return FOREVER
    return now_iso(time.time() + max(0.0, slot["ttl_s"] - slot["idle_s"]))


# -- routes --------------------------------------------------------------------------------------------------
KNOWN = {"/api/version": "GET", "/api/tags": "GET", "/api/ps": "GET", "/api/show": "POST", "/api/chat": "POST",
         "/api/generate": "POST", "/api/embed": "POST", "/api/embeddings": "POST", "/api/pull": "POST",
         "/api/delete": "DELETE"}


def routes(app: FastAPI, st: Any) -> None:
    """Ollama's ``/api/*`` routes on ``app`` (``st``: the app's ``State``)."""
    router = APIRouter(route_class=OllamaRoute)
    models = Models(st)
    _model_routes(router, st, models)
    _generation_routes(router, st)
    _embedding_routes(router, st)

    @router.api_route("/api/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"],
                      include_in_schema=False)
    async def unknown(rest: str, request: Request) -> JSONResponse:
        path = "/api/" + rest
        if path in KNOWN:
            return JSONResponse({"error": f"{request.method} {path} is not allowed; use {KNOWN[path]}"},
                                status_code=405, headers={"Allow": KNOWN[path]})
        return JSONResponse({"error": f"{path} is not part of Hearth's Ollama API (docs/server.md lists the "
                                      "endpoints)"}, status_code=404)
    app.include_router(router)


def _model_routes(router: APIRouter, st: Any, models: Models) -> None:
    @router.get("/api/version")
    async def version() -> dict:
        return {"version": VERSION}

    @router.get("/api/tags")
    async def tags() -> dict:
        rows = await run_in_threadpool(models.rows)
        return {"models": [Models.tag(*row) for row in rows]}

    @router.post("/api/show")
    async def show(request: Request) -> dict:
        body = await read_body(request, ModelRequest)
        return await run_in_threadpool(models.show, body.model or body.name)

    @router.get("/api/ps")
    async def ps() -> dict:
        return {"models": await run_in_threadpool(models.running)}

    @router.api_route("/api/pull", methods=["POST"])
    @router.api_route("/api/delete", methods=["DELETE"])
    async def manage(request: Request) -> JSONResponse:
        body = await read_body(request, ModelRequest)
        what = "download" if request.url.path == "/api/pull" else "delete"
        raise InvalidRequest(f"Hearth does not {what} models through the Ollama API (asked for "
                             f"{body.model or body.name!r}): add or remove .gguf files in the models folder "
                             "(`hearth models` shows where and lists what is installed)")


def _generation_routes(router: APIRouter, st: Any) -> None:
    @router.post("/api/chat")
    async def chat(request: Request):
        t0 = time.perf_counter()
        body = await read_body(request, ChatRequest)
        if not body.messages:
            return await _load_only(st, body, "chat")
        req = chat_body(body)
        return await _run(st, req, request, OllamaAnswer("chat", t0, 0.0), body.options, convert.chat_plan)

    @router.post("/api/generate")
    async def generate(request: Request):
        t0 = time.perf_counter()
        body = await read_body(request, GenerateRequest)
        if not body.prompt and not body.images:
            return await _load_only(st, body, "generate")
        req = generate_body(body)
        plan = convert.completion_plan if body.raw else convert.chat_plan
        return await _run(st, req, request, OllamaAnswer("generate", t0, 0.0), body.options, plan)


async def _run(st: Any, req: Any, request: Request, answer: OllamaAnswer, options: Optional[dict],
               make: Callable[..., Plan]):
    """``req`` run on the model it names and answered by ``answer`` (NDJSON when streamed)."""
    t = time.perf_counter()
    held = await st.hold(req)
    answer.load_s = time.perf_counter() - t

    async def plan() -> Plan:
        path = str(getattr(held.engine, "model_path", ""))  # num_ctx against the loaded (and trained) context
        sampling(options, held.engine.settings.n_ctx, lambda: getattr(st.catalog.info(path), "context_length", None))
        return make(req, held.model, st.options(held.model))
    out = await st.answer(held, plan, request, answer)
    if isinstance(out, StreamingResponse):
        out.headers["content-type"] = NDJSON
    return out


async def _load_only(st: Any, body: _Generating, kind: str) -> JSONResponse:
    """No messages (or prompt): load the model (``done_reason`` "load"), or with ``keep_alive`` 0 unload it
    ("unload"), as Ollama does."""
    held = await st.hold(body.model_copy(update={"model": model_name(body.model)}))
    held.release()
    reply = {"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""}
    unload = parse_keep_alive(body.keep_alive) == 0
    return JSONResponse({"model": held.model, "created_at": now_iso(), **reply, "done": True,
                         "done_reason": "unload" if unload else "load"})


def _embedding_routes(router: APIRouter, st: Any) -> None:
    @router.post("/api/embed")
    async def embed(request: Request) -> dict:
        t0 = time.perf_counter()
        body = await read_body(request, EmbedRequest)
        if body.input is None:
            raise InvalidRequest("input is required: a string or a list of strings", param="input")
        model, vectors, tokens = await _embed(st, body, body.input)
        return {"model": model, "embeddings": vectors, "total_duration": _ns(time.perf_counter() - t0),
                "load_duration": 0, "prompt_eval_count": tokens}

    @router.post("/api/embeddings")
    async def embeddings_legacy(request: Request) -> dict:
        body = await read_body(request, EmbedRequest)
        if not body.prompt:
            return {"embedding": []}  # Ollama's answer to an empty prompt
        _model, vectors, _tokens = await _embed(st, body, body.prompt)
        return {"embedding": vectors[0]}


async def _embed(st: Any, body: EmbedRequest, texts: Any) -> tuple[str, list[list[float]], int]:
    """``(model id, vectors, prompt tokens)`` from the server's embedder, as ``/v1/embeddings`` computes them.
    Raises ``CannotEmbed`` (no embedding model), ``ModelNotFound``, ``InvalidRequest``."""
    if body.truncate is False:
        raise InvalidRequest("truncate: false is not supported (inputs longer than the embedding model's context "
                             "are cut to fit)", param="truncate")
    if body.options:
        raise InvalidRequest("options are not supported for embeddings", param="options")
    req = _validated(EmbeddingRequest, {"input": texts, "model": model_name(body.model),
                                        "dimensions": body.dimensions})
    model = st.catalog.check_embedding(req.model, st.provider(), st.embedder)
    vectors, tokens = await run_in_threadpool(embeddings.run, st.embedder, embeddings.inputs(req))
    data = embeddings.response(req, model, vectors, tokens)["data"]
    return model, [d["embedding"] for d in data], tokens
