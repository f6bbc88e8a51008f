"""GUI-thread stalls of the desktop app while a model loads and while a 3000-token prompt is prefilled.

A ``QTimer`` fires every 10 ms on the GUI thread and records when it actually ran; a stall is the longest gap
between two beats (nominal 10 ms). Phases, on the real window (offscreen) with the bundled model:

1. load the model (worker: inspect + spawn the engine process + llama.cpp load);
2. send a ~3000-token message (prefix cache off, so all of it is prefilled) and wait for the first token;
3. the rest of the answer (16 tokens), streamed and rendered as Markdown;
4. abort a load in progress (Esc): time until the engine process is gone.

Target: max gap < 100 ms. Run: ``QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/ui_stall.py [--json]``.
Uses a temporary HEARTH_HOME; the model comes from .cache/models (``app.catalog.bundled``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class Heartbeat:
    def __init__(self, interval_ms: int = 10) -> None:
        from PySide6.QtCore import QTimer

        self.beats: list[float] = []
        self.timer = QTimer(interval=interval_ms)
        self.timer.setTimerType(self.timer.timerType().PreciseTimer)
        self.timer.timeout.connect(lambda: self.beats.append(time.perf_counter()))

    def start(self) -> None:
        self.beats = [time.perf_counter()]
        self.timer.start()

    def stop(self) -> dict:
        self.timer.stop()
        self.beats.append(time.perf_counter())
        gaps = sorted((b - a) * 1000 for a, b in zip(self.beats, self.beats[1:]))
        p99 = gaps[int(0.99 * (len(gaps) - 1))] if gaps else 0.0
        return {"max_gap_ms": round(gaps[-1], 1) if gaps else 0.0, "p99_gap_ms": round(p99, 1),
                "beats": len(self.beats), "duration_s": round(self.beats[-1] - self.beats[0], 2)}


def spin_until(app, cond, timeout_s: float) -> None:
    from PySide6.QtCore import QEventLoop

    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("timed out")
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 5)


def long_message(engine, target_tokens: int) -> tuple[str, int]:
    words = ("the quick brown fox jumps over the lazy dog while seven wizards quietly judge "
             "boxing matches near a frozen lake ").split()
    text = " ".join(words[i % len(words)] for i in range(target_tokens))
    n = engine.count_tokens(text)
    while n > target_tokens:
        text = text[: int(len(text) * target_tokens / n)]
        n = engine.count_tokens(text)
    return "Summarize this text in one sentence:\n\n" + text, n


def run() -> dict:
    from dataclasses import replace

    from PySide6.QtWidgets import QApplication

    from app import paths
    from app.catalog.bundled import ensure_bundled_model
    from app.protocol.types import DecodingParams, LoadSettings
    from app.settings import UserSettings, save_user_settings

    model = ensure_bundled_model(REPO / ".cache" / "models" / "gemma-3-270m-q4_k_m.gguf")
    paths.bundled_model_path().symlink_to(model)
    save_user_settings(UserSettings(load=LoadSettings(n_ctx=4096), prefix_cache=False,
                                    decoding=DecodingParams(temperature=0.0, max_tokens=16)))
    app = QApplication.instance() or QApplication([])
    from app.ui.context import AppContext
    from app.ui.main_window import MainWindow

    ctx = AppContext()
    win = MainWindow(ctx, autoload=False)
    win.show()
    spin_until(app, lambda: False if time.sleep(0) else True, 1)
    hb = Heartbeat()
    out: dict = {"cpu_count": os.cpu_count()}

    hb.start()
    t0 = time.perf_counter()
    win.load_startup_model()
    spin_until(app, lambda: ctx.engine.state == "ready", 120)
    out["load"] = {**hb.stop(), "wall_s": round(time.perf_counter() - t0, 2)}

    text, n = long_message(ctx.engine.engine, 3000)
    first: list[float] = []
    ctx.chat.delta.connect(lambda _t: first.append(time.perf_counter()) if not first else None)
    hb.start()
    t0 = time.perf_counter()
    win.send(text)
    spin_until(app, lambda: bool(first) or not ctx.chat.busy, 300)
    out["prefill"] = {**hb.stop(), "prompt_tokens": n, "ttft_s": round((first[0] if first else 0) - t0, 2)}
    hb.start()
    spin_until(app, lambda: not ctx.chat.busy, 120)
    out["decode"] = hb.stop()

    job = replace(ctx.engine.job)
    ctx.engine.unload()
    spin_until(app, lambda: ctx.pool.active == 0, 30)
    hb.start()
    ctx.engine.load(job)
    spin_until(app, lambda: ctx.engine._pending is not None, 30)
    time.sleep(0.05)
    t0 = time.perf_counter()
    win.escape()  # Esc during a load aborts it
    spin_until(app, lambda: ctx.engine.state == "idle" and ctx.pool.active == 0, 30)
    out["abort_load"] = {**hb.stop(), "abort_to_idle_s": round(time.perf_counter() - t0, 2)}
    import multiprocessing

    children = multiprocessing.active_children()
    out["abort_load"]["engine_processes_left"] = sum(p.name == "hearth-engine" for p in children)
    win.close()
    return out


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    with tempfile.TemporaryDirectory(prefix="hearth-stall-") as home:
        os.environ["HEARTH_HOME"] = home
        res = run()
    if "--json" in sys.argv:
        print(json.dumps(res, indent=2))
        return 0
    print(f"GUI-thread heartbeat every 10 ms, {res['cpu_count']} CPU cores; max gap = worst stall (target < 100 ms)")
    for phase in ("load", "prefill", "decode", "abort_load"):
        r = res[phase]
        extra = {k: v for k, v in r.items() if k not in ("max_gap_ms", "p99_gap_ms", "beats", "duration_s")}
        print(f"  {phase:<11} max gap {r['max_gap_ms']:>6.1f} ms   p99 {r['p99_gap_ms']:>5.1f} ms   "
              f"over {r['duration_s']:>5.2f} s   {extra}")
    worst = max(res[p]["max_gap_ms"] for p in ("load", "prefill", "decode", "abort_load"))
    print(f"worst stall: {worst:.1f} ms → {'OK' if worst < 100 else 'OVER TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
