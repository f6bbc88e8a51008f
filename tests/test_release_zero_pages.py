"""``release_zero_pages`` (app/engine/local/llama.py): the all-zero pages of large anonymous mappings go back to
the kernel, and every byte reads as it did (pure: an mmap of our own, no model)."""

from __future__ import annotations

import mmap
import sys

import pytest

from app.engine.local.llama import release_zero_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/maps: Linux")


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def test_zero_pages_are_released_and_every_byte_keeps_its_value():
    size = 64 << 20
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        m.write(b"\0" * size)  # resident, as llama.cpp's zero-filled KV buffer is
        marks = {0: 7, 3 << 20: 9, size - 1: 5}  # non-zero bytes in three 2 MiB blocks
        for at, value in marks.items():
            m[at] = value
        before = _rss_kib()
        released = release_zero_pages(min_bytes=32 << 20)
        assert released >= size - 4 * (2 << 20)
        assert before - _rss_kib() >= (size >> 10) // 2
        for at, value in marks.items():
            assert m[at] == value
        assert m[1 << 20] == 0 and m.find(b"\x01", 5 << 20, 6 << 20) == -1
        m[10 << 20] = 3  # a released page is writable again
        assert m[10 << 20] == 3
    finally:
        m.close()
