"""Thinking markers per model, and the streaming splitter that keeps reasoning text apart from the answer.

A thinking model writes its reasoning between two markers and then its answer. Hearth keeps the two apart
everywhere (``message.reasoning_content`` in the API, collapsed in the window, stored apart in memory, never
fed back as answer text), so the markers must be known per model (``markers_for``) and found in a stream of
token texts (``ReasoningSplitter``).

The reasoning: docs/reasoning.md, 'Which markers a model uses' and 'Splitting the stream'.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Union

from app.errors import InvalidRequest

WS = " \t\r\n"
FAMILIES = ("think", "harmony", "mistral", "command-r7b", "prefill", "custom")


@dataclass(frozen=True)
class ThinkingMarkers:
    """How one model marks its thinking.

    ``start`` / ``end``: the strings that open and close thinking in the model's output (non-empty, different).
    ``close``: the text Hearth writes to end thinking early (budget forcing, "stop thinking"), which must
    contain ``end``; "" means ``end`` alone. ``drop``: other control strings removed from both outputs
    wherever they appear (harmony's headers, Command R7B's response tags). ``prefill_start``: the model does
    not think by itself; thinking is started by appending ``start`` to the prompt. ``switch``: the name of the
    template variable that turns thinking off (Qwen3: ``enable_thinking``), None when there is none or the
    model's own template is not the one rendering. ``effort_var``: a template variable that takes
    low / medium / high (GPT-OSS: ``reasoning_effort``). ``family``: one of ``FAMILIES``. ``source``: where the
    markers come from, for a person.

    Raises ``InvalidRequest`` (param ``thinking_markers.<field>``) for an empty or clashing marker.
    """

    start: str
    end: str
    close: str = ""
    drop: tuple[str, ...] = ()
    prefill_start: bool = False
    switch: str | None = None
    effort_var: str | None = None
    family: str = "custom"
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InvalidRequest(f"thinking_markers.{name} must be a non-empty string, got {value!r}",
                                     param=f"thinking_markers.{name}")
        if self.start == self.end:
            raise InvalidRequest(f"thinking_markers.start and .end must differ, both are {self.start!r}",
                                 param="thinking_markers.end")
        if not isinstance(self.close, str) or (self.close and self.end not in self.close):
            raise InvalidRequest(f"thinking_markers.close must contain the end marker {self.end!r}, got "
                                 f"{self.close!r}", param="thinking_markers.close")
        if not isinstance(self.drop, tuple) or not all(isinstance(s, str) and s for s in self.drop):
            raise InvalidRequest(f"thinking_markers.drop must be a list of non-empty strings, got {self.drop!r}",
                                 param="thinking_markers.drop")
        if not isinstance(self.prefill_start, bool):
            raise InvalidRequest(f"thinking_markers.prefill_start must be true or false, got "
                                 f"{self.prefill_start!r}", param="thinking_markers.prefill_start")
        if not self.close:
            object.__setattr__(self, "close", self.end)

    @property
    def native(self) -> bool:
        """The model opens thinking by itself (or its template does)."""
        return not self.prefill_start

    @property
    def strings(self) -> tuple[str, ...]:
        """Every string the splitter removes: start, end, then ``drop``."""
        return (self.start, self.end) + tuple(s for s in self.drop if s not in (self.start, self.end))

    @property
    def empty_thinking(self) -> str:
        """Text that opens and at once closes thinking (appended to a prompt for "no thinking")."""
        return self.start + self.close

    def force_text(self, answer_now: str | None = None) -> str:
        """What to insert to end thinking now: ``close`` then the optional "answer now" line."""
        return self.close + (answer_now or "")

    def inside_after(self, prompt: str) -> bool:
        """Whether generation after ``prompt`` (rendered text) begins inside thinking: its last start marker
        comes after its last end marker (DeepSeek-R1's ``<think>\\n``, a prefilled start, a client's
        unfinished assistant turn)."""
        i = prompt.rfind(self.start)
        return i != -1 and i > prompt.rfind(self.end)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["drop"] = list(self.drop)
        return d


THINK = ThinkingMarkers("<think>", "</think>", close="\n</think>\n\n", family="think",
                        source="DeepSeek-R1 / QwQ-32B / Qwen3 chat templates (<think>…</think>)")
HARMONY = ThinkingMarkers(
    "<|channel|>analysis<|message|>", "<|end|>", close="<|end|><|start|>assistant<|channel|>final<|message|>",
    drop=("<|start|>assistant", "<|channel|>final<|message|>", "<|return|>"), family="harmony",
    source="openai/gpt-oss chat_template.jinja and the Harmony response format (analysis / final channels)")
MISTRAL_THINK = ThinkingMarkers("[THINK]", "[/THINK]", family="mistral",
                                source="Magistral Small 2509 chat template ([THINK]…[/THINK])")
COMMAND_R7B = ThinkingMarkers(
    "<|START_THINKING|>", "<|END_THINKING|>", close="<|END_THINKING|><|START_RESPONSE|>",
    drop=("<|START_RESPONSE|>", "<|END_RESPONSE|>"), family="command-r7b",
    source="CohereForAI c4ai-command-r7b-12-2024 chat template (START/END_THINKING, START/END_RESPONSE)")
DEFAULT_MARKERS = ThinkingMarkers("<think>", "</think>", close="\n</think>\n\n", prefill_start=True,
                                  family="prefill",
                                  source="Hearth's default: the model has no thinking markers; thinking is "
                                         "started by prefilling <think>")

# Template text that names each family, checked in this order (harmony first: its templates mention no tags).
_BY_TEMPLATE = (("<|channel|>", HARMONY), ("<|START_THINKING|>", COMMAND_R7B), ("[THINK]", MISTRAL_THINK),
                ("<think>", THINK), ("</think>", THINK))
_OVERRIDE_KEYS = ("start", "end", "close", "drop", "prefill_start")


def markers_for(template_name: str, chat_template: str | None = None, architecture: str = "",
                overrides: Mapping[str, Any] | None = None) -> ThinkingMarkers:
    """The thinking markers of a model (the order and the sources: docs/reasoning.md, 'Which markers a model uses').

    ``template_name``: the template Hearth renders with ("gguf", "transcript", a built-in); the template's
    ``switch`` / ``effort_var`` are reported only for "gguf" (only the model's own template reads them).
    ``chat_template``: the GGUF's template text (None: none). ``architecture``: ``general.architecture``.
    ``overrides``: the model's ``thinking_markers`` setting, keys in ``_OVERRIDE_KEYS`` (None or empty: none).

    Raises ``InvalidRequest`` (param ``thinking_markers`` or ``thinking_markers.<key>``) for a bad override.
    """
    t = chat_template or ""
    arch = (architecture or "").lower()
    found = next((m for needle, m in _BY_TEMPLATE if needle in t), None)
    if found is None and template_name != "transcript":
        found = HARMONY if arch == "gpt-oss" else THINK if arch in ("qwen3", "qwen3moe") else None
    base = found or DEFAULT_MARKERS
    own = template_name == "gguf"
    switch = "enable_thinking" if own and "enable_thinking" in t else None
    effort_var = "reasoning_effort" if own and found is HARMONY and "reasoning_effort" in t else None
    if overrides:
        return _from_overrides(overrides, switch, effort_var)
    return ThinkingMarkers(base.start, base.end, base.close, base.drop, base.prefill_start, switch, effort_var,
                           base.family, base.source)


def _from_overrides(o: Mapping[str, Any], switch: str | None, effort_var: str | None) -> ThinkingMarkers:
    if not isinstance(o, Mapping):
        raise InvalidRequest(f"thinking_markers must be an object with start and end, got {o!r}",
                             param="thinking_markers")
    for key in o:
        if key not in _OVERRIDE_KEYS:
            raise InvalidRequest(f"thinking_markers has an unknown key {key!r}; known: {', '.join(_OVERRIDE_KEYS)}",
                                 param=f"thinking_markers.{key}")
    for key in ("start", "end"):
        if key not in o:
            raise InvalidRequest(f"thinking_markers.{key} is required", param=f"thinking_markers.{key}")
    drop = o.get("drop", ())
    if isinstance(drop, list):
        drop = tuple(drop)
    return ThinkingMarkers(o["start"], o["end"], close=o.get("close", ""), drop=drop,
                           prefill_start=o.get("prefill_start", False), switch=switch, effort_var=effort_var,
                           family="custom", source="the model's thinking_markers setting")


# -- the splitter ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReasoningPiece:
    """Reasoning text (``reasoning_content``), never empty."""

    text: str


@dataclass(frozen=True)
class AnswerPiece:
    """Answer text (``content``), never empty."""

    text: str


Piece = Union[ReasoningPiece, AnswerPiece]


@dataclass(frozen=True)
class SplitOutput:
    """A whole output split: ``reasoning`` and ``answer`` text; ``unclosed``: thinking never ended."""

    reasoning: str
    answer: str
    unclosed: bool = False


class ReasoningSplitter:
    """Feed the model's output text in pieces; get ``ReasoningPiece`` s and ``AnswerPiece`` s back.

    ``feed(text) -> list[Piece]``: the pieces this text completes (consecutive ones of a kind merged).
    ``finish() -> list[Piece]``: the rest (a held-back partial marker is text after all); then ``unclosed``
    says whether thinking was still open (a model that never closed it: all it wrote is reasoning).
    ``started_inside``: the prompt ended inside thinking (``ThinkingMarkers.inside_after``).
    ``inside``: thinking is open now; ``opened``: it was open at some point; ``closed``: an end marker closed
    it at least once.

    Rules: every start marker opens thinking and every end marker closes it (one inside thinking, or a stray
    end in the answer, is only removed); ``drop`` strings are removed. Whitespace that frames thinking is
    dropped: right after the start marker, right before the end marker, and once right after the end marker
    (the "\\n\\n" before the answer), and whitespace before a start marker at the very beginning. Thinking
    that opens again (harmony's second analysis message) is joined to the earlier reasoning by a blank line.
    Output without markers comes out byte for byte.
    """

    def __init__(self, markers: ThinkingMarkers, started_inside: bool = False) -> None:
        self.markers = markers
        self.inside = self.opened = started_inside
        self.closed = False
        self._kinds = {s: "drop" for s in markers.strings}
        self._kinds[markers.start] = "start"
        self._kinds[markers.end] = "end"
        self._buf = ""  # text not yet decided: it may be the beginning of a marker
        self._ws = ""  # whitespace held until the next text decides whether it framed a marker
        self._lead = "drop" if started_inside else "hold"  # what to do with leading whitespace
        self._sep = ""  # put before the next reasoning text: thinking reopened after some was shown
        self._out: list[Piece] = []
        self._parts: dict[type, list[str]] = {ReasoningPiece: [], AnswerPiece: []}
        self._finished = False

    # -- the public side ------------------------------------------------------------------------------------
    def feed(self, text: str) -> list[Piece]:
        """Split the next piece of output; return the pieces it completes."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += text
        self._scan(final=False)
        return self._take()

    def finish(self) -> list[Piece]:
        """End the output: release what was held back; ``unclosed`` is set from here on."""
        if not self._finished:
            self._finished = True
            self._scan(final=True)
            if not self.inside and self._ws:
                self._put(AnswerPiece, self._ws)
            self._ws = ""
        return self._take()

    @property
    def unclosed(self) -> bool:
        """After ``finish()``: thinking was still open when the output ended."""
        return self._finished and self.inside

    @property
    def holding(self) -> bool:
        """Text is held back: it may be the beginning of a marker."""
        return bool(self._buf)

    @property
    def reasoning(self) -> str:
        return "".join(self._parts[ReasoningPiece])

    @property
    def answer(self) -> str:
        return "".join(self._parts[AnswerPiece])

    def result(self) -> SplitOutput:
        """The output split so far (after ``finish()``: the whole of it)."""
        return SplitOutput(self.reasoning, self.answer, self.unclosed)

    # -- scanning -------------------------------------------------------------------------------------------
    def _scan(self, final: bool) -> None:
        while self._buf:
            i, marker, pending = self._first_marker(self._buf, final)
            if marker is None:
                self._text(self._buf)
                self._buf = ""
                return
            self._text(self._buf[:i])
            if pending:
                self._buf = self._buf[i:]
                return
            self._buf = self._buf[i + len(marker):]
            self._marker(self._kinds[marker])

    def _first_marker(self, buf: str, final: bool) -> tuple[int, str | None, bool]:
        """Leftmost-longest marker in ``buf``: (where, which, pending), pending when ``buf`` ends inside it and
        more text may complete it (never when ``final``); (len, None, False) when there is none."""
        best, best_m, pending = len(buf), None, False
        for m in self._kinds:
            i = buf.find(m)
            if i != -1 and (i < best or i == best and best_m is not None and len(m) > len(best_m)):
                best, best_m, pending = i, m, False
            if final:
                continue
            for k in range(min(len(m) - 1, len(buf)), 0, -1):  # the longest start of m that buf ends with
                if buf.endswith(m[:k]):
                    i = len(buf) - k
                    if i < best or i == best and best_m is not None and len(m) > len(best_m):
                        best, best_m, pending = i, m, True
                    break
        return best, best_m, pending

    def _marker(self, kind: str) -> None:
        if kind == "start" and not self.inside:
            self.inside = self.opened = True
            self._ws, self._lead = "", "drop"
            self._sep = "\n\n" if self._parts[ReasoningPiece] else ""
        elif kind == "end" and self.inside:
            self.inside, self.closed = False, True
            self._ws, self._lead = "", "drop"
        elif kind == "end" and self._lead == "hold":  # a stray end before any answer text
            self._ws, self._lead = "", "drop"

    def _text(self, s: str) -> None:
        if not s:
            return
        if self._lead == "drop":
            s = s.lstrip(WS)
            if not s:
                return
            self._lead = ""
        if self.inside:  # trailing whitespace waits: it is dropped if the end marker follows
            s = self._ws + s
            body = s.rstrip(WS)
            self._ws = s[len(body):]
            if body:
                self._put(ReasoningPiece, self._sep + body)
                self._sep = ""
        elif self._lead == "hold":  # the very beginning: whitespace waits for a possible start marker
            s = self._ws + s
            if not s.strip(WS):
                self._ws = s
                return
            self._ws, self._lead = "", ""
            self._put(AnswerPiece, s)
        else:
            self._put(AnswerPiece, s)

    def _put(self, kind: type, s: str) -> None:
        self._parts[kind].append(s)
        if self._out and type(self._out[-1]) is kind:
            self._out[-1] = kind(self._out[-1].text + s)
        else:
            self._out.append(kind(s))

    def _take(self) -> list[Piece]:
        out, self._out = self._out, []
        return out


def split_reasoning(text: str, markers: ThinkingMarkers, started_inside: bool = False) -> SplitOutput:
    """Split a whole output at once (the streamed pieces joined give the same)."""
    s = ReasoningSplitter(markers, started_inside)
    s.feed(text)
    s.finish()
    return s.result()
