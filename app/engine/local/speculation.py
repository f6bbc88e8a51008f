"""Speculative decoding in the runtime (docs/speculative.md): whether a request speculates, how many guesses keep
the logits exact, the guesses (prompt lookup or a draft model) and their verification."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from app.engine.local import speculative as spec
from app.engine.local.llama import _context_with_sequences, llama_kwargs
from app.engine.local.seqs import LlamaSeq
from app.errors import HearthError, ModelLoadError
from app.protocol.types import GenerateRequest, LoadSettings

log = logging.getLogger("app.engine.local.runtime")


PROBE_ROWS = 8  # tokens ``_probe_exact_rows`` evaluates after the slot's KV


def depth_bucket(kv: int) -> int:
    """The depth bucket of a verification step after ``kv`` tokens of KV: the power of two ≥ kv + ``PROBE_ROWS``
    (at least 256). llama.cpp's kernels change with the KV length: its CPU flash attention gives a lone query
    row a split-KV path (the KV cut across threads, partial sums reduced) once the padded KV reaches 512
    cells, so past 256 tokens of f16 KV a one-token step sums in another order than a row of a verification
    batch (measured here: 2 and 3 rows exact up to ~250 tokens of KV, off by up to 1.1 in a logit beyond;
    docs/speculative.md, "Exactness"). The exact batch size is measured per bucket."""
    return max(256, 1 << (kv + PROBE_ROWS - 1).bit_length())


class SpeculationMixin:
    """``Runtime``'s speculative decoding (it holds ``slots``, ``draft``, ``spec_default``, ``_spec_cap``: depth
    bucket → guesses per step that keep decoding exact)."""

    def _plan_speculation(self, seq: LlamaSeq, request: GenerateRequest, d) -> None:
        """Decide whether ``seq`` speculates: the request's ``speculative`` mode, else the model's default, else
        ``"auto"`` (adaptive prompt lookup, ``speculative.AdaptiveLookup``); only where verification is exact
        (``speculative.ineligible_reason``) and a draft model is loaded for ``"draft"``. A request or model that
        named a mode and does not get it says why in ``info["speculative"]``. ``"auto"`` names itself in the
        metrics (``spec_mode``) only once it guesses."""
        mode = request.speculative if request.speculative is not None else self.spec_default
        mode = mode or "auto"
        if mode == "off":
            return
        why = spec.ineligible_reason(mode, d, request.want_logprobs)
        if why is None and mode == "auto":
            why = spec.auto_reason(d)
        if why is None and mode == "draft" and self.draft is None:
            why = "no draft model is loaded (the model's draft_model setting)"
        if why is not None:
            if mode != "auto":
                seq.info["speculative"] = f"off: {why}"
            return
        seq.spec_mode, seq.spec_d = mode, d
        seq.spec_rng = spec.request_rng(d.seed) if d.temperature > 0 else None
        if mode == "auto":
            seq.lookup = spec.AdaptiveLookup(seq.tokens, spec.SAMPLED_ROW_COST if d.temperature > 0 else 0.0)
            return
        if mode == "prompt_lookup":
            seq.lookup = spec.PromptLookup(seq.tokens)
        seq.metrics.update(spec_mode=mode, spec_drafted=0, spec_accepted=0, spec_steps=0)

    def spec_cap(self, seq: LlamaSeq) -> int:
        """Guesses per step at most: ``HEARTH_SPEC_MAX_DRAFT`` when set (for measurements; may break exactness),
        else the most that keep the target's logits bit for bit those of one-token steps at this depth
        (``_probe_exact_rows`` − 1, measured once per depth bucket, ``depth_bucket``, on ``seq``'s slot), and at
        most ``LOOKUP_DRAFT`` / ``DRAFT_MODEL_DRAFT``."""
        most = spec.DRAFT_MODEL_DRAFT if seq.spec_mode == "draft" else spec.LOOKUP_DRAFT
        env = os.environ.get("HEARTH_SPEC_MAX_DRAFT")
        if env:
            return max(0, int(env))
        bucket = depth_bucket(len(self.slots[seq.slot].tokens))
        cap = self._spec_cap.get(bucket)
        if cap is None:
            rows = self._probe_exact_rows(seq)
            if rows is None:  # no room in this slot's context: no guesses now, probe on a later step
                return 0
            cap = self._spec_cap[bucket] = rows - 1
            log.info("speculative decoding: %d guesses per step keep the logits exact with up to %d tokens of KV",
                     cap, bucket)
        return min(most, cap)

    def _probe_exact_rows(self, seq: LlamaSeq, most: int = PROBE_ROWS) -> int | None:
        """The largest batch of one sequence's tokens (≤ ``most``) whose logits equal, bit for bit, those of
        the same tokens evaluated one per ``llama_decode``. llama.cpp's CPU matmuls switch kernels with the
        number of rows: measured on this build with the bundled Q4_K_M model, 2 and 3 rows are exact, 4 rows
        (the repacked Q4_K GEMM) differ by up to 2.6 in a logit, and without flash attention even 2 rows
        differ. Evaluated after ``seq``'s slot's KV (its pending token and its last prompt tokens, repeated to
        ``most`` tokens), then removed: the slot's KV is as before. None when the slot's context has no room
        for them."""
        import numpy as np

        slot = self.slots[seq.slot]
        kv = len(slot.tokens)
        toks = (([seq.pending] + seq.tokens[-(most - 1):]) * most)[:most]
        if kv + len(toks) > self.settings.n_ctx:
            return None
        lib, mem, sid = self._lib, self.mem, slot.seq_id

        def rows(size: int) -> list:
            lib.llama_memory_seq_rm(mem, sid, kv, -1)
            out = []
            for a in range(0, len(toks), size):
                part = toks[a:a + size]
                last = self._decode([(sid, kv + a, part)], all_logits=True)[0]
                out += [np.ctypeslib.as_array(lib.llama_get_logits_ith(self.ctx, last - len(part) + 1 + i),
                                              shape=(self.n_vocab,)).copy() for i in range(len(part))]
            return out

        try:
            one = rows(1)
            exact = 1
            for size in range(2, len(toks) + 1):
                if not all(np.array_equal(a, b) for a, b in zip(one, rows(size))):
                    break
                exact = size
        finally:
            lib.llama_memory_seq_rm(mem, sid, kv, -1)
        return exact

    def _propose(self, seq: LlamaSeq, n_seqs: int = 1) -> list[int]:
        """``seq``'s guesses for this step (possibly none): within the step's budget, the context, and the
        tokens it may still emit. ``n_seqs``: the sequences in this decode step; ``"auto"`` guesses only when
        ``seq`` decodes alone (docs/speculative.md, "The default"), and probes the exact batch size
        (``spec_cap``) only once its look-up found something."""
        if seq.spec_mode == "auto" and n_seqs > 1:
            return []
        slot = self.slots[seq.slot]
        kv = len(slot.tokens)
        k = min(self.settings.n_ctx - kv - 1, seq.max_new - seq.n_out - 1, self.settings.n_batch - 1)
        if seq.room is not None:
            k = min(k, seq.room - seq.n_out - seq.n_inserted - 1)
        if seq.spec_mode == "draft":
            k = min(k, self.spec_cap(seq))
            return self.draft.propose(seq, slot.tokens + [seq.pending], k) if k > 0 else []
        lookup = seq.lookup
        if len(lookup) < kv:
            lookup.extend(slot.tokens[len(lookup):])
        if len(lookup) == kv:
            lookup.extend([seq.pending])
        if seq.spec_mode == "prompt_lookup":
            k = min(k, self.spec_cap(seq))
            return lookup.propose(k) if k > 0 else []
        known = self._spec_cap.get(depth_bucket(kv), spec.LOOKUP_DRAFT)
        guesses = lookup.guess(min(k, known)) if k > 0 else []
        return guesses[:self.spec_cap(seq)] if guesses else []

    def _row(self, idx: int):
        import numpy as np

        return np.ctypeslib.as_array(self._lib.llama_get_logits_ith(self.ctx, idx), shape=(self.n_vocab,))

    def _verify(self, seq: LlamaSeq, kv: int, drafts: list[int], first: int) -> None:
        """``seq``'s pending token and ``drafts`` were evaluated at positions ``kv`` … (logits from batch index
        ``first``): keep the guesses the target agrees with (``speculative.verify_greedy`` /
        ``verify_sampled``), emit them and the target's own next token through ``Seq.accept`` one by one
        (stopping where the answer ends or thinking is ended by an insert: the rest is discarded), and drop
        the KV of every position past the last emitted token."""
        if not drafts:  # nothing guessed: a plain step (llama.cpp's own sampler chain)
            seq.pending, seq.inserts = None, []
            self._sample(seq, first)
            return
        if seq.t_first is None and seq.t_prefill is not None:
            seq.metrics["prefill_s"] = time.perf_counter() - seq.t_prefill
        d = seq.spec_d
        if d.temperature == 0:
            v = spec.verify_greedy(drafts, lambda i: spec.greedy_token(self._row(first + i), d.logit_bias))
        else:
            q = self.draft.last_q(seq) if seq.spec_mode == "draft" else None
            v = spec.verify_sampled(drafts, lambda i: spec.target_dist(self._row(first + i), d), q, seq.spec_rng)
        if seq.spec_mode == "auto":
            seq.lookup.observe(len(drafts), v.accepted)
            seq.metrics["spec_mode"] = "auto"
        spec.add_step(seq.metrics, len(drafts), v.accepted)
        out = drafts[:v.accepted] + [v.token]
        seq.pending, seq.inserts = None, []
        emitted = 0
        for t in out:
            seq.accept(t, self.is_eog(t), self.llm._model.detokenize([t], special=False), None)
            emitted += 1
            if seq.finish is not None or seq.pending is None or seq.inserts:
                break
        keep = kv + emitted  # the pending token and the guesses before the last emitted token
        slot = self.slots[seq.slot]
        if keep < len(slot.tokens):
            self._lib.llama_memory_seq_rm(self.mem, slot.seq_id, keep, -1)
            del slot.tokens[keep:]


class DraftModel:
    """The draft model of ``speculative: "draft"``: a second (small) GGUF with the target's vocabulary, in a
    context of its own with the same ``n_slots`` sequences (``_context_with_sequences``) and the target's load
    settings. Per slot it remembers the tokens its KV holds and is brought in line with the target's history
    before each proposal (the common prefix kept, the rest evaluated in chunks of ``n_batch``), so accepted
    guesses are never evaluated twice and rejected ones are dropped. Guesses are its argmax for greedy
    requests, and draws from ``speculative.target_dist`` of its logits under the request's own parameters
    (the same top-k/top-p/min-p/temperature) for sampled ones, whose q the verification needs (``last_q``).
    Leviathan et al. 2023 §3 (a smaller model of the same family as the approximation model).

    Raises ``ModelLoadError`` when the file does not load or its vocabulary differs from the target's (size,
    or the text of any of a spread sample of tokens)."""

    SAMPLE = 256  # token ids compared between the two vocabularies (spread over the whole range)

    def __init__(self, path: str, settings: LoadSettings, n_slots: int, target: Any) -> None:
        import llama_cpp

        kwargs = llama_kwargs(settings)
        kwargs["n_ctx"] = settings.n_ctx * n_slots
        try:
            with _context_with_sequences(n_slots):
                self.llm = llama_cpp.Llama(model_path=path, **kwargs)
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"llama.cpp could not load the draft model: {exc}", path=path) from None
        self.path = path
        self._lib = llama_cpp
        self.ctx = self.llm._ctx.ctx
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_batch = settings.n_batch
        self.n_vocab = self.llm.n_vocab()
        self.batch = llama_cpp.llama_batch_init(settings.n_batch, 0, 1)
        self.tokens: list[list[int]] = [[] for _ in range(n_slots)]
        self._q: dict[int, list] = {}  # rid -> proposal distributions of its last guesses (sampled requests)
        self._check_vocab(target)

    def _check_vocab(self, target: Any) -> None:
        mine, theirs = self.llm._model, target.llm._model
        why = ""
        if self.n_vocab != target.n_vocab:
            why = f"{self.n_vocab} tokens against the target's {target.n_vocab}"
        else:
            step = max(1, self.n_vocab // self.SAMPLE)
            for t in list(range(0, self.n_vocab, step)) + [self.n_vocab - 1]:
                a, b = mine.detokenize([t], special=True), theirs.detokenize([t], special=True)
                if a != b:
                    why = f"token {t} is {a!r} in the draft and {b!r} in the target"
                    break
        if why:
            raise ModelLoadError(f"the draft model {os.path.basename(self.path)} does not share the vocabulary "
                                 f"of {os.path.basename(target.model_path)}: {why}", path=self.path)

    def _decode(self, seq_id: int, pos0: int, toks: list[int]) -> None:
        b = self.batch
        for i, t in enumerate(toks):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + i, 1
            b.seq_id[i][0] = seq_id
            b.logits[i] = i == len(toks) - 1
        b.n_tokens = len(toks)
        rc = self._lib.llama_decode(self.ctx, b)
        if rc != 0:
            raise HearthError(f"llama_decode of the draft model failed (error {rc}) on {len(toks)} tokens")

    def _sync(self, slot: int, hist: list[int]) -> None:
        """Make the draft's KV of ``slot`` hold ``hist`` (the common prefix with what it holds is kept)."""
        have = self.tokens[slot]
        n = 0
        limit = min(len(have), len(hist))
        while n < limit and have[n] == hist[n]:
            n += 1
        if n == len(hist) and n:  # the last token must be evaluated again for its logits
            n -= 1
        if n < len(have):
            self._lib.llama_memory_seq_rm(self.mem, slot, n, -1)
            del have[n:]
        for a in range(n, len(hist), self.n_batch):
            part = hist[a:a + self.n_batch]
            self._decode(slot, a, part)
            have.extend(part)

    def propose(self, seq: LlamaSeq, hist: list[int], k: int) -> list[int]:
        """``k`` guesses after ``hist`` (the target's KV tokens and its pending token), one draft decode each."""
        import numpy as np

        d = seq.spec_d
        self._sync(seq.slot, hist)
        out, qs = [], []
        for i in range(k):
            row = np.ctypeslib.as_array(self._lib.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))
            if d.temperature == 0:
                t = spec.greedy_token(row, d.logit_bias)
            else:
                q = spec.target_dist(row, d)
                qs.append(q)
                t = q.sample(seq.spec_rng)
            out.append(t)
            if i < k - 1:
                self._decode(seq.slot, len(hist) + i, [t])
                self.tokens[seq.slot].append(t)
        self._q[seq.rid] = qs
        return out

    def last_q(self, seq: LlamaSeq) -> list:
        """The proposal distributions of ``seq``'s last guesses (sampled requests)."""
        return self._q.pop(seq.rid, [])
