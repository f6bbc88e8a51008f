"""``RemoteEngine`` against a scripted OpenAI-compatible server in this process (``FakeRemote``: the
standard library's HTTP server on 127.0.0.1 and a free port), so every failure of a remote can be made on
purpose: 401, 429 with Retry-After, 5xx, refused connections, timeouts, malformed streams, a stream without
``[DONE]``, a connection reset mid-answer. Also: the request bodies, metrics at Hearth's boundary, tool calls
read back by ``ToolStream``, cancel closing the HTTP stream, the turn pipeline storing a marked partial answer,
the port forwarding, keys (environment, keyring, masking, log redaction), the ``remotes`` settings and
``hearth remote``. No model."""

from __future__ import annotations

import json
import logging
import pickle
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import httpx
import pytest

from app.engine.chat.tool_stream import ToolStream
from app.engine.remote import (
    RemoteAuthError,
    RemoteBadRequest,
    RemoteEngine,
    RemoteRateLimited,
    RemoteServerError,
    RemoteStreamError,
    RemoteTimeout,
    RemoteUnreachable,
    approx_tokens,
    normalize_url,
    sse_data,
)
from app.errors import Cancelled, EngineCrashed, InvalidRequest, ModelLoadError, QueueFull
from app.protocol.tools import ToolChoice, ToolSpec
from app.protocol.types import ChatMessage, DecodingParams, Delta, Done, GenerateRequest

KEY = "sk-test-0123456789abcdefXYZ"
USER = (ChatMessage("user", "Hello?"),)


# ------------------------------------------------------------------------------------------------------
# the fake remote
# ------------------------------------------------------------------------------------------------------
def chunk(content: str | None = None, reasoning: str | None = None, finish: str | None = None,
          tool_calls: list | None = None, **extra: Any) -> dict:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


USAGE = {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3,
                                                      "prompt_tokens_details": {"cached_tokens": 8}}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes: a plain, framing-free stream

    def log_message(self, *args: Any) -> None:
        pass

    def _any(self, method: str) -> None:
        fake: FakeRemote = self.server.fake  # type: ignore[attr-defined]
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else None
        fake.requests.append({"method": method, "path": self.path, "headers": dict(self.headers), "body": body})
        route = fake.routes.get((method, self.path))
        if route is None:
            self.send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        route(self, body)

    def do_GET(self) -> None:
        self._any("GET")

    def do_POST(self) -> None:
        self._any("POST")

    # helpers the routes use
    def send_json(self, status: int, obj: Any, headers: dict | None = None) -> None:
        raw = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(raw)

    def start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

    def send_lines(self, lines: list[str | bytes], delay: float = 0.0) -> bool:
        """Write SSE lines; False when the client left (the remote saw the disconnect)."""
        fake: FakeRemote = self.server.fake  # type: ignore[attr-defined]
        try:
            for line in lines:
                self.wfile.write(line if isinstance(line, bytes) else line.encode())
                self.wfile.flush()
                if delay:
                    time.sleep(delay)
        except (BrokenPipeError, ConnectionResetError):
            fake.disconnects.append(time.monotonic())
            return False
        return True

    def sse(self, chunks: list[dict], done: bool = True, delay: float = 0.0) -> bool:
        self.start_sse()
        lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + (["data: [DONE]\n\n"] if done else [])
        return self.send_lines(lines, delay)

    def reset(self) -> None:
        """Close the connection with a TCP reset (SO_LINGER 0), as a killed process's kernel would."""
        self.wfile.flush()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()


class FakeRemote:
    """An OpenAI-compatible server whose every answer a test scripts: ``routes[(method, path)] =
    fn(handler, body)``. ``requests`` records what came in; ``disconnects`` when a client left mid-stream."""

    def __init__(self, models: list[dict] | None = None) -> None:
        self.requests: list[dict] = []
        self.disconnects: list[float] = []
        cards = models or [{"id": "m1", "object": "model", "owned_by": "vllm", "max_model_len": 8192}]
        self.routes: dict[tuple[str, str], Callable] = {
            ("GET", "/v1/models"): lambda h, b: h.send_json(200, {"object": "list", "data": cards})}
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def chat(self, fn: Callable) -> None:
        self.routes[("POST", "/v1/chat/completions")] = fn

    def bodies(self, path: str = "/v1/chat/completions") -> list[dict]:
        return [r["body"] for r in self.requests if r["path"] == path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def remote():
    fake = FakeRemote()
    yield fake
    fake.close()


def engine(fake: FakeRemote, **kw: Any) -> RemoteEngine:
    kw.setdefault("api_key", KEY)
    return RemoteEngine("gpu-box", fake.url, **kw)


def drain(gen) -> tuple[list[Delta], Done]:
    deltas, done = [], None
    for ev in gen:
        if isinstance(ev, Delta):
            deltas.append(ev)
        else:
            done = ev
    assert done is not None
    return deltas, done


# ------------------------------------------------------------------------------------------------------
# pure parts
# ------------------------------------------------------------------------------------------------------
def test_urls_names_and_the_approximation():
    assert normalize_url("http://gpu:8000") == "http://gpu:8000/v1"
    assert normalize_url("https://api.example.com/v1/") == "https://api.example.com/v1"
    for bad in ("ftp://x", "gpu:8000", "http://user:pw@gpu/v1", "http://gpu:99999/v1", "http://gpu/v1?k=1"):
        with pytest.raises(InvalidRequest) as e:
            normalize_url(bad)
        assert e.value.param == "url" and "pw" not in str(e.value)
    with pytest.raises(InvalidRequest):
        RemoteEngine("has.dot", "http://x/v1")  # a dot would be cut by registry.model_id
    assert approx_tokens("") == 0 and approx_tokens("abcdef") == 2 and approx_tokens("歪歪") == 2


def test_sse_lines():
    assert sse_data(b"data: {\"a\": 1}\n") == '{"a": 1}'
    assert sse_data(b"data:[DONE]\r\n") == "[DONE]"
    assert sse_data(b"\n") is None and sse_data(b": keep-alive\n") is None and sse_data(b"event: x\n") is None
    assert json.loads(sse_data(b'error: {"message": "boom"}\n'))["error"]["message"] == "boom"
    with pytest.raises(ValueError):
        sse_data(b"<html>oops</html>\n")


def test_errors_pickle_with_their_partial_text():
    for err in (RemoteStreamError("lost", "'a' (u)", None, "partial", "thought"),
                RemoteRateLimited("slow down", 7.0, "'a' (u)"), RemoteBadRequest("bad", "messages", "'a'", 400)):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.__dict__ == err.__dict__
    assert isinstance(RemoteStreamError("x"), EngineCrashed) and isinstance(RemoteRateLimited("x"), QueueFull)


# ------------------------------------------------------------------------------------------------------
# load and requests
# ------------------------------------------------------------------------------------------------------
def test_load_finds_the_model_and_the_servers_context(remote):
    eng = engine(remote)
    info = eng.load()
    assert (eng.model, eng.kind, eng.n_ctx, eng.settings.n_ctx) == ("m1", "vllm", 8192, 8192)
    assert info["remote"]["url"] == remote.url and eng.alive and eng.model_path == "gpu-box"
    assert remote.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    with pytest.raises(ModelLoadError) as e:
        engine(remote, model="nope").load()
    assert "has no model 'nope'" in str(e.value) and "m1" in str(e.value) and "gpu-box" in str(e.value)
    many = FakeRemote([{"id": "a"}, {"id": "b"}])
    try:
        with pytest.raises(ModelLoadError) as e:
            RemoteEngine("x", many.url).load()
        assert "serves 2 models (a, b)" in str(e.value)
        eng = RemoteEngine("x", many.url, model="b")
        assert eng.load()["remote"]["model"] == "b" and eng.kind == "openai" and eng.n_ctx == 4096
    finally:
        many.close()


def test_chat_stream_body_metrics_and_done(remote):
    remote.chat(lambda h, b: h.sse([chunk(reasoning="Let me think. "), chunk("Hel"),
                                    chunk("lo!", finish="stop", hearth={"metrics": {"ttft_s": 0.01}}), USAGE],
                                   delay=0.02))
    eng = engine(remote)
    tools = (ToolSpec("get_time", "the time", {"type": "object", "properties": {}}),)
    dec = DecodingParams(temperature=0.2, top_k=5, seed=7, stop=("END",), max_tokens=20, repeat_penalty=1.1)
    from app.protocol.reasoning import ReasoningBudget
    from app.protocol.types import ReasoningRequest

    req = GenerateRequest(messages=USER, decoding=dec, tools=tools, tool_choice=ToolChoice("auto"),
                          reasoning=ReasoningRequest(ReasoningBudget(tokens=256, effort="low", source="request")))
    deltas, done = drain(eng.generate(req))
    assert [d.text for d in deltas] == ["", "Hel", "lo!"] and deltas[0].reasoning == "Let me think. "
    assert (done.text, done.reasoning, done.finish_reason) == ("Hello!", "Let me think. ", "stop")
    body = remote.bodies()[0]
    assert body["messages"] == [{"role": "user", "content": "Hello?"}] and body["model"] == "m1"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["seed"], body["stop"], body["max_tokens"]) == (0.2, 7, ["END"], 20)
    assert body["top_k"] == 5 and body["repetition_penalty"] == 1.1  # vLLM's name for it
    assert body["tools"][0]["function"]["name"] == "get_time" and body["tool_choice"] == "auto"
    assert body["reasoning_effort"] == "low"
    m = done.metrics
    assert (m.prompt_tokens, m.completion_tokens, m.cached_tokens) == (12, 3, 8)
    assert 0 < m.ttft_s < m.total_s and m.ttfat_s is not None and m.ttfat_s > m.ttft_s and m.itl_max_s > 0.01
    r = done.info["remote"]
    assert (r["url"], r["model"], r["kind"], r["usage"]) == (remote.url, "m1", "vllm", "remote")
    assert "Hearth's boundary" in r["note"] and done.info["model"] == "gpu-box"
    assert r["metrics"] == {"ttft_s": 0.01}  # a remote Hearth's own clocks, passed on
    assert eng.stats.completed == 1 and eng.stats.prompt_tokens == 12 and eng.active() == 0


def test_raw_prompt_goes_to_completions_and_no_usage_is_unknown(remote):
    remote.routes[("POST", "/v1/completions")] = lambda h, b: h.sse(
        [{"choices": [{"index": 0, "text": " Paris", "finish_reason": None}]},
         {"choices": [{"index": 0, "text": ".", "finish_reason": "length"}]}])
    done = engine(remote).complete(GenerateRequest(prompt="The capital of France is"))
    assert (done.text, done.finish_reason) == (" Paris.", "length")
    assert remote.bodies("/v1/completions")[0]["prompt"] == "The capital of France is"
    assert done.info["remote"]["usage"] == "unknown" and done.metrics.prompt_tokens == 0


def test_structured_tool_calls_are_read_back_by_tool_stream(remote):
    calls = [chunk(tool_calls=[{"index": 0, "id": "c1", "type": "function",
                                "function": {"name": "get_weather", "arguments": ""}}]),
             chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}]),
             chunk(tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}], finish="tool_calls")]
    remote.chat(lambda h, b: h.sse(calls))
    eng = engine(remote)
    tools = (ToolSpec("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}),)
    req = GenerateRequest(messages=USER, tools=tools, tool_choice=ToolChoice("function", "get_weather"))
    reader = ToolStream.for_request(req, eng.tool_format())
    done = None
    for ev in eng.generate(req):
        if isinstance(ev, Delta):
            reader.feed(ev.text)
        else:
            done = ev
    _pieces, outcome = reader.finish(done.finish_reason)
    assert outcome.finish_reason == "tool_calls" and outcome.errors == ()
    assert [(c.name, json.loads(c.arguments)) for c in outcome.calls] == [("get_weather", {"city": "Paris"})]
    assert remote.bodies()[0]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert done.info["tool_format"] == "hermes"


def test_history_with_calls_and_results_goes_out_structured(remote):
    from app.protocol.tools import ToolCall

    remote.chat(lambda h, b: h.sse([chunk("It is sunny.", finish="stop")]))
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    msgs = (ChatMessage("user", "Weather?"), ChatMessage("assistant", "", (call,)),
            ChatMessage("tool", "sunny", tool_call_id="call_1", name="get_weather"))
    tools = (ToolSpec("get_weather", "", {"type": "object", "properties": {}}),)
    engine(remote).complete(GenerateRequest(messages=msgs, tools=tools))
    sent = remote.bodies()[0]["messages"]
    assert sent[1]["tool_calls"] == [call.to_openai()]
    assert sent[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"}


def test_what_a_remote_cannot_do_is_refused_naming_the_parameter(remote):
    eng = engine(remote)
    for req, param in ((GenerateRequest(messages=USER, want_logprobs=2), "logprobs"),
                       (GenerateRequest(messages=USER, speculative="prompt_lookup"), "hearth.speculative"),
                       (GenerateRequest(messages=USER, decoding=DecodingParams(grammar='root ::= "a"')),
                        "response_format")):
        with pytest.raises(InvalidRequest) as e:
            eng.generate(req)
        assert e.value.param == param
    assert eng.generate(GenerateRequest(messages=USER)).stop_thinking() is False


# ------------------------------------------------------------------------------------------------------
# the remote's errors
# ------------------------------------------------------------------------------------------------------
def _fails(remote, fn, **kw) -> BaseException:
    remote.chat(fn)
    with pytest.raises(Exception) as e:
        drain(engine(remote, **kw).generate(GenerateRequest(messages=USER)))
    return e.value


def test_401_names_the_remote_and_never_the_key(remote):
    err = _fails(remote, lambda h, b: h.send_json(401, {"error": {"message": f"Incorrect API key provided: {KEY}"}}),
                 key_hint="$VLLM_KEY")
    assert isinstance(err, RemoteAuthError) and err.status == 401
    assert "refused the API key (the key from $VLLM_KEY): 401" in str(err) and "'gpu-box'" in str(err)
    assert KEY not in str(err) and "[redacted]" in str(err)


def test_429_is_a_queue_full_with_the_remotes_retry_after(remote):
    from app.server.errors import from_exception

    err = _fails(remote, lambda h, b: h.send_json(429, {"error": {"message": "too many"}}, {"Retry-After": "7"}))
    assert isinstance(err, RemoteRateLimited) and err.retry_after_s == 7.0 and "429" in str(err)
    api = from_exception(err)
    assert (api.status, api.headers) == (429, {"Retry-After": "7"})


def test_5xx_and_4xx_carry_the_remotes_message(remote):
    err = _fails(remote, lambda h, b: h.send_json(500, {"error": {"message": "CUDA out of memory"}}))
    assert isinstance(err, RemoteServerError) and "500" in str(err) and "CUDA out of memory" in str(err)
    err = _fails(remote, lambda h, b: h.send_json(503, {"object": "error", "message": "loading"}))
    assert isinstance(err, RemoteServerError) and "503" in str(err) and "loading" in str(err)
    err = _fails(remote, lambda h, b: h.send_json(400, {"error": {"message": "maximum context length is 8192",
                                                                  "param": "messages"}}))
    assert isinstance(err, RemoteBadRequest) and err.param == "messages" and "8192" in str(err)


def test_refused_connection_and_timeouts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    eng = RemoteEngine("gone", f"http://127.0.0.1:{port}/v1")
    with pytest.raises(RemoteUnreachable) as e:
        eng.load()
    assert "connection refused" in str(e.value) and "'gone'" in str(e.value) and not eng.alive


def test_a_silent_remote_times_out_before_and_during_the_answer(remote):
    err = _fails(remote, lambda h, b: time.sleep(1.5), read_timeout_s=0.4)
    assert isinstance(err, RemoteTimeout) and "did not answer within 0.4 s" in str(err)

    def stalls(h, b):
        h.start_sse()
        h.send_lines([f"data: {json.dumps(chunk('Partial '))}\n\n"])
        time.sleep(1.5)
    err = _fails(remote, stalls, read_timeout_s=0.4)
    assert isinstance(err, RemoteTimeout) and err.partial_text == "Partial "


@pytest.mark.parametrize("case", ["malformed", "no_done", "reset", "error_event", "html"])
def test_broken_streams_fail_clearly_with_the_partial_text(remote, case):
    first = f"data: {json.dumps(chunk('The answer is'))}\n\n"

    def fn(h, b):
        if case == "html":
            h.send_response(200)
            h.send_header("Content-Type", "text/html")
            h.end_headers()
            h.wfile.write(b"<html>proxy login</html>")
            return
        h.start_sse()
        h.send_lines([first])
        if case == "malformed":
            h.send_lines(["data: {not json\n\n"])
        elif case == "error_event":
            h.send_lines([f"data: {json.dumps({'error': {'message': 'engine died'}})}\n\n"])
        elif case == "reset":
            h.reset()
    err = _fails(remote, fn)
    if case == "html":
        assert isinstance(err, RemoteStreamError) and "not with an event stream" in str(err)
        return
    want = {"malformed": (RemoteStreamError, "malformed event line"),
            "no_done": (RemoteStreamError, "without [DONE]"),
            "reset": (RemoteStreamError, "lost in the middle of the answer"),
            "error_event": (RemoteServerError, "engine died")}[case]
    assert isinstance(err, want[0]) and want[1] in str(err), str(err)
    assert err.partial_text == "The answer is" and "'gpu-box'" in str(err)


# ------------------------------------------------------------------------------------------------------
# cancel, deadline, slots
# ------------------------------------------------------------------------------------------------------
def _slow(h, b):
    h.sse([chunk(f"tok{i} ") for i in range(200)], delay=0.02)


def test_cancel_closes_the_http_stream_and_the_remote_sees_it(remote):
    remote.chat(_slow)
    eng = engine(remote)
    gen = eng.generate(GenerateRequest(messages=USER))
    got = [next(gen) for _ in range(3)]
    assert all(isinstance(d, Delta) for d in got)
    threading.Timer(0.05, gen.cancel).start()
    with pytest.raises(Cancelled):
        for _ev in gen:
            pass
    deadline = time.monotonic() + 3
    while not remote.disconnects and time.monotonic() < deadline:
        time.sleep(0.02)
    assert remote.disconnects, "the remote never saw the client leave"
    assert eng.stats.cancelled == 1 and eng.active() == 0


def test_closing_a_stream_early_disconnects_too(remote):
    remote.chat(_slow)
    gen = engine(remote).generate(GenerateRequest(messages=USER))
    next(gen)
    gen.close()
    deadline = time.monotonic() + 3
    while not remote.disconnects and time.monotonic() < deadline:
        time.sleep(0.02)
    assert remote.disconnects


def test_deadline_ends_the_answer_with_length(remote):
    remote.chat(_slow)
    deltas, done = drain(engine(remote).generate(GenerateRequest(messages=USER, deadline_s=0.3)))
    # The deadline's timer ended it (stopped_by), part-way: fewer than the 200 tokens the remote would send.
    assert done.finish_reason == "length" and done.info["stopped_by"] == "deadline"
    assert deltas and done.text == "".join(d.text for d in deltas)
    assert 0 < len(deltas) < 200 and done.text != "".join(f"tok{i} " for i in range(200)), len(deltas)
    deadline = time.monotonic() + 3  # (a poll's cap, not a claim: it ends when the remote sees the client go)
    while not remote.disconnects and time.monotonic() < deadline:
        time.sleep(0.02)
    assert remote.disconnects, "the deadline left the remote streaming"


def test_slots_queue_and_queue_full(remote):
    remote.chat(_slow)
    eng = engine(remote, n_parallel=1, max_queue=1)
    first = eng.generate(GenerateRequest(messages=USER))
    next(first)
    waiting = eng.generate(GenerateRequest(messages=USER))
    outcome: list = []

    def wait() -> None:
        try:
            next(waiting)
        except Cancelled as exc:
            outcome.append(exc)
    t = threading.Thread(target=wait, daemon=True)
    t.start()
    deadline = time.monotonic() + 2
    while eng.queue_depth() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (eng.active(), eng.queue_depth()) == (1, 1)
    with pytest.raises(QueueFull):
        next(eng.generate(GenerateRequest(messages=USER)))
    waiting.cancel()
    t.join(3)
    assert outcome and "before it started" in str(outcome[0])
    first.close()
    assert eng.active() == 0 and eng.queue_depth() == 0


# ------------------------------------------------------------------------------------------------------
# vocabulary
# ------------------------------------------------------------------------------------------------------
def test_llama_server_tokenize_is_used_and_cached():
    fake = FakeRemote([{"id": "g", "owned_by": "llamacpp", "meta": {"n_ctx_train": 32768}}])
    fake.routes[("POST", "/tokenize")] = lambda h, b: h.send_json(200, {"tokens": list(range(len(b["content"])))})
    fake.routes[("GET", "/props")] = lambda h, b: h.send_json(200, {"default_generation_settings": {"n_ctx": 2048}})
    try:
        eng = RemoteEngine("ls", fake.url)
        info = eng.load()
        assert (eng.kind, eng.n_ctx, info["remote"]["tokenizer"]) == ("llama-server", 2048, "llama-server")
        assert eng.count_tokens("abcdefg") == 7 and eng.count_tokens("abcdefg") == 7
        assert len([r for r in fake.requests if r["path"] == "/tokenize"]) == 2  # the probe, then one count
        rp = eng.render(GenerateRequest(messages=USER))
        assert "Hello?" in rp.text and not rp.add_bos
    finally:
        fake.close()


def test_without_a_tokenizer_counts_are_approximate(remote):
    eng = engine(remote)
    eng.load()
    assert eng.info["remote"]["tokenizer"] == "approximate" and eng.count_tokens("a" * 30) == 10


# ------------------------------------------------------------------------------------------------------
# the turn pipeline and the port over a remote
# ------------------------------------------------------------------------------------------------------
def test_a_turn_over_a_remote_is_stored_and_a_failure_keeps_the_marked_partial(remote, memory_store):
    from app.assistant import Assistant

    remote.chat(lambda h, b: h.sse([chunk("Paris is "), chunk("the capital.", finish="stop"), USAGE]))
    asst = Assistant(engine(remote), memory_store)
    conv = asst.new_conversation()
    done = asst.send(conv, "Capital of France?")
    stored = memory_store.get_message(done.result.message_id)
    assert (stored.content, stored.status) == ("Paris is the capital.", "complete")
    assert done.result.metrics["prompt_tokens"] == 12 and asst.model == "gpu-box"

    def dies(h, b):
        h.start_sse()
        h.send_lines([f"data: {json.dumps(chunk('Berlin is '))}\n\n", f"data: {json.dumps(chunk('the'))}\n\n"])
        h.reset()
    remote.chat(dies)
    with pytest.raises(RemoteStreamError) as e:
        asst.send(conv, "And Germany?")
    assert e.value.partial_text == "Berlin is the"
    msgs = memory_store.messages(conv)
    assert [m.content for m in msgs if m.role == "user"] == ["Capital of France?", "And Germany?"]
    last = msgs[-1]
    assert (last.role, last.status, last.content) == ("assistant", "error", "Berlin is the")
    assert last.meta["error"] == "RemoteStreamError" and "lost in the middle" in last.meta["message"]


def test_the_port_forwards_streams_and_cancels_on_disconnect(remote):
    from app.server import ServerThread, create_app
    from app.server.models import ModelCatalog
    from app.settings import ServerSettings

    remote.chat(lambda h, b: _slow(h, b) if b.get("max_tokens") == 999 else
                h.sse([chunk("Hi "), chunk("there", finish="stop"), USAGE]))
    eng = engine(remote)
    eng.load()
    with ServerThread(create_app(eng, ServerSettings(), catalog=ModelCatalog(lambda: []))) as srv:
        assert [m["id"] for m in httpx.get(f"{srv.url}/v1/models").json()["data"]] == ["gpu-box"]
        body = {"model": "gpu-box", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        raw = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=10).text
        text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                       for line in raw.splitlines() if line.startswith("data: {") and '"choices":[{' in line)
        assert text == "Hi there" and raw.endswith("data: [DONE]\n\n")
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json={**body, "max_tokens": 999},
                          timeout=10) as r:
            for _line in zip(range(3), r.iter_lines()):
                pass
        deadline = time.monotonic() + 5
        while not remote.disconnects and time.monotonic() < deadline:
            time.sleep(0.05)
        assert remote.disconnects, "closing the port's stream did not close the remote's"


# ------------------------------------------------------------------------------------------------------
# keys, settings, the CLI
# ------------------------------------------------------------------------------------------------------
class MemoryKeyring:
    """A keyring backend in a dict (the ``keyring`` package's interface)."""

    priority = 1

    def __init__(self) -> None:
        self.store: dict[tuple[str, str], str] = {}

    def set_password(self, service: str, user: str, password: str) -> None:
        self.store[(service, user)] = password

    def get_password(self, service: str, user: str) -> str | None:
        return self.store.get((service, user))

    def delete_password(self, service: str, user: str) -> None:
        import keyring.errors

        if (service, user) not in self.store:
            raise keyring.errors.PasswordDeleteError(user)
        del self.store[(service, user)]


@pytest.fixture
def memory_keyring(monkeypatch):
    pytest.importorskip("keyring")
    kr = MemoryKeyring()
    import keyring

    for name in ("set_password", "get_password", "delete_password"):
        monkeypatch.setattr(keyring, name, getattr(kr, name))
    return kr


def test_keys_from_the_environment_and_the_keyring(memory_keyring):
    from app import secrets
    from app.settings import RemoteSettings

    env_remote = RemoteSettings(url="http://x/v1", api_key_env="HEARTH_TEST_KEY")
    assert secrets.api_key_for("a", env_remote, env={"HEARTH_TEST_KEY": KEY}) == KEY
    with pytest.raises(secrets.SecretError) as e:
        secrets.api_key_for("a", env_remote, env={})
    assert "$HEARTH_TEST_KEY" in str(e.value)
    kr_remote = RemoteSettings(url="http://x/v1", api_key_keyring=True)
    with pytest.raises(secrets.SecretError):
        secrets.api_key_for("b", kr_remote)
    secrets.store_key("b", KEY)
    assert memory_keyring.store[("hearth", "remote:b")] == KEY and secrets.api_key_for("b", kr_remote) == KEY
    assert secrets.delete_key("b") and not secrets.delete_key("b")
    assert secrets.mask(KEY) == "…fXYZ" and secrets.mask("short-key") == "****" and secrets.mask(None) == "(none)"
    with pytest.raises(secrets.SecretError) as e:
        secrets.check_env_name(KEY)
    assert KEY not in str(e.value)


def test_logs_never_show_a_key(remote, caplog):
    from app import secrets

    eng = engine(remote)  # registers its key and installs the filter
    secrets.install_redaction()  # onto caplog's handler too
    log = logging.getLogger("app.engine.remote.engine.test")
    with caplog.at_level(logging.DEBUG):
        log.warning("headers %s", {"Authorization": f"Bearer {KEY}", "x-api-key": "other-secret-1234"})
        log.warning("the key is %s", KEY)
        eng.load()
    text = caplog.text
    assert KEY not in text and "other-secret-1234" not in text and "[redacted]" in text
    assert KEY not in repr(eng)


def test_settings_keep_references_only(hearth_home, caplog):
    from app.settings import RemoteSettings, from_dict, load_user_settings, save_user_settings

    (hearth_home / "settings.json").write_text(json.dumps({"remotes": {
        "gpu": {"url": "http://gpu:8000", "model": "Qwen/Qwen3-8B", "api_key": KEY, "n_ctx": None},
        "bad": {"url": "not a url"}, "x.y": {"url": "http://h/v1"}}}))
    with caplog.at_level(logging.WARNING):
        user = load_user_settings()
    assert list(user.remotes) == ["gpu"] and user.remotes["gpu"].url == "http://gpu:8000/v1"
    assert "remotes.gpu.api_key is ignored" in caplog.text and KEY not in caplog.text
    save_user_settings(user)
    assert KEY not in (hearth_home / "settings.json").read_text()
    assert from_dict(user.to_dict()).remotes == user.remotes
    with pytest.raises(InvalidRequest) as e:
        RemoteSettings(url="http://h/v1", api_key_env="A", api_key_keyring=True).validate("n")
    assert e.value.param == "api_key_keyring"


def test_cli_add_list_test_remove(remote, hearth_home, memory_keyring, monkeypatch, capsys):
    from app.cli import main

    remote.chat(lambda h, b: h.sse([chunk("Hello "), chunk("there.", finish="stop"), USAGE]))
    monkeypatch.setenv("GPU_KEY", KEY)
    assert main(["remote", "add", "gpu", remote.url, "--api-key-env", "GPU_KEY", "--model", "m1"]) == 0
    saved = json.loads((hearth_home / "settings.json").read_text())["remotes"]["gpu"]
    assert saved["api_key_env"] == "GPU_KEY" and saved["model"] == "m1"
    assert main(["remote", "test", "gpu"]) == 0
    out = capsys.readouterr()
    assert "Hello there." in out.out and "TTFT" in out.err and "Hearth's boundary" in out.err
    assert remote.requests[-1]["headers"]["Authorization"] == f"Bearer {KEY}"
    monkeypatch.setattr("getpass.getpass", lambda prompt="": "sk-keyring-secret-99887766")
    assert main(["remote", "add", "kr", remote.url, "--api-key-keyring"]) == 0
    assert memory_keyring.store[("hearth", "remote:kr")] == "sk-keyring-secret-99887766"
    assert main(["remote", "list"]) == 0
    listing = capsys.readouterr().out
    assert "$GPU_KEY [set (…fXYZ)]" in listing and "keyring" in listing and "[set (…7766)]" in listing
    text = (hearth_home / "settings.json").read_text()
    assert KEY not in text and "sk-keyring-secret" not in text and KEY not in listing
    assert main(["remote", "add", "bad", remote.url, "--api-key-env", KEY]) == 1  # a key pasted as the name
    assert KEY not in capsys.readouterr().err
    assert main(["remote", "remove", "kr"]) == 0 and ("hearth", "remote:kr") not in memory_keyring.store
    assert main(["remote", "remove", "kr"]) == 1
    monkeypatch.delenv("GPU_KEY")
    assert main(["remote", "test", "gpu"]) == 1
    assert "$GPU_KEY, which is not set" in capsys.readouterr().err


def test_self_consistency_samples_run_as_concurrent_remote_requests(remote):
    from app.engine.policies.consistency import parse_self_consistency
    from app.engine.policies.self_consistency import SelfConsistencyRun

    answers = iter(["The answer is 42.", "It is 41.", "I get 42."])
    lock = threading.Lock()

    def fn(h, b):
        with lock:
            text = next(answers)
        h.sse([chunk(text, finish="stop")], delay=0.05)
    remote.chat(fn)
    req = GenerateRequest(messages=USER, decoding=DecodingParams(temperature=0.7, seed=1))
    result = SelfConsistencyRun(engine(remote), req, parse_self_consistency({"n": 3})).run()
    assert "42" in result.chosen.text and len(result.dones) == 3
    assert sorted(b["seed"] for b in remote.bodies()) == [1, 2, 3]


def test_another_hearth_is_recognised_by_its_listing():
    listing = {"object": "list", "data": [], "hearth": {"pool": {"models": {"gemma": {"loaded": True}}}}}
    fake = FakeRemote()
    fake.routes[("GET", "/v1/models")] = lambda h, b: h.send_json(200, listing)
    try:
        eng = RemoteEngine("peer", fake.url)
        assert eng.load()["remote"]["model"] == "gemma" and eng.kind == "hearth"
        listing.update(data=[{"id": "a", "hearth": {"loaded": False}}, {"id": "b", "hearth": {"loaded": True}}])
        assert RemoteEngine("peer", fake.url).load()["remote"]["model"] == "b"  # the one it has loaded
    finally:
        fake.close()
