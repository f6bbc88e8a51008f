"""The repository stands alone: code and docs cite only documents that are in it (docs/llama-cpp-notes.md holds
the measured llama.cpp facts the code relies on), never notes kept outside it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("app", "docs", "tests", "benchmarks", "packaging", "README.md", "Makefile", "pyproject.toml")
# Spelled in pieces so that this file does not match itself.
OUTSIDE = ("/work/" + "shared", "../" + "shared/", "LLAMA_CPP_" + "NOTES", "ARCHI" + "TECTURE.md")
DOC_CITATION = re.compile(r"(?<![\w/.])docs/[\w./-]+\.md\b")  # not the tail of a URL


def _files() -> list[Path]:
    out: list[Path] = []
    for name in SCANNED:
        p = REPO / name
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += [f for f in p.rglob("*") if f.is_file() and f.suffix in (".py", ".md", ".sh", ".toml", ".txt")]
    return out


def test_nothing_cites_notes_outside_the_repository() -> None:
    found = [f"{f.relative_to(REPO)}:{n}: {line.strip()}" for f in _files()
             for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if any(s in line for s in OUTSIDE)]
    assert not found, "\n".join(found)


def test_every_cited_doc_exists() -> None:
    missing = sorted({f"{f.relative_to(REPO)} cites {m}" for f in _files()
                      for m in DOC_CITATION.findall(f.read_text(encoding="utf-8", errors="replace"))
                      if not (REPO / m).is_file()})
    assert not missing, "\n".join(missing)
