"""Presets and projects in the conversation store (tables of ``m006_presets_projects``), as a mixin of ``Store``.

Presets and projects are ordinary editable rows, apart from the append-only history; a conversation's
project, preset and own system prompt are keys of its settings, resolved by ``setup``.

The reasoning: docs/memory.md, 'app/memory/library.py'.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from app.errors import InvalidRequest, StoreError
from app.memory.presets import Preset, Project, check_name, check_preset, export_presets, parse_presets
from app.memory.records import dumps_json, loads_json, now

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setup:
    """How a conversation answers: its ``project`` and the ``preset`` in force (each None when there is none),
    ``preset_source`` ("chat", "project" or ""), and ``system_prompt``: the chat's own when it has one, else
    the preset's, else None (the person's default applies)."""

    project: Project | None
    preset: Preset | None
    preset_source: str
    system_prompt: str | None
    own_system_prompt: bool


class PresetsProjects:
    """Preset and project rows, and a conversation's membership (mixed into ``Store``)."""

    # provided by Store
    _tx: Any
    _rows: Any
    get_conversation: Any
    update_conversation: Any

    # ---- presets -----------------------------------------------------------------------------------------

    @staticmethod
    def _preset(row: dict) -> Preset:
        return Preset(id=row["id"], name=row["name"], system_prompt=row["system_prompt"] or "",
                      decoding=loads_json(row["decoding"], f"preset {row['id']}: decoding", None), model=row["model"],
                      created=row["created"], updated=row["updated"])

    def presets(self) -> list[Preset]:
        """Every preset, by name."""
        return [self._preset(r) for r in self._rows("SELECT * FROM presets ORDER BY name COLLATE NOCASE")]

    def preset(self, preset_id: str) -> Preset:
        """The preset, or ``StoreError`` when there is none with this id."""
        rows = self._rows("SELECT * FROM presets WHERE id = ?", [preset_id])
        if not rows:
            raise StoreError(f"no preset with id {preset_id!r}")
        return self._preset(rows[0])

    def preset_named(self, name: str) -> Preset | None:
        """The preset called ``name`` (any case), or None."""
        rows = self._rows("SELECT * FROM presets WHERE name = ? COLLATE NOCASE", [name.strip()])
        return self._preset(rows[0]) if rows else None

    def _name_free(self, table: str, name: str, own_id: str | None) -> None:
        rows = self._rows(f"SELECT id FROM {table} WHERE name = ? COLLATE NOCASE", [name])
        if rows and rows[0]["id"] != own_id:
            raise InvalidRequest(f"name: a {table[:-1]} called {name!r} already exists", param="name")

    def create_preset(self, name: str, system_prompt: str = "", decoding: dict | None = None,
                      model: str | None = None) -> Preset:
        """A new preset (``InvalidRequest`` names a bad field or a name already taken)."""
        fields = check_preset({"name": name, "system_prompt": system_prompt, "decoding": decoding or {},
                               "model": model})
        self._name_free("presets", fields["name"], None)
        pid, ts = uuid.uuid4().hex, now()
        with self._tx() as db:
            db.execute("INSERT INTO presets (id, name, system_prompt, decoding, model, created, updated) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", [pid, fields["name"], fields["system_prompt"],
                                                        dumps_json(fields["decoding"]), fields["model"], ts, ts])
        return self.preset(pid)

    def update_preset(self, preset_id: str, **changes: Any) -> Preset:
        """Change fields of a preset (``name``, ``system_prompt``, ``decoding``, ``model``), validated."""
        fields = check_preset({**self.preset(preset_id).to_dict(), **changes})
        self._name_free("presets", fields["name"], preset_id)
        with self._tx() as db:
            self._write_preset(db, preset_id, fields)
        return self.preset(preset_id)

    @staticmethod
    def _write_preset(db: Any, preset_id: str, fields: dict) -> None:
        db.execute("UPDATE presets SET name = ?, system_prompt = ?, decoding = ?, model = ?, updated = ? "
                   "WHERE id = ?", [fields["name"], fields["system_prompt"], dumps_json(fields["decoding"]),
                                    fields["model"], now(), preset_id])

    def delete_preset(self, preset_id: str) -> None:
        """Delete a preset; projects and chats that used it fall back to the defaults."""
        self.preset(preset_id)
        for conv in self._conversations_with("preset", preset_id):
            self._set_key(conv, "preset", None)
        with self._tx() as db:
            db.execute("UPDATE projects SET preset_id = NULL WHERE preset_id = ?", [preset_id])
            db.execute("DELETE FROM presets WHERE id = ?", [preset_id])

    def export_presets(self, preset_ids: list[str] | None = None) -> str:
        """The presets (all, or those of ``preset_ids``) as an exchange file (``app.memory.presets``)."""
        chosen = self.presets() if preset_ids is None else [self.preset(p) for p in preset_ids]
        return export_presets(chosen)

    def import_presets(self, text: str | bytes | dict) -> list[str]:
        """Store the presets of an exchange file; returns their ids in file order. The whole file is checked
        first (``InvalidRequest`` names the bad field, and nothing is written); a preset with the name of an
        existing one updates it in place."""
        items = parse_presets(text)
        ids: list[str] = []
        with self._tx() as db:
            for fields in items:
                row = db.execute("SELECT id FROM presets WHERE name = ? COLLATE NOCASE", [fields["name"]]).fetchone()
                if row:
                    self._write_preset(db, row[0], fields)
                    ids.append(row[0])
                    continue
                pid, ts = uuid.uuid4().hex, now()
                db.execute("INSERT INTO presets (id, name, system_prompt, decoding, model, created, updated) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?)", [pid, fields["name"], fields["system_prompt"],
                                                            dumps_json(fields["decoding"]), fields["model"], ts, ts])
                ids.append(pid)
        return ids

    # ---- projects ----------------------------------------------------------------------------------------

    @staticmethod
    def _project(row: dict) -> Project:
        try:
            docs = json.loads(row["documents"]) if row["documents"] else None
        except ValueError:
            log.warning("project %s: its documents are not JSON; reading them as all documents", row["id"])
            docs = None
        return Project(id=row["id"], name=row["name"], preset_id=row["preset_id"],
                       documents=[str(d) for d in docs] if isinstance(docs, list) else None, created=row["created"],
                       updated=row["updated"])

    def projects(self) -> list[Project]:
        """Every project, by name."""
        return [self._project(r) for r in self._rows("SELECT * FROM projects ORDER BY name COLLATE NOCASE")]

    def project(self, project_id: str) -> Project:
        """The project, or ``StoreError`` when there is none with this id."""
        rows = self._rows("SELECT * FROM projects WHERE id = ?", [project_id])
        if not rows:
            raise StoreError(f"no project with id {project_id!r}")
        return self._project(rows[0])

    @staticmethod
    def _check_documents(documents: Any) -> str | None:
        if documents is None:
            return None
        if not isinstance(documents, (list, tuple)) or not all(isinstance(d, str) for d in documents):
            raise InvalidRequest("documents must be a list of document paths, or null for all", param="documents")
        return json.dumps(sorted(set(documents)), ensure_ascii=False)

    def create_project(self, name: str, preset_id: str | None = None,
                       documents: list[str] | None = None) -> Project:
        """A new project (``InvalidRequest`` names a bad field or a name already taken)."""
        name = check_name(name)
        self._name_free("projects", name, None)
        if preset_id is not None:
            self.preset(preset_id)
        pid, ts = uuid.uuid4().hex, now()
        with self._tx() as db:
            db.execute("INSERT INTO projects (id, name, preset_id, documents, created, updated) "
                       "VALUES (?, ?, ?, ?, ?, ?)", [pid, name, preset_id, self._check_documents(documents), ts, ts])
        return self.project(pid)

    _UNSET: Any = object()

    def update_project(self, project_id: str, *, name: str | None = None, preset_id: Any = _UNSET,
                       documents: Any = _UNSET) -> Project:
        """Rename a project, or set its preset (None: the defaults) or documents (None: all)."""
        old = self.project(project_id)
        new_name = check_name(name) if name is not None else old.name
        self._name_free("projects", new_name, project_id)
        preset = old.preset_id if preset_id is self._UNSET else preset_id
        if preset is not None:
            self.preset(preset)
        docs = old.documents if documents is self._UNSET else documents
        with self._tx() as db:
            db.execute("UPDATE projects SET name = ?, preset_id = ?, documents = ?, updated = ? WHERE id = ?",
                       [new_name, preset, self._check_documents(docs), now(), project_id])
        return self.project(project_id)

    def delete_project(self, project_id: str) -> None:
        """Delete a project; its chats stay, outside any project."""
        self.project(project_id)
        for conv in self._conversations_with("project", project_id):
            self._set_key(conv, "project", None)
        with self._tx() as db:
            db.execute("DELETE FROM projects WHERE id = ?", [project_id])

    # ---- a conversation's project, preset and system prompt ---------------------------------------------

    def _conversations_with(self, key: str, value: str) -> list[str]:
        rows = self._rows("SELECT id, settings FROM conversations")
        return [r["id"] for r in rows
                if loads_json(r["settings"], f"conversation {r['id']}: settings", None).get(key) == value]

    def _set_key(self, conversation_id: str, key: str, value: Any) -> None:
        conv = self.get_conversation(conversation_id)
        settings = {k: v for k, v in conv.settings.items() if k != key}
        if value is not None:
            settings[key] = value
        self.update_conversation(conversation_id, settings=settings)

    def set_conversation_project(self, conversation_id: str, project_id: str | None) -> None:
        """Put a chat in a project (None: in none)."""
        if project_id is not None:
            self.project(project_id)
        self._set_key(conversation_id, "project", project_id)

    def set_conversation_preset(self, conversation_id: str, preset_id: str | None) -> None:
        """The chat's own preset (None: its project's, else the defaults)."""
        if preset_id is not None:
            self.preset(preset_id)
        self._set_key(conversation_id, "preset", preset_id)

    def set_conversation_system_prompt(self, conversation_id: str, text: str | None) -> None:
        """The chat's own system prompt (None: the preset's, else the person's default). Applies from the
        chat's next turn; the messages already written keep the prompt they were answered under."""
        if text is not None and not isinstance(text, str):
            raise InvalidRequest("system_prompt must be text", param="system_prompt")
        self._set_key(conversation_id, "system_prompt", text)

    def setup(self, conversation_id: str | None, project_id: str | None = None) -> Setup:
        """The layers in force for a conversation (or, for a chat not stored yet, for ``project_id``'s new
        chats). A project or preset deleted meanwhile reads as none."""
        settings = self.get_conversation(conversation_id).settings if conversation_id else {}
        project = self._maybe(self.project, settings.get("project", project_id))
        preset, source = self._maybe(self.preset, settings.get("preset")), "chat"
        if preset is None:
            preset = self._maybe(self.preset, project.preset_id) if project else None
            source = "project" if preset is not None else ""
        own = settings.get("system_prompt")
        own = own if isinstance(own, str) else None
        prompt = own if own is not None else (preset.system_prompt if preset is not None else None)
        return Setup(project, preset, source, prompt, own is not None)

    @staticmethod
    def _maybe(get: Any, key: Any) -> Any:
        if not isinstance(key, str) or not key:
            return None
        try:
            return get(key)
        except StoreError:
            return None
