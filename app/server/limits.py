"""Limits a request body meets before anything expensive runs (issue 29: one request must never take the
port down, nor delay another's ``/health``).

``BodyLimit`` (ASGI middleware) refuses a body over ``max_bytes`` with a 413, from its ``Content-Length``
before reading, or while reading when it has none or lies. ``JsonRoute`` (the app's route class; Ollama's
routes call ``read_model``) then parses the JSON and validates the route's body model in a worker thread,
refusing bodies that are not UTF-8, not JSON, nested deeper than ``MAX_JSON_DEPTH``, hold a lone surrogate
(in a key too) or carry more than ``MAX_MESSAGES`` messages (``parse``); the handler gets the validated
model, so nothing of this runs on the event loop. Every limit and its error: docs/server.md, "Limits".
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import InvalidRequest
from app.fileio import MAX_JSON_DEPTH, lone_surrogate  # the config files' walk, shared
from app.server.errors import ApiError, InvalidJson, shape_for

MAX_BODY_BYTES = 16 * 1024 * 1024  # default of ServerSettings.max_body_bytes
MAX_MESSAGES = 10_000  # items of a body's top-level "messages" (or Responses' "input") list
_COUNTED = ("messages", "input")
_METHODS = frozenset({"POST", "PUT", "PATCH"})


def too_large(limit: int) -> ApiError:
    """The 413 for a body over ``limit`` bytes."""
    mib = f" ({limit // 2**20} MiB)" if limit % 2**20 == 0 else ""
    return ApiError(413, "invalid_request_error", f"the request body is larger than the limit of {limit} bytes{mib}",
                    None, "request_too_large")


class BodyLimit:
    """Reads a request body whole, refusing it with a 413 once it passes ``max_bytes`` (or at once when its
    ``Content-Length`` says it will), then hands it to the app in one piece; later ``receive`` calls (a
    client's disconnect) go to the server's."""

    def __init__(self, app: ASGIApp, max_bytes: int, on_error: Callable[[ApiError], None]) -> None:
        self.app, self.max_bytes, self.on_error = app, max_bytes, on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _METHODS:
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
        body = None if declared.isdigit() and int(declared) > self.max_bytes else await self._read(receive)
        if body is None:
            err = too_large(self.max_bytes)
            self.on_error(err)
            await err.response(shape_for(scope["path"]))(scope, receive, send)
            return
        first: list[Message] = [body]

        async def replay() -> Message:
            return first.pop() if first else await receive()
        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> Message | None:
        """The whole body as one ``http.request`` message (a disconnect as it came), None past the limit."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return None
            if not message.get("more_body", False):
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}


def parse(raw: bytes) -> Any:
    """The JSON value of a request body. Raises ``InvalidJson`` (not UTF-8, not JSON, nested deeper than
    ``MAX_JSON_DEPTH``) or ``InvalidRequest`` naming the field (a lone surrogate; more than ``MAX_MESSAGES``
    items in ``messages`` / ``input``)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidJson(f"the request body is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") \
            from None
    if too_deep(raw):
        raise InvalidJson(f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InvalidJson(f"the request body is not valid JSON: {e}") from None
    _check_surrogates(text, data)
    if isinstance(data, dict):
        for key in _COUNTED:
            items = data.get(key)
            if isinstance(items, list) and len(items) > MAX_MESSAGES:
                raise InvalidRequest(f"{key} has {len(items)} items, over the limit of {MAX_MESSAGES}", param=key)
    return data


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b'"[]{}')  # bytes.translate's delete
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def too_deep(raw: bytes) -> bool:
    """Whether the JSON text ``raw`` (UTF-8) nests brackets deeper than ``MAX_JSON_DEPTH`` outside strings.
    All in C: escaped backslashes, then escaped quotes, go; every byte but quotes and brackets goes; what is
    between two quotes was in a string; then each pass strips the innermost pairs. A 10 MB body takes tens of
    milliseconds (a loop over its tokens, as ``app.fileio`` reads files, took seconds). Brackets that do not
    pair up are left to ``json.loads`` to report."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return False
    kept = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_BRACKETS)
    brackets = b"".join(kept.replace(b'""', b"").split(b'"')[::2])  # two quotes side by side: parity kept
    for _ in range(MAX_JSON_DEPTH):
        shorter = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if shorter == brackets:
            return False
        brackets = shorter
    return bool(brackets)


def _check_surrogates(text: str, data: Any) -> None:
    """Raise ``InvalidRequest`` naming the first string or key of ``data`` that holds a lone surrogate. Only an
    escape can write one, and a body whose text has none is not walked."""
    if not _ESCAPED_SURROGATE.search(text):
        return
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    where = lone_surrogate(data) or "the request"
    raise InvalidRequest(f"{where} holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode text",
                         param=where.removeprefix("the key "))


async def read_model(request: Request, cls: Any) -> Any:
    """The body of ``request`` as ``cls`` (a pydantic model), parsed (``parse``; an empty body is ``{}``) and
    validated in a worker thread. Raises as ``parse`` does, or ``RequestValidationError`` naming the field."""
    raw = await request.body()

    def work() -> Any:
        data = parse(raw) if raw.strip() else {}
        if not isinstance(data, dict):
            raise InvalidRequest("the request body must be a JSON object")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
    return await run_in_threadpool(work)


class JsonRoute(APIRoute):
    """A route whose JSON body is parsed (``parse``) and validated against its body model in a worker thread
    before FastAPI's handler runs; the handler then finds the request's JSON already read and validated (a
    model instance validates as itself), so a 10 MB body delays no other request."""

    def get_route_handler(self) -> Callable:
        """FastAPI's handler, with the body read first."""
        handler = super().get_route_handler()
        field = self.body_field

        async def run(request: Request) -> Response:
            raw = await request.body()
            if field is not None and raw:
                # Starlette's Request caches its JSON here; FastAPI's handler reads it through request.json().
                request._json = await run_in_threadpool(_validated, raw, field)
            return await handler(request)
        return run


def _validated(raw: bytes, field: Any) -> Any:
    """``raw`` parsed and validated as the route's body ``field``; a long ``messages`` / ``input`` list first,
    ``_BATCH`` items at a time (pydantic holds the GIL through one call: 10,000 messages in one call kept
    ``/health`` waiting a second), so the last call finds its items validated already."""
    data = parse(raw)
    model = getattr(getattr(field, "field_info", None), "annotation", None)
    if isinstance(data, dict) and isinstance(model, type) and issubclass(model, BaseModel):
        for key in _COUNTED:
            items = data.get(key)
            if isinstance(items, list) and len(items) > _BATCH and key in model.model_fields:
                data = {**data, key: _in_batches(model.model_fields[key].annotation, key, items)}
    value, errors = field.validate(data, {}, loc=("body",))
    if errors:
        raise RequestValidationError(errors)
    return value


_BATCH = 256


def _in_batches(annotation: Any, key: str, items: list) -> list:
    adapter, out = TypeAdapter(annotation), []
    for start in range(0, len(items), _BATCH):
        try:
            out.extend(adapter.validate_python(items[start:start + _BATCH]))
        except ValidationError as exc:
            raise RequestValidationError([{**e, "loc": ("body", key, *_shifted(e["loc"], start))}
                                          for e in exc.errors()]) from None
    return out


def _shifted(loc: tuple, start: int) -> tuple:
    """``loc`` of an error in a batch with its first index (the item's) counted from the whole list's start."""
    at = next((i for i, p in enumerate(loc) if isinstance(p, int)), None)
    return loc if at is None else (*loc[:at], loc[at] + start, *loc[at + 1:])
