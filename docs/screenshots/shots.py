"""What the screenshot scripts share (render_window.py, render_reasoning.py, render_tools.py): an Xvfb display,
a temporary HEARTH_HOME with the bundled model linked in, and an event loop that waits for the window.
Imported from the scripts' own folder (they add it to ``sys.path``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def xvfb(display: str, size: str) -> Iterator[None]:
    """A running ``Xvfb display`` of ``size`` ("WxHxDEPTH"), ended afterwards whatever happens."""
    proc = subprocess.Popen(["Xvfb", display, "-screen", "0", size, "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        yield
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def in_xvfb(display: str, size: str) -> Iterator[str]:
    """This process on a fresh Xvfb (xcb platform) with a temporary HEARTH_HOME (its path)."""
    with xvfb(display, size), tempfile.TemporaryDirectory() as home:
        os.environ.update(DISPLAY=display, QT_QPA_PLATFORM="xcb", HEARTH_HOME=home)
        yield home


def spin(app: Any, cond: Callable[[], bool], timeout_s: float = 240) -> None:
    """Run Qt's event loop until ``cond()`` (TimeoutError after ``timeout_s`` seconds)."""
    from PySide6.QtCore import QEventLoop

    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)


def pause(app: Any, seconds: float) -> None:
    """Run Qt's event loop for ``seconds``."""
    end = time.monotonic() + seconds
    spin(app, lambda: time.monotonic() > end)


def setup_home(max_tokens: int) -> None:
    """The bundled model and the embedding model linked into HEARTH_HOME, greedy answers of at most
    ``max_tokens`` tokens."""
    from app import paths
    from app.catalog.bundled import ensure_bundled_model
    from app.protocol.types import DecodingParams, LoadSettings
    from app.retrieval.embed_model import default_embedding_model_path, ensure_embedding_model
    from app.settings import UserSettings, save_user_settings

    paths.bundled_model_path().symlink_to(ensure_bundled_model(REPO / ".cache/models/gemma-3-270m-q4_k_m.gguf"))
    emb = ensure_embedding_model(REPO / ".cache/models/embeddings/all-MiniLM-L6-v2-f16.gguf")
    if emb is not None:  # hybrid search, as after `make run`
        default_embedding_model_path().parent.mkdir(parents=True, exist_ok=True)
        default_embedding_model_path().symlink_to(emb)
    save_user_settings(UserSettings(load=LoadSettings(n_ctx=2048),
                                    decoding=DecodingParams(temperature=0.0, max_tokens=max_tokens)))


def add_mcp_server() -> None:
    """The MCP test server as ``calc`` in the temporary HEARTH_HOME's mcp.json."""
    import json
    import sys

    from app import paths

    server = {"command": sys.executable, "args": [str(REPO / "tests/mcp_servers/tool_server.py")],
              "disabledTools": ["big", "crash", "fail", "grow", "header", "slow"]}
    (paths.home() / "mcp.json").write_text(json.dumps({"mcpServers": {"calc": server}}, indent=2))
