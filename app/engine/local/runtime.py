"""The code that owns a ``llama_cpp.Llama`` inside the engine process.

``Runtime`` loads one model into a context of ``n_parallel`` sequences (slots) and serves the scheduler
(``app.engine.local.scheduler``): per request, template → tokens → reuse of its slot's live KV prefix (and the
persistent prefix cache) → prefill in canonical chunks → decode with llama.cpp's sampler chain, batched with
the other slots' decodes. Its parts: ``prompting``, ``sampling``, ``reuse``, ``speculation``, ``settle`` (mixins
of ``Runtime``), ``llama`` (load helpers), ``seqs``. Why not ``Llama.eval`` / ``generate``: docs/engine.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from app.engine.chat.reasoning_budget import BudgetForcer
from app.engine.chat.templates import RenderedPrompt, choose_template_name, template_tool_caps, tool_format
from app.engine.chat.thinking import markers_for
from app.engine.local.layout import common_prefix, merged_end
from app.engine.local.llama import (
    GGML_TYPES,
    _context_with_sequences,
    decode_capacity,
    llama_kwargs,
    peak_rss_bytes,
    release_zero_pages,
    route_llama_logs,
)
from app.engine.local.prompting import PromptMixin, _MetaView
from app.engine.local.reuse import MIN_COPY_TOKENS, MIN_LIVE_REUSE, SPLIT_ALIGN, ReuseMixin
from app.engine.local.sampling import SamplingMixin, close_sampler
from app.engine.local.seqs import LlamaSeq, _Slot
from app.engine.local.settle import SETTLE_MAX_TOKENS, SETTLE_PROBE, SettleMixin, _Settle
from app.engine.local.speculation import DraftModel, SpeculationMixin
from app.errors import ContextLengthExceeded, HearthError, InvalidRequest, ModelLoadError
from app.protocol.reasoning import ReasoningBudget
from app.protocol.types import GenerateRequest, LoadSettings

__all__ = [
    "GGML_TYPES", "MIN_COPY_TOKENS", "MIN_LIVE_REUSE", "PREFILL_ANSWER_NOW", "SETTLE_MAX_TOKENS", "SETTLE_PROBE",
    "DraftModel", "LlamaSeq", "Runtime", "llama_kwargs", "peak_rss_bytes", "route_llama_logs",
]

# After a forced end of thinking on a model that thinks only when prefilled (no markers of its own), this line
# starts the answer (s1's "Final Answer:"): measured on the bundled base model, without it the model wrote the
# next "User:" turn at once, so the answer was empty; with it, "Answer: France." (docs/reasoning.md).
PREFILL_ANSWER_NOW = "Answer:"


class Runtime(PromptMixin, SamplingMixin, ReuseMixin, SpeculationMixin, SettleMixin):
    """One loaded model in a context of ``n_slots`` sequences (``settings.n_parallel``; each with its own
    ``settings.n_ctx`` tokens of KV), driven by ``app.engine.local.scheduler.Scheduler`` (``SeqRuntime``)."""

    def __init__(self, model_path: str, settings: LoadSettings, model_meta: dict[str, Any] | None = None,
                 prefix_cache: Any = None) -> None:
        import llama_cpp

        self.settings = settings
        self.model_path = model_path
        self.meta = model_meta or {}
        self.n_slots = settings.n_parallel or 1
        t0 = time.perf_counter()
        route_llama_logs()
        kwargs = llama_kwargs(settings)
        kwargs["n_ctx"] = settings.n_ctx * self.n_slots
        try:
            with _context_with_sequences(self.n_slots):
                self.llm = llama_cpp.Llama(model_path=model_path, **kwargs)
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"llama.cpp could not load the model: {exc}", path=model_path) from None
        self._lib = llama_cpp
        self.ctx = self.llm._ctx.ctx
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.prefill_budget = settings.n_batch
        self.capacity = decode_capacity(settings)
        self.batch = llama_cpp.llama_batch_init(self.capacity, 0, 1)  # tokens per llama_decode at most
        self.slots = [_Slot(i) for i in range(self.n_slots)]
        self._settle_wanted: dict[int, LlamaSeq] = {}  # slot -> the request whose answer may be settled
        self._settling: dict[int, _Settle] = {}
        self.settled = {"settled_answers": 0, "settled_tokens": 0}
        self._save_wanted: set[int] = set()  # slots whose chunks the disk cache may not hold yet (``idle_step``)
        self.split_rows = 0  # batches this big give each token the same bits (``_probe_split``; 0: unknown/no)
        self.split_probed = False
        self._probe_waits = False  # the probe found no empty slot: it waits for a request to leave
        self._warm_up()
        self.released_bytes = release_zero_pages()  # the zero-filled KV is resident only as it is written
        self.load_s = time.perf_counter() - t0
        self.vocab = self.llm._model.vocab
        self._vocab_is_eog = llama_cpp.llama_vocab_is_eog  # looked up once, not per decoded token
        self.n_vocab = self.llm.n_vocab()
        self.prefix_cache = prefix_cache
        md = self.llm.metadata
        arch = md.get("general.architecture", "")
        self.sliding_window = int(md.get(f"{arch}.attention.sliding_window", 0) or 0)
        # With a window-only SWA cache a reused shorter prefix gives wrong logits: reuse nothing then.
        self.reuse_ok = settings.swa_full or not self.sliding_window
        view = _MetaView(self.meta, md, model_path)
        self.chat_template = view.chat_template
        self.architecture = view.architecture
        self.template_name = choose_template_name(view)
        self.bos_text = self._piece(self.llm.token_bos(), special=True) if self.llm.token_bos() >= 0 else ""
        self.eos_text = self._piece(self.llm.token_eos(), special=True) if self.llm.token_eos() >= 0 else ""
        self.markers = markers_for(self.template_name, self.chat_template, self.architecture,
                                   self.meta.get("thinking_markers"))
        self.turn_breaks = self._turn_breaks()
        self.spec_default = self.meta.get("speculative")  # the model's default mode (a request's own wins)
        self._spec_cap: dict[int, int] = {}  # depth bucket -> guesses per step that keep decoding exact
        self.draft = None
        if self.meta.get("draft_model"):
            self.draft = DraftModel(self.meta["draft_model"], settings, self.n_slots, self)
        t1 = time.perf_counter()
        self._probe_at_load()
        self.load_s += time.perf_counter() - t1

    def _warm_up(self) -> None:
        """Evaluate one token and forget it, so that thread start-up and first touches of the weights are
        paid by the load, not by the first request's TTFT."""
        bos = self.llm.token_bos()
        self._decode([(0, 0, [bos if bos >= 0 else 0])])
        self._lib.llama_memory_clear(self.mem, True)

    def ready_info(self) -> dict[str, Any]:
        """What the parent learns once the model is loaded (``load_s`` in seconds)."""
        return {"template": self.template_name, "n_ctx": self.settings.n_ctx, "load_s": self.load_s,
                "n_vocab": self.n_vocab, "n_parallel": self.n_slots, "architecture": self.architecture,
                "thinking": self.markers.to_dict(), **self.tool_info()}

    def tool_info(self) -> dict[str, Any]:
        """``tool_format``: the ``ToolFormat`` name of the model's own template; ``template_tools``: the GGUF
        template renders the tool list itself (``templates.template_tool_caps``)."""
        fmt = tool_format(self.template_name, self.architecture, self.chat_template)
        caps = (template_tool_caps(self.chat_template, self.bos_text, self.eos_text)
                if self.template_name == "gguf" and self.chat_template else None)
        return {"tool_format": fmt.name, "template_tools": bool(caps and caps.tools)}

    def cache_stats(self) -> dict:
        """The disk prefix cache's counters (``PrefixCache.stats``; none without one) and the answers laid
        out again while idle (``settled_answers``, ``settled_tokens``: ``idle_step``), and whether reuse may end
        inside a chunk (``split_rows``: batches of that many tokens give the same bits, 0: no or not measured
        yet; ``split_probed``: ``_probe_split`` ran)."""
        return {**(self.prefix_cache.stats() if self.prefix_cache else {}), **self.settled,
                "split_rows": self.split_rows, "split_probed": self.split_probed}

    def close(self) -> None:
        """Finish the prefix cache's pending writes and close its index (the engine process is ending)."""
        if self.prefix_cache is not None:
            self.save_slots()
            self.prefix_cache.close()

    def begin(self, rid: int, request: GenerateRequest, free: list[int]) -> LlamaSeq:
        """Render and tokenize ``request``, check it fits, pick a slot among ``free`` and make that slot's KV
        hold the longest exactly reusable prefix of the prompt.

        Exactness: llama.cpp's CPU kernels give slightly different numbers for the same row in batches of
        different shapes (measured here: a prompt prefilled as [0,3)+[3,7)+[7] and as [0,8) diverge after a few
        greedy tokens). So every prompt of L tokens is prefilled in one *canonical* layout fixed by absolute
        positions and tokens (``app.engine.local.layout``): cut before each turn break (the template's turn-opening
        control token), every C = n_batch tokens after a cut, and at L−1 when the tail after the last cut is
        long (then the last token alone; a short tail goes in with it), each chunk
        in a ``llama_decode`` of its own (never merged with other slots' tokens). A reused prefix ends where a
        chunk of this layout ends and the reused KV was laid out the same way up to there (a chat's next turn
        reuses its previous prompt up to the turn that now holds the answer), or inside the next chunk where
        batches of 64 tokens give every token the same bits (``layout.usable_within``, ``_probe_split``); so the
        KV and the last token's logits are bit for bit those of a cold prefill. Each position also sits in the same KV
        cell as in the cold prefill (position p in cell p of the slot's stream, head after the last): attention
        sums cells in cell order (``PrefixCache._set_state``; live reuse frees the tail cells and the head goes
        back to the reuse point). The slot's chunks are saved to the disk cache once the engine is idle
        (``idle_step``). ``request.prefix_cache=False`` prefills cold: no live reuse, no disk lookup, no save."""
        rp = self.render(request)
        d = request.decoding if rp.grammar is None else replace(request.decoding, grammar=rp.grammar)
        suffix, budget, inside, thinks = self.thinking_plan(request, rp.text)
        tokens, tools_tokens = self._prompt_tokens(request, rp, suffix, d)
        n_ctx = self.settings.n_ctx
        sampler = self._sampler(d)
        try:
            allowed = request.prefix_cache and self.reuse_ok
            busy = set(range(self.n_slots)) - set(free)
            bounds = self.layout(tokens)
            live = {i: self.live_prefix(self.slots[i], tokens, bounds) if allowed else 0 for i in free}
            slot = max((self.slots[i] for i in free),
                       key=lambda s: (live[s.seq_id], -_runs(busy | {s.seq_id}), -s.last_used))
            self._settle_wanted.pop(slot.seq_id, None)
            self._settling.pop(slot.seq_id, None)  # its KV is consistent after every chunk: reused as it is
            if slot.seq_id in self._save_wanted and _drops_other_chunks(slot.bounds, slot.tokens, tokens):
                self._save_one(slot.seq_id)  # chunks this request would drop, not saved yet (``SAVE_GRACE_S``)
            copied = self._copy_longer(slot, tokens, live[slot.seq_id], bounds) if allowed else None
            if copied is not None:
                live[slot.seq_id] = len(slot.tokens)
            seq = LlamaSeq(rid, request, slot.seq_id, rp.stop)
            seq.tokens, seq.sampler, seq.bounds = tokens, sampler, bounds
            seq.max_new = min(d.max_tokens or n_ctx, n_ctx - len(tokens))  # None: until the context is full
            seq.room = n_ctx - len(tokens)
            if thinks:
                self._force_budget(seq, request, budget, inside, d)
            seq.metrics["prompt_tokens"] = len(tokens)
            seq.info = {"template": rp.name, "model": os.path.basename(self.model_path)}
            self._plan_speculation(seq, request, d)
            if request.tools:
                seq.info.update(tool_format=rp.tool_format, tools_tokens=tools_tokens)
            self._reuse(seq, slot, live[slot.seq_id], request.prefix_cache, disk=copied is None)
            if copied is not None:
                seq.metrics["cache_copied_from_slot"] = copied
                seq.metrics["cache_reuse_reason"] += f" (copied from slot {copied})"
        except BaseException:
            close_sampler(sampler)  # its grammar's C++ state goes now, not when Python's cycle collector runs
            raise
        return seq

    def _prompt_tokens(self, request: GenerateRequest, rp: RenderedPrompt, suffix: str, d) -> tuple[list[int], int]:
        """``request``'s prompt tokens (the rendered text, then the thinking plan's ``suffix``) and the tokens its
        tool definitions take; raises ``InvalidRequest`` for an empty prompt and ``ContextLengthExceeded`` when
        it and ``d.max_tokens`` do not fit the context."""
        tokens = self.tokenize(rp.text, add_bos=rp.add_bos, special=request.prompt is None)
        if suffix:
            tokens += self.tokenize(suffix, add_bos=False, special=True)
        if not tokens:
            raise InvalidRequest("the prompt is empty", param="prompt" if request.prompt is not None else "messages")
        n_ctx = self.settings.n_ctx
        reserve = d.max_tokens or 0
        tools_tokens = self.tools_tokens(request, len(tokens))
        if len(tokens) + reserve > n_ctx or len(tokens) >= n_ctx:
            fits_without = len(tokens) - tools_tokens < n_ctx
            raise ContextLengthExceeded(len(tokens), n_ctx, reserve, tools_tokens,
                                        "tools" if tools_tokens and fits_without else "messages")
        return tokens, tools_tokens

    def _force_budget(self, seq: LlamaSeq, request: GenerateRequest, budget: ReasoningBudget, inside: bool,
                      d) -> None:
        """Give ``seq`` the ``BudgetForcer`` of its thinking ``budget``, fitted to the context."""
        fitted = budget.fit(self.settings.n_ctx, len(seq.tokens), d.max_tokens)
        answer_now = request.reasoning.answer_now if request.reasoning is not None else None
        if answer_now is None and self.markers.prefill_start:
            answer_now = PREFILL_ANSWER_NOW
        seq.forcer = BudgetForcer(self.markers, fitted.tokens, fitted.deadline_s, answer_now,
                                  started_inside=inside, t0=time.perf_counter())
        seq.tokenize_insert = lambda text: self.tokenize(text, add_bos=False, special=True)

    def chunk_tokens(self, seq: LlamaSeq) -> int:
        """Prompt tokens the next ``prefill_step`` of ``seq`` evaluates (0 when only the last one is left: it
        joins the next decode step)."""
        return self._group_end(seq) - seq.pos if seq.pos < len(seq.tokens) - 1 else 0

    def _group_end(self, seq: LlamaSeq) -> int:
        """Where the next ``prefill_step`` of ``seq`` ends: its next canonical chunk, joined by the chunks after
        it that one ubatch (``n_ubatch`` tokens) can evaluate at once with every token's bits unchanged
        (``layout.merged_end``; only once ``_probe_split`` found that batches of ``split_rows`` tokens or more
        give the same bits)."""
        return merged_end(seq.bounds, seq.pos, len(seq.tokens) - 1, self.split_rows, self.settings.n_ubatch,
                          SPLIT_ALIGN)

    def prefill_step(self, seqs: list[LlamaSeq]) -> None:
        """Evaluate the next canonical chunk of each of ``seqs``' prompts (at most ``n_batch`` tokens each),
        each chunk alone in its ``llama_decode``, so the KV is a solo cold prefill's (or several consecutive
        chunks of one prompt in one ``llama_decode``, where that gives each of them the same bits: ``_group_end``;
        a 2,500-token prompt then takes 5 passes over the weights instead of 10). When the layout ends a
        chunk at L (a tail shorter than ``layout.TAIL_SPLIT``), that chunk holds the last token too and the first
        answer token is sampled from it. Otherwise, once the first L−1 tokens are in, the last one becomes
        ``pending``: the next decode step evaluates it with the other sequences' tokens (alone when no other
        sequence decodes: then exactly the solo computation) and samples the first answer token from its logits.

        Short prompts (L−1 < n_batch) of several requests arriving together are evaluated together instead,
        in ``llama_decode`` calls of at most ``n_batch`` tokens (``short_groups``; a burst of chat turns costs
        one weight pass, not one each): their KV is then not a solo prefill's, so their slots do not offer the
        same-prompt reuse afterwards (their prompts are shorter than a chunk, so they hold no reusable chunk
        and are never saved to disk anyway)."""
        C = self.settings.n_batch
        groups = short_groups(sorted((s for s in seqs if s.pos == 0 and 0 < len(s.tokens) - 1 < C),
                                     key=lambda s: s.slot), C)
        short = [s for g in groups for s in g]
        now = time.perf_counter()
        for seq in seqs:
            if seq.t_prefill is None:
                seq.t_prefill = now
        for group in groups:
            self._decode([(s.slot, 0, s.tokens[:-1]) for s in group])
            for s in group:
                self.slots[s.slot].tokens.extend(s.tokens[:-1])
                s.pos = len(s.tokens) - 1
                self._prompt_in(s, merged=True)
        for seq in seqs:
            if seq in short:
                continue
            slot, tokens = self.slots[seq.slot], seq.tokens
            L = len(tokens)
            if seq.pos < L - 1:
                end = self._group_end(seq)
                if end == L:  # a short tail goes in with the last token: sample the first answer token now
                    idx = self._decode([(slot.seq_id, seq.pos, tokens[seq.pos:])])[0]
                    slot.tokens.extend(tokens[seq.pos:])  # no cut recorded at L: no other prompt has one there
                    seq.pos, seq.prompt_done = L, True
                    self._sample(seq, idx)
                    continue
                self._prefill_chunk(slot, tokens, seq.pos, end, seq.bounds)
                seq.pos = end
            if seq.pos == L - 1:
                self._prompt_in(seq)

    def _prompt_in(self, seq: LlamaSeq, merged: bool = False) -> None:
        """``seq``'s first L−1 prompt tokens are in its slot: make the last prompt token pending (the next
        decode step evaluates it). ``merged``: prefilled in one ``llama_decode`` with other prompts, so the
        slot offers no reuse of it."""
        slot, tokens = self.slots[seq.slot], seq.tokens
        if merged:
            slot.bounds = set()  # merged with other prompts' tokens: not a cold prefill's KV
            seq.metrics["prefill_shared"] = True
        seq.pending = tokens[-1]
        seq.prompt_done = True

    def decode_step(self, seqs: list[LlamaSeq]) -> None:
        """Evaluate each sequence's pending token, all in one ``llama_decode`` (in groups of at most
        ``n_batch`` tokens), and sample every next token. A speculating sequence (``_plan_speculation``) feeds
        its guesses after the pending token, with logits at every position, and takes the verified tokens
        (``_verify``)."""
        # In sequence-id order: llama.cpp's split of a batch for a non-unified cache (``split_equal`` with
        # ``sequential``) puts only increasing, consecutive sequence ids in one ubatch, so slots 1, 2, 3, 0 in
        # that order were two graph computations instead of one (measured: a 4-sequence step 44 ms in order,
        # 66–74 ms not). Gaps (slots 0, 2, 3) still split; ``begin`` keeps the busy slots contiguous.
        # A sequence whose thinking was just ended by budget forcing also feeds the inserted end-of-thinking
        # tokens after its pending one (``Seq.inserts``): not sampled, logits only after the last of them; it
        # does not speculate in that step.
        seqs = sorted(seqs, key=lambda s: s.slot)
        n = self.settings.n_batch
        drafts = {s.rid: self._propose(s, len(seqs)) for s in seqs if s.spec_mode and not s.inserts}
        for group in batch_groups(seqs, lambda s: 1 + len(s.inserts) + len(drafts.get(s.rid, ())), n):
            feeds = [[s.pending] + s.inserts + drafts.get(s.rid, []) for s in group]
            every = frozenset(j for j, s in enumerate(group) if s.rid in drafts)
            kv = [len(self.slots[s.slot].tokens) for s in group]
            lasts = self._decode([(s.slot, k, f) for s, k, f in zip(group, kv, feeds)], every=every)
            for s, k, f, idx in zip(group, kv, feeds, lasts):
                self.slots[s.slot].tokens.extend(f)
                if s.rid in drafts:
                    self._verify(s, k, drafts[s.rid], idx - len(f) + 1)
                    continue
                s.pending, s.inserts = None, []
                self._sample(s, idx)

    def end(self, seq: LlamaSeq, clean: bool = True) -> None:
        """``seq`` left its slot. Its KV stays for the next request's reuse unless the step that ended it
        failed (``clean=False``): then the slot is emptied. A finished chat answer is remembered for
        ``idle_step``."""
        close_sampler(seq.sampler)
        seq.sampler = None
        slot = self.slots[seq.slot]
        slot.last_used = time.perf_counter()
        self._probe_waits = False
        self._settling.pop(slot.seq_id, None)
        if not clean:
            self._lib.llama_memory_seq_rm(self.mem, slot.seq_id, -1, -1)
            slot.forget()
        if clean and self._may_settle(seq):
            self._settle_wanted[slot.seq_id] = seq
        else:
            self._settle_wanted.pop(slot.seq_id, None)
        if clean and self.prefix_cache is not None and seq.request.prefix_cache and self.reuse_ok:
            self._save_wanted.add(slot.seq_id)
        seq.metrics["peak_rss_bytes"] = peak_rss_bytes()

    def _decode(self, items: list[tuple[int, int, list[int]]], all_logits: bool = False,
                every: frozenset[int] = frozenset()) -> list[int]:
        """One ``llama_decode`` of ``items`` = ``(seq_id, first position, tokens)``; logits for the last token
        of each item (``all_logits``: for every token; ``every``: indices of the items that get logits at
        every token, a speculative verification). Returns each item's last token's batch index (for
        ``llama_get_logits_ith``; item j's token i is at ``lasts[j] - len(tokens_j) + 1 + i``). Raises
        ``HearthError``."""
        b = self.batch
        total = sum(len(toks) for _sid, _pos, toks in items)
        if total > self.capacity:  # the batch holds ``capacity`` tokens; writing past it is a NULL seq_id
            raise HearthError(f"a decode batch of {total} tokens exceeds its capacity of {self.capacity}")
        n = 0
        lasts = []
        for j, (seq_id, pos0, toks) in enumerate(items):
            last = len(toks) - 1
            each = all_logits or j in every
            for i, t in enumerate(toks):
                b.token[n] = t
                b.pos[n] = pos0 + i
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = seq_id
                b.logits[n] = i == last or each
                n += 1
            lasts.append(n - 1)
        b.n_tokens = n
        rc = self._lib.llama_decode(self.ctx, b)
        if rc != 0:
            why = "no free KV cell" if rc == 1 else "aborted" if rc == 2 else f"error {rc}"
            raise HearthError(f"llama_decode failed ({why}) on a batch of {n} tokens")
        return lasts


def batch_groups(items: list, size: Callable[[Any], int], capacity: int) -> list[list]:
    """``items`` in order, in consecutive groups whose ``size`` (tokens each) sums to at most ``capacity``
    (the batch's ``n_batch``); an item larger than ``capacity`` is a group of its own."""
    groups: list[list] = [[]]
    used = 0
    for item in items:
        n = size(item)
        if groups[-1] and used + n > capacity:
            groups.append([])
            used = 0
        groups[-1].append(item)
        used += n
    return groups if groups[-1] else []


def short_groups(short: list, capacity: int) -> list[list]:
    """Short prompts to prefill together (``batch_groups`` of all but their last token, ``len(s.tokens) - 1``
    tokens each). A prompt that would be alone in its group is left out: it takes the solo path, whose KV is
    a cold prefill's."""
    return [g for g in batch_groups(short, lambda s: len(s.tokens) - 1, capacity) if len(g) >= 2]


def _drops_other_chunks(bounds: set[int], have: list[int], tokens: list[int]) -> bool:
    """Whether a KV holding ``have`` (its chunks ending at ``bounds``) ends a chunk past its common prefix with
    the prompt ``tokens``: a chunk the prompt does not contain, which giving the slot to it would drop. (A next
    step that extends the KV's prompt drops at most the answer and the part of a chunk it computes again.)"""
    n = common_prefix(have, tokens)
    return any(b > n for b in bounds)


def _runs(ids: set[int]) -> int:
    """Runs of consecutive integers in ``ids`` ({0, 1, 3} → 2). llama.cpp splits a decode batch of a
    non-unified cache into one ubatch per run of consecutive sequence ids (``split_equal``, sequential), so a
    new request takes, among slots that reuse nothing, one that keeps the running ones contiguous."""
    return sum(1 for i in ids if i - 1 not in ids)
