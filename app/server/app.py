"""``create_app``: the FastAPI application of Hearth's OpenAI-compatible port.

Thin handlers: each holds the model its ``model`` field names (``source``), turns the body into a ``Plan``
(``convert``; ``responses`` and ``messages`` first map their API's body onto a chat request) and hands it to
``Service``, which answers in the API's shape (an ``Answer``); the mapping code lives in ``convert`` /
``format`` / ``structured`` / ``errors``, and retrieval for ``hearth.documents`` in ``documents``.

The reasoning: docs/server.md, 'app/server/app.py'.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import HearthError, ModelNotFound
from app.protocol.reasoning import SETTING_KEYS
from app.server import convert, embeddings, limits, mcp_server, messages, ollama, responses, security
from app.server.documents import Documents
from app.server.errors import ApiError, from_exception, from_http, from_validation, shape_for
from app.server.metrics import ServerMetrics
from app.server.models import ModelCatalog, anthropic_model, anthropic_page, loaded_id
from app.server.openai_schema import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from app.server.reasoning import Defaults, PortOptions, model_default
from app.server.service import Answer, Service
from app.server.source import Held, keep_alive_of, source_for
from app.settings import ServerSettings

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/responses",
             "/v1/messages", "/v1/messages/count_tokens", "/health", "/metrics", "/mcp", "/", *ollama.KNOWN)
STOP_THINKING = "/v1/hearth/requests/{request_id}/stop_thinking"


class State:
    """What the handlers share: the model source, the embedder, the documents, the model catalog, metrics,
    the service (and its registry of running requests), the reasoning defaults, whether a command verifier
    may run, and the response chains of /v1/responses."""

    def __init__(self, source: Any, embedder: Any, catalog: ModelCatalog, metrics: ServerMetrics,
                 documents: Any = None, reasoning_defaults: Defaults = None, allow_command: bool = False,
                 chains: Any = None) -> None:
        self.source = source
        self.embedder, self.catalog, self.metrics = embedder, catalog, metrics
        self.documents = Documents(documents)
        self.service = Service(metrics)
        self.reasoning_defaults, self.allow_command = reasoning_defaults, allow_command
        self.chains = chains

    def provider(self) -> Any:
        """The engine /health and /metrics report on (the window's, or the pool's default model when loaded)."""
        return self.source.current()

    async def hold(self, body: Any) -> Held:
        """The model ``body.model`` names, held until ``release()`` (loaded first when the pool needs to)."""
        keep = keep_alive_of(body)
        return await run_in_threadpool(self.source.acquire, body.model, keep, self.embedder)

    def options(self, model: str) -> PortOptions:
        """What the server adds to a request for ``model`` (the held model's id)."""
        return PortOptions(model_default(self.reasoning_defaults, model), self.allow_command)

    async def answer(self, held: Held, make_plan: Callable[[], Any], request: Request,
                     answer: Optional[Answer] = None):
        """``make_plan()`` (an awaitable ``Plan``) run on the held model and answered; the model is released
        when the answer is over, or at once when the plan cannot be made."""
        try:
            plan = await make_plan()
        except BaseException:
            held.release()
            raise
        return await self.service.respond(plan, held.engine, request, answer, held.release)


def settings_reasoning_defaults(user_settings: Any) -> Callable[[str], Optional[dict]]:
    """``reasoning_defaults`` from ``settings.json``: the ``reasoning_effort`` / ``reasoning_budget`` /
    ``reasoning_deadline_s`` keys of ``per_model[<model id>]`` (other keys there are load settings)."""
    def lookup(model_id: str) -> Optional[dict]:
        over = user_settings.per_model.get(model_id, {})
        return {k: over[k] for k in SETTING_KEYS if k in over} or None
    return lookup


def create_app(engine_provider: Any = None, settings: Optional[ServerSettings] = None, *, pool: Any = None,
               default_model: Optional[str] = None, embedder: Any = None, allow_hosts: Iterable[str] = (),
               catalog: Optional[ModelCatalog] = None, metrics: Optional[ServerMetrics] = None,
               documents: Any = None, reasoning_defaults: Defaults = None,
               allow_command_verifier: Optional[bool] = None, responses_store: Any = None,
               mcp_tools: Any = None) -> FastAPI:
    """The ASGI app. ``engine_provider``: the current engine (a callable or the engine itself); or ``pool``:
    a ``ModelPool`` serving every installed model by name, ``default_model`` the one an absent ``model``
    means (None: the bundled model). ``settings``: host (for the Host check), api_key, cors_origins
    (``max_queue`` belongs to the Engine). ``allow_hosts``: extra Host names to accept (e.g. a LAN name when
    bound off-loopback). ``documents``: an ``app.assistant.DocumentSource`` for ``hearth.documents`` (None:
    such requests get a 400 ``documents_unavailable``). ``reasoning_defaults``: the model layer of thinking
    budgets (module docstring). ``allow_command_verifier``: let ``hearth.self_consistency`` run command
    verifiers (None: the settings' ``allow_command_verifier``, off when absent). ``responses_store``: the
    ``app.memory.Store`` that keeps /v1/responses chains (None: an in-memory store). ``mcp_tools``: the
    ``app.server.mcp_tools.PortTools`` run for requests with ``hearth.mcp_tools`` (None: such requests get a
    400)."""
    settings = settings or ServerSettings()
    allow_command = (allow_command_verifier if allow_command_verifier is not None
                     else bool(getattr(settings, "allow_command_verifier", False)))
    catalog = catalog or ModelCatalog()
    st = State(source_for(engine_provider, pool, catalog, default_model), embedder, catalog,
               metrics or ServerMetrics(), documents, reasoning_defaults, allow_command,
               responses.ResponseChains(responses_store))
    st.service.mcp = mcp_tools
    # No /docs or /redoc: their pages load Swagger UI / ReDoc from a CDN (/openapi.json stays).
    app = FastAPI(title="Hearth", version="1.0", summary="OpenAI-compatible API of a local Hearth model",
                  docs_url=None, redoc_url=None)
    app.router.route_class = limits.JsonRoute  # bodies parsed and validated off the event loop
    app.state.hearth = st
    _error_handlers(app, st.metrics)
    _routes(app, st)
    responses.routes(app, st)
    messages.routes(app, st)
    ollama.routes(app, st)
    mcp_server.mount(app, st)  # /mcp: Hearth as an MCP server (docs/mcp.md), behind the guards below
    app.add_middleware(limits.BodyLimit, on_error=lambda e: st.metrics.error(e.type, e.code),
                       max_bytes=int(getattr(settings, "max_body_bytes", limits.MAX_BODY_BYTES)))
    hosts = security.allowed_hosts(settings.host, [*allow_hosts, *getattr(settings, "allow_hosts", [])])
    security.install(app, api_key=settings.api_key, cors_origins=list(settings.cors_origins), hosts=hosts,
                     on_error=lambda e: st.metrics.error(e.type, e.code))
    app.add_middleware(JsonBodyByDefault)
    app.add_middleware(RequestMetrics, metrics=st.metrics)
    return app


def _routes(app: FastAPI, st: State) -> None:
    _status_routes(app, st)
    _generation_routes(app, st)


def _status_routes(app: FastAPI, st: State) -> None:
    """What is loaded and how it runs: health, metrics, the model listing."""

    @app.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse)
    async def root() -> str:
        """What Ollama answers at ``/`` ("Ollama is running"): tools probe it before they use ``/api/*``."""
        return "Hearth is running (OpenAI and Anthropic APIs at /v1, Ollama's at /api, MCP at /mcp)"

    @app.get("/health")
    async def health() -> JSONResponse:
        eng = st.provider()
        pool = st.source.pool_status()
        if eng is None and pool is None:
            return JSONResponse({"status": "no_model"}, status_code=503, headers={"Retry-After": "2"})
        failed = pool.get("default_load_error") if eng is None and pool is not None else None
        if failed:  # the default model cannot load: say so (it is tried again as docs/server.md, Many models, says)
            return JSONResponse({"status": "model_load_error", "error": failed, "pool": pool}, status_code=503,
                                headers={"Retry-After": "5"})
        body: dict[str, Any] = {"status": "ok", "model": loaded_id(eng) if eng is not None else None}
        if eng is not None:
            body.update(engine_alive=bool(eng.alive), n_parallel=eng.n_parallel, active=eng.active(),
                        queue_depth=eng.queue_depth())
        if pool is not None:
            body["pool"] = pool
        return JSONResponse(body)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        text = st.metrics.render(st.provider())
        if st.service.mcp is not None:
            text += "\n".join(st.service.mcp.metric_lines()) + "\n"
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict:
        """Every model a request may name, the default first; Anthropic's shape (paged by ``limit``,
        ``after_id``, ``before_id``) when the request carries an ``anthropic-version`` header."""
        data = await run_in_threadpool(st.source.listing, st.embedder)
        if "anthropic-version" in request.headers:
            q = request.query_params
            return anthropic_page(data, q.get("limit"), q.get("after_id"), q.get("before_id"))
        out: dict[str, Any] = {"object": "list", "data": data}
        pool = st.source.pool_status()
        if pool is not None:
            out["hearth"] = {"pool": pool}
        return out

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> dict:
        data = await run_in_threadpool(st.source.listing, st.embedder)
        for m in data:
            if model_id == m["id"] or model_id == m["hearth"]["file"]:
                return anthropic_model(m) if "anthropic-version" in request.headers else m
        raise ModelNotFound(model_id, [m["id"] for m in data])


def _generation_routes(app: FastAPI, st: State) -> None:
    """Requests that run a model: completions (chat and plain), stopping a request's thinking, embeddings."""

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        held = await st.hold(body)

        async def plan():
            made = await run_in_threadpool(convert.chat_plan, body, held.model, st.options(held.model))
            return await st.documents.ground(made, body.hearth, held.engine)
        return await st.answer(held, plan, request)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        held = await st.hold(body)

        async def plan():
            return await run_in_threadpool(convert.completion_plan, body, held.model, st.options(held.model))
        return await st.answer(held, plan, request)

    @app.post(STOP_THINKING)
    async def stop_thinking(request_id: str) -> dict:
        """End a running request's thinking now (budget forcing's insert, docs/reasoning.md): 200 with
        ``stopped`` (false: it was not thinking any more), 404 for an unknown or finished id."""
        stopped = await run_in_threadpool(st.service.running.stop_thinking, request_id)
        return {"id": request_id, "object": "hearth.stop_thinking", "stopped": stopped}

    @app.post("/v1/embeddings")
    async def create_embeddings(body: EmbeddingRequest) -> dict:
        model = st.catalog.check_embedding(body.model, st.provider(), st.embedder)
        texts = embeddings.inputs(body)
        vectors, tokens = await run_in_threadpool(embeddings.run, st.embedder, texts)
        return embeddings.response(body, model, vectors, tokens)


def _error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    def answer(req: Request, err: ApiError) -> JSONResponse:
        metrics.error(err.type, err.code)
        return err.response(shape_for(req.url.path, req.headers))

    @app.exception_handler(RequestValidationError)
    async def _validation(req: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(req, from_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        return answer(req, from_http(exc))

    @app.exception_handler(HearthError)
    async def _known(req: Request, exc: HearthError) -> JSONResponse:
        return answer(req, from_exception(exc))

    @app.exception_handler(Exception)  # a bug: logged with its traceback, answered without it
    async def _any(req: Request, exc: Exception) -> JSONResponse:
        return answer(req, from_exception(exc))


class JsonBodyByDefault:
    """POST bodies of /v1/* are JSON whatever the client labelled them: ``curl -d '{...}'`` sends
    ``application/x-www-form-urlencoded``, and llama-server and Ollama accept such requests. A missing or
    form Content-Type is read as ``application/json`` (a body that is not JSON still gets the 400 saying so)."""

    _FORM = (b"", b"application/x-www-form-urlencoded", b"text/plain")

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].startswith("/v1/"):
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            ctype = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
            if ctype.split(b";")[0].strip().lower() in self._FORM:
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


class RequestMetrics:
    """Outermost middleware: counts every answer by endpoint, method and status (401/403 included)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else ("/v1/models/{id}" if path.startswith("/v1/models/") else
                                                   "/v1/responses/{id}" if path.startswith("/v1/responses/") else
                                                   STOP_THINKING if path.startswith("/v1/hearth/requests/")
                                                   else "other")
        status = 500

        async def send_wrapper(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.request_started()
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.request_done(endpoint, scope["method"], status)
