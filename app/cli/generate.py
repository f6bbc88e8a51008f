"""``hearth generate PROMPT``: one raw completion (no chat template), streamed to stdout."""

from __future__ import annotations

import argparse
import json
import sys

from app.cli._engine_args import add_decoding_args, add_load_args, decoding, make_engine
from app.engine.types import ChatMessage, Delta, Done, GenerateRequest


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="complete a prompt with the model (streams to stdout)",
                       description="Complete PROMPT with the model. Without --chat the prompt is sent as raw "
                                   "text; with --chat it is one user message under the model's chat template.")
    p.add_argument("prompt", help="the prompt text ('-' reads stdin)")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    p.add_argument("--system", default=None, help="system prompt (with --chat)")
    p.add_argument("--json", action="store_true", help='print {"text", "finish_reason", "metrics", "info"}')
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
    req.validate()
    with make_engine(args) as eng:
        done = None
        for ev in eng.generate(req):
            if isinstance(ev, Delta) and not args.json:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            elif isinstance(ev, Done):
                done = ev
        assert done is not None
        if args.json:
            out = {"text": done.text, "finish_reason": done.finish_reason, "metrics": done.metrics.to_dict(),
                   "info": done.info}
            if eng.cache_cfg:
                out["prefix_cache"] = eng.cache_stats()
            print(json.dumps(out, ensure_ascii=False))
        else:
            m = done.metrics
            print()
            print(f"[{done.finish_reason}] prompt {m.prompt_tokens} tok ({m.cached_tokens} cached), "
                  f"{m.completion_tokens} tok out · TTFT {m.ttft_s * 1000:.0f} ms · "
                  f"decode {m.decode_tps:.1f} tok/s", file=sys.stderr)
    return 0
