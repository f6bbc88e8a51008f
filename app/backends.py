"""Settings + model name → backend: the one place a chat backend is built from the user's settings.

The CLI, the port's model pool and the window each ask for a ``BackendPlan`` (a comparable value: what would
be built) and have ``build`` make it, so the same settings give the same backend everywhere.

The reasoning: docs/architecture.md, 'app/backends.py'.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

from app.catalog.registry import model_id as id_of
from app.catalog.registry import resolve_model
from app.errors import InvalidRequest
from app.protocol.types import LoadSettings
from app.settings import RemoteSettings, UserSettings

if TYPE_CHECKING:
    from app.engine.pool import ModelPool
    from app.protocol.backend import Backend

ENGINE_OPTIONS = ("speculative", "draft_model", "thinking_markers")  # per_model keys that are Engine arguments
_LOAD_FIELDS = frozenset(f.name for f in fields(LoadSettings))


@dataclass(frozen=True)
class BackendPlan:
    """What ``build`` makes, resolved and validated. ``model_id``: the id conversations record (the file stem;
    a remote's name). ``path``: the GGUF file (a remote: its name). ``load``: the validated ``LoadSettings``
    (None for a remote, whose context is the remote's). ``speculative`` / ``draft_model`` /
    ``thinking_markers``: the model's ``Engine`` options (docs/speculative.md, docs/reasoning.md).
    ``prefix_cache``: the engine's prefix-cache options (folder, byte budget) or None when off. ``remote``:
    the ``RemoteSettings`` of a remote engine, else None."""

    model_id: str
    path: str
    load: Optional[LoadSettings] = None
    speculative: Optional[str] = None
    draft_model: Optional[str] = None
    thinking_markers: Optional[dict[str, Any]] = None
    prefix_cache: Optional[dict[str, Any]] = None
    remote: Optional[RemoteSettings] = None

    def engine_options(self) -> dict[str, Any]:
        """The ``Engine`` keyword arguments of the model's options that are set."""
        opts = {"speculative": self.speculative, "draft_model": self.draft_model,
                "thinking_markers": self.thinking_markers}
        return {k: v for k, v in opts.items() if v is not None}


def load_settings(settings: UserSettings, model_id: Optional[str],
                  flags: Optional[Mapping[str, Any]] = None) -> LoadSettings:
    """``settings.load`` with ``per_model[model_id]``'s load keys, then ``flags`` (``LoadSettings`` field →
    value) applied. With flags given, a quantized ``type_v`` turns flash attention on unless the flags set
    ``flash_attn`` too (it needs it). Raises ``InvalidRequest`` naming the field for a value out of range or an
    unknown flag."""
    base = settings.load_for(model_id)
    flags = dict(flags or {})
    unknown = sorted(set(flags) - _LOAD_FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown load settings {unknown}; known: {', '.join(sorted(_LOAD_FIELDS))}",
                             param=unknown[0])
    if flags and flags.get("type_v", base.type_v) != "f16" and "flash_attn" not in flags:
        flags["flash_attn"] = True  # an explicit flash_attn=False still fails validation, naming type_v
    return replace(base, **flags).validate()


def engine_options(settings: UserSettings, model_id: Optional[str]) -> dict[str, Any]:
    """``per_model[model_id]``'s ``Engine`` options that are set (``speculative``, ``draft_model``,
    ``thinking_markers``). Raises ``InvalidRequest`` naming ``per_model.<id>.<key>`` for a value of the wrong
    type (a mode or path that is not a string, markers that are not an object); the values themselves are
    checked by ``Engine`` (``speculative``) and when it loads (the draft file, the markers)."""
    over = settings.per_model.get(model_id or "", {})
    out = {k: over[k] for k in ENGINE_OPTIONS if over.get(k) is not None}
    for key, kind in (("speculative", str), ("draft_model", str), ("thinking_markers", dict)):
        if key in out and not isinstance(out[key], kind):
            raise InvalidRequest(f"per_model.{model_id}.{key} must be a {kind.__name__}, got {out[key]!r}",
                                 param=f"per_model.{model_id}.{key}")
    return out


def plan_file(settings: UserSettings, path: str | Path, *, model_id: Optional[str] = None,
              flags: Optional[Mapping[str, Any]] = None, prefix_cache: bool = True,
              cache_budget_mb: Optional[float] = None) -> BackendPlan:
    """The plan for the local GGUF at ``path`` (not opened here). ``model_id``: its id (default: the file stem,
    ``registry.model_id``). ``prefix_cache`` False: no prefix cache; ``cache_budget_mb``: its budget in MiB
    instead of the settings' (0: off). Raises ``InvalidRequest`` naming a bad load setting or option."""
    mid = model_id or id_of(path)
    opts = engine_options(settings, mid)
    cache = settings.prefix_cache_options(cache_budget_mb) if prefix_cache else None
    return BackendPlan(model_id=mid, path=str(path), load=load_settings(settings, mid, flags),
                       speculative=opts.get("speculative"), draft_model=opts.get("draft_model"),
                       thinking_markers=opts.get("thinking_markers"), prefix_cache=cache)


def plan_remote(settings: UserSettings, name: str) -> BackendPlan:
    """The plan for ``remotes[name]``. Raises ``InvalidRequest`` (param ``name``) when there is none."""
    remote = settings.remotes.get(name)
    if remote is None:
        raise InvalidRequest(f"no remote engine named {name!r}; see `hearth remote list`", param="name")
    return BackendPlan(model_id=name, path=name, remote=remote)


def plan(settings: UserSettings, name: Optional[str], *, allow_paths: bool = True,
         flags: Optional[Mapping[str, Any]] = None, prefix_cache: bool = True,
         cache_budget_mb: Optional[float] = None) -> BackendPlan:
    """The plan for the model ``name`` means: a ``remotes`` entry, else an installed model or (with
    ``allow_paths``) a GGUF path, resolved by ``registry.resolve_model`` (None: the bundled model). The other
    arguments are ``plan_file``'s. Raises ``ModelNotFound`` for an unknown name, ``InvalidRequest`` for a bad
    setting."""
    if name and name in settings.remotes:
        return plan_remote(settings, name)
    path = resolve_model(name, allow_paths=allow_paths)
    return plan_file(settings, path, flags=flags, prefix_cache=prefix_cache, cache_budget_mb=cache_budget_mb)


def build(p: BackendPlan, **engine_kwargs: Any) -> "Backend":
    """A new, not yet loaded backend for ``p``: a ``RemoteEngine`` with its key resolved (``app.secrets``;
    ``SecretError`` names what is missing), else an ``Engine`` (``engine_kwargs``: its other arguments, e.g.
    ``max_queue``; ``InvalidRequest`` for an unknown ``speculative`` mode). Loading (``load()``) raises
    ``ModelLoadError``."""
    if p.remote is not None:
        from app import secrets
        from app.engine.remote.engine import RemoteEngine

        return RemoteEngine.from_settings(p.path, p.remote, api_key=secrets.api_key_for(p.path, p.remote),
                                          key_hint=secrets.key_source(p.path, p.remote), **engine_kwargs)
    from app.engine.local.engine import Engine

    return Engine(p.path, p.load, prefix_cache=p.prefix_cache, **{**p.engine_options(), **engine_kwargs})


def model_pool(settings: UserSettings, *, budget_bytes: Optional[int] = None, ttl_s: Optional[float] = 300.0,
               load_timeout_s: float = 300.0, prefix_cache: bool = True, cache_budget_mb: Optional[float] = None,
               engine_kwargs: Optional[Mapping[str, Any]] = None) -> "ModelPool":
    """The port's pool of every installed model and remote engine, each built by ``build(plan_file(...))`` (or
    ``plan_remote``) from ``settings``; a model's idle TTL from ``per_model[<id>].ttl_s`` (seconds). The
    other arguments are ``app.engine.pool.local_pool``'s (``budget_bytes`` None: 80 % of the RAM available
    now) and ``plan_file``'s; ``engine_kwargs`` go to every local ``Engine`` (e.g. ``max_queue``)."""
    from app.engine.pool import REMOTE_PREFIX, local_pool

    kw = dict(engine_kwargs or {})

    def make(key: str, path: str) -> Any:
        if path.startswith(REMOTE_PREFIX):
            return build(plan_remote(settings, key))
        return build(plan_file(settings, path, model_id=key, prefix_cache=prefix_cache,
                               cache_budget_mb=cache_budget_mb), **kw)

    def ttl_for(key: str) -> Optional[float]:
        v = settings.per_model.get(key, {}).get("ttl_s")
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return local_pool(make, lambda key: load_settings(settings, key), remote_names=tuple(settings.remotes),
                      ttl_for=ttl_for, budget_bytes=budget_bytes, ttl_s=ttl_s, load_timeout_s=load_timeout_s)
