"""``release_zero_pages`` and ``trim_heap`` (app/engine/local/llama.py): the all-zero pages of large anonymous
mappings go back to the kernel, and every byte reads as it did; freed transient blocks leave the C heap (pure: an
mmap and allocations of our own, no model)."""

from __future__ import annotations

import mmap
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.local.llama import release_zero_pages

ROOT = Path(__file__).resolve().parent.parent

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


HEAP_PROBE = """
import sys
from app.engine.local.llama import trim_heap

def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) >> 10

keep, base = [], rss_mib()
for i in range(20):
    block = b"x" * (12 << 20)  # a transient block, as a KV state buffer of the disk cache
    keep.append(b"y" * 200)  # a small long-lived block allocated after it
    del block
if sys.argv[1] == "trim":
    assert trim_heap()
print(rss_mib() - base)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_trim_heap_returns_freed_transient_blocks_to_the_kernel():
    # In a child process, so pytest's own heap is not in the figures. glibc raises its mmap threshold to the
    # first 12 MiB block freed, the next ones come from the heap, and the small block allocated after each keeps
    # the freed space resident; trim_heap gives it back.
    def grown(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", HEAP_PROBE, mode], capture_output=True, text=True,
                             timeout=60, check=True, cwd=ROOT)
        return int(out.stdout.strip())

    assert grown("keep") >= 10
    assert grown("trim") <= 2
