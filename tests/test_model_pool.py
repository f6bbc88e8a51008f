"""The model pool (app/engine/pool.py) over FakeEngines: load on demand, budget, LRU eviction, TTL and
keep_alive, a model that fails to load while others serve, waits for a loading model."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import pytest
from fakes import FakeEngine

from app.engine.pool import ModelBusy, ModelPool
from app.errors import ModelLoadError, ModelNotFound
from app.protocol.types import ChatMessage, GenerateRequest

GIB = 1 << 30
SIZES = {"a": 2 * GIB, "b": 2 * GIB, "c": 3 * GIB, "huge": 9 * GIB}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Maker:
    """FakeEngines that load slowly or fail on demand, and remember what was made and closed."""

    def __init__(self, load_delay_s: float = 0.0) -> None:
        self.made: list[str] = []
        self.closed: list[str] = []
        self.broken: set[str] = set()
        self.load_delay_s = load_delay_s

    def __call__(self, key: str, path: str):
        maker = self
        self.made.append(key)

        class E(FakeEngine):
            def __init__(self, *a, **kw):
                self._from_init = True  # FakeEngine loads itself at once; here the pool's load() is the load
                super().__init__(*a, **kw)

            def load(self):
                if self._from_init:
                    self._from_init = False
                    return {}
                if key in maker.broken:
                    raise ModelLoadError(f"{path}: not a GGUF file (bad magic)", path=path)
                time.sleep(maker.load_delay_s)
                return super().load()

            def close(self):
                maker.closed.append(key)
                super().close()

        return E(path, reply=lambda r: f"I am {key}")


MODELS = Path(tempfile.mkdtemp(prefix="hearth-pool-test-"))
for _name in SIZES:  # the files exist: a failed load is remembered by the file's size and mtime
    (MODELS / f"{_name}.gguf").write_bytes(b"GGUF")


def resolve(name):
    if name not in SIZES:
        raise ModelNotFound(name or "", sorted(SIZES))
    return name, str(MODELS / f"{name}.gguf")


def pool(maker, clock=None, **kw) -> ModelPool:
    kw.setdefault("budget_bytes", 5 * GIB)
    return ModelPool(resolve, maker, lambda k, p: SIZES[k], reaper_interval_s=0, clock=clock or time.monotonic,
                     **kw)


def ask(p: ModelPool, name: str, **kw) -> str:
    with p.acquire(name, **kw) as lease:
        return lease.engine.complete(GenerateRequest(messages=(ChatMessage("user", "hi"),))).text


def test_requests_alternating_between_models_load_and_unload_within_the_budget():
    m = Maker()
    p = pool(m)
    try:
        assert ask(p, "a") == "I am a" and ask(p, "b") == "I am b"  # 4 GiB of 5: both loaded
        assert m.made == ["a", "b"] and p.used_bytes() == 4 * GIB
        assert ask(p, "c") == "I am c"  # 3 GiB more: the least recently used (a) goes
        assert m.closed == ["a"] and p.status()["a"]["state"] == "unloaded"
        assert p.used_bytes() == 5 * GIB <= p.budget_bytes
        ask(p, "a")  # b is now the least recently used
        assert m.closed == ["a", "b"] and m.made == ["a", "b", "c", "a"]
        assert p.unloads[-1] == ("b", "evicted for a")
    finally:
        p.close()


def test_a_model_larger_than_the_budget_and_an_unknown_name_are_refused_clearly():
    p = pool(Maker())
    try:
        with pytest.raises(ModelLoadError, match=r"'huge' needs about 9.00 GiB .* budget of 5.00 GiB"):
            p.acquire("huge")
        with pytest.raises(ModelNotFound, match="available: a, b, c, huge"):
            p.acquire("nope")
    finally:
        p.close()


def test_idle_models_unload_after_their_ttl_and_keep_alive_overrides_it():
    clock, m = Clock(), Maker()
    p = pool(m, clock, ttl_s=60, ttl_for=lambda k: 5 if k == "b" else None)
    try:
        ask(p, "a")
        ask(p, "b")
        ask(p, "c", keep_alive_s=-1)  # evicts a (LRU); c stays until evicted
        clock.t += 10
        assert p.reap() == ["b"]  # b's own TTL (5 s) passed; c never expires
        clock.t += 100
        assert p.reap() == [] and p.status()["c"]["loaded"]
        ask(p, "a", keep_alive_s=0)  # unloaded right after the request
        assert p.status()["a"]["state"] == "unloaded" and m.closed[-1] == "a"
    finally:
        p.close()


def test_a_held_model_is_never_unloaded_and_a_new_one_waits_then_fails_clearly():
    clock = Clock()
    p = pool(Maker(), clock, load_timeout_s=0.0, ttl_s=1)
    try:
        lease_a, lease_b = p.acquire("a"), p.acquire("b")
        clock.t += 100
        assert p.reap() == []  # both busy
        with pytest.raises(ModelBusy, match=r"'c' .* does not fit .* while a, b are busy"):
            p.acquire("c")
        lease_b.release()
        lease_b.release()  # twice is harmless
        with p.acquire("c") as c:
            assert c.engine.complete(GenerateRequest(messages=(ChatMessage("user", "x"),))).text == "I am c"
        lease_a.release()
    finally:
        p.close()


def test_a_broken_model_answers_its_load_error_while_the_others_keep_serving(tmp_path):
    m = Maker()
    m.broken.add("b")
    p = pool(m)
    try:
        assert ask(p, "a") == "I am a"
        for _ in range(2):
            with pytest.raises(ModelLoadError, match="not a GGUF file"):
                p.acquire("b")
        assert m.made.count("b") == 1  # the unchanged file's error is answered again without a new load
        assert p.status()["b"]["state"] == "failed" and "bad magic" in p.status()["b"]["error"]
        assert ask(p, "a") == "I am a" and p.status()["a"]["loads"] == 1
    finally:
        p.close()


def test_requests_for_a_loading_model_wait_for_that_one_load():
    m = Maker(load_delay_s=0.3)
    p = pool(m)
    out = []
    try:
        threads = [threading.Thread(target=lambda: out.append(ask(p, "a"))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert out == ["I am a"] * 4 and m.made == ["a"]
    finally:
        p.close()


def test_a_remote_in_the_settings_is_a_pool_entry_whose_failure_is_tried_again():
    import socket

    from app.backends import model_pool
    from app.errors import EngineCrashed
    from app.settings import RemoteSettings, UserSettings

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    settings = UserSettings(remotes={"far": RemoteSettings(url=url, connect_timeout_s=1.0).validate("far")})
    p = model_pool(settings, budget_bytes=GIB, ttl_s=60)
    try:
        for _ in range(2):  # unreachable: an error naming it, and the next request tries again
            with pytest.raises(EngineCrashed, match="far"):
                p.acquire("far")
            assert p.status()["far"]["state"] == "unloaded"
        assert p.used_bytes() == 0
    finally:
        p.close()


def test_names_from_the_port_are_never_files_of_the_working_directory_nor_crash_on_length(tmp_path,
                                                                                          monkeypatch):
    from app.catalog.registry import resolve_model

    (tmp_path / "stray.gguf").write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFound):
        resolve_model("stray.gguf", allow_paths=False)  # a bare name is an installed model, not a local file
    assert resolve_model("stray.gguf") == (tmp_path / "stray.gguf").resolve()  # the CLI's --model still may
    with pytest.raises(ModelNotFound):
        resolve_model("a" * 100_000)  # was OSError: File name too long (a 500 at the port)
