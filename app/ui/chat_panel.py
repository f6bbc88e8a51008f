"""The chat's own settings, in a collapsible panel right of the chat (as in LM Studio): its preset, its system
prompt (visible and editable), the documents and tools it uses, thinking and samples.

The preset picker lists *the project's / the defaults* first (the chat follows its project's preset, else the
person's defaults from Settings), then every preset. **Save for this chat** stores the prompt in force as the
chat's own (``Store.set_conversation_system_prompt``) and **Use preset's** drops it. The panel only shows and
emits; the window stores (``preset_chosen(str)``, "" for none; ``system_prompt_saved(object)``, None to drop;
``open_page(str)`` asks for the Documents or Tools page). The thinking and samples pickers are the chat view's
(it keeps their state and signals); the panel lays them out.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.ui import theme

WIDTH = 300  # the panel's width, px (it collapses below the window's compact width)


class ChatPanel(QScrollArea):
    """Preset, system prompt, documents, tools, thinking and samples of the chat shown (scrolls when short)."""

    preset_chosen = Signal(str)
    system_prompt_saved = Signal(object)
    open_page = Signal(str)

    def __init__(self, effort: QComboBox, samples: QComboBox, parent: QWidget | None = None) -> None:
        super().__init__(parent, widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        self.setObjectName("chatPanel")
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # Tab goes to its controls
        self.setFixedWidth(WIDTH)
        body = QWidget()
        body.setObjectName("chatPanelBody")
        lay = QVBoxLayout(body)
        sp = theme.SPACE
        lay.setContentsMargins(sp[1], sp[1], sp[1], sp[1])
        lay.setSpacing(sp[2])
        lay.addWidget(self._preset_box())
        lay.addWidget(self._prompt_box())
        lay.addWidget(self._documents_box())
        lay.addWidget(self._tools_box())
        answers = QGroupBox("Answers")
        f = QFormLayout(answers)
        f.addRow("Thinking", effort)
        f.addRow("Samples", samples)
        effort.setAccessibleName("Thinking effort")
        samples.setAccessibleName("Self-consistency samples")
        lay.addWidget(answers)
        lay.addStretch(1)
        self.setWidget(body)

    def _preset_box(self) -> QGroupBox:
        box = QGroupBox("Preset")
        lay = QVBoxLayout(box)
        self.preset = QComboBox(toolTip="The preset this chat answers with: system prompt, decoding settings, model")
        self.preset.setObjectName("presetPicker")
        self.preset.setAccessibleName("Preset")
        self.preset.setMinimumContentsLength(12)
        self.preset.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.preset.activated.connect(lambda i: self.preset_chosen.emit(self.preset.itemData(i) or ""))
        lay.addWidget(self.preset)
        return box

    def _prompt_box(self) -> QGroupBox:
        box = QGroupBox("System prompt")
        lay = QVBoxLayout(box)
        self.prompt = QPlainTextEdit(placeholderText="No system prompt: the model sees only the conversation",
                                     tabChangesFocus=True)
        self.prompt.setObjectName("systemPromptEdit")
        self.prompt.setAccessibleName("System prompt")
        self.prompt.setFixedHeight(110)
        self.source = QLabel(wordWrap=True)
        self.source.setObjectName("chatHeaderNote")
        buttons = QHBoxLayout()
        self.reset = QPushButton("Use preset's")
        self.reset.clicked.connect(lambda: self.system_prompt_saved.emit(None))
        self.save = QPushButton("Save for this chat")
        self.save.clicked.connect(lambda: self.system_prompt_saved.emit(self.prompt.toPlainText()))
        buttons.addWidget(self.reset)
        buttons.addWidget(self.save)
        lay.addWidget(self.prompt)
        lay.addWidget(self.source)
        lay.addLayout(buttons)
        return box

    def _documents_box(self) -> QGroupBox:
        box, self.documents, self.choose_documents = self._note_box(
            "Documents", "None: drop files on the chat to attach them", "Choose documents…", "documents")
        return box

    def _tools_box(self) -> QGroupBox:
        box, self.tools, self.manage_tools = self._note_box("Tools", "No MCP servers", "Manage tools…", "tools")
        return box

    def _note_box(self, title: str, note: str, button: str, page: str) -> tuple[QGroupBox, QLabel, QPushButton]:
        """A box of a wrapped note and a button that opens ``page``."""
        box = QGroupBox(title)
        lay = QVBoxLayout(box)
        label = QLabel(note, wordWrap=True, objectName="chatHeaderNote")
        btn = QPushButton(button)
        btn.clicked.connect(lambda: self.open_page.emit(page))
        lay.addWidget(label)
        lay.addWidget(btn)
        return box, label, btn

    def show_setup(self, setup: Any, presets: list[Any], default_prompt: str) -> None:
        """Show a chat: ``setup`` (``app.memory.library.Setup``), every preset, the default system prompt."""
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

    def set_documents(self, text: str, tip: str) -> None:
        """This chat's documents (``formatting.documents_indicator``: ``text`` "" for none, ``tip`` the names)."""
        self.documents.setText(tip if text else "None: drop files on the chat to attach them")

    def set_tools(self, text: str, tip: str) -> None:
        """The tools offered (``formatting.tools_indicator``: ``text`` "" when no server is configured)."""
        self.tools.setText(tip if text else "No MCP servers: add one on the Tools page")
