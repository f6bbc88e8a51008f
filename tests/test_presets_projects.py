"""Presets and projects (app.memory.presets, app.memory.library): they survive a restart of the store and an
export/import round trip; a bad file names the field and changes nothing; a chat's layers resolve in order."""

from __future__ import annotations

import json

import pytest

from app.errors import InvalidRequest
from app.memory import Store
from app.memory.presets import parse_presets
from app.protocol.types import DecodingParams


def _fill(store: Store) -> tuple[str, str, str]:
    brief = store.create_preset("Brief", "Answer in one sentence.", {"temperature": 0.2, "max_tokens": 64},
                                model="gemma-3-270m-q4_k_m")
    store.create_preset("Coder", "You write Python.", {"top_k": 20, "stop": ["\n\n\n"]})
    proj = store.create_project("Garden", preset_id=brief.id, documents=["/d/roses.md", "/d/soil.pdf"])
    cid = store.create_conversation(title="Roses")
    store.set_conversation_project(cid, proj.id)
    return brief.id, proj.id, cid


def test_presets_and_projects_survive_a_restart(tmp_path):
    path = tmp_path / "hearth.db"
    with Store(path) as store:
        brief, proj, cid = _fill(store)
        store.set_conversation_system_prompt(cid, "Talk about roses only.")
    with Store(path) as store:  # a new process opening the same file
        assert [p.name for p in store.presets()] == ["Brief", "Coder"]
        p = store.preset(brief)
        assert (p.system_prompt, p.decoding, p.model) == ("Answer in one sentence.",
                                                          {"temperature": 0.2, "max_tokens": 64},
                                                          "gemma-3-270m-q4_k_m")
        project = store.project(proj)
        assert (project.name, project.preset_id, project.documents) == ("Garden", brief,
                                                                         ["/d/roses.md", "/d/soil.pdf"])
        setup = store.setup(cid)
        assert setup.project.id == proj and setup.preset.id == brief and setup.preset_source == "project"
        assert setup.system_prompt == "Talk about roses only." and setup.own_system_prompt


def test_export_import_round_trip(tmp_path):
    with Store(tmp_path / "a.db") as a:
        _fill(a)
        exported = a.export_presets()
        before = [p.to_dict() for p in a.presets()]
    doc = json.loads(exported)
    assert doc["format"] == "hearth.presets" and doc["version"] == 1
    with Store(tmp_path / "b.db") as b:
        ids = b.import_presets(exported)
        assert len(ids) == 2
        assert [p.to_dict() for p in b.presets()] == before
        assert b.export_presets() == exported  # byte for byte
        # importing again updates in place (same ids), nothing duplicated
        assert b.import_presets(exported) == ids and len(b.presets()) == 2


def test_preset_decoding_applies_over_the_defaults(memory_store):
    p = memory_store.create_preset("Cold", decoding={"temperature": 0.0})
    d = p.decoding_over(DecodingParams.make(temperature=0.8, top_k=33, max_tokens=100))
    assert (d.temperature, d.top_k, d.max_tokens) == (0.0, 33, 100)


@pytest.mark.parametrize("doc, field", [
    ({"presets": [{"name": "ok"}, {"name": "hot", "decoding": {"temperature": 500}}]},
     "presets[1].decoding.temperature"),
    ({"presets": [{"name": "x", "decoding": {"temprature": 1}}]}, "presets[0].decoding.temprature"),
    ({"presets": [{"name": ""}]}, "presets[0].name"),
    ({"presets": [{"system_prompt": "no name"}]}, "presets[0].name"),
    ({"presets": [{"name": "x", "system_prompt": 3}]}, "presets[0].system_prompt"),
    ({"presets": [{"name": "x", "colour": "red"}]}, "presets[0].colour"),
    ({"presets": [{"name": "a"}, {"name": "A"}]}, "presets[1].name"),
    ({"presets": {"name": "x"}}, "presets"),
    ({"format": "other", "presets": []}, "format"),
    ({"version": 99, "presets": []}, "version"),
])
def test_a_bad_file_names_the_field_and_changes_nothing(memory_store, doc, field):
    memory_store.create_preset("ok", "kept", {"temperature": 0.5})
    before = memory_store.export_presets()
    with pytest.raises(InvalidRequest) as err:
        memory_store.import_presets(json.dumps(doc))
    assert err.value.param == field and field in str(err.value)
    assert memory_store.export_presets() == before  # nothing lost, nothing half-imported


def test_not_json_is_a_clear_error(memory_store):
    with pytest.raises(InvalidRequest, match="not JSON"):
        memory_store.import_presets("{nope")


def test_a_single_preset_object_imports():
    assert parse_presets({"name": "One", "decoding": {"seed": 7}})[0]["decoding"] == {"seed": 7}


def test_names_are_unique_and_layers_resolve(memory_store):
    s = memory_store
    a = s.create_preset("A", "prompt A")
    b = s.create_preset("B", "prompt B")
    with pytest.raises(InvalidRequest, match="already exists"):
        s.create_preset("a")
    proj = s.create_project("P", preset_id=a.id)
    with pytest.raises(InvalidRequest, match="already exists"):
        s.create_project("p")
    cid = s.create_conversation()
    assert s.setup(cid).preset is None and s.setup(cid).system_prompt is None
    assert s.setup(None, proj.id).preset.id == a.id  # a new chat of the project, not stored yet
    s.set_conversation_project(cid, proj.id)
    assert s.setup(cid).system_prompt == "prompt A"
    s.set_conversation_preset(cid, b.id)  # the chat's own preset wins over the project's
    assert (s.setup(cid).preset.id, s.setup(cid).preset_source) == (b.id, "chat")
    s.delete_preset(b.id)  # the chat falls back to its project's
    assert s.setup(cid).preset.id == a.id
    s.delete_project(proj.id)  # the chat stays, outside any project
    assert s.setup(cid).project is None and s.get_conversation(cid).settings == {}


def test_project_documents_and_rename(memory_store):
    p = memory_store.create_project("Docs")
    assert p.documents is None
    p = memory_store.update_project(p.id, name="Papers", documents=[])
    assert (p.name, p.documents) == ("Papers", [])
    with pytest.raises(InvalidRequest) as err:
        memory_store.update_project(p.id, documents="all")
    assert err.value.param == "documents"


# ---------------------------------------------------------------------------------------------- in the window
@pytest.mark.gui
def test_presets_dialog_saves_exports_and_refuses_a_bad_import(qtbot, memory_store, tmp_path):
    from app.ui.presets_dialog import PresetsDialog

    dlg = PresetsDialog(memory_store)
    qtbot.addWidget(dlg)
    dlg.name.setText("Terse")
    dlg.prompt.setPlainText("One line.")
    dlg.spins["temperature"].setValue(0.3)
    dlg.save()
    p = memory_store.preset_named("Terse")
    assert p is not None and p.decoding == {"temperature": 0.3} and dlg.error.text() == ""
    out = tmp_path / "presets.json"
    dlg.export_path(str(out))
    assert json.loads(out.read_text())["presets"][0]["name"] == "Terse"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"presets": [{"name": "New"}, {"name": "X", "decoding": {"top_p": 7}}]}))
    dlg.import_path(str(bad))
    assert "presets[1].decoding.top_p" in dlg.error.text()
    assert [x.name for x in memory_store.presets()] == ["Terse"]


def test_a_chats_turn_uses_its_preset_and_own_prompt(memory_store):
    from app.settings import UserSettings
    from app.ui.chat_ctl import chat_setup

    user = UserSettings(system_prompt="default prompt")
    cid = memory_store.create_conversation()
    assert chat_setup(memory_store, cid, user) == (user.decoding, "default prompt")
    p = memory_store.create_preset("Cold", "preset prompt", {"temperature": 0.0, "max_tokens": 32})
    memory_store.set_conversation_preset(cid, p.id)
    decoding, prompt = chat_setup(memory_store, cid, user)
    assert (decoding.temperature, decoding.max_tokens, decoding.top_k, prompt) == (0.0, 32, user.decoding.top_k,
                                                                                   "preset prompt")
    memory_store.set_conversation_system_prompt(cid, "")  # an empty own prompt is a choice too
    assert chat_setup(memory_store, cid, user)[1] == ""


@pytest.mark.gui
def test_header_and_panel_show_and_edit_the_system_prompt(qtbot, memory_store):
    from PySide6.QtWidgets import QComboBox

    from app.ui.chat_header import ChatHeader
    from app.ui.chat_panel import ChatPanel

    p = memory_store.create_preset("Brief", "Be brief.")
    proj = memory_store.create_project("Work", preset_id=p.id)
    cid = memory_store.create_conversation(title="Plans", settings={"project": proj.id})
    h, panel = ChatHeader(), ChatPanel(QComboBox(), QComboBox())
    qtbot.addWidget(h)
    qtbot.addWidget(panel)
    setup = memory_store.setup(cid)
    h.show_chat("Plans", setup.project.name)
    panel.show_setup(setup, memory_store.presets(), "default")
    assert h.title.text() == "Plans" and h.project.text() == "in Work"
    assert panel.preset.currentText() == "project's (Brief)"
    assert panel.prompt.toPlainText() == "Be brief." and "preset Brief" in panel.source.text()
    assert not panel.reset.isEnabled()  # no own prompt to drop yet
    panel.prompt.setPlainText("Be very brief.")
    with qtbot.waitSignal(panel.system_prompt_saved) as sig:
        panel.save.click()
    assert sig.args == ["Be very brief."]


@pytest.mark.gui
def test_sidebar_groups_chats_under_projects(qtbot, memory_store):
    from app.ui.models import KindRole
    from app.ui.sidebar import Sidebar

    proj = memory_store.create_project("Garden")
    a = memory_store.create_conversation(title="Roses")
    memory_store.create_conversation(title="Taxes")
    bar = Sidebar(memory_store)
    qtbot.addWidget(bar)
    bar.move_to(a, proj.id)
    texts = [(bar.model.index(i).data(KindRole), bar.model.index(i).data().strip())
             for i in range(bar.model.rowCount())]
    assert texts == [("project", "▾ Garden"), ("conversation", "Roses"), ("header", "Today"),
                     ("conversation", "Taxes")]
