"""Conversation memory with the real bundled model: a 60-turn chat at n_ctx 2048 (summaries, nothing lost,
prefix-cache reuse across turns) and a SIGKILL while an answer streams."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from app.assistant import Assistant
from app.engine.local.engine import Engine
from app.memory import Store
from app.protocol.types import DecodingParams, LoadSettings

pytestmark = pytest.mark.model


@pytest.mark.slow
def test_sixty_turns_fit_are_summarized_and_nothing_is_lost(bundled_model, tmp_path, capsys):
    n_ctx, max_tokens = 2048, 24
    store = Store(tmp_path / "hearth.db")
    cache = {"dir": str(tmp_path / "kv"), "budget_bytes": 1 << 30}
    with Engine(bundled_model, LoadSettings(n_ctx=n_ctx), prefix_cache=cache) as eng:
        session = Assistant(eng, store, decoding=DecodingParams.make(temperature=0.0, max_tokens=max_tokens),
                            system_prompt="You are a helpful assistant. Keep answers short.")
        cid = session.new_conversation("sixty turns")
        rows = []
        for i in range(60):
            text = (f"Note {i}: the courier named Alice{i} delivered {i * 7} parcels to dock {i % 9} "
                    f"on a rainy day. What should she do next?")
            r = session.send(cid, text).result
            m = r.metrics
            assert m["prompt_tokens"] + max_tokens <= n_ctx, f"turn {i} does not fit"
            parts = ("system", "summaries", "history", "evidence", "user", "template")
            assert m["prompt_tokens"] == sum(r.context[k] for k in parts), f"turn {i}: {r.context}"
            rows.append((i, m["prompt_tokens"], m["cached_tokens"], bool(r.summaries_added)))
    conv = store.load_conversation(cid)
    messages = [m for m in conv.messages]
    assert len(messages) == 120, "every original message is still stored"
    assert all(m.status == "complete" for m in messages)
    summaries = store.summaries_for(cid)
    assert summaries, "old turns were summarized"
    ids = [m.id for m in store.path_to(messages[-1].id)]
    for s in summaries:
        assert s.first_message_id in ids and s.last_message_id in ids
        assert ids.index(s.first_message_id) <= ids.index(s.last_message_id)
    hits = store.search("Alice3")
    assert any("Alice3" in h.snippet and h.role == "user" for h in hits), "original text is searchable"
    plain = [r for r in rows[1:] if not r[3]]
    reuse = sum(r[2] for r in plain) / sum(r[1] for r in plain)
    with capsys.disabled():
        print(f"\n60-turn chat, n_ctx {n_ctx}: {len(summaries)} summaries; prompt tokens reused on turns without "
              f"a new summary: {reuse:.1%} (turns: {len(plain)})")
    assert reuse > 0.5, "most prompt tokens are reused on turns that add no new summary"


_STREAMER = r"""
import sys
from app.assistant import Assistant
from app.engine.local.engine import Engine
from app.protocol.types import DecodingParams, LoadSettings
from app.memory import Store
store = Store(sys.argv[2])
with Engine(sys.argv[1], LoadSettings(n_ctx=2048)) as eng:
    # This small base model ends its answers quickly; banning its end-of-turn, newline and "User" tokens keeps
    # it writing long enough to be killed mid-answer.
    ban = set(eng.tokenize("\n") + eng.tokenize("\n\n") + eng.tokenize("User") + eng.tokenize(" User") + [1, 106])
    dec = DecodingParams.make(temperature=0.0, max_tokens=1500, logit_bias={t: -100.0 for t in ban})
    s = Assistant(eng, store, decoding=dec)
    s.session.update_interval_s = 0.05
    cid = s.new_conversation("killed")
    print(cid, flush=True)
    s.send(cid, "Count from 1 to 500: 1, 2, 3,")
"""


def test_sigkill_mid_answer_leaves_partial_answer_incomplete(bundled_model, tmp_path):
    db = tmp_path / "hearth.db"
    other = Store(db)
    keep = other.create_conversation("other conversation")
    other.append_message(keep, "user", "hello")
    other.close()
    proc = subprocess.Popen([sys.executable, "-c", _STREAMER, str(bundled_model), str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        cid = proc.stdout.readline().strip()
        deadline = time.time() + 120
        partial = ""
        while time.time() < deadline:
            time.sleep(0.3)
            probe = Store(db)
            msgs = probe.load_conversation(cid).messages
            partial = msgs[-1].content if len(msgs) == 2 else ""
            if len(partial) > 20:
                break
    finally:  # whatever happens above, the streamer (a model-loading child) does not outlive the test
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    store = Store(db)  # the store opens
    conv = store.load_conversation(cid)
    answer = conv.messages[-1]
    assert answer.role == "assistant" and answer.status == "incomplete"
    assert answer.content.startswith(partial[:20]) and len(answer.content) >= 20
    assert store.load_conversation(keep).messages[0].content == "hello"
