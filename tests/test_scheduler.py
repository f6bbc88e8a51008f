"""The engine process's scheduler (app/engine/local/scheduler.py) over a scripted ``SeqRuntime``: admission by
priority, one batched decode step for every active sequence, prefill chunks within the step's budget,
cancel and deadline per request, a failing step ending only its own requests."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

from app.engine.local.scheduler import Scheduler, Seq
from app.errors import Cancelled, HearthError
from app.protocol.types import DecodingParams, GenerateRequest


class Scripted:
    """Prompts of ``chunks`` prefill chunks of ``chunk`` tokens; every answer is ``n`` tokens "x"."""

    def __init__(self, n_slots: int, chunks: int = 1, chunk: int = 4, budget: int = 8) -> None:
        self.n_slots, self.chunks, self.chunk, self.prefill_budget = n_slots, chunks, chunk, budget
        self.steps: list[tuple] = []  # ("decode", rids) | ("prefill", rid)
        self.fail_decode_of: set[int] = set()

    def ready_info(self) -> dict:
        return {}

    def begin(self, rid, request, free):
        seq = Seq(rid, request, free[0])
        seq.left = self.chunks
        return seq

    def chunk_tokens(self, seq):
        return self.chunk

    def prefill_step(self, seqs):
        for seq in seqs:
            self.steps.append(("prefill", seq.rid))
            seq.left -= 1
            if seq.left == 0:
                seq.prompt_done = True
                seq.accept(7, False, b"x")

    def decode_step(self, seqs):
        self.steps.append(("decode", tuple(s.rid for s in seqs)))
        if any(s.rid in self.fail_decode_of for s in seqs):
            raise HearthError("scripted decode failure")
        for s in seqs:
            s.pending = None
            s.accept(7, False, b"x")

    def end(self, seq, clean):
        pass

    def cache_stats(self):
        return {"lookups": 0}


def req(n=3, priority=0, deadline_s=None):
    return GenerateRequest(prompt="p", decoding=DecodingParams.make(max_tokens=n), priority=priority,
                           deadline_s=deadline_s)


def serve(rt, msgs):
    sent: list[tuple] = []
    inbox: queue.Queue = queue.Queue()
    for m in msgs:
        inbox.put(m)
    inbox.put(("close",))
    def send(m):
        if m[0] == "events":  # one runtime step's events, batched
            sent.extend(("event", *ev) for ev in m[1])
        else:
            sent.append(m)
        return True

    sched = Scheduler(rt, send)
    # run until every request is answered, then close
    orig_get = inbox.get_nowait

    def get_nowait():
        if sched.active or sched.waiting:
            if inbox.qsize() == 1:  # only the close is left: keep stepping
                raise queue.Empty
        return orig_get()

    orig_blocking = inbox.get

    def get(block=True, timeout=None):
        if timeout is not None:  # the idle engine's wait for the rest of a burst (Scheduler._gather)
            return get_nowait()
        return orig_blocking(block, timeout)

    inbox.get_nowait = get_nowait
    inbox.get = get
    sched.run(inbox)
    return sent


def collector(sent: list) -> Callable[[tuple], bool]:
    """A scheduler ``send`` that appends replies to ``sent`` and unpacks batched events into it."""
    def send(m):
        sent.extend(("event", *ev) for ev in m[1]) if m[0] == "events" else sent.append(m)
        return True
    return send


def replies(sent):
    return {m[1]: m for m in sent if m[0] in ("ok", "error", "bug")}


def test_decodes_are_batched_and_requests_join_between_steps():
    rt = Scripted(n_slots=3)
    sent = serve(rt, [("submit", i, "generate", req(3)) for i in (1, 2, 3)])
    r = replies(sent)
    assert all(r[i][0] == "ok" and r[i][2][1] == "xxx" and r[i][2][0] == "length" for i in (1, 2, 3))
    decodes = [s[1] for s in rt.steps if s[0] == "decode"]
    assert (1, 2, 3) in decodes  # one llama_decode for the three
    assert max(r[i][2][2]["batch_peak"] for i in (1, 2, 3)) == 3
    admitted = [m for m in sent if m[0] == "event" and m[2] == "admitted"]
    assert [m[3] for m in admitted] == [0, 1, 2]  # slots


def test_priority_first_then_arrival_order():
    rt = Scripted(n_slots=1)
    sent = serve(rt, [("submit", 1, "generate", req(2)), ("submit", 2, "generate", req(2)),
                      ("submit", 3, "generate", req(2, priority=1))])
    order = [m[1] for m in sent if m[0] == "event" and m[2] == "admitted"]
    assert order == [3, 1, 2]


def test_prefill_chunks_run_within_the_step_budget_and_interleave_with_decodes():
    rt = Scripted(n_slots=3, chunks=3, chunk=4, budget=8)
    serve(rt, [("submit", i, "generate", req(10)) for i in (1, 2, 3)])
    first_step = rt.steps[:2]
    assert first_step == [("prefill", 1), ("prefill", 2)]  # 8-token budget: two 4-token chunks per step
    assert rt.steps[2:4] == [("prefill", 1), ("prefill", 2)]  # first admitted first (FCFS)
    third = [i for i, s in enumerate(rt.steps) if s == ("prefill", 3)]
    assert len(third) == 3 and any(rt.steps[i][0] == "decode" for i in range(third[0], third[-1]))


def test_cancel_waiting_and_running_and_a_failed_step_end_only_their_requests():
    rt = Scripted(n_slots=2)
    rt.fail_decode_of = {2}
    sent = serve(rt, [("submit", 1, "generate", req(50)), ("submit", 2, "generate", req(5)),
                      ("submit", 3, "generate", req(2)), ("cancel", 3), ("cancel", 1),
                      ("submit", 4, "cache_stats")])
    r = replies(sent)
    assert r[3][0] == "error" and isinstance(r[3][2], Cancelled) and "before it started" in str(r[3][2])
    assert r[1][0] == "error" and isinstance(r[1][2], Cancelled)
    assert r[2][0] == "error" and "scripted decode failure" in str(r[2][2])
    assert r[4] == ("ok", 4, {"lookups": 0})


def test_deadline_returns_the_answer_so_far():
    rt = Scripted(n_slots=1)
    sent = serve(rt, [("submit", 1, "generate", req(10**6, deadline_s=0.05)),
                      ("submit", 2, "generate", req(3, deadline_s=0.01))])
    r = replies(sent)
    finish, text, metrics, info = r[1][2]
    assert finish == "length" and info["stopped_by"] == "deadline" and 0 < len(text) < 10**6
    assert r[2][2][0] == "length" and r[2][2][3] == {"stopped_by": "deadline"}  # expired while it waited


def test_a_burst_reaching_an_idle_engine_is_admitted_together():
    """Requests that reach an idle engine a few ms apart are prefilled in one step (``Scheduler._gather``);
    one that comes after the quiet gap waits for the next step, as before."""
    import threading

    from app.engine.local import scheduler as sch
    rt = Scripted(n_slots=4, budget=16)
    inbox: queue.Queue = queue.Queue()
    sent: list[tuple] = []
    send = collector(sent)

    def feed():
        for rid in (1, 2, 3):
            inbox.put(("submit", rid, "generate", req(2)))
            time.sleep(sch.GATHER_QUIET_S / 4)
        time.sleep(sch.GATHER_MAX_S * 4)
        inbox.put(("submit", 4, "generate", req(2)))
        time.sleep(0.2)
        inbox.put(("close",))

    t = threading.Thread(target=feed)
    t.start()
    Scheduler(rt, send).run(inbox)
    t.join()
    first_decode = next(i for i, s in enumerate(rt.steps) if s[0] == "decode")
    assert rt.steps[:first_decode] == [("prefill", 1), ("prefill", 2), ("prefill", 3)]
    assert rt.steps[first_decode][1] == (1, 2, 3) and ("prefill", 4) in rt.steps
    assert all(m[0] == "ok" for m in replies(sent).values()) and len(replies(sent)) == 4


def test_the_burst_wait_is_paid_only_while_requests_come_in_bursts():
    """The idle engine's wait for the rest of a burst (``Scheduler._gather``) is skipped for a lone request that
    follows a lone request; a request that follows a lone one within ``GATHER_MAX_S`` turns it back on."""
    import threading

    waits = []

    class Inbox(queue.Queue):
        def get(self, block=True, timeout=None):
            if timeout is not None:
                waits.append(timeout)
            return super().get(block, timeout)

    rt = Scripted(n_slots=4)
    inbox, sent = Inbox(), []
    counts = {}

    def answered(*rids):
        deadline = time.monotonic() + 10
        while not all(r in replies(sent) for r in rids) and time.monotonic() < deadline:
            time.sleep(0.002)

    def feed():
        for rid in (1, 2):  # a fresh engine waits for a burst; the second lone request does not
            inbox.put(("submit", rid, "generate", req(2)))
            answered(rid)
            counts[rid] = len(waits)
        inbox.put(("submit", 3, "generate", req(2)))  # a burst after a lone request: no wait for it ...
        inbox.put(("submit", 4, "generate", req(2)))
        answered(3, 4)
        counts[4] = len(waits)
        inbox.put(("submit", 5, "generate", req(2)))  # ... but the next request waits again
        answered(5)
        counts[5] = len(waits)
        inbox.put(("close",))

    t = threading.Thread(target=feed)
    t.start()
    Scheduler(rt, collector(sent)).run(inbox)
    t.join()
    assert counts[1] >= 1 and counts[2] == counts[1]
    assert counts[5] > counts[4]
    assert all(m[0] == "ok" for m in replies(sent).values()) and len(replies(sent)) == 5


def test_runs_of_consecutive_slots():
    """A decode batch is split into one llama.cpp ubatch per run of consecutive sequence ids: the slot
    choice minimises the runs (app/engine/local/runtime.py)."""
    from app.engine.local.runtime import _runs

    assert [_runs(s) for s in (set(), {2}, {0, 1, 2, 3}, {0, 1, 3}, {0, 2, 4})] == [0, 1, 1, 2, 3]


def test_idle_work_runs_only_while_nothing_waits_or_runs_and_yields_to_a_new_request():
    """``SeqRuntime.idle_step`` (the last answer laid out for the next turn) runs after a request leaves,
    one step per loop turn while the inbox is empty; a request that arrives meanwhile is admitted at the next
    loop turn, and idle work resumes after it."""
    import threading

    class WithIdle(Scripted):
        def __init__(self):
            super().__init__(n_slots=1)
            self.idle_left = 0

        def end(self, seq, clean):
            self.idle_left = 50

        def idle_step(self):
            self.steps.append(("idle",))
            self.idle_left -= 1
            time.sleep(0.002)
            return self.idle_left > 0

    rt = WithIdle()
    inbox: queue.Queue = queue.Queue()
    sent: list[tuple] = []
    send = collector(sent)

    def feed():
        inbox.put(("submit", 1, "generate", req(2)))
        while not any(s == ("idle",) for s in rt.steps):
            time.sleep(0.001)
        inbox.put(("submit", 2, "generate", req(2)))
        while len(replies(sent)) < 2:
            time.sleep(0.001)
        time.sleep(0.3)
        inbox.put(("close",))

    t = threading.Thread(target=feed)
    t.start()
    Scheduler(rt, send).run(inbox)
    t.join()
    kinds = [s[0] for s in rt.steps]
    first_idle = kinds.index("idle")
    second = rt.steps.index(("prefill", 2))
    assert "decode" not in kinds[first_idle:second]  # nothing else ran between
    assert all(k == "idle" for k in kinds[first_idle:second]) and second - first_idle < 50  # it yielded
    assert kinds[-1] == "idle" and kinds.count("idle") >= 50  # resumed after request 2, until done
    assert kinds[:first_idle].count("decode") >= 1
    assert all(m[0] == "ok" for m in replies(sent).values())


def test_idle_work_the_runtime_defers_waits_on_the_inbox():
    """A runtime whose idle work is not due yet (``idle_delay`` > 0: the disk cache's save grace) makes the idle
    scheduler wait on its inbox, not spin: a request that follows within the delay (an agent's next step) is
    admitted before the idle work, and the work runs once it is due."""
    import threading

    grace = 0.3

    class Deferring(Scripted):
        def __init__(self):
            super().__init__(n_slots=1)
            self.left_at = 0.0
            self.idle_at: list[float] = []
            self.delays = 0

        def end(self, seq, clean):
            self.left_at = time.perf_counter()

        def idle_delay(self):
            self.delays += 1
            return max(0.0, self.left_at + grace - time.perf_counter())

        def idle_step(self):
            if self.idle_delay() > 0:
                return True
            self.steps.append(("idle",))
            self.idle_at.append(time.perf_counter())
            return False

    rt = Deferring()
    inbox: queue.Queue = queue.Queue()
    sent: list[tuple] = []

    def feed():
        for rid in (1, 2, 3):
            inbox.put(("submit", rid, "generate", req(2)))
            while rid not in replies(sent):
                time.sleep(0.001)
        time.sleep(grace + 0.3)
        inbox.put(("close",))

    t = threading.Thread(target=feed)
    t.start()
    Scheduler(rt, collector(sent)).run(inbox)
    t.join()
    kinds = [s[0] for s in rt.steps]
    assert kinds.count("idle") == 1 and kinds[-1] == "idle"  # not between the requests: once, after the last
    assert rt.idle_at[0] - rt.left_at >= grace * 0.95
    assert rt.delays < 20  # it waited on the inbox, it did not spin


def test_a_runtime_without_idle_work_blocks_on_the_inbox():
    rt = Scripted(n_slots=1)
    sent = serve(rt, [("submit", 1, "generate", req(2))])
    assert replies(sent)[1][0] == "ok" and not any(s[0] == "idle" for s in rt.steps)
