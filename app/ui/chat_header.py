"""The bar above the chat: the chat's title and project, the model picker (as at the top of LM Studio's chat),
what the chat uses (documents, tools), and the button that shows or hides the chat's settings panel.

The title is elided, never widening the window; the model picker lists the installed models (the Models page's
list) and emits ``model_chosen(row)``; ``panel_toggled(bool)`` shows or hides the panel.
"""

from __future__ import annotations

from PySide6.QtCore import QAbstractItemModel, Signal
from PySide6.QtWidgets import QComboBox, QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.ui import theme
from app.ui.labels import ElidedComboBox, ElidedLabel


class ChatHeader(QFrame):
    """Title, project, model picker, the documents and tools notes, and the panel button of the chat shown."""

    model_chosen = Signal(int)
    panel_toggled = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatHeader")
        outer = QVBoxLayout(self)
        sp = theme.SPACE
        outer.setContentsMargins(sp[2], sp[1], sp[1], sp[1])
        outer.setSpacing(sp[0])
        self.title = ElidedLabel("New chat")
        self.title.setObjectName("chatTitle")
        self.title.setAccessibleName("Chat title")
        self.project = QLabel()
        self.project.setObjectName("chatHeaderNote")
        self.model_picker = ElidedComboBox(toolTip="The model that answers (load another one here or on the "
                                                   "Models page)")
        self.model_picker.setObjectName("modelPicker")
        self.model_picker.setAccessibleName("Model")
        self.model_picker.setPlaceholderText("No model loaded — pick one")  # shown while no model is loaded
        self.model_picker.setMinimumContentsLength(14)
        self.model_picker.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model_picker.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.model_picker.setMaximumWidth(420)
        self.model_picker.activated.connect(self.model_chosen.emit)
        self.tools = QLabel(visible=False)  # MCP tools offered to the model (``set_tools``)
        self.tools.setObjectName("toolsIndicator")
        self.tools.setAccessibleName("Tools offered to the model")
        self.documents = QLabel(visible=False)  # the documents this chat uses (``set_documents``)
        self.documents.setObjectName("documentsIndicator")
        self.documents.setAccessibleName("Documents this chat uses")
        self.toggle = QToolButton(text="Chat settings", checkable=True, toolTip="Show or hide this chat's preset, "
                                  "system prompt, documents, tools and thinking (Ctrl+Shift+S)")
        self.toggle.setObjectName("panelToggle")
        self.toggle.setAccessibleName("Chat settings panel")
        self.toggle.toggled.connect(self.panel_toggled.emit)
        top, below = QHBoxLayout(), QHBoxLayout()
        top.addWidget(self.title, 1)  # the title has a row of its own: elided only on a very narrow chat
        top.addWidget(self.project)
        top.addWidget(self.toggle)
        below.addWidget(self.model_picker, 1)
        for w in (self.documents, self.tools):
            below.addWidget(w)
        outer.addLayout(top)
        outer.addLayout(below)

    def set_models(self, model: QAbstractItemModel) -> None:
        """List the rows of ``model`` (the Models page's ``ModelListModel``) in the picker."""
        self.model_picker.setModel(model)

    def show_model(self, row: int) -> None:
        """Show row ``row`` as the model in use (-1: none loaded)."""
        self.model_picker.setCurrentIndex(row)
        self.model_picker.setToolTip(self.model_picker.currentText() or "No model loaded: choose one")

    def show_chat(self, title: str, project: str | None) -> None:
        """The chat's ``title`` ("" for a new chat) and its project's name."""
        self.title.setText(title or "New chat")
        self.project.setText(f"in {project}" if project else "")

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

    def set_panel(self, on: bool) -> None:
        """Show the panel button as pressed or not, without emitting."""
        self.toggle.blockSignals(True)
        self.toggle.setChecked(on)
        self.toggle.blockSignals(False)
        self.toggle.setText("Chat settings ▾" if on else "Chat settings ▸")
