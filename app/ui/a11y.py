"""Accessibility checks for the window (issue 27): colour contrast of the theme's tokens and the accessible
names of controls, as WCAG 2.1 (AA) measures them.

Contrast is computed from the design tokens (``app.ui.theme.PALETTES``), not from screenshots: each pair the
stylesheet draws is listed once here (``_PAIRS``, with where it is drawn), and ``token_pairs`` gives it with its
required ratio. Text needs 4.5:1 (success criterion 1.4.3); the boundaries of controls, focus rings, selection
marks and progress chunks need 3:1 against what they sit on (1.4.11). Disabled controls are exempt (1.4.3).
Decorative frames (bubbles, cards, group boxes, separators) keep the lighter ``border`` token: they identify
no control. Pygments' colours in code blocks are checked against the code background by ``code_pairs``.

Names are read as a screen reader reads them, through Qt's accessibility interface: a button's text, an
explicit ``setAccessibleName`` and a buddy or form-layout label all count. Placeholder text does not: Qt 6
reports it as the description, never the name (and it disappears while one types). On Linux Qt reports a combo
box's current item as its name; that is its value, so a combo box needs an explicit name or a label.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAccessible, QColor
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QAbstractSpinBox,
    QComboBox,
    QLineEdit,
    QPlainTextEdit,
    QSlider,
    QTabBar,
    QTextEdit,
    QWidget,
)

from app.ui.theme import PALETTES

TEXT = 4.5  # WCAG 2.1 SC 1.4.3, contrast (minimum), normal-size text
NON_TEXT = 3.0  # WCAG 2.1 SC 1.4.11, non-text contrast: control boundaries, focus, state marks, graphics
RATIOS = {"text": TEXT, "control border": NON_TEXT, "focus ring": NON_TEXT, "selection": NON_TEXT,
          "graphic": NON_TEXT}

# (foreground token, background token, kind): every pair the stylesheet, the palette and the chat's rich text
# draw, each with where; tests/test_ui_accessibility.py checks that every colour the sheet uses
# for text has a pair here.
_PAIRS: tuple[tuple[str, str, str], ...] = (
    # body text on every surface (labels, inputs, tooltips, hovered buttons, the progress bar's text)
    *(("text", bg, "text") for bg in ("window", "surface", "surface_alt", "user_bubble", "assistant_bubble",
                                      "tool_bubble", "code_bg", "progress")),
    # muted: placeholders, notes, tabs, the status strip, card facts, message status, thinking, citation marks
    *(("muted", bg, "text") for bg in ("window", "surface", "user_bubble", "assistant_bubble", "tool_bubble")),
    ("accent_text", "accent", "text"),  # selected items, Send / New chat, search hits in a chat
    ("accent", "surface", "text"),  # the status strip's service state while running
    *(("error", bg, "text") for bg in ("window", "surface", "tool_bubble")),  # errors, a failed tool call
    *(("notice", bg, "text") for bg in ("window", "surface", "assistant_bubble")),  # notices, "not supported"
    *(("link", bg, "text") for bg in ("window", "surface", "assistant_bubble")),  # links, citations
    *(("control_border", bg, "control border") for bg in ("window", "surface")),  # buttons, inputs, spin boxes
    ("muted", "window", "control border"),  # check boxes (theme.HearthStyle outlines them in muted)
    ("muted", "surface", "control border"),  # check boxes in lists
    *(("accent", bg, "focus ring") for bg in ("window", "surface")),  # a focused input, button, check box
    ("accent_text", "accent", "focus ring"),  # the focus ring on Send / New chat (theme.HearthStyle)
    ("accent", "window", "selection"),  # the selected tab's underline; Send / New chat's fill
    ("accent", "surface", "selection"),  # the selected item in a list or dropdown
    ("accent", "surface_alt", "selection"),  # the navigation rail's mark of the page shown
    ("progress", "window", "graphic"),  # a progress bar's chunk on its track
    ("notice", "assistant_bubble", "graphic"),  # the wavy underline of an unsupported sentence
)


def _rgb(colour: str | QColor, name: str) -> tuple[int, int, int]:
    if isinstance(colour, QColor):
        return colour.red(), colour.green(), colour.blue()
    s = colour.strip() if isinstance(colour, str) else ""
    if len(s) != 7 or s[0] != "#":
        raise ValueError(f"{name} must be a '#rrggbb' string or a QColor, got {colour!r}")
    try:
        return int(s[1:3], 16), int(s[3:5], 16), int(s[5:7], 16)
    except ValueError:
        raise ValueError(f"{name} must be a '#rrggbb' string or a QColor, got {colour!r}") from None


def relative_luminance(colour: str | QColor) -> float:
    """The WCAG 2.1 relative luminance of an sRGB colour (0 black … 1 white)."""
    def linear(channel: int) -> float:
        c = channel / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(v) for v in _rgb(colour, "colour"))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(fg: str | QColor, bg: str | QColor) -> float:
    """The contrast ratio of two colours, 1.0 (none) to 21.0 (black on white), the same either way round.

    WCAG 2.1, definition "contrast ratio": (L1 + 0.05) / (L2 + 0.05), L1 the relative luminance of the lighter
    colour and L2 of the darker; relative luminance (definition "relative luminance") is
    0.2126 R + 0.7152 G + 0.0722 B of the linearised sRGB channels (c / 12.92 when c <= 0.04045, else
    ((c + 0.055) / 1.055) ** 2.4). https://www.w3.org/TR/WCAG21/#dfn-contrast-ratio. Takes '#rrggbb' strings
    or QColors (alpha is ignored); ``ValueError`` names the argument otherwise."""
    for colour, name in ((fg, "fg"), (bg, "bg")):
        _rgb(colour, name)  # a bad argument is named before any arithmetic
    lighter, darker = sorted((relative_luminance(fg), relative_luminance(bg)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def token_pairs(theme_name: str) -> list[tuple[str, str, str, float]]:
    """``(foreground token, background token, kind, required ratio)`` for every pair theme ``theme_name``
    draws (the same pairs in both themes). Kinds: ``text`` (4.5), ``control border``, ``focus ring``,
    ``selection`` and ``graphic`` (3.0)."""
    if theme_name not in PALETTES:
        raise ValueError(f"theme_name must be one of {', '.join(PALETTES)}, got {theme_name!r}")
    return [(fg, bg, kind, RATIOS[kind]) for fg, bg, kind in _PAIRS]


def code_pairs(theme_name: str) -> list[tuple[str, str, float]]:
    """``(Pygments token type, colour, contrast ratio)`` of each coloured token type of the theme's Pygments
    style against its code background (``theme.code_colors``); whitespace is left out (it draws nothing)."""
    from pygments.styles import get_style_by_name
    from pygments.token import Whitespace

    from app.ui.theme import code_colors

    style, background = code_colors(theme_name)
    return [(str(token), f"#{spec['color']}", contrast_ratio(f"#{spec['color']}", background))
            for token, spec in get_style_by_name(style) if spec["color"] and token not in Whitespace]


def contrast_failures(theme_name: str) -> list[str]:
    """A line for each token pair or code colour of theme ``theme_name`` below its required ratio (none: [])."""
    colours = PALETTES[theme_name]
    out = []
    for fg, bg, kind, need in token_pairs(theme_name):
        got = contrast_ratio(getattr(colours, fg), getattr(colours, bg))
        if got < need:
            out.append(f"{theme_name}: {fg} on {bg} ({kind}) is {got:.2f}:1, needs {need}:1")
    out += [f"{theme_name}: code {token} {colour} is {got:.2f}:1, needs {TEXT}:1"
            for token, colour, got in code_pairs(theme_name) if got < TEXT]
    return out


_INTERACTIVE = (QAbstractButton, QComboBox, QLineEdit, QPlainTextEdit, QTextEdit, QAbstractSpinBox, QSlider,
                QAbstractItemView, QTabBar)
_COMPOUND = (QAbstractSpinBox, QComboBox, QTabBar, QLineEdit)  # their child widgets are parts of themselves


def is_interactive(w: QWidget) -> bool:
    """Whether ``w`` is a control a person operates (a read-only text view is content, not a control)."""
    if isinstance(w, (QPlainTextEdit, QTextEdit)):
        return not w.isReadOnly()
    return isinstance(w, _INTERACTIVE)


def is_tab_stop(w: QWidget) -> bool:
    """Whether Tab stops at ``w`` (its focus policy has ``Qt.TabFocus``): a control, or a view a person reads
    with the keyboard (a message's text, a scroll area), which a screen reader announces by name too."""
    return bool(w.focusPolicy() & Qt.FocusPolicy.TabFocus)


def accessible_name(w: QWidget) -> str:
    """The name assistive technology announces for ``w``: its explicit accessible name, else Qt's (its text, a
    buddy or form label, its group box's title), else the label that labels it; a name that is only the
    control's value (Qt on Linux names a combo box by its current item) does not count."""
    iface = QAccessible.queryAccessibleInterface(w)
    if w.accessibleName().strip() or iface is None or not iface.isValid():
        return w.accessibleName().strip()
    name = iface.text(QAccessible.Text.Name).strip()
    if name and name != iface.text(QAccessible.Text.Value).strip():
        return name
    for label, _relation in iface.relations(QAccessible.RelationFlag.Label):
        text = label.text(QAccessible.Text.Name).strip()
        if text:
            return text
    return ""


def _part_of_another(w: QWidget, root: QWidget) -> bool:
    """A widget inside a spin box, combo box, tab bar or line edit (its editor, popup, scroll arrows, clear
    button): announced as part of that control."""
    p = w.parentWidget()
    while p is not None and p is not root:
        if isinstance(p, _COMPOUND):
            return True
        p = p.parentWidget()
    return w.objectName().startswith("qt_")


def describe(w: QWidget) -> str:
    """``w`` in one line for a report: class, object name, text, placeholder, tooltip and its owner's class."""
    parts = [type(w).__name__ + (f"#{w.objectName()}" if w.objectName() else "")]
    for label, getter in (("text", "text"), ("placeholder", "placeholderText"), ("tooltip", "toolTip")):
        value = getattr(w, getter)() if hasattr(w, getter) else ""
        if isinstance(value, str) and value:
            parts.append(f"{label}={value[:60]!r}")
    owner = w.parentWidget()
    while owner is not None and type(owner).__module__.startswith("PySide6"):
        owner = owner.parentWidget()
    if owner is not None:
        parts.append(f"in {type(owner).__name__}" + (f"#{owner.objectName()}" if owner.objectName() else ""))
    return " ".join(parts)


def unnamed_controls(root: QWidget, include_hidden: bool = False) -> list[str]:
    """``describe`` of each interactive control (``is_interactive``) or other Tab stop (``is_tab_stop``: a
    read-only text view, a scroll area) under ``root`` that has no accessible name (``accessible_name``).
    Only those visible to ``root`` unless ``include_hidden`` (e.g. other pages of a stack); the parts of
    compound controls (a spin box's editor, a combo box's popup) are left out."""
    found = []
    for w in root.findChildren(QWidget):
        if not (is_interactive(w) or is_tab_stop(w)) or _part_of_another(w, root):
            continue
        if not include_hidden and not w.isVisibleTo(root):
            continue
        if not accessible_name(w):
            found.append(describe(w))
    return found


def _focus_chain(root: QWidget) -> list[QWidget]:
    """The widgets of ``root``'s window after ``root`` in the order Tab follows (``nextInFocusChain``), once."""
    chain, seen, w = [], set(), root.nextInFocusChain()
    while w is not root and w not in seen:
        chain.append(w)
        seen.add(w)
        w = w.nextInFocusChain()
    return chain


def tab_order(root: QWidget) -> list[QWidget]:
    """The widgets Tab stops at under ``root``, in the order it visits them: the enabled Tab stops
    (``is_tab_stop``) visible to ``root``, parts of compound controls left out, as ``unnamed_controls``."""
    return [w for w in _focus_chain(root) if root.isAncestorOf(w) and is_tab_stop(w) and w.isVisibleTo(root)
            and w.isEnabled() and not _part_of_another(w, root)]


def keyboard_unreachable(root: QWidget) -> list[str]:
    """``describe`` of each enabled interactive control visible to ``root`` that the keyboard never reaches:
    its focus policy lacks ``Qt.TabFocus``, or it is missing from the window's focus chain
    (``QWidget.nextInFocusChain``, the order Tab follows). A button of an exclusive group is reached as a radio
    group is: Tab stops at the one of them holding Tab focus and the arrow keys move along the group. An
    editable text box must pass Tab on (``tabChangesFocus``): one that types a tab traps the keyboard. Parts of
    compound controls are left out, as in ``unnamed_controls``."""
    chain = set(_focus_chain(root))
    found = []
    for w in root.findChildren(QWidget):
        if not is_interactive(w) or _part_of_another(w, root) or not w.isVisibleTo(root) or not w.isEnabled():
            continue
        group = w.group() if isinstance(w, QAbstractButton) else None
        stops = group.buttons() if group is not None and group.exclusive() else [w]  # arrows move in a group
        if not any(b.focusPolicy() & Qt.FocusPolicy.TabFocus and b in chain for b in stops):
            found.append(describe(w))
        elif isinstance(w, (QPlainTextEdit, QTextEdit)) and not w.isReadOnly() and not w.tabChangesFocus():
            found.append(describe(w) + " (Tab types a tab: the keyboard cannot leave it)")
    return found
