"""Presets and projects as plain values, their validation, and their JSON exchange format (no Qt, no SQL).

Validation names the field as the JSON file would, and an import is checked whole before anything is written.

The reasoning: docs/memory.md, 'app/memory/presets.py'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.errors import InvalidRequest
from app.protocol.types import DecodingParams

PRESETS_FORMAT = "hearth.presets"
PRESETS_VERSION = 1
# The decoding fields a preset may set (the rest come from the person's defaults).
DECODING_KEYS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
                 "frequency_penalty", "seed", "max_tokens", "stop")
MAX_NAME = 100


@dataclass(frozen=True)
class Preset:
    """A saved system prompt + decoding settings + model. ``decoding``: only the keys it sets
    (``DECODING_KEYS``); ``model``: a model id or path, None for the loaded one."""

    id: str
    name: str
    system_prompt: str = ""
    decoding: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    created: str = ""
    updated: str = ""

    def decoding_over(self, base: DecodingParams) -> DecodingParams:
        """``base`` (the person's defaults) with this preset's decoding settings applied, validated."""
        return base.updated(**self.decoding) if self.decoding else base

    def to_dict(self) -> dict[str, Any]:
        """The exchange form (no id or times: an imported preset is matched by name)."""
        return {"name": self.name, "system_prompt": self.system_prompt, "decoding": dict(self.decoding),
                "model": self.model}


@dataclass(frozen=True)
class Project:
    """A folder of conversations: ``preset_id`` (None: the person's defaults), ``documents`` (paths of the
    document index its chats search; None: all documents)."""

    id: str
    name: str
    preset_id: str | None = None
    documents: list[str] | None = None
    created: str = ""
    updated: str = ""


def _fail(where: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"{where} {what}", param=where)


def check_name(name: Any, where: str = "name") -> str:
    """A preset's or project's name: text, 1-100 characters after trimming."""
    if not isinstance(name, str) or not name.strip():
        raise _fail(where, f"must be a non-empty text, got {name!r}")
    name = name.strip()
    if len(name) > MAX_NAME:
        raise _fail(where, f"must be at most {MAX_NAME} characters, got {len(name)}")
    return name


def check_decoding(decoding: Any, where: str = "decoding") -> dict[str, Any]:
    """The decoding settings of a preset: an object of ``DECODING_KEYS``, each in the range
    ``DecodingParams`` accepts (``InvalidRequest`` names ``<where>.<key>``)."""
    if decoding is None:
        return {}
    if not isinstance(decoding, dict):
        raise _fail(where, f"must be an object, got {type(decoding).__name__}")
    for key in decoding:
        if key not in DECODING_KEYS:
            raise _fail(f"{where}.{key}", f"is not a decoding setting (known: {', '.join(DECODING_KEYS)})")
    out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in decoding.items()}
    for key, value in out.items():
        if isinstance(value, bool) or (key == "stop" and not isinstance(value, (list, str))):
            raise _fail(f"{where}.{key}", f"has the wrong type: {value!r}")
    try:
        DecodingParams().updated(**out)
    except InvalidRequest as exc:
        raise InvalidRequest(f"{where}.{exc.param}: {exc}", param=f"{where}.{exc.param}") from None
    except (TypeError, ValueError) as exc:
        raise _fail(where, f"is not valid: {exc}") from None
    return out


def check_preset(data: Any, where: str = "preset") -> dict[str, Any]:
    """A preset's fields from a mapping (``name``, ``system_prompt``, ``decoding``, ``model``), checked;
    unknown keys are refused so a misspelt field is not silently lost."""
    if not isinstance(data, dict):
        raise _fail(where, f"must be an object, got {type(data).__name__}")
    known = ("name", "system_prompt", "decoding", "model")
    for key in data:
        if key not in known:
            raise _fail(f"{where}.{key}", f"is not a preset field (known: {', '.join(known)})")
    if "name" not in data:
        raise _fail(f"{where}.name", "is missing")
    prompt = data.get("system_prompt", "")
    if not isinstance(prompt, str):
        raise _fail(f"{where}.system_prompt", f"must be text, got {type(prompt).__name__}")
    model = data.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise _fail(f"{where}.model", f"must be a model id or path, or null, got {model!r}")
    return {"name": check_name(data["name"], f"{where}.name"), "system_prompt": prompt,
            "decoding": check_decoding(data.get("decoding"), f"{where}.decoding"),
            "model": model.strip() if isinstance(model, str) else None}


def export_presets(presets: list[Preset]) -> str:
    """The JSON file of ``presets`` (``{"format": "hearth.presets", "version": 1, "presets": [...]}``)."""
    doc = {"format": PRESETS_FORMAT, "version": PRESETS_VERSION, "presets": [p.to_dict() for p in presets]}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def parse_presets(text: str | bytes | dict) -> list[dict[str, Any]]:
    """Every preset of an exported file, checked (``InvalidRequest`` names the first bad field, e.g.
    ``presets[1].decoding.temperature``). A single preset object is accepted too."""
    if isinstance(text, dict):
        doc: Any = text
    else:
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"the file is not JSON: {exc}", param="file") from None
    if isinstance(doc, dict) and "presets" not in doc and "name" in doc:
        return [check_preset(doc, "preset")]
    if not isinstance(doc, dict):
        raise InvalidRequest("the file must hold a JSON object with a presets list", param="file")
    if doc.get("format", PRESETS_FORMAT) != PRESETS_FORMAT:
        raise _fail("format", f"must be {PRESETS_FORMAT!r}, got {doc.get('format')!r}")
    version = doc.get("version", PRESETS_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version > PRESETS_VERSION:
        raise _fail("version", f"must be at most {PRESETS_VERSION} (this Hearth's), got {version!r}")
    items = doc.get("presets")
    if not isinstance(items, list):
        raise _fail("presets", "must be a list")
    checked = [check_preset(p, f"presets[{i}]") for i, p in enumerate(items)]
    names = [p["name"].casefold() for p in checked]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise _fail(f"presets[{i}].name", f"repeats the name {checked[i]['name']!r}")
    return checked
