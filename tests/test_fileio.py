"""The one atomic file write (app.fileio): the target is replaced whole or not at all, and no temp file stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.fileio import atomic_path, atomic_write_bytes, atomic_write_text


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """An empty folder of its own (``tmp_path`` also holds the autouse ``HEARTH_HOME``)."""
    d = tmp_path / "files"
    d.mkdir()
    return d


def test_write_replaces_whole_and_leaves_no_temp(folder: Path) -> None:
    target = folder / "a.json"
    atomic_write_text(target, "old\n")
    atomic_write_bytes(target, b"new\r\n")
    assert target.read_bytes() == b"new\r\n"
    assert sorted(p.name for p in folder.iterdir()) == ["a.json"]


def test_failed_write_keeps_the_old_file(folder: Path) -> None:
    target = folder / "a.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer died")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in folder.iterdir()) == ["a.bin"]


def test_missing_folder_is_an_oserror(folder: Path) -> None:
    with pytest.raises(OSError):
        atomic_write_bytes(folder / "no-such-folder" / "a", b"x")


def test_fixed_temp_name_overwrites_a_stale_partial(folder: Path) -> None:
    target = folder / "model.gguf"
    (folder / "model.gguf.partial").write_bytes(b"left by a killed run")
    with atomic_path(target, temp_name="model.gguf.partial") as tmp:
        assert tmp == folder / "model.gguf.partial"
        tmp.write_bytes(b"GGUF")
    assert target.read_bytes() == b"GGUF"
    assert sorted(p.name for p in folder.iterdir()) == ["model.gguf"]


def test_prefix_names_the_temp_file(folder: Path) -> None:
    with atomic_path(folder / "settings.json", prefix=".settings-") as tmp:
        assert tmp.name.startswith(".settings-") and tmp.name.endswith(".tmp") and tmp.exists()
        tmp.write_text("{}")
    assert (folder / "settings.json").read_text() == "{}"
