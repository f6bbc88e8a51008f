"""``hearth serve``: the OpenAI-compatible API without the desktop app (same server as the app's port).

Every installed model is served by name: a ``ModelPool`` (``app.backends.model_pool``) loads the model a
request's ``model`` field names on demand, within ``--models-budget-gb`` (default: 80 % of the RAM available
at start), and unloads idle models after ``--ttl`` seconds (a model's ``per_model[id].ttl_s`` and a request's
``keep_alive`` override it). ``--model X`` preloads X, keeps it loaded until the budget needs its room, and
makes it the model an absent ``model`` means. The engine flags (``--n-ctx`` ...) are the base load settings of
every model; ``per_model`` entries of settings.json still win for their model.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from app.cli._engine_args import add_load_args, load_settings
from app.settings import DEFAULT_PORT

EXPOSE_FLAG = "--i-know-this-exposes-my-machine"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible API (default http://127.0.0.1:%d)" % DEFAULT_PORT,
                       description="Serve Hearth's OpenAI-compatible API (/v1/chat/completions, /v1/completions, "
                                   "/v1/embeddings, /v1/models, /v1/responses, /health, /metrics), Anthropic's "
                                   "/v1/messages, Ollama's /api/* and Hearth's MCP server (/mcp) on one port. "
                                   f"Loopback only unless {EXPOSE_FLAG} is given.")
    p.add_argument("--host", default=None, help="address to bind (default from settings: 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help=f"port (default from settings: {DEFAULT_PORT})")
    p.add_argument("--api-key", default=os.environ.get("HEARTH_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $HEARTH_API_KEY, else none)")
    p.add_argument("--cors-origin", action="append", default=None, metavar="ORIGIN",
                   help="allow browser pages from ORIGIN, e.g. http://localhost:5173 (repeatable; CORS is off "
                        "by default)")
    p.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                   help="accept this Host header besides loopback names (repeatable; DNS-rebinding protection)")
    p.add_argument("--max-queue", type=int, default=None, help="requests allowed to wait for a free engine slot "
                                                                  "(default from settings: 16); then 429")
    p.add_argument("--embeddings", action="store_true", help="also serve /v1/embeddings with Hearth's "
                                                             "embedding model")
    p.add_argument("--documents", action="store_true",
                   help='answer from the indexed documents when a chat request asks with "hearth": {"documents": '
                        'true} (the default collection; see `hearth ingest`)')
    p.add_argument("--models-budget-gb", type=float, default=None, metavar="GB",
                   help="memory the loaded models may use together, by their memory estimates (default: 80%% of "
                        "the RAM available at start); the least recently used idle model is unloaded to make room")
    p.add_argument("--ttl", type=float, default=300.0, metavar="SECONDS",
                   help="unload a model idle this long (default 300; negative: never; a request's keep_alive and "
                        "per_model[id].ttl_s in settings.json override it)")
    p.add_argument("--mcp-tools", action="store_true",
                   help='run the tools of mcp.json server-side for chat requests that ask with "hearth": '
                        '{"mcp_tools": true}; only tools in alwaysAllow run (nobody is there to ask). Off loopback '
                        "it needs --api-key")
    p.add_argument(EXPOSE_FLAG, dest="expose", action="store_true",
                   help="allow binding a non-loopback address (anyone who can reach it can use your machine's "
                        "model; set --api-key)")
    add_load_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from app.server.run import bind_host, is_loopback
    from app.settings import load_user_settings

    user = load_user_settings()
    base = user.server
    settings = replace(base, host=bind_host(args.host or base.host),
                       port=args.port if args.port is not None else base.port,
                       api_key=args.api_key or base.api_key,
                       cors_origins=args.cors_origin if args.cors_origin is not None else base.cors_origins,
                       max_queue=args.max_queue if args.max_queue is not None else base.max_queue)
    if not is_loopback(settings.host) and not args.expose:
        print(f"hearth: error: refusing to bind {settings.host}: it is not a loopback address. Add "
              f"{EXPOSE_FLAG} if you mean it (and set --api-key).", file=sys.stderr)
        return 2
    refused = mcp_refusal(getattr(args, "mcp_tools", False), settings.host, settings.api_key)
    if refused:  # before the warning: a command that will not serve warns about nothing
        print(f"hearth: error: {refused}", file=sys.stderr)
        return 2
    if not is_loopback(settings.host):
        print(f"hearth: WARNING: serving on {settings.host}:{settings.port}; other machines that can reach it "
              f"can use this model{'' if settings.api_key else ' WITHOUT an API key'}.", file=sys.stderr)
    user = replace(user, load=load_settings(args, user))  # a bad load flag is one line before anything starts
    budget = _budget_bytes(args.models_budget_gb)
    _check_port_free(settings.host, settings.port)  # before a model loads: fail fast with one line
    pool, default = _pool(args, user, settings, budget)
    try:
        return _serve(args, user, settings, pool, default)
    finally:
        pool.close()


def mcp_refusal(mcp_tools: bool, host: str, api_key: str | None) -> str | None:
    """Why ``--mcp-tools`` may not run on ``host`` (None: it may): off loopback the tools run on this machine
    for whoever reaches the port, so an API key must be configured."""
    from app.server.run import is_loopback

    if not mcp_tools or is_loopback(host) or api_key:
        return None
    return (f"--mcp-tools on {host} (not a loopback address) needs an API key: set --api-key or "
            "$HEARTH_API_KEY, so that only clients holding it can run this machine's MCP tools")


def _budget_bytes(gb: float | None) -> int | None:
    """``--models-budget-gb`` in bytes (None: the pool's default); raises ``InvalidRequest`` for 0 or less."""
    from app.errors import InvalidRequest

    if gb is None:
        return None
    if not gb > 0:
        raise InvalidRequest(f"--models-budget-gb must be more than 0, got {gb:g}", param="models_budget_gb")
    return int(gb * (1 << 30))


def _pool(args: argparse.Namespace, user, settings, budget: int | None):
    """The model pool, with ``--model`` (when given) loaded and kept; returns ``(pool, the default model's
    path)``."""
    from app.backends import model_pool
    from app.catalog.registry import resolve_model

    pool = model_pool(user, budget_bytes=budget, ttl_s=args.ttl if args.ttl >= 0 else None,
                      prefix_cache=args.prefix_cache, cache_budget_mb=getattr(args, "cache_budget_mb", None),
                      engine_kwargs={"max_queue": settings.max_queue})
    default = str(resolve_model(args.model))  # None: the bundled model, named here so /health can report it
    if args.model:
        try:
            pool.pin(default)  # preloaded, kept while idle until the budget needs the room
        except BaseException:
            pool.close()
            raise
    return pool, default


def _serve(args: argparse.Namespace, user, settings, pool, default: str) -> int:
    from app.server import create_app, serve
    from app.server.app import settings_reasoning_defaults
    from app.server.models import ModelCatalog

    embedder = _embedder() if args.embeddings else None
    documents = _documents(embedder) if args.documents else None
    tools = _port_tools(user) if getattr(args, "mcp_tools", False) else None
    app = create_app(settings=settings, pool=pool, default_model=default, embedder=embedder,
                     allow_hosts=args.allow_host, documents=documents, catalog=ModelCatalog(load_for=user.load_for),
                     reasoning_defaults=settings_reasoning_defaults(user),
                     allow_command_verifier=settings.allow_command_verifier, responses_store=_responses_store(),
                     mcp_tools=tools)
    budget = "no limit" if pool.budget_bytes is None else f"{pool.budget_bytes / (1 << 30):.1f} GiB"
    ttl = f"after {pool.ttl_s:g} s" if pool.ttl_s is not None else "never"
    shown = f"[{settings.host}]" if ":" in settings.host else settings.host  # an IPv6 address, as URLs write it
    print(f"hearth: serving every installed model on http://{shown}:{settings.port}/v1 (default "
          f"{Path(default).stem}; models' budget {budget}; idle models unload {ttl}; Ctrl+C stops)", file=sys.stderr)
    import signal

    # uvicorn shuts down on SIGTERM, then re-raises it; ending through SystemExit instead lets the engine
    # processes and their semaphores be released.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(app, settings.host, settings.port)
    finally:
        if embedder is not None:
            embedder.close()
        if documents is not None:
            documents.close()
        if tools is not None:
            tools.close()
    return 0


def _port_tools(user):
    """The mcp.json servers started for ``--mcp-tools`` (``PortTools``), or None when there are none or the
    file is malformed (one line on stderr each, the port runs without them)."""
    from app.cli._mcp_terminal import start_hub
    from app.server.mcp_tools import PortTools

    hub = start_hub(user.tools.start_timeout_s)
    if hub is None:
        return None
    tools = hub.tools()
    allowed = sorted(t.qualified_name for t in tools if t.always_allowed)
    print(f"hearth: MCP tools for hearth.mcp_tools requests: {len(tools)} tools; run without asking (alwaysAllow): "
          f"{', '.join(allowed) or 'none, so every call is answered as not allowed'}", file=sys.stderr)
    return PortTools(hub, max_steps=user.tools.max_steps, call_timeout_s=user.tools.call_timeout_s)


def _responses_store():
    """The conversation store that keeps /v1/responses chains (the person's own, so they show as
    conversations)."""
    from app.memory import Store

    return Store()


def _check_port_free(host: str, port: int) -> None:
    """Raise ``InvalidRequest`` for a port out of range or already in use on ``host``."""
    import socket

    from app.errors import InvalidRequest

    if not 1 <= port <= 65535:
        raise InvalidRequest(f"--port must be between 1 and 65535, got {port}", param="port")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise InvalidRequest(f"cannot listen on {host}:{port}: {exc.strerror or exc} (is another server "
                                 "using it? choose another with --port)", param="port") from None


def _documents(embedder):
    """The default document index for ``hearth.documents``, searched with the served ``embedder`` when there
    is one (one embedding process for both), else its own."""
    from app.assistant import DocumentSource

    docs = DocumentSource.open_default(embedder)
    if docs.embedder is None:
        from app.retrieval.embed_switch import no_model_notice

        print(f"hearth: documents: {no_model_notice(docs.store)}", file=sys.stderr)
    return docs


def _embedder():
    from app.errors import ModelLoadError
    from app.retrieval.embed_model import ensure_embedding_model
    from app.retrieval.embedder import Embedder

    path = ensure_embedding_model()
    if path is None:
        raise ModelLoadError("no embedding model is installed (run `hearth setup`)")
    return Embedder(path)
