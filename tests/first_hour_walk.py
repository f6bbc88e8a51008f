"""A first hour with the real window and the real bundled model (issue 27), step by step, as a report.

``walk(home, files)`` drives the window on an empty data folder ``home`` (HEARTH_HOME, prepared with the model
links and short greedy settings) through: first start, a chat, an edit (a branch), a regeneration (a second
version), a dropped document attached to a new chat only, every page at full width and at 900 × 700, a restart.
After every step it checks that the window fits the screen, did not widen itself, and cut no text
(``clipped``). It returns a JSON-able report and never raises; a step that cannot go on ends the walk there.

It runs in the process of ``tests/test_ui_first_hour_walk.py`` (offscreen), or as a child under Xvfb with the
xcb platform: ``python -m tests.first_hour_walk --home DIR --files DIR --report FILE``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QEventLoop, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QAbstractButton, QApplication, QComboBox, QLabel, QProgressBar

LOAD_S = 180  # a model load on a busy 2-core machine, seconds
ANSWER_S = 180
START_WIDTH = 1280  # the window's width at a first start on a roomy screen (MainWindow.__init__)
NARROW = (900, 700)
PAGE_ORDER = ("documents", "models", "tools", "port", "settings", "chats")  # from Chats, ending there


class StepFailed(Exception):
    """The walk cannot go on (what it waited for did not come, or the state the next step needs is wrong)."""


# -- the checks after every step -----------------------------------------------------------------------------
def clipped(window: Any) -> list[str]:
    """Text cut without its whole being at hand, in the chat header (title first), the status strip and the
    rail: an ``ElidedLabel`` cut must end with "…" and carry its whole text as its tooltip; any other visible
    label must be word-wrapped or as wide as its text (``sizeHint``); buttons' and the context bar's text must
    fit their width; the model picker's tooltip names the model whole. Empty: nothing is cut."""
    from app.ui.labels import ElidedLabel

    problems: list[str] = []
    for where, root in (("header", window.header), ("status strip", window.status), ("rail", window.rail)):
        for label in root.findChildren(QLabel):
            if label.isVisible():
                problems += [f"{where}: {p}" for p in _label_cut(label, ElidedLabel)]
        for button in root.findChildren(QAbstractButton):
            if button.isVisible():
                problems += [f"{where}: {p}" for p in _button_cut(button)]
        for bar in root.findChildren(QProgressBar):
            room = bar.contentsRect().width()
            if bar.isVisible() and bar.isTextVisible() and bar.fontMetrics().horizontalAdvance(bar.text()) > room:
                problems.append(f"{where}: the bar's text {bar.text()!r} is wider than its {room} px")
        for combo in root.findChildren(QComboBox):
            if combo.isVisible() and combo.currentText() and combo.toolTip() != combo.currentText():
                problems.append(f"{where}: {_name(combo)} shows {combo.currentText()!r} but its tooltip is "
                                f"{combo.toolTip()!r}")
    return problems


def _name(w: Any) -> str:
    return w.objectName() or w.accessibleName() or type(w).__name__


def _label_cut(label: QLabel, elided: type) -> list[str]:
    shown, width = QLabel.text(label), label.width()
    if isinstance(label, elided):
        full = label.text()
        room = label.contentsRect().width() - 2 * label.margin()
        out = []
        if label.fontMetrics().horizontalAdvance(shown) > max(room, 0):
            out.append(f"{_name(label)} shows {shown!r}, wider than its {room} px")
        if shown != full and (not shown.endswith("…") or not QLabel.toolTip(label).startswith(full)):
            out.append(f"{_name(label)} is cut to {shown!r} without '…' and its whole text {full!r} as the "
                       f"tooltip (tooltip {QLabel.toolTip(label)!r})")
        return out
    if label.wordWrap() or label.sizeHint().width() <= width:
        return []
    return [f"{_name(label)} {shown!r} needs {label.sizeHint().width()} px, has {width}"]


def _button_cut(button: QAbstractButton) -> list[str]:
    fm, width = button.fontMetrics(), button.width()
    lines = [ln for ln in button.text().split("\n") if ln]
    wide = [ln for ln in lines if fm.horizontalAdvance(ln) > width]
    out = [f"{_name(button)}: {ln!r} is {fm.horizontalAdvance(ln)} px wide, the button {width}" for ln in wide]
    if not out and lines and button.sizeHint().width() > width:
        out.append(f"{_name(button)} {button.text()!r} needs {button.sizeHint().width()} px, has {width}")
    return out


def misfit(window: Any, max_width: int) -> list[str]:
    """The window's frame outside the screen's available area, or the window wider than ``max_width``."""
    frame, avail = window.frameGeometry(), window.screen().availableGeometry()
    out = []
    if not avail.contains(frame):
        out.append(f"the window's frame {_rect(frame)} is not within the screen's available {_rect(avail)}")
    if window.width() > max_width:
        out.append(f"the window is {window.width()} px wide, more than {max_width}")
    return out


def _rect(r: Any) -> str:
    return f"{r.width()}×{r.height()}+{r.x()}+{r.y()}"


# -- the walk ---------------------------------------------------------------------------------------------------
class Walk:
    """One first hour; ``report`` fills as it goes (``run`` returns it)."""

    def __init__(self, home: Path, files: Path) -> None:
        self.app = QApplication.instance() or QApplication(["hearth"])
        self.home, self.files = home, files
        self.w: Any = None
        self.max_width = START_WIDTH
        self.cids: list[str] = []
        self.edited = "What is the capital of Italy?"
        screen = self.app.primaryScreen()
        self.report: dict[str, Any] = {"platform": self.app.platformName(), "screen": _rect(screen.geometry()),
                                       "available": _rect(screen.availableGeometry()), "steps": [], "error": None}

    # -- helpers ----------------------------------------------------------------------------------------------
    def spin(self, cond: Callable[[], bool], what: str, timeout_s: float = 10) -> None:
        """Run the event loop until ``cond()``; StepFailed naming ``what`` after ``timeout_s`` seconds."""
        end = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > end:
                raise StepFailed(f"timed out after {timeout_s:.0f} s waiting for {what}")
            self.app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)

    def settle(self) -> None:
        for _ in range(5):
            self.app.processEvents()
            QTest.qWait(20)

    def ask(self, text: str) -> Any:
        """Type ``text``, press Enter, wait for the answer; returns its row."""
        w = self.w
        w.chat.composer.setFocus()
        QTest.keyClicks(w.chat.composer, text)
        QTest.keyClick(w.chat.composer, Qt.Key.Key_Return)
        self.spin(lambda: w.ctx.chat.busy, "the answer to begin")
        self.spin(lambda: not w.ctx.chat.busy, "the answer to end", ANSWER_S)
        self.settle()
        return w.chat_model.items()[-1]

    def open_window(self) -> Any:
        from app.ui.context import AppContext
        from app.ui.main_window import MainWindow

        self.w = MainWindow(AppContext())
        self.w.show()
        QTest.qWaitForWindowExposed(self.w, 10_000)
        self.w.activateWindow()
        QTest.qWaitForWindowActive(self.w, 5_000)
        self.spin(lambda: self.w.ctx.engine.state == "ready", "the model to load", LOAD_S)
        self.settle()
        return self.w

    def close_window(self, fails: list[str]) -> None:
        """Close as a person does; what ``close_window`` in tests/test_ui_window.py asserts, as failures."""
        w, self.w = self.w, None
        ctx = w.ctx
        w.close()
        if ctx.pool.pool.activeThreadCount() or ctx.pool.active:
            fails.append(f"workers still running after the window closed ({ctx.pool.active})")
        left = [p.name for p in multiprocessing.active_children() if p.name in ("hearth-engine", "hearth-embedder")]
        if left:
            fails.append(f"processes left after the window closed: {left}")
        if [t for t in threading.enumerate() if t.name == "hearth-http"]:
            fails.append("the HTTP server thread is still running after the window closed")
        w.deleteLater()
        self.settle()

    def step(self, name: str, body: Callable[[list[str]], None], after: bool = True) -> None:
        """Run ``body(fails)`` (it appends what went wrong), then the fit and clipping checks."""
        fails: list[str] = []
        t0 = time.monotonic()
        entry = {"step": name, "failures": fails}
        self.report["steps"].append(entry)
        try:
            body(fails)
        except StepFailed as exc:
            fails.append(f"stopped: {exc}")
            raise
        finally:
            if after and self.w is not None:
                self.settle()
                fails += [p for p in self.look(self.w.current_page()) if p not in fails]
            entry["seconds"] = round(time.monotonic() - t0, 1)

    def look(self, page: str) -> list[str]:
        return [f"[{page}] {p}" for p in misfit(self.w, self.max_width) + clipped(self.w)]

    # -- the steps ----------------------------------------------------------------------------------------------
    def first_start(self, fails: list[str]) -> None:
        from app import paths

        if (self.home / "hearth.db").exists():
            names = sorted(p.name for p in self.home.iterdir())
            fails.append(f"the data folder is not empty at the first start: {names}")
        w = self.open_window()
        self.report["start_size"] = [w.width(), w.height()]
        self.max_width = min(START_WIDTH, w.width())
        if w.width() > START_WIDTH:
            fails.append(f"the first window is {w.width()} px wide, more than {START_WIDTH}")
        job = w.ctx.engine.job
        if Path(job.path).name != paths.bundled_model_path().name:
            fails.append(f"the first start loaded {job.path}, not the bundled model")
        listed = w.models.model
        self.spin(lambda: listed.row_of_path(job.path) >= 0, "the answering model in the Models list")
        row = listed.row_of_path(job.path)
        index, entry = listed.index(row), listed.item(row)
        shown = f"{index.data()} {index.data(Qt.ItemDataRole.ToolTipRole)}"
        if not entry.installed or "not installed" in shown:
            fails.append(f"the Models list says the answering model is not installed: {shown!r}")
        if not w.chat.send_btn.isEnabled():
            fails.append("Send is not enabled once the model is ready")
        if not w.status.model.text().startswith("Model: "):
            fails.append(f"the status strip does not name the model: {w.status.model.text()!r}")

    def chat(self, fails: list[str]) -> None:
        w = self.w
        answer = self.ask("What is the capital of France?")
        rows = w.chat_model.items()
        if [r.role for r in rows] != ["user", "assistant"] or answer.status != "complete" or not answer.content:
            raise StepFailed(f"the first answer did not complete: {[(r.role, r.status, r.content) for r in rows]}")
        self.cids.append(w.conversation_id)
        title = w.ctx.store.get_conversation(w.conversation_id).title
        if not title or w.header.title.text() != title:
            fails.append(f"the header shows {w.header.title.text()!r}, the chat is titled {title!r}")
        if w.sidebar.model.row_of(w.conversation_id) < 0:
            fails.append("the new chat is not in the sidebar")
        if not w.status.ttft.text().startswith("TTFT "):
            fails.append(f"no TTFT after the answer: {w.status.ttft.text()!r}")

    def edit(self, fails: list[str]) -> None:
        w = self.w
        first = w.chat_model.item(0)
        w.chat.widgets[0].buttons["edit"].click()  # message_action("edit", the user row)
        if w.chat.composer.toPlainText() != first.content or not w.chat.edit_bar.isVisible():
            raise StepFailed(f"Edit did not put the message back in the box: {w.chat.composer.toPlainText()!r}")
        w.chat.composer.clear()
        answer = self.ask(self.edited)
        rows = w.chat_model.items()
        if len(rows) != 2 or rows[0].content != self.edited or rows[0].siblings != (2, 2):
            raise StepFailed(f"the edit is not a second branch: {[(r.content, r.siblings) for r in rows]}")
        if answer.status != "complete" or not answer.content:
            fails.append(f"the edited question's answer did not complete: {answer.status} {answer.content!r}")

    def regenerate(self, fails: list[str]) -> None:
        w = self.w
        w.chat.widgets[1].buttons["regenerate"].click()
        self.spin(lambda: not w.ctx.chat.busy, "the regenerated answer", ANSWER_S)
        self.settle()
        rows = w.chat_model.items()
        answer = rows[-1]
        if answer.siblings != (2, 2) or answer.status != "complete" or not answer.content:
            raise StepFailed(f"regenerate made no second version: {answer.siblings} {answer.status}")
        if rows[0].content != self.edited or rows[0].siblings != (2, 2):
            fails.append(f"regenerating left the edited branch: {rows[0].content!r} {rows[0].siblings}")
        if not w.chat.widgets[1].branch.isVisible() or w.chat.widgets[1].branch.text() != "2/2":
            fails.append(f"the answer's version counter shows {w.chat.widgets[1].branch.text()!r}")

    def document(self, fails: list[str]) -> None:
        w = self.w
        if not w.ctx.docs.available:
            raise StepFailed("app.retrieval is not in this build")
        QTest.keyClick(w.chat.composer, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)  # a new chat
        self.settle()
        if w.conversation_id is not None or w.chat_model.rowCount():
            fails.append("Ctrl+N did not start a new chat; w.new_chat() used instead")
            w.new_chat()
        doc = self.files / "ferries.txt"
        doc.write_text("Ferry timetable.\n\nThe ferry to Lindholm island leaves at 7:45 every morning from pier 4.\n")
        from tests.test_ui_window import drop

        drop(w, [doc])  # over the chat's messages: nothing there takes drops, the window does
        listed = w.documents.model
        self.spin(lambda: listed.row_of(str(doc)) >= 0 and not w.ctx.docs.busy, "the dropped file's indexing", 120)
        self.settle()
        row = listed.item(listed.row_of(str(doc)))
        if row.status != "indexed" or row.chunks < 1:
            raise StepFailed(f"the dropped file was not indexed: {row}")
        self.header_documents(fails, "before the first message")
        answer = self.ask("When does the ferry to Lindholm leave?")
        cid = w.conversation_id
        self.cids.append(cid)
        if answer.status != "complete":
            fails.append(f"the answer about the document did not complete: {answer.status}")
        if w.ctx.conversation_documents(cid) != [str(doc)]:
            fails.append(f"the new chat's documents are {w.ctx.conversation_documents(cid)}, not the dropped file")
        if w.ctx.conversation_documents(self.cids[0]) != []:
            fails.append(f"the first chat was given documents: {w.ctx.conversation_documents(self.cids[0])}")
        given = w.ctx.store.get_message(answer.id).meta.get("evidence") or []
        if str(doc) not in [p.get("path") for p in given]:
            fails.append(f"the answer's stored evidence does not include the document: {given}")
        if str(doc) not in [c.get("path") for c in answer.citations or answer.retrieved]:
            fails.append("the passages under the answer do not list the document")
        self.header_documents(fails, "after the answer")

    def header_documents(self, fails: list[str], when: str) -> None:
        note = self.w.header.documents
        if not note.isVisible() or note.text() != "▤ Documents: 1" or "ferries.txt" not in note.toolTip():
            fails.append(f"{when}: the header's documents note is {note.text()!r} (shown: {note.isVisible()})")

    def pages(self, fails: list[str]) -> None:
        """Every page by its rail button; the checks on each."""
        w = self.w
        for name in PAGE_ORDER:
            QTest.mouseClick(w.rail.buttons[name], Qt.MouseButton.LeftButton)
            self.settle()
            if w.current_page() != name:
                fails.append(f"the rail's {name} button shows {w.current_page()}")
            fails += self.look(name)

    def narrow(self, fails: list[str]) -> None:
        """The window at 900 × 700 (less where the screen is smaller), every page again."""
        w, avail = self.w, self.w.screen().availableGeometry()
        frame = w.frameGeometry().size() - w.size()  # the decorations: the frame must fit, not only the window
        w.resize(min(NARROW[0], avail.width() - frame.width()), min(NARROW[1], avail.height() - frame.height()))
        self.settle()
        self.max_width = w.width()
        self.report["narrow_size"] = [self.w.width(), self.w.height()]
        self.pages(fails)

    def restart(self, fails: list[str]) -> None:
        from app import paths

        self.close_window(fails)
        self.max_width = START_WIDTH
        w = self.open_window()
        if w.width() > START_WIDTH:
            fails.append(f"the window is {w.width()} px wide at the restart")
        if Path(w.ctx.engine.job.path).name != paths.bundled_model_path().name:
            fails.append(f"the restart loaded {w.ctx.engine.job.path}, not the last model")
        if not w.chat.send_btn.isEnabled():
            fails.append("Send is not enabled after the restart")
        self.spin(lambda: all(w.sidebar.model.row_of(c) >= 0 for c in self.cids), "both chats in the sidebar")
        index = w.sidebar.model.index(w.sidebar.model.row_of(self.cids[0]))
        view = w.sidebar.view
        view.scrollTo(index)
        QTest.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=view.visualRect(index).center())
        self.spin(lambda: w.conversation_id == self.cids[0], "the first chat to open from the sidebar")
        self.settle()
        rows = w.chat_model.items()
        shown = [(r.role, r.content if r.role == "user" else "", r.siblings) for r in rows]
        if len(rows) != 2 or shown[0] != ("user", self.edited, (2, 2)) or rows[1].siblings != (2, 2):
            fails.append(f"the first chat reopened without its branch: {shown}")
        title = w.ctx.store.get_conversation(self.cids[0]).title
        if w.header.title.text() != title:
            fails.append(f"the reopened chat's header shows {w.header.title.text()!r}, not {title!r}")

    def run(self) -> dict[str, Any]:
        steps: list[tuple[str, Callable[[list[str]], None]]] = [
            ("1 first start on an empty data folder", self.first_start), ("2 a chat", self.chat),
            ("3 edit: a branch", self.edit), ("4 regenerate: a second version", self.regenerate),
            ("5 a dropped document, this chat only", self.document), ("6 every page", self.pages),
            ("6b every page at 900 × 700", self.narrow), ("7 close and start again", self.restart)]
        try:
            for name, body in steps:
                self.step(name, body)
        except StepFailed as exc:
            self.report["error"] = f"the walk stopped: {exc}"
        except Exception as exc:  # noqa: BLE001 - the report says where the walk stopped and why
            self.report["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        finally:
            if self.w is not None:
                self.step("8 close", self.close_window, after=False)
        return self.report


def walk(home: Path, files: Path) -> dict[str, Any]:
    """The report of one first hour on data folder ``home`` (the process's HEARTH_HOME), with files to drop
    written to ``files``."""
    return Walk(home, files).run()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--home", type=Path, required=True, help="the HEARTH_HOME the process runs with")
    p.add_argument("--files", type=Path, required=True, help="a folder for the files to drop")
    p.add_argument("--report", type=Path, required=True, help="where to write the JSON report")
    args = p.parse_args(argv)
    app = QApplication(sys.argv[:1])
    app.setApplicationName("Hearth")
    args.report.write_text(json.dumps(walk(args.home, args.files), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
