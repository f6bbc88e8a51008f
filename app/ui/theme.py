"""Light and dark follow the system: Qt 6.5+ reports the colour scheme (``QStyleHints.colorScheme``) and
signals changes; the Fusion style gets a matching palette, and message bubbles a matching tint."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

BUBBLES = {
    "light": "QFrame#userMessage { background: #eef3fb; border-radius: 8px; border: 1px solid #d6e0f0; }"
             "QFrame#assistantMessage { background: #ffffff; border-radius: 8px; border: 1px solid #e3e3e3; }"
             "QFrame#toolCall { background: #fbf8ef; border-radius: 8px; border: 1px solid #e6dcc0; }",
    "dark": "QFrame#userMessage { background: #2b3342; border-radius: 8px; border: 1px solid #3b4558; }"
            "QFrame#assistantMessage { background: #262626; border-radius: 8px; border: 1px solid #383838; }"
            "QFrame#toolCall { background: #2d2a22; border-radius: 8px; border: 1px solid #4a4433; }",
}


def scheme() -> str:
    hints = QGuiApplication.styleHints()
    return "dark" if hints.colorScheme() == Qt.ColorScheme.Dark else "light"


def dark_palette() -> QPalette:
    p = QPalette()
    base, text, window = QColor(30, 30, 30), QColor(230, 230, 230), QColor(40, 40, 40)
    for role, colour in ((QPalette.ColorRole.Window, window), (QPalette.ColorRole.WindowText, text),
                         (QPalette.ColorRole.Base, base), (QPalette.ColorRole.AlternateBase, window),
                         (QPalette.ColorRole.Text, text), (QPalette.ColorRole.Button, window),
                         (QPalette.ColorRole.ButtonText, text), (QPalette.ColorRole.ToolTipBase, base),
                         (QPalette.ColorRole.ToolTipText, text), (QPalette.ColorRole.Highlight, QColor(53, 104, 176)),
                         (QPalette.ColorRole.HighlightedText, QColor(255, 255, 255)),
                         (QPalette.ColorRole.Link, QColor(110, 168, 254))):
        p.setColor(role, colour)
    return p


def apply_theme(app: QApplication) -> str:
    """Style ``app`` for the current system scheme; returns "light" or "dark"."""
    name = scheme()
    app.setStyle("Fusion")
    app.setPalette(dark_palette() if name == "dark" else app.style().standardPalette())
    app.setStyleSheet(BUBBLES[name])
    return name


def follow_system(app: QApplication) -> None:
    """Apply the theme now and again whenever the system switches between light and dark."""
    apply_theme(app)
    QGuiApplication.styleHints().colorSchemeChanged.connect(lambda _s: apply_theme(app))
