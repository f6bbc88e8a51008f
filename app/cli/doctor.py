"""``hearth doctor [--json]``: check this machine for Hearth and print, per check, its status and the exact fix.

The checks are ``app.doctor.checks`` (display, Qt platform plugin, llama.cpp backend and GPU, memory for the
chosen model, disk, model files, port, embedding model, user service). Exit status 1 when one failed.
``--qt-probe`` (hidden) is the child ``app.doctor.qt`` starts in a frozen bundle to try creating the Qt
application, ``--backend-probe`` (hidden) the one ``app.doctor.backend`` starts to read the llama.cpp build;
from a source tree each child is ``python -c`` of the same code.
"""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check the environment (Qt, display, backend, memory, disk, models, port)",
                       description="Check what Hearth needs on this machine; each check prints its status and, "
                                   "when something is wrong, the exact fix.")
    p.add_argument("--json", action="store_true", help='print {"ok", "checks": [{name, status, summary, fix, '
                                                       'details}]}')
    p.add_argument("--only", action="append", default=None, metavar="CHECK",
                   help="run only this check (repeatable): display, qt, backend, memory, disk, models, port, "
                        "embedding, service")
    p.add_argument("--qt-lib-dir", action="append", default=None, metavar="DIR",
                   help="resolve the Qt plugin's libraries in these folders only, instead of the system's "
                        "(to see what a machine without them would lack)")
    p.add_argument("--qt-probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend-probe", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.qt_probe:
        from app.doctor.qt import PROBE_CODE

        exec(PROBE_CODE, {"__name__": "__qt_probe__"})  # noqa: S102 - our own constant, run in a child process
        return 0
    if args.backend_probe:
        from app.doctor import backend

        exec(backend.PROBE_CODE, {"__name__": "__backend_probe__"})  # noqa: S102 - as --qt-probe
        return 0
    from app.doctor import exit_code, format_text, run_checks
    from app.doctor.checks import ALL

    unknown = [n for n in args.only or [] if n not in dict(ALL)]
    if unknown:
        from app.errors import InvalidRequest

        raise InvalidRequest(f"--only: unknown check {unknown[0]!r}; choose from {', '.join(dict(ALL))}",
                             param="only")
    results = run_checks(args.only, qt_search_dirs=args.qt_lib_dir)
    if args.json:
        print(json.dumps({"ok": exit_code(results) == 0, "checks": [c.to_dict() for c in results]},
                         ensure_ascii=False, indent=2, default=str))
    else:
        print(format_text(results))
    return exit_code(results)
