"""A verifier's ``Verdict``, and the two verifiers that only read: ``RegexCheck`` (the answer or the text
matches a gated regex whole) and ``JsonSchemaCheck`` (valid against a JSON schema) (docs/reasoning.md,
"Verifiers")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.engine.policies.extract import PARAM, last_json_object
from app.engine.policies.regex_gate import MAX_SCAN_CHARS, _gate


@dataclass(frozen=True)
class Verdict:
    """A verifier's judgement of one candidate. ``reason``: a short line for a person (why it was rejected,
    or what accepted it)."""

    accepted: bool
    reason: str


NO_ANSWER = Verdict(False, "no extractable answer")
TARGETS = ("answer", "text")


@dataclass(frozen=True)
class RegexCheck:
    """``{"regex": pattern, "on": "answer" | "text"}``: accepted iff the pattern matches the *whole* answer
    (default) or the whole text. A target longer than the pattern's ``match_window`` is rejected unread."""

    pattern: str
    on: str = "answer"

    def verify(self, answer: str | None, text: str) -> Verdict:
        target = answer if self.on == "answer" else text
        if target is None:
            return NO_ANSWER
        compiled, budget = _gate(self.pattern, PARAM + ".verifier", "verifier.regex")
        if len(target) > budget.match_window:
            return Verdict(False, f"the {self.on} is {len(target)} characters, longer than the "
                                  f"{budget.match_window} this regex may scan")
        if compiled.fullmatch(target):
            return Verdict(True, f"the {self.on} matches the regex")
        return Verdict(False, f"the {self.on} does not match the regex")

    def to_api(self) -> dict:
        return {"regex": self.pattern, "on": self.on}


@dataclass(frozen=True)
class JsonSchemaCheck:
    """``{"json_schema": {...}, "on": "answer" | "text"}``: the answer parsed as JSON (an answer that is not
    JSON is taken as a JSON string), or the last JSON object of the text, validated with ``jsonschema``
    (the schema's own dialect). Schema ``pattern``s pass ``regex_gate``; an instance longer than the
    tightest pattern window is rejected unread."""

    schema: dict
    on: str = "answer"
    max_chars: int = MAX_SCAN_CHARS

    def verify(self, answer: str | None, text: str) -> Verdict:
        if self.on == "answer":
            if answer is None:
                return NO_ANSWER
            instance = _as_json(answer)
        else:
            instance = last_json_object(text)
            if instance is None:
                return Verdict(False, "the text holds no JSON object")
        if len(json.dumps(instance)) > self.max_chars:
            return Verdict(False, f"the {self.on} is longer than the {self.max_chars} characters the schema's "
                                  "patterns may scan")
        import jsonschema

        error = jsonschema.exceptions.best_match(
            jsonschema.validators.validator_for(self.schema)(self.schema).iter_errors(instance))
        if error is None:
            return Verdict(True, "valid against the JSON schema")
        where = "/".join(str(p) for p in error.absolute_path)
        return Verdict(False, f"not valid against the JSON schema{' at ' + where if where else ''}: "
                              f"{error.message[:200]}")

    def to_api(self) -> dict:
        return {"json_schema": self.schema, "on": self.on}


def _as_json(answer: str) -> Any:
    try:
        return json.loads(answer)
    except ValueError:
        return answer


def _schema_patterns(node: Any) -> list[str]:
    if isinstance(node, dict):
        out = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        if isinstance(node.get("patternProperties"), dict):
            out += list(node["patternProperties"])
        return out + [p for v in node.values() for p in _schema_patterns(v)]
    if isinstance(node, list):
        return [p for v in node for p in _schema_patterns(v)]
    return []
