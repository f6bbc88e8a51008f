"""User settings, persisted atomically as JSON in the data directory (``settings.json``).

Layers (STYLE.md §9): ``LoadSettings`` (how a model is loaded), decoding defaults, server settings and app
options are separate typed values; unknown keys in the file are ignored with a warning, a damaged file (not
UTF-8, cut short, nested too deep, not an object: ``app.fileio.read_json_file``) is moved aside
(``settings.json.corrupt-<UTC time>``) and defaults are used, so every command still runs (docs/doctor.md,
'Damaged settings.json or mcp.json').
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from app import paths
from app.errors import HearthError, InvalidRequest
from app.fileio import JsonFileError, atomic_write_text, read_json_file, set_aside
from app.protocol.types import DecodingParams, LoadSettings, _check_range

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765  # not Ollama (11434), LM Studio (1234) nor llama-server (8080)


@dataclass
class ServerSettings:
    """The local OpenAI-compatible port."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    allow_hosts: list[str] = field(default_factory=list)  # extra Host names accepted (DNS-rebinding guard)
    max_queue: int = 16
    max_body_bytes: int = 16 * 1024 * 1024  # a larger request body is refused with a 413 (docs/server.md, Limits)
    allow_command_verifier: bool = False  # hearth.self_consistency may run command verifiers (runs programs)


MIN_BODY_BYTES = 64 * 1024  # the smallest server.max_body_bytes taken from settings.json

# The chat's tool loop (``tools`` in settings.json, Settings → MCP servers): name -> (lowest, highest).
TOOL_LIMITS = {"max_steps": (1, 20), "call_timeout_s": (1, 600), "start_timeout_s": (1, 300)}


@dataclass
class ToolSettings:
    """The tool loop's limits. ``max_steps``: generations per turn (the last may not call a tool);
    ``call_timeout_s``: seconds one MCP call may take; ``start_timeout_s``: seconds a server has to answer
    ``initialize`` (applies to servers started after the change). Whole numbers in ``TOOL_LIMITS``."""

    max_steps: int = 6
    call_timeout_s: int = 60
    start_timeout_s: int = 30

    def validate(self) -> "ToolSettings":
        """Raise ``InvalidRequest`` (``param``: the field) for a value out of ``TOOL_LIMITS``; return self."""
        for name, (lo, hi) in TOOL_LIMITS.items():
            _check_range(name, getattr(self, name), lo, hi, integer=True)
        return self


@dataclass
class RemoteSettings:
    """One remote engine (``remotes`` in settings.json, ``hearth remote add``; docs/remote.md): an
    OpenAI-compatible server answering as a model named by its key in ``remotes`` (``app.engine.remote.engine``).

    ``url``: its API base (``http://host:8000/v1``); ``model``: the remote's model id (None: the only one it
    serves); ``api_key_env``: the environment variable holding its key, or ``api_key_keyring`` true: the key is
    in the OS keyring (``app.secrets``). The key itself is never stored here: an ``api_key`` found in the file
    is dropped with a warning (and so is gone from the next save). ``n_ctx``: its context in tokens (None:
    what the remote reports); ``n_parallel``: requests forwarded at once (1-64); ``connect_timeout_s`` /
    ``read_timeout_s``: seconds to connect / with no data from it."""

    url: str = ""
    model: str | None = None
    api_key_env: str | None = None
    api_key_keyring: bool = False
    n_ctx: int | None = None
    n_parallel: int = 4
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 300.0

    def validate(self, name: str) -> "RemoteSettings":
        """Raise ``InvalidRequest`` naming the bad field; return a copy with ``url`` normalized."""
        from app.engine.remote.wire import check_name, normalize_url
        from app.secrets import ENV_NAME_RE

        check_name(name)
        if self.api_key_env is not None and not ENV_NAME_RE.match(str(self.api_key_env)):
            raise InvalidRequest("api_key_env must name an environment variable", param="api_key_env")
        if self.api_key_env and self.api_key_keyring:
            raise InvalidRequest("a remote's key comes from api_key_env or the keyring, not both",
                                 param="api_key_keyring")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise InvalidRequest(f"model must be the remote's model id, got {self.model!r}", param="model")
        if self.n_ctx is not None:
            _check_range("n_ctx", self.n_ctx, 16, 1 << 20, integer=True)
        _check_range("n_parallel", self.n_parallel, 1, 64, integer=True)
        _check_range("connect_timeout_s", self.connect_timeout_s, 0.0, 600.0, lo_open=True)
        _check_range("read_timeout_s", self.read_timeout_s, 0.0, 86400.0, lo_open=True)
        return replace(self, url=normalize_url(self.url))


def _remotes_from(data: Any) -> dict[str, RemoteSettings]:
    """``remotes`` of the file: each valid entry; a bad one is dropped with a warning naming it, and a key
    written in clear text is never read."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        log.warning("settings: remotes must be an object; ignoring it")
        return {}
    out: dict[str, RemoteSettings] = {}
    for name, entry in data.items():
        if isinstance(entry, dict) and "api_key" in entry:
            entry = {k: v for k, v in entry.items() if k != "api_key"}
            log.warning("settings: remotes.%s.api_key is ignored and will be removed: keys are never kept in "
                        "settings.json (use `hearth remote add %s URL --api-key-env VAR` or --api-key-keyring)",
                        name, name)
        if isinstance(entry, dict):  # null means the default for the optional fields
            entry = {k: v for k, v in entry.items() if not (v is None and k in ("model", "api_key_env", "n_ctx"))}
        try:
            out[name] = RemoteSettings(**_typed(RemoteSettings, entry, f"remotes.{name}.")).validate(name)
        except (InvalidRequest, TypeError) as exc:
            log.warning("settings: remotes.%s is not usable (%s); ignoring it", name, exc)
    return out


@dataclass
class UserSettings:
    """Everything the app remembers. ``model``: the model id or path last chosen (None: bundled). ``load``:
    ``LoadSettings``, e.g. ``load.n_parallel`` (requests served at once; null: auto, chosen from the memory
    estimate when the model loads; out of 1-64 or not an integer: a warning and auto).
    ``cache_budget_mb``: byte budget of the on-disk prefix cache in MiB. ``per_model``: overrides of
    ``load`` fields keyed by model id, and the model's own keys (``speculative``, ``draft_model``,
    ``thinking_markers``, ``ttl_s``, the reasoning defaults; ``app.backends`` reads the engine's). ``tools``:
    ``ToolSettings``, the tool loop's limits. ``remotes``: ``RemoteSettings`` by name (remote engines; their
    keys are elsewhere, ``app.secrets``). ``embedding_model``: the GGUF file documents are embedded with
    (None: the bundled all-MiniLM-L6-v2); ``embedding_pooling``: its pooling override (``mean``, ``cls``,
    ``last``; None: the model's own), how a chat GGUF is used as an embedder (docs/retrieval.md, "Embedding
    models")."""

    model: str | None = None
    load: LoadSettings = field(default_factory=LoadSettings)
    decoding: DecodingParams = field(default_factory=DecodingParams)
    system_prompt: str = ""
    prefix_cache: bool = True
    cache_budget_mb: float = 4096.0
    server: ServerSettings = field(default_factory=ServerSettings)
    per_model: dict[str, dict[str, Any]] = field(default_factory=dict)
    tools: ToolSettings = field(default_factory=ToolSettings)
    remotes: dict[str, RemoteSettings] = field(default_factory=dict)
    embedding_model: str | None = None
    embedding_pooling: str | None = None

    def load_for(self, model_id: str | None) -> LoadSettings:
        """Load settings for ``model_id`` with its remembered overrides applied."""
        over = self.per_model.get(model_id or "", {})
        known = {f.name for f in fields(LoadSettings)}
        return replace(self.load, **{k: v for k, v in over.items() if k in known}).validate()

    def prefix_cache_options(self, budget_mb: float | None = None) -> dict[str, Any] | None:
        """The engine's ``prefix_cache`` argument: None when the cache is off or its budget is 0, else the
        folder and the byte budget. ``budget_mb`` overrides ``cache_budget_mb`` (MiB); negative is refused."""
        budget = self.cache_budget_mb if budget_mb is None else budget_mb
        if budget < 0:
            raise InvalidRequest(f"cache budget must be >= 0 MiB, got {budget}", param="cache_budget_mb")
        if not self.prefix_cache or budget == 0:
            return None
        return {"dir": str(paths.kv_cache_dir()), "budget_bytes": int(budget * 1024 * 1024)}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["decoding"]["stop"] = list(self.decoding.stop)
        d["decoding"]["logit_bias"] = {str(k): v for k, v in self.decoding.logit_bias}
        return d


def _typed(cls, data: Any, where: str, defaults: Any = None) -> dict[str, Any]:
    """The fields of ``data`` whose type matches ``cls``'s defaults; others are dropped with a warning (so one
    bad value falls back to its default instead of losing the whole file)."""
    if not isinstance(data, dict):
        if data is not None:
            log.warning("settings: %s must be an object; using defaults", where or "the file")
        return {}
    ref = defaults if defaults is not None else cls()
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        v, d = data[f.name], getattr(ref, f.name)
        if _same_type(v, d) or (f.name in _OPTIONAL and v is None):
            out[f.name] = v
        else:
            log.warning("settings: %s%s=%r has the wrong type; using the default %r", where, f.name, v, d)
    extra = set(data) - {f.name for f in fields(cls)}
    if extra:
        log.warning("settings: ignoring unknown keys %s", sorted(f"{where}{k}" for k in extra))
    return out


_OPTIONAL = {"n_threads", "n_parallel", "seed", "max_tokens", "grammar", "model", "api_key", "embedding_model",
             "embedding_pooling"}  # null allowed
_POOLINGS = ("mean", "cls", "last")  # app.retrieval.embedder.POOLING_TYPES (not imported: no llama.cpp here)


def _same_type(v: Any, d: Any) -> bool:
    if isinstance(d, bool) or isinstance(v, bool):
        return isinstance(v, bool) and isinstance(d, bool)
    if isinstance(d, float):
        return isinstance(v, (int, float))
    if isinstance(d, (list, tuple)):
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    if d is None:
        return isinstance(v, (int, str))
    return isinstance(v, type(d))


def _validated(make, kw: dict[str, Any], where: str):
    """``make(**kw)``, dropping (with a warning) each value it refuses, until it accepts the rest."""
    kw = dict(kw)
    for _ in range(len(kw) + 1):
        try:
            return make(**kw)
        except InvalidRequest as exc:
            bad = (exc.param or "").split("[")[0].split(".")[0]
            if bad not in kw:
                raise
            log.warning("settings: %s%s: %s; using the default", where, bad, exc)
            kw.pop(bad)
    return make()


def from_dict(data: dict[str, Any]) -> UserSettings:
    """Parse a settings dict. A value of the wrong type or out of range falls back to its default (logged)."""
    if not isinstance(data, dict):
        raise ValueError("settings must be a JSON object")
    load = _validated(lambda **k: LoadSettings(**k).validate(), _typed(LoadSettings, data.get("load"), "load."),
                      "load.")
    dec_in = dict(data["decoding"]) if isinstance(data.get("decoding"), dict) else data.get("decoding")
    bias = dec_in.pop("logit_bias", None) if isinstance(dec_in, dict) else None
    dec_kw = _typed(DecodingParams, dec_in, "decoding.", DecodingParams(stop=()))
    if bias is not None:
        dec_kw["logit_bias"] = bias  # a dict of token id -> bias; DecodingParams.make checks it
    dec = _validated(DecodingParams.make, dec_kw, "decoding.")
    server = ServerSettings(**_typed(ServerSettings, data.get("server"), "server."))
    if not 1 <= server.port <= 65535:
        log.warning("settings: server.port=%r is out of range; using %d", server.port, DEFAULT_PORT)
        server = replace(server, port=DEFAULT_PORT)
    if server.max_body_bytes < MIN_BODY_BYTES:  # 0 or less would refuse every request with a body
        log.warning("settings: server.max_body_bytes=%r is below %d; using the default", server.max_body_bytes,
                    MIN_BODY_BYTES)
        server = replace(server, max_body_bytes=ServerSettings().max_body_bytes)
    tools = _validated(lambda **k: ToolSettings(**k).validate(),
                       _typed(ToolSettings, data.get("tools"), "tools."), "tools.")
    remotes = _remotes_from(data.get("remotes"))
    top = {k: v for k, v in data.items() if k not in ("load", "decoding", "server", "tools", "remotes")}
    base = UserSettings(**_typed(UserSettings, top, ""))
    if base.cache_budget_mb < 0:
        log.warning("settings: cache_budget_mb=%r is negative; using the default", base.cache_budget_mb)
        base = replace(base, cache_budget_mb=UserSettings().cache_budget_mb)
    if base.embedding_model is not None and not (isinstance(base.embedding_model, str) and base.embedding_model):
        log.warning("settings: embedding_model=%r is not a file path; using the bundled model", base.embedding_model)
        base = replace(base, embedding_model=None)
    if base.embedding_pooling is not None and base.embedding_pooling not in _POOLINGS:
        log.warning("settings: embedding_pooling=%r is not one of %s; using the model's own",
                    base.embedding_pooling, ", ".join(_POOLINGS))
        base = replace(base, embedding_pooling=None)
    if not all(isinstance(v, dict) for v in base.per_model.values()):
        base = replace(base, per_model={k: v for k, v in base.per_model.items() if isinstance(v, dict)})
    return replace(base, load=load, decoding=dec, server=server, tools=tools, remotes=remotes)


def load_user_settings() -> UserSettings:
    """The saved settings, or defaults. Never raises for a bad file: a damaged one (``read_json_file``: not
    UTF-8, cut short, nested deeper than 64 levels, a lone surrogate, empty, not an object) is moved aside to
    ``settings.json.corrupt-<UTC time>`` and the defaults are used; one that cannot be read (permissions, a
    folder) is left alone and the defaults are used; a bad value falls back to its default. Each is logged as
    a warning that names the file and what to do."""
    path = paths.settings_file()
    try:
        data = read_json_file(path)
    except FileNotFoundError:
        return UserSettings()
    except OSError as exc:
        log.warning("settings: cannot read %s (%s); Hearth uses its defaults until it can", path,
                    exc.strerror or exc)
        return UserSettings()
    except JsonFileError as exc:
        _keep_aside(path, exc)
        return UserSettings()
    try:
        return from_dict(data)
    except (ValueError, TypeError, HearthError) as exc:  # a value from_dict cannot fall back from
        _keep_aside(path, JsonFileError(str(path), str(exc)))
        return UserSettings()


def _keep_aside(path, exc: JsonFileError) -> None:
    """Move the damaged ``path`` aside (never written over) and say so, with what to do."""
    try:
        aside = set_aside(path)
    except OSError as move:
        log.warning("%s; Hearth uses its defaults (and could not move the file aside: %s): fix or "
                    "delete it", exc, move.strerror or move)
        return
    log.warning("%s; Hearth moved it to %s and uses its defaults: fix that file and move it back to "
                "%s, or delete it", exc, aside, path.name)


def save_user_settings(s: UserSettings) -> None:
    """Write ``settings.json`` atomically (``app.fileio``: a temp file in the same folder, fsync, rename over
    the old file); a damaged file found there is moved aside first, never written over. Raises ``OSError``
    when the data folder is not writable; the old file is then unchanged."""
    path = paths.settings_file()
    try:
        read_json_file(path)
    except JsonFileError as exc:
        aside = set_aside(path)  # OSError: nothing is written
        log.warning("%s; it was kept as %s, and a new %s is written", exc, aside, path.name)
    except OSError:
        pass  # missing, or unreadable: the write below says why if it fails
    text = json.dumps(s.to_dict(), indent=2, sort_keys=True)
    atomic_write_text(path, text, prefix=".settings-")
