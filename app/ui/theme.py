"""Hearth's look: one set of design tokens (colours, a spacing scale, a type scale) rendered as a Fusion palette
plus one application stylesheet, for a light and a dark theme.

Design decisions held here:

The reasoning: docs/ui.md, 'app/ui/theme.py'.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QObject, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFont, QGuiApplication, QPainter, QPalette, QPen
from PySide6.QtWidgets import QApplication, QProxyStyle, QStyle, QStyleOption, QStyleOptionComplex, QWidget

from app.ui.prefs import THEMES as MODES

SPACE = (4, 8, 12, 16, 24)  # px: the only margins and paddings used (xs, s, m, l, xl)
TYPE = {"small": 11, "body": 13, "title": 15, "heading": 18}  # px
RADIUS = 10  # bubbles; controls use RADIUS // 2


@dataclass(frozen=True)
class Colors:
    """The colour tokens of one theme (hex strings). ``border`` draws frames that identify no control (bubbles,
    cards, separators); ``control_border`` outlines buttons and inputs, at least 3:1 against the window and the
    surface (WCAG 2.1 SC 1.4.11, as Material 3 splits outline / outline-variant). ``progress`` is a progress
    bar's chunk: the bar's text sits on it and on its track (the window), so it holds 4.5:1 with the text and
    3:1 with the track (``app.ui.a11y`` lists every pair)."""

    window: str
    surface: str
    surface_alt: str
    text: str
    muted: str
    border: str
    control_border: str
    accent: str
    progress: str
    accent_text: str
    user_bubble: str
    user_border: str
    assistant_bubble: str
    assistant_border: str
    tool_bubble: str
    tool_border: str
    code_bg: str
    error: str
    notice: str
    link: str
    pygments_style: str


PALETTES = {
    "light": Colors(window="#f5f5f7", surface="#ffffff", surface_alt="#ececf0", text="#1d1d1f", muted="#6e6e73",
                    border="#d9d9de", control_border="#8a8a8f", accent="#c2410c", progress="#e95a0f",
                    accent_text="#ffffff", user_bubble="#fff1e8", user_border="#f5d0b5", assistant_bubble="#ffffff",
                    assistant_border="#e3e3e8", tool_bubble="#fbf8ef", tool_border="#e6dcc0", code_bg="#f6f8fa",
                    error="#b91c1c", notice="#8a6d00", link="#b45309", pygments_style="default"),
    "dark": Colors(window="#1c1c1e", surface="#262628", surface_alt="#2f2f33", text="#ececf0", muted="#9a9aa2",
                   border="#3a3a3f", control_border="#737378", accent="#fb923c", progress="#b5460c",
                   accent_text="#1c1c1e", user_bubble="#3a2a20", user_border="#5a3c28", assistant_bubble="#262628",
                   assistant_border="#3a3a3f", tool_bubble="#2d2a22", tool_border="#4a4433", code_bg="#1a1b1e",
                   error="#f87171", notice="#facc15", link="#fdba74", pygments_style="github-dark"),
}


def system_scheme() -> str:
    """What the OS asks for: "dark" or "light" (Unknown, e.g. under Xvfb, is light)."""
    hints = QGuiApplication.styleHints()
    return "dark" if hints.colorScheme() == Qt.ColorScheme.Dark else "light"


def resolve(mode: str) -> str:
    """The theme name for a mode: ``system`` follows the OS; ``light``/``dark`` are themselves."""
    if mode not in MODES:
        raise ValueError(f"theme must be one of {', '.join(MODES)}, got {mode!r}")
    return system_scheme() if mode == "system" else mode


def palette(name: str) -> QPalette:
    """The Fusion palette of theme ``name`` (the colours native widgets and dialogs draw with)."""
    c = PALETTES[name]
    p = QPalette()
    roles = QPalette.ColorRole
    for role, colour in ((roles.Window, c.window), (roles.WindowText, c.text), (roles.Base, c.surface),
                         (roles.AlternateBase, c.surface_alt), (roles.Text, c.text), (roles.Button, c.surface),
                         (roles.ButtonText, c.text), (roles.ToolTipBase, c.surface), (roles.ToolTipText, c.text),
                         (roles.PlaceholderText, c.muted), (roles.Highlight, c.accent),
                         (roles.HighlightedText, c.accent_text), (roles.Link, c.link),
                         (roles.LinkVisited, c.link), (roles.Mid, c.control_border), (roles.Midlight, c.surface_alt)):
        p.setColor(role, QColor(colour))
    for role in (roles.Text, roles.WindowText, roles.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(c.muted))
    return p


def stylesheet(name: str) -> str:
    """The application stylesheet of theme ``name``, written from the tokens only: the controls, then the chat
    column and status strip, then the remaining widgets (in this order: later rules win)."""
    c = PALETTES[name]
    return "\n" + _controls_qss(c) + _chat_qss(c) + _widgets_qss(c)


def _controls_qss(c: Colors) -> str:
    """Rules for the window, toolbar, buttons, inputs, lists and tabs."""
    xs, s, m, r, t = SPACE[0], SPACE[1], SPACE[2], RADIUS, TYPE
    return f"""QWidget {{ font-size: {t['body']}px; }}
QMainWindow, QDialog {{ background: {c.window}; }}
QToolBar {{ background: {c.window}; border: none; border-bottom: 1px solid {c.border}; padding: {xs}px {s}px;
           spacing: {s}px; }}
QToolBar QToolButton {{ padding: {xs}px {m}px; border-radius: {r // 2}px; }}
QToolBar QToolButton:hover {{ background: {c.surface_alt}; }}
QPushButton {{ background: {c.surface}; border: 1px solid {c.control_border}; border-radius: {r // 2}px;
              padding: {xs + 1}px {s}px; min-height: 18px; }}
QPushButton:hover {{ background: {c.surface_alt}; }}
QPushButton:disabled {{ color: {c.muted}; border-color: {c.border}; }}
QPushButton#sendButton, QPushButton#newChat {{ background: {c.accent}; color: {c.accent_text};
              border: 1px solid {c.accent}; font-weight: 600; }}
QPushButton#sendButton:disabled {{ background: {c.surface_alt}; color: {c.muted}; border-color: {c.border}; }}
QLineEdit, QPlainTextEdit, QComboBox {{ background: {c.surface};
              border: 1px solid {c.control_border}; border-radius: {r // 2}px; padding: {xs}px {s}px; }}
QLineEdit:focus, QPlainTextEdit:focus, QComboBox:focus {{ border: 1px solid {c.accent}; }}
QLineEdit:disabled, QPlainTextEdit:disabled, QComboBox:disabled {{ border-color: {c.border}; }}
QPlainTextEdit#composer {{ border-radius: {r}px; padding: {s}px; font-size: {t['title'] - 1}px; }}
QListView, QTreeView {{ background: {c.surface}; border: 1px solid {c.border}; border-radius: {r // 2}px;
              padding: {xs}px; }}
QListView::item {{ padding: {xs + 1}px {s}px; border-radius: {r // 2 - 1}px; }}
QListView::item:selected {{ background: {c.accent}; color: {c.accent_text}; }}
QComboBox QAbstractItemView {{ background: {c.surface}; border: 1px solid {c.border}; outline: none; }}
QComboBox::item {{ color: {c.text}; }}
QComboBox::item:selected {{ background: {c.accent}; color: {c.accent_text}; }}
QTabWidget::pane {{ border: 1px solid {c.border}; border-radius: {r // 2}px; background: {c.surface}; }}
QTabBar::tab {{ padding: {xs + 2}px {m}px; border: none; color: {c.muted}; }}
QTabBar::tab:selected {{ color: {c.text}; border-bottom: 2px solid {c.accent}; }}
"""


def _chat_qss(c: Colors) -> str:
    """Rules for the chat column (bubbles, messages, header, notices) and the status strip."""
    xs, s, m, r, t = SPACE[0], SPACE[1], SPACE[2], RADIUS, TYPE
    return f"""QScrollArea#chatScroll, QWidget#chatColumn {{ background: {c.window}; border: none; }}
QFrame#userMessage {{ background: {c.user_bubble}; border: 1px solid {c.user_border}; border-radius: {r}px; }}
QFrame#assistantMessage {{ background: {c.assistant_bubble}; border: 1px solid {c.assistant_border};
              border-radius: {r}px; }}
QFrame#toolCall {{ background: {c.tool_bubble}; border: 1px solid {c.tool_border}; border-radius: {r}px; }}
QFrame#userMessage QTextBrowser, QFrame#assistantMessage QTextBrowser {{ background: transparent; }}
QLabel#messageAuthor {{ font-weight: 600; font-size: {t['body']}px; }}
QLabel#messageStatus, QLabel#agreement, QLabel#chatHeaderNote {{ color: {c.muted}; font-size: {t['small']}px; }}
QToolButton#thinkingToggle {{ color: {c.muted}; font-size: {t['small'] + 1}px; padding: {xs // 2}px 0; }}
QTextBrowser#reasoningText {{ color: {c.muted}; border-left: 3px solid {c.border}; padding-left: {s}px; }}
QFrame#messageActions QToolButton, QFrame#chatHeader QToolButton {{ color: {c.muted}; padding: 2px {s}px;
              border-radius: {r // 2}px; }}
QFrame#messageActions QToolButton:hover, QFrame#chatHeader QToolButton:hover {{ background: {c.surface_alt};
              color: {c.text}; }}
QFrame#chatHeader {{ background: {c.surface}; border: 1px solid {c.border}; border-radius: {r // 2}px; }}
QLabel#chatTitle {{ font-size: {t['title']}px; font-weight: 600; }}
QLabel#baseModelBanner {{ background: {c.tool_bubble}; border: 1px solid {c.tool_border};
              border-radius: {r // 2}px; padding: {s}px {m}px; }}
QLabel#chatError, QLabel#errorText {{ color: {c.error}; padding: {xs}px {s}px; }}
QLabel#chatNotice, QLabel#noticeText {{ color: {c.notice}; padding: {xs}px {s}px; }}
QWidget#statusStrip {{ background: {c.surface}; border-top: 1px solid {c.border}; }}
QWidget#statusStrip QLabel {{ color: {c.muted}; font-size: {t['small'] + 1}px; padding: 0 {xs}px; }}
QLabel#serviceStatus[running="true"] {{ color: {c.accent}; }}
"""


def _widgets_qss(c: Colors) -> str:
    """Rules for progress bars, group boxes, splitters, the Models page's cards, tooltips, the navigation rail
    and the chat panel."""
    xs, s, m, lg, r, t = SPACE[0], SPACE[1], SPACE[2], SPACE[3], RADIUS, TYPE
    return f"""QProgressBar {{ border: 1px solid {c.border}; border-radius: {r // 2}px; background: {c.window};
              color: {c.text}; text-align: center; font-size: {t['small']}px; min-height: 16px; max-height: 16px; }}
QProgressBar::chunk {{ background: {c.progress}; border-radius: {r // 2 - 1}px; }}
QGroupBox {{ border: 1px solid {c.border}; border-radius: {r // 2}px; margin-top: {lg}px; padding: {m}px {s}px
              {s}px {s}px; }}
QGroupBox::title {{ subcontrol-origin: margin; left: {s}px; padding: 0 {xs}px; font-weight: 600; }}
QSplitter::handle {{ background: {c.window}; width: {s}px; }}
QScrollArea#recommendedCards, QWidget#recommendedColumn {{ background: transparent; border: none; }}
QFrame#modelCard {{ background: {c.surface}; border: 1px solid {c.border}; border-radius: {r // 2}px;
              padding: {xs}px; }}
QLabel#cardName {{ font-weight: 600; font-size: {t['title'] - 1}px; }}
QLabel#cardFacts, QLabel#cardBlurb {{ color: {c.muted}; }}
QLabel#cardFit[fit="tight"] {{ color: {c.notice}; }}
QLabel#cardFit[fit="bad"] {{ color: {c.error}; }}
QToolTip {{ background: {c.surface}; color: {c.text}; border: 1px solid {c.border}; padding: {xs}px; }}
QFrame#navRail {{ background: {c.surface}; border-right: 1px solid {c.border}; }}
QFrame#navRail QPushButton {{ color: {c.text}; background: transparent; border: none;
              border-left: 3px solid transparent; border-radius: {r // 2}px; padding: {xs}px 0;
              font-size: {t['small'] + 1}px; min-height: 40px; }}
QFrame#navRail QPushButton:focus {{ border: 1px solid {c.accent}; border-left: 3px solid {c.accent}; }}
QFrame#navRail QPushButton:hover {{ background: {c.surface_alt}; }}
QFrame#navRail QPushButton:checked {{ background: {c.surface_alt}; border-left: 3px solid {c.accent}; }}
QToolButton:focus {{ border: 1px solid {c.accent}; border-radius: {r // 2}px; }}
QScrollArea#chatPanel, QWidget#chatPanelBody {{ background: {c.window}; border: none; }}
"""


def code_colors(name: str) -> tuple[str, str]:
    """``(Pygments style name, code block background)`` for theme ``name``."""
    c = PALETTES[name]
    return c.pygments_style, c.code_bg


class HearthStyle(QProxyStyle):
    """Fusion, with check boxes outlined in the muted text colour: Fusion's own outline is the window colour
    darkened, about 1.1:1 against the dark theme's window (issue 27); the muted colour is at least 4.6:1 against
    the window in both themes. Check boxes in item views (the document list) are drawn the same way.

    The keyboard focus ring (buttons, check boxes) is a solid accent line: Fusion's is the accent at 30 % opacity,
    under 2:1 against the button (WCAG 2.1 SC 1.4.11); on a button filled with the accent it is the button's
    text colour instead."""

    def __init__(self) -> None:
        super().__init__("Fusion")

    def drawPrimitive(self, element: QStyle.PrimitiveElement, option: QStyleOption,  # noqa: N802 - Qt API
                      painter: QPainter, widget: QWidget | None = None) -> None:
        """Fusion's drawing, then the check box's outline; our own focus ring instead of Fusion's."""
        if element == QStyle.PrimitiveElement.PE_FrameFocusRect:
            self._focus_ring(option, painter)
            return
        super().drawPrimitive(element, option, painter, widget)
        if element == QStyle.PrimitiveElement.PE_IndicatorCheckBox:
            painter.save()
            painter.setPen(QPen(option.palette.color(QPalette.ColorRole.PlaceholderText), 1))  # the muted token
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRect(option.rect.adjusted(0, 0, -1, -1))
            painter.restore()


    @staticmethod
    def _focus_ring(option: QStyleOption, painter: QPainter) -> None:
        """A 1-px accent rounded rectangle, drawn (as Fusion's) only after the keyboard moved the focus."""
        if not option.state & QStyle.StateFlag.State_KeyboardFocusChange:
            return
        pal, roles = option.palette, QPalette.ColorRole
        colour = pal.color(roles.Highlight)
        if colour == pal.color(roles.Button):  # an accent-filled button (the stylesheet sets its palette)
            colour = pal.color(roles.ButtonText)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(QPen(colour, 1))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRoundedRect(QRectF(option.rect).adjusted(0.5, 0.5, -0.5, -0.5), 2, 2)
        painter.restore()

    def drawComplexControl(self, control: QStyle.ComplexControl, option: QStyleOptionComplex,  # noqa: N802
                           painter: QPainter, widget: QWidget | None = None) -> None:
        """Fusion's drawing; a spin box (drawn by Fusion, with its arrows: the stylesheet leaves spin boxes
        alone, since a styled one loses them) gets the border of the other inputs."""
        super().drawComplexControl(control, option, painter, widget)
        if control == QStyle.ComplexControl.CC_SpinBox and not option.state & QStyle.StateFlag.State_HasFocus:
            painter.save()
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.setPen(QPen(option.palette.color(QPalette.ColorRole.Mid), 1))  # the border token
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(QRectF(option.rect).adjusted(0.5, 0.5, -0.5, -0.5), 2, 2)
            painter.restore()


class ThemeManager(QObject):
    """Applies the theme of ``mode`` to the application and follows the OS while ``mode`` is ``system``.
    ``changed(name)`` after each application ("light" / "dark"); ``name`` is the theme shown now."""

    changed = Signal(str)

    def __init__(self, app: QApplication, mode: str = "system") -> None:
        super().__init__(app)
        self.app = app
        self.mode = "system"
        self.name = ""
        self.style: HearthStyle | None = None
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._system_changed)
        self.set_mode(mode)

    def set_mode(self, mode: str) -> str:
        """Use ``mode`` (system / light / dark; ``ValueError`` naming the choices otherwise); returns the
        theme name now shown."""
        name = resolve(mode)
        self.mode = mode
        self._apply(name)
        return name

    def _system_changed(self, _scheme: object) -> None:
        if self.mode == "system":
            self._apply(system_scheme())

    def _apply(self, name: str) -> None:
        if self.style is None:  # one instance: the application owns it once set
            self.style = HearthStyle()
            self.app.setStyle(self.style)
        self.app.setPalette(palette(name))
        self.app.setStyleSheet(stylesheet(name))
        font = QFont(self.app.font())
        font.setPixelSize(TYPE["body"])
        self.app.setFont(font)
        changed = name != self.name
        self.name = name
        if changed:
            self.changed.emit(name)


_manager: ThemeManager | None = None


def manager() -> ThemeManager:
    """The application's ``ThemeManager`` (created on first use with the mode saved in ``ui.json``)."""
    global _manager
    app = QApplication.instance()
    if _manager is None or _manager.app is not app:
        from app.ui.prefs import load_prefs

        _manager = ThemeManager(app, load_prefs().theme)  # type: ignore[arg-type]
    return _manager


def current() -> str:
    """The theme shown now ("light" when no manager applied one yet)."""
    return _manager.name if _manager is not None and _manager.app is QApplication.instance() else "light"


def apply_theme(app: QApplication, mode: str | None = None) -> str:
    """Style ``app`` for ``mode`` (None: the saved mode); returns "light" or "dark"."""
    m = manager() if _manager is None or _manager.app is not app else _manager
    return m.set_mode(mode) if mode is not None else m.name


def follow_system(app: QApplication) -> None:
    """Apply the saved theme now; while it is ``system``, follow the OS switching between light and dark."""
    apply_theme(app)
