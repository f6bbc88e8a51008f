"""Hearth as an MCP server: ``build_server`` wraps a ``Library`` in the SDK's ``MCPServer`` (stdio: ``hearth
mcp``); ``mount`` serves it at ``/mcp`` on the port (streamable HTTP, behind the port's Host and API-key
guards). The SDK is imported only when a server is built (0.75 s of pydantic models).

No ``from __future__ import annotations`` here: the SDK reads the tools' annotations (``Annotated`` with a
``Field`` or a ``Resolve``) from the functions, and names imported inside a function would not resolve from
strings. The reasoning: docs/mcp.md, 'Hearth as an MCP server'.
"""

import asyncio
import functools
import logging
from typing import Annotated, Any, Callable, Optional

from pydantic import BaseModel, Field

from app import __version__
from app.errors import HearthError
from app.server.mcp_library import DEFAULT_ANSWER_TOKENS, MAX_ANSWER_TOKENS, MAX_K, Library

log = logging.getLogger(__name__)
PATH = "/mcp"
INSTRUCTIONS = ("Hearth's local documents and conversations. search_documents finds passages (cite them by "
                "evidence ID), read_passage reads one with its neighbours, ask answers from the documents with "
                "the local model and checks its citations. Read-only unless the person allowed writes.")
NO_ELICITATION = ("ingest needs the person's confirmation and this client cannot ask for it (it does not "
                  "support MCP elicitation); run `hearth ingest PATH` instead")
READ_ONLY = {"read_only_hint": True, "destructive_hint": False, "idempotent_hint": True, "open_world_hint": False}


class Confirm(BaseModel):
    """What the person is asked before a write: one yes/no."""

    confirm: bool = Field(description="Index it into Hearth's documents")


def build_server(library: Library, name: str = "hearth") -> Any:
    """The ``MCPServer`` offering ``library`` as tools: ``search_documents``, ``read_passage``,
    ``list_documents``, ``search_conversations``, ``read_conversation``, ``ask`` (all read-only) and
    ``ingest`` (refused unless ``library.allow_writes``, and then only after the person confirms through
    the client). A ``HearthError`` from the library becomes a tool error carrying its message alone (bad
    input: ``bare_error``); only an unexpected failure reads ``Error executing tool <name>``."""
    server = _server_class()(name, title="Hearth", instructions=INSTRUCTIONS, version=__version__,
                             log_level="WARNING")
    _document_tools(server, library)
    _conversation_tools(server, library)
    _ask_tool(server, library)
    _ingest_tool(server, library)
    return server


async def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread (the tools block: SQLite, the engine); a ``HearthError`` is raised
    again as the SDK's ``ToolError`` (an MCP result with ``isError``, its message for the caller)."""
    import anyio.to_thread
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args))
    except HearthError as exc:
        raise ToolError(str(exc)) from None


@functools.lru_cache(maxsize=None)
def _server_class() -> type:
    """The SDK's ``MCPServer`` with ``call_tool`` answering anticipated failures bare (``bare_error``)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import CallToolResult, TextContent

    class HearthMCPServer(MCPServer):
        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            """The SDK's ``call_tool``; an anticipated failure is an ``isError`` result with its bare message."""
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                text = bare_error(exc)
                if text is None:
                    raise
                log.info("Tool %r refused: %r", name, text)
                return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)

    return HearthMCPServer


def bare_error(exc: BaseException) -> Optional[str]:
    """The message an anticipated tool failure is answered with, None for anything else. The SDK (2.3) wraps
    every failure of a tool as ``ToolError("Error executing tool <name>: <message>")`` from the original;
    docs/mcp.md keeps that prefix for unexpected failures (``UnexpectedToolError``: the message withheld).
    Bad input, a refusal (a ``ToolError`` raised here or by a resolver) or arguments that fail the input
    schema (a pydantic ``ValidationError``, given as ``<argument>: <problem>`` per error) come back bare."""
    from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
    from pydantic import ValidationError

    if not isinstance(exc, ToolError) or isinstance(exc, UnexpectedToolError):
        return None
    cause = exc.__cause__
    if isinstance(cause, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                         for e in cause.errors())
    if isinstance(cause, ToolError) and not isinstance(cause, UnexpectedToolError):
        return str(cause)
    return None


def _tool(server: Any, **annotations: Any) -> Callable:
    from mcp_types import ToolAnnotations

    return server.tool(annotations=ToolAnnotations(**{**READ_ONLY, **annotations}))


def _document_tools(server: Any, lib: Library) -> None:
    @_tool(server)
    async def search_documents(
            query: Annotated[str, Field(description="what to look for (free text)")],
            k: Annotated[int, Field(description=f"passages to return, 1-{MAX_K}")] = 5) -> dict[str, Any]:
        """Search the person's indexed documents (hybrid BM25 + embeddings, or BM25 alone). Returns hits with
        evidence_id, path, title, page, char_start/char_end (offsets in the document's text), headings,
        score and text; notice says when search was degraded."""
        return await call(lib.search_documents, query, k)

    @_tool(server)
    async def read_passage(
            evidence_id: Annotated[str, Field(description="a passage's evidence ID, from search_documents")],
            neighbours: Annotated[int, Field(description="passages to add on each side, 0-5")] = 0
    ) -> dict[str, Any]:
        """Read one passage by its evidence ID: text, path, title, page, offsets; with neighbours > 0 also the
        passages around it in its document (each with its offset)."""
        return await call(lib.read_passage, evidence_id, neighbours)

    @_tool(server)
    async def list_documents() -> dict[str, Any]:
        """List the indexed documents: path, title, type, pages, chunks, size_bytes, indexed_at."""
        return await call(lib.list_documents)


def _conversation_tools(server: Any, lib: Library) -> None:
    @_tool(server)
    async def search_conversations(
            query: Annotated[str, Field(description="words to find in stored messages")],
            limit: Annotated[int, Field(description="results to return, 1-50")] = 10) -> dict[str, Any]:
        """Search the person's stored conversations (full text): conversation_id, title, message_id, role,
        created and a snippet with the matches in [brackets]."""
        return await call(lib.search_conversations, query, limit)

    @_tool(server)
    async def read_conversation(
            conversation_id: Annotated[str, Field(description="the id (or a unique prefix) of a conversation")]
    ) -> dict[str, Any]:
        """Read one stored conversation: title, model, and the messages of its current branch in order."""
        return await call(lib.read_conversation, conversation_id)


def _ask_tool(server: Any, lib: Library) -> None:
    @_tool(server, idempotent_hint=False)
    async def ask(
            question: Annotated[str, Field(description="the question to answer from the documents")],
            k: Annotated[int, Field(description=f"passages to give the model, 1-{MAX_K}")] = 4,
            max_tokens: Annotated[int, Field(description=f"answer length cap, 1-{MAX_ANSWER_TOKENS} tokens")]
            = DEFAULT_ANSWER_TOKENS,
            require_citations: Annotated[bool, Field(description="constrain the answer so that every sentence "
                                                     "ends with a citation [E:id] of a passage it was given (for "
                                                     "small models that do not cite on their own)")] = False
    ) -> dict[str, Any]:
        """Answer a question with Hearth's local model from the person's documents. Returns the answer, the
        evidence IDs it cites, each citation checked against its passage (supported, the citing sentence's
        span, the reason), all_supported, and the passages the model was given. Nothing is stored."""
        return await call(lib.ask, question, k, max_tokens, require_citations)


def _ingest_tool(server: Any, lib: Library) -> None:
    from mcp.server.mcpserver import AcceptedElicitation, Context, Elicit, ElicitationResult, Resolve
    from mcp.server.mcpserver.exceptions import ToolError

    def confirmation(path: str, ctx: Context) -> Any:
        """Runs before the tool: refuses when writes are off or the client cannot ask, else asks the person
        (the SDK sends ``elicitation/create`` mid-call, or an input-required result on 2026-07-28)."""
        try:
            target = lib.ingest_path(path)
        except HearthError as exc:
            raise ToolError(str(exc)) from None
        caps = ctx.client_capabilities
        if caps is None or caps.elicitation is None:
            raise ToolError(NO_ELICITATION)
        return Elicit(f"An MCP client asks Hearth to index {target} into your documents (read, chunked and "
                      "searchable by every client of this server). Allow it?", Confirm)

    @_tool(server, read_only_hint=False, idempotent_hint=True)
    async def ingest(
            path: Annotated[str, Field(description="an absolute path of a file or folder to index")],
            confirmed: Annotated[ElicitationResult[Confirm], Resolve(confirmation)]) -> dict[str, Any]:
        """Index a file or folder into the person's documents (a write: off unless the server was started
        with --allow-writes, and the person is asked to confirm each call)."""
        if not (isinstance(confirmed, AcceptedElicitation) and confirmed.data.confirm):
            raise ToolError(f"not indexed: the person did not allow indexing {path}")
        return await call(lib.ingest, path)


class McpEndpoint:
    """The ASGI app at ``/mcp``: the SDK's streamable-HTTP transport for ``build_server(make_library())``.

    Started by the first request on the loop serving it (the port runs uvicorn with ``lifespan="off"``, so
    an app lifespan would never start the SDK's session manager): the server is built off the loop, and its
    session manager runs in a task of that loop until the loop ends (uvicorn's shutdown cancels it). The
    SDK's own Host/Origin check is off: the port's ``HostGuard`` (with ``--allow-host``) already ran."""

    def __init__(self, make_library: Callable[[], Library]) -> None:
        self._make = make_library
        self._http: Any = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._lock: Optional[asyncio.Lock] = None
        self._task: Optional[asyncio.Task] = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        http = await self._started()
        await http(scope, receive, send)

    async def _started(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._http is not None and self._loop is loop:
            return self._http
        if self._lock is None or self._loop is not loop:
            self._lock, self._loop, self._http = asyncio.Lock(), loop, None
        async with self._lock:
            if self._http is None:
                self._http = await self._start(loop)
        return self._http

    async def _start(self, loop: asyncio.AbstractEventLoop) -> Any:
        import anyio.to_thread
        from mcp.server.transport_security import TransportSecuritySettings

        server = await anyio.to_thread.run_sync(lambda: build_server(self._make()))
        http = server.streamable_http_app(
            streamable_http_path=PATH,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        started: asyncio.Future = loop.create_future()
        self._task = loop.create_task(_run_sessions(http, started), name="hearth-mcp-sessions")
        await started
        return http


async def _run_sessions(http: Any, started: asyncio.Future) -> None:
    """Hold the SDK app's lifespan (its session manager) open until cancelled."""
    try:
        async with http.router.lifespan_context(http):
            started.set_result(None)
            await asyncio.Event().wait()
    except BaseException as exc:
        if not started.done():
            started.set_exception(exc if isinstance(exc, Exception) else RuntimeError("MCP sessions stopped"))
        raise


def mount(app: Any, st: Any, *, allow_writes: bool = False) -> None:
    """Serve Hearth's MCP tools at ``/mcp`` on the FastAPI ``app`` (``st``: its ``app.server.app.State``):
    documents from the port's ``DocumentSource`` (none without ``--documents``), ``ask`` on the model the
    port serves by default, conversations from the data folder. Added as a route, so the port's middleware
    (Host, Origin, API key, metrics) guards it like every other path."""
    from starlette.routing import Route

    def library() -> Library:
        """The port's documents, its default model and the data folder's conversations."""
        return Library(lambda: st.documents.provider, engine=lambda: st.source.acquire(None, None, st.embedder),
                       allow_writes=allow_writes)

    app.router.routes.append(Route(PATH, endpoint=McpEndpoint(library)))
