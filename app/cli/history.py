"""``hearth history``: list, show, search, export and import stored conversations (app.memory.store).

Every subcommand takes ``--json`` for machine-readable output. Conversation ids may be shortened to any
unique prefix.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.errors import InvalidRequest
from app.memory.records import flagged_sentences


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("history", help="stored conversations: list, show, search, export, import")
    hsub = p.add_subparsers(dest="history_command", metavar="ACTION", required=True)

    q = hsub.add_parser("list", help="conversations, most recent first")
    q.add_argument("--limit", type=int, default=None, help="show at most this many")
    q.set_defaults(func=run_list)

    q = hsub.add_parser("show", help="the messages (current branch) and summaries of a conversation")
    q.add_argument("id", help="conversation id (or a unique prefix)")
    q.add_argument("--all", action="store_true", help="every branch, in the order stored")
    q.set_defaults(func=run_show)

    q = hsub.add_parser("search", help="full-text search over the original text of every message")
    q.add_argument("query")
    q.add_argument("--limit", type=int, default=20)
    q.add_argument("--conversation", default=None, help="search only this conversation")
    q.set_defaults(func=run_search)

    q = hsub.add_parser("export", help="write a conversation as Markdown or JSON (JSON is the lossless form)")
    q.add_argument("id", help="conversation id (or a unique prefix)")
    q.add_argument("--format", choices=("md", "json"), default="json")
    q.add_argument("--output", "-o", default=None, help="file to write (default: standard output)")
    q.set_defaults(func=run_export)

    q = hsub.add_parser("import", help="import a conversation exported as JSON or Markdown")
    q.add_argument("file", help="the export file ('-' for standard input)")
    q.add_argument("--as-new", action="store_true", help="import under a new id if this one exists")
    q.set_defaults(func=run_import)

    for parser in hsub.choices.values():
        parser.add_argument("--json", action="store_true", help="machine-readable output")


def _store():
    from app.memory.store import Store

    return Store()


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, ensure_ascii=False, indent=2))


def run_list(args: argparse.Namespace) -> int:
    with _store() as store:
        convs = store.list_conversations(args.limit)
    if args.json:
        _print_json({"conversations": [{**c.to_dict(), "message_count": c.message_count} for c in convs]})
        return 0
    for c in convs:
        print(f"{c.id[:12]}  {c.updated[:19].replace('T', ' ')}  {c.message_count:4d} msgs  "
              f"{c.title or '(untitled)'}")
    if not convs:
        print("no conversations yet")
    return 0


def run_show(args: argparse.Namespace) -> int:
    with _store() as store:
        cid = store.resolve_conversation_id(args.id)
        data = store.load_conversation(cid)
        tip = data.conversation.current_message_id
        messages = data.messages if args.all or tip is None else store.path_to(tip)
    if args.json:
        _print_json({"conversation": data.conversation.to_dict(), "messages": [m.to_dict() for m in messages],
                     "summaries": [s.to_dict() for s in data.summaries],
                     "citations": [c.to_dict() for c in data.citations],
                     "attributions": [a.to_dict() for a in data.attributions], "warnings": data.warnings})
        return 0
    for w in data.warnings:
        print(f"hearth: warning: {w}", file=sys.stderr)
    flags: dict[str, list[dict]] = {}
    for a in data.attributions:
        flags.setdefault(a.message_id, []).append(a.to_dict())
    print(f"# {data.conversation.title or '(untitled)'}  [{cid}]")
    for m in messages:
        status = "" if m.status == "complete" else f" ({m.status})"
        print(f"\n{m.role}{status}  {m.id[:12]}\n{m.content}")
        for sentence, reason in flagged_sentences(m.content, flags.get(m.id, [])):
            print(f"  ⚠ {sentence!r}: {reason}")
    for s in data.summaries:
        print(f"\n-- summary of {s.first_message_id[:12]}..{s.last_message_id[:12]} ({s.model or 'unknown model'})"
              f"\n{s.text}")
    return 0


def run_search(args: argparse.Namespace) -> int:
    with _store() as store:
        cid = store.resolve_conversation_id(args.conversation) if args.conversation else None
        hits = store.search(args.query, limit=args.limit, conversation_id=cid)
    if args.json:
        _print_json({"query": args.query, "results": [h.to_dict() for h in hits]})
        return 0
    for h in hits:
        print(f"{h.conversation_id[:12]}  {h.message_id[:12]}  {h.role:9s} {h.snippet}  "
              f"[{h.conversation_title or 'untitled'}]")
    if not hits:
        print("no matches")
    return 0


def run_export(args: argparse.Namespace) -> int:
    with _store() as store:
        cid = store.resolve_conversation_id(args.id)
        text = store.export_conversation(cid, args.format)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    # newline="": keep the text's own line endings, so the export stays byte-exact (md import reads lengths)
    with open(args.output, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    if args.json:
        _print_json({"conversation_id": cid, "format": args.format, "output": str(Path(args.output).resolve()),
                     "characters": len(text)})
    else:
        print(f"exported {cid} to {args.output} ({args.format})")
    return 0


def run_import(args: argparse.Namespace) -> int:
    try:
        raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read {args.file}: {exc}", param="file") from None
    with _store() as store:
        cid = store.import_conversation(text, as_new=args.as_new)
        data = store.load_conversation(cid)
    if args.json:
        _print_json({"conversation_id": cid, "messages": len(data.messages), "summaries": len(data.summaries),
                     "citations": len(data.citations)})
    else:
        print(f"imported {cid}: {len(data.messages)} messages, {len(data.summaries)} summaries")
    return 0
