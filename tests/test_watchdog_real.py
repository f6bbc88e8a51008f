"""The watchdog and the restarts of issue 29 (items 7 and 8) on the real bundled models (docs/engine.md,
"Watchdog"): a stopped (SIGSTOP) engine fails its requests by their deadline, is reported not alive, killed and
restarted by the next request; a long prefill is not taken for a freeze; an embedder killed mid-ingest
restarts and every chunk gets its vector; a request right after an idle crash is served.

Every process a test stops is continued and killed in ``finally`` whatever happens; every wait that the
defect would make endless runs on a thread with a time limit (the engine is killed when it passes)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from crashes import end_stopped, gone, kill
from engine_runs import served

from app.engine.local.engine import Engine
from app.errors import EngineCrashed
from app.protocol.types import DecodingParams, GenerateRequest, LoadSettings

pytestmark = pytest.mark.model


def _raw(prompt: str, max_tokens: int, deadline_s: float | None = None) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, decoding=DecodingParams(max_tokens=max_tokens, temperature=0.0),
                           deadline_s=deadline_s, prefix_cache=False)


class _Drain(threading.Thread):
    """Runs a started stream to its end on a thread: ``error`` (what it raised) and ``at`` (when it ended)."""

    def __init__(self, it) -> None:
        super().__init__(daemon=True)
        self.it, self.error, self.at = it, None, None

    def run(self) -> None:
        try:
            for _ev in self.it:
                pass
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc
        self.at = time.monotonic()


def _started(eng: Engine, request: GenerateRequest):
    it = iter(eng.generate(request))
    next(it)  # the engine is generating this one
    return it


WATCHDOG_S = 6.0  # longer than the deadline below, so the deadline (not the watchdog) ends the first request
DEADLINE_S = 3.0


def test_a_stopped_engine_fails_its_requests_is_reported_killed_and_restarted(bundled_model: Path):
    eng = Engine(bundled_model, LoadSettings(n_ctx=1024, n_parallel=2), watchdog_s=WATCHDOG_S)
    stopped: list[int] = []
    try:
        eng.load()
        with served_engine(eng) as url:
            t0 = time.monotonic()
            timed = _Drain(_started(eng, _raw("Tell me a long story:", 900, deadline_s=DEADLINE_S)))
            untimed = _Drain(_started(eng, _raw("Write a long poem:", 900)))
            pid = eng.pid
            os.kill(pid, signal.SIGSTOP)  # frozen: no token, no heartbeat, no end at the deadline
            stopped.append(pid)
            t_stop = time.monotonic()
            timed.start()
            untimed.start()
            timed.join(DEADLINE_S + 3)
            assert not timed.is_alive(), "a request with a deadline still waits on a stopped engine"
            assert isinstance(timed.error, EngineCrashed) and "not responding" in str(timed.error)
            assert timed.at - t0 <= DEADLINE_S + 1.5  # its deadline, and at most one stale period more
            untimed.join(WATCHDOG_S + 3)
            assert not untimed.is_alive(), "the watchdog did not end the request without a deadline"
            assert isinstance(untimed.error, EngineCrashed) and "stopped responding" in str(untimed.error)
            assert WATCHDOG_S - 0.5 <= untimed.at - t_stop <= WATCHDOG_S + 1.5
            assert httpx.get(f"{url}/health").json()["engine_alive"] is False
            assert gone(pid, 5), "the frozen engine process was not killed"
            assert eng.stats.crashes == 1
            done = eng.complete(_raw("The capital of France is", 4))
            assert done.metrics.completion_tokens > 0 and eng.pid not in (None, pid)
            assert httpx.get(f"{url}/health").json()["engine_alive"] is True
    finally:
        end_stopped(stopped)
        eng.close()


def test_a_long_prefill_is_not_taken_for_a_frozen_engine(bundled_model: Path):
    # the whole prompt in one llama_decode: the engine's main thread is busy far longer than the watchdog's time
    eng = Engine(bundled_model, LoadSettings(n_ctx=4096, n_batch=2048, n_ubatch=2048, n_parallel=1),
                 watchdog_s=1.0)
    try:
        eng.load()
        pid = eng.pid
        prompt = " ".join(f"item {i} is a small grey stone," for i in range(190))  # about 2,000 tokens
        done = eng.complete(_raw(prompt, 4))
        assert done.metrics.prompt_tokens >= 1800
        assert done.metrics.prefill_s > 1.0, "the prefill was too quick to show anything"
        assert eng.alive and eng.pid == pid and eng.stats.crashes == 0
    finally:
        eng.close()


def test_a_request_right_after_an_idle_crash_is_served(bundled_model: Path):
    # A crashed process is torn down for a while (its memory unmapped, or dumped to a core file: seconds for a
    # large model) before the host can see it is gone: a request arriving then goes to a child that never reads
    # it. A stop before the request and the kill after it hold that window open.
    stopped: list[int] = []
    with served(bundled_model, n_ctx=1024) as srv:
        try:
            model = httpx.get(f"{srv.url}/v1/models").json()["data"][0]["id"]
            body = {"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
            assert httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60).status_code == 200
            pid = _engine_pid()
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
            got: list = []
            post = threading.Thread(target=lambda: got.append(
                httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60)), daemon=True)
            post.start()
            time.sleep(0.5)  # the request is in the stopped child's pipe
            kill(pid)  # the crash, before the child read it
            post.join(60)
            assert got and got[0].status_code == 200, got and got[0].text
            assert got[0].json()["choices"][0]["message"]["content"] is not None
            assert _engine_pid() != pid
        finally:
            end_stopped(stopped)


def _engine_pid() -> int:
    """The one engine child of this process (``served`` does not hand out its engine)."""
    import multiprocessing as mp

    kids = [p for p in mp.active_children() if p.name == "hearth-engine"]
    assert len(kids) == 1, kids
    return kids[0].pid


def test_an_embedder_killed_mid_ingest_restarts_and_every_chunk_gets_its_vector(embedding_model: Path,
                                                                               tmp_path: Path):
    from app.retrieval.embedder import Embedder
    from app.retrieval.ingest import Ingester
    from app.retrieval.store import DocumentStore

    folder = tmp_path / "notes"
    folder.mkdir()
    for k in range(12):
        (folder / f"note{k}.md").write_text(f"# Note {k}\n\n" + "\n\n".join(
            f"Paragraph {j} of note {k}: the herons came back to the river in spring, nest by nest. " * 3
            for j in range(8)))
    killed: list[int] = []
    emb = Embedder(embedding_model, workers=1)
    try:
        def crash_once(state) -> None:
            if state.event == "embed" and state.chunks_embedded > 0 and not killed:
                killed.append(emb.pid)
                kill(killed[0])  # mid-request: the group in flight has more to embed

        with DocumentStore(tmp_path / "docs.db") as store:
            report = Ingester(store, emb, embed_group_tokens=2000).ingest([folder], progress=crash_once)
            stats = store.stats()
            assert killed and emb.pid not in (None, killed[0])  # it died and a new one finished the ingest
            assert report.count("indexed") == 12
            assert not [f.reason for f in report.files if f.reason and "keyword" in f.reason]
            assert stats["embeddings"] == stats["chunks"] > 0
    finally:
        emb.close()


# -------------------------------------------------------------------------------------------- helpers

class served_engine:
    """``eng`` behind the port on a free loopback port (yields its url); the server stops whatever happens."""

    def __init__(self, eng: Engine) -> None:
        from app.server import ServerThread, create_app
        from app.settings import ServerSettings

        self.srv = ServerThread(create_app(eng, ServerSettings()))

    def __enter__(self) -> str:
        return self.srv.__enter__().url

    def __exit__(self, *exc) -> None:
        self.srv.__exit__(*exc)

