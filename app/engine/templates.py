"""Chat templates: turn a list of chat messages into the exact prompt text a model was trained on.

Choice (``choose_template_name``), first match wins:
1. The GGUF's own Jinja template (``tokenizer.chat_template``), rendered in a Jinja2 sandbox the way
   llama-cpp-python's ``Jinja2ChatFormatter`` and Hugging Face ``apply_chat_template`` do.
2. A model that has no template in its metadata and does not say it is instruction-tuned (name, finetune or
   file name without ``it``/``instruct``/``chat``) is a *base* model: a plain transcript
   ("User: … / Assistant:" with a one-shot preamble, stopping at the next "User:" or a blank line). Measured on the bundled
   Gemma 3 270M base model: it answers "What is the capital of France?" with " Paris." this way and loops
   under the Gemma chat template.
3. A built-in template by architecture: gemma (system merged into the first user turn: Gemma has no system
   role), llama-3, mistral, chatml (the fallback).

A rendered prompt carries its own stop strings and whether a BOS token must be prepended at tokenization.
Control tokens written in the template text (``<start_of_turn>``…) are tokenized with ``special=True``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from app.errors import InvalidRequest

TEMPLATE_NAMES = ("gguf", "transcript", "gemma", "llama-3", "mistral", "chatml")

TRANSCRIPT_PREAMBLE = (
    "The following is a conversation between a User and a helpful, concise Assistant.\n\n"
    "User: What is the largest planet in the solar system?\n"
    "Assistant: Jupiter.\n\n"
)


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt ready to tokenize. ``text`` may hold control-token text (tokenize with special=True);
    ``add_bos``: prepend the model's BOS token; ``stop``: extra stop strings this template needs;
    ``name``: the template used (reported in each answer's metadata)."""

    text: str
    name: str
    add_bos: bool = True
    stop: tuple[str, ...] = ()


_INSTRUCT_HINT = re.compile(r"(^|[^a-z])(it|instruct|chat|sft|dpo|rlhf)([^a-z]|$)", re.I)


def choose_template_name(info: Any) -> str:
    """Pick a template name for a model. ``info`` has attributes ``chat_template`` (str or None),
    ``architecture`` (str), and optionally ``name``, ``finetune``, ``file_name``."""
    if getattr(info, "chat_template", None):
        return "gguf"
    hints = " ".join(str(getattr(info, a, "") or "") for a in ("name", "finetune", "file_name"))
    if not _INSTRUCT_HINT.search(hints):
        return "transcript"
    arch = (getattr(info, "architecture", "") or "").lower()
    name = hints.lower()
    if arch.startswith("gemma"):
        return "gemma"
    if arch == "llama" and ("llama-3" in name or "llama3" in name):
        return "llama-3"
    if arch == "llama" and "mistral" in name or arch == "mistral":
        return "mistral"
    return "chatml"


def _merge_system(messages: Sequence[Any]) -> list[tuple[str, str]]:
    """Fold system messages into the first user turn (for templates without a system role)."""
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    rest = [(m.role, m.content) for m in messages if m.role != "system"]
    if system:
        if rest and rest[0][0] == "user":
            rest[0] = ("user", f"{system}\n\n{rest[0][1]}")
        else:
            rest.insert(0, ("user", system))
    return rest


def _transcript(messages: Sequence[Any]) -> RenderedPrompt:
    system = "\n\n".join(m.content.strip() for m in messages if m.role == "system")
    parts = [TRANSCRIPT_PREAMBLE if not system else f"{system}\n\n"]
    for m in messages:
        if m.role == "user":
            parts.append(f"User: {m.content.strip()}\n")
        elif m.role == "assistant":
            parts.append(f"Assistant: {m.content.strip()}\n\n")
    parts.append("Assistant:")
    # A base model's answer ends at a blank line or where it starts writing the next turn (it would otherwise go
    # on inventing questions and answers).
    return RenderedPrompt("".join(parts), "transcript", True, ("\n\n", "\nUser:", "User:"))


def _gemma(messages: Sequence[Any]) -> RenderedPrompt:
    out = []
    for role, content in _merge_system(messages):
        r = "model" if role == "assistant" else "user"
        out.append(f"<start_of_turn>{r}\n{content}<end_of_turn>\n")
    out.append("<start_of_turn>model\n")
    return RenderedPrompt("".join(out), "gemma", True, ())


def _llama3(messages: Sequence[Any]) -> RenderedPrompt:
    out = []
    for m in messages:
        out.append(f"<|start_header_id|>{m.role}<|end_header_id|>\n\n{m.content.strip()}<|eot_id|>")
    out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return RenderedPrompt("".join(out), "llama-3", True, ())


def _mistral(messages: Sequence[Any]) -> RenderedPrompt:
    out = []
    for role, content in _merge_system(messages):
        if role == "user":
            out.append(f"[INST] {content.strip()} [/INST]")
        else:
            out.append(f" {content.strip()}</s>")
    return RenderedPrompt("".join(out), "mistral", True, ())


def _chatml(messages: Sequence[Any]) -> RenderedPrompt:
    out = [f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages]
    out.append("<|im_start|>assistant\n")
    return RenderedPrompt("".join(out), "chatml", False, ("<|im_end|>",))


def _gguf(messages: Sequence[Any], template: str, bos_token: str, eos_token: str) -> RenderedPrompt:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg: str) -> None:
        raise InvalidRequest(f"the model's chat template refused the messages: {msg}", param="messages")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    try:
        tpl = env.from_string(template)
        text = tpl.render(messages=[{"role": m.role, "content": m.content} for m in messages],
                          bos_token=bos_token, eos_token=eos_token, add_generation_prompt=True,
                          raise_exception=raise_exception)
    except InvalidRequest:
        raise
    except jinja2.TemplateError as exc:
        raise InvalidRequest(f"the model's chat template failed: {exc}", param="messages") from None
    add_bos = not (bos_token and text.startswith(bos_token))
    return RenderedPrompt(text, "gguf", add_bos, ())


def render(messages: Sequence[Any], name: str, *, chat_template: str | None = None, bos_token: str = "",
           eos_token: str = "") -> RenderedPrompt:
    """Render ``messages`` (objects with ``role`` and ``content``) with template ``name``.

    Raises ``InvalidRequest`` for an unknown template name or a template that fails on these messages."""
    if name == "gguf":
        if not chat_template:
            raise InvalidRequest("template 'gguf' requested but the model has no chat template", param="template")
        return _gguf(messages, chat_template, bos_token, eos_token)
    fn = {"transcript": _transcript, "gemma": _gemma, "llama-3": _llama3, "mistral": _mistral,
          "chatml": _chatml}.get(name)
    if fn is None:
        raise InvalidRequest(f"unknown template {name!r}; choose one of {', '.join(TEMPLATE_NAMES)}",
                             param="template")
    return fn(messages)
