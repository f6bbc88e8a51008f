"""Streaming parser of tool calls in a model's output: text in, text pieces and calls out, as tokens arrive.

``feed(text)`` and ``finish()`` return events (``TextPiece``, ``CallStart``, ``ArgsPiece``, ``CallEnd``,
``CallFailed``); a call is only ever passed on whole. Each family subclasses ``ToolCallParser``.

The reasoning: docs/tools.md, 'app/engine/chat/tool_parser.py'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Generator, Union

from app.protocol.tools import ToolCall, new_call_id

WS = " \t\r\n"
_PRIMITIVE = frozenset("0123456789+-.eEtruefalsn")
_CLOSES = {"}": "{", "]": "["}

Chars = Generator[None, "str | None", Any]  # what every sub-parser is: sent characters, returns a value


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgsPiece:
    index: int
    text: str


@dataclass(frozen=True)
class ToolCallError:
    """A call the parser could not pass on. ``raw``: the model's text of it; ``reason``: why, for a person;
    ``index`` / ``name``: set when its ``CallStart`` was sent."""

    raw: str
    reason: str
    index: int | None = None
    name: str | None = None


@dataclass(frozen=True)
class CallEnd:
    index: int
    call: ToolCall


@dataclass(frozen=True)
class CallFailed:
    error: ToolCallError


Event = Union[TextPiece, CallStart, ArgsPiece, CallEnd, CallFailed]


@dataclass(frozen=True)
class ParsedOutput:
    """A whole answer parsed: ``text`` (all ``TextPiece`` texts joined), the good ``calls`` and the ``errors``."""

    text: str
    calls: tuple[ToolCall, ...]
    errors: tuple[ToolCallError, ...]


class _Malformed(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Revert(Exception):
    """A tentative call (Llama's bare ``{``) turned out to be ordinary text."""


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


class ToolCallParser:
    """Base of the per-family parsers; the events: docs/tools.md, 'app/engine/chat/tool_parser.py'.

    Class attributes a family sets: ``markers`` (strings that open a call anywhere in the text),
    ``bare_json`` (a ``{`` at the start of the answer or right after a call opens a tentative call, which
    becomes text again unless it reads as one: see ``_object``), ``separators`` (framing
    characters dropped around calls), ``closer`` (an optional closing tag consumed after a call and ending a
    malformed one), ``resync_at_newline`` (a malformed call ends at the end of its line), ``arg_keys`` (keys
    that hold the arguments).
    """

    markers: tuple[str, ...] = ()
    bare_json = False
    separators = WS
    closer = ""
    resync_at_newline = False
    arg_keys: tuple[str, ...] = ("arguments", "parameters")

    def __init__(self, new_id: Callable[[], str] = new_call_id) -> None:
        self.calls: list[ToolCall] = []
        self.errors: list[ToolCallError] = []
        self._new_id = new_id
        self._text_parts: list[str] = []
        self._out: list[Event] = []
        self._pend: list[str] = []  # text of the TextPiece / ArgsPiece being built
        self._pend_key: tuple[str, int | None] = ("text", None)
        self._back: list[str] = []  # pushed-back characters, the next one last
        self._raw: list[str] = []  # the region's characters since its marker or the last call
        self._ended = False
        self._finished = False
        self._started = 0
        self._current: tuple[int, str, str] | None = None  # (index, id, name) of the call being read
        self._after_call = False  # nothing but separators since the last call
        self._fresh = True  # nothing but separators since the start or the last call (for bare_json)
        self._tentative = False
        self._pending = ""  # separators before a tentative '{', text again if it is not a call
        self._gen = self._main()
        next(self._gen)

    # -- the public side ------------------------------------------------------------------------------------
    def feed(self, text: str) -> list[Event]:
        """Parse the next piece of the answer; return the events it completes."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        send = self._gen.send
        for c in text:
            send(c)
        return self._take()

    def finish(self) -> list[Event]:
        """End the answer: release held-back text, and report a call left open as a ``CallFailed``."""
        if not self._finished:
            self._finished = True
            try:
                self._gen.send(None)
            except StopIteration:
                pass
        return self._take()

    @property
    def text(self) -> str:
        """All text passed on as ``TextPiece`` so far."""
        return "".join(self._text_parts)

    def result(self) -> ParsedOutput:
        """The answer parsed so far (call after ``finish()`` for the whole answer)."""
        self._flush()
        return ParsedOutput(self.text, tuple(self.calls), tuple(self.errors))

    # -- output ---------------------------------------------------------------------------------------------
    def _put(self, kind: str, index: int | None, s: str) -> None:
        if self._pend and self._pend_key != (kind, index):
            self._flush()
        self._pend_key = (kind, index)
        self._pend.append(s)

    def _flush(self) -> None:
        if not self._pend:
            return
        text = "".join(self._pend)
        self._pend = []
        kind, index = self._pend_key
        if kind == "text":
            self._text_parts.append(text)
            self._out.append(TextPiece(text))
        else:
            assert index is not None
            self._out.append(ArgsPiece(index, text))

    def _event(self, event: Event) -> None:
        self._flush()
        self._out.append(event)

    def _take(self) -> list[Event]:
        self._flush()
        out, self._out = self._out, []
        return out

    def _emit_text(self, s: str) -> None:
        if self._after_call:
            s = s.lstrip(self.separators)
        if s:
            self._after_call = self._fresh = False
            self._put("text", None, s)

    def _args(self, s: str) -> None:
        assert self._current is not None
        self._put("args", self._current[0], s)

    def _start_call(self, name: str) -> None:
        index, call_id = self._started, self._new_id()
        self._started += 1
        self._current = (index, call_id, name)
        self._event(CallStart(index, call_id, name))

    def _end_call(self, arguments: str) -> None:
        assert self._current is not None
        index, call_id, name = self._current
        call = ToolCall(call_id, name, arguments)
        self.calls.append(call)
        self._event(CallEnd(index, call))
        self._current = None
        self._raw = []
        self._after_call = self._fresh = True

    # -- input ----------------------------------------------------------------------------------------------
    def _getc(self, record: bool = True) -> Chars:
        """The next character, or None once the answer has ended."""
        c: str | None
        if self._back:
            c = self._back.pop()
        elif self._ended:
            return None
        else:
            c = yield
            if c is None:
                self._ended = True
                return None
        if record:
            self._raw.append(c)
        return c

    def _unget(self, s: str) -> None:
        """Push ``s`` (the characters just read, in order) back; they leave ``_raw`` too."""
        if s and "".join(self._raw[-len(s):]) == s:
            del self._raw[-len(s):]
        self._back.extend(reversed(s))

    def _bad(self, reason: str, c: str | None) -> Exception:
        """The exception for a malformed call at character ``c``, which is pushed back so that resyncing sees
        it. In a tentative call, the text was not a call after all."""
        if self._tentative:
            return _Revert()
        if c is not None:
            self._unget(c)
        return _Malformed(reason)

    def _need(self) -> Chars:
        c = yield from self._getc()
        if c is None:
            raise self._bad("the answer ended inside the tool call", None)
        return c

    def _skip_ws(self, need: bool = True) -> Chars:
        while True:
            c = yield from (self._need() if need else self._getc())
            if c is None or c not in WS:
                return c

    # -- the answer -----------------------------------------------------------------------------------------
    def _main(self) -> Chars:
        marker = yield from self._text()
        while marker is not None:
            self._raw, self._current, self._tentative = list(marker), None, False
            resume = None
            try:
                yield from self._region(marker)
            except _Revert:
                self._tentative = False
                self._emit_text(self._pending + "".join(self._raw))
            except _Malformed as exc:
                resume = yield from self._fail(exc.reason)
            self._pending = ""
            marker = resume if resume is not None else (yield from self._text())

    def _text(self) -> Chars:
        """Pass text on until a call marker; return the marker (or "{" for a bare call), None at the end."""
        held = ""
        while True:
            c = yield from self._getc(record=False)
            if c is None:
                self._emit_text(held)
                return None
            if c == "{" and self.bare_json and self._fresh and not held.strip(self.separators):
                self._pending = held
                return "{"
            held += c
            for m in self.markers:
                if held.endswith(m):
                    self._emit_text(held[:-len(m)].rstrip(self.separators))
                    return m
            cut = self._safe_len(held)
            if cut:
                self._emit_text(held[:cut])
                held = held[cut:]

    def _safe_len(self, held: str) -> int:
        """How much of ``held`` is surely text: not a possible marker start, nor separators before one."""
        keep = 0
        for m in self.markers:
            for k in range(min(len(m) - 1, len(held)), keep, -1):
                if held.endswith(m[:k]):
                    keep = k
                    break
        cut = len(held) - keep
        while cut > 0 and held[cut - 1] in self.separators:
            cut -= 1
        return cut

    def _region(self, marker: str) -> Chars:
        """Parse the calls after ``marker`` (a family's syntax). Raises ``_Malformed`` or ``_Revert``."""
        raise NotImplementedError
        yield  # pragma: no cover

    def _fail(self, reason: str) -> Chars:
        """Record a malformed call: read on to where parsing can resume; return the next marker found, if any."""
        resume = yield from self._resync()
        index, name = (self._current[0], self._current[2]) if self._current else (None, None)
        error = ToolCallError("".join(self._raw), reason, index, name)
        self.errors.append(error)
        self._event(CallFailed(error))
        self._current, self._raw = None, []
        self._after_call = self._fresh = True
        return resume

    def _resync(self) -> Chars:
        """Consume a broken call up to its closer (included), the next marker (returned, left out of the
        raw text), the end of its line (``resync_at_newline``) or the end of the answer."""
        longest = max([len(m) for m in self.markers] + [len(self.closer)])
        while True:
            c = yield from self._getc()
            if c is None:
                return None
            if self.resync_at_newline and c == "\n":
                self._unget(c)
                return None
            tail = "".join(self._raw[-longest:])
            if self.closer and tail.endswith(self.closer):
                return None
            for m in self.markers:
                if tail.endswith(m):
                    del self._raw[-len(m):]
                    return m

    # -- JSON pieces ----------------------------------------------------------------------------------------
    def _object(self, tentative: bool = False) -> Chars:
        """A call object after its ``{``: ``{"name": "...", "arguments": {...}}`` in any key order, other keys
        (``type``, ``id``) skipped. Sends CallStart, the arguments and CallEnd.

        ``tentative`` (Llama's bare ``{``): the object is a call only if it reads ``"type": "function"``
        (optional), then ``"name"`` with a string, then an arguments key; anything else first makes it text
        again, so that an answer ``{"name": "Alice", "age": 30}`` stays an answer. CallStart waits for the
        arguments key there."""
        self._tentative = tentative
        name: str | None = None
        args: str | None = None
        c = yield from self._skip_ws()
        while True:
            if c != '"':
                raise self._bad("expected a quoted key in the tool call", c)
            key = yield from self._string()
            if self._tentative and not (key == "type" and name is None or key == "name"
                                        or key in self.arg_keys and name is not None):
                raise _Revert()
            c = yield from self._skip_ws()
            if c != ":":
                raise self._bad(f"expected ':' after the key {key!r}", c)
            c = yield from self._skip_ws()
            if key == "name" and name is None:
                if c != '"':
                    raise self._bad("the tool's name must be a string", c)
                name = yield from self._string()
                if not isinstance(name, str) or not name:
                    raise self._bad("the tool's name is empty", None)
                if not self._tentative:
                    self._start_call(name)
                    if args is not None:  # written before the name
                        self._args(args)
            elif key in self.arg_keys and args is None:
                if self._tentative:
                    assert name is not None
                    self._tentative = False
                    self._start_call(name)
                args = yield from self._arguments(c)
            else:
                value = yield from self._value(c, stream=False)
                if self._tentative and value != '"function"':
                    raise _Revert()
            c = yield from self._skip_ws()
            if c == ",":
                c = yield from self._skip_ws()
            elif c == "}":
                break
            else:
                raise self._bad("expected ',' or '}' in the tool call", c)
        if name is None or self._tentative:
            raise self._bad("the tool call has no name", None)
        if args is None:
            args = "{}"
            self._args(args)
        self._end_call(args)

    def _arguments(self, c: str) -> Chars:
        """The arguments value starting at ``c``: an object (streamed once the name is known) or a string
        holding JSON text (decoded). Returns the JSON text, checked to be an object."""
        stream = self._current is not None
        if c == "{":
            text = yield from self._value(c, stream)
        elif c == '"':
            text = yield from self._string()
            if stream:
                self._args(text)
        else:
            raise self._bad("the arguments must be a JSON object", c)
        try:
            obj = json.loads(text, parse_constant=_no_constant)
        except ValueError as exc:
            raise self._bad(f"the arguments are not valid JSON ({exc})", None) from None
        if not isinstance(obj, dict):
            raise self._bad(f"the arguments must be a JSON object, got {type(obj).__name__}", None)
        return text

    def _value(self, c: str, stream: bool) -> Chars:
        """Scan one JSON value starting at ``c`` without parsing it; return its text."""
        buf = [c]
        if stream:
            self._args(c)
        if c == '"':
            yield from self._string_rest(buf, stream)
        elif c in "{[":
            stack = [c]
            while stack:
                c = yield from self._need()
                buf.append(c)
                if stream:
                    self._args(c)
                if c == '"':
                    yield from self._string_rest(buf, stream)
                elif c in "{[":
                    stack.append(c)
                elif c in _CLOSES and stack.pop() != _CLOSES[c]:
                    raise self._bad("mismatched brackets in the tool call's JSON", None)
        elif c in _PRIMITIVE:
            while True:
                c = yield from self._getc()
                if c is None or c not in _PRIMITIVE:
                    if c is not None:
                        self._unget(c)
                    break
                buf.append(c)
                if stream:
                    self._args(c)
        else:
            raise self._bad(f"unexpected {c!r} in the tool call's JSON", c)
        return "".join(buf)

    def _string_rest(self, buf: list[str], stream: bool) -> Chars:
        """The rest of a JSON string after its opening quote, appended to ``buf``."""
        escaped = False
        while True:
            c = yield from self._need()
            buf.append(c)
            if stream:
                self._args(c)
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                return

    def _string(self) -> Chars:
        """A JSON string after its opening quote, decoded."""
        buf = ['"']
        yield from self._string_rest(buf, False)
        try:
            return json.loads("".join(buf))
        except ValueError as exc:
            raise self._bad(f"a string in the tool call is not valid JSON ({exc})", None) from None
