"""``FakeEngine``: the real ``Engine`` handle (FIFO queue, ``QueueFull``, ``Generation``, cancel, stats) with a
scripted answer instead of a model process. For the server's tests, its fuzz run and UI development.

One token per character (token id = code point), so token counts are easy to predict; the rendered prompt is
``role: content`` lines. ``reply(request) -> str`` chooses the answer (default: ``echo: <last message>``, or
``{}`` under a grammar); ``token_delay_s`` paces tokens (cancellation is honoured within one token);
``fail_next`` makes the next generation raise that error before its first token.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from app.engine.engine import Engine, Generation, _metrics
from app.engine.types import Delta, Done, GenerateRequest, LoadSettings
from app.errors import Cancelled, ContextLengthExceeded, EngineCrashed


def default_reply(req: GenerateRequest) -> str:
    if req.decoding.grammar:
        return "{}"
    last = req.prompt if req.prompt is not None else req.messages[-1].content
    seed = f" (seed {req.decoding.seed})" if req.decoding.seed is not None else ""
    return f"echo: {last}{seed}"


class FakeEngine(Engine):
    def __init__(self, model_path: str | Path = "fake-model.gguf", n_ctx: int = 512, *, max_queue: int = 16,
                 token_delay_s: float = 0.0, reply: Optional[Callable[[GenerateRequest], str]] = None) -> None:
        super().__init__(model_path, LoadSettings(n_ctx=n_ctx), max_queue=max_queue)
        self.token_delay_s = token_delay_s
        self.reply = reply or default_reply
        self.fail_next: Optional[BaseException] = None
        self.seen: list[GenerateRequest] = []
        self.started = threading.Event()  # set when a generation begins decoding (tests wait on it)
        self.info = {"template": "fake", "n_ctx": n_ctx, "model": Path(self.model_path).name,
                     "model_path": self.model_path}

    # -- lifecycle: nothing to start ---------------------------------------------------------------------
    def load(self) -> dict:
        self._closed = False
        return self.info

    @property
    def alive(self) -> bool:
        return not self._closed

    def close(self) -> None:
        self._closed = True

    def _call(self, op: str, *args):
        with self._turn(None):
            if op == "tokenize":
                return [ord(c) for c in args[0]]
            if op == "detokenize":
                return "".join(chr(t) for t in args[0])
            if op == "cache_stats":
                return {}
            raise EngineCrashed(f"the fake engine has no {op!r}")

    def token_piece_bytes(self, token: int) -> bytes:
        return chr(token).encode("utf-8")

    @staticmethod
    def local_token_count(text: str) -> int:
        return len(text)

    @staticmethod
    def render_text(req: GenerateRequest) -> str:
        if req.prompt is not None:
            return req.prompt
        return "".join(f"{m.role}: {m.content}\n" for m in req.messages) + "assistant:"

    # -- the stream ----------------------------------------------------------------------------------------
    def _stream(self, gen: Generation, t_call: float, t0: float) -> Iterator[Delta | Done]:
        req = gen.request
        self.seen.append(req)
        text, finish, n_prompt = self._plan(req)
        finished, times = False, []
        try:
            self.started.set()
            for ch in text:
                if self._cancel.wait(self.token_delay_s) if self.token_delay_s else self._cancel.is_set():
                    raise Cancelled("cancelled during decode")
                times.append(time.perf_counter())
                yield Delta(ch, (ord(ch),), self._logprobs(ch, req.want_logprobs))
            finished = True
            m = _metrics(t_call, t0, times, {"prompt_tokens": n_prompt, "completion_tokens": len(text)})
            self._count(m)
            gen.done = Done(finish, m, text, {"template": "fake", "model": Path(self.model_path).name,
                                              "n_ctx": self.settings.n_ctx})
            yield gen.done
        finally:
            if not finished:
                self.stats.cancelled += 1

    def _plan(self, req: GenerateRequest) -> tuple[str, str, int]:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            self.stats.failed += 1
            raise exc
        d, n_ctx = req.decoding, self.settings.n_ctx
        n_prompt = len(self.render_text(req)) + 1  # + BOS
        if n_prompt >= n_ctx or n_prompt + (d.max_tokens or 0) > n_ctx:
            raise ContextLengthExceeded(n_prompt, n_ctx, d.max_tokens or 0)
        text = self.reply(req)
        cuts = [text.find(s) for s in d.stop if s in text]
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
