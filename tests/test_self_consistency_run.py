"""Running self-consistency on an engine (app/engine/policies/self_consistency.py): the order the samples
start in, seeds,
the vote over finished samples, token totals, errors and cancellation, on the scripted FakeEngine (the real
Engine and scheduler over a scripted runtime, n_parallel slots)."""

from __future__ import annotations

import threading
import time

import pytest

from app.engine.policies.consistency import parse_self_consistency
from app.engine.policies.self_consistency import SelfConsistencyRun, run_self_consistency
from app.errors import Cancelled, InvalidRequest
from app.protocol.types import DecodingParams, Delta, GenerateRequest
from tests.fakes import FakeEngine

BASE = 100


def request(temperature: float = 0.7, max_tokens: int = 200, seed: int | None = BASE) -> GenerateRequest:
    return GenerateRequest(prompt="Q: 3 + 4?\nA:", decoding=DecodingParams.make(
        temperature=temperature, max_tokens=max_tokens, seed=seed))


def by_seed(answers: dict[int, str], default: str = "no idea"):
    """A reply callable: the text for the request's seed offset (seed - BASE)."""
    def reply(req: GenerateRequest) -> str:
        return answers.get(req.decoding.seed - BASE, default)
    return reply


class Spy:
    """Wraps a Generation to record when its first Delta arrives (at the caller)."""

    def __init__(self, gen, log: list) -> None:
        self.gen, self.log = gen, log

    def __iter__(self):
        first = True
        for ev in self.gen:
            if first and isinstance(ev, Delta):
                first = False
                self.log.append(("first_token", self.gen.request.decoding.seed, time.perf_counter()))
            yield ev

    def cancel(self) -> None:
        self.gen.cancel()

    def close(self) -> None:
        self.gen.close()


class SpyEngine(FakeEngine):
    """A FakeEngine whose generate() records each call and each stream's first token."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.log: list = []

    def generate(self, req):
        self.log.append(("generate", req.decoding.seed, time.perf_counter()))
        return Spy(super().generate(req), self.log)


@pytest.fixture
def engines():
    made = []

    def make(cls=FakeEngine, **kw):
        eng = cls(**kw)
        made.append(eng)
        return eng
    yield make
    for eng in made:
        eng.close()


def live_sample_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hearth-sc-")]


def test_majority_of_five_seeds_vote_and_totals(engines):
    answers = {0: "7 = 3 + 4. The answer is 7.", 1: "The answer is 8.", 2: "So 7.", 3: "It is 8.", 4: "7"}
    eng = engines(reply=by_seed(answers), n_parallel=5)
    spec = parse_self_consistency({"n": 5})
    res = run_self_consistency(eng, request(), spec)
    assert [r.decoding.seed for r in eng.seen] == [100, 101, 102, 103, 104]
    assert [c.answer for c in res.candidates] == ["7", "8", "7", "8", "7"]
    v = res.vote
    assert (v.answer, v.agreement, v.pool, v.tie, v.no_answer) == ("7", 0.6, "all", False, False)
    assert res.chosen_index == 0 and res.chosen.text == answers[0]
    assert res.seeds == (100, 101, 102, 103, 104)
    # One character per token in the fake: completion tokens are the answers' lengths; nothing is cached there.
    assert res.completion_tokens == sum(len(a) for a in answers.values())
    prompt = res.dones[0].metrics.prompt_tokens
    assert res.prompt_tokens == prompt and res.prefilled_tokens == 5 * prompt
    assert res.total_tokens == res.completion_tokens + res.prefilled_tokens
    assert [c.tokens for c in res.candidates] == [len(answers[i]) for i in range(5)]
    assert all(c.seconds == d.metrics.total_s for c, d in zip(res.candidates, res.dones))
    assert res.wall_s >= max(c.seconds for c in res.candidates)


def test_the_others_start_after_sample_zero_has_a_token_and_decode_together(engines):
    eng = engines(cls=SpyEngine, reply=lambda r: "x" * 30 + " 5", n_parallel=4, token_delay_s=0.005)
    res = run_self_consistency(eng, request(), parse_self_consistency({"n": 4}))
    first_0 = next(t for kind, seed, t in eng.log if kind == "first_token" and seed == BASE)
    later = [t for kind, seed, t in eng.log if kind == "generate" and seed != BASE]
    assert len(later) == 3 and min(later) >= first_0
    # Submitted together, the three were admitted in one burst and decoded in one batch with sample 0.
    assert max(d.metrics.batch_peak for d in res.dones) == 4
    assert res.vote.answer == "5" and res.vote.agreement == 1.0


def test_request_seed_is_the_default_and_the_argument_wins(engines):
    eng = engines(n_parallel=2)
    spec = parse_self_consistency({"n": 2})
    run_self_consistency(eng, request(seed=7), spec)
    run_self_consistency(eng, request(seed=7), spec, seed=40)
    assert [r.decoding.seed for r in eng.seen] == [7, 8, 40, 41]
    # No seed anywhere: every sample is seeded at random (None to the engine).
    run_self_consistency(eng, request(seed=None), spec)
    assert [r.decoding.seed for r in eng.seen[4:]] == [None, None]


def test_greedy_with_n_above_one_names_temperature(engines):
    eng = engines()
    with pytest.raises(InvalidRequest) as err:
        run_self_consistency(eng, request(temperature=0.0), parse_self_consistency({"n": 3}))
    assert err.value.param == "temperature"
    assert eng.seen == []
    res = run_self_consistency(eng, request(temperature=0.0), parse_self_consistency({"n": 1}))
    assert len(res.candidates) == 1


def test_more_samples_than_slots_wait_and_finish(engines):
    eng = engines(reply=by_seed({i: f"answer {i % 2}" for i in range(5)}), n_parallel=2)
    res = run_self_consistency(eng, request(), parse_self_consistency({"n": 5}))
    assert [c.answer for c in res.candidates] == ["0", "1", "0", "1", "0"]
    assert res.vote.answer == "0" and max(d.metrics.batch_peak for d in res.dones) == 2


def test_verifier_accepted_pool_and_api_shape(engines):
    eng = engines(reply=by_seed({0: "about 7.5", 1: "8", 2: "8", 3: "7.5"}), n_parallel=4)
    spec = parse_self_consistency({"n": 4, "verifier": {"regex": "[0-9]+"}})
    res = run_self_consistency(eng, request(), spec)
    v = res.vote
    # 7.5 is the tied majority of all answers, but only the integer 8 passes the verifier.
    assert (v.answer, v.pool, v.accepted, v.agreement) == ("8", "accepted", 2, 0.5)
    assert res.chosen_index == 1
    api = res.to_api()
    assert api["answer"] == "8" and api["pool"] == "accepted" and len(api["candidates"]) == 4
    assert api["candidates"][0] == {"answer": "7.5", "accepted": False, "reason": api["candidates"][0]["reason"],
                                    "tokens": 9, "seconds": api["candidates"][0]["seconds"],
                                    "finish_reason": "stop"}
    assert api["candidates"][1]["accepted"] is True
    assert api["total_tokens"] == res.total_tokens


def test_tie_and_no_answer_are_reported(engines):
    eng = engines(reply=by_seed({0: "3", 1: "4", 2: "4", 3: "3"}), n_parallel=4)
    v = run_self_consistency(eng, request(), parse_self_consistency({"n": 4})).vote
    assert (v.answer, v.tie, v.tied, v.agreement) == ("3", True, ("3", "4"), 0.5)
    eng2 = engines(reply=lambda r: "I cannot say.", n_parallel=3)
    res = run_self_consistency(eng2, request(), parse_self_consistency({"n": 3}))
    assert res.vote.no_answer and res.vote.answer is None and res.vote.pool == "none"
    assert res.chosen_index == 0 and res.to_api()["no_answer"] is True


def test_on_sample_runs_on_the_callers_thread_once_per_sample(engines):
    eng = engines(reply=by_seed({0: "1", 1: "2", 2: "1"}), n_parallel=3)
    seen = []
    me = threading.get_ident()
    res = run_self_consistency(eng, request(), parse_self_consistency({"n": 3}),
                               on_sample=lambda i, c, d: seen.append((i, c.answer, d.text, threading.get_ident())))
    assert sorted(s[0] for s in seen) == [0, 1, 2]
    assert all(s[3] == me for s in seen)
    assert {s[0]: s[1] for s in seen} == {i: c.answer for i, c in enumerate(res.candidates)}


def test_an_error_in_one_sample_cancels_the_others(engines):
    def reply(req):
        if req.decoding.seed == BASE + 2:
            raise InvalidRequest("scripted failure", param="prompt")
        return "y" * 400

    eng = engines(reply=reply, n_parallel=4, n_ctx=1024, token_delay_s=0.005)
    with pytest.raises(InvalidRequest, match="scripted failure"):
        run_self_consistency(eng, request(max_tokens=500), parse_self_consistency({"n": 4}))
    # The others were cancelled: none ran out its 400 tokens; every sample but the failed one was cancelled.
    s = eng.stats
    assert (s.requests, s.failed, s.cancelled, s.completed, s.completion_tokens) == (4, 1, 3, 0, 0), s
    assert live_sample_threads() == []
    assert eng.active() == 0 and eng.queue_depth() == 0


def test_an_error_before_the_first_token_starts_no_other_sample(engines):
    eng = engines(n_parallel=4)
    eng.fail_next = InvalidRequest("boom", param="prompt")
    with pytest.raises(InvalidRequest, match="boom"):
        run_self_consistency(eng, request(), parse_self_consistency({"n": 4}))
    assert len(eng.seen) == 1 and live_sample_threads() == []


def test_cancel_from_another_thread_stops_every_sample(engines):
    eng = engines(reply=lambda r: "z" * 400, n_parallel=3, n_ctx=1024, token_delay_s=0.005)
    runner = SelfConsistencyRun(eng, request(max_tokens=500), parse_self_consistency({"n": 3}))
    generating = threading.Event()
    on_token = eng.runtime._send_one

    def send_one(seq):  # the cancel comes once the three samples are decoding (an event, not a delay)
        on_token(seq)
        if len(eng.runtime.seen) == 3 and len(seq.sent) >= 3:
            generating.set()

    eng.runtime._send_one = send_one
    canceller = threading.Thread(target=lambda: generating.wait(30) and runner.cancel())
    canceller.start()
    with pytest.raises(Cancelled):
        runner.run()
    canceller.join(30)
    assert generating.is_set() and runner.cancelled and live_sample_threads() == []
    s = eng.stats  # every sample stopped part-way: none ran out its 400 tokens
    assert (s.requests, s.cancelled, s.completed, s.completion_tokens) == (3, 3, 0, 0), s
    assert eng.active() == 0 and eng.queue_depth() == 0
    with pytest.raises(RuntimeError):
        runner.run()


def test_cancel_before_run_generates_nothing(engines):
    eng = engines(n_parallel=2)
    runner = SelfConsistencyRun(eng, request(), parse_self_consistency({"n": 2}))
    runner.cancel()
    with pytest.raises(Cancelled):
        runner.run()
    assert eng.seen == []
