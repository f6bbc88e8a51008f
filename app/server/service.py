"""Run a ``Plan`` on the engine and answer it, streamed (SSE) or whole.

- Errors raised before the first event (bad parameters, context overflow, a full queue, a grammar llama.cpp
  refuses) become HTTP errors: a stream's headers are sent only once its first event is in, so a client
  gets a real 400/429 rather than a 200 with an error inside. Later errors become an SSE ``error`` event.
- max_tokens larger than the context left is clamped: the engine refuses it before prefill with
  ``ContextLengthExceeded(prompt_tokens, n_ctx, max_tokens)``, and the request is re-queued once with
  ``max_tokens = n_ctx - prompt_tokens`` (finish_reason "length" if it gets there; ``hearth.context``
  says so). A prompt that alone fills the context stays a 400 with both counts.
- A client that disconnects cancels its generation (``DisconnectWatcher``); n > 1 choices run one after
  another, each queued behind whatever other clients sent meanwhile and after the desktop window's turns
  (the engine runs ``n_parallel`` at once and admits the window's priority 1 before the port's 0).
- A request with tools reads its answer through ``app.engine.tool_stream.ToolStream`` with the loaded
  model's ``ToolFormat`` (``engine.tool_format()``), streamed or whole: the same reader, so both agree.
  Streams send text as it comes and a call's ``delta.tool_calls`` once it has ended and validated; logprob
  entries held back with a call go out on the next content chunk or the choice's last one. The reader sees
  answer text only (``Delta.text``); thinking (``Delta.reasoning``) goes out as ``delta.reasoning_content``
  chunks of its own, before the answer text of the same event.
- Every answer is in the registry of running requests (``app.server.running``) under its response id from
  before its first generation is queued until it ends, so ``stop_thinking`` reaches it.
- ``hearth.self_consistency`` (whole answers only): ``app.engine.self_consistency.SelfConsistencyRun`` runs
  the samples on the thread pool; its samples' generations are recorded in the registry as the run starts
  them (``_Recording``), a disconnect cancels the run, and the voted sample is answered with the vote.
- Logprobs name tokens by the bytes of their text, from ``engine.token_piece_bytes`` (the engine's
  vocabulary lane: no turn in the queue, so it never waits for the generation it describes). A lookup may
  cross to the engine process, so logprob entries are formatted off the event loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Callable, Optional

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.engine.self_consistency import SelfConsistencyRun
from app.engine.tool_parser import ArgsPiece, CallStart, TextPiece
from app.engine.tool_stream import ToolStream
from app.engine.types import Delta, Done, GenerateRequest
from app.errors import Cancelled, ContextLengthExceeded, InvalidRequest
from app.server import format as fmt
from app.server.convert import Plan
from app.server.errors import from_exception
from app.server.metrics import ServerMetrics
from app.server.pump import DisconnectWatcher, Pump
from app.server.running import Entry, Running

log = logging.getLogger(__name__)


@dataclass
class _Call:
    """What every generation of one HTTP request shares."""

    engine: Any
    watcher: DisconnectWatcher
    entry: Entry
    tool_fmt: Any = None


class Service:
    """Runs plans on an engine and answers them; ``running`` is the registry of answers in progress."""

    def __init__(self, metrics: ServerMetrics, running: Optional[Running] = None) -> None:
        self.metrics = metrics
        self.running = running or Running()

    async def respond(self, plan: Plan, engine: Any, request: Request):
        """The answer to ``plan``: a ``JSONResponse`` or an ``SSEResponse``."""
        piece: fmt.PieceFn | None = engine.token_piece_bytes if plan.logprobs is not None else None
        frame = fmt.Frame.new(plan)
        call = _Call(engine, DisconnectWatcher(request.receive, self.metrics.cancelled_by_client),
                     self.running.open(frame.id))
        try:
            call.tool_fmt = await run_in_threadpool(engine.tool_format) if plan.requests[0].tools else None
            if plan.stream:
                first = await self._start(call, plan.requests[0])
                return SSEResponse(self._events(frame, call, first, piece), call.watcher, call.entry.close)
            if plan.consistency is not None:
                choices = [await self._consistent(call, req, plan.consistency) for req in plan.requests]
            else:
                choices = [await self._collect(call, req) for req in plan.requests]
        except BaseException:
            call.watcher.close()
            call.entry.close()
            raise
        call.watcher.close()
        call.entry.close()
        if piece is None:
            return JSONResponse(fmt.response(frame, choices, piece))
        return JSONResponse(await run_in_threadpool(fmt.response, frame, choices, piece))

    async def _start(self, call: _Call, req: GenerateRequest):
        """Queue ``req``; return ``(pump, first_event, clamped_to)`` once the engine produced something."""
        clamped = None
        while True:
            pump = Pump(call.entry.add(call.engine.generate(req)))
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

    async def _events(self, frame: fmt.Frame, call: _Call, first: tuple,
                      piece: fmt.PieceFn | None) -> AsyncIterator[bytes]:
        plan = frame.plan
        choices: list[fmt.Choice] = []
        pump = first[0]
        try:
            for i, req in enumerate(plan.requests):
                pump, ev, clamped = first if i == 0 else await self._start(call, req)
                if plan.kind == "chat":
                    yield fmt.chunk(frame, i, role=True)
                reader = ToolStream.for_request(req, call.tool_fmt) if req.tools else None
                out = _ChoiceStream(frame, i, piece, reader)
                while isinstance(ev, Delta):
                    for data in await out.delta(ev):
                        yield data
                    ev = await pump.next()
                choice = fmt.Choice(ev, [], clamped, req.decoding.max_tokens)
                for data in await out.done(choice):
                    yield data
                choices.append(choice)
                self.metrics.generation(ev)
            call.entry.close()  # before [DONE]: a client that read the end finds the id gone (404)
            if plan.include_usage:
                yield fmt.usage_chunk(frame, choices)
            yield fmt.DONE_EVENT
        except Exception as exc:  # noqa: BLE001 - after the headers, errors go in-band
            if call.watcher.gone and isinstance(exc, Cancelled):
                return
            err = from_exception(exc)
            self.metrics.error(err.type, err.code)
            yield fmt.error_event({"message": err.message, "type": err.type, "param": err.param,
                                   "code": err.code})
        finally:
            pump.stop()  # no-op for a finished generation; cancels one left behind by a closed stream
            call.entry.close()


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

    def __init__(self, engine: Any, entry: Entry) -> None:
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


class _ChoiceStream:
    """The chunks of one streamed choice: each ``Delta``'s text (read for tool calls when ``reader`` is
    given), its logprob entries, and the last chunk with the finish reason and the ``hearth`` object."""

    def __init__(self, frame: fmt.Frame, index: int, piece: fmt.PieceFn | None, reader: ToolStream | None) -> None:
        self.frame, self.index, self.piece, self.reader = frame, index, piece, reader
        self.gate = LogprobGate()
        self.entries: list[Any] = []  # logprob entries waiting for the text they go out with
        self.offset = 0

    async def delta(self, ev: Delta) -> list[bytes]:
        """The chunks of one event: its thinking text, then its answer text (read for calls)."""
        out = [fmt.chunk(self.frame, self.index, reasoning=ev.reasoning)] if ev.reasoning else []
        self.entries.extend(self.gate.feed(ev))
        if self.reader is None:
            return out + await self._pieces([TextPiece(ev.text)] if ev.text else [])
        return out + await self._pieces(self.reader.feed(ev.text))

    async def done(self, choice: fmt.Choice) -> list[bytes]:
        out: list[bytes] = []
        if self.reader is not None:
            pieces, choice.tools = self.reader.finish(choice.done.finish_reason)
            out = await self._pieces(pieces)
        lp = await self._logprobs()
        plan = self.frame.plan
        out.append(fmt.chunk(self.frame, self.index, finish=choice.finish_reason, lp=lp,
                             hearth=fmt.choice_hearth(plan, choice)))
        return out

    async def _pieces(self, pieces: list) -> list[bytes]:
        out = []
        for p in pieces:
            if isinstance(p, TextPiece):
                lp = await self._logprobs()
                out.append(fmt.chunk(self.frame, self.index, text=p.text, lp=lp))
                self.offset += len(p.text)
            elif isinstance(p, (CallStart, ArgsPiece)):
                out.append(fmt.chunk(self.frame, self.index, tool_calls=[fmt.tool_call_delta(p)]))
        return out

    async def _logprobs(self) -> dict | None:
        if self.piece is None or not self.entries:
            return None
        entries, self.entries = self.entries, []
        return await run_in_threadpool(fmt.logprobs, self.frame.plan, entries, self.piece, self.offset)


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
