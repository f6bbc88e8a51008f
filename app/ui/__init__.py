"""Hearth's desktop app (PySide6): windows, item models and workers over the Qt-free core.

Shape (STYLE.md §10, §13):

The reasoning: docs/ui.md, 'app/ui/__init__.py'.
"""
