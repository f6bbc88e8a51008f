"""The coding agents ``hearth launch`` knows: how each is pointed at Hearth's port, pure data and functions.

Each ``Agent`` says which API of the port it speaks, the smallest context (n_ctx) its own system prompt and
tool definitions need, how it is installed, and ``configure``: the flags, environment and config files that
point it at an ``Endpoint``. Nothing here starts a process or touches the disk, so ``hearth launch --print``
and the tests show exactly what a launch would run. The table and its reasons: docs/launch.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from app.errors import HearthError

AIDER_MIN_N_CTX = 8192
# An agent's key when the port has none: clients insist on sending one; the port ignores it.
PLACEHOLDER_KEY = "hearth"


@dataclass(frozen=True)
class Endpoint:
    """Where the port answers: ``root`` is ``http://host:port`` (no ``/v1``); ``model`` the id requests name;
    ``api_key`` None when the port needs none; ``n_ctx`` the context each request gets, when known."""

    root: str
    model: str
    api_key: str | None = None
    n_ctx: int | None = None

    @property
    def v1(self) -> str:
        """The OpenAI-style base URL (``root/v1``)."""
        return f"{self.root}/v1"

    @property
    def key(self) -> str:
        """The key to hand the agent (a placeholder when the port needs none)."""
        return self.api_key or PLACEHOLDER_KEY


@dataclass(frozen=True)
class Plan:
    """What a launch runs: ``argv``; ``env`` set on top of the caller's (a None value removes the variable);
    ``files`` (path → text) written before it starts."""

    argv: tuple[str, ...]
    env: dict[str, str | None] = field(default_factory=dict)
    files: dict[Path, str] = field(default_factory=dict)

    def environ(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` with ``env`` applied."""
        out = dict(base)
        for k, v in self.env.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
        return out


# configure(endpoint, config_dir) -> (flags before the agent's own argv, env, files)
Configure = Callable[[Endpoint, Path], "tuple[list[str], dict[str, str | None], dict[Path, str]]"]


@dataclass(frozen=True)
class Agent:
    """One coding agent: ``name`` (what ``hearth launch`` takes), ``executable``, ``install`` (the command
    that installs it), ``api`` (the port's path it speaks), ``min_n_ctx`` and ``configure``."""

    name: str
    executable: str
    install: str
    api: str
    min_n_ctx: int
    configure: Configure

    def plan(self, endpoint: Endpoint, config_dir: Path, argv: list[str], executable: str | None = None) -> Plan:
        """The command, environment and files that run this agent against ``endpoint`` with the person's own
        ``argv`` after Hearth's flags; ``executable`` is the resolved path (default: the bare name)."""
        flags, env, files = self.configure(endpoint, config_dir)
        return Plan((executable or self.executable, *flags, *argv), env, files)


class UnknownAgent(HearthError):
    """``hearth launch`` was asked for an agent it does not know."""


class AgentNotInstalled(HearthError):
    """The agent's executable is not on PATH nor in Hearth's agents folder."""


# -- the agents --------------------------------------------------------------------------------------------
def _aider(ep: Endpoint, config_dir: Path):
    """aider through /v1/chat/completions (litellm's ``openai/`` provider). The model metadata file tells it
    the context window and zero prices, so it never downloads litellm's price list at start (it does when a
    model is missing from both), and LITELLM_LOCAL_MODEL_COST_MAP keeps litellm on its bundled copy."""
    meta = config_dir / "aider.model.metadata.json"
    info = {"max_input_tokens": ep.n_ctx or AIDER_MIN_N_CTX, "max_output_tokens": 4096, "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0, "litellm_provider": "openai", "mode": "chat"}
    flags = ["--model", f"openai/{ep.model}", "--model-metadata-file", str(meta), "--no-check-update",
             "--no-show-model-warnings", "--analytics-disable", "--no-show-release-notes"]
    env: dict[str, str | None] = {"OPENAI_API_BASE": ep.v1, "OPENAI_API_KEY": ep.key,
                                  "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return flags, env, {meta: json.dumps({f"openai/{ep.model}": info}, indent=2) + "\n"}


def _claude(ep: Endpoint, config_dir: Path):
    """Claude Code through /v1/messages: every model tier is Hearth's model; no telemetry, no updater."""
    env: dict[str, str | None] = {
        "ANTHROPIC_BASE_URL": ep.root, "ANTHROPIC_AUTH_TOKEN": ep.key, "ANTHROPIC_API_KEY": None,
        "ANTHROPIC_MODEL": ep.model, "ANTHROPIC_SMALL_FAST_MODEL": ep.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": ep.model, "ANTHROPIC_DEFAULT_SONNET_MODEL": ep.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": ep.model, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1"}
    return [], env, {}


def _codex(ep: Endpoint, config_dir: Path):
    """Codex through /v1/responses: a ``hearth`` model provider given as ``-c`` overrides (TOML values), so
    the person's own ``~/.codex/config.toml`` is left alone. Codex 0.171 also sends a ``namespace`` tool
    (``multi_agent_v1``) and a hosted ``web_search`` tool, which the port refuses (function tools only):
    both are turned off here."""
    p = "model_providers.hearth"
    flags = ["-c", f'{p}.name="Hearth"', "-c", f'{p}.base_url="{ep.v1}"', "-c", f'{p}.wire_api="responses"',
             "-c", f'{p}.env_key="HEARTH_API_KEY"', "-c", 'model_provider="hearth"', "-c", f'model="{ep.model}"',
             "-c", "check_for_update_on_startup=false", "-c", "features.multi_agent=false",
             "-c", 'web_search="disabled"']
    return flags, {"HEARTH_API_KEY": ep.key}, {}


def _opencode(ep: Endpoint, config_dir: Path):
    """opencode through /v1/chat/completions: a custom provider (@ai-sdk/openai-compatible) in its own
    config file, named by OPENCODE_CONFIG; no model list download, no autoupdate."""
    conf = config_dir / "opencode.json"
    body = {"$schema": "https://opencode.ai/config.json", "model": f"hearth/{ep.model}", "autoupdate": False,
            "provider": {"hearth": {"npm": "@ai-sdk/openai-compatible", "name": "Hearth",
                                    "options": {"baseURL": ep.v1, "apiKey": ep.key},
                                    "models": {ep.model: {"name": ep.model}}}}}
    env: dict[str, str | None] = {"OPENCODE_CONFIG": str(conf), "OPENCODE_DISABLE_AUTOUPDATE": "1",
                                  "OPENCODE_DISABLE_MODELS_FETCH": "1"}
    return [], env, {conf: json.dumps(body, indent=2) + "\n"}


# min_n_ctx: the agent's system prompt + tool definitions + room for a question, files and an answer.
# aider's measured (docs/launch.md): 2,300 prompt tokens for a one-line question in its default diff mode.
AGENTS: dict[str, Agent] = {a.name: a for a in (
    Agent("aider", "aider", "make agent-aider  (or: pipx install aider-chat)", "/v1/chat/completions",
          AIDER_MIN_N_CTX, _aider),
    Agent("claude", "claude", "npm i -g @anthropic-ai/claude-code", "/v1/messages", 32768, _claude),
    Agent("codex", "codex", "npm i -g @openai/codex", "/v1/responses", 16384, _codex),
    Agent("opencode", "opencode", "npm i -g opencode-ai", "/v1/chat/completions", 16384, _opencode),
)}


def get(name: str | None) -> Agent:
    """The agent called ``name``; raises ``UnknownAgent`` listing the known ones."""
    if name in AGENTS:
        return AGENTS[name]
    known = ", ".join(sorted(AGENTS))
    what = f"unknown agent {name!r}" if name else "no agent given"
    raise UnknownAgent(f"{what}; known agents: {known} (`hearth launch AGENT`)")
