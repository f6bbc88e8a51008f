"""Incremental text assembly for streaming: UTF-8 boundaries and stop strings.

Tokens carry bytes, not characters: an emoji or a CJK character can span several tokens, so bytes are held
until they form complete UTF-8 characters. Stop strings can span tokens, so text that could still be the start
of a stop string is held back until it is known not to be one. The joined stream therefore equals the
non-streamed text byte for byte, and no prefix of a stop string is ever emitted.
"""

from __future__ import annotations

import codecs


class StopStreamer:
    """Feed token bytes; get back text that is safe to emit.

    ``feed(piece) -> (text, stopped)``: ``text`` is new safe text (may be ""), ``stopped`` is True once a
    stop string was found (the stop string and anything after it are dropped). ``flush() -> str``: the
    held-back text at the end of a generation that did not stop on a stop string.
    Matching uses the earliest occurrence of any stop string in the whole answer; ``matched`` is the stop string
    found (the first of ``stop`` among those that begin there), None before one is.
    """

    def __init__(self, stop: tuple[str, ...] | list[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._stop = tuple(s for s in stop if s)
        self._max_stop = max((len(s) for s in self._stop), default=0)
        self._pending = ""  # decoded text not yet emitted
        self._emitted_tail = ""  # last few emitted chars, for stop strings that straddle an emission
        self.text = ""  # everything emitted so far
        self.stopped = False
        self.matched: str | None = None

    def feed(self, piece: bytes) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        try:
            self._pending += self._decoder.decode(piece)
        except UnicodeDecodeError:
            # Invalid UTF-8 from the model: replace rather than crash; never split valid characters.
            self._decoder.reset()
            self._pending += piece.decode("utf-8", errors="replace")
        return self._release()

    def _release(self) -> tuple[str, bool]:
        if not self._stop:
            out, self._pending = self._pending, ""
            self.text += out
            return out, False
        best = -1
        for s in self._stop:
            i = self._pending.find(s)
            if i != -1 and (best == -1 or i < best):
                best, self.matched = i, s
        if best != -1:
            out = self._pending[:best]
            self._pending = ""
            self.text += out
            self.stopped = True
            return out, True
        hold = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self._pending)), 0, -1):
                if self._pending.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        cut = len(self._pending) - hold
        out, self._pending = self._pending[:cut], self._pending[cut:]
        self.text += out
        return out, False

    def flush(self) -> str:
        """Release held-back text (and any incomplete UTF-8 bytes as U+FFFD) at the end of a generation."""
        if self.stopped:
            return ""
        tail = self._decoder.decode(b"", final=False)
        rest = self._pending + tail
        try:
            self._decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            rest += "\ufffd"
        self._pending = ""
        self.text += rest
        return rest
