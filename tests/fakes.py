"""The shared test doubles: one fake engine, one fake embedder. (Test doubles never live in ``app/``.)

``FakeEngine`` is the real ``app.engine.local.engine.Engine`` (the scheduler, its queue and priorities,
``QueueFull``, ``Generation``, cancel, stats, metrics, the vocabulary lane) over ``FakeRuntime``, a scripted
runtime served through the Engine's public ``runtime=`` seam on threads of this process (no model, no child
process: the suite stays fast). ``n_parallel`` slots (default 1: one request at a time, the rest wait).

The script: one token per character (token id = code point), so token counts are easy to predict; the
rendered prompt is ``role: content`` lines then ``assistant:``, and a generation's prompt is that plus BOS.
``reply(request) -> str`` chooses the answer (default: ``echo: <last message>``, or ``{}`` under a grammar);
``token_delay_s`` paces tokens, one per request per scheduler step (a cancel is honoured within one step);
``fail_next`` makes the next
generation raise that error before its first token; ``crash_next`` makes the next generation end the
runtime's serving thread (``SystemExit``), which the engine reports as a crash (``EngineCrashed``, "its thread
ended") as it would a killed child process; ``seen`` lists the requests generated; ``started`` is
set when a generation begins. A prompt that leaves no room for ``max_tokens`` raises
``ContextLengthExceeded``, as the real runtime does.

Thinking: a request with ``reasoning`` set goes through the real ``Seq.accept`` path with a
``BudgetForcer`` over ``<think>…</think>`` markers (a model that thinks by itself): a scripted reply
``"<think>plan</think>answer"`` streams ``plan`` as ``Delta.reasoning`` and ``answer`` as text; when the budget,
the deadline or ``Generation.stop_thinking`` ends thinking, the rest of the script's thinking is skipped and
its answer follows the inserted close.

``FakeEmbedder`` has the ``Embedder`` interface: ``model_id``, ``name``, ``dim``, ``embed(texts)`` →
float32 ``(n, 3)`` rows ``[1, len(text), 0.5]``, ``count_tokens(texts)`` → whitespace-separated words.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from app.engine.chat.reasoning_budget import BudgetForcer
from app.engine.chat.templates import RenderedPrompt
from app.engine.chat.thinking import THINK
from app.engine.local.engine import Engine
from app.engine.local.scheduler import Seq
from app.errors import ContextLengthExceeded
from app.protocol.types import GenerateRequest, LoadSettings

BOS = 0  # the fake vocabulary's BOS token (no text)


def default_reply(req: GenerateRequest) -> str:
    if req.decoding.grammar:
        return "{}"
    last = req.prompt if req.prompt is not None else req.messages[-1].content
    seed = f" (seed {req.decoding.seed})" if req.decoding.seed is not None else ""
    return f"echo: {last}{seed}"


def render_text(req: GenerateRequest) -> str:
    if req.prompt is not None:
        return req.prompt
    return "".join(f"{m.role}: {m.content}\n" for m in req.messages) + "assistant:"


class _FakeSeq(Seq):
    """A scripted request: the characters still to send and how it ends."""

    chars: list[str]
    script_finish: str = "stop"
    sent: str = ""

    def result(self) -> tuple[str, str, dict, dict]:
        if self.forcer is not None:
            self.finish = self.finish or self.script_finish
            return Seq.result(self)
        self.metrics["completion_tokens"] = len(self.sent)
        self.metrics["batch_peak"] = self.batch_peak
        return self.finish or self.script_finish, self.sent, self.metrics, self.info


class FakeRuntime:
    """A scripted ``app.engine.local.engine.EngineRuntime`` (see the module docstring), driven by the real
    scheduler: ``n_slots`` requests at once, one character per request per step, ``token_delay_s`` per step."""

    def __init__(self, n_ctx: int, model_name: str, token_delay_s: float = 0.0,
                 reply: Optional[Callable[[GenerateRequest], str]] = None, n_parallel: int = 1) -> None:
        self.n_ctx, self.model_name = n_ctx, model_name
        self.token_delay_s = token_delay_s
        self.reply = reply or default_reply
        self.n_slots = n_parallel
        self.prefill_budget = 1  # one prompt per step
        self.fail_next: Optional[BaseException] = None
        self.crash_next = False
        self.seen: list[GenerateRequest] = []
        self.started = threading.Event()

    def ready_info(self) -> dict:
        return {"template": "fake", "n_ctx": self.n_ctx, "load_s": 0.0, "n_vocab": 0x110000}

    # -- main lane (the scheduler's SeqRuntime) -------------------------------------------------------
    def begin(self, rid: int, req: GenerateRequest, free: list[int]) -> Seq:
        if self.crash_next:  # past the scheduler's ``except Exception``: the serving thread ends, as a process dies
            self.crash_next = False
            raise SystemExit("scripted crash")
        self.seen.append(req)
        text, finish, n_prompt = self._plan(req)
        seq = _FakeSeq(rid, req, free[0])
        seq.chars, seq.script_finish = list(text), finish
        seq.metrics["prompt_tokens"] = n_prompt
        seq.info = {"template": "fake", "model": self.model_name}
        if req.reasoning is not None:
            b = req.reasoning.budget.fit(self.n_ctx, n_prompt)
            seq.forcer = BudgetForcer(THINK, b.tokens, b.deadline_s, req.reasoning.answer_now, t0=time.perf_counter())
            seq.tokenize_insert = lambda text: [ord(c) for c in text]
        return seq

    def chunk_tokens(self, seq: Seq) -> int:
        return 1

    def prefill_step(self, seqs: list[Seq]) -> None:
        self.started.set()
        self._pace()
        for seq in seqs:
            seq.prompt_done = True
            self._send_one(seq)

    def decode_step(self, seqs: list[Seq]) -> None:
        self._pace()  # one step for the whole batch
        for seq in seqs:
            seq.pending = None
            self._send_one(seq)

    def _pace(self) -> None:
        if self.token_delay_s:
            time.sleep(self.token_delay_s)

    def _send_one(self, seq) -> None:
        if not seq.chars:
            seq.finish = seq.script_finish
            return
        ch = seq.chars.pop(0)
        seq.sent += ch
        if seq.forcer is not None:
            self._think_one(seq, ch)
            return
        seq.emit("delta", ch, (ord(ch),), self._logprobs(ch, seq.request.want_logprobs))
        if seq.chars:
            seq.pending = ord(ch)
        else:
            seq.finish = seq.script_finish

    @staticmethod
    def _think_one(seq, ch: str) -> None:
        seq.accept(ord(ch), False, ch.encode("utf-8"))
        if seq.inserts:  # thinking was ended for it: skip the script's thinking, its answer follows
            rest = "".join(seq.chars)
            cut = rest.find("</think>")
            if cut != -1:
                seq.chars = list(rest[cut + len("</think>"):])
            seq.inserts = []
        if not seq.chars and seq.finish is None:
            seq.pending = None
            seq.finish = seq.script_finish

    def end(self, seq: Seq, clean: bool) -> None:
        pass

    def close(self) -> None:
        pass

    def cache_stats(self) -> dict:
        return {}

    def _plan(self, req: GenerateRequest) -> tuple[str, str, int]:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        d, n_ctx = req.decoding, self.n_ctx
        n_prompt = len(render_text(req)) + 1  # + BOS
        if n_prompt >= n_ctx or n_prompt + (d.max_tokens or 0) > n_ctx:
            raise ContextLengthExceeded(n_prompt, n_ctx, d.max_tokens or 0)
        text = self.reply(req)
        cuts = [text.find(s) for s in d.stop if s in text]
        if req.reasoning is None:  # with thinking the real Seq path applies stop strings to the answer only
            text = text[:min(cuts)] if cuts else text
        limit = min(d.max_tokens or n_ctx, n_ctx - n_prompt)
        if len(text) > limit:
            return text[:limit], "length", n_prompt
        return text, "stop", n_prompt  # a stop string, or the end of the scripted answer (end of turn)

    @staticmethod
    def _logprobs(ch: str, want: int) -> tuple:
        if not want:
            return ()
        alts = [(ord(ch), -0.25), (ord("?"), -1.5), (ord("!"), -2.5)][:max(1, want)]
        return ((ord(ch), -0.25, alts),)

    # -- side lane (vocabulary) -----------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool, special: bool) -> list[int]:
        return ([BOS] if add_bos else []) + [ord(c) for c in text]

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(chr(t) for t in tokens if t != BOS)

    def piece_bytes(self, token: int) -> bytes:
        return b"" if token == BOS else chr(token).encode("utf-8")

    def render(self, req: GenerateRequest) -> RenderedPrompt:
        return RenderedPrompt(render_text(req), "fake", req.add_bos if req.prompt is not None else True)


class FakeEngine(Engine):
    """The real ``Engine`` over a ``FakeRuntime`` (loaded at once: threads, no model). ``fail_next``,
    ``seen`` and ``started`` are the runtime's (``runtime`` holds the rest of the script)."""

    def __init__(self, model_path: str | Path = "fake-model.gguf", n_ctx: int = 512, *, max_queue: int = 16,
                 token_delay_s: float = 0.0, reply: Optional[Callable[[GenerateRequest], str]] = None,
                 n_parallel: int = 1) -> None:
        self.runtime = FakeRuntime(n_ctx, Path(model_path).name, token_delay_s, reply, n_parallel)
        super().__init__(model_path, LoadSettings(n_ctx=n_ctx), max_queue=max_queue, runtime=lambda: self.runtime)
        self.load()

    @property
    def fail_next(self) -> Optional[BaseException]:
        return self.runtime.fail_next

    @fail_next.setter
    def fail_next(self, exc: Optional[BaseException]) -> None:
        self.runtime.fail_next = exc

    @property
    def seen(self) -> list[GenerateRequest]:
        return self.runtime.seen

    @property
    def started(self) -> threading.Event:
        return self.runtime.started


class FakeEmbedder:
    """``app.retrieval.embedder.Embedder``'s interface without a model (see the module docstring)."""

    dim = 3

    def __init__(self, model_id: str = "mini@0123456789ab") -> None:
        self.model_id = model_id
        self.name = f"fake:{model_id}"

    def embed(self, texts: list[str], progress=None) -> np.ndarray:
        """``progress(texts_done, tokens_done)`` once at the end, tokens counted as words + 2 (like
        ``Embedder.embed``'s special tokens)."""
        if progress is not None and texts:
            progress(len(texts), sum(len(t.split()) + 2 for t in texts))
        return np.array([[1.0, float(len(t)), 0.5] for t in texts], dtype=np.float32).reshape(-1, self.dim)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(t.split()) for t in texts]

    def close(self) -> None:
        pass
