"""While idle, the last answer's turn laid out again in the canonical layout, so that the next turn reuses it
bit for bit (``SettleMixin.idle_step``; docs/prefix-cache.md, "The answer, laid out again while idle")."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from app.engine.local.layout import next_bound, usable
from app.engine.local.llama import trim_heap
from app.engine.local.reuse import MIN_LIVE_REUSE
from app.engine.local.seqs import LlamaSeq
from app.protocol.types import ChatMessage

log = logging.getLogger("app.engine.local.runtime")

SETTLE_MAX_TOKENS = 2048  # tokens of an answer's turn re-laid out while idle, at most (``idle_step``)
SETTLE_PROBE = "\u2026"  # the next user message stand-in whose turn opening ends the settled prefix
SAVE_GRACE_S = 0.3  # a slot is saved to the disk cache once it has been unused this long (seconds): an agent
# or a script sends its next request within milliseconds of the last answer, and that request waited for the
# capture of the KV state (measured: queue 90-150 ms for a 500-token prompt right after another); a person
# reading the answer leaves seconds. The engine saves every slot when it closes, whatever the grace.


class _Settle:
    """An answer's turn being laid out again in its slot while the engine is idle (``Runtime.idle_step``):
    ``tokens``, the next turn's prompt as far as it is known (the chat with the answer and a stand-in user
    message, rendered and tokenized), ``bounds`` its canonical layout, ``pos`` the next position to evaluate,
    ``target`` where it stops (the cut that opens the next user turn), ``started``: the slot was cut back to
    ``pos`` already."""

    __slots__ = ("tokens", "bounds", "pos", "target", "started")

    def __init__(self, tokens: list[int], bounds: list[int], pos: int, target: int) -> None:
        self.tokens, self.bounds, self.pos, self.target, self.started = tokens, bounds, pos, target, False


class SettleMixin:
    """``Runtime``'s idle work (it holds ``_settle_wanted``, ``_settling``, ``settled``, ``_save_wanted``,
    ``prefix_cache``)."""

    def _may_settle(self, seq: LlamaSeq) -> bool:
        """A chat answer that ended normally (not cancelled), without thinking or tools, whose prompt may be
        reused (``prefix_cache`` on, a reusable cache): its next turn will likely begin with it."""
        r = seq.request
        return (seq.finish is not None and r.prompt is None and bool(r.messages) and not r.tools
                and seq.forcer is None and r.prefix_cache and self.reuse_ok and bool(self.turn_breaks))

    def idle_step(self) -> bool:
        """One step of idle work (the scheduler calls it while no request waits or runs): lay the last
        answer's turn out again in the canonical layout, one chunk (at most ``n_batch`` tokens) per call, then
        save the chunks of the slots used since to the disk cache, one slot per call (``_save_one``), each once
        it has been unused ``SAVE_GRACE_S`` (``idle_delay``); once, as early, ``_probe_split``. Returns True while
        more remains; once none does, ``trim_heap``.

        Why: a chat's next request is its previous prompt, the answer, and a new user turn. The answer's KV was
        decoded one token at a time, so it is not what a cold prefill of those tokens gives, and the next turn
        could reuse the previous prompt only up to the break that opens the answer (``app.engine.local.layout``).
        Here the chat with the answer and a stand-in user message (``SETTLE_PROBE``) is rendered and
        tokenized exactly as the next request will be, the slot's KV is cut back to the last common cut, and
        the tokens up to the cut that opens the next user turn are prefilled in chunks of the canonical
        layout: the next turn then reuses the answer's turn too, bit for bit as a cold prefill would compute
        it. A request arriving meanwhile waits for at most the chunk in flight; the slot's tokens and bounds
        are right after every chunk. When the next request does not repeat the answer verbatim the work is
        wasted, never wrong (reuse is by token prefix and layout). The cost: a repeat of the same prompt
        (regenerate) reuses the prompt up to its assistant break instead of all but its last token.
        ``cache_stats`` counts ``settled_answers`` and ``settled_tokens``."""
        try:
            if not self._settling and not self._settle_wanted and self._deferred_work():
                if self.idle_delay() <= 0:
                    if self._probe_wanted():
                        if self._probe_split():
                            return True
                        self._probe_waits = True  # no empty slot: again once a request has left
                    if self._save_wanted:
                        self._save_one()
                return self._deferred_work()
            if not self._settling:
                while self._settle_wanted and not self._settling:
                    sid, seq = self._settle_wanted.popitem()
                    plan = self._settle_plan(seq)
                    if plan is not None:
                        self._settling[sid] = plan
            if self._settling:
                sid = next(iter(self._settling))
                if self._settle_chunk(sid, self._settling[sid]):
                    self._settling.pop(sid, None)
        except Exception:  # noqa: BLE001 - idle work must never end the engine; its slot starts over
            log.exception("laying out the last answer again failed")
            for sid in list(self._settling):
                self._lib.llama_memory_seq_rm(self.mem, sid, -1, -1)
                self.slots[sid].forget()
            self._settling.clear()
        more = bool(self._settling or self._settle_wanted) or self._deferred_work()
        if not more:
            trim_heap()  # the idle work is done: the heap's free pages go back before the next request
        return more

    def _probe_wanted(self) -> bool:
        """``_probe_split`` has not run, and has not found every slot holding KV since a request last left."""
        return not self.split_probed and not self._probe_waits

    def _deferred_work(self) -> bool:
        """Idle work that waits for ``SAVE_GRACE_S``: slots to save, or the split probe."""
        return bool(self._save_wanted) or self._probe_wanted()

    def idle_delay(self) -> float:
        """Seconds until the next idle step is due: 0 while an answer is being laid out or waits to be, else
        until the least recently used slot waiting for a save (or, before ``_probe_split`` ran, the last slot
        used) has been unused ``SAVE_GRACE_S``."""
        if self._settling or self._settle_wanted or not self._deferred_work():
            return 0.0
        used = [self.slots[sid].last_used for sid in self._save_wanted] or [max(s.last_used for s in self.slots)]
        return max(0.0, min(used) + SAVE_GRACE_S - time.perf_counter())

    def _save_one(self, sid: int | None = None) -> None:
        """Save one slot's chunks that the disk cache does not hold yet (``PrefixCache.save_slot``): ``sid``,
        else the least recently used of those waiting."""
        if sid is None:
            sid = min(self._save_wanted, key=lambda i: self.slots[i].last_used)
        self._save_wanted.discard(sid)
        if self.prefix_cache is not None:
            self.prefix_cache.save_slot(self, self.slots[sid])

    def save_slots(self) -> None:
        """Save every slot whose chunks the disk cache may not hold yet (the engine is closing)."""
        while self._save_wanted:
            try:
                self._save_one()
            except Exception:  # noqa: BLE001 - closing must go on; the cache is optional
                log.exception("saving a slot's KV to the prefix cache failed")

    def _settle_plan(self, seq: LlamaSeq) -> _Settle | None:
        """What ``idle_step`` prefills for ``seq``'s answer, or None when nothing would be gained."""
        slot = self.slots[seq.slot]
        messages = tuple(seq.request.messages) + (ChatMessage("assistant", seq.streamer.text),
                                                  ChatMessage("user", SETTLE_PROBE))
        rp = self.render(replace(seq.request, messages=messages))
        tokens = self.tokenize(rp.text, add_bos=rp.add_bos, special=True)
        bounds = self.layout(tokens)
        cuts = [b for b in bounds if b < len(tokens) and tokens[b] in self.turn_breaks]
        if len(cuts) < 2:
            return None
        target = cuts[-2]  # the stand-in's turn opens here; the last cut opens the answer after it
        start = self.live_prefix(slot, tokens, bounds)
        if target - start > SETTLE_MAX_TOKENS:
            target = usable(bounds, start + SETTLE_MAX_TOKENS)
        if start < MIN_LIVE_REUSE or target <= start or target >= self.settings.n_ctx:
            return None
        return _Settle(tokens, bounds, start, target)

    def _settle_chunk(self, sid: int, plan: _Settle) -> bool:
        """Prefill the next chunk of ``plan`` into slot ``sid``; True when it reached its target."""
        slot = self.slots[sid]
        if not plan.started:
            if self._keep_prefix(slot, plan.tokens, plan.pos) != plan.pos:
                return True  # the tail would not go: the slot was emptied, nothing to lay out
            plan.started = True
        start = plan.pos
        end = next_bound(plan.bounds, start)
        self._prefill_chunk(slot, plan.tokens, start, end)
        plan.pos = end
        self.settled["settled_tokens"] += end - start
        if end >= plan.target:
            self.settled["settled_answers"] += 1
            self._save_wanted.add(sid)  # the answer's turn is in whole chunks now: worth a checkpoint
            return True
        return False
