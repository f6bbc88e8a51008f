"""Render resources/hearth.svg into hearth.png (256 px) and hearth.ico (16-256 px) with Qt; run once after
changing the SVG: ``QT_QPA_PLATFORM=offscreen python packaging/make_icon.py``."""

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

RES = Path(__file__).resolve().parents[1] / "resources"


def render(size: int) -> QImage:
    img = QImage(size, size, QImage.Format.Format_ARGB32)
    img.fill(Qt.GlobalColor.transparent)
    painter = QPainter(img)
    QSvgRenderer(str(RES / "hearth.svg")).render(painter)
    painter.end()
    return img


if __name__ == "__main__":
    app = QGuiApplication([])
    render(256).save(str(RES / "hearth.png"))
    render(256).save(str(RES / "hearth.ico"))
    print("wrote", RES / "hearth.png", RES / "hearth.ico")
