"""Hearth's desktop app (PySide6): windows, item models and workers over the Qt-free core.

Shape (STYLE.md §10, §13):

- ``workers``: ``FunctionWorker`` / ``GeneratorWorker`` on a private ``QThreadPool`` (superqt's pattern). Every
  call that can take more than a few milliseconds (model load and unload, generation, tokenization, ingest,
  downloads, the HTTP port starting) runs there; the GUI thread only touches widgets and small SQLite reads.
- ``*_ctl`` modules: controllers (``QObject``) that own one core object each (the ``Engine``, a turn of a
  ``ChatSession``, the document index, the HTTP server, downloads) and speak in signals. Widgets never call the
  engine directly, so the engine's queue can never make the GUI thread wait.
- ``models``: ``QAbstractListModel`` item models (conversations, models, documents, chat messages), tested
  without a window.
- ``markdown``, ``formatting``, ``recommend``, ``hub``, ``model_files``: pure helpers, tested without Qt.
- Widgets: ``main_window`` (sidebar | chat | Models · Documents · Port tabs, status strip), ``chat_view``,
  ``sidebar``, ``status_strip``, ``model_panel``, ``documents_panel``, ``port_panel``, ``settings_dialog``.

Streaming text is re-rendered as Markdown at most every ``RENDER_INTERVAL_MS`` (qutebrowser's throttle
idea), not per token. Nothing in the core imports this package.
"""
