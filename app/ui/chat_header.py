"""The bar above the chat: the chat's title and project, its preset, and its system prompt, visible and
editable.

The preset picker lists *the project's / the defaults* first (the chat follows its project's preset, else the
person's defaults from Settings), then every preset. **System prompt ▸** opens the prompt in force for the
next turn (the chat's own, else its preset's, else the default); **Save for this chat** stores it as the chat's
own (``Store.set_conversation_system_prompt``) and **Use preset's** drops the chat's own. The bar only shows and
emits; the window stores (``preset_chosen(str)``, "" for none; ``system_prompt_saved(object)``, None to drop).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.ui import theme


class ChatHeader(QFrame):
    """Title, project, preset picker and the system prompt editor of the chat shown."""

    preset_chosen = Signal(str)
    system_prompt_saved = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatHeader")
        outer = QVBoxLayout(self)
        sp = theme.SPACE
        outer.setContentsMargins(sp[2], sp[1], sp[2], sp[1])
        outer.setSpacing(sp[1])
        row = QHBoxLayout()
        self.title = QLabel("New chat")
        self.title.setObjectName("chatTitle")
        self.title.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)  # may be cut, never
        self.title.setMinimumWidth(80)  # widen the window
        self.project = QLabel()
        self.project.setObjectName("chatHeaderNote")
        self.preset = QComboBox(toolTip="The preset this chat answers with: system prompt, decoding settings, model")
        self.preset.setObjectName("presetPicker")
        self.preset.setMinimumContentsLength(10)
        self.preset.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.preset.activated.connect(lambda i: self.preset_chosen.emit(self.preset.itemData(i) or ""))
        self.tools = QLabel(visible=False)  # MCP tools offered to the model (``set_tools``)
        self.tools.setObjectName("toolsIndicator")
        self.tools.setAccessibleName("Tools offered to the model")
        self.documents = QLabel(visible=False)  # the documents this chat uses (``set_documents``)
        self.documents.setObjectName("documentsIndicator")
        self.documents.setAccessibleName("Documents this chat uses")
        self.toggle = QToolButton(text="System prompt ▸", checkable=True)
        self.toggle.setObjectName("systemPromptToggle")
        self.toggle.toggled.connect(self._toggle)
        row.addWidget(self.project)
        row.insertWidget(0, self.title, 1)  # the title takes the free width (cut with its project note kept)
        for w in (self.documents, self.tools, QLabel("Preset:"), self.preset, self.toggle):
            row.addWidget(w)
        outer.addLayout(row)
        self.editor = QWidget(visible=False)
        ed = QVBoxLayout(self.editor)
        ed.setContentsMargins(0, 0, 0, 0)
        self.prompt = QPlainTextEdit(placeholderText="No system prompt: the model sees only the conversation")
        self.prompt.setObjectName("systemPromptEdit")
        self.prompt.setFixedHeight(72)
        self.source = QLabel()
        self.source.setObjectName("chatHeaderNote")
        buttons = QHBoxLayout()
        self.save = QPushButton("Save for this chat")
        self.save.clicked.connect(lambda: self.system_prompt_saved.emit(self.prompt.toPlainText()))
        self.reset = QPushButton("Use preset's")
        self.reset.clicked.connect(lambda: self.system_prompt_saved.emit(None))
        buttons.addWidget(self.source, 1)
        buttons.addWidget(self.reset)
        buttons.addWidget(self.save)
        ed.addWidget(self.prompt)
        ed.addLayout(buttons)
        outer.addWidget(self.editor)

    def set_tools(self, text: str, tip: str) -> None:
        """Show which tools the model is offered (``formatting.tools_indicator``); hidden for ``""``."""
        self.tools.setText(text)
        self.tools.setToolTip(tip)
        self.tools.setVisible(bool(text))

    def set_documents(self, text: str, tip: str) -> None:
        """Show which documents the chat uses (``formatting.documents_indicator``); hidden for ``""``."""
        self.documents.setText(text)
        self.documents.setToolTip(tip)
        self.documents.setVisible(bool(text))

    def _toggle(self, on: bool) -> None:
        self.editor.setVisible(on)
        self.toggle.setText("System prompt ▾" if on else "System prompt ▸")

    def show_setup(self, title: str, setup: Any, presets: list[Any], default_prompt: str) -> None:
        """Show a chat: ``setup`` (``app.memory.library.Setup``), every preset, the default system prompt."""
        self.title.setText(title or "New chat")
        self.project.setText(f"in {setup.project.name}" if setup.project else "")
        follow = (f"project's ({setup.preset.name})" if setup.preset_source == "project" else
                  "project's (defaults)" if setup.project else "defaults")
        self.preset.clear()
        self.preset.addItem(follow, "")
        for p in presets:
            self.preset.addItem(p.name, p.id)
        chosen = setup.preset.id if setup.preset is not None and setup.preset_source == "chat" else ""
        self.preset.setCurrentIndex(max(self.preset.findData(chosen), 0) if chosen else 0)
        prompt = setup.system_prompt if setup.system_prompt is not None else default_prompt
        self.prompt.setPlainText(prompt)
        self.source.setText("this chat's own prompt" if setup.own_system_prompt else
                            f"from the preset {setup.preset.name}" if setup.preset is not None else
                            "the default from Settings")
        self.reset.setEnabled(setup.own_system_prompt)
