"""``hearth remote``: remote engines (OpenAI-compatible servers answering as a Hearth model; docs/remote.md).

    hearth remote add NAME URL [--model REMOTE_ID] [--api-key-env VAR | --api-key-keyring] [--n-ctx N]
                               [--parallel N] [--connect-timeout S] [--read-timeout S]
    hearth remote list [--json]
    hearth remote remove NAME
    hearth remote test NAME [--prompt TEXT] [--max-tokens N]

The reasoning: docs/remote.md, 'app/cli/remote.py'.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from dataclasses import replace

from app.errors import InvalidRequest


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("remote", help="remote engines: OpenAI-compatible servers (vLLM, llama-server, another "
                                      "Hearth) used as models",
                       description="Add, list, test and remove remote engines. A remote's NAME is the model id "
                                   "Hearth shows for it. API keys are never written to settings.json.")
    rs = p.add_subparsers(dest="remote_command", metavar="ACTION", required=True)
    a = rs.add_parser("add", help="add or replace a remote engine")
    a.add_argument("name", metavar="NAME", help="the model id Hearth gives it (letters, digits, - and _)")
    a.add_argument("url", metavar="URL", help="its API base, e.g. http://gpu-box:8000/v1")
    a.add_argument("--model", default=None, metavar="REMOTE_ID",
                   help="the remote's model id (default: the only model it serves)")
    key = a.add_mutually_exclusive_group()
    key.add_argument("--api-key-env", default=None, metavar="VAR",
                     help="read the API key from this environment variable when the remote is used")
    key.add_argument("--api-key-keyring", action="store_true",
                     help="ask for the API key now (not echoed) and keep it in the OS keyring")
    a.add_argument("--n-ctx", type=int, default=None, help="its context in tokens (default: what it reports)")
    a.add_argument("--parallel", type=int, default=4, metavar="N", help="requests forwarded at once (default 4)")
    a.add_argument("--connect-timeout", type=float, default=10.0, metavar="S", help="seconds to connect")
    a.add_argument("--read-timeout", type=float, default=300.0, metavar="S",
                   help="seconds without data from the remote before the answer fails")
    a.set_defaults(func=add)
    ls = rs.add_parser("list", help="list remote engines (keys masked)")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=list_remotes)
    rm = rs.add_parser("remove", help="remove a remote engine (and its key from the keyring)")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(func=remove)
    t = rs.add_parser("test", help="probe a remote and stream a short answer")
    t.add_argument("name", metavar="NAME")
    t.add_argument("--prompt", default="Say hello in one short sentence.")
    t.add_argument("--max-tokens", type=int, default=24)
    t.set_defaults(func=test)


def _local_ids() -> set[str]:
    """Ids of installed local models (a remote may not take one's name)."""
    from app.catalog.registry import BUNDLED_MODEL_ID, model_files, model_id

    try:
        return {BUNDLED_MODEL_ID, *(model_id(p) for p in model_files())}
    except OSError:
        return {BUNDLED_MODEL_ID}


def add(args: argparse.Namespace) -> int:
    from app import secrets
    from app.settings import RemoteSettings, load_user_settings, save_user_settings

    if args.name in _local_ids():
        raise InvalidRequest(f"{args.name!r} is the id of an installed model; give the remote another name",
                             param="name")
    if args.api_key_env is not None:
        secrets.check_env_name(args.api_key_env)
    remote = RemoteSettings(url=args.url, model=args.model, api_key_env=args.api_key_env,
                            api_key_keyring=bool(args.api_key_keyring), n_ctx=args.n_ctx, n_parallel=args.parallel,
                            connect_timeout_s=args.connect_timeout, read_timeout_s=args.read_timeout
                            ).validate(args.name)
    if args.api_key_keyring:
        key = getpass.getpass(f"API key for remote {args.name} (not shown): ").strip()
        secrets.store_key(args.name, key)
    user = load_user_settings()
    old = user.remotes.get(args.name)
    save_user_settings(replace(user, remotes={**user.remotes, args.name: remote}))
    if old is not None and old.api_key_keyring and not remote.api_key_keyring:
        secrets.delete_key(args.name)
    src = secrets.key_source(args.name, remote) or "no API key"
    print(f"hearth: remote {args.name} -> {remote.url}" + (f" (model {remote.model})" if remote.model else "")
          + f", key: {src}. Check it with `hearth remote test {args.name}`.", file=sys.stderr)
    if args.api_key_env and not _env_set(args.api_key_env):
        print(f"hearth: note: ${args.api_key_env} is not set in this shell", file=sys.stderr)
    return 0


def _env_set(var: str) -> bool:
    import os

    return bool(os.environ.get(var))


def _row(name: str, remote) -> dict:
    from app import secrets

    row = {"name": name, "url": remote.url, "model": remote.model, "n_ctx": remote.n_ctx,
           "n_parallel": remote.n_parallel, "key": secrets.key_source(name, remote) or None}
    try:
        key = secrets.api_key_for(name, remote)
        row["key_status"] = f"set ({secrets.mask(key)})" if key else "none"
    except secrets.SecretError:
        row["key_status"] = "missing"
    return row


def list_remotes(args: argparse.Namespace) -> int:
    from app.settings import load_user_settings

    rows = [_row(n, r) for n, r in sorted(load_user_settings().remotes.items())]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no remote engines (add one with `hearth remote add NAME URL`)")
        return 0
    for r in rows:
        key = f"{r['key']} [{r['key_status']}]" if r["key"] else "no key"
        print(f"{r['name']:<20} {r['url']:<40} model={r['model'] or '(the only one)'}  key: {key}")
    return 0


def remove(args: argparse.Namespace) -> int:
    from app import secrets
    from app.settings import load_user_settings, save_user_settings

    user = load_user_settings()
    if args.name not in user.remotes:
        raise InvalidRequest(f"no remote engine named {args.name!r}; see `hearth remote list`", param="name")
    old = user.remotes[args.name]
    save_user_settings(replace(user, remotes={k: v for k, v in user.remotes.items() if k != args.name}))
    if old.api_key_keyring:
        secrets.delete_key(args.name)
    print(f"hearth: removed remote {args.name}", file=sys.stderr)
    return 0


def open_remote(name: str, user=None):
    """The ``RemoteEngine`` for ``remotes[name]`` of the settings, its key resolved (not yet loaded), built by
    ``app.backends``. Raises ``InvalidRequest`` when there is no such remote, ``SecretError`` for its key."""
    from app import backends
    from app.settings import load_user_settings

    return backends.build(backends.plan_remote(user or load_user_settings(), name))


def test(args: argparse.Namespace) -> int:
    from app.protocol.types import ChatMessage, DecodingParams, Delta, Done, GenerateRequest

    eng = open_remote(args.name)
    try:
        info = eng.load()
        r = info["remote"]
        print(f"hearth: {args.name}: {r['kind']} at {r['url']}, model {r['model']}, n_ctx {info['n_ctx']}, "
              f"tokens: {r['tokenizer']}", file=sys.stderr)
        req = GenerateRequest(messages=(ChatMessage("user", args.prompt),),
                              decoding=DecodingParams(temperature=0.0, max_tokens=args.max_tokens))
        done = None
        for ev in eng.generate(req):
            if isinstance(ev, Delta):
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            elif isinstance(ev, Done):
                done = ev
        print()
        assert done is not None
        m = done.metrics
        usage = f"{m.prompt_tokens} prompt + {m.completion_tokens} answer tokens" \
            if done.info["remote"]["usage"] == "remote" else "token counts unknown (no usage from the remote)"
        print(f"hearth: TTFT {m.ttft_s * 1000:.0f} ms, total {m.total_s:.2f} s (measured here, at Hearth's "
              f"boundary), {usage}", file=sys.stderr)
    finally:
        eng.close()
    return 0
