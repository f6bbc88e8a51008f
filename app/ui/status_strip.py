"""The status strip under the chat: the model and its state, then the last answer's TTFT, decode speed,
prompt tokens reused from the prefix cache (the decode speed's tooltip names a speculative mode and the guesses
kept), and the context used / n_ctx as a bar whose tooltip breaks it down
(``ContextPlan.breakdown`` from app.memory). Used context is the answer's real prompt + completion tokens from its
metrics; before any answer the bar shows the loaded model's n_ctx with 0 used, or "context —" without a model.

An answer that thought also shows its thinking tokens, answer tokens and TTFAT, the time to first *answer*
token (thinking excluded), whose tooltip names its clock; hidden for answers without thinking.

When the Hearth service answers on the settings' port (``service_ctl``), the strip says so, with a *connect*
link (``connect_service``)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QSizePolicy, QWidget

from app.ui import theme
from app.ui.formatting import context_bar, context_tooltip, disk_cache_off, speculative_text, status_texts
from app.ui.labels import ElidedLabel

THINKING_TIP = ("Thinking tokens and answer tokens of the last answer (sampled tokens; inserted text counts in "
                "neither).\nTTFAT, time to first answer token: from the request entering its slot in the engine to "
                "the first answer text, after the thinking (TTFT counts from the same start to the first text "
                "of any kind).")


class StatusStrip(QWidget):
    """The model's state and the last answer's metrics (see the module docstring)."""

    connect_service = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("statusStrip")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(theme.SPACE[2], theme.SPACE[0], theme.SPACE[2], theme.SPACE[0])
        lay.setSpacing(theme.SPACE[1])
        self._model_text = "No model loaded"
        self.model = ElidedLabel(self._model_text)  # a long line is cut, never widens the window
        self.model.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)  # the one cut first
        self.service = QLabel(visible=False, textFormat=Qt.TextFormat.RichText)
        self.service.setObjectName("serviceStatus")
        self.service.setToolTip("The Hearth service (hearth service install) answers /health on this port. "
                                "Connect: chat through it instead of loading a model in the window.")
        self.service.linkActivated.connect(lambda _l: self.connect_service.emit())
        self.ttft, self.decode, self.reused, self.thinking = (ElidedLabel() for _ in range(4))
        self.thinking.setObjectName("thinkingMetrics")
        self.context = QProgressBar(textVisible=True, minimumWidth=230, maximumWidth=260)
        self.context.setAccessibleName("Context used")
        self.n_ctx: int | None = None  # the loaded model's context window (tokens), shown before any answer
        self._last: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        lay.addWidget(self.model, 1)
        for w in (self.service, self.ttft, self.thinking, self.decode, self.reused, self.context):
            lay.addWidget(w)
        self.show_answer({}, {})

    def show_model(self, text: str) -> None:
        """The model's state (a note shown with it goes)."""
        self._model_text = text
        self.model.setText(text)

    def show_note(self, note: str) -> None:
        """A note before the model's state (a fallback at start: it comes first, so a cut keeps it), until
        ``clear_note`` or the next ``show_model``."""
        self.model.setText(f"{note} · {self._model_text}" if note else self._model_text)

    def clear_note(self) -> None:
        """The model's state alone again."""
        self.model.setText(self._model_text)

    def show_service(self, text: str) -> None:
        """The service's state (``service_ctl.service_text``; "" hides it)."""
        self.service.setText(text)
        self.service.setVisible(bool(text))

    def set_n_ctx(self, n_ctx: int | None) -> None:
        """The loaded model's context window in tokens (None: no model); redraws the bar."""
        self.n_ctx = n_ctx
        self.show_answer(*self._last)

    def show_answer(self, metrics: dict[str, Any], breakdown: dict[str, Any]) -> None:
        """The last answer's ``Metrics`` dict and ``ContextPlan.breakdown`` (both empty: no answer yet)."""
        self._last = (metrics, breakdown)
        texts = status_texts(metrics)
        self.ttft.setText(texts["ttft"])
        self.ttft.setToolTip("Time to first token: the request entering its slot in the engine → the first text, "
                             "thinking included (TTFAT, next to it after an answer that thought, is the first "
                             "answer text)")
        self.decode.setText(texts["decode"])
        spec = speculative_text(metrics)
        self.decode.setToolTip("Decode speed of the answer, tokens per second after the first token"
                               + (f"\n{spec}" if spec else ""))
        self.thinking.setText(texts["thinking"])
        self.thinking.setVisible(bool(texts["thinking"]))
        self.thinking.setToolTip(THINKING_TIP + (f"\nThinking time: {metrics['thinking_s']:.2f} s"
                                                 if metrics.get("thinking_s") else ""))
        self.reused.setText(texts["reused"])
        off = disk_cache_off(metrics)
        self.reused.setToolTip("Prompt tokens restored from the prefix cache instead of being prefilled"
                               + (f"\n{off[:1].upper()}{off[1:]}; answers go on without it, and it is tried again "
                                  "later" if off else ""))
        value, maximum, text = context_bar(breakdown, metrics, self.n_ctx)
        self.context.setRange(0, maximum)
        self.context.setValue(value)
        self.context.setFormat(text)
        self.context.setToolTip(context_tooltip(breakdown, metrics))
