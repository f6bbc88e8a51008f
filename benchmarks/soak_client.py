"""The clients of ``hearth bench soak`` (``benchmarks.soak``): what each kind of request sends and how its
answer is read, one ``SoakRecord`` per request, never an exception.

Every clock is ``time.perf_counter()`` in this process. ``start_s`` is when the client began sending
(before connecting), relative to the soak's start; ``ttft_s`` runs from then to the first non-empty content
piece of a streamed answer (chat ``delta.content``, ``response.output_text.delta``, Anthropic's
``text_delta``, Ollama's ``message.content``); ``total_s`` to the last byte read (or to the moment the
client closed the connection). A whole (not streamed) answer has no TTFT: its first content byte is its last.

Outcomes: ``ok`` (HTTP 200 and the stream's own end event: ``[DONE]``, ``response.completed``,
``message_stop``, ``"done": true``; a whole answer with what its kind asks for, a tool call for ``tool``),
``cut`` (a stream the client closed on purpose after a few content pieces), ``cancelled`` (a stream the
client closed on purpose as soon as the headers came, before any content), ``rejected`` (HTTP 429) and
``failed`` (anything else: another status, an error event, a stream that ends before its end event, a
timeout, a connection error). Deliberate cuts and cancels are counted apart from failures.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

MAX_TOKENS = 32  # per answer: short, so that a shared 2-core machine still turns over many requests

# kind → relative weight in the mix (embeddings only with --embeddings; documents only where the server has them)
WEIGHTS = {"chat": 1, "stream": 3, "cut": 1, "cancel": 1, "tool": 1, "documents": 1, "responses": 1,
           "messages": 1, "ollama": 1, "embeddings": 1}
DELIBERATE = ("cut", "cancelled")

_OPENERS = ("The lighthouse keeper wrote in her log that", "At the harbour market this morning",
            "The old ferry to the island", "When the fog came in over the bay", "The recipe for fish stew says",
            "Our neighbour's boat, the Marigold,", "Every winter the fishermen", "The tide table for next week")
_DOC_QUESTIONS = ("When does the ferry leave on Sundays?", "What does the harbour master ask of visiting boats?",
                  "Which fish are sold at the market?", "How tall is the lighthouse?",
                  "What is in the fish stew?")
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city today",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima", "Perth"]}},
                   "required": ["city"]}}}


@dataclass
class SoakRecord:
    """One request as the client saw it (seconds; ``start_s`` relative to the soak's start)."""

    kind: str
    model: str
    client: int
    start_s: float
    ttft_s: Optional[float] = None
    total_s: Optional[float] = None
    status: str = "failed"
    http_status: Optional[int] = None
    error: Optional[str] = None
    pieces: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready values."""
        return asdict(self)


@dataclass
class Mix:
    """What the clients send: ``kinds`` with their weights, the ``models`` to pick from, ``max_tokens`` per
    answer, the server's ``url`` (no ``/v1``) and the client ``timeout_s``."""

    url: str
    models: list[str]
    kinds: dict[str, int] = field(default_factory=dict)
    max_tokens: int = MAX_TOKENS
    timeout_s: float = 120.0

    def draw(self, rng: random.Random) -> tuple[str, str]:
        """The next request's ``(kind, model)``."""
        names = sorted(self.kinds)
        kind = rng.choices(names, weights=[self.kinds[k] for k in names])[0]
        return kind, rng.choice(self.models)


def prompt(rng: random.Random) -> str:
    """A short story opening (a different one most times: a few words of it are drawn)."""
    return f"{rng.choice(_OPENERS)} {rng.randint(2, 99)} {rng.choice(('gulls', 'nets', 'crates', 'lanterns'))}"


def _messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def request_for(kind: str, model: str, mix: Mix, rng: random.Random) -> tuple[str, dict[str, Any], bool]:
    """``(path, body, streamed)`` of one request of ``kind`` to ``model``."""
    mt, text = mix.max_tokens, prompt(rng)
    chat = {"model": model, "messages": _messages(text), "max_tokens": mt, "temperature": 0.7}
    if kind == "chat":
        return "/v1/chat/completions", chat, False
    if kind in ("stream", "cut", "cancel"):
        return "/v1/chat/completions", {**chat, "stream": True}, True
    if kind == "tool":
        # one call (a base model repeats calls while it may, and one cut off by max_tokens fails the answer)
        return "/v1/chat/completions", {**chat, "max_tokens": max(64, mt), "tools": [WEATHER_TOOL],
                                        "tool_choice": "required", "parallel_tool_calls": False}, False
    if kind == "documents":
        return "/v1/chat/completions", {**chat, "messages": _messages(rng.choice(_DOC_QUESTIONS)), "stream": True,
                                        "hearth": {"documents": True, "k": 2}}, True
    if kind == "responses":
        return "/v1/responses", {"model": model, "input": text, "max_output_tokens": mt, "stream": True}, True
    if kind == "messages":
        return "/v1/messages", {"model": model, "messages": _messages(text), "max_tokens": mt, "stream": True}, True
    if kind == "ollama":
        return "/api/chat", {"model": model, "messages": _messages(text), "stream": True,
                             "options": {"num_predict": mt}}, True
    if kind == "embeddings":
        return "/v1/embeddings", {"input": [text]}, False
    raise ValueError(f"unknown request kind {kind!r}; known: {', '.join(sorted(WEIGHTS))}")


# Stream readers: one parsed event → (content piece, the stream's end event?, error message or None)
def _chat_event(obj: dict) -> tuple[str, bool, Optional[str]]:
    if "error" in obj:
        return "", False, str(obj["error"])[:300]
    choices = obj.get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content") or "", False, None


def _responses_event(obj: dict) -> tuple[str, bool, Optional[str]]:
    kind = obj.get("type", "")
    if kind in ("error", "response.failed"):
        return "", False, str(obj.get("message") or obj)[:300]
    if kind == "response.output_text.delta":
        return obj.get("delta") or "", False, None
    return "", kind in ("response.completed", "response.incomplete"), None


def _messages_event(obj: dict) -> tuple[str, bool, Optional[str]]:
    kind = obj.get("type", "")
    if kind == "error":
        return "", False, str(obj.get("error") or obj)[:300]
    if kind == "content_block_delta":
        return (obj.get("delta") or {}).get("text") or "", False, None
    return "", kind == "message_stop", None


def _ollama_event(obj: dict) -> tuple[str, bool, Optional[str]]:
    if "error" in obj:
        return "", False, str(obj["error"])[:300]
    return (obj.get("message") or {}).get("content") or "", bool(obj.get("done")), None


READERS: dict[str, Callable[[dict], tuple[str, bool, Optional[str]]]] = {
    "/v1/chat/completions": _chat_event, "/v1/responses": _responses_event, "/v1/messages": _messages_event,
    "/api/chat": _ollama_event}


def _event(path: str, line: str) -> Optional[dict]:
    """The JSON object of one stream line (None for blank, ``event:`` and comment lines); ``{"_done": True}``
    for chat's ``data: [DONE]``."""
    if path == "/api/chat":
        return json.loads(line) if line.strip() else None
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    return {"_done": True} if data == "[DONE]" else json.loads(data)


def send(client: Any, mix: Mix, kind: str, model: str, rng: random.Random, t0: float, idx: int) -> SoakRecord:
    """Send one request of ``kind`` and return its record; never raises for the server's or the network's
    faults (they become ``failed`` records)."""
    path, body, streamed = request_for(kind, model, mix, rng)
    start = time.perf_counter()
    rec = SoakRecord(kind, model, idx, start - t0)
    try:
        if streamed:
            cut_after = rng.randint(1, 4) if kind == "cut" else None
            _stream(client, mix.url + path, body, path, rec, start, cut_after, kind == "cancel")
        else:
            _whole(client, mix.url + path, body, kind, rec)
    except Exception as e:  # noqa: BLE001 - a request's fault is its record, not the soak's end
        rec.status, rec.error = "failed", f"{type(e).__name__}: {e}"[:600]
    rec.total_s = time.perf_counter() - start
    return rec


def _http_error(rec: SoakRecord, status: int, text: str) -> None:
    rec.http_status = status
    rec.status = "rejected" if status == 429 else "failed"
    rec.error = f"HTTP {status}: {text[:300]}"


def _stream(client: Any, url: str, body: dict, path: str, rec: SoakRecord, start: float,
            cut_after: Optional[int], cancel: bool) -> None:
    reader = READERS[path]
    with client.stream("POST", url, json=body, headers={"anthropic-version": "2023-06-01"}) as r:
        if r.status_code != 200:
            _http_error(rec, r.status_code, r.read().decode("utf-8", "replace"))
            return
        rec.http_status = 200
        if cancel:  # closed as soon as the headers came: the server must free the request's slot
            rec.status = "cancelled"
            return
        for line in r.iter_lines():
            obj = _event(path, line)
            if obj is None:
                continue
            if obj.get("_done"):
                rec.status = "ok"
                return
            piece, done, error = reader(obj)
            if error:
                rec.status, rec.error = "failed", f"error event: {error}"
                return
            if piece:
                rec.pieces += 1
                if rec.ttft_s is None:
                    rec.ttft_s = time.perf_counter() - start
                if cut_after is not None and rec.pieces >= cut_after:
                    rec.status = "cut"  # leaving the block closes the connection mid-answer
                    return
            if done:
                rec.status = "ok"
                return
    if rec.status == "failed" and rec.error is None:
        rec.error = "the stream ended before its end event"


def _whole(client: Any, url: str, body: dict, kind: str, rec: SoakRecord) -> None:
    r = client.post(url, json=body)
    if r.status_code != 200:
        _http_error(rec, r.status_code, r.text)
        return
    rec.http_status = 200
    obj = r.json()
    if kind == "embeddings":
        ok = bool(obj.get("data")) and bool(obj["data"][0].get("embedding"))
        why = "no embedding in the answer"
    else:
        choice = (obj.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        ok = bool(msg.get("tool_calls")) if kind == "tool" else msg.get("content") is not None
        why = "no message content"
        if kind == "tool":
            error = (obj.get("hearth") or choice.get("hearth") or {}).get("tool_call_error")
            why = (f"no tool call in the answer (finish_reason {choice.get('finish_reason')!r}, "
                   f"hearth.tool_call_error {json.dumps(error)[:400]}, content {str(msg.get('content'))[:160]!r})")
    rec.status, rec.error = ("ok", None) if ok else ("failed", why)
    rec.pieces = 1 if ok else 0
