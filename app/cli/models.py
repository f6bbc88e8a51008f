"""``hearth models``: the models Hearth can use (the bundled one and every GGUF in the models folder).

On a fresh data folder the bundled model is not there yet: it is listed as not installed (``"installed":
false`` in ``--json``, with the path ``hearth setup`` will write), not as a file that exists."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the available models",
                       description="List the bundled model and every *.gguf file (or link) in the models "
                                   "folder. A file that cannot be used is listed with the reason.")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app import paths
    from app.catalog.registry import list_models

    entries = list_models()
    if args.json:
        print(json.dumps([e.to_dict() for e in entries], ensure_ascii=False, indent=2))
        return 0
    print(f"models folder: {paths.models_dir()}")
    for e in entries:
        tag = " [bundled]" if e.bundled else ""
        if not e.installed:
            print(f"  {e.id}{tag}  {e.error}")
            continue
        if e.error:
            print(f"  {e.id}{tag}  ERROR: {e.error}")
            continue
        params = f"{e.parameter_count / 1e6:,.0f}M" if e.parameter_count else "?"
        print(f"  {e.id}{tag}  {e.architecture} {params} {e.quantization}  "
              f"{e.size_bytes / (1 << 20):,.1f} MiB  ctx {e.context_length or '?'}")
    return 0
