"""``hearth generate PROMPT``: one raw completion (no chat template), streamed to stdout."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from app.cli._engine_args import add_decoding_args, add_load_args, decoding, make_engine
from app.protocol.reasoning import EFFORT_TOKENS, resolve_budget
from app.protocol.types import ChatMessage, Delta, Done, GenerateRequest, ReasoningRequest


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="complete a prompt with the model (streams to stdout)",
                       description="Complete PROMPT with the model. Without --chat the prompt is sent as raw "
                                   "text; with --chat it is one user message under the model's chat template.")
    p.add_argument("prompt", help="the prompt text ('-' reads stdin)")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    p.add_argument("--system", default=None, help="system prompt (with --chat)")
    p.add_argument("--json", action="store_true",
                   help='print {"text", "reasoning", "finish_reason", "metrics", "info"}')
    p.add_argument("--reasoning-effort", choices=list(EFFORT_TOKENS), default=None,
                   help="thinking budget by effort (none 0, low 256, medium 1024, high 4096 tokens); a model "
                        "without thinking markers gets <think> prefilled (docs/reasoning.md)")
    p.add_argument("--reasoning-budget", type=int, default=None, metavar="TOKENS",
                   help="thinking budget in tokens (beats --reasoning-effort); the end of thinking is forced "
                        "when it is spent")
    p.add_argument("--reasoning-deadline", type=float, default=None, metavar="SECONDS",
                   help="end thinking after this many seconds")
    add_load_args(p)
    add_decoding_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        from app.errors import InvalidRequest

        raise InvalidRequest("the prompt is empty", param="prompt")
    dec = decoding(args)
    if args.chat:
        msgs = ([ChatMessage("system", args.system)] if args.system else []) + [ChatMessage("user", prompt)]
        req = GenerateRequest(messages=tuple(msgs), decoding=dec, prefix_cache=args.prefix_cache)
    else:
        req = GenerateRequest(prompt=prompt, decoding=dec, prefix_cache=args.prefix_cache)
    if args.reasoning_effort or args.reasoning_budget is not None or args.reasoning_deadline is not None:
        budget = resolve_budget(args.reasoning_effort, args.reasoning_budget, args.reasoning_deadline)
        req = replace(req, reasoning=ReasoningRequest(budget))
    req.validate()
    with make_engine(args) as eng:
        done = None
        thinking = False
        for ev in eng.generate(req):
            if isinstance(ev, Delta) and not args.json:
                if ev.reasoning:  # thinking goes to stderr, dimmed where it is a terminal
                    if not thinking:
                        sys.stderr.write(_dim("[thinking] "))
                        thinking = True
                    sys.stderr.write(_dim(ev.reasoning))
                    sys.stderr.flush()
                if ev.text and thinking:
                    sys.stderr.write("\n")
                    thinking = False
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            elif isinstance(ev, Done):
                done = ev
        assert done is not None
        if args.json:
            out = {"text": done.text, "reasoning": done.reasoning, "finish_reason": done.finish_reason,
                   "metrics": done.metrics.to_dict(),
                   "info": done.info}
            cache = eng.cache_stats()  # the backend contract: {} without a prefix cache of its own (a remote)
            if cache:
                out["prefix_cache"] = cache
            print(json.dumps(out, ensure_ascii=False))
        else:
            m = done.metrics
            print()
            print(f"[{done.finish_reason}] prompt {m.prompt_tokens} tok ({m.cached_tokens} cached), "
                  f"{m.completion_tokens} tok out · TTFT {m.ttft_s * 1000:.0f} ms · "
                  f"decode {m.decode_tps:.1f} tok/s", file=sys.stderr)
            if m.reasoning_budget is not None:
                why = f", ended by {m.reasoning_stopped_by}" if m.reasoning_stopped_by else ""
                first = f"{m.ttfat_s * 1000:.0f} ms" if m.ttfat_s is not None else "none"
                print(f"[thinking] {m.reasoning_tokens} tok (budget {m.reasoning_budget}{why}), answer "
                      f"{m.answer_tokens} tok · first answer token {first} after admission", file=sys.stderr)
    return 0


def _dim(text: str) -> str:
    return f"\x1b[2m{text}\x1b[0m" if sys.stderr.isatty() else text
