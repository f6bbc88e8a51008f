"""The ``hearth`` command as a person runs it (separate processes, the real bundled model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.local.layout import TAIL_SPLIT

pytestmark = pytest.mark.model

LONG = ("The old lighthouse stood on the northern cape for two hundred years, and every night its keeper "
        "wound the clockwork that turned the great lens. ") * 20


def hearth(home: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HEARTH_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture()
def home(tmp_path: Path, bundled_model: Path) -> Path:
    h = tmp_path / "home"
    (h / "models").mkdir(parents=True)
    (h / "models" / bundled_model.name).symlink_to(bundled_model)
    return h


def test_second_generate_process_restores_the_prompt_from_disk(home: Path):
    args = ("generate", LONG, "--max-tokens", "16", "--temperature", "0", "--json")
    first = json.loads(hearth(home, *args).stdout)
    second = json.loads(hearth(home, *args).stdout)
    assert first["metrics"]["cache_source"] == "none"
    assert second["metrics"]["cache_source"] == "disk"
    # all but the last token, or but a tail shorter than TAIL_SPLIT that goes in with it (docs/prefix-cache.md)
    assert 0 < second["metrics"]["prompt_tokens"] - second["metrics"]["cached_tokens"] <= TAIL_SPLIT
    assert second["metrics"]["cached_tokens"] >= 256
    assert second["text"] == first["text"]
    assert second["metrics"]["ttft_s"] < first["metrics"]["ttft_s"]
    assert second["prefix_cache"]["bytes_on_disk"] > 0
    off = json.loads(hearth(home, *args, "--no-prefix-cache").stdout)
    assert off["metrics"]["cache_source"] == "none" and off["text"] == first["text"]


@pytest.mark.parametrize("args,words", [
    (("generate", "hi", "--temperature", "-1"), "temperature"),
    (("generate", "hi", "--max-tokens", "0"), "max_tokens"),
    (("generate", "hi", "--top-p", "2"), "top_p"),
    (("generate", "hi", "--type-v", "q4_0", "--no-flash-attn"), "flash"),
    (("generate", "hi", "--model", "no-such-model"), "not found"),
    (("generate", "word " * 400, "--n-ctx", "128"), "context window"),
])
def test_known_errors_print_one_line_and_exit_1(home: Path, args, words):
    r = hearth(home, *args)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("hearth: error:")]
    assert len(lines) == 1 and words in lines[0], r.stderr[-2000:]


def test_bad_model_file_is_named(home: Path, tmp_path: Path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(os.urandom(4096))
    r = hearth(home, "generate", "hi", "--model", str(bad))
    assert r.returncode == 1 and "not a GGUF" in r.stderr and "Traceback" not in r.stderr


def test_chat_new_then_continue_then_history(home: Path):
    first = json.loads(hearth(home, "chat", "--new", "--message", "What is the capital of France?", "--json",
                              "--temperature", "0", "--max-tokens", "16").stdout)
    assert "Paris" in first["text"] and first["finish_reason"] == "stop"
    assert {"conversation_id", "message_id", "text", "metrics", "context"} <= set(first)
    assert first["context"]["n_ctx"] >= first["context"]["user"] > 0
    cid = first["conversation_id"]
    second = json.loads(hearth(home, "chat", "--conversation", cid[:10], "--message", "And of Italy?", "--json",
                               "--temperature", "0", "--max-tokens", "16").stdout)
    assert second["conversation_id"] == cid
    assert second["context"]["history"] > 0, "the first turn is in the second prompt"
    shown = json.loads(hearth(home, "history", "show", cid, "--json").stdout)
    roles = [m["role"] for m in shown["messages"]]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert all(m["status"] == "complete" for m in shown["messages"])
    assert shown["messages"][0]["content"] == "What is the capital of France?"
    r = hearth(home, "history", "show", "nonexistent")
    assert r.returncode == 1 and "Traceback" not in r.stderr


def test_interactive_chat_left_before_a_message_stores_no_conversation(home: Path):
    """`hearth chat` created its conversation at start: /quit (or /new) before a message left an empty chat."""
    env = {**os.environ, "HEARTH_HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "app.cli", "chat", "--no-mcp"], input="/new\n/quit\n",
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "a new conversation" in r.stderr, r.stderr[-2000:]
    assert json.loads(hearth(home, "history", "list", "--json").stdout) == {"conversations": []}


def test_chat_with_docs_goes_through_the_turn_pipeline(home: Path, tmp_path: Path):
    """``hearth ingest`` then ``hearth chat --docs``: the passage is given to the model (one header), the
    answer and its citations are stored, and the conversation records the model id without ".gguf"."""
    doc = tmp_path / "notes.txt"
    doc.write_text("The code word is PELICAN.\n", encoding="utf-8")
    assert hearth(home, "ingest", str(doc)).returncode == 0
    r = hearth(home, "chat", "--docs", "--new", "--message", "What is the code word?", "--json",
               "--temperature", "0", "--max-tokens", "16")
    out = json.loads(r.stdout)
    (given,) = out["evidence"]
    assert given["text"].strip() == "The code word is PELICAN." and given["path"] == str(doc)
    assert out["context"]["evidence"] > 0 and "PELICAN" in out["text"]
    assert all(c["evidence_id"] == given["evidence_id"] for c in out["citations"])
    shown = json.loads(hearth(home, "history", "show", out["conversation_id"], "--json").stdout)
    assert shown["conversation"]["model"] == "gemma-3-270m-q4_k_m"
    stored = shown["messages"][-1]
    assert stored["content"] == out["text"] and stored["status"] == "complete"
    assert [c["evidence_id"] for c in shown["citations"]] == [c["evidence_id"] for c in out["citations"]]
