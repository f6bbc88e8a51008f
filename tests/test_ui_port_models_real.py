"""The desktop app's port serves every installed model (issue 15): the window's own model through its
engine, another installed model loaded on demand by the port's pool (its own engine process, unloaded when
the port stops). Real bundled model; the second model is a link to it under another name."""

from __future__ import annotations

import os
import socket

import pytest

from app import paths
from tests.test_ui_window import ANSWER_MS, close_window, home_with_model, open_window  # noqa: F401

pytestmark = [pytest.mark.model, pytest.mark.gui]


def test_the_port_answers_for_another_installed_model_and_unloads_it_when_stopped(qtbot, home_with_model,  # noqa: F811
                                                                                   bundled_model):
    import httpx

    os.symlink(bundled_model, paths.models_dir() / "second-model.gguf")
    w = open_window(qtbot)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        w.port.port.setValue(port)
        w.port.enabled.setChecked(True)
        qtbot.waitUntil(lambda: w.ctx.server.running, timeout=20_000)
        url = f"http://127.0.0.1:{port}/v1"
        body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 8,
                "temperature": 0}
        out: list = []
        w.ctx.pool.run(lambda: [httpx.post(f"{url}/chat/completions", json={**body, "model": m}, timeout=120)
                                for m in ("gemma-3-270m-q4_k_m", "second-model")] + [httpx.get(f"{url}/models")],
                       on_return=out.append)
        qtbot.waitUntil(lambda: bool(out), timeout=ANSWER_MS)
        own, other, models = out[0]
        assert own.status_code == 200 and other.status_code == 200, other.text
        assert other.json()["model"] == "second-model"
        assert other.json()["choices"][0]["message"]["content"] == own.json()["choices"][0]["message"]["content"]
        loaded = {m["id"]: m["hearth"]["loaded"] for m in models.json()["data"] if m["hearth"]["kind"] == "chat"}
        assert loaded == {"gemma-3-270m-q4_k_m": True, "second-model": True}
        pool = w.ctx.server._models
        assert pool.status()["second-model"]["loads"] == 1 and "gemma-3-270m-q4_k_m" not in pool.status()
    finally:
        close_window(w)  # stops the port: the pool's engine process ends too (checked there)
