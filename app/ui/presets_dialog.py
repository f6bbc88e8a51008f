"""Presets… (Ctrl+Shift+P): make, edit, delete, import and export presets (``app.memory.library``).

A preset is a system prompt, decoding settings (each spin box reads *default* until set: the person's
default from Settings then applies) and optionally a model. Decoding keys the form does not show (``stop``,
penalties in an imported file) are kept as they were. **Import…** reads a ``hearth.presets`` JSON file and
checks it whole first: an error names the field (``presets[1].decoding.temperature ...``) and nothing is
written. **Export…** writes every preset. Changes are stored at once; the window refreshes its picker after.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.errors import HearthError, InvalidRequest

# (key, label, lowest shown = "default", highest, step, decimals or None for whole numbers)
FIELDS = (("temperature", "Temperature", -0.05, 5.0, 0.05, 2), ("top_p", "Top p", 0.0, 1.0, 0.01, 2),
          ("top_k", "Top k", -1, 1000, 1, None), ("min_p", "Min p", -0.01, 1.0, 0.01, 2),
          ("max_tokens", "Max answer tokens", 0, 1 << 20, 16, None))


class PresetsDialog(QDialog):
    """Edits the presets of ``store``; ``changed`` is True after anything was stored."""

    def __init__(self, store: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Presets")
        self.store, self.changed, self.current_id = store, False, None
        self.list = QListWidget()
        self.list.setAccessibleName("Presets")
        self.list.currentItemChanged.connect(lambda item, _old: self._show(item))
        self.name, self.model = QLineEdit(), QLineEdit(placeholderText="the loaded model")
        self.prompt = QPlainTextEdit(placeholderText="Optional instructions for chats using this preset",
                                     tabChangesFocus=True)
        self.spins: dict[str, Any] = {}
        form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow("System prompt", self.prompt)
        for key, label, lo, hi, step, dec in FIELDS:
            w = QDoubleSpinBox(minimum=lo, maximum=hi, singleStep=step, decimals=dec) if dec else \
                QSpinBox(minimum=lo, maximum=hi, singleStep=step)
            w.setSpecialValueText("default")
            self.spins[key] = w
            form.addRow(label, w)
        form.addRow("Model", self.model)
        self.error = QLabel(wordWrap=True, objectName="errorText")
        side = QVBoxLayout()
        side.addWidget(self.list, 1)
        row = QHBoxLayout()
        for text, slot in (("New", self.new), ("Delete", self.delete), ("Import…", self.import_file),
                           ("Export…", self.export_file)):
            b = QPushButton(text)
            b.clicked.connect(slot)
            row.addWidget(b)
        side.addLayout(row)
        body = QHBoxLayout()
        body.addLayout(side, 2)
        right = QVBoxLayout()
        right.addLayout(form)
        save = QPushButton("Save preset")
        save.setObjectName("sendButton")
        save.clicked.connect(self.save)
        right.addWidget(save, 0, Qt.AlignmentFlag.AlignRight)
        body.addLayout(right, 3)
        outer = QVBoxLayout(self)
        outer.addLayout(body)
        outer.addWidget(self.error)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        outer.addWidget(close)
        self.resize(760, 460)
        self.refresh()

    def refresh(self, select: str | None = None) -> None:
        """Reload the list (selecting ``select``, else the first preset)."""
        self.list.clear()
        for p in self.store.presets():
            item = QListWidgetItem(p.name)
            item.setData(Qt.ItemDataRole.UserRole, p.id)
            self.list.addItem(item)
            if p.id == select:
                self.list.setCurrentItem(item)
        if self.list.currentItem() is None and self.list.count():
            self.list.setCurrentRow(0)
        if not self.list.count():
            self._show(None)

    def _show(self, item: QListWidgetItem | None) -> None:
        p = self.store.preset(item.data(Qt.ItemDataRole.UserRole)) if item is not None else None
        self.current_id = p.id if p else None
        self.name.setText(p.name if p else "")
        self.prompt.setPlainText(p.system_prompt if p else "")
        self.model.setText((p.model or "") if p else "")
        for key, w in self.spins.items():
            value = (p.decoding if p else {}).get(key)
            w.setValue(w.minimum() if value is None else value)

    def form_fields(self) -> dict[str, Any]:
        """The preset as the form shows it (decoding keys it does not show are kept from the stored one)."""
        kept = dict(self.store.preset(self.current_id).decoding) if self.current_id else {}
        for key, w in self.spins.items():
            kept.pop(key, None)
            if w.value() != w.minimum():
                kept[key] = w.value()
        return {"name": self.name.text(), "system_prompt": self.prompt.toPlainText(), "decoding": kept,
                "model": self.model.text().strip() or None}

    def _stored(self, action: Any) -> None:
        try:
            preset_id = action()
        except (InvalidRequest, HearthError, OSError) as exc:
            self.error.setText(str(exc))
            return
        self.error.setText("")
        self.changed = True
        self.refresh(preset_id)

    def save(self) -> None:
        """Store the form: a new preset, or the changes of the selected one."""
        f = self.form_fields()
        if self.current_id is None:
            self._stored(lambda: self.store.create_preset(**f).id)
        else:
            self._stored(lambda: self.store.update_preset(self.current_id, **f).id)

    def new(self) -> None:
        self.list.setCurrentItem(None)
        self._show(None)
        self.name.setFocus()

    def delete(self) -> None:
        if self.current_id is not None:
            pid = self.current_id
            self._stored(lambda: self.store.delete_preset(pid))

    def import_path(self, path: str) -> None:
        """Import the presets of a JSON file (the error names the bad field; nothing is written then)."""
        def run() -> str | None:
            ids = self.store.import_presets(Path(path).read_bytes())
            return ids[0] if ids else None
        self._stored(run)

    def export_path(self, path: str) -> None:
        """Write every preset to ``path`` as a ``hearth.presets`` file."""
        try:
            Path(path).write_text(self.store.export_presets(), encoding="utf-8")
        except OSError as exc:
            self.error.setText(f"Cannot write {path}: {exc}")
            return
        self.error.setText(f"Exported {self.list.count()} presets to {Path(path).name}")

    def import_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import presets", "", "Presets (*.json)")
        if path:
            self.import_path(path)

    def export_file(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export presets", "hearth-presets.json", "Presets (*.json)")
        if path:
            self.export_path(path)
