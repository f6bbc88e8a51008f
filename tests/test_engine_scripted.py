"""The real ``Engine`` (FIFO, streams, cancel, stats, the vocabulary lane, crash and restart) over the scripted
runtime of ``tests/fakes.py``, through the public ``runtime=`` seam: no model, no child process."""

from __future__ import annotations

import threading
import time

import pytest
from fakes import FakeEngine

from app.errors import Cancelled, ContextLengthExceeded, EngineCrashed, QueueFull
from app.protocol.types import ChatMessage, DecodingParams, Delta, Done, GenerateRequest


def chat(text: str, **kw) -> GenerateRequest:
    return GenerateRequest(messages=(ChatMessage("user", text),), decoding=DecodingParams.make(**kw))


def test_stream_done_metrics_and_stats():
    eng = FakeEngine(reply=lambda r: "abc")
    events = list(eng.generate(chat("hi")))
    assert [e.text for e in events if isinstance(e, Delta)] == ["a", "b", "c"]
    done = events[-1]
    assert isinstance(done, Done) and done.text == "abc" and done.finish_reason == "stop"
    assert done.info == {"template": "fake", "model": "fake-model.gguf", "n_ctx": 512}
    assert done.metrics.completion_tokens == 3 and done.metrics.prompt_tokens == len("user: hi\nassistant:") + 1
    assert eng.stats.completed == 1 and eng.stats.completion_tokens == 3
    assert eng.info["template"] == "fake" and eng.alive and eng.pid is None


def test_vocabulary_lane_does_not_wait_for_the_running_generation():
    eng = FakeEngine(token_delay_s=0.02, reply=lambda r: "x" * 500)  # a 10 s answer
    gen = eng.generate(chat("hi"))
    it = iter(gen)
    next(it)
    assert eng.tokenize("héllo") == [104, 233, 108, 108, 111] and eng.count_tokens("héllo") == 5
    assert eng.tokenize("ab", add_bos=True) == [0, 97, 98] and eng.detokenize([0, 104, 105]) == "hi"
    assert eng.token_piece_bytes(233) == "é".encode() and eng.token_piece_bytes(0) == b""
    rp = eng.render(chat("hi"))
    assert (rp.text, rp.name) == ("user: hi\nassistant:", "fake")
    assert gen.done is None and eng.active() == 1  # answered while the generation still runs
    gen.close()
    assert eng.stats.cancelled == 1 and eng.complete(chat("hi", max_tokens=2)).text == "xx"


def test_fifo_queue_full_and_cancel_before_start():
    eng = FakeEngine(max_queue=1, token_delay_s=0.01, reply=lambda r: r.messages[-1].content * 50)
    order: list[str] = []
    first = eng.generate(chat("A"))
    it = iter(first)
    next(it)
    assert eng.runtime.started.is_set()
    second = eng.generate(chat("B"))
    t = threading.Thread(target=lambda: order.append(second.result().text))
    t.start()
    deadline = time.time() + 5
    while eng.queue_depth() < 1 and time.time() < deadline:
        time.sleep(0.005)
    with pytest.raises(QueueFull):
        eng.complete(chat("C"))
    order.append("".join(e.text for e in it if isinstance(e, Delta)))
    t.join(10)
    assert order == ["A" * 49, "B" * 50]
    late = eng.generate(chat("D"))
    late.cancel()
    with pytest.raises(Cancelled, match="before it started"):
        late.result()


def test_known_errors_cross_and_count_as_failed():
    eng = FakeEngine(n_ctx=32)
    with pytest.raises(ContextLengthExceeded):
        eng.complete(chat("x" * 100))
    eng.fail_next = EngineCrashed("boom")
    with pytest.raises(EngineCrashed, match="boom"):
        eng.complete(chat("hi"))
    assert eng.stats.failed == 2 and eng.stats.crashes == 0


# the scripted crash ends the serving thread with SystemExit, which pytest reports as an unhandled thread exception
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_crash_is_reported_counted_and_the_runtime_restarts():
    eng = FakeEngine()
    eng.runtime.crash_next = True
    with pytest.raises(EngineCrashed, match="its thread ended"):
        eng.complete(chat("hi"))
    assert eng.stats.crashes == 1 and not eng.alive
    assert eng.complete(chat("again")).text == "echo: again"
    assert eng.runtime.seen[-1].messages[-1].content == "again"  # the same script serves the new thread


def test_closing_mid_stream_never_lets_an_old_reader_take_the_next_engines_messages():
    """Closing an engine closed its pipe while its reader thread was reading it; the next engine's pipe could
    get the same descriptor and the old reader took its "ready" (CI: "the process died while loading (it
    was stopped)"). The reader is now joined before the pipe is closed."""
    def ask(engine, n):
        return engine.complete(GenerateRequest(messages=(ChatMessage("user", "hi"),),
                                               decoding=DecodingParams.make(max_tokens=n)))

    for i in range(100):
        eng = FakeEngine(reply=lambda r: "word " * 200, token_delay_s=0.001)
        streams = [threading.Thread(target=lambda: _quietly(ask, eng, 300)) for _ in range(3)]
        for t in streams:
            t.start()
        time.sleep(0.003 * (i % 5))
        eng.close()
        for t in streams:
            t.join(5)
        nxt = FakeEngine()  # loads: its "ready" reached it
        try:
            assert ask(nxt, 3).metrics.completion_tokens >= 1
        finally:
            nxt.close()


def _quietly(fn, *args):
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - the engine was closed under the stream: that is the point
        pass
