"""Run a ``Plan`` on the engine and answer it, streamed (SSE) or whole.

The reasoning: docs/server.md, 'app/server/service.py'.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Callable, Optional, Protocol

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.engine.chat.tool_parser import ArgsPiece, CallStart, TextPiece
from app.engine.chat.tool_stream import ToolStream
from app.engine.policies.self_consistency import SelfConsistencyRun
from app.errors import Cancelled, ContextLengthExceeded, InvalidRequest
from app.protocol.backend import Backend
from app.protocol.types import Delta, Done, GenerateRequest
from app.server import format as fmt
from app.server import structured
from app.server.convert import Plan
from app.server.errors import ApiError, from_exception
from app.server.mcp_tools import BoxStopper, PortTools, prepare
from app.server.metrics import ServerMetrics
from app.server.pump import DisconnectWatcher, Pump
from app.server.running import Entry, Running

log = logging.getLogger(__name__)


@dataclass
class _Call:
    """What every generation of one HTTP request shares."""

    engine: Backend
    watcher: DisconnectWatcher
    entry: Entry
    tool_fmt: Any = None
    pump: Any = None  # the generation streaming now (stopped when the answer ends early)


@dataclass(frozen=True)
class ChoiceStart:
    """Piece: choice ``index`` begins."""

    index: int


@dataclass(frozen=True)
class Thought:
    """Piece: thinking text (``Delta.reasoning``), apart from the answer."""

    text: str


@dataclass(frozen=True)
class Entries:
    """Piece: logprob entries that go out with the next answer text (``LogprobGate``)."""

    entries: tuple


class Answer(Protocol):
    """How one API writes answers (``CHAT``, ``responses.ResponsesAnswer``, ``messages.MessagesAnswer``)."""

    def frame(self, plan: Plan) -> fmt.Frame: ...

    async def whole(self, frame: fmt.Frame, choices: list[fmt.Choice], piece: Optional[fmt.PieceFn]) -> dict: ...

    def stream(self, frame: fmt.Frame, pieces: AsyncIterator[Any],
               piece: Optional[fmt.PieceFn]) -> AsyncIterator[bytes]: ...

    def error_event(self, err: ApiError) -> bytes: ...


class Service:
    """Runs plans on an engine and answers them; ``running`` is the registry of answers in progress; ``mcp``:
    the MCP tools a plan with ``mcp_tools`` runs (None: such plans are refused)."""

    def __init__(self, metrics: ServerMetrics, running: Optional[Running] = None,
                 mcp: Optional[PortTools] = None) -> None:
        self.metrics = metrics
        self.running = running or Running()
        self.mcp = mcp

    async def respond(self, plan: Plan, engine: Backend, request: Request, answer: Optional[Answer] = None,
                      release: Callable[[], None] = lambda: None):
        """The answer to ``plan``: a ``JSONResponse`` or an ``SSEResponse``, written by ``answer`` (default
        ``CHAT``). ``release`` is called once when the answer is over (the model's lease)."""
        answer = answer or CHAT
        boxes = None
        if plan.mcp_tools:
            try:
                plan, boxes = await run_in_threadpool(prepare, self.mcp, plan)
            except BaseException:
                release()
                raise
        piece: fmt.PieceFn | None = engine.token_piece_bytes if plan.logprobs is not None else None
        frame = answer.frame(plan)
        call = _Call(engine, DisconnectWatcher(request.receive, self.metrics.cancelled_by_client),
                     self.running.open(frame.id))
        done = _once(call, release)
        handed_over = False  # a started stream releases when its connection ends (SSEResponse)
        try:
            call.tool_fmt = await run_in_threadpool(engine.tool_format) if plan.requests[0].tools else None
            if plan.stream and boxes is None:
                first = await self._start(call, plan.requests[0])
                handed_over = True
                return SSEResponse(self._events(frame, call, first, answer, piece), call.watcher, done)
            if plan.consistency is not None:
                choices = [await self._consistent(call, req, plan.consistency) for req in plan.requests]
            elif boxes is not None:
                choices = [await self._with_mcp(call, req, box) for req, box in zip(plan.requests, boxes)]
            else:
                choices = [await self._collect(call, req) for req in plan.requests]
            for choice in choices:
                await _check_citations(plan, choice)
                _check_answer(plan, choice)
            if plan.stream:  # hearth.mcp_tools: the tools ran first, then the answers go out as a stream
                handed_over = True
                return SSEResponse(self._replay(frame, call, choices, answer, piece), call.watcher, done)
            return JSONResponse(await answer.whole(frame, choices, piece))
        finally:
            if not handed_over:
                done()

    async def _start(self, call: _Call, req: GenerateRequest):
        """Queue ``req``; return ``(pump, first_event, clamped_to)`` once the engine produced something."""
        clamped = None
        while True:
            pump = Pump(call.entry.add(call.engine.generate(req)))
            call.pump = pump
            call.watcher.track(pump)
            try:
                return pump, await pump.next(), clamped
            except ContextLengthExceeded as exc:
                clamped, req = _clamped(exc, req, clamped)
            except InvalidRequest as exc:
                raise _grammar_param(exc, req) from None

    async def _collect(self, call: _Call, req: GenerateRequest) -> fmt.Choice:
        pump, ev, clamped = await self._start(call, req)
        lps: list[Any] = []
        gate = LogprobGate()
        while not isinstance(ev, Done):
            lps.extend(gate.feed(ev))
            ev = await pump.next()
        self.metrics.generation(ev)
        return fmt.Choice(ev, lps, clamped, req.decoding.max_tokens, _read_tools(req, call.tool_fmt, ev))

    async def _with_mcp(self, call: _Call, req: GenerateRequest, box: Any) -> fmt.Choice:
        """``req`` answered with the port's MCP tools (``mcp_tools``): each step's calls run through the tool
        loop, then the next step generates; the last step's choice is the answer."""
        stopper, step, tools = BoxStopper(box), 1, self.mcp
        assert tools is not None  # respond refused the plan otherwise
        try:
            while True:
                choice = await self._collect(call, req)
                call.watcher.track(stopper)  # type: ignore[arg-type]
                calls = choice.tools.calls if choice.tools is not None else ()
                nxt = await run_in_threadpool(tools.next_request, box, req, choice.text, calls, step,
                                              call.engine.settings.n_ctx)
                if nxt is None:
                    return choice
                req, step = nxt, step + 1
        finally:
            stopper.finished = True

    async def _replay(self, frame: fmt.Frame, call: _Call, choices: list[fmt.Choice], answer: Answer,
                      piece: fmt.PieceFn | None) -> AsyncIterator[bytes]:
        """Finished ``choices`` written as the API's stream: each one's thinking, text and calls in one piece."""
        async def pieces() -> AsyncIterator[Any]:
            for i, choice in enumerate(choices):
                yield ChoiceStart(i)
                for p in _whole_pieces(choice):
                    yield p
                yield choice
            call.entry.close()
        try:
            async for data in answer.stream(frame, pieces(), piece):
                yield data
        finally:
            call.entry.close()

    async def _consistent(self, call: _Call, req: GenerateRequest, spec: Any) -> fmt.Choice:
        """``req`` answered by self-consistency: its samples voted, the chosen one returned with the vote."""
        clamped = None
        while True:
            run = SelfConsistencyRun(_Recording(call.engine, call.entry), req, spec)
            stopper = _RunStopper(run)
            call.watcher.track(stopper)  # type: ignore[arg-type]
            try:
                result = await run_in_threadpool(run.run)
                break
            except ContextLengthExceeded as exc:
                clamped, req = _clamped(exc, req, clamped)
            except InvalidRequest as exc:
                raise _grammar_param(exc, req) from None
            finally:
                stopper.finished = True
        for done in result.dones:
            self.metrics.generation(done)
        return fmt.Choice(result.chosen, [], clamped, req.decoding.max_tokens, consistency=result.to_api(),
                          samples=result.dones)

    async def _pieces(self, call: _Call, plan: Plan, first: tuple) -> AsyncIterator[Any]:
        """Every generation of ``plan`` in turn, as pieces (module docstring); the answer's registry entry is
        closed after the last one, before the API writes its end."""
        for i, req in enumerate(plan.requests):
            pump, ev, clamped = first if i == 0 else await self._start(call, req)
            yield ChoiceStart(i)
            reader = ToolStream.for_request(req, call.tool_fmt) if req.tools else None
            gate = LogprobGate()
            while isinstance(ev, Delta):
                if ev.reasoning:
                    yield Thought(ev.reasoning)
                entries = gate.feed(ev)
                if entries:
                    yield Entries(tuple(entries))
                for p in (reader.feed(ev.text) if reader is not None else [TextPiece(ev.text)] if ev.text else []):
                    yield p
                ev = await pump.next()
            choice = fmt.Choice(ev, [], clamped, req.decoding.max_tokens)
            if reader is not None:
                tail, choice.tools = reader.finish(ev.finish_reason)
                for p in tail:
                    yield p
            self.metrics.generation(ev)
            await _check_citations(plan, choice)
            _check_answer(plan, choice)
            yield choice
        call.entry.close()  # before the end: a client that read the end finds the id gone (404)

    async def _events(self, frame: fmt.Frame, call: _Call, first: tuple, answer: Answer,
                      piece: fmt.PieceFn | None) -> AsyncIterator[bytes]:
        pieces = self._pieces(call, frame.plan, first)
        try:
            async for data in answer.stream(frame, pieces, piece):
                yield data
        except Exception as exc:  # noqa: BLE001 - after the headers, errors go in-band
            if call.watcher.gone and isinstance(exc, Cancelled):
                return
            err = from_exception(exc)
            self.metrics.error(err.type, err.code)
            yield answer.error_event(err)
        finally:
            await pieces.aclose()  # type: ignore[attr-defined]
            if call.pump is not None:
                call.pump.stop()  # no-op for a finished generation; cancels one left behind by a closed stream
            call.entry.close()


async def _check_citations(plan: Plan, choice: fmt.Choice) -> None:
    """With documents: ``choice.citations`` checked and ``choice.attributions`` computed on the thread pool,
    before any body is written (with an embedding model the check embeds the citing sentences and the cited
    passages' spans: one call per answer, ~0.2 s per citation on the loaded 2-core dev machine,
    docs/retrieval.md; the attribution one more call for every claim sentence and every passage's spans;
    never on the event loop)."""
    if plan.grounding is not None:
        choice.citations = await run_in_threadpool(plan.grounding.checked_citations, choice.text)
        choice.attributions = await run_in_threadpool(plan.grounding.attributions, choice.text)


def _check_answer(plan: Plan, choice: fmt.Choice) -> None:
    """A 422 for an answer that breaks its ``response_format`` schema where the grammar could not enforce it
    (``structured.check_answer``), or that one of the request's own ``stop`` strings cut before its JSON was
    complete under a ``response_format`` grammar (``structured.check_cut``; a cut by ``max_tokens`` goes back as
    it is, its finish_reason "length" says why). A stream has sent the text already, so the 422 goes in-band. A
    call, or a failed one (``hearth.tool_call_error`` says why), is not an answer in the format."""
    if choice.tools and (choice.tools.calls or choice.tools.errors):
        return
    dec = plan.requests[0].decoding if plan.requests else None
    if dec is not None and dec.grammar and dec.stop:
        structured.check_cut(choice.text, choice.finish_reason, choice.done.info.get("stop_sequence"), dec.stop)
    if plan.answer_format is not None:
        structured.check_answer(choice.text, choice.finish_reason, plan.answer_format)


def _whole_pieces(choice: fmt.Choice) -> list[Any]:
    """A finished choice as the pieces a stream of it would have had (logprobs aside)."""
    out: list[Any] = [Thought(choice.reasoning)] if choice.reasoning else []
    out += [TextPiece(choice.text)] if choice.text else []
    for i, c in enumerate(choice.tools.calls if choice.tools is not None else ()):
        out += [CallStart(i, c.id, c.name), ArgsPiece(i, c.arguments)]
    return out


def _once(call: _Call, release: Callable[[], None]) -> Callable[[], None]:
    """The end of an answer, run once however many paths reach it: the disconnect watcher stops, the
    registry entry closes and the model is released."""
    state = {"done": False}

    def done() -> None:
        if state["done"]:
            return
        state["done"] = True
        call.watcher.close()
        call.entry.close()
        release()
    return done


def _clamped(exc: ContextLengthExceeded, req: GenerateRequest, clamped: Optional[int]):
    """``(clamped_to, req)`` to retry once with max_tokens clamped to what the context leaves; re-raises
    ``exc`` when the prompt alone fills the context, no max_tokens was asked for, or it was clamped already."""
    if clamped is not None or not exc.max_tokens or exc.prompt_tokens >= exc.n_ctx:
        raise exc
    to = exc.n_ctx - exc.prompt_tokens
    return to, replace(req, decoding=replace(req.decoding, max_tokens=to))


def _grammar_param(exc: InvalidRequest, req: GenerateRequest) -> InvalidRequest:
    """A grammar llama.cpp refused names the field it came from: response_format, or the tools' grammar of a
    forced call."""
    if exc.param == "grammar":
        return InvalidRequest(exc.message, param="tools" if req.choice.forces_call else "response_format")
    return exc


def _read_tools(req: GenerateRequest, tool_fmt: Any, done: Done) -> Any:
    """A whole answer read for tool calls (None without tools): the stream's reader, fed at once."""
    if not req.tools:
        return None
    reader = ToolStream.for_request(req, tool_fmt)
    reader.feed(done.text)
    return reader.finish(done.finish_reason)[1]


class _Recording:
    """The engine as a self-consistency run sees it: each sample's generation is recorded in the answer's
    registry entry as it is created, so ``stop_thinking`` reaches every sample."""

    def __init__(self, engine: Backend, entry: Entry) -> None:
        self._engine, self._entry = engine, entry

    def generate(self, request: GenerateRequest) -> Any:
        """``Engine.generate``, recorded."""
        return self._entry.add(self._engine.generate(request))


class _RunStopper:
    """What ``DisconnectWatcher`` stops when the client leaves: a self-consistency run (``finished`` and
    ``stop()``, like a ``Pump``)."""

    def __init__(self, run: SelfConsistencyRun) -> None:
        self.run = run
        self.finished = False

    def stop(self) -> None:
        """Cancel every sample."""
        if not self.finished:
            self.run.cancel()


class ChatAnswer:
    """OpenAI's chat and text completions (``chat.completion`` / ``text_completion``, their chunks, ``[DONE]``)."""

    def frame(self, plan: Plan) -> fmt.Frame:
        """A ``chatcmpl-`` / ``cmpl-`` id."""
        return fmt.Frame.new(plan)

    async def whole(self, frame: fmt.Frame, choices: list[fmt.Choice], piece: Optional[fmt.PieceFn]) -> dict:
        """The whole answer (logprob tokens looked up off the event loop)."""
        if piece is None:
            return fmt.response(frame, choices, piece)
        return await run_in_threadpool(fmt.response, frame, choices, piece)

    async def stream(self, frame: fmt.Frame, pieces: AsyncIterator[Any],
                     piece: Optional[fmt.PieceFn]) -> AsyncIterator[bytes]:
        """Chunks per choice (the role first, text, calls, the last with its finish reason and ``hearth``),
        the usage chunk when asked for, then ``[DONE]``."""
        choices: list[fmt.Choice] = []
        out: Optional[_ChoiceStream] = None
        async for p in pieces:
            if isinstance(p, ChoiceStart):
                out = _ChoiceStream(frame, p.index, piece)
                if frame.plan.kind == "chat":
                    yield fmt.chunk(frame, p.index, role=True)
                continue
            assert out is not None
            if isinstance(p, fmt.Choice):
                choices.append(p)
            for data in await (out.done(p) if isinstance(p, fmt.Choice) else out.piece(p)):
                yield data
        if frame.plan.include_usage:
            yield fmt.usage_chunk(frame, choices)
        yield fmt.DONE_EVENT

    def error_event(self, err: ApiError) -> bytes:
        """``data: {"error": ...}``: the ``openai`` client raises ``APIError`` on it."""
        return fmt.error_event({"message": err.message, "type": err.type, "param": err.param, "code": err.code})


class _ChoiceStream:
    """The chunks of one streamed chat / text choice: each piece's text, its logprob entries, and the last
    chunk with the finish reason and the ``hearth`` object."""

    def __init__(self, frame: fmt.Frame, index: int, piece: fmt.PieceFn | None) -> None:
        self.frame, self.index, self.piece_fn = frame, index, piece
        self.entries: list[Any] = []  # logprob entries waiting for the text they go out with
        self.offset = 0

    async def piece(self, p: Any) -> list[bytes]:
        """The chunks of one piece: thinking, answer text (with the entries waiting), a call's start or
        arguments; entries wait for the next text."""
        if isinstance(p, Thought):
            return [fmt.chunk(self.frame, self.index, reasoning=p.text)]
        if isinstance(p, Entries):
            self.entries.extend(p.entries)
            return []
        if isinstance(p, TextPiece):
            lp = await self._logprobs()
            self.offset += len(p.text)
            return [fmt.chunk(self.frame, self.index, text=p.text, lp=lp)]
        if isinstance(p, (CallStart, ArgsPiece)):
            return [fmt.chunk(self.frame, self.index, tool_calls=[fmt.tool_call_delta(p)])]
        return []

    async def done(self, choice: fmt.Choice) -> list[bytes]:
        """The choice's last chunk."""
        lp = await self._logprobs()
        return [fmt.chunk(self.frame, self.index, finish=choice.finish_reason, lp=lp,
                          hearth=fmt.choice_hearth(self.frame.plan, choice))]

    async def _logprobs(self) -> dict | None:
        if self.piece_fn is None or not self.entries:
            return None
        entries, self.entries = self.entries, []
        return await run_in_threadpool(fmt.logprobs, self.frame.plan, entries, self.piece_fn, self.offset)


CHAT = ChatAnswer()


class LogprobGate:
    """Logprob entries travel with the text they produced. The engine holds back text that may begin a stop
    string (one event per token, with empty text); those tokens' entries wait here and go out with the
    next text, and entries still waiting at the end belonged to the stop string and are dropped. Streamed
    and whole answers therefore report the same entries. Logprobs cover the answer: an event whose only
    text is thinking drops its entries and those waiting (thinking tokens, or held-back marker text)."""

    def __init__(self) -> None:
        self.pending: list[Any] = []

    def feed(self, ev: Delta) -> list[Any]:
        """The entries to send with ``ev``'s text (none when it has no answer text)."""
        if ev.reasoning and not ev.text:
            self.pending = []
            return []
        self.pending.extend(ev.logprobs)
        if not ev.text:
            return []
        out, self.pending = self.pending, []
        return out


class SSEResponse(StreamingResponse):
    """A ``text/event-stream`` answer that always releases its generation: when the stream ends, fails or
    the client leaves, the body generator is closed (its pump stopped) and the disconnect watcher ends."""

    def __init__(self, events: AsyncIterator[bytes], watcher: DisconnectWatcher,
                 release: Callable[[], None] = lambda: None) -> None:
        super().__init__(events, media_type="text/event-stream; charset=utf-8",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._events = events
        self._watcher = watcher
        self._release = release  # the registry entry's close: also when the body never started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.stream_response(send)
        except OSError:  # the client went away mid-write
            pass
        finally:
            await self._events.aclose()  # type: ignore[attr-defined]
            self._watcher.close()
            self._release()
