"""Context assembly: what the model is given for one turn, within a token budget.

Stable parts come first (system prompt and summaries, verbatim recent turns, then evidence and the new
message), so the next turn's prompt starts with this turn's and the prefix cache hits.

The reasoning: docs/memory.md, 'app/memory/context.py'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeAlias, runtime_checkable

from app.errors import ContextLengthExceeded, InvalidRequest
from app.protocol.types import ChatMessage

CUT_NOTE = "[result cut: {total:,} bytes, first {shown:,} shown; the whole result is kept in the conversation]"
SUMMARY_HEADER = "Summary of the earlier part of this conversation (the full messages are kept in the history):"
EVIDENCE_HEADER = "Sources that may help with the question below:"


@dataclass(frozen=True)
class EvidenceText:
    """Retrieved passages as prompt text: one ``header`` (the instructions that go with them), then the
    ``passages`` in rank order, each already rendered (``app.assistant.evidence`` renders ``[E:<id>] path``
    headed passages). The builder takes passages in rank order, each one that still fits (a passage too long
    for the room left is skipped whole, and a shorter one after it may still go in), so evidence is trimmed
    passage by passage, never cut inside one."""

    header: str
    passages: tuple[str, ...]

    def block(self, keep: Sequence[int] | None = None) -> str:
        """The header and the passages at indices ``keep`` (all by default), in rank order, ending in a blank
        line; "" for none."""
        chosen = [self.passages[i].strip() for i in (range(len(self.passages)) if keep is None else keep)]
        return self.header.strip() + "\n\n" + "\n\n".join(chosen) + "\n\n" if chosen else ""


EvidenceInput: TypeAlias = "EvidenceText | str | Sequence[str] | None"  # what ``build`` accepts as evidence


class Grounded(Protocol):
    """What a ``Grounder`` reports with the grounded messages (``app.assistant.grounding.Grounding`` fits):
    ``tokens``, the evidence blocks' size in all turns (0 when nothing was given)."""

    tokens: int


Grounder = Callable[[tuple[ChatMessage, ...]], tuple[tuple[ChatMessage, ...], Grounded]]
"""Puts evidence into the user messages of a planned prompt: ``messages -> (grounded messages, Grounded)``; it
must keep the grounded prompt within the builder's budget (``available``) and change user messages only."""


def as_evidence(evidence: EvidenceInput) -> EvidenceText | None:
    """``evidence`` as ``EvidenceText``: plain strings are passages under ``EVIDENCE_HEADER``; empty → None."""
    if isinstance(evidence, EvidenceText):
        return evidence if evidence.passages else None
    if evidence is None:
        return None
    parts = [evidence] if isinstance(evidence, str) else list(evidence)
    parts = [p for p in parts if p and p.strip()]
    return EvidenceText(EVIDENCE_HEADER, tuple(parts)) if parts else None


def with_evidence(block: str, text: str) -> str:
    """The user turn that carries evidence: the evidence ``block`` (``EvidenceText.block``), then ``text``. The
    stored chat (``ContextBuilder``) and stateless HTTP grounding (``app.assistant``) both build it here, so the
    model sees the same prompt text either way."""
    return block + text


class HistoryItem(Protocol):
    """What the builder reads from a stored message (``app.memory.store.Message`` fits). Tool use adds
    ``tool_calls`` (assistant), ``tool_call_id`` and ``name`` (role ``tool``); items without them are plain."""

    id: str
    role: str
    content: str


def cut_note(total_bytes: int, shown_bytes: int) -> str:
    """The note that ends a tool result cut in the prompt: its whole size and the bytes shown (UTF-8)."""
    return CUT_NOTE.format(total=total_bytes, shown=shown_bytes)


def _calls(m: HistoryItem) -> tuple:
    return tuple(getattr(m, "tool_calls", None) or ())


def calls_text(calls: Sequence) -> str:
    """Tool calls as one line each, ``name(arguments)``: how a summary prompt and the estimates see them."""
    return "\n".join(f"{c.name}({c.arguments})" for c in calls)


def _summary_text(m: HistoryItem) -> str:
    """A message as the summarizer reads it: a call's name and arguments, a result named by its tool."""
    if m.role == "tool":
        return f"({getattr(m, 'name', None) or 'a tool'}) {m.content}"
    calls = _calls(m)
    return (m.content + "\n" if m.content else "") + "(calls " + calls_text(calls) + ")" if calls else m.content


def _pair_calls(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Keep only calls answered by a following result and results of a call before them (the engine refuses
    a result without its call, and a template cannot show a call without its result)."""
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    out: list[ChatMessage] = []
    made: set[str] = set()
    for m in messages:
        if m.tool_calls:
            calls = tuple(c for c in m.tool_calls if c.id in answered)
            made.update(c.id for c in calls)
            if not calls and not m.content:
                continue
            m = replace(m, tool_calls=calls)
        elif m.role == "tool" and m.tool_call_id not in made:
            continue
        out.append(m)
    return out


class SummaryItem(Protocol):
    """What the builder reads from a stored summary (``app.memory.store.Summary`` fits)."""

    id: str
    text: str
    first_message_id: str
    last_message_id: str


@runtime_checkable
class Summarizer(Protocol):
    """Writes a summary: ``(prompt, max_tokens) -> text``. ``max_tokens`` caps the answer, in tokens. The lead
    backs it with the loaded chat model (one user message holding ``prompt``, low temperature)."""

    def __call__(self, prompt: str, max_tokens: int) -> str: ...


def _render(messages: Sequence[HistoryItem]) -> str:
    return "\n\n".join(f"{m.role.capitalize()}: {m.content}" for m in messages)


def summary_prompt(messages: Sequence[HistoryItem], previous: Sequence[str] = (),
                   max_words: int | None = None) -> str:
    """The instruction that turns a stretch of conversation (and, for a roll-up, the earlier summaries of what
    came before it) into one summary that keeps what later turns may depend on."""
    parts = [
        "Summarize the conversation below so that it can be continued from your summary alone, without the "
        "original messages.",
        "Keep exactly: names (people, places, files, products), every number, date, quantity and unit, the "
        "user's constraints, requirements and preferences, decisions made and their reasons, and open questions "
        "or promised follow-ups. Leave out greetings, filler and repetition. Do not add anything that is not in "
        "the text. Write in the language of the conversation, in the third person (\"The user ...\", \"The "
        "assistant ...\"), as short sentences or bullet points"
        + (f", in at most {max_words} words." if max_words else "."),
    ]
    if previous:
        parts.append("Summary of what came before (keep its facts in your summary):\n\n" + "\n\n".join(previous))
    parts.append("Conversation:\n\n" + _render(messages))
    parts.append("Summary:")
    return "\n\n".join(parts)


@dataclass(frozen=True)
class SummaryRequest:
    """What to summarize next: the range ``first_message_id`` .. ``last_message_id`` (inclusive), the
    ``prompt`` to send (already clipped to fit the context window) and ``max_tokens`` for the summary.
    ``previous``: ids of the summaries a roll-up replaces (empty for a plain block)."""

    first_message_id: str
    last_message_id: str
    prompt: str
    max_tokens: int
    message_ids: tuple[str, ...]
    previous: tuple[str, ...] = ()


@dataclass
class ContextPlan:
    """One turn's prompt. ``breakdown`` in tokens: system, summaries, history, evidence, user (with an exact
    ``count_messages``: each part's own text, plus ``template``: what the chat template adds, so that the parts
    sum to the exact prompt; without it, estimates that include ``message_overhead`` per message;
    ``tool_definitions``, moved out of ``template`` once the engine has counted them, after the answer),
    reserved (max_tokens), free (n_ctx − prompt − reserved) and n_ctx. ``evidence_kept``: indices (rank order) of
    the passages given to the model; ``evidence_dropped``: how many were left out for room.
    ``content_tokens``: each part's own text, in tokens, without the template's markers."""

    messages: list[ChatMessage]
    breakdown: dict[str, int]
    needs_summary: tuple[str, str] | None = None
    summary_request: SummaryRequest | None = None
    summary_ids: list[str] = field(default_factory=list)
    history_ids: list[str] = field(default_factory=list)
    dropped_ids: list[str] = field(default_factory=list)
    evidence_dropped: int = 0
    evidence_kept: tuple[int, ...] = ()
    content_tokens: dict[str, int] = field(default_factory=dict, repr=False)
    grounding: Grounded | None = None  # what ``build(ground=...)``'s grounder reported (None without one)

    @property
    def prompt_tokens(self) -> int:
        b = self.breakdown
        return (b["system"] + b["summaries"] + b["history"] + b["evidence"] + b["user"] + b.get("tools", 0)
                + b.get("tool_definitions", 0) + b.get("template", 0))


def _exact_breakdown(plan: ContextPlan, exact: int) -> ContextPlan:
    """``plan`` with its breakdown made exact: each part is its own text's token count, ``template`` the rest of
    the ``exact`` templated prompt (role markers, BOS, a transcript's example exchange), so the parts sum to
    ``exact``. Where tokens merge across a part boundary (a rare token or two), the largest part absorbs it."""
    b = plan.breakdown
    b.update(plan.content_tokens)
    parts = ("system", "summaries", "history", "evidence", "user", "tools")
    rest = exact - sum(b[k] for k in parts)
    if rest < 0:
        b[max(parts, key=lambda k: b[k])] += rest
        rest = 0
    b["template"] = rest
    b["free"] = plan.breakdown["n_ctx"] - b["reserved"] - exact
    return plan


def _turns(messages: Sequence[HistoryItem]) -> list[list[HistoryItem]]:
    """Split into turns, each starting at a user message (leading non-user messages join the first turn)."""
    turns: list[list[HistoryItem]] = []
    for m in messages:
        if m.role == "user" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return turns


class ContextBuilder:
    """Assembles prompts within ``n_ctx`` (tokens), leaving ``max_tokens`` for the answer.

    ``count_tokens(text) -> int`` counts tokens with the loaded model's tokenizer (memoized here by text).
    ``summary_max_tokens``: length cap of one summary (default n_ctx // 8, within 32..512).
    ``summary_fraction``: the share of the prompt budget summaries may take before they are rolled up.
    ``keep_fraction``: after summarizing, verbatim history fills at most this share of its budget.
    ``evidence_fraction``: the share of the prompt budget evidence may take.
    ``tool_result_fraction``: the share of the prompt budget one tool result may take (longer ones are cut).
    """

    def __init__(self, count_tokens: Callable[[str], int], n_ctx: int, max_tokens: int, system_prompt: str = "",
                 *, message_overhead: int = 6, margin: int = 16, summary_max_tokens: int | None = None,
                 summary_fraction: float = 0.3, keep_fraction: float = 0.5, evidence_fraction: float = 0.4,
                 tool_result_fraction: float = 0.25,
                 count_messages: Callable[[list[ChatMessage]], int] | None = None) -> None:
        if n_ctx - max_tokens - margin <= 0:
            raise InvalidRequest(f"max_tokens ({max_tokens}) leaves no room for a prompt in n_ctx ({n_ctx})",
                                 param="max_tokens")
        self._count = count_tokens
        self._memo: dict[str, int] = {}
        self.n_ctx, self.max_tokens, self.system_prompt = n_ctx, max_tokens, system_prompt
        self.message_overhead, self.margin = message_overhead, margin
        self.summary_max_tokens = summary_max_tokens or max(32, min(512, n_ctx // 8))
        self.summary_fraction, self.keep_fraction = summary_fraction, keep_fraction
        self.evidence_fraction, self.tool_result_fraction = evidence_fraction, tool_result_fraction
        self.count_messages = count_messages

    # ---- counting ---------------------------------------------------------------------------------------------

    def count(self, text: str) -> int:
        """Tokens in ``text`` (memoized)."""
        n = self._memo.get(text)
        if n is None:
            if len(self._memo) > 20000:
                self._memo.clear()
            n = self._memo[text] = int(self._count(text))
        return n

    def _cost(self, m: HistoryItem, cap: int | None = None) -> int:
        return self.count(self._text(m, cap)) + self.message_overhead

    def _text(self, m: HistoryItem, cap: int | None = None) -> str:
        """What ``m`` puts in the prompt, for counting: a result as cut to ``cap`` (default
        ``tool_result_cap``), a call's text with its calls."""
        if m.role == "tool":
            return self.cut_result(m.content, self.tool_result_cap if cap is None else cap)
        calls = _calls(m)
        return m.content + "\n" + calls_text(calls) if calls else m.content

    @property
    def tool_result_cap(self) -> int:
        """Tokens one tool result may take in the prompt: ``tool_result_fraction`` of the budget (at least 16)."""
        return max(16, int(self.available * self.tool_result_fraction))

    def cut_result(self, text: str, cap: int) -> str:
        """``text`` when it fits ``cap`` tokens; else its longest beginning that fits together with the note
        (``cut_note``). A text over 128 characters per token of ``cap`` is not counted whole: no token is that
        long, and a 1 MB result is never tokenized just to learn it does not fit."""
        if len(text) <= cap * 128 and self.count(text) <= cap:
            return text
        total, keep, best = len(text.encode("utf-8")), min(len(text), cap * 4), None
        for _ in range(64):
            head = text[:keep]
            out = head + "\n" + cut_note(total, len(head.encode("utf-8")))
            n = self.count(out)
            if n > cap and best is None and keep > 0:  # too long: shrink in proportion
                keep = min(keep - 1, int(keep * min(0.95, cap / n)))
                continue
            if n > cap:  # grew past the cap: the last one that fitted
                return best or out
            best = out  # fits: grow in proportion while the room left is worth it (a token can be 8 x's)
            grown = min(len(text) - 1, int(keep * cap / max(1, n) * 0.97))
            if n >= cap * 0.9 or grown <= keep:
                return out
            keep = grown
        return best or cut_note(total, 0)

    @property
    def available(self) -> int:
        """Tokens available to the prompt: n_ctx − max_tokens − margin."""
        return self.n_ctx - self.max_tokens - self.margin

    # ---- pieces -----------------------------------------------------------------------------------------------

    @staticmethod
    def summary_chain(history: Sequence[HistoryItem], summaries: Sequence[SummaryItem]) -> list[SummaryItem]:
        """The stored summaries that cover this branch contiguously from its first message, each reaching as
        far as possible (a roll-up wins over the summaries it folded in; on a tie, the newest)."""
        pos = {m.id: i for i, m in enumerate(history)}
        starting: dict[int, list[tuple[int, int, SummaryItem]]] = {}
        for order, s in enumerate(summaries):
            a, b = pos.get(s.first_message_id), pos.get(s.last_message_id)
            if a is not None and b is not None and a <= b:
                starting.setdefault(a, []).append((b, order, s))
        chain: list[SummaryItem] = []
        i = 0
        while i in starting:
            end, _, best = max(starting[i], key=lambda t: (t[0], t[1]))
            chain.append(best)
            i = end + 1
        return chain

    def _summary_block(self, chain: Sequence[SummaryItem]) -> str:
        return SUMMARY_HEADER + "\n\n" + "\n\n".join(s.text.strip() for s in chain) if chain else ""

    def _system_costs(self, block: str) -> tuple[int, int]:
        system = self.count(self.system_prompt) + self.message_overhead if self.system_prompt else 0
        if not block:
            return system, 0
        return system, self.count(block) + (2 if self.system_prompt else self.message_overhead)

    def fit_evidence(self, evidence: EvidenceInput, room: int) -> tuple[str, int, tuple[int, ...]]:
        """(block, tokens, indices of the passages kept): passages in rank order, each kept when the block
        with it still fits ``room`` tokens; ("", 0, ()) when none fits."""
        ev = as_evidence(evidence)
        if ev is None:
            return "", 0, ()
        kept: list[int] = []
        for i in range(len(ev.passages)):
            if self.count(ev.block([*kept, i])) <= room:
                kept.append(i)
        block = ev.block(kept)
        return block, (self.count(block) if block else 0), tuple(kept)

    def evidence_room(self, prompt_tokens: int, available: int | None = None) -> int:
        """Tokens evidence may take next to a prompt of ``prompt_tokens``: at most ``evidence_fraction`` of the
        prompt budget (``available``, default ``self.available``), and never more than what the prompt leaves."""
        avail = self.available if available is None else available
        return max(0, min(int(avail * self.evidence_fraction), avail - prompt_tokens))

    # ---- the plan ---------------------------------------------------------------------------------------------

    def build(self, history: Sequence[HistoryItem], user_message: str, *, summaries: Sequence[SummaryItem] = (),
              evidence: EvidenceInput = None, tail: Sequence[HistoryItem] = (),
              ground: Grounder | None = None) -> ContextPlan:
        """Plan one turn. ``history``: the branch before the new message, oldest first (``Store.path_to``);
        ``summaries``: stored summaries of the conversation (any branch; those not on this one are ignored);
        ``evidence``: retrieved passages for the message (a string, or a list in rank order); ``ground``: a
        ``Grounder`` instead (evidence in every user message: docs/memory.md, 'app/memory/context.py'); ``tail``:
        what this turn already holds after the message (tool calls and their results, oldest first), always
        given. The plan always fits."""
        if ground is not None:
            return self._grounded(history, user_message, summaries, tail, ground)
        return self._planned(history, user_message, summaries, evidence, tail)

    def _planned(self, history: Sequence[HistoryItem], user_message: str, summaries: Sequence[SummaryItem],
                 evidence: EvidenceInput, tail: Sequence[HistoryItem], reserve: int = 0) -> ContextPlan:
        """The plan (``reserve``: tokens kept free for evidence a grounder adds), checked against
        ``count_messages`` when there is one."""
        plan = self._build(history, user_message, summaries, evidence, tail, self.margin, reserve)
        if self.count_messages is None:
            return plan
        for _ in range(3):
            exact = self.count_messages(plan.messages)
            over = exact - (self.n_ctx - self.max_tokens)
            if over <= 0:
                break
            plan = self._build(history, user_message, summaries, evidence, tail, self.margin + over + 8, reserve)
            exact = self.count_messages(plan.messages)
        return _exact_breakdown(plan, exact)

    def _grounded(self, history: Sequence[HistoryItem], user_message: str, summaries: Sequence[SummaryItem],
                  tail: Sequence[HistoryItem], ground: Grounder) -> ContextPlan:
        """The plan without evidence, its messages grounded by ``ground``. When the history leaves less than
        ``evidence_room`` free, it is planned again with the room kept that the message's own evidence takes
        (the message grounded alone), so that evidence goes before older turns as with ``evidence``; the
        grounder leaves out the oldest turns' evidence first when the prompt still does not fit."""
        plan = self._planned(history, user_message, summaries, None, tail)
        if plan.breakdown["free"] < self.evidence_room(0):
            alone = int(ground((ChatMessage("user", user_message),))[1].tokens)
            if alone:
                plan = self._planned(history, user_message, summaries, None, tail,
                                     min(alone, self.evidence_room(0)))
        messages, grounded = ground(tuple(plan.messages))
        plan.messages, plan.grounding = list(messages), grounded
        plan.content_tokens["evidence"] = plan.breakdown["evidence"] = int(grounded.tokens)
        if self.count_messages is not None:
            return _exact_breakdown(plan, self.count_messages(plan.messages))
        plan.breakdown["free"] = self.n_ctx - self.max_tokens - plan.prompt_tokens
        return plan

    def _build(self, history: Sequence[HistoryItem], user_message: str, summaries: Sequence[SummaryItem],
               evidence: EvidenceInput, tail: Sequence[HistoryItem], margin: int, reserve: int = 0) -> ContextPlan:
        avail = self.n_ctx - self.max_tokens - margin
        history = [m for m in history if m.role in ("user", "assistant", "tool")]
        chain = self.summary_chain(history, summaries)
        pos = {m.id: i for i, m in enumerate(history)}
        covered = pos[chain[-1].last_message_id] + 1 if chain else 0
        uncovered = history[covered:]
        system, _ = self._system_costs("")
        user = self.count(user_message) + self.message_overhead
        cap, tools = self._tail_cost(tail, avail - system - user)
        if system + user + tools > avail:
            raise ContextLengthExceeded(system + user + tools + margin, self.n_ctx, self.max_tokens)
        user += tools  # from here on the tail is as required as the message
        shown = list(chain)
        while shown and sum(self._system_costs(self._summary_block(shown))) + user > avail:
            shown.pop(0)  # summaries from a larger n_ctx: keep the newest that fit; a roll-up is requested
        system, summ = self._system_costs(self._summary_block(shown))
        ev_text = as_evidence(evidence)
        ev_block, ev, ev_kept = self.fit_evidence(ev_text, self.evidence_room(system + summ + user, avail))
        ev_dropped = len(ev_text.passages) - len(ev_kept) if ev_text else 0
        room = avail - system - summ - ev - reserve - user
        request = None
        if sum(self._cost(m) for m in uncovered) > room or len(shown) < len(chain):
            summ_all = self._system_costs(self._summary_block(chain))[1]
            request = self._summary_request(history, chain, uncovered, avail - system - ev - reserve - user, summ_all,
                                            force_rollup=len(shown) < len(chain))
        kept, dropped = self._fit_turns(uncovered, room)
        messages = self._messages(self._summary_block(shown), kept, ev_block, user_message, tail, cap)
        hist = sum(self._cost(m) for m in kept)
        breakdown = {"system": system, "summaries": summ, "history": hist, "evidence": ev, "user": user - tools,
                     "tools": tools, "reserved": self.max_tokens, "n_ctx": self.n_ctx}
        breakdown["free"] = self.n_ctx - self.max_tokens - (system + summ + hist + ev + user)
        content = {"system": self.count(self.system_prompt) if self.system_prompt else 0,
                   "summaries": self.count(self._summary_block(shown)) if shown else 0,
                   "history": sum(self.count(self._text(m)) for m in kept), "evidence": ev,
                   "user": self.count(user_message), "tools": sum(self.count(self._text(m, cap)) for m in tail)}
        return ContextPlan(messages, breakdown,
                           (request.first_message_id, request.last_message_id) if request else None, request,
                           [s.id for s in shown], [m.id for m in kept], [m.id for m in dropped], ev_dropped, ev_kept,
                           content)

    def _tail_cost(self, tail: Sequence[HistoryItem], room: int) -> tuple[int, int]:
        """(cap per result, tokens) of this turn's calls and results: each result cut to ``tool_result_cap``,
        or, when they would not fit ``room`` together, to an equal share of what the calls leave."""
        cap = self.tool_result_cap
        cost = sum(self._cost(m, cap) for m in tail)
        results = [m for m in tail if m.role == "tool"]
        if cost > room and results:
            calls = sum(self._cost(m) for m in tail if m.role != "tool")
            cap = max(16, (room - calls) // len(results) - self.message_overhead)
            cost = sum(self._cost(m, cap) for m in tail)
        return cap, cost

    def _fit_turns(self, uncovered: Sequence[HistoryItem], room: int) -> tuple[list, list]:
        """Leave out the oldest whole turns until the rest fits ``room`` tokens."""
        turns = _turns(uncovered)
        dropped: list[HistoryItem] = []
        while turns and sum(self._cost(m) for t in turns for m in t) > room:
            dropped.extend(turns.pop(0))
        return [m for t in turns for m in t], dropped

    def _messages(self, summary_block: str, kept: Sequence[HistoryItem], evidence_block: str,
                  user_message: str, tail: Sequence[HistoryItem] = (), cap: int | None = None) -> list[ChatMessage]:
        system = "\n\n".join(p for p in (self.system_prompt, summary_block) if p)
        msgs = [ChatMessage("system", system)] if system else []
        for m in kept:
            if m.role == "tool" or _calls(m):
                msgs.append(self._tool_message(m))
            elif m.content:
                msgs.append(ChatMessage(m.role, m.content))
        msgs.append(ChatMessage("user", with_evidence(evidence_block, user_message)))
        msgs.extend(self._tool_message(m, cap) for m in tail)
        out: list[ChatMessage] = []
        for cm in _pair_calls(msgs):
            prev = out[-1] if out else None
            if prev and prev.role == cm.role and cm.role in ("user", "assistant") and not (prev.tool_calls
                                                                                         or cm.tool_calls):
                out[-1] = ChatMessage(cm.role, prev.content + "\n\n" + cm.content)
            else:
                out.append(cm)
        return out

    def _tool_message(self, m: HistoryItem, cap: int | None = None) -> ChatMessage:
        """A call (assistant, with its calls) or a result (cut to ``cap`` tokens) as the engine takes it."""
        if m.role == "tool":
            return ChatMessage("tool", self._text(m, cap), tool_call_id=getattr(m, "tool_call_id", None),
                               name=getattr(m, "name", None))
        return ChatMessage(m.role, m.content, tool_calls=_calls(m))

    # ---- what to summarize --------------------------------------------------------------------------------------

    def _summary_request(self, history: Sequence[HistoryItem], chain: Sequence[SummaryItem],
                         uncovered: Sequence[HistoryItem], room_for_context: int, summ: int,
                         force_rollup: bool = False) -> SummaryRequest:
        """The next block to summarize. ``room_for_context``: tokens left for summaries + verbatim history;
        ``summ``: tokens the current summaries take."""
        smax = self.summary_max_tokens
        rollup = bool(chain) and (force_rollup or summ + smax > self.summary_fraction * self.available)
        previous = [s.text for s in chain] if rollup else []
        header = self.count(SUMMARY_HEADER) + self.message_overhead
        after = smax + header + (0 if rollup else summ)
        target = max(0, int((room_for_context - after) * self.keep_fraction))
        max_words = max(16, int(smax * 0.6))
        capacity = (self.n_ctx - self.margin - smax - self.message_overhead
                    - self.count(summary_prompt([], previous, max_words)))  # tokens left for the messages
        turns = _turns(uncovered)
        block: list[HistoryItem] = []
        rest = sum(self._cost(m) for m in uncovered)
        while turns and (rest > target or not block):
            t_cost = sum(self._cost(m) for m in turns[0])
            if block and sum(self._cost(m) for m in block) + t_cost > capacity:
                break
            block.extend(turns.pop(0))
            rest -= t_cost
        if not block:  # everything after the summaries is already summarized: only a roll-up is left to do
            block = list(uncovered) or [history[-1]]
        first = history[0].id if rollup else block[0].id
        prompt = self._clipped_prompt(block, previous, capacity, max_words)
        return SummaryRequest(first, block[-1].id, prompt, smax, tuple(m.id for m in block),
                              tuple(s.id for s in chain) if rollup else ())

    def _clipped_prompt(self, block: Sequence[HistoryItem], previous: Sequence[str], capacity: int,
                        max_words: int) -> str:
        """The summary prompt, with the longest message texts shortened (marked […]) until the messages fit
        ``capacity`` tokens."""
        items = [_Item(m.id, "tool result" if m.role == "tool" else m.role, _summary_text(m)) for m in block]
        for _ in range(32):
            over = sum(self._cost(m) for m in items) - capacity
            if over <= 0:
                break
            longest = max(items, key=lambda m: self.count(m.content))
            n = self.count(longest.content)
            keep = max(0, int(len(longest.content) * (1 - min(1.0, (over + 4) / max(1, n)))))
            longest.content = longest.content[:keep].rstrip() + " […]"
        return summary_prompt(items, previous, max_words)


@dataclass
class _Item:
    id: str
    role: str
    content: str
