"""What goes over the wire to an OpenAI-compatible server and back, as pure functions: names and URLs, request
bodies, error bodies, server-sent event lines, the state of one answer's chunks (``StreamState``), what a
``/v1/models`` listing says, and the metrics of a stream (docs/remote.md)."""

from __future__ import annotations

import email.utils
import json
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

from app.engine.chat.tool_formats import FORMATS
from app.engine.stream import percentile
from app.errors import InvalidRequest
from app.protocol.tools import ToolCall
from app.protocol.types import ChatMessage, DecodingParams, GenerateRequest, Metrics

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
TOOL_FORMAT = "hermes"  # how a remote's structured calls are written into the answer text (docs/remote.md)
KINDS = ("hearth", "llama-server", "vllm", "openai")
_EXTENDED_SAMPLING = {"hearth", "llama-server", "vllm"}  # take top_k, min_p, ... besides OpenAI's parameters


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
    """Refuse, naming the parameter, what a remote cannot be asked for (docs/remote.md)."""
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


def _metrics(st: StreamState, t_call: float, t_send: float, times: list[float], t_answer: Optional[float]) -> Metrics:
    """Hearth-boundary clocks (docs/remote.md, Timings) and the remote's usage."""
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
