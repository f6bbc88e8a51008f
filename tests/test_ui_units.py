"""Tier 1-2 tests of the desktop app's parts without a window and without a model: pure helpers (Markdown,
formatting, recommendations, Hub client with a fake API, linking files), the item models, branches over a real
store, the workers, and the settings dialog's mapping."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from PySide6.QtCore import Qt

from app.catalog.files import link_model
from app.catalog.hub import DownloadCancelled, HubClient
from app.catalog.recommended import Recommendation, load_catalog, recommend
from app.errors import HearthError
from app.ui.formatting import (
    context_bar,
    context_tooltip,
    context_usage,
    date_group,
    file_name,
    human_bytes,
    status_texts,
)
from app.ui.markdown import code_blocks, copy_index, with_copy_links
from app.ui.models import ChatModel, ChatRow, ConversationListModel, DocRow, DocumentListModel, IdRole, KindRole

pytestmark = pytest.mark.gui


# ---------------------------------------------------------------------------------------------- pure
def test_markdown_copy_links_only_for_closed_blocks():
    md = "Intro\n\n```python\nprint(1)\n```\n\n~~~\nB\n~~~\n\n```\nstill streaming"
    out, blocks = with_copy_links(md)
    assert blocks == ["print(1)", "B"]
    assert out.count("hearth-copy:") == 2 and "still streaming" in out
    assert copy_index("hearth-copy:1") == 1 and copy_index("https://x") is None
    assert code_blocks("no code") == []


def test_formatting():
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(None) == "?"
    today = date(2026, 3, 10)
    iso = lambda d: datetime(d.year, d.month, d.day, 12, tzinfo=timezone.utc).isoformat()  # noqa: E731
    assert date_group(iso(today), today) == "Today"
    assert date_group(iso(today - timedelta(days=1)), today) == "Yesterday"
    assert date_group(iso(today - timedelta(days=5)), today) == "Previous 7 days"
    assert date_group(iso(today - timedelta(days=90)), today) == "Older"
    texts = status_texts({"ttft_s": 0.25, "decode_tps": 31.25, "prompt_tokens": 100, "cached_tokens": 80,
                          "cache_source": "memory"})
    assert texts == {"ttft": "TTFT 250 ms", "decode": "decode 31.2 tok/s",
                     "reused": "reused 80/100 prompt tokens (memory)", "thinking": ""}
    off = status_texts({"prompt_tokens": 20, "cache_error": "disk cache off: disk full: /d/kv-cache (free some)"})
    assert off["reused"] == "reused 0/20 prompt tokens · disk cache off"  # the strip says so (issue 29, item 1)
    assert "·" not in status_texts({"prompt_tokens": 5, "cache_error": "entry rejected: bad shape"})["reused"]
    thought = status_texts({"ttft_s": 0.01, "reasoning_tokens": 40, "answer_tokens": 12, "ttfat_s": 1.25,
                            "reasoning_budget": 256})
    assert thought["thinking"] == "thinking 40 tok · answer 12 tok · TTFAT 1.2 s"
    assert status_texts({"reasoning_budget": 0, "ttfat_s": 0.05})["thinking"] == (
        "thinking 0 tok · answer 0 tok · TTFAT 50 ms")
    bd = {"system": 10, "summaries": 0, "history": 30, "evidence": 50, "user": 10, "reserved": 256, "free": 700,
          "n_ctx": 1024}
    assert context_usage(bd, {"completion_tokens": 20}) == (120, 1024)  # no prompt count: the estimate
    tip = context_tooltip(bd, {"completion_tokens": 20})
    assert "Context: 120 / 1024 tokens" in tip and "Document evidence: 50" in tip


def test_context_used_is_the_real_prompt_plus_the_answer():
    # the case: the builder's per-part estimate said 16 tokens, the engine evaluated a 47-token prompt
    bd = {"system": 0, "summaries": 0, "history": 0, "evidence": 0, "user": 16, "reserved": 256, "n_ctx": 4096}
    metrics = {"prompt_tokens": 47, "completion_tokens": 5, "ttft_s": 0.1, "decode_tps": 50.0}
    assert context_usage(bd, metrics) == (52, 4096)
    assert context_bar(bd, metrics, 4096) == (52, 4096, "context 52 / 4096 tokens")
    tip = context_tooltip(bd, metrics)
    assert "Context: 52 / 4096 tokens" in tip and "as the model counted it" in tip and ": 47" in tip
    assert "Answer: 5" in tip


def test_context_bar_before_any_answer_never_reads_slash_one():
    assert context_bar({}, {}, 4096) == (0, 4096, "context 0 / 4096 tokens")  # a model is loaded
    assert context_bar({}, {}, None) == (0, 1, "context —")  # no model: an empty bar, no made-up maximum
    assert "No answer yet" in context_tooltip({}, {})


def test_status_strip_context_bar(qtbot):
    from app.ui.status_strip import StatusStrip

    strip = StatusStrip()
    qtbot.addWidget(strip)
    assert strip.context.text() == "context —" and strip.context.value() == 0
    strip.set_n_ctx(4096)
    assert strip.context.text() == "context 0 / 4096 tokens" and strip.context.maximum() == 4096
    strip.show_answer({"prompt_tokens": 47, "completion_tokens": 5}, {"user": 16, "n_ctx": 4096})
    assert strip.context.text() == "context 52 / 4096 tokens" and strip.context.value() == 52
    strip.show_answer({}, {})  # a new chat: the model's window again, nothing used
    assert strip.context.text() == "context 0 / 4096 tokens"
    strip.set_n_ctx(None)
    assert strip.context.text() == "context —"


def test_file_name_of_any_platforms_path():
    assert file_name("/home/a/notes/report.pdf") == "report.pdf"
    assert file_name(r"C:\Users\a\Documents\report.pdf") == "report.pdf"
    assert file_name("report.pdf") == "report.pdf" and file_name("") == ""


def test_recommendations_sized_to_memory():
    catalog = load_catalog()
    assert len(catalog) >= 5 and all(r.repo and r.file.endswith(".gguf") for r in catalog)
    small = recommend(catalog, ram_bytes=2_000_000_000)
    assert small[0].verdict == "fits" and small[0].min_memory_bytes <= 1_600_000_000
    big_cpu = recommend(catalog, ram_bytes=64 << 30)
    assert all((r.weights_bytes() or 0) <= 5_500_000_000 for r in big_cpu)  # no GPU: nothing too slow for a CPU
    gpu = recommend(catalog, ram_bytes=8 << 30, vram_bytes=24 << 30)
    assert gpu[0].min_memory_bytes > big_cpu[0].min_memory_bytes
    none_fit = recommend(catalog, ram_bytes=100 << 20)
    assert none_fit and none_fit[0].verdict == "won't fit"


class FakeApi:
    def list_models(self, **kw):
        assert kw["filter"] == "gguf"
        return [SimpleNamespace(id="org/tiny-GGUF", downloads=10)]

    def list_repo_tree(self, repo, recursive=False):
        return [SimpleNamespace(path="tiny-Q4_K_M.gguf", size=100), SimpleNamespace(path="mmproj-f16.gguf", size=5),
                SimpleNamespace(path="README.md", size=1)]


def fake_download(payload: bytes, cancel_after: int | None = None):
    """An ``hf_hub_download`` stand-in that streams ``payload`` through ``tqdm_class`` in 10-byte steps,
    resuming from a ``.incomplete`` file like huggingface_hub does."""

    def download(repo_id, filename, local_dir, tqdm_class):
        part = Path(local_dir) / ".cache" / (filename + ".incomplete")
        part.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.exists() else 0
        bar = tqdm_class(total=len(payload), initial=have, unit="B")
        with open(part, "ab") as f:
            for i in range(have, len(payload), 10):
                if cancel_after is not None and i >= cancel_after:
                    download.cancel.set()
                chunk = payload[i:i + 10]
                bar.update(len(chunk))  # raises DownloadCancelled once cancel is set
                f.write(chunk)
        bar.close()
        final = Path(local_dir) / filename
        part.replace(final)
        return str(final)

    return download


def test_hub_search_files_and_resumable_download(tmp_path):
    payload = bytes(range(256)) * 4
    cancel = threading.Event()
    dl = fake_download(payload, cancel_after=500)
    dl.cancel = cancel
    hub = HubClient(api=FakeApi(), download=dl)
    assert [m.repo for m in hub.search("tiny")] == ["org/tiny-GGUF"]
    assert [f.path for f in hub.files("org/tiny-GGUF")] == ["tiny-Q4_K_M.gguf"]
    seen: list[tuple[int, int | None]] = []
    with pytest.raises(DownloadCancelled):
        hub.download("org/tiny-GGUF", "tiny-Q4_K_M.gguf", lambda d, t: seen.append((d, t)), cancel, tmp_path)
    assert seen[-1][0] == 500 and not (tmp_path / "tiny-Q4_K_M.gguf").exists()
    cancel.clear()
    dl2 = fake_download(payload)
    resumed: list[tuple[int, int | None]] = []
    path = HubClient(api=FakeApi(), download=dl2).download("org/tiny-GGUF", "tiny-Q4_K_M.gguf",
                                                            lambda d, t: resumed.append((d, t)), cancel, tmp_path)
    assert path.read_bytes() == payload
    assert resumed[0][0] == 510 and resumed[-1] == (len(payload), len(payload))  # resumed, not restarted


def test_hub_errors_are_one_line():
    class Down:
        def list_models(self, **kw):
            raise ValueError("rate limited")

    with pytest.raises(HearthError, match="search failed: ValueError: rate limited"):
        HubClient(api=Down()).search("x")


def test_link_model_links_in_place(tmp_path):
    src = tmp_path / "elsewhere" / "m.gguf"
    src.parent.mkdir()
    src.write_bytes(b"GGUF")
    folder = tmp_path / "models"
    folder.mkdir()
    link = link_model(src, folder)
    assert link.is_symlink() and link.resolve() == src.resolve()
    assert link_model(src, folder) == link  # the same file twice: one link
    other = tmp_path / "m.gguf"
    other.write_bytes(b"GGUF2")
    assert link_model(other, folder).name == "m-2.gguf"
    with pytest.raises(HearthError, match="not a .gguf"):
        link_model(tmp_path / "x.txt", folder)


# ---------------------------------------------------------------------------------------------- models
def test_conversation_model_groups_by_date_and_shows_hits():
    now = datetime.now(timezone.utc)
    conv = lambda i, days: SimpleNamespace(id=f"c{i}", title=f"chat {i}", message_count=2,  # noqa: E731
                                           updated=(now - timedelta(days=days)).isoformat())
    m = ConversationListModel()
    m.set_conversations([conv(1, 0), conv(2, 0), conv(3, 40)])
    texts = [m.index(i).data() for i in range(m.rowCount())]
    assert texts == ["Today", "chat 1", "chat 2", "Older", "chat 3"]
    assert m.flags(m.index(0)) == Qt.ItemFlag.NoItemFlags and m.index(1).data(IdRole) == "c1"
    assert m.row_of("c3") == 4
    hit = SimpleNamespace(conversation_id="c2", conversation_title="chat 2", message_id="m9", role="user",
                          snippet="the [launch] code")
    other = SimpleNamespace(**{**hit.__dict__, "message_id": "m10", "snippet": "a second [launch] date"})
    m.set_hits("launch", [hit, other])
    assert m.rowCount() == 3 and m.index(1).data(KindRole) == "hit"
    # The match leads, the chat follows: two hits in one chat no longer read the same (issue 27)
    assert m.index(1).data() == "the [launch] code\n   in chat 2"
    assert m.index(2).data() == "a second [launch] date\n   in chat 2"
    assert m.index(1).data(Qt.ItemDataRole.ToolTipRole) == "chat 2\nuser: the [launch] code"


def test_document_model_status_and_per_conversation_choice():
    m = DocumentListModel()
    m.set_documents([DocRow("/d/b.txt", "indexed", chunks=3), DocRow("/d/a.pdf", "failed", "password-protected")])
    assert m.index(0).data().startswith("a.pdf — failed (password-protected)")
    assert m.index(0).data(Qt.ItemDataRole.CheckStateRole) is None  # only indexed documents are choosable
    assert m.index(1).data(Qt.ItemDataRole.CheckStateRole) == Qt.CheckState.Checked  # None = all
    changes = []
    m.selection_changed.connect(lambda: changes.append(m.selected_paths()))
    m.setData(m.index(1), Qt.CheckState.Unchecked, Qt.ItemDataRole.CheckStateRole)
    assert changes == [[]]
    m.update_status(DocRow("/d/c.md", "indexed", chunks=1))
    m.update_status(DocRow("/d/b.txt", "removed"))
    assert [m.item(i).path for i in range(m.rowCount())] == ["/d/a.pdf", "/d/c.md"]


def test_chat_model_streams_into_last_row():
    m = ChatModel()
    changed = []
    m.dataChanged.connect(lambda a, b, *_: changed.append(a.row()))
    m.append(ChatRow(None, "user", "hi"))
    m.append(ChatRow(None, "assistant", "", streaming=True))
    m.append_text("Hel")
    m.append_text("lo")
    assert m.item(1).content == "Hello" and changed == [1, 1]


# ---------------------------------------------------------------------------------------------- branches
def test_branches_follow_edits_and_regenerations():
    from app.memory.store import Store
    from app.ui.branches import branch_rows, descend, sibling_tip

    s = Store(":memory:")
    cid = s.create_conversation("t")
    u1 = s.append_message(cid, "user", "first")
    a1 = s.append_message(cid, "assistant", "answer one", u1)
    a2 = s.append_message(cid, "assistant", "answer two", u1)
    s.add_citations(a2, [{"evidence_id": "e1", "path": "/d/x.txt", "page": None, "quote": "q"}])
    rows = branch_rows(s, cid, None)
    assert [r.content for r in rows] == ["first", "answer two"]
    assert rows[1].siblings == (2, 2) and rows[1].citations[0]["evidence_id"] == "e1"
    tip = sibling_tip(s, rows[1], -1)
    assert tip == a1 and sibling_tip(s, rows[1], +1) is None
    assert descend(s, u1) == a2
    s.close()


# ---------------------------------------------------------------------------------------------- workers
def test_generator_worker_streams_returns_and_quits(qtbot):
    from app.ui.workers import GeneratorWorker, WorkerPool

    pool = WorkerPool()
    got, result = [], []

    def numbers(n):
        for i in range(n):
            yield i
        return "done"

    w = GeneratorWorker(numbers, 5)
    with qtbot.waitSignal(w.signals.finished, timeout=5000):
        pool.start(w, on_yield=got.append, on_return=result.append)
    assert got == [0, 1, 2, 3, 4] and result == ["done"]

    closed = threading.Event()

    def endless():
        try:
            while True:
                yield 1
        finally:
            closed.set()

    w2 = GeneratorWorker(endless)
    with qtbot.waitSignal(w2.signals.finished, timeout=5000):
        pool.start(w2, on_yield=lambda _x: w2.quit())
    qtbot.waitUntil(lambda: pool.active == 0, timeout=5000)
    assert closed.is_set() and pool.shutdown(5000)


def test_settings_page_round_trip_and_per_model_override(qtbot):
    from app.settings import UserSettings
    from app.ui.settings_page import SettingsPage

    base = UserSettings()
    dlg = SettingsPage(base, "my-model")
    qtbot.addWidget(dlg)
    dlg.n_ctx.setValue(8192)
    dlg.temperature.setValue(0.3)
    dlg.seed.setValue(-1)
    dlg.system_prompt.setPlainText("Be brief.")
    out = dlg.result_settings()
    assert out.load.n_ctx == 8192 and out.decoding.temperature == 0.3 and out.decoding.seed is None
    assert out.system_prompt == "Be brief." and out.per_model == {}
    dlg.per_model.setChecked(True)
    dlg.n_gpu_layers.setValue(-1)
    out2 = dlg.result_settings()
    assert out2.load == base.load and out2.per_model["my-model"] == {"n_ctx": 8192, "n_gpu_layers": -1}
    assert out2.load_for("my-model").n_ctx == 8192 and out2.load_for("other").n_ctx == base.load.n_ctx
    dlg.type_v.setCurrentText("q8_0")
    dlg.flash_attn.setChecked(False)
    assert not dlg.apply()  # invalid: a quantized V cache needs flash attention → names the field
    assert "type_v" in dlg.error.text()


def test_server_texts():
    from app.settings import ServerSettings
    from app.ui.server_ctl import base_url, curl_example, new_api_key

    s = replace(ServerSettings(), port=9000, api_key="k1")
    assert base_url(s) == "http://127.0.0.1:9000/v1"
    assert 'Authorization: Bearer k1' in curl_example(s, "m") and '"model": "m"' in curl_example(s, "m")
    assert new_api_key() != new_api_key()


def test_recommendation_is_a_value():
    r = Recommendation("id", "n", "r", "f.gguf", 1, 2, "b", "l")
    assert r.verdict == "unknown"


def test_a_title_of_only_spaces_is_refused_and_the_old_one_kept(qtbot, memory_store, monkeypatch):
    """Issue 27 trial, defect 7: renaming a chat to spaces saved an empty title."""
    from app.ui import sidebar as sidebar_mod

    store = memory_store
    a = store.create_conversation("Trip planning")
    bar = sidebar_mod.Sidebar(store)
    qtbot.addWidget(bar)
    bar.refresh()
    assert bar.rename(a, "   ") is False and store.get_conversation(a).title == "Trip planning"
    answers, prompts = [("  ", True), ("Travel", True)], []

    def get_text(_parent, _title, label, text=""):
        prompts.append(label)
        return answers.pop(0)

    monkeypatch.setattr(sidebar_mod.QInputDialog, "getText", get_text)
    assert bar.rename(a) is True and store.get_conversation(a).title == "Travel"
    assert prompts[0] == "Title:" and "cannot be empty" in prompts[1]  # the dialog said why and asked again


def test_sidebar_rename_delete_search(qtbot, memory_store):
    from app.ui.sidebar import Sidebar

    store = memory_store
    a = store.create_conversation("Trip planning")
    store.append_message(a, "user", "Which ferry goes to Lindholm?")
    b = store.create_conversation("Recipes")
    store.append_message(b, "user", "How long do I boil an egg?")
    bar = Sidebar(store)
    qtbot.addWidget(bar)
    bar.refresh()
    assert [bar.model.index(i).data() for i in range(bar.model.rowCount())] == ["Today", "Recipes", "Trip planning"]
    bar.rename(a, "Travel")  # keeps its place (it jumped to the top, away from the mouse: issue 27)
    assert [bar.model.index(i).data() for i in range(bar.model.rowCount())] == ["Today", "Recipes", "Travel"]
    from app.ui.sidebar import delete_question

    assert "“Travel”" in delete_question(store.get_conversation(a).title)  # the confirmation names the chat
    assert "“" + "x" * 59 + "…”" in delete_question("x" * 80) and "“New chat”" in delete_question(None)
    picked = []
    bar.selected.connect(lambda cid, mid: picked.append((cid, mid)))
    bar.search.setText("ferry")
    qtbot.waitUntil(lambda: bar.model.rowCount() == 2, timeout=2000)  # header + one hit, after the debounce
    bar.view.clicked.emit(bar.model.index(1))
    assert picked and picked[0][0] == a and picked[0][1]
    bar.search.clear()
    deleted = []
    bar.deleted.connect(deleted.append)
    bar.delete(b, confirm=False)
    qtbot.waitUntil(lambda: bar.model.rowCount() == 2, timeout=2000)
    assert deleted == [b] and bar.model.index(1).data() == "Travel"
    # the search debounce started by clear() must not fire after the store is closed (in a later test)
    qtbot.waitUntil(lambda: not bar._debounce.isActive(), timeout=2000)


def test_exact_breakdown_lists_the_template_part():
    bd = {"system": 3, "summaries": 0, "history": 10, "evidence": 0, "user": 12, "template": 22, "reserved": 16,
          "free": 4033, "n_ctx": 4096}
    tip = context_tooltip(bd, {"prompt_tokens": 47, "completion_tokens": 2})
    assert "Per part:" in tip and "Estimated" not in tip and "Chat template (role markers, BOS): 22" in tip


# ---------------------------------------------------------------------------------------------- the service
def test_service_probe_and_text():
    import http.server
    import socket
    import threading

    from app.ui.service_ctl import probe, service_text

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert probe("127.0.0.1", free) is None and service_text(None, free, False) == ""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server API
            body = b'{"status": "no_model"}' if self.path == "/health" else b"{}"
            self.send_response(503 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        health = probe("127.0.0.1", srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()
    assert health == {"status": "no_model"}  # a 503 no_model is a Hearth server that is running
    assert "service running on :8765 · no model" in service_text(health, 8765, False)
    assert "connect" in service_text({"status": "ok", "model": "m"}, 8765, False)
    assert service_text({"status": "ok"}, 8765, True) == "service :8765 · connected"


def test_documents_indicator_names_what_the_chat_uses():
    from app.ui.formatting import documents_indicator

    assert documents_indicator([]) == ("", "")  # a new chat: none attached, nothing shown
    text, tip = documents_indicator(["/d/ferries.txt", "/d/cake.pdf"])
    assert text == "▤ Documents: 2" and tip.splitlines()[1:] == ["ferries.txt", "cake.pdf"]
    assert documents_indicator(None)[0] == "▤ All documents"  # a chat from before per-chat documents
    many = documents_indicator([f"/d/n{i}.txt" for i in range(20)])[1]
    assert many.endswith("… and 8 more")
