"""``hearth service install|uninstall|status``: run ``hearth serve`` as a user service (``app.service_unit``).

``install`` writes a systemd user unit (``~/.config/systemd/user/hearth.service``) or a launchd agent
(``~/Library/LaunchAgents/org.hearth.serve.plist``) that runs this installation's ``hearth serve`` with the
current data folder, then enables and starts it (``--no-start``: only write it; ``--print``: show it and write
nothing). ``status`` says whether it is installed, what the service manager reports, and whether the port
answers ``/health``. Exit status: 0 when the action succeeded (``status``: when the service answers), else 1.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("service", help="run `hearth serve` as a user service (systemd / launchd)",
                       description="Install, remove or inspect `hearth serve` as a per-user background service.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ins = actions.add_parser("install", help="write the unit, then enable and start it")
    ins.add_argument("--port", type=int, default=None, help="pin the port (default: settings.json's, 8765)")
    ins.add_argument("--model", default=None, help="model id or path to serve (default: the chosen one)")
    ins.add_argument("--embeddings", action="store_true", help="also serve /v1/embeddings")
    ins.add_argument("--documents", action="store_true", help="answer from the indexed documents on request")
    ins.add_argument("--no-start", action="store_true", help="write the unit only; start it yourself")
    ins.add_argument("--print", dest="print_only", action="store_true", help="print the unit and write nothing")
    uni = actions.add_parser("uninstall", help="stop, disable and remove the unit")
    uni.add_argument("--no-stop", action="store_true", help="remove the file only (do not call the manager)")
    st = actions.add_parser("status", help="installed? running? does the port answer?")
    st.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return {"install": _install, "uninstall": _uninstall, "status": _status}[args.action](args)


def _serve_args(args: argparse.Namespace) -> list[str]:
    out = []
    if args.port is not None:
        from app.errors import InvalidRequest

        if not 1 <= args.port <= 65535:
            raise InvalidRequest(f"--port must be between 1 and 65535, got {args.port}", param="port")
        out += ["--port", str(args.port)]
    if args.model:
        out += ["--model", args.model]
    return out + (["--embeddings"] if args.embeddings else []) + (["--documents"] if args.documents else [])


def _install(args: argparse.Namespace) -> int:
    from app import service_unit as su

    spec = su.default_spec(_serve_args(args))
    if args.print_only:
        text = su.render_launchd(spec).decode() if su.manager() == "launchd" else su.render_systemd(spec)
        sys.stdout.write(text)
        return 0
    res = su.install(spec, start=not args.no_start)
    print(f"wrote {res.path}")
    _print_commands(res)
    if args.no_start:
        print("not started; to start it: " + " && ".join(shlex.join(c) for c in su.start_commands(res.path)))
    elif res.ok:
        print("started; it loads the model first. `hearth service status` shows when it answers; logs: "
              + su.logs_hint())
    else:
        print("hearth: error: the service manager refused (see above); the unit file is in place",
              file=sys.stderr)
    return 0 if res.ok else 1


def _uninstall(args: argparse.Namespace) -> int:
    from app import service_unit as su

    res = su.uninstall(stop=not args.no_stop)
    _print_commands(res)
    print(f"removed {res.path}")
    return 0


def _print_commands(res) -> None:
    for c in res.commands:
        mark = "ok" if c["returncode"] == 0 else f"exit {c['returncode']}"
        print(f"  $ {c['command']}  [{mark}]" + (f"\n    {c['output']}" if c["output"] else ""))


def _status(args: argparse.Namespace) -> int:
    from app import service_unit as su

    st = su.status()
    if args.json:
        print(json.dumps(st.to_dict(), ensure_ascii=False, indent=2))
    else:
        print(f"{st.manager or 'service'}: {st.summary()}")
    return 0 if st.answering else 1
