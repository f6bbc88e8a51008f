"""``hearth chat``: chat in the terminal, every turn stored (``app.memory``).

Interactive by default, or one message with ``--message`` (``--json`` for machines); the thinking streams to
stderr, so stdout carries the answer only. The tools of ``mcp.json`` are offered as in the window, each call
asked on stderr (``_mcp_terminal``; docs/tools.md, 'MCP in the terminal and on the port').

The reasoning: docs/memory.md, 'app/cli/chat.py'.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

from app.cli._engine_args import add_decoding_args, add_load_args, decoding, make_engine
from app.errors import Cancelled, HearthError, InvalidRequest


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat in the terminal (streams answers; conversations are stored)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--new", action="store_true", help="start a new conversation")
    g.add_argument("--conversation", "-c", default=None, help="continue conversation ID (or a unique prefix)")
    p.add_argument("--message", default=None, help="send one message, print the answer and exit")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--json", action="store_true", help="with --message: print the answer as JSON")
    p.add_argument("--docs", action="store_true", help="answer from the indexed documents (see `hearth ingest`), "
                   "citing passages as [E:id]")
    p.add_argument("--k", type=int, default=4, help="with --docs: passages given to the model per turn")
    p.add_argument("--reasoning-effort", default=None, choices=("none", "low", "medium", "high"),
                   help="how much the model may think before answering (none 0, low 256, medium 1024, high 4096 "
                   "tokens; default: the conversation's setting, else the model's)")
    p.add_argument("--reasoning-budget", type=int, default=None, metavar="N",
                   help="thinking tokens allowed (beats --reasoning-effort)")
    p.add_argument("--no-mcp", action="store_true", help="do not start the MCP servers of mcp.json (no tools)")
    p.add_argument("--yes-tools", action="store_true",
                   help="allow every MCP tool call without asking (else each call of a tool not in alwaysAllow is "
                   "asked; with --message or without a terminal it is refused)")
    p.add_argument("--tool-choice", default=None, choices=("auto", "required"),
                   help="with MCP tools: required makes the model call a tool first, then answer from the "
                   "result (default auto: the model decides)")
    add_load_args(p)
    add_decoding_args(p)
    p.set_defaults(func=run_terminal_chat)


def _defaults(args: argparse.Namespace) -> None:
    for name, default in (("max_tokens", None), ("system", None), ("prefix_cache", True), ("new", False),
                          ("conversation", None), ("message", None), ("json", False), ("docs", False), ("k", 4),
                          ("reasoning_effort", None), ("reasoning_budget", None), ("no_mcp", False),
                          ("yes_tools", False), ("tool_choice", None)):
        if not hasattr(args, name):
            setattr(args, name, default)


def run_terminal_chat(args: argparse.Namespace) -> int:
    from app.assistant import Assistant
    from app.memory import Store
    from app.settings import load_user_settings

    _defaults(args)
    if args.json and args.message is None:
        raise InvalidRequest("--json needs --message (one message, non-interactive)", param="json")
    if args.message is not None and not args.message.strip():
        raise InvalidRequest("the message is empty", param="message")
    if args.conversation is not None and not args.conversation.strip():
        raise InvalidRequest("--conversation needs a conversation id (or a unique prefix)", param="conversation")
    if args.tool_choice is not None and args.no_mcp:
        raise InvalidRequest("--tool-choice needs MCP tools; drop --no-mcp", param="tool_choice")
    if args.docs:
        from app.assistant.evidence import check_k

        check_k(args.k, "--k")  # before the model loads
    args.reasoning = _reasoning_layer(args)  # checked before the model loads
    user = load_user_settings()
    system = args.system if args.system is not None else user.system_prompt
    with Store() as store, _documents(args) as docs, _tools(args, user.tools) as box, make_engine(args) as eng:
        assistant = Assistant(eng, store, decoding=decoding(args), system_prompt=system or "", documents=docs,
                              k=args.k, tools=box)
        # A new conversation is created with its first message: leaving before one stores no empty chat.
        cid = store.resolve_conversation_id(args.conversation) if args.conversation else None
        if args.message is not None:
            return _one_message(assistant, cid, args)
        return _interactive(eng, assistant, cid, args.reasoning)


def _reasoning_layer(args: argparse.Namespace):
    """This command's reasoning layer (None when neither option is given); ``InvalidRequest`` names a bad
    value."""
    from app.protocol.reasoning import ReasoningSettings

    if args.reasoning_effort is None and args.reasoning_budget is None:
        return None
    return ReasoningSettings(args.reasoning_effort, args.reasoning_budget).validate()


class _Thinking:
    """Writes streamed thinking to stderr: dimmed on a terminal, else between ``[thinking]`` markers."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.open = False

    def __call__(self, text: str) -> None:
        if not self.open:
            sys.stderr.write("\x1b[2m" if self.tty else "[thinking] ")
            self.open = True
        sys.stderr.write(text)
        sys.stderr.flush()

    def answer(self, text: str) -> None:
        """Answer text: closes the thinking first."""
        self.close()
        sys.stdout.write(text)
        sys.stdout.flush()

    def close(self) -> None:
        if self.open:
            sys.stderr.write("\x1b[0m\n" if self.tty else " [/thinking]\n")
            sys.stderr.flush()
            self.open = False


def _thinking_line(m: dict) -> str:
    if not m.get("reasoning_tokens") and m.get("reasoning_budget") is None:
        return ""
    ttfat = m.get("ttfat_s")
    first = f"{ttfat * 1000:.0f} ms" if ttfat is not None else "–"
    return (f" · thinking {m.get('reasoning_tokens', 0)} tok, answer {m.get('answer_tokens', 0)} tok · "
            f"TTFAT {first}")


@contextlib.contextmanager
def _tools(args: argparse.Namespace, settings):
    """The ``ToolBox`` over the mcp.json servers (None with ``--no-mcp`` or none configured), the servers
    stopped at the end."""
    from app.cli._mcp_terminal import TerminalPermission, start_hub, toolbox
    from app.protocol.tools import ToolChoice

    hub = None if args.no_mcp else start_hub(settings.start_timeout_s)
    ask = TerminalPermission(args.message is None and sys.stdin.isatty(), args.yes_tools)
    choice = ToolChoice(args.tool_choice) if args.tool_choice else None
    try:
        yield toolbox(hub, ask, settings, choice)
    finally:
        if hub is not None:
            hub.close()


def _send(assistant, cid: str, text: str, shown: "_Thinking | None", reasoning=None):
    """One turn: the answer and the thinking to ``shown`` (None: nothing streams, ``--json``), tool calls and
    results as lines on stderr; returns the ``TurnDone``."""
    from app.assistant import ReasoningDelta, TextDelta, TurnDone
    from app.cli._mcp_terminal import show_event

    done = None
    for item in assistant.turn(cid, text, reasoning=reasoning):
        if isinstance(item, TurnDone):
            done = item
        elif isinstance(item, (TextDelta, ReasoningDelta)):
            if shown is not None:
                (shown.answer if isinstance(item, TextDelta) else shown)(item.text)
        else:
            if shown is not None:
                shown.close()
            show_event(item)
    assert done is not None
    return done


@contextlib.contextmanager
def _documents(args: argparse.Namespace):
    """The document index for ``--docs`` (None without it), closed at the end."""
    if not args.docs:
        yield None
        return
    from app.assistant import DocumentSource

    docs = DocumentSource.open_default()
    try:
        yield docs
    finally:
        docs.close()


def _one_message(assistant, cid: str | None, args) -> int:
    shown = _Thinking()
    cid = cid or assistant.new_conversation()
    done = _send(assistant, cid, args.message, None if args.json else shown, args.reasoning)
    shown.close()
    if args.json:
        out = done.to_dict()
        if assistant.documents is None:
            for key in ("citations", "attributions", "evidence", "search_notice"):
                out.pop(key)
        print(json.dumps(out, ensure_ascii=False))
    else:
        print()
        _print_sources(done.citations, done.evidence, done.result.text, done.attributions)
        _print_notices(done)
    return 0


def _print_sources(cites: list[dict], given: list[dict], text: str = "", attributions: list[dict] = ()) -> None:
    """The cited passages (else the passages given) and each sentence the attribution check flags."""
    from app.memory.records import flagged_sentences

    for c in cites:
        page = f" p.{c['page']}" if c.get("page") else ""
        print(f"  [E:{c['evidence_id']}] {c['path']}{page}: {(c.get('quote') or '')[:100]!r}", file=sys.stderr)
    if given and not cites:
        print("  (no passage cited; the model was given: " + ", ".join(f"[E:{g['evidence_id']}] {g['path']}"
                                                                     for g in given) + ")", file=sys.stderr)
    for sentence, reason in flagged_sentences(text, list(attributions)):
        print(f"  ⚠ {sentence!r}: {reason}", file=sys.stderr)


def _interactive(eng, assistant, cid: str | None, reasoning=None) -> int:
    which = f"conversation {cid[:12]}" if cid else "a new conversation"
    print(f"Hearth chat · {eng.info.get('model')} · template {eng.info.get('template')} · {which} · /new to "
          "start over, /quit to leave", file=sys.stderr)
    if eng.info.get("template") == "transcript":
        print("(a small base model for trying things out: answers are short and often wrong)", file=sys.stderr)
    while True:
        try:
            line = input("you> ")
        except EOFError:
            print()
            return 0
        cmd = line.strip()
        if not cmd:
            continue
        if cmd in ("/quit", "/exit"):
            return 0
        if cmd == "/new":
            cid = None
            print("  [a new conversation starts with your next message]", file=sys.stderr)
            continue
        if cmd.startswith("/") and " " not in cmd:
            print(f"  [unknown command {cmd}: /new starts a new conversation, /quit leaves]", file=sys.stderr)
            continue
        if cid is None:
            cid = assistant.new_conversation()
            print(f"  [conversation {cid[:12]}]", file=sys.stderr)
        _stream_turn(assistant, cid, line, reasoning)


def _stream_turn(assistant, cid: str, text: str, reasoning=None) -> None:
    sys.stdout.write("hearth> ")
    sys.stdout.flush()
    shown = _Thinking()
    try:
        done = _send(assistant, cid, text, shown, reasoning)
    except (KeyboardInterrupt, Cancelled):
        shown.close()
        print("\n  [stopped]", file=sys.stderr)
        return
    except HearthError as exc:
        print(f"\n  error: {exc}", file=sys.stderr)
        return
    finally:
        shown.close()
        print(flush=True)  # the answer's line ends on stdout too (when it is piped)
    r, m = done.result, done.result.metrics
    print(f"  [{r.finish_reason} · TTFT {m.get('ttft_s', 0) * 1000:.0f} ms{_thinking_line(m)} · "
          f"{m.get('decode_tps', 0):.1f} tok/s · "
          f"{m.get('cached_tokens', 0)}/{m.get('prompt_tokens', 0)} prompt tokens reused · context "
          f"{m.get('prompt_tokens', 0) + m.get('completion_tokens', 0)}/{r.context.get('n_ctx', 0)} tokens]",
          file=sys.stderr)
    _print_sources(done.citations, done.evidence, done.result.text, done.attributions)
    _print_notices(done)


def _print_notices(done) -> None:
    """What the person should know about this turn's context: evidence left out, search degraded, older turns
    left out of the prompt because they could not be summarized."""
    if done.notice:
        print(f"  ({done.notice})", file=sys.stderr)
    if done.result.dropped_ids:
        print(f"  ({len(done.result.dropped_ids)} older messages were left out of this prompt: they could not be "
              "summarized; they stay in the history)", file=sys.stderr)
