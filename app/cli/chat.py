"""``hearth chat``: terminal chat with streaming (for machines without a display).

Interactive: type a message, Enter sends; ``/new`` starts over, ``/quit`` (or Ctrl+D) leaves; Ctrl+C stops
the answer being written.
"""

from __future__ import annotations

import argparse
import sys

from app.cli._engine_args import add_decoding_args, add_load_args, decoding, make_engine
from app.engine.types import ChatMessage, Delta, Done, GenerateRequest
from app.errors import Cancelled, HearthError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat in the terminal (streams answers)")
    p.add_argument("--system", default=None, help="system prompt")
    add_load_args(p)
    add_decoding_args(p)
    p.set_defaults(func=run_terminal_chat)


def run_terminal_chat(args: argparse.Namespace) -> int:
    for name, default in (("max_tokens", 256), ("system", None), ("prefix_cache", True)):
        if not hasattr(args, name):
            setattr(args, name, default)
    dec = decoding(args)
    history: list[ChatMessage] = [ChatMessage("system", args.system)] if args.system else []
    with make_engine(args) as eng:
        print(f"Hearth chat · {eng.info.get('model')} · template {eng.info.get('template')} · "
              "/new to start over, /quit to leave", file=sys.stderr)
        if eng.info.get("template") == "transcript":
            print("(this is a small base model for trying things out: answers are short and often wrong)",
                  file=sys.stderr)
        while True:
            try:
                line = input("you> ")
            except EOFError:
                print()
                return 0
            if not line.strip():
                continue
            if line.strip() in ("/quit", "/exit"):
                return 0
            if line.strip() == "/new":
                history = history[:1] if args.system else []
                continue
            history.append(ChatMessage("user", line))
            answer = _stream_answer(eng, GenerateRequest(messages=tuple(history), decoding=dec))
            if answer is not None:
                history.append(ChatMessage("assistant", answer))
            else:
                history.pop()


def _stream_answer(eng, req: GenerateRequest) -> str | None:
    gen = eng.generate(req)
    sys.stdout.write("hearth> ")
    try:
        for ev in gen:
            if isinstance(ev, Delta):
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            elif isinstance(ev, Done):
                m = ev.metrics
                print(f"\n  [{ev.finish_reason} · TTFT {m.ttft_s * 1000:.0f} ms · {m.decode_tps:.1f} tok/s · "
                      f"{m.cached_tokens}/{m.prompt_tokens} prompt tokens reused]", file=sys.stderr)
                return ev.text
    except KeyboardInterrupt:
        gen.close()
        print("\n  [stopped]", file=sys.stderr)
    except Cancelled:
        print("\n  [stopped]", file=sys.stderr)
    except HearthError as exc:
        print(f"\n  error: {exc}", file=sys.stderr)
    return None
