"""Running self-consistency: ``n`` samples of one request on one engine, judged and voted (issue 14).

``app.engine.policies.consistency`` and ``vote`` hold the pure half; this module schedules the samples:
``run_self_consistency(engine, request, spec)`` returns a ``SelfConsistencyResult``, ``SelfConsistencyRun``
is the same with a ``cancel()``. The decision it holds is the order the samples start in: sample 0 alone,
the rest once its prompt is live in a slot, so they copy it instead of prefilling it.

The reasoning: docs/reasoning.md, 'Running self-consistency'.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from app.engine.policies.consistency import SelfConsistencySpec, sample_seeds
from app.engine.policies.vote import Candidate, Vote, judge, vote
from app.errors import Cancelled, InvalidRequest
from app.protocol.types import Delta, Done, GenerateRequest

if TYPE_CHECKING:  # pragma: no cover
    from app.engine.local.engine import Engine, Generation

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 30.0  # a cancelled sample ends within one scheduler step; this only bounds a wedged engine

OnSample = Callable[[int, Candidate, Done], None]


@dataclass(frozen=True)
class SelfConsistencyResult:
    """The outcome of one self-consistency request.

    - ``candidates`` / ``dones``: per sample, in sample order (index ``i`` ran with seed ``seeds[i]``).
    - ``vote``: ``consistency.vote`` over the candidates; ``chosen_index``: the sample whose text to return
      (``vote.chosen_index``).
    - ``prompt_tokens``: the prompt's length in tokens (once); ``prefilled_tokens``: prompt tokens actually
      evaluated over all samples (``prompt_tokens - cached_tokens`` summed); ``completion_tokens``: sampled
      tokens of all samples, thinking included; ``total_tokens`` = ``completion_tokens + prefilled_tokens``.
    - ``wall_s``: seconds from ``run()`` starting to the last sample's end (``time.perf_counter``), routing
      and judging included.
    """

    candidates: tuple[Candidate, ...]
    vote: Vote
    dones: tuple[Done, ...]
    seeds: tuple[int | None, ...]
    chosen_index: int | None
    prompt_tokens: int
    prefilled_tokens: int
    completion_tokens: int
    wall_s: float

    @property
    def total_tokens(self) -> int:
        return self.completion_tokens + self.prefilled_tokens

    @property
    def chosen(self) -> Done | None:
        """The ``Done`` of the chosen sample (None when there were no samples)."""
        return None if self.chosen_index is None else self.dones[self.chosen_index]

    def to_api(self) -> dict:
        """``hearth.self_consistency`` for a response: ``Vote.to_api()`` plus per-sample ``candidates``
        (answer, accepted, reason, tokens, seconds, finish_reason) and the token totals."""
        cands = [{"answer": c.answer, "accepted": c.accepted if c.verdict is not None else None,
                  "reason": c.verdict.reason if c.verdict is not None else None, "tokens": c.tokens,
                  "seconds": round(c.seconds, 4), "finish_reason": d.finish_reason}
                 for c, d in zip(self.candidates, self.dones)]
        return {**self.vote.to_api(), "candidates": cands, "prompt_tokens": self.prompt_tokens,
                "prefilled_tokens": self.prefilled_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens, "wall_s": round(self.wall_s, 4)}


def check_sampling(request: GenerateRequest, spec: SelfConsistencySpec) -> None:
    """Raise ``InvalidRequest(param="temperature")`` when ``spec.n`` > 1 and the request is greedy
    (temperature 0): its samples would all be one text (docs/reasoning.md, 'Running self-consistency')."""
    if spec.n > 1 and request.decoding.temperature == 0:
        raise InvalidRequest(f"hearth.self_consistency.n is {spec.n} but temperature is 0: greedy samples are all "
                             "the same answer; set temperature > 0 (e.g. 0.7) or n to 1", param="temperature")


class SelfConsistencyRun:
    """One self-consistency request: ``run()`` once, ``cancel()`` from any thread.

    ``engine``: an ``Engine`` (or one built on it, like the tests' ``FakeEngine``); ``request``: the request
    every sample runs (its ``decoding.seed`` is replaced per sample); ``spec``: ``n``, the extractor and the
    verifier (``consistency.parse_self_consistency``); ``seed``: the first sample's seed (None: the
    request's, else random); ``on_sample(index, candidate, done)``: called as each sample finishes, on the
    thread of ``run()``. Raises ``InvalidRequest`` at construction for a greedy request with n > 1 or a bad
    request (``GenerateRequest.validate``)."""

    def __init__(self, engine: "Engine", request: GenerateRequest, spec: SelfConsistencySpec, *,
                 seed: int | None = None, on_sample: OnSample | None = None) -> None:
        request.validate()
        check_sampling(request, spec)
        self.engine, self.request, self.spec, self.on_sample = engine, request, spec, on_sample
        self.seeds = tuple(sample_seeds(spec.n, seed if seed is not None else request.decoding.seed))
        self._lock = threading.Lock()
        self._cancelled = False
        self._started = False
        self._gens: list["Generation"] = []
        self._threads: list[threading.Thread] = []
        self._events: "queue.Queue[tuple[int, str, object]]" = queue.Queue()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Stop every sample (within one scheduler step); ``run()`` then raises ``Cancelled``."""
        with self._lock:
            self._cancelled = True
            gens = list(self._gens)
        for gen in gens:
            gen.cancel()
        self._events.put((-1, "cancel", None))  # wakes run() even before any sample has started

    def run(self) -> SelfConsistencyResult:
        """Run the ``n`` samples (docs/reasoning.md, 'Running self-consistency') and vote. Raises the first
        sample's error, or ``Cancelled`` after ``cancel()``; ``RuntimeError`` when called twice."""
        with self._lock:
            if self._started:
                raise RuntimeError("a SelfConsistencyRun runs once")
            self._started = True
        t0 = time.perf_counter()
        dones: list[Done | None] = [None] * self.spec.n
        cands: list[Candidate | None] = [None] * self.spec.n
        try:
            self._start(0)
            self._collect(dones, cands, until_first_token=True)
            for i in range(1, self.spec.n):
                self._start(i)
            self._collect(dones, cands, until_first_token=False)
        finally:
            self._stop_all()
        return self._result(dones, cands, time.perf_counter() - t0)

    # -- the samples ------------------------------------------------------------------------------------
    def _start(self, i: int) -> None:
        req = replace(self.request, decoding=replace(self.request.decoding, seed=self.seeds[i]))
        with self._lock:
            if self._cancelled:
                raise Cancelled("self-consistency was cancelled")
            gen = self.engine.generate(req)
            self._gens.append(gen)
            t = threading.Thread(target=self._sample, args=(i, gen), name=f"hearth-sc-{i}", daemon=True)
            self._threads.append(t)
        t.start()

    def _sample(self, i: int, gen: "Generation") -> None:
        """One sample's thread: relay its first token and its end (or error) to ``run()``."""
        told = False
        try:
            for ev in gen:
                if isinstance(ev, Done):
                    self._events.put((i, "done", ev))
                elif not told and isinstance(ev, Delta) and (ev.token_ids or ev.text or ev.reasoning):
                    told = True
                    self._events.put((i, "token", None))
        except BaseException as exc:  # crosses to run() as an object (STYLE.md 3)
            self._events.put((i, "error", exc))
        finally:
            gen.close()

    def _collect(self, dones: list, cands: list, *, until_first_token: bool) -> None:
        """Read the samples' events until sample 0 has a token (or ended), or until every sample ended."""
        while not all(d is not None for d in dones):
            i, kind, payload = self._events.get()
            if kind == "cancel" or self._cancelled:
                raise Cancelled("self-consistency was cancelled")
            if kind == "error":
                raise payload  # type: ignore[misc]
            if kind == "done":
                done: Done = payload  # type: ignore[assignment]
                dones[i] = done
                cands[i] = judge(self.spec, done.text, tokens=done.metrics.completion_tokens,
                                 seconds=done.metrics.total_s)
                if self.on_sample is not None:
                    self.on_sample(i, cands[i], done)
            if until_first_token and i == 0:
                return

    def _stop_all(self) -> None:
        """Cancel whatever still runs and wait for every sample's thread (each closes its own stream)."""
        with self._lock:
            gens, threads = list(self._gens), list(self._threads)
        for gen, t in zip(gens, threads):
            if t.is_alive():
                gen.cancel()
        for t in threads:
            t.join(JOIN_TIMEOUT_S)
            if t.is_alive():
                log.warning("self-consistency sample thread %s did not end within %.0f s", t.name, JOIN_TIMEOUT_S)

    def _result(self, dones: list, cands: list, wall_s: float) -> SelfConsistencyResult:
        v = vote(cands)
        prompt = max((d.metrics.prompt_tokens for d in dones), default=0)
        prefilled = sum(max(0, d.metrics.prompt_tokens - d.metrics.cached_tokens) for d in dones)
        completion = sum(d.metrics.completion_tokens for d in dones)
        return SelfConsistencyResult(tuple(cands), v, tuple(dones), self.seeds, v.chosen_index, prompt, prefilled,
                                     completion, wall_s)


def run_self_consistency(engine: "Engine", request: GenerateRequest, spec: SelfConsistencySpec, *,
                         seed: int | None = None, on_sample: OnSample | None = None) -> SelfConsistencyResult:
    """Run ``spec.n`` samples of ``request`` on ``engine``, judge each and vote (``SelfConsistencyRun``).

    Returns a ``SelfConsistencyResult``. Raises ``InvalidRequest`` (param ``temperature``) for a greedy
    request with n > 1, and whatever a sample raised (``QueueFull``, ``ContextLengthExceeded``,
    ``EngineCrashed``, ``Cancelled``) after cancelling the others."""
    return SelfConsistencyRun(engine, request, spec, seed=seed, on_sample=on_sample).run()
