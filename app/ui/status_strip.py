"""The status strip under the chat: the model and its state, then the last answer's TTFT, decode speed,
prompt tokens reused from the prefix cache, and the context used / n_ctx as a bar whose tooltip breaks it down
(``ContextPlan.breakdown`` from app.memory)."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QWidget

from app.ui.formatting import context_tooltip, context_usage, status_texts


class StatusStrip(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(6, 2, 6, 2)
        self.model = QLabel("No model loaded")
        self.ttft, self.decode, self.reused = QLabel(), QLabel(), QLabel()
        self.context = QProgressBar(textVisible=True, minimumWidth=230, maximumWidth=260)
        self.context.setFormat("context %v / %m tokens")
        lay.addWidget(self.model, 1)
        for w in (self.ttft, self.decode, self.reused, self.context):
            lay.addWidget(w)
        self.show_answer({}, {})

    def show_model(self, text: str) -> None:
        self.model.setText(text)

    def show_answer(self, metrics: dict[str, Any], breakdown: dict[str, Any]) -> None:
        texts = status_texts(metrics)
        self.ttft.setText(texts["ttft"])
        self.ttft.setToolTip("Time to first token: request accepted by the engine → first answer text")
        self.decode.setText(texts["decode"])
        self.decode.setToolTip("Decode speed of the answer, tokens per second after the first token")
        self.reused.setText(texts["reused"])
        self.reused.setToolTip("Prompt tokens restored from the prefix cache instead of being prefilled")
        completion = int(metrics.get("completion_tokens", 0)) if metrics else 0
        used, n_ctx = context_usage(breakdown, completion)
        self.context.setRange(0, max(n_ctx, 1))
        self.context.setValue(min(used, max(n_ctx, 1)))
        self.context.setToolTip(context_tooltip(breakdown, completion))
