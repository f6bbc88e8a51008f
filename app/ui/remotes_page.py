"""Settings → Remote engines: the window's side of ``hearth remote add|remove`` (docs/remote.md).

A remote engine is an OpenAI-compatible server (vLLM, llama-server, another Hearth) that answers as a model of
the models list. The page lists ``settings.remotes`` and adds or removes entries. The API key is never kept in
settings.json: the page stores the *name* of an environment variable, or puts the key typed here into the OS
keyring (``app.secrets.store_key``) and stores only that it is there. Entries are checked by
``RemoteSettings.validate`` (the URL, the name), and a bad one is an error naming the field; nothing is saved
until Settings are applied.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.errors import HearthError, InvalidRequest


class RemotesPage(QWidget):
    """The remote engines of the settings, edited in place. ``result_remotes()``: name → ``RemoteSettings``;
    ``keys_to_store``: name → key typed for the keyring, written by ``store_keys()`` once Settings are applied
    (never shown again, never logged)."""

    def __init__(self, remotes: dict[str, Any], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.remotes = dict(remotes)
        self.keys_to_store: dict[str, str] = {}
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("Models served by another machine (vLLM, llama-server, another Hearth). "
                             "Conversations, documents and citations stay on this one.", wordWrap=True))
        self.list = QListWidget()
        self.list.setAccessibleName("Remote engines")
        lay.addWidget(self.list, 1)
        remove = QPushButton("Remove selected")
        remove.setAccessibleName("Remove the selected remote engine")
        remove.clicked.connect(self.remove_selected)
        lay.addWidget(remove)
        box = QGroupBox("Add a remote engine")
        form = QFormLayout(box)
        self.name = QLineEdit(placeholderText="e.g. big-gpu")
        self.url = QLineEdit(placeholderText="http://10.0.0.5:8000/v1")
        self.model = QLineEdit(placeholderText="the remote's model id (empty: the only one it serves)")
        self.key_env = QLineEdit(placeholderText="environment variable holding the API key, e.g. VLLM_API_KEY")
        self.in_keyring = QCheckBox("Keep the key in the OS keyring instead")
        self.key = QLineEdit(placeholderText="API key (stored in the keyring, never in settings.json)",
                             echoMode=QLineEdit.EchoMode.Password, enabled=False)
        self.key.setAccessibleName("API key")  # it shares a row with the check box: no label of its own
        self.in_keyring.toggled.connect(self.key.setEnabled)
        for label, w in (("Name", self.name), ("URL", self.url), ("Model", self.model),
                         ("Key variable", self.key_env)):
            form.addRow(label, w)
        row = QHBoxLayout()
        row.addWidget(self.in_keyring)
        row.addWidget(self.key, 1)
        form.addRow("", row)
        add = QPushButton("Add")
        add.clicked.connect(self.add)
        self.error = QLabel(wordWrap=True, objectName="errorText")
        form.addRow(add, self.error)
        lay.addWidget(box)
        self._fill()

    def _fill(self) -> None:
        from app import secrets

        self.list.clear()
        for name, r in sorted(self.remotes.items()):
            source = "keyring (new)" if name in self.keys_to_store else secrets.key_source(name, r)
            item = QListWidgetItem(f"{name} · {r.url}{' · ' + r.model if r.model else ''} · key: {source}")
            item.setData(256, name)
            self.list.addItem(item)

    def add(self) -> bool:
        """Add the entry of the fields (replacing one of the same name). False, with the error shown, when a
        field is bad."""
        from app.settings import RemoteSettings

        name = self.name.text().strip()
        try:
            if not name:
                raise InvalidRequest("give the remote engine a name", param="name")
            keyring = self.in_keyring.isChecked()
            if keyring and not self.key.text():
                raise InvalidRequest("type the API key to keep in the keyring", param="api_key")
            r = RemoteSettings(url=self.url.text().strip(), model=self.model.text().strip() or None,
                               api_key_env=None if keyring else (self.key_env.text().strip() or None),
                               api_key_keyring=keyring).validate(name)
        except HearthError as exc:
            self.error.setText(str(exc))
            return False
        self.remotes[name] = r
        if keyring:
            self.keys_to_store[name] = self.key.text()
        self.key.clear()
        self.error.setText("")
        self._fill()
        return True

    def remove_selected(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            name = item.data(256)
            self.remotes.pop(name, None)
            self.keys_to_store.pop(name, None)
            self._fill()

    def result_remotes(self) -> dict[str, Any]:
        return dict(self.remotes)

    def store_keys(self) -> None:
        """Put the keys typed for the keyring there (when Settings are applied). Raises ``SecretError`` when
        the keyring cannot take them (named in its message)."""
        from app import secrets

        for name, key in self.keys_to_store.items():
            secrets.store_key(name, key)
        self.keys_to_store.clear()
