"""The answer of a request with tools, read once for every adapter: text pieces and checked calls out.

``ToolStream`` (``feed`` / ``finish``; ``finish`` also returns the ``ToolOutcome``: content, calls, errors,
finish reason) and ``stream_tools`` (over an engine stream) hold one rule: a call is passed on only whole and
valid, so a streamed answer and a whole one always agree.

The reasoning: docs/tools.md, 'Reading the answer'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Sequence, Union

from app.engine.chat.tool_formats import ToolFormat
from app.engine.chat.tool_parser import ArgsPiece, CallEnd, CallFailed, CallStart, TextPiece, ToolCallError
from app.engine.chat.tools import validate_call
from app.protocol.tools import ToolCall, ToolChoice, ToolSpec
from app.protocol.types import Delta, Done, GenerateRequest

Piece = Union[TextPiece, CallStart, ArgsPiece, CallEnd]


@dataclass(frozen=True)
class ToolOutcome:
    """A whole answer read. ``text``: its content (the text outside calls; the whole raw answer when a call
    failed); ``calls``: the valid calls, in order (empty when any failed); ``errors``: each failed call's
    ``ToolCallError`` (``reason`` for a person, ``raw`` the model's text of it, ``index`` / ``name`` when
    known); ``finish_reason``: "tool_calls" when ``calls``, else the engine's ("stop" / "length")."""

    text: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[ToolCallError, ...] = ()
    finish_reason: str = "stop"

    @property
    def error_message(self) -> str | None:
        """One line saying why the calls were not passed on (None when nothing failed)."""
        if not self.errors:
            return None
        return "; ".join(_describe(e) for e in self.errors)


def _describe(e: ToolCallError) -> str:
    return f"tool call {e.name!r}: {e.reason}" if e.name else f"tool call: {e.reason}"


@dataclass(frozen=True)
class ToolsDone:
    """The end of a ``stream_tools`` stream: the engine's ``Done`` and the answer read."""

    done: Done
    outcome: ToolOutcome


class ToolStream:
    """Reads one answer (docs/tools.md, 'Reading the answer'). ``fmt``: the loaded model's ``ToolFormat``
    (``Engine.tool_format()``); ``tools``: the request's tools; ``choice``: its ``tool_choice`` (None: "auto"
    with tools). Not thread-safe: one reader per answer."""

    def __init__(self, fmt: ToolFormat | None, tools: Sequence[ToolSpec], choice: ToolChoice | None = None) -> None:
        self.tools = tuple(tools)
        mode = (choice.mode if choice is not None else "auto") if tools else "none"
        self._parser = fmt.parser() if fmt is not None and mode != "none" else None
        self._raw: list[str] = []
        self._sent: list[str] = []  # text passed on before the first call
        self._held: list[Piece | CallFailed] | None = None  # None until the first call begins
        self.outcome: ToolOutcome | None = None

    @classmethod
    def for_request(cls, request: GenerateRequest, fmt: ToolFormat | None) -> "ToolStream":
        """The reader for ``request``'s answer."""
        return cls(fmt, request.tools, request.tool_choice)

    @property
    def parsing(self) -> bool:
        """True when the answer is read for calls (tools offered and ``tool_choice`` is not "none")."""
        return self._parser is not None

    def feed(self, text: str) -> list[Piece]:
        """The next text of the answer; returns the pieces that can go out now (text before any call)."""
        if not text:
            return []
        self._raw.append(text)
        if self._parser is None:
            self._sent.append(text)
            return [TextPiece(text)]
        return self._take(self._parser.feed(text))

    def _take(self, events: list) -> list[Piece]:
        out: list[Piece] = []
        for ev in events:
            if self._held is None and isinstance(ev, TextPiece):
                self._sent.append(ev.text)
                out.append(ev)
            else:
                if self._held is None:
                    self._held = []
                self._held.append(ev)
        return out

    def finish(self, finish_reason: str = "stop") -> tuple[list[Piece], ToolOutcome]:
        """End the answer (``finish_reason``: the engine's). Returns the pieces still to go out and the
        ``ToolOutcome``."""
        out = self._take(self._parser.finish()) if self._parser is not None else []
        held = _complete_calls(self._held or [], finish_reason)
        errors = self._errors(held)
        if errors:
            raw, sent = "".join(self._raw), "".join(self._sent)
            rest = raw[len(sent):] if raw.startswith(sent) else raw
            out += [TextPiece(rest)] if rest else []
            self.outcome = ToolOutcome(sent + rest, (), tuple(errors), finish_reason)
            return out, self.outcome
        pieces = [p for p in held if not isinstance(p, CallFailed)]
        out += pieces
        text = "".join(self._sent) + "".join(p.text for p in pieces if isinstance(p, TextPiece))
        calls = tuple(p.call for p in pieces if isinstance(p, CallEnd))
        self.outcome = ToolOutcome(text, calls, (), "tool_calls" if calls else finish_reason)
        return out, self.outcome

    def _errors(self, held: list) -> list[ToolCallError]:
        errors = [p.error for p in held if isinstance(p, CallFailed)]
        for p in held:
            if isinstance(p, CallEnd):
                why = validate_call(p.call, self.tools)
                if why is not None:
                    errors.append(ToolCallError(p.call.arguments, why, p.index, p.call.name))
        return errors


def _complete_calls(held: list, finish_reason: str) -> list:
    """``held`` without what a small model adds after its calls: a last call cut off by ``max_tokens``
    (finish_reason "length", after at least one whole call) and exact repeats of an earlier call (same name and
    arguments); the calls left are renumbered from 0. Measured on the bundled 270M model under a forced,
    parallel grammar: five identical calls, then a sixth cut by max_tokens, which used to turn the whole
    answer into text."""
    ends = [p for p in held if isinstance(p, CallEnd)]
    failed = [p for p in held if isinstance(p, CallFailed)]
    drop: set[int] = set()
    if finish_reason == "length" and ends and len(failed) == 1:
        last = failed[0].error.index
        if last is not None and last > max(p.index for p in ends):
            drop.add(last)
            held = [p for p in held if p is not failed[0]]
    seen: set[tuple[str, str]] = set()
    for p in ends:
        key = (p.call.name, _args_key(p.call.arguments))
        if key in seen:
            drop.add(p.index)
        seen.add(key)
    if not drop:
        return held
    kept = sorted({p.index for p in held if isinstance(p, CallStart)} - drop)
    new = {old: i for i, old in enumerate(kept)}
    out = []
    for p in held:
        if isinstance(p, (CallStart, ArgsPiece, CallEnd)):
            if p.index in drop:
                continue
            p = replace(p, index=new[p.index])
        out.append(p)
    return out


def _args_key(arguments: str) -> str:
    """Arguments compared by value (keys sorted); the raw text if it is not JSON."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return arguments


def stream_tools(events: Iterable[Delta | Done], reader: ToolStream) -> Iterator[Piece | ToolsDone]:
    """``events`` (an engine stream) read by ``reader``: its pieces, then one ``ToolsDone``. Closing this
    iterator closes ``events`` when it can be closed (a ``Generation``'s iterator cancels the request)."""
    it = iter(events)
    try:
        for ev in it:
            if isinstance(ev, Done):
                pieces, outcome = reader.finish(ev.finish_reason)
                yield from pieces
                yield ToolsDone(ev, outcome)
                return
            yield from reader.feed(ev.text)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
