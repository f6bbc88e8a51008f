"""Many models behind the port: ``create_app(pool=...)`` over a ``ModelPool`` of fake engines (the pool's real
bookkeeping: on-demand loads, the budget, LRU eviction, TTL / ``keep_alive``, a failing load), the ``model``
field, ``/v1/models`` (loaded, memory estimate, capabilities) and ``keep_alive`` parsing; capabilities of the
real bundled GGUF (read only, nothing loaded)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from fakes import FakeEngine
from fastapi.testclient import TestClient

from app.engine.pool import GIB, ModelPool
from app.errors import InvalidRequest, ModelLoadError, ModelNotFound
from app.server import ServerThread, create_app
from app.server.models import ModelCatalog
from app.server.source import parse_keep_alive
from app.settings import ServerSettings

MODELS = {"alpha": "/m/alpha.gguf", "beta": "/m/beta.gguf", "broken": "/m/broken.gguf"}
HI = [{"role": "user", "content": "hi"}]


class Made:
    """The engines the pool made, by model id (each a ``FakeEngine`` answering ``<id>: <last message>``)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.engines: dict[str, list] = {}
        self.delay = delay

    def __call__(self, key: str, path: str):
        if key == "broken":
            raise ModelLoadError("broken.gguf: not a GGUF file", path=path)
        eng = FakeEngine(path, token_delay_s=self.delay,
                         reply=lambda req, k=key: f"{k}: {req.messages[-1].content if req.messages else req.prompt}")
        self.engines.setdefault(key, []).append(eng)
        return eng


def resolve(name):
    name = name or "alpha"
    for mid, path in MODELS.items():
        if name.lower() in (mid, path, path.rsplit("/", 1)[1]):
            return mid, path
    raise ModelNotFound(name, list(MODELS))


def make_pool(budget_gib=None, **kw):
    made = Made(kw.pop("delay", 0.0))
    pool = ModelPool(resolve, made, lambda key, path: GIB, budget_bytes=None if budget_gib is None
                     else int(budget_gib * GIB), reaper_interval_s=0, **kw)
    return pool, made


CATALOG = ModelCatalog(lambda: [(k, v, "chat") for k, v in MODELS.items()])


def client(pool, **kw) -> TestClient:
    app = create_app(settings=ServerSettings(), pool=pool, catalog=kw.pop("catalog", CATALOG), **kw)
    return TestClient(app, base_url="http://127.0.0.1:8765", raise_server_exceptions=False)


def chat(c, model=None, **kw):
    body = {"messages": HI, **({"model": model} if model else {}), **kw}
    return c.post("/v1/chat/completions", json=body)


def test_each_request_gets_the_model_it_names_loaded_on_demand():
    pool, made = make_pool()
    c = client(pool)
    assert chat(c).json()["model"] == "alpha"  # no model: the default
    r = chat(c, "beta").json()
    assert r["model"] == "beta" and r["choices"][0]["message"]["content"] == "beta: hi"
    assert chat(c, "BETA.gguf").json()["model"] == "beta"  # file name, case-insensitively
    assert list(made.engines) == ["alpha", "beta"] and len(made.engines["beta"]) == 1  # loaded once
    j = c.post("/v1/completions", json={"model": "alpha", "prompt": "x"}).json()
    assert j["choices"][0]["text"] == "alpha: x"
    assert pool.status()["alpha"]["leases"] == 0 and pool.status()["beta"]["loaded"]


def test_wrong_names_and_paths_are_404_listing_ids():
    pool, _ = make_pool()
    c = client(pool)
    e = chat(c, "gpt-4o").json()["error"]
    assert e["code"] == "model_not_found" and e["param"] == "model" and e["available"] == list(MODELS)
    e = chat(c, "/etc/passwd").json()["error"]  # never looked up on disk
    assert e["code"] == "model_not_found"


def test_a_model_that_fails_to_load_answers_its_error_others_keep_serving():
    pool, _ = make_pool()
    c = client(pool)
    r = chat(c, "broken")
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_error"
    assert "not a GGUF" in r.json()["error"]["message"]
    assert chat(c, "broken").json()["error"]["code"] == "model_load_error"  # the same answer at once
    assert chat(c, "beta").status_code == 200
    m = {x["id"]: x["hearth"] for x in c.get("/v1/models").json()["data"]}
    assert m["broken"]["pool"]["state"] == "failed" and "not a GGUF" in m["broken"]["pool"]["error"]


def test_health_reports_a_default_model_that_cannot_load():
    """/health said ok while every request for the default model was a 503 (issue 29, item 1)."""
    pool, _ = make_pool()
    c = client(pool, default_model="broken")
    assert c.get("/health").status_code == 200  # not tried yet: nothing is known to be wrong
    assert chat(c).json()["error"]["code"] == "model_load_error"
    h = c.get("/health")
    assert h.status_code == 503 and h.json()["status"] == "model_load_error" and "not a GGUF" in h.json()["error"]
    assert h.json()["pool"]["load_errors"]["broken"]["type"] == "ModelLoadError"
    ok = client(pool, default_model="alpha")  # another default on the same pool: ok, the failure still listed
    assert chat(ok).status_code == 200
    assert ok.get("/health").json()["status"] == "ok" and "broken" in ok.get("/health").json()["pool"]["load_errors"]


def test_budget_evicts_the_least_recently_used_idle_model():
    pool, made = make_pool(budget_gib=2)
    c = client(pool)
    for name in ("alpha", "beta", "alpha", "gamma-not-there"):
        chat(c, name)
    assert {k for k, s in pool.status().items() if s["loaded"]} == {"alpha", "beta"}
    MODELS["gamma"] = "/m/gamma.gguf"
    try:
        assert chat(c, "gamma").status_code == 200  # beta was used least recently: it goes
        assert {k for k, s in pool.status().items() if s["loaded"]} == {"alpha", "gamma"}
        assert ("beta", "evicted for gamma") in pool.unloads
    finally:
        del MODELS["gamma"]


def test_keep_alive_zero_unloads_after_and_strings_are_seconds():
    pool, _ = make_pool()
    c = client(pool)
    assert chat(c, "beta", keep_alive=0).status_code == 200
    assert not pool.status()["beta"]["loaded"] and ("beta", "keep_alive 0") in pool.unloads
    chat(c, "beta", hearth={"keep_alive": "5m"})
    assert pool.status()["beta"]["ttl_s"] == 300
    chat(c, "beta", keep_alive=-1)
    assert pool.status()["beta"]["ttl_s"] is None
    bad = (({"keep_alive": "soon"}, "keep_alive"), ({"hearth": {"keep_alive": [1]}}, "hearth.keep_alive"))
    for body, param in bad:
        e = chat(c, "beta", **body).json()["error"]
        assert e["param"] == param and e["code"] == "invalid_value"


@pytest.mark.parametrize("value,seconds", [(0, 0.0), (30, 30.0), (2.5, 2.5), ("300", 300.0), ("90s", 90.0),
                                           ("5m", 300.0), ("1h", 3600.0), ("500ms", 0.5), (-1, -1.0), ("-5m", -1.0),
                                           (None, None)])
def test_parse_keep_alive(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "", "5 minutes", True, float("inf"), [], 1e12])
def test_parse_keep_alive_refuses(value):
    with pytest.raises(InvalidRequest) as e:
        parse_keep_alive(value, "hearth.keep_alive")
    assert e.value.param == "hearth.keep_alive"


def test_the_lease_is_held_for_a_whole_stream_and_released_at_the_end():
    pool, made = make_pool(delay=0.02)
    with ServerThread(create_app(settings=ServerSettings(), pool=pool, catalog=CATALOG)) as srv:
        seen = []
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", timeout=30,
                          json={"model": "beta", "messages": HI, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and not seen:
                    seen.append(pool.status()["beta"]["leases"])
        assert seen == [1]
        deadline = time.monotonic() + 5
        while pool.status()["beta"]["leases"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.status()["beta"]["leases"] == 0
        # a client that leaves mid-stream releases the model too
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", timeout=30, json={
                "model": "beta", "messages": [{"role": "user", "content": "x" * 200}], "stream": True}) as r:
            next(r.iter_lines())
        deadline = time.monotonic() + 5
        while pool.status()["beta"]["leases"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.status()["beta"]["leases"] == 0


def test_requests_for_a_loading_model_wait_then_run():
    gate, entered = threading.Event(), threading.Event()
    made = Made()

    def slow(key, path):
        entered.set()
        gate.wait(5)
        return made(key, path)
    pool = ModelPool(resolve, slow, lambda k, p: GIB, reaper_interval_s=0)
    with ServerThread(create_app(settings=ServerSettings(), pool=pool, catalog=CATALOG)) as srv:
        out: list = []
        threads = [threading.Thread(target=lambda: out.append(httpx.post(
            f"{srv.url}/v1/chat/completions", json={"model": "beta", "messages": HI}, timeout=30))) for _ in range(3)]
        for t in threads:
            t.start()
        assert entered.wait(10)  # the first request is loading the model (an event, not a sleep)
        assert pool.status()["beta"]["state"] == "loading"
        gate.set()
        for t in threads:
            t.join(10)
    assert [r.status_code for r in out] == [200] * 3 and len(made.engines["beta"]) == 1


def test_models_list_every_installed_model_with_pool_state():
    pool, _ = make_pool()
    c = client(pool)
    chat(c, "beta")
    j = c.get("/v1/models").json()
    assert [m["id"] for m in j["data"]] == list(MODELS)
    h = {m["id"]: m["hearth"] for m in j["data"]}
    assert h["beta"]["loaded"] and not h["alpha"]["loaded"]
    assert set(h["alpha"]) >= {"loaded", "memory_estimate_bytes", "capabilities", "pool", "kind", "file"}
    assert h["beta"]["pool"]["memory_bytes"] == GIB and j["hearth"]["pool"]["used_bytes"] == GIB
    health = c.get("/health").json()
    assert health["status"] == "ok" and health["pool"]["models"]["beta"]["loaded"]


def test_default_model_and_its_aliases_and_the_single_engine_path_unchanged():
    pool, _ = make_pool()
    c = client(pool, default_model="/m/beta.gguf")
    assert chat(c).json()["model"] == "beta"
    assert chat(c, "/m/beta.gguf").json()["model"] == "beta"  # the default's own path is accepted
    eng = FakeEngine("fake-model.gguf")
    single = TestClient(create_app(eng, catalog=ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat"),
                                                                      ("other", "/m/other.gguf", "chat")])),
                        base_url="http://127.0.0.1:8765")
    assert chat(single, keep_alive="5m").json()["model"] == "fake-model"  # accepted, nothing to unload
    assert chat(single, "other").json()["error"]["code"] == "model_not_loaded"


@pytest.mark.model
def test_capabilities_of_the_bundled_gguf(bundled_model):
    cat = ModelCatalog(lambda: [("gemma-3-270m-q4_k_m", str(bundled_model), "chat")])
    (m,) = cat.listing(None, None, {})
    h = m["hearth"]
    assert h["capabilities"] == ["chat", "tools"] and h["tool_format"] == "json"
    assert h["thinking"] == {"family": "prefill", "native": False}  # thinks only when a budget asks
    assert 100 * 2**20 < h["memory_estimate_bytes"] < 4 * GIB and h["loaded"] is False


def test_the_desktop_port_serves_the_windows_model_and_loads_the_others_from_its_pool():
    """``create_app(engine_provider, pool=...)`` (the desktop app): the window's engine answers for its own
    model and for no ``model``; another installed model is loaded by the pool, never a second copy of the
    window's; an unknown name is still a 404."""
    window = FakeEngine("/m/alpha.gguf", reply=lambda req: "window: " + req.messages[-1].content)
    pool, made = make_pool()
    app = create_app(lambda: window, ServerSettings(), pool=pool, catalog=CATALOG)
    c = TestClient(app, base_url="http://127.0.0.1:8765", raise_server_exceptions=False)
    try:
        for model in (None, "alpha", "alpha.gguf"):
            body = {"messages": HI, **({"model": model} if model else {})}
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "window: hi"
        r = c.post("/v1/chat/completions", json={"messages": HI, "model": "beta"})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "beta: hi"
        assert r.json()["model"] == "beta" and list(made.engines) == ["beta"]  # alpha never loaded twice
        listing = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        assert listing["alpha"]["hearth"]["loaded"] and listing["beta"]["hearth"]["loaded"]
        r = c.post("/v1/chat/completions", json={"messages": HI, "model": "nope"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    finally:
        pool.close()
        window.close()


def test_the_desktop_port_lists_the_windows_model_first_and_the_pools_remotes():
    """Clients pick the first model listed: the window's (what an absent ``model`` means), then the installed
    models and the remote engines the pool serves (``hearth.remote``)."""
    window = FakeEngine("/m/beta.gguf")
    pool, _ = make_pool()
    pool.remote_names = ("gpu-box",)
    c = TestClient(create_app(lambda: window, ServerSettings(), pool=pool, catalog=CATALOG),
                   base_url="http://127.0.0.1:8765")
    try:
        data = c.get("/v1/models").json()["data"]
        assert [m["id"] for m in data] == ["beta", "alpha", "broken", "gpu-box"]
        assert data[-1]["hearth"]["remote"] is True and "remote" not in data[0]["hearth"]
        assert c.get("/v1/models/gpu-box").json()["id"] == "gpu-box"
    finally:
        pool.close()
        window.close()


def test_a_served_file_is_listed_once_first_even_when_an_installed_model_has_its_id():
    """``hearth serve --model /elsewhere/beta.gguf``: ``beta`` in a request means that file (an alias of the
    default), so the listing names it once, first, with its own path; a file outside the folder is added."""
    entries = CATALOG.entries(None, None, ["/elsewhere/beta.gguf"], ["gpu-box"])
    assert entries[0] == ("beta", "/elsewhere/beta.gguf", "chat")
    assert [e[0] for e in entries] == ["beta", "alpha", "broken", "gpu-box"]
    assert CATALOG.entries(None, None, ["/own/mine.gguf"])[0] == ("mine", "/own/mine.gguf", "chat")
    assert [e[0] for e in CATALOG.entries(None, None, ["/m/broken.gguf"])] == ["broken", "alpha", "beta"]
