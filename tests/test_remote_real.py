"""Issue 15's "Must show" for remote engines, on real servers: a second real ``hearth serve`` process (the
bundled Gemma 3 270M, 127.0.0.1, a free port) as the remote, and llama.cpp's own llama-server where
``make bench-peer`` built it (``~/.cache/hearth-peer/llama-server-*/llama-server``; skipped otherwise).

Shown: chat streamed through ``RemoteEngine`` (the same greedy text the remote gives unstreamed), cancel (the
remote counts the client's disconnect / logs the cancelled task), a turn of the turn pipeline stored over a
remote, Hearth's own port forwarding a remote, and the remote killed mid-answer: a clear ``RemoteStreamError``
and the partial answer stored with status ``error``. Every server started here is stopped in ``finally``
(its whole process group)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from app.engine.remote import RemoteEngine, RemoteError, RemoteStreamError
from app.errors import Cancelled
from app.protocol.types import ChatMessage, DecodingParams, Delta, Done, GenerateRequest

pytestmark = pytest.mark.model
REPO = Path(__file__).resolve().parents[1]
FRANCE = (ChatMessage("user", "What is the capital of France?"),)
COUNT = (ChatMessage("user", "Count from 1 to 300, one number per line."),)
GREEDY = DecodingParams(temperature=0.0, max_tokens=12)
LONG = DecodingParams(temperature=0.0, max_tokens=300, repeat_penalty=1.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL after 10 s; never raises."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def hearth_serve(model: Path, home: Path, *extra: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real ``hearth serve`` in its own process group (server + engine child), stopped on exit whatever
    happens. Yields ``(base_url, process)``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HEARTH_HOME": str(home)}
    err = open(home / "serve.stderr", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--model", str(model),
                             "--n-ctx", "1024", "--parallel", "2", "--no-prefix-cache", *extra],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, f"hearth serve exited: {(home / 'serve.stderr').read_text()[-2000:]}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "hearth serve did not become ready"
            time.sleep(0.3)
        yield url, proc
    finally:
        _stop(proc)
        err.close()


@pytest.fixture(scope="module")
def peer(bundled_model, tmp_path_factory):
    """The remote for most tests: one ``hearth serve`` for the module."""
    with hearth_serve(bundled_model, tmp_path_factory.mktemp("remote-home")) as (url, _proc):
        yield url


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _stream(eng, req) -> tuple[list[Delta], Done]:
    deltas, done = [], None
    for ev in eng.generate(req):
        if isinstance(ev, Delta):
            deltas.append(ev)
        else:
            done = ev
    assert done is not None
    return deltas, done


def _cancel_after(eng, req, n: int) -> list[Delta]:
    gen = eng.generate(req)
    got = []
    with pytest.raises(Cancelled):
        for ev in gen:
            got.append(ev)
            if len(got) == n:
                gen.cancel()
    return got


# -- a second real hearth serve as the remote ------------------------------------------------------------
def test_hearth_remote_streams_the_same_greedy_answer(peer):
    eng = RemoteEngine("peer", f"{peer}/v1")
    info = eng.load()
    assert info["remote"]["kind"] == "hearth" and eng.model == "gemma-3-270m-q4_k_m"
    deltas, done = _stream(eng, GenerateRequest(messages=FRANCE, decoding=GREEDY))
    whole = httpx.post(f"{peer}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": FRANCE[0].content}], "temperature": 0, "max_tokens": 12}).json()
    assert len(deltas) > 1 and done.text == whole["choices"][0]["message"]["content"] and "Paris" in done.text
    m = done.metrics
    assert (m.prompt_tokens, m.completion_tokens) == (whole["usage"]["prompt_tokens"],
                                                      whole["usage"]["completion_tokens"])
    assert 0 < m.ttft_s <= m.total_s and done.info["remote"]["usage"] == "remote"
    assert "Hearth's boundary" in done.info["remote"]["note"] and done.info["remote"]["metrics"]["ttft_s"] > 0
    eng.close()


def test_hearth_generate_json_over_a_remote(peer, tmp_path):
    """`hearth generate --json` on a remote prints its JSON (it asked the backend for its prefix cache through
    the backend contract; a remote has none of its own, so there is no prefix_cache entry)."""
    import json

    env = {**os.environ, "HEARTH_HOME": str(tmp_path / "home")}

    def hearth(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=300)

    added = hearth("remote", "add", "peer", f"{peer}/v1", "--model", "gemma-3-270m-q4_k_m")
    assert added.returncode == 0, added.stderr[-2000:]
    r = hearth("generate", "--model", "peer", "Once upon a time", "--max-tokens", "4", "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["text"] and out["info"]["remote"]["kind"] == "hearth" and "prefix_cache" not in out


def test_hearth_remote_cancel_is_seen_by_the_remote(peer):
    eng = RemoteEngine("peer", f"{peer}/v1")
    before = _metric(peer, "hearth_requests_cancelled_total")
    got = _cancel_after(eng, GenerateRequest(messages=COUNT, decoding=LONG), 3)
    assert len(got) == 3
    deadline = time.monotonic() + 15
    while _metric(peer, "hearth_requests_cancelled_total") <= before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _metric(peer, "hearth_requests_cancelled_total") == before + 1
    assert eng.stats.cancelled == 1 and eng.active() == 0
    _deltas, done = _stream(eng, GenerateRequest(messages=FRANCE, decoding=GREEDY))  # the remote is free again
    assert "Paris" in done.text


def test_a_turn_over_the_remote_is_stored(peer, memory_store):
    from app.assistant import Assistant

    asst = Assistant(RemoteEngine("peer", f"{peer}/v1"), memory_store, decoding=GREEDY)
    conv = asst.new_conversation()
    done = asst.send(conv, "What is the capital of France?")
    msg = memory_store.get_message(done.result.message_id)
    assert msg.status == "complete" and "Paris" in msg.content and msg.meta["model"] == "peer"
    again = asst.send(conv, "And of Italy?")  # the history goes to the remote with the new question
    assert memory_store.get_message(again.result.message_id).status == "complete"


def test_the_port_forwards_a_remote(peer):
    import openai

    from app.server import ServerThread, create_app
    from app.server.models import ModelCatalog
    from app.settings import ServerSettings

    eng = RemoteEngine("peer", f"{peer}/v1")
    eng.load()
    with ServerThread(create_app(eng, ServerSettings(), catalog=ModelCatalog(lambda: []))) as srv:
        c = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)
        chunks = list(c.chat.completions.create(model="peer", stream=True, temperature=0, max_tokens=12,
                                                messages=[{"role": "user", "content": FRANCE[0].content}]))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert "Paris" in text and len(chunks) > 3


def test_the_remote_killed_mid_answer_is_a_clear_error_and_a_stored_partial(bundled_model, tmp_path, memory_store):
    from app.assistant import Assistant, TextDelta

    with hearth_serve(bundled_model, tmp_path / "doomed-home") as (url, proc):
        asst = Assistant(RemoteEngine("doomed", f"{url}/v1"), memory_store, decoding=LONG)
        conv = asst.new_conversation()
        seen: list[str] = []
        with pytest.raises(RemoteError) as e:
            for ev in asst.turn(conv, COUNT[0].content):
                if isinstance(ev, TextDelta):
                    seen.append(ev.text)
                    if len(seen) == 5:
                        os.killpg(proc.pid, signal.SIGKILL)
    err = e.value
    assert isinstance(err, RemoteStreamError) and "'doomed'" in str(err), str(err)
    assert "in the middle of the answer" in str(err) or "without [DONE]" in str(err)
    last = memory_store.messages(conv)[-1]
    assert (last.role, last.status) == ("assistant", "error")
    assert last.content == err.partial_text and last.content.startswith("".join(seen)) and last.content
    assert last.meta["error"] == "RemoteStreamError" and last.meta["message"] == str(err)
    assert memory_store.messages(conv)[0].content == COUNT[0].content


# -- llama-server, where `make bench-peer` built it ----------------------------------------------------------
@pytest.fixture
def llama_server(bundled_model, tmp_path):
    from benchmarks import peer as peer_mod

    try:
        binary = peer_mod.find_binary()
    except peer_mod.PeerError as exc:
        pytest.skip(str(exc))
    cfg = peer_mod.PeerConfig(bundled_model, n_parallel=1, n_ctx_per_slot=1024)
    with peer_mod.llama_server(cfg, binary, log_path=tmp_path / "llama-server.log") as srv:
        yield srv


def test_llama_server_remote_streams_cancels_and_dies_clearly(llama_server, memory_store):
    from app.assistant import Assistant, TextDelta

    eng = RemoteEngine("fleet", f"{llama_server.url}/v1")
    info = eng.load()
    assert info["remote"]["kind"] == "llama-server" and info["remote"]["tokenizer"] == "llama-server"
    assert eng.n_ctx == 1024 and eng.count_tokens("Hello world") == 2
    deltas, done = _stream(eng, GenerateRequest(messages=FRANCE, decoding=GREEDY))
    assert len(deltas) > 1 and done.text and done.metrics.completion_tokens > 0
    assert done.info["remote"]["timings"]["predicted_n"] == done.metrics.completion_tokens
    got = _cancel_after(eng, GenerateRequest(messages=COUNT, decoding=LONG), 3)
    assert len(got) == 3
    deadline = time.monotonic() + 10
    while "cancel task" not in llama_server.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "cancel task" in llama_server.log.read_text(), "llama-server did not see the client leave"
    asst = Assistant(eng, memory_store, decoding=LONG)
    conv = asst.new_conversation()
    seen: list[str] = []
    with pytest.raises(RemoteStreamError) as e:
        for ev in asst.turn(conv, COUNT[0].content):
            if isinstance(ev, TextDelta):
                seen.append(ev.text)
                if len(seen) == 5:
                    os.killpg(llama_server.proc.pid, signal.SIGKILL)
    last = memory_store.messages(conv)[-1]
    assert (last.status, last.content) == ("error", e.value.partial_text) and last.content
