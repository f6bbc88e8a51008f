"""Continuous batching in the engine process: many requests share one llama.cpp context.

One loop on the engine process's main thread runs steps: take the parent's messages, end cancelled or late
requests, admit waiting ones into free slots, run prefill chunks within a token budget, then one batched
decode step for every sequence. The runtime side is ``SeqRuntime``.

The reasoning: docs/engine.md, 'app/engine/local/scheduler.py'.
"""

from __future__ import annotations

import codecs
import logging
import queue
import time
from typing import Any, Callable, Optional, Protocol

from app.childhost import bug_text
from app.engine.chat.reasoning_budget import BudgetForcer
from app.engine.chat.thinking import AnswerPiece, ReasoningPiece
from app.engine.local.textstream import StopStreamer
from app.errors import Cancelled, HearthError
from app.protocol.types import GenerateRequest

log = logging.getLogger(__name__)

GATHER_QUIET_S = 0.004  # seconds without a new request that end an idle engine's wait for a burst
GATHER_MAX_S = 0.015  # the longest that wait lasts (the first request's TTFT grows by at most this)
# The wait is paid only while requests come in bursts: a lone request after a lone request starts at once (the
# wait was 4 ms of every single user's TTFT); one that a burst follows within GATHER_MAX_S turns it back on.


class Seq:
    """One admitted request in its slot (the runtime subclasses it with its own state).

    ``pending``: a sampled token not yet evaluated (the next decode step feeds it); ``prompt_done``: the
    prompt's last token was evaluated; ``finish``: the finish_reason once the answer ended. ``metrics``:
    the child-side metrics dict (prompt_tokens, cached_tokens, prefill_s, ... as ``Runtime`` fills it).

    Thinking: with a ``forcer`` (``reasoning_budget.BudgetForcer``, set by the runtime when the request may
    think) each sampled token's text goes through it first; thinking text is emitted apart (the fourth
    field of a ``delta`` event) and only answer text reaches the stop strings (the transcript template's
    blank-line stop would otherwise end thinking mid-paragraph). When the forcer ends thinking (budget,
    deadline, ``stop_thinking``) its text is tokenized by ``tokenize_insert`` into ``inserts``: tokens the
    next decode step evaluates after ``pending`` without sampling them. ``room``: tokens the slot's KV still
    has for the answer (sampled and inserted together; None: no limit but ``max_new``)."""

    def __init__(self, rid: int, request: GenerateRequest, slot: int, stop: tuple[str, ...] = ()) -> None:
        self.rid, self.request, self.slot = rid, request, slot
        self.emit: Callable[..., None] = lambda *payload: None
        self.pending: Optional[int] = None
        self.prompt_done = False
        self.finish: Optional[str] = None
        self.n_out = 0
        self.max_new = request.decoding.max_tokens or 1 << 30
        self.streamer = StopStreamer(tuple(request.decoding.stop) + tuple(stop))
        self.metrics: dict[str, Any] = {}
        self.info: dict[str, Any] = {}
        self.t_first: Optional[float] = None
        self.batch_peak = 1
        self.deadline_at: Optional[float] = None  # set by the scheduler on admission
        self.forcer: Optional[BudgetForcer] = None
        self.tokenize_insert: Callable[[str], list[int]] = lambda text: []
        self.inserts: list[int] = []
        self.n_inserted = 0
        self.room: Optional[int] = None
        self.reasoning: list[str] = []
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def stop_thinking(self) -> bool:
        """Ask thinking to end at the next token (``BudgetForcer.stop_thinking``); False without thinking."""
        return self.forcer.stop_thinking() if self.forcer is not None and self.finish is None else False

    def accept(self, token: int, is_eog: bool, piece: bytes, logprob: Any = None) -> None:
        """Take one sampled token: end on an end-of-generation token (not part of the answer), else emit its
        text (held back while it may begin a stop string; thinking text apart, see the class), then end on a
        stop string or ``max_new`` tokens; otherwise the token is ``pending`` for the next decode step."""
        self.n_out += 1
        if self.t_first is None:
            self.t_first = time.perf_counter()
        if is_eog:
            self.n_out -= 1
            self.finish = "stop"
            return
        lps = (logprob,) if logprob is not None else ()
        if self.forcer is None:
            text, stopped = self.streamer.feed(piece)
            # One event per token (even when its text is held back) so that ITL is measured per token.
            self.emit("delta", text, (token,), lps)
        else:
            step = self.forcer.step(self._text.decode(piece), time.perf_counter())
            text, stopped, thought = self._pieces(step.pieces)
            self.emit("delta", text, (token,), lps, thought)
            if step.insert and not stopped:
                self.inserts = list(self.tokenize_insert(step.insert))
                self.n_inserted += len(self.inserts)
        if stopped:
            self.finish = "stop"
        elif self.n_out >= self.max_new or (self.room is not None and self.n_out + self.n_inserted >= self.room):
            self.finish = "length"
        else:
            self.pending = token

    def _pieces(self, pieces: Any) -> tuple[str, bool, str]:
        """Answer pieces through the stop strings, thinking pieces kept: ``(answer text, stopped, thinking)``."""
        thought = "".join(p.text for p in pieces if isinstance(p, ReasoningPiece))
        answer = "".join(p.text for p in pieces if isinstance(p, AnswerPiece))
        if thought:
            self.reasoning.append(thought)
        if not answer:
            return "", self.streamer.stopped, thought
        text, stopped = self.streamer.feed(answer.encode("utf-8"))
        return text, stopped, thought

    def result(self) -> tuple[str, str, dict, dict]:
        """``(finish_reason, text, child_metrics, info)`` of an ended request (flushes held-back text). With
        thinking, ``info["reasoning"]`` is the thinking text and the metrics carry the forcer's counts; an answer
        ended by a stop string has it in ``info["stop_sequence"]``."""
        if self.forcer is not None:
            rest = self._text.decode(b"", final=True)
            last = self.forcer.splitter.feed(rest) if rest else []  # an incomplete character: U+FFFD
            pieces = tuple(last) + tuple(self.forcer.finish())
            text, _stopped, thought = self._pieces(pieces)
            if text or thought:
                self.emit("delta", text, (), (), thought)
            rm = self.forcer.metrics()
            self.metrics.update(reasoning_tokens=rm.reasoning_tokens, answer_tokens=rm.answer_tokens,
                                thinking_s=rm.thinking_s, reasoning_forced=rm.forced,
                                reasoning_stopped_by=rm.stopped_by, reasoning_unclosed=rm.unclosed,
                                reasoning_budget=self.forcer.budget_tokens)
            self.info["reasoning"] = "".join(self.reasoning)
        tail = self.streamer.flush()
        if tail:
            self.emit("delta", tail, (), ())
        if self.streamer.matched is not None:
            self.info["stop_sequence"] = self.streamer.matched
        self.metrics["completion_tokens"] = self.n_out
        self.metrics["decode_s"] = time.perf_counter() - self.t_first if self.t_first else 0.0
        self.metrics["batch_peak"] = self.batch_peak
        self.metrics["slot"] = self.slot
        return self.finish or "length", self.streamer.text, self.metrics, self.info


class SeqRuntime(Protocol):
    """What the scheduler drives (``app.engine.local.runtime.Runtime``, or a scripted one for tests).

    ``n_slots``: sequences that can run at once. ``begin`` renders and checks a request, picks one of
    ``free`` slots (the one whose live KV gives back the longest prefix), restores or reuses its prefix and
    returns its ``Seq`` (raises ``HearthError`` for a bad request). ``prefill_step`` evaluates the next chunk
    of each of ``seqs``' prompts (within the step's budget); a sequence whose prompt is then done either has
    its first token sampled (``Seq.accept``) or its last prompt token ``pending`` for the next decode step.
    ``chunk_tokens`` says how many tokens that step evaluates. ``decode_step`` evaluates every ``pending``
    token of ``seqs`` in one batch and samples the next ones.
    ``end`` is called once per admitted sequence when it leaves its slot (the KV stays for reuse unless
    ``clean`` is False: the step that ended it failed)."""

    n_slots: int
    prefill_budget: int  # prompt tokens prefilled per step at most (the first chunk always runs)

    def ready_info(self) -> dict: ...

    def chunk_tokens(self, seq: Seq) -> int: ...  # tokens the next prefill_step of seq evaluates

    def begin(self, rid: int, request: GenerateRequest, free: list[int]) -> Seq: ...

    def prefill_step(self, seqs: list[Seq]) -> None: ...

    def decode_step(self, seqs: list[Seq]) -> None: ...

    def end(self, seq: Seq, clean: bool) -> None: ...

    def cache_stats(self) -> dict: ...

    # Optional: ``idle_step() -> bool`` runs one short step of idle work (True while more remains); the
    # scheduler calls it only while no request waits or runs (``Runtime.idle_step``). Optional too:
    # ``idle_delay() -> float``, the seconds until the next step is due (it then waits on its inbox).


class _Waiting:
    __slots__ = ("rid", "request", "t_arrival", "order")

    def __init__(self, rid: int, request: GenerateRequest, order: int) -> None:
        self.rid, self.request, self.order = rid, request, order
        self.t_arrival = time.perf_counter()

    def deadline_at(self) -> Optional[float]:
        """``time.perf_counter`` seconds at which the request's deadline passes (None: no deadline)."""
        d = self.request.deadline_s
        return None if d is None else self.t_arrival + d


class Scheduler:
    """The engine process's serving loop over ``runtime`` (docs/engine.md, 'app/engine/local/scheduler.py').
    ``send`` writes one message to the parent (``process.MuxHandler.serve``)."""

    def __init__(self, runtime: SeqRuntime, send: Callable[[tuple], bool]) -> None:
        self.rt = runtime
        self._send = send
        self._events: list[tuple] = []  # (rid, *payload) emitted during the current runtime step
        self.waiting: list[_Waiting] = []
        self.active: dict[int, Seq] = {}  # rid -> seq, in admission order
        self.cancels: set[int] = set()
        self.stop_early: set[int] = set()  # stop_thinking asked before admission
        self.free = list(range(runtime.n_slots))
        self._order = 0
        self._idle_work = False  # the runtime may have idle work (set when a request leaves)
        self._bursty = True  # requests came in a burst when the engine last woke: wait for the rest of one
        self._woke_at = float("-inf")  # when a lone request last woke the engine without that wait

    # -- the loop -------------------------------------------------------------------------------------
    def run(self, inbox: "queue.Queue[tuple]") -> None:
        """Serve until ``("close",)``. While no request waits or runs, the runtime's idle work
        (``SeqRuntime.idle_step``: the last answer laid out for the next turn) runs one short step at a time
        between looks at the inbox; work the runtime defers (``idle_delay``) waits on the inbox meanwhile."""
        while True:
            idle = not self.active and not self.waiting
            try:
                if idle and not self._idle_work:
                    msg = inbox.get()
                elif idle and (delay := self._idle_delay()) > 0:
                    msg = inbox.get(timeout=delay)
                else:
                    msg = inbox.get_nowait()
                while True:
                    if not self._handle(msg):
                        return
                    msg = inbox.get_nowait()
            except queue.Empty:
                pass
            if idle and self.waiting and not self._gather(inbox):
                return
            if not self.active and not self.waiting:
                if self._idle_work:
                    self._idle_step()
                continue
            self._expire()
            self._admit()
            self._step()

    def _idle_step(self) -> None:
        """One step of the runtime's idle work; a runtime without any (a scripted one) has none."""
        step = getattr(self.rt, "idle_step", None)
        try:
            self._idle_work = bool(step()) if step is not None else False
        except Exception:  # noqa: BLE001 - idle work must never end the engine
            log.exception("idle work failed")
            self._idle_work = False

    def _idle_delay(self) -> float:
        """Seconds until the runtime's next idle step is due (``idle_delay``; 0 for a runtime without it)."""
        delay = getattr(self.rt, "idle_delay", None)
        return float(delay()) if delay is not None else 0.0

    def _gather(self, inbox: "queue.Queue[tuple]") -> bool:
        """The idle engine just got a request: take the messages that follow it within ``GATHER_QUIET_S`` of
        each other (at most ``GATHER_MAX_S`` in all, and only while a slot would still be free). Not when the
        last wake was a lone request too and only one waits (``_bursty``). False when ``("close",)`` came."""
        if not self._bursty and len(self.waiting) == 1:
            self._woke_at = time.perf_counter()
            return True
        end = time.perf_counter() + GATHER_MAX_S
        try:
            while len(self.waiting) < len(self.free):
                left = end - time.perf_counter()
                if left <= 0:
                    return True
                try:
                    msg = inbox.get(timeout=min(GATHER_QUIET_S, left))
                except queue.Empty:
                    return True
                if not self._handle(msg):
                    return False
            return True
        finally:
            self._bursty = len(self.waiting) > 1

    def _handle(self, msg: tuple) -> bool:
        kind = msg[0]
        if kind == "close":
            return False
        if kind == "cancel":
            self._cancel(msg[1])
        elif kind == "stop_thinking":
            self._stop_thinking(msg[1])
        elif kind == "submit":
            rid, op, args = msg[1], msg[2], msg[3:]
            if op == "generate":
                if time.perf_counter() - self._woke_at <= GATHER_MAX_S:
                    self._bursty = True  # a burst followed a lone request that did not wait for it
                self._order += 1
                self.waiting.append(_Waiting(rid, args[0], self._order))
            elif op == "cache_stats":
                self._answer(rid, lambda: self.rt.cache_stats())
            else:
                self.send(("error", rid, HearthError(f"unknown engine command {op!r}")))
        return True

    def _answer(self, rid: int, fn: Callable[[], Any]) -> None:
        try:
            self.send(("ok", rid, fn()))
        except HearthError as exc:
            self.send(("error", rid, exc))
        except Exception as exc:  # noqa: BLE001 - a bug in one request must not end the engine
            self.send(("bug", rid, bug_text(exc)))

    def _cancel(self, rid: int) -> None:
        self.stop_early.discard(rid)
        for w in self.waiting:
            if w.rid == rid:
                self.waiting.remove(w)
                self.send(("error", rid, Cancelled("cancelled before it started")))
                return
        if rid in self.active:
            self.cancels.add(rid)

    def _stop_thinking(self, rid: int) -> None:
        """End ``rid``'s thinking at its next token (a waiting request: as soon as it is admitted)."""
        seq = self.active.get(rid)
        if seq is not None:
            seq.stop_thinking()
        elif any(w.rid == rid for w in self.waiting):
            self.stop_early.add(rid)

    def _expire(self) -> None:
        now = time.perf_counter()
        for rid in list(self.cancels):
            seq = self.active.get(rid)
            self.cancels.discard(rid)
            if seq is not None:
                stage = "decode" if seq.prompt_done else "prefill"
                self._leave(seq, Cancelled(f"cancelled during {stage}"))
        for w in [w for w in self.waiting if _passed(w.deadline_at(), now)]:
            self.waiting.remove(w)
            self.send(("ok", w.rid, ("length", "", {"completion_tokens": 0}, {"stopped_by": "deadline"})))
        for seq in [s for s in self.active.values() if _passed(s.deadline_at, now)]:
            seq.finish = seq.finish or "length"
            seq.info["stopped_by"] = "deadline"
            self._leave(seq)

    def _admit(self) -> None:
        while self.free and self.waiting:
            w = min(self.waiting, key=lambda x: (-x.request.priority, x.order))
            self.waiting.remove(w)
            try:
                seq = self.rt.begin(w.rid, w.request, list(self.free))
            except HearthError as exc:
                self.send(("error", w.rid, exc))
                continue
            except Exception as exc:  # noqa: BLE001 - a bug in one request must not end the engine
                self.send(("bug", w.rid, bug_text(exc)))
                continue
            self.free.remove(seq.slot)
            seq.emit = self._emitter(w.rid)
            seq.deadline_at = w.deadline_at()
            self.active[w.rid] = seq
            seq.emit("admitted", seq.slot, seq.forcer is not None)
            if w.rid in self.stop_early:
                self.stop_early.discard(w.rid)
                seq.stop_thinking()
        self._flush()

    def _emitter(self, rid: int) -> Callable[..., None]:
        def emit(*payload: Any) -> None:
            self._events.append((rid, *payload))
        return emit

    def send(self, msg: tuple) -> None:
        """Send a reply, after the events emitted before it."""
        self._flush()
        self._send(msg)

    def _flush(self) -> None:
        """One message for every event of a runtime step (``("events", [(rid, *payload), ...])``): a decode
        step of N sequences costs one pickle and one pipe write instead of N (measured on 2 cores, the
        serving process's per-token work competes with llama.cpp's threads)."""
        if self._events:
            events, self._events = self._events, []
            self._send(("events", events))

    def _step(self) -> None:
        """Prefill chunks first, then one decode step for everything pending: a prompt whose last chunk just
        went in has its last token evaluated (and its first answer token sampled) in this same step."""
        # Highest priority first; among equals, prompts that finish in this step's chunk before longer ones
        # (a long prompt admitted amid a burst would otherwise spend the budget the burst's short prompts
        # share one llama_decode in); stable: admission order among the rest.
        C = self.rt.prefill_budget
        prefilling = sorted((s for s in self.active.values() if not s.prompt_done and s.finish is None),
                            key=lambda s: (-s.request.priority, self.rt.chunk_tokens(s) >= C))
        budget, chosen = self.rt.prefill_budget, []
        for seq in prefilling:
            cost = self.rt.chunk_tokens(seq)
            if chosen and cost > budget:
                break  # the first chunk always runs; the others only within the step's budget
            budget -= cost
            chosen.append(seq)
        if chosen:
            self._guard(chosen, lambda: self.rt.prefill_step(chosen))
            self._flush()
        decoding = [s for s in self.active.values() if s.pending is not None and s.finish is None]
        if decoding:
            n = len(decoding)
            for s in decoding:
                s.batch_peak = max(s.batch_peak, n)
            self._guard(decoding, lambda: self.rt.decode_step(decoding))
            self._flush()
        for seq in list(self.active.values()):
            if seq.finish is not None:
                self._leave(seq)

    def _guard(self, seqs: list[Seq], fn: Callable[[], None]) -> None:
        """Run one runtime step; an error ends the requests it concerned (the others keep running)."""
        try:
            fn()
        except HearthError as exc:
            for s in seqs:
                self._leave(s, exc)
        except Exception as exc:  # noqa: BLE001 - a bug in one step must not end the engine
            text = bug_text(exc)
            for s in seqs:
                self._leave(s, bug=text)

    def _leave(self, seq: Seq, error: Optional[BaseException] = None, bug: str = "") -> None:
        """End ``seq``: its reply (result, error or bug) goes out and its slot is free for the next step."""
        if self.active.pop(seq.rid, None) is None:
            return
        try:
            self.rt.end(seq, clean=not bug and (error is None or isinstance(error, Cancelled)))
        except Exception:  # noqa: BLE001 - bookkeeping must not hide the request's own reply
            log.exception("ending a sequence failed")
        self.free.append(seq.slot)
        self._idle_work = getattr(self.rt, "idle_step", None) is not None
        if bug:
            self.send(("bug", seq.rid, bug))
        elif error is not None:
            self.send(("error", seq.rid, error))
        else:
            self._answer(seq.rid, seq.result)


def _passed(at: Optional[float], now: float) -> bool:
    return at is not None and now >= at
