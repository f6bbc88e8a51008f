"""Turn a file's bytes into text pages, or fail with a reason a person can act on.

Every failure is an ``IngestError(path, reason)`` with a short reason ("encrypted", "no text layer (scanned?)",
"not text (binary content)", ...); the caller records it and goes on with the batch. A PDF is "encrypted" when
it cannot be opened with an empty user password (many PDFs are encrypted only to set permissions and open
that way); it has "no text layer (scanned?)" when no page yields any text. Pages without a text layer are read
by OCR when Tesseract is installed (``app.retrieval.ocr``); otherwise the reason names how to install it. A
PDF where only some pages have no text is indexed, with a note naming how many (and which were read by OCR).

The reasoning: docs/retrieval.md, 'app/retrieval/extract.py'.
"""

from __future__ import annotations

import codecs
import io
import logging
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from app.errors import IngestError
from app.retrieval.chunking import Heading, find_headings, format_of
from app.retrieval.ocr import OcrOutcome, read_pages

log = logging.getLogger(__name__)

PAGE_SEPARATOR = "\n\n"
MAX_FILE_BYTES = 256 * 1024 * 1024  # larger files are refused (bytes)

TEXT_SUFFIXES = frozenset(
    ".txt .text .md .markdown .rst .adoc .org .tex .log .csv .tsv .json .jsonl .yaml .yml .toml .ini .cfg .conf "
    ".xml .py .pyi .pyx .ipynb .js .mjs .ts .tsx .jsx .c .h .cc .cpp .cxx .hpp .hh .m .mm .java .kt .kts .scala "
    ".go .rs .rb .php .pl .pm .lua .r .jl .swift .cs .fs .vb .sh .bash .zsh .fish .ps1 .bat .cmd .sql .css .scss "
    ".less .vue .svelte .dart .ex .exs .erl .hs .ml .mli .clj .el .lisp .scm .nim .zig .v .sv .vhd .cmake .mk "
    ".gradle .proto .graphql .tf .dockerfile .gitignore .properties .env .srt .vtt".split()
)
HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
PDF_SUFFIXES = frozenset({".pdf"})
DOCX_SUFFIXES = frozenset({".docx"})
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES | DOCX_SUFFIXES
# Well-known text files that have no suffix.
TEXT_NAMES = frozenset({"readme", "license", "licence", "copying", "authors", "changelog", "makefile",
                        "dockerfile", "notice", "todo", "news", "install", "contributing"})


REASON_ENCRYPTED = "encrypted"
REASON_NO_TEXT_LAYER = "no text layer (scanned?)"


@dataclass(frozen=True)
class Extracted:
    """A document's text. ``kind``: text, html, pdf or docx. ``pages``: the text of each page (one page for
    unpaged formats). ``paged``: whether page numbers mean something (PDF). ``headings``: heading spans in
    ``text`` (document offsets). ``fmt``: the chunking rules (``markdown``, ``rst``, ``python``, ``code``,
    ``pdf``, ``text``). ``note``: something a person should know about a file that was read (e.g. pages
    without a text layer, pages read by OCR), else None. ``ocr_pages``: the 1-based pages whose text came
    from OCR."""

    kind: str
    pages: list[str]
    paged: bool = False
    headings: tuple[Heading, ...] = ()
    fmt: str = "text"
    note: str | None = None
    ocr_pages: tuple[int, ...] = ()

    @property
    def text(self) -> str:
        return PAGE_SEPARATOR.join(self.pages)

    @property
    def page_starts(self) -> list[int]:
        """Offset in ``text`` where each page starts."""
        out, pos = [], 0
        for page in self.pages:
            out.append(pos)
            pos += len(page) + len(PAGE_SEPARATOR)
        return out


def kind_of(path: Path) -> str | None:
    """The extractor for a file name (``text``, ``html``, ``pdf``, ``docx``), or None when unsupported."""
    suffix = path.suffix.lower()
    if suffix in PDF_SUFFIXES:
        return "pdf"
    if suffix in DOCX_SUFFIXES:
        return "docx"
    if suffix in HTML_SUFFIXES:
        return "html"
    if suffix in TEXT_SUFFIXES or (not suffix and path.name.lower() in TEXT_NAMES):
        return "text"
    return None


def extract(path: Path, data: bytes) -> Extracted:
    """Extract the text of ``data`` (the bytes of the file at ``path``). Raises ``IngestError``."""
    kind = kind_of(path)
    if kind is None:
        raise IngestError(str(path), f"unsupported type ({path.suffix.lower() or 'no extension'})")
    if not data:
        raise IngestError(str(path), "empty file (0 bytes)")
    if kind == "pdf":
        return _extract_pdf(path, data)
    if kind == "docx":
        return _extract_docx(path, data)
    text = decode_text(path, data)
    if kind == "html":
        text, headings = html_to_text_and_headings(text)
        fmt = "text"
    else:
        fmt = format_of(path.suffix)
        headings = find_headings(text, fmt)
    if not text.strip():
        raise IngestError(str(path), "no text (only whitespace)")
    return Extracted(kind, [text], headings=tuple(headings), fmt=fmt)


# ---------------------------------------------------------------------------------------------- text encodings

_BOMS = (  # longest first: the UTF-32 LE BOM starts with the UTF-16 LE one
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
_MAX_CONTROL_RATIO = 0.01


def decode_text(path: Path, data: bytes) -> str:
    """Decode text bytes (see the module docstring for the order). Raises ``IngestError`` ("not text")."""
    text = _decode(data)
    if text is None or _looks_binary(text):
        raise IngestError(str(path), "not text (binary content)")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _decode(data: bytes) -> str | None:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data[len(bom):].decode(encoding)
            except UnicodeDecodeError:
                return None
    bomless16 = _bomless_utf16(data)  # before UTF-8: ASCII in UTF-16 is valid UTF-8 full of NULs
    if bomless16:
        try:
            return data.decode(bomless16)
        except UnicodeDecodeError:
            return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    if b"\x00" in data:
        return None
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:  # 0x81, 0x8d, 0x8f, 0x90, 0x9d are undefined in cp1252
        return None


def _bomless_utf16(data: bytes) -> str | None:
    """``utf-16-le``/``-be`` when the sample looks like UTF-16 text of a Latin script without a BOM (nearly
    every odd/even byte is NUL), else None."""
    sample = data[:4096]
    if len(sample) < 4 or len(sample) % 2:
        return None
    even_nul = sample[0::2].count(0) / (len(sample) // 2)
    odd_nul = sample[1::2].count(0) / (len(sample) // 2)
    if odd_nul > 0.9 and even_nul < 0.1:
        return "utf-16-le"
    if even_nul > 0.9 and odd_nul < 0.1:
        return "utf-16-be"
    return None


def _looks_binary(text: str) -> bool:
    if "\x00" in text:
        return True
    sample = text[:65536]
    return bool(sample) and len(_CONTROL.findall(sample)) / len(sample) > _MAX_CONTROL_RATIO


# ------------------------------------------------------------------------------------------------------ PDF

def _extract_pdf(path: Path, data: bytes) -> Extracted:
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError, PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not _pdf_open_with_empty_password(reader):
            raise IngestError(str(path), REASON_ENCRYPTED)
        pages = [_page_text(p) for p in reader.pages]
    except IngestError:
        raise
    except FileNotDecryptedError as exc:
        raise IngestError(str(path), REASON_ENCRYPTED) from exc
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise IngestError(str(path), f"corrupt PDF ({type(exc).__name__}: {exc})") from exc
    except Exception as exc:  # noqa: BLE001  (pypdf raises many kinds on malformed files; one bad file only)
        if type(exc).__module__.startswith("pypdf"):
            raise IngestError(str(path), f"corrupt PDF ({type(exc).__name__}: {exc})") from exc
        raise
    blank = [i for i, p in enumerate(pages) if not p.strip()]
    ocr = read_pages(reader.pages, blank) if blank else OcrOutcome()
    for i, text in ocr.texts.items():
        pages[i] = text
    empty = len(blank) - len(ocr.texts)
    if empty == len(pages):
        raise IngestError(str(path), "; ".join(filter(None, (REASON_NO_TEXT_LAYER, ocr.problem))))
    ocr_pages = tuple(sorted(i + 1 for i in ocr.texts))
    note = "; ".join(filter(None, (
        f"{empty} of {len(pages)} pages have no text layer (scanned?)" if empty else None, ocr.problem,
        f"{len(ocr_pages)} page(s) read by OCR (Tesseract): {_page_ranges(ocr_pages)}" if ocr_pages else None,
    ))) or None
    headings: list[Heading] = []
    pos = 0
    for page in pages:
        headings.extend(Heading(h.start + pos, h.end + pos, h.level, h.title) for h in find_headings(page, "pdf"))
        pos += len(page) + len(PAGE_SEPARATOR)
    return Extracted("pdf", pages, paged=True, headings=tuple(headings), fmt="pdf", note=note,
                     ocr_pages=ocr_pages)


def _page_ranges(pages: tuple[int, ...]) -> str:
    """``(1, 2, 3, 5)`` → ``"1-3, 5"`` (sorted 1-based page numbers)."""
    runs: list[list[int]] = []
    for p in pages:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _pdf_open_with_empty_password(reader) -> bool:
    """Many PDFs are encrypted only to set permissions, with an empty user password: those are readable."""
    try:
        return bool(reader.decrypt(""))
    except Exception:  # noqa: BLE001  (unsupported algorithm or missing crypto backend: treat as protected)
        return False


def _page_text(page) -> str:
    text = page.extract_text() or ""
    return text.replace("\r\n", "\n").replace("\r", "\n")


# ----------------------------------------------------------------------------------------------------- DOCX

def _extract_docx(path: Path, data: bytes) -> Extracted:
    import docx

    try:
        document = docx.Document(io.BytesIO(data))
        blocks = [(_docx_block_text(b), _docx_heading_level(b)) for b in document.iter_inner_content()]
    except Exception as exc:  # noqa: BLE001  (zipfile, lxml and python-docx all raise their own kinds)
        raise IngestError(str(path), f"corrupt or not a DOCX file ({type(exc).__name__}: {exc})") from exc
    parts, headings, pos = [], [], 0
    for text, level in blocks:
        if not text.strip():
            continue
        if parts:
            pos += 2  # the "\n\n" between blocks
        if level:
            headings.append(Heading(pos, pos + len(text), level, text.strip()))
        parts.append(text)
        pos += len(text)
    text = "\n\n".join(parts)
    if not text.strip():
        raise IngestError(str(path), "no text in the document")
    return Extracted("docx", [text], headings=tuple(headings))


def _docx_heading_level(block) -> int:
    """1-9 for a paragraph in a "Title" (1) or "Heading N" style, else 0."""
    style = getattr(getattr(block, "style", None), "name", "") or ""
    if style == "Title":
        return 1
    m = re.fullmatch(r"Heading (\d)", style)
    return int(m.group(1)) if m else 0


def _docx_block_text(block) -> str:
    if hasattr(block, "rows"):  # a table: one line per row, cells separated by " | "
        return "\n".join(" | ".join(c.text.strip() for c in row.cells) for row in block.rows)
    return block.text


# ----------------------------------------------------------------------------------------------------- HTML

_BLOCK_TAGS = frozenset(
    "p div br hr li ul ol dl dt dd h1 h2 h3 h4 h5 h6 pre blockquote table tr td th section article header "
    "footer nav aside main figure figcaption title address details summary".split()
)
_SKIP_TAGS = frozenset({"script", "style", "noscript", "template", "svg"})
_HEADING_TAGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.headings: list[tuple[int, str]] = []  # (level, title) in document order
        self._heading: tuple[int, list[str]] | None = None
        self._skip = 0
        self._pre = 0

    def handle_starttag(self, tag, attrs):
        if tag in _SKIP_TAGS:
            self._skip += 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n\n")
        if tag == "pre":
            self._pre += 1
        if tag in _HEADING_TAGS and not self._skip:
            self._heading = (int(tag[1]), [])

    def handle_endtag(self, tag):
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n\n")
        if tag == "pre":
            self._pre = max(0, self._pre - 1)
        if tag in _HEADING_TAGS and self._heading is not None:
            title = re.sub(r"\s+", " ", "".join(self._heading[1])).strip()
            if title:
                self.headings.append((self._heading[0], title))
            self._heading = None

    def handle_data(self, data):
        if self._skip:
            return
        self.parts.append(data if self._pre else re.sub(r"\s+", " ", data))
        if self._heading is not None:
            self._heading[1].append(data)


def html_to_text(html: str) -> str:
    """Visible text of an HTML document: paragraphs separated by a blank line, whitespace collapsed."""
    return html_to_text_and_headings(html)[0]


def html_to_text_and_headings(html: str) -> tuple[str, list[Heading]]:
    """``html_to_text`` and the spans of its ``<h1>``-``<h6>`` headings in that text (each found as the text
    at the start of a line, in document order, after the previous one)."""
    parser = _TextParser()
    parser.feed(html)
    parser.close()
    text = "".join(parser.parts)
    lines = [line.strip() for line in text.split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    headings: list[Heading] = []
    pos = 0
    for level, title in parser.headings:
        at = text.find(title, pos)
        while at > 0 and text[at - 1] != "\n":
            at = text.find(title, at + 1)
        if at < 0:
            continue
        headings.append(Heading(at, at + len(title), level, title))
        pos = at + len(title)
    return text, headings
