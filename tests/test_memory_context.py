"""Context assembly with a fake tokenizer (one token per whitespace-separated word): order, budgets,
summary chains, which range needs summarizing, evidence trimming, prefix stability."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.errors import ContextLengthExceeded, InvalidRequest
from app.memory.context import EVIDENCE_HEADER, SUMMARY_HEADER, ContextBuilder, summary_prompt
from app.protocol.types import ChatMessage


def words(text: str) -> int:
    return len(text.split())


@dataclass
class M:
    id: str
    role: str
    content: str


@dataclass
class S:
    id: str
    text: str
    first_message_id: str
    last_message_id: str


def history(turns: int, q_words: int = 10, a_words: int = 20) -> list[M]:
    out = []
    for i in range(turns):
        out.append(M(f"u{i}", "user", " ".join([f"q{i}"] * q_words)))
        out.append(M(f"a{i}", "assistant", " ".join([f"a{i}"] * a_words)))
    return out


def builder(**kw) -> ContextBuilder:
    args = dict(count_tokens=words, n_ctx=400, max_tokens=50, system_prompt="You are terse.", message_overhead=2,
                margin=8, summary_max_tokens=40)
    args.update(kw)
    return ContextBuilder(**args)


def test_order_and_breakdown() -> None:
    b = builder()
    hist = history(2)
    summ = [S("s0", "earlier: the user likes tea", "u0", "a0")]
    plan = b.build(hist, "what now?", summaries=summ, evidence=["[doc1] tea is hot", "[doc2] cups are small"])
    roles = [m.role for m in plan.messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert plan.messages[0].content == f"You are terse.\n\n{SUMMARY_HEADER}\n\nearlier: the user likes tea"
    assert plan.messages[1:3] == [ChatMessage("user", hist[2].content), ChatMessage("assistant", hist[3].content)]
    assert plan.messages[-1].content == (f"{EVIDENCE_HEADER}\n\n[doc1] tea is hot\n\n[doc2] cups are small"
                                         "\n\nwhat now?")
    bd = plan.breakdown
    assert bd["system"] == 3 + 2 and bd["history"] == 10 + 20 + 4 and bd["user"] == 2 + 2
    assert bd["summaries"] == words(SUMMARY_HEADER) + 5 + 2 and bd["evidence"] > 0
    assert plan.prompt_tokens + bd["reserved"] + bd["free"] == bd["n_ctx"] == 400
    assert plan.needs_summary is None and plan.summary_ids == ["s0"] and plan.history_ids == ["u1", "a1"]


def test_first_turn_without_system_prompt() -> None:
    plan = builder(system_prompt="").build([], "hello there")
    assert plan.messages == [ChatMessage("user", "hello there")]
    assert plan.breakdown["system"] == 0 and plan.breakdown["history"] == 0


def test_needs_summary_range_is_oldest_whole_turns_with_room_to_spare() -> None:
    b = builder(n_ctx=800)
    hist = history(26)  # 26 turns × 34 tokens = 884 > the budget
    plan = b.build(hist, "next question")
    first, last = plan.needs_summary
    assert first == "u0" and last.startswith("a")  # turn-aligned, from the oldest
    req = plan.summary_request
    assert req.max_tokens == 40 and req.message_ids[0] == "u0" and req.message_ids[-1] == last
    assert "q0 q0" in req.prompt and "Keep exactly" in req.prompt
    assert plan.prompt_tokens <= b.n_ctx - b.max_tokens  # the fallback plan fits
    assert plan.dropped_ids and plan.dropped_ids[0] == "u0"
    after = b.build(hist, "next question", summaries=[S("s1", " ".join(["x"] * 40), first, last)])
    assert after.needs_summary is None and after.summary_ids == ["s1"] and not after.dropped_ids
    room = b.available - after.breakdown["system"] - after.breakdown["summaries"] - after.breakdown["user"]
    assert after.breakdown["history"] <= room * b.keep_fraction  # room to spare for the next turns
    assert after.history_ids[0] == hist[hist.index(next(m for m in hist if m.id == last)) + 1].id


def test_summaries_roll_up_when_they_pass_their_share() -> None:
    b = builder(summary_fraction=0.3)  # 0.3 × 342 ≈ 102 tokens of summaries at most
    hist = history(16)
    summ = [S("s1", " ".join(["x"] * 40), "u0", "a2"), S("s2", " ".join(["y"] * 40), "u3", "a5")]
    plan = b.build(hist, "q", summaries=summ)
    req = plan.summary_request
    assert plan.needs_summary[0] == "u0" and req.previous == ("s1", "s2")  # one summary will replace both
    assert "x x x" in req.prompt and "y y y" in req.prompt and "q6 q6" in req.prompt
    rolled = [*summ, S("s3", " ".join(["z"] * 40), "u0", plan.needs_summary[1])]
    again = b.build(hist, "q", summaries=rolled)
    assert again.summary_ids == ["s3"]


def test_summary_chain_prefers_farthest_and_ignores_other_branches() -> None:
    hist = history(6)
    summ = [S("a", "A", "u0", "a1"), S("b", "B", "u2", "a3"), S("roll", "R", "u0", "a3"),
            S("other", "O", "u4", "zz-not-on-this-branch"), S("c", "C", "u4", "a4")]
    assert [s.id for s in ContextBuilder.summary_chain(hist, summ)] == ["roll", "c"]
    assert ContextBuilder.summary_chain(hist, [S("gap", "G", "u1", "a2")]) == []  # must start at the first


def test_evidence_is_trimmed_from_the_end_and_never_breaks_the_prefix() -> None:
    b = builder(evidence_fraction=0.1)  # ≈ 34 tokens of evidence
    passages = [" ".join([f"e{i}"] * 12) for i in range(5)]
    plan = b.build(history(1), "q", evidence=passages)
    final = plan.messages[-1].content
    assert plan.evidence_dropped == 3 and "e1 e1" in final and "e2" not in final
    assert plan.messages[-1].content.endswith("q")


def test_prefix_is_stable_from_turn_to_turn() -> None:
    b = builder(n_ctx=2000)
    hist = history(3)
    p1 = b.build(hist, "fourth question")
    hist2 = [*hist, M("u3", "user", "fourth question"), M("a3", "assistant", "fourth answer")]
    p2 = b.build(hist2, "fifth question", evidence="[doc] changes every turn")
    assert p2.messages[: len(p1.messages)] == p1.messages


def test_too_long_user_message_and_bad_budget() -> None:
    with pytest.raises(ContextLengthExceeded) as err:
        builder().build([], " ".join(["w"] * 400))
    assert err.value.n_ctx == 400 and err.value.max_tokens == 50
    with pytest.raises(InvalidRequest):
        builder(max_tokens=400)


def test_history_alternates_and_skips_empty_messages() -> None:
    hist = [M("u0", "user", "one"), M("a0", "assistant", ""), M("u1", "user", "two"),
            M("sys", "system", "ignored"), M("a1", "assistant", "ok")]
    plan = builder(system_prompt="").build(hist, "three")
    assert plan.messages == [ChatMessage("user", "one\n\ntwo"), ChatMessage("assistant", "ok"),
                             ChatMessage("user", "three")]


def test_exact_count_hook_tightens_the_plan() -> None:
    exact = lambda msgs: sum(words(m.content) + 10 for m in msgs)  # a template heavier than assumed  # noqa: E731
    b = builder(count_messages=exact)
    plan = b.build(history(9), "q")
    assert exact(plan.messages) <= b.n_ctx - b.max_tokens


def test_long_message_is_clipped_in_the_summary_prompt() -> None:
    b = builder(n_ctx=200, max_tokens=20, summary_max_tokens=30)
    hist = [M("u0", "user", " ".join(["long"] * 500)), M("a0", "assistant", "ok")]
    plan = b.build(hist, "q")
    assert plan.needs_summary == ("u0", "a0")
    assert words(plan.summary_request.prompt) + 30 <= 200 and "[…]" in plan.summary_request.prompt


def test_summary_prompt_keeps_what_matters() -> None:
    p = summary_prompt([M("1", "user", "My budget is 500 EUR"), M("2", "assistant", "Noted.")], ["Earlier: Oslo"],
                       max_words=50)
    for needle in ("names", "number", "constraints", "decisions", "User: My budget is 500 EUR",
                   "Assistant: Noted.", "Earlier: Oslo", "at most 50 words"):
        assert needle in p
    assert p.endswith("Summary:")


def test_a_passage_too_long_for_the_room_is_skipped_whole_and_a_shorter_one_still_goes_in() -> None:
    b = builder(evidence_fraction=0.1)  # ≈ 34 tokens of evidence
    passages = [" ".join(["big"] * 60), "small passage", " ".join(["mid"] * 8)]
    plan = b.build(history(1), "q", evidence=passages)
    final = plan.messages[-1].content
    assert plan.evidence_kept == (1, 2) and plan.evidence_dropped == 1
    assert "big" not in final and final.index("small passage") < final.index("mid mid")  # rank order kept
    assert final.count(EVIDENCE_HEADER) == 1


@dataclass
class G:
    tokens: int


def word_grounder(n: int):
    """A ``Grounder`` that puts ``n`` evidence words before each user message's text (and records its calls)."""
    calls: list[tuple[ChatMessage, ...]] = []

    def ground(messages):
        calls.append(messages)
        out = tuple(ChatMessage("user", " ".join(["ev"] * n) + " " + m.content) if m.role == "user" else m
                    for m in messages)
        return out, G(n * sum(m.role == "user" for m in messages))
    return ground, calls


def test_a_grounder_puts_evidence_in_every_user_message_and_is_counted() -> None:
    ground, calls = word_grounder(5)
    b = builder()
    plan = b.build(history(2), "q", ground=ground)
    users = [m.content for m in plan.messages if m.role == "user"]
    assert len(users) == 3 and all(u.startswith("ev ev ev ev ev ") for u in users)
    assert plan.breakdown["evidence"] == 15 and plan.grounding.tokens == 15
    plain = b.build(history(2), "q")
    assert calls == [tuple(plain.messages)]  # the grounder sees the plan without evidence, once
    assert plan.breakdown["free"] == plain.breakdown["free"] - 15
    nxt = b.build([*history(2), M("u2", "user", "q"), M("a2", "assistant", "answer")], "q2", ground=ground)
    assert [m.content for m in nxt.messages[:len(plan.messages)]] == [m.content for m in plan.messages]


def test_a_grounded_plan_keeps_room_for_the_messages_own_evidence_before_older_turns() -> None:
    b = builder()
    room = b.evidence_room(0)
    ground, calls = word_grounder(room // 2)
    long = history(40)  # more than the budget: history is summarized / left out
    plain = b.build(long, "q")
    plan = b.build(long, "q", ground=ground)
    assert calls[0] == (ChatMessage("user", "q"),)  # the message grounded alone, to size the room it needs
    assert len(plan.history_ids) < len(plain.history_ids)  # older turns gave way to the evidence
    b_ = plan.breakdown  # the history left room for the message's own evidence (this grounder ignores the budget)
    assert b_["history"] + room // 2 <= b.available - b_["system"] - b_["summaries"] - b_["user"]
