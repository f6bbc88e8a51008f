"""Exception *types* → OpenAI error JSON ``{"error": {"message", "type", "param", "code"}}`` and a status.

The mapping is by type (STYLE.md §6), never by message text. Client input never yields a 500 with a
traceback: request-validation errors become 400 ``invalid_request_error`` naming the parameter; anything
unexpected is logged with its traceback and answered with a short 500 that points at the log.

Anthropic's Messages API (``/v1/messages``) answers the same errors in its own shape,
``{"type": "error", "error": {"type", "message"}}`` with the same status; ``ApiError.anthropic()`` maps the
status to Anthropic's error type (``ANTHROPIC_TYPES``). ``shape_for(path)`` says which shape a path answers.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from app.engine.pool import ModelBusy
from app.errors import (
    Cancelled,
    ContextLengthExceeded,
    DiskFull,
    EngineCrashed,
    EngineUnresponsive,
    HearthError,
    InvalidRequest,
    ModelLoadError,
    ModelNotFound,
    QueueFull,
    StoreDamaged,
)

log = logging.getLogger(__name__)


class ModelNotLoaded(HearthError):
    """The request names a known model other than the loaded one. Hearth never switches models for an API
    request (the desktop UI owns that choice): this is a 400 naming both."""

    def __init__(self, requested: str, loaded: str) -> None:
        super().__init__(f"model {requested!r} is installed but not loaded; the loaded model is {loaded!r}. "
                         f"Use model {loaded!r}, or load {requested!r} in Hearth (or `hearth serve --model "
                         f"{requested}`)")
        self.requested, self.loaded = requested, loaded

    def __reduce__(self):
        return (self.__class__, (self.requested, self.loaded))


class NoModelLoaded(HearthError):
    """No chat engine is available right now (none chosen yet, or the UI is swapping models)."""


class CannotEmbed(HearthError):
    """/v1/embeddings was called but no embedding model is available (the chat model cannot embed)."""


class DocumentsUnavailable(HearthError):
    """A request asked for ``hearth.documents`` but this server has no documents provider."""


class RequestNotFound(HearthError):
    """``POST /v1/hearth/requests/{id}/...`` named no running request (unknown, or already finished): 404."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"no running request has id {request_id!r} (unknown, or it has already finished)")
        self.request_id = request_id

    def __reduce__(self):
        return (self.__class__, (self.request_id,))


class ResponseNotFound(HearthError):
    """A response id names no stored response (unknown, malformed, deleted, or made with ``store: false``): 404
    naming ``param``, ``previous_response_id`` on a create or ``response_id`` on ``GET`` / ``DELETE
    /v1/responses/{response_id}``."""

    def __init__(self, response_id: str, param: str = "previous_response_id") -> None:
        what = "previous response" if param == "previous_response_id" else "response"
        super().__init__(f"{what} {response_id!r} not found (unknown, deleted, or created with store: false, so "
                         "nothing was kept)")
        self.response_id, self.param = response_id, param

    def __reduce__(self):
        return (self.__class__, (self.response_id, self.param))


class AnswerMismatch(HearthError):
    """A whole answer breaks its ``response_format`` schema where the grammar could not enforce it (a bound, a
    ``multipleOf``...): 422 naming ``param`` and the ``problem`` (``structured.check_answer``)."""

    def __init__(self, problem: str, param: str = "response_format", advice: str | None = None) -> None:
        advice = advice or ("The grammar cannot enforce this keyword while decoding; retry (another seed or "
                            "temperature) or loosen it")
        super().__init__(f"the model's answer does not match the {param} schema: {problem}. {advice}")
        self.problem, self.param, self.advice = problem, param, advice

    def __reduce__(self):
        return (self.__class__, (self.problem, self.param, self.advice))


class InvalidJson(HearthError):
    """A request body that is not UTF-8, not JSON, or nested deeper than the port allows: 400 ``invalid_json``
    (``app.server.limits.parse``)."""


@dataclass(frozen=True)
class ApiError:
    """One error answer: HTTP status, OpenAI ``type`` / ``code`` / ``param``, message, extra headers."""

    status: int
    type: str
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] | None = None
    extra: dict[str, Any] | None = None

    def response(self, shape: str = "openai") -> JSONResponse:
        """The JSON answer in ``shape``: "openai", "anthropic" or "ollama" (``{"error": "message"}``)."""
        if shape == "anthropic":
            return JSONResponse(self.anthropic(), status_code=self.status, headers=self.headers)
        if shape == "ollama":
            return JSONResponse({"error": self.message}, status_code=self.status, headers=self.headers)
        body: dict[str, Any] = {"message": self.message, "type": self.type, "param": self.param,
                                "code": self.code}
        if self.extra:
            body.update(self.extra)
        return JSONResponse({"error": body}, status_code=self.status, headers=self.headers)

    def anthropic(self) -> dict[str, Any]:
        """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}`` (the type by status)."""
        kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        message = self.message if self.param is None else f"{self.message} (param: {self.param})"
        return {"type": "error", "error": {"type": kind, "message": message}}


# HTTP status -> Anthropic's error type (docs.anthropic.com "Errors"); 503 is their 529's meaning.
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error", 529: "overloaded_error"}
ANTHROPIC_PATHS = ("/v1/messages",)


def shape_for(path: str, headers: Mapping[str, str] | None = None) -> str:
    """The error shape a request path answers: "anthropic" for the Messages API, and for ``/v1/models`` when
    the request carries an ``anthropic-version`` header (``headers``: the request's, case-insensitive as
    Starlette's are; the listing answers in Anthropic's shape then, so do its errors), "ollama" for Ollama's
    ``/api/*``, else "openai"."""
    if path.startswith("/api/"):
        return "ollama"
    if any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS):
        return "anthropic"
    models = path == "/v1/models" or path.startswith("/v1/models/")
    return "anthropic" if models and headers is not None and "anthropic-version" in headers else "openai"


def _retry(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def from_exception(exc: BaseException) -> ApiError:
    """The ``ApiError`` for a known exception type (the single place that decides status codes)."""
    if isinstance(exc, ContextLengthExceeded):
        extra = {"prompt_tokens": exc.prompt_tokens, "n_ctx": exc.n_ctx}
        if exc.tools_tokens:
            extra["tools_tokens"] = exc.tools_tokens
        return ApiError(400, "invalid_request_error", exc.message, exc.param, "context_length_exceeded",
                        extra=extra)
    if isinstance(exc, ModelNotFound):
        return ApiError(404, "invalid_request_error", exc.message, "model", "model_not_found",
                        extra={"available": exc.available})
    if isinstance(exc, ModelNotLoaded):
        return ApiError(400, "invalid_request_error", exc.message, "model", "model_not_loaded")
    if isinstance(exc, CannotEmbed):
        return ApiError(400, "invalid_request_error", exc.message, "model", "model_cannot_embed")
    if isinstance(exc, DocumentsUnavailable):
        return ApiError(400, "invalid_request_error", exc.message, "hearth.documents", "documents_unavailable")
    if isinstance(exc, RequestNotFound):
        return ApiError(404, "invalid_request_error", exc.message, "id", "request_not_found")
    if isinstance(exc, ResponseNotFound):
        code = "previous_response_not_found" if exc.param == "previous_response_id" else "response_not_found"
        return ApiError(404, "invalid_request_error", exc.message, exc.param, code)
    if isinstance(exc, AnswerMismatch):
        return ApiError(422, "invalid_request_error", exc.message, exc.param, "answer_schema_mismatch")
    if isinstance(exc, InvalidJson):
        return ApiError(400, "invalid_request_error", exc.message, None, "invalid_json")
    if isinstance(exc, InvalidRequest):
        return ApiError(400, "invalid_request_error", exc.message, exc.param, "invalid_value")
    if isinstance(exc, QueueFull):
        return ApiError(429, "rate_limit_error", exc.message, None, "queue_full",
                        headers=_retry(exc.retry_after_s))
    if isinstance(exc, NoModelLoaded):
        return ApiError(503, "server_error", exc.message, None, "no_model_loaded", headers=_retry(2))
    if isinstance(exc, EngineUnresponsive):
        return ApiError(503, "server_error", exc.message, None, "engine_unresponsive", headers=_retry(1))
    if isinstance(exc, EngineCrashed):
        return ApiError(503, "server_error", exc.message, None, "engine_crashed", headers=_retry(1))
    if isinstance(exc, ModelBusy):
        return ApiError(503, "server_error", exc.message, "model", "model_busy", headers=_retry(5))
    if isinstance(exc, ModelLoadError):
        return ApiError(503, "server_error", exc.message, None, "model_load_error", headers=_retry(5))
    if isinstance(exc, Cancelled):
        return ApiError(503, "server_error", exc.message, None, "cancelled", headers=_retry(1))
    if isinstance(exc, DiskFull):  # names the disk; nothing was half-written (docs/memory.md)
        return ApiError(507, "server_error", exc.message, None, "insufficient_storage")
    if isinstance(exc, StoreDamaged):  # the file is left untouched; the message has the recovery command
        return ApiError(503, "server_error", exc.message, None, "store_damaged")
    if isinstance(exc, HearthError):
        return ApiError(500, "server_error", exc.message, None, "hearth_error")
    log.error("unexpected error while serving a request", exc_info=exc)
    return ApiError(500, "server_error", "unexpected server error; see Hearth's log for details", None,
                    "internal_error")


# Tags pydantic puts in ``loc`` for the union branch that failed (``str``, ``list[str]``,
# ``function-after[...]``): they are no parameter names.
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|literal\[.*|list\[.*|dict\[.*|function-.*|json-or-python\[.*|"
                        r"tagged-union\[.*|chain\[.*|lax-.*|is-instance\[.*|constrained-.*)$", re.I)


def _loc_to_param(loc: tuple[Any, ...]) -> str | None:
    out = ""
    for p in loc:
        if p == "body":
            continue
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and not _UNION_TAG.match(p):
            out += ("." if out else "") + p
    return out or None


def from_validation(exc: RequestValidationError) -> ApiError:
    """A 400 naming the first bad parameter (``messages[0].content``, ``temperature``…)."""
    errs = exc.errors()
    if not errs:
        return ApiError(400, "invalid_request_error", "invalid request", None, "invalid_request")
    e = errs[0]
    kind = e.get("type", "")
    if kind == "json_invalid":
        return ApiError(400, "invalid_request_error", "the request body is not valid JSON", None, "invalid_json")
    param = _loc_to_param(tuple(e.get("loc", ())))
    if param is not None and kind != "missing":
        # A union (a string or a list of parts) fails once per branch, the string's first: the deepest error
        # under the same parameter names what is wrong ("messages[0].content[0]: a valid dictionary").
        deeper = [(len(q), x) for x in errs[1:]
                  if (q := _loc_to_param(tuple(x.get("loc", ())))) and q.startswith(param) and len(q) > len(param)]
        if deeper:
            e = max(deeper, key=lambda t: t[0])[1]
            kind, param = e.get("type", ""), _loc_to_param(tuple(e.get("loc", ())))
    if param is None:
        return ApiError(400, "invalid_request_error", "the request body must be a JSON object", None,
                        "invalid_request")
    msg = e.get("msg", "invalid value")
    if kind == "missing":
        text = f"missing required parameter: {param}"
    else:
        got = e.get("input")
        shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
        text = f"invalid value for {param}: {msg} (got {shown[:80]})"
    return ApiError(400, "invalid_request_error", text, param,
                    "missing_required_parameter" if kind == "missing" else "invalid_value")


def from_http(exc: StarletteHTTPException) -> ApiError:
    """Routing errors (404 unknown path, 405 wrong method) in OpenAI's shape."""
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return ApiError(exc.status_code, kind, str(exc.detail), None, code, headers=dict(exc.headers or {}) or None)
