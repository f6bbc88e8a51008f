"""One host for Hearth's llama.cpp child processes (docs/engine.md, "The process host"): ``threads`` (thread
and OpenMP policy), ``child`` (the child's loops), ``host`` (``ChildHost``), ``calls`` (its requests in
flight), ``watchdog`` (heartbeats and read receipts)."""

from app.childhost.calls import Call, MuxCall
from app.childhost.child import PARENT_WATCH_S, ChildBug, Handler, MuxHandler, bug_text, watch_parent
from app.childhost.host import ChildHost, Timeouts
from app.childhost.threads import default_threads, tune_openmp

__all__ = ["PARENT_WATCH_S", "Call", "ChildBug", "ChildHost", "Handler", "MuxCall", "MuxHandler", "Timeouts",
           "bug_text", "default_threads", "tune_openmp", "watch_parent"]
