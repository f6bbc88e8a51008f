"""Scanned PDFs: image-only PDFs rendered here with Pillow, read by the real Tesseract when this machine has it
(a fresh machine does not: those tests skip), reported with the install command when it is hidden, and bounded
when a stand-in ``tesseract`` hangs or fails. Keyword search only: no embedding model is needed."""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import pytest

from app.doctor import checks
from app.errors import IngestError
from app.retrieval import ingest as ingest_mod
from app.retrieval import ocr
from app.retrieval.extract import REASON_NO_TEXT_LAYER, extract
from app.retrieval.ingest import Ingester
from app.retrieval.search import Retriever
from tests.test_retrieval import make_pdf

PIL = pytest.importorskip("PIL", reason="Pillow renders the scanned pages")
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

needs_tesseract = pytest.mark.skipif(ocr.tesseract_path() is None,
                                     reason="tesseract is not on PATH (e.g. `sudo apt install tesseract-ocr`)")
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="the stand-in tesseract is a shell script")

PAGES = [["Cormorants nest on the northern cliff.", "The colony counted 212 pairs in May."],
         ["The lighthouse keeper logs the tide at 9:15.", "Kelp gathers below the western jetty."]]
DPI = 200


def _font(size: int):
    """DejaVu Sans from matplotlib when it is installed, else Pillow's own scalable font (Pillow >= 10.1)."""
    try:
        import matplotlib

        return ImageFont.truetype(os.path.join(matplotlib.get_data_path(), "fonts/ttf/DejaVuSans.ttf"), size)
    except (ImportError, OSError):
        return ImageFont.load_default(size=size)


def _scan(lines: list[str]) -> Image.Image:
    """A page strip at 200 dpi (8.5 x 2 in) with ``lines`` in 13 pt black on white, as a scanner gives it."""
    img = Image.new("L", (int(8.5 * DPI), 2 * DPI), 255)
    draw, font = ImageDraw.Draw(img), _font(36)
    for i, line in enumerate(lines):
        draw.text((DPI // 2, DPI // 3 + i * 60), line, font=font, fill=0)
    return img


def scanned_pdf(path: Path, pages: list[list[str]] = PAGES) -> Path:
    """An image-only PDF (no text layer), one scanned image per page."""
    first, *rest = [_scan(lines) for lines in pages]
    first.save(path, "PDF", resolution=DPI, save_all=True, append_images=rest)
    return path


def _hide_tesseract(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, script: str | None = None) -> Path:
    """PATH holds only an empty folder, or one with a stand-in ``tesseract`` running ``script`` (sh)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if script is not None:
        exe = bin_dir / "tesseract"
        exe.write_text("#!/bin/sh\n" + script)
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


# ------------------------------------------------------------------------------------------ with Tesseract

@needs_tesseract
def test_a_scanned_pdf_is_indexed_by_ocr_and_found_with_its_page(tmp_path: Path, doc_store):
    pdf = scanned_pdf(tmp_path / "scan.pdf")
    ex = extract(pdf, pdf.read_bytes())
    assert ex.ocr_pages == (1, 2) and ex.paged
    assert ex.note == "2 page(s) read by OCR (Tesseract): 1-2"
    status = Ingester(doc_store).ingest([pdf]).files[0]
    assert (status.status, status.pages) == ("indexed", 2)
    assert status.reason == "2 page(s) read by OCR (Tesseract): 1-2"  # the report says where the text came from
    r = Retriever(doc_store)
    hit = r.search("lighthouse keeper tide", k=1)[0]
    assert hit.page == 2 and "9:15" in hit.text
    assert ex.text[hit.char_start:hit.char_end] == hit.text  # offsets into the extracted text, as for any PDF
    assert r.search("cormorants colony", k=1)[0].page == 1


@needs_tesseract
def test_only_the_pages_without_text_are_read_by_ocr(tmp_path: Path):
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.append(make_pdf(tmp_path / "text.pdf", [["Alpha page about otters."]]))
    writer.append(scanned_pdf(tmp_path / "scan.pdf", PAGES[1:]))
    with open(tmp_path / "mixed.pdf", "wb") as f:
        writer.write(f)
    ex = extract(tmp_path / "mixed.pdf", (tmp_path / "mixed.pdf").read_bytes())
    assert ex.ocr_pages == (2,) and ex.note == "1 page(s) read by OCR (Tesseract): 2"
    assert ex.pages[0].startswith("Alpha page about otters") and "lighthouse" in ex.pages[1]


@needs_tesseract
def test_a_language_tesseract_lacks_is_reported_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        doc_store):
    monkeypatch.setenv(ocr.LANG_ENV, "xyz")
    pdf = scanned_pdf(tmp_path / "scan.pdf", PAGES[:1])
    status = Ingester(doc_store).ingest([pdf]).files[0]
    assert status.status == "failed"
    assert status.reason == (f"{REASON_NO_TEXT_LAYER}; OCR failed on page 1: tesseract exited with status 1: "
                             "Failed loading language 'xyz'")


# --------------------------------------------------------------------------------------- without Tesseract

def test_without_tesseract_a_scan_is_reported_as_before_with_the_install_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, doc_store):
    pdf = scanned_pdf(tmp_path / "scan.pdf")
    _hide_tesseract(monkeypatch, tmp_path)
    assert ocr.tesseract_path() is None
    status = Ingester(doc_store).ingest([pdf]).files[0]
    assert status.status == "failed"
    assert status.reason == f"{REASON_NO_TEXT_LAYER}; OCR needs Tesseract: {ocr.install_command()}"
    assert doc_store.stats()["documents"] == 0


def test_without_tesseract_a_partly_scanned_pdf_is_indexed_with_a_note(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.append(make_pdf(tmp_path / "text.pdf", [["Alpha page about otters."]]))
    writer.append(scanned_pdf(tmp_path / "scan.pdf", PAGES[1:]))
    with open(tmp_path / "mixed.pdf", "wb") as f:
        writer.write(f)
    _hide_tesseract(monkeypatch, tmp_path)
    ex = extract(tmp_path / "mixed.pdf", (tmp_path / "mixed.pdf").read_bytes())
    assert ex.ocr_pages == () and ex.pages[1] == ""
    assert ex.note == f"1 of 2 pages have no text layer (scanned?); OCR needs Tesseract: {ocr.install_command()}"


@posix_only
def test_a_scan_that_failed_for_want_of_tesseract_is_read_once_tesseract_is_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, doc_store):
    pdf = scanned_pdf(tmp_path / "scan.pdf", PAGES[:1])
    bin_dir = _hide_tesseract(monkeypatch, tmp_path)
    assert Ingester(doc_store).ingest([pdf]).files[0].status == "failed"
    exe = bin_dir / "tesseract"  # a stand-in that "reads" every image and counts its runs
    exe.write_text(f"#!/bin/sh\necho run >> {tmp_path / 'runs'}\necho 'Cormorants nest on the cliff.'\n")
    exe.chmod(0o755)
    status = Ingester(doc_store).ingest([pdf]).files[0]  # unchanged, but named: read again
    assert (status.status, status.reason) == ("indexed", "1 page(s) read by OCR (Tesseract): 1")
    assert "Cormorants" in Retriever(doc_store).search("cormorants", k=1)[0].text


@posix_only
def test_a_rescan_retries_a_failure_of_the_ocr_setup_once_per_setup_but_not_other_failures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, doc_store):
    folder = tmp_path / "docs"
    folder.mkdir()
    pdf = scanned_pdf(folder / "scan.pdf", PAGES[:1])
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    bin_dir = _hide_tesseract(monkeypatch, tmp_path)
    runs = tmp_path / "runs"
    read: list[str] = []
    monkeypatch.setattr(ingest_mod, "extract", lambda path, data: read.append(path.name) or extract(path, data))
    ingester = Ingester(doc_store)
    assert [f.status for f in ingester.ingest([folder]).files] == ["failed", "failed"]
    exe = bin_dir / "tesseract"  # fails as a bad HEARTH_OCR_LANG would, counting its runs
    exe.write_text(f"#!/bin/sh\necho run >> {runs}\necho \"Failed loading language 'xxx'\" >&2\nexit 1\n")
    exe.chmod(0o755)
    broken = doc_store.document(str(folder / "broken.pdf"))
    assert not ocr.depends_on_setup(broken.error) and ocr.depends_on_setup(doc_store.document(str(pdf)).error)
    read.clear()
    ingester.rescan()
    assert runs.read_text().count("run") == 1 and read == ["scan.pdf"]  # retried: Tesseract appeared
    ingester.rescan()
    assert runs.read_text().count("run") == 1  # same setup: a watch does not run Tesseract each poll
    assert read == ["scan.pdf"]  # the broken file's failure does not depend on the machine: not read again
    exe.write_text(f"#!/bin/sh\necho run >> {runs}\necho 'Cormorants nest on the cliff.'\n")
    monkeypatch.setenv(ocr.LANG_ENV, "eng")  # the setting fixed: a new setup, retried
    statuses = {f.path: f.status for f in ingester.rescan().files}
    assert statuses[str(pdf)] == "indexed" and runs.read_text().count("run") == 2


@posix_only
def test_a_hanging_tesseract_is_stopped_and_ocr_gives_up_on_the_document(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    pdf = scanned_pdf(tmp_path / "scan.pdf")  # two pages: only the first is tried
    _hide_tesseract(monkeypatch, tmp_path, "exec /bin/sleep 30\n")  # exec: the timeout kills the sleep itself
    monkeypatch.setattr(ocr, "OCR_TIMEOUT_S", 1.0)
    t0 = time.monotonic()
    with pytest.raises(IngestError) as err:
        extract(pdf, pdf.read_bytes())
    assert time.monotonic() - t0 < 10
    assert err.value.reason == f"{REASON_NO_TEXT_LAYER}; OCR failed on page 1: tesseract timed out after 1 s"


@posix_only
def test_a_crashing_tesseract_is_reported_with_its_last_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pdf = scanned_pdf(tmp_path / "scan.pdf", PAGES[:1])
    _hide_tesseract(monkeypatch, tmp_path, "echo 'Error in pixReadMem: Unknown format' >&2\nexit 134\n")
    with pytest.raises(IngestError) as err:
        extract(pdf, pdf.read_bytes())
    assert err.value.reason == (f"{REASON_NO_TEXT_LAYER}; OCR failed on page 1: tesseract exited with status "
                                "134: Error in pixReadMem: Unknown format")


@posix_only
def test_a_huge_image_is_scaled_down_and_the_languages_come_from_the_setting(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch):
    bin_dir = tmp_path / "bin"
    _hide_tesseract(monkeypatch, tmp_path, f'echo "$@" > "{bin_dir}/args"\n/bin/cat > "{bin_dir}/in.png"\n'
                                           'echo read it\n')
    monkeypatch.setattr(ocr, "MAX_OCR_PIXELS", 100_000)
    monkeypatch.setenv(ocr.LANG_ENV, "eng+deu")
    text = ocr.ocr_image(Image.new("RGB", (2000, 1000), "white"), ocr.tesseract_path(), ocr.languages())
    assert text == "read it"
    sent = Image.open(io.BytesIO((bin_dir / "in.png").read_bytes()))
    assert sent.mode == "L" and sent.width * sent.height <= 100_000 and abs(sent.width - 2 * sent.height) <= 1
    assert (bin_dir / "args").read_text().split() == ["stdin", "stdout", "-l", "eng+deu"]


def test_a_bad_language_setting_is_refused_by_name(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(ocr.LANG_ENV, "eng; rm -rf /")
    with pytest.raises(ocr.OcrFailed, match="HEARTH_OCR_LANG='eng; rm -rf /' is not a Tesseract language list"):
        ocr.languages()


# ------------------------------------------------------------------------------------------------- doctor

@needs_tesseract
def test_doctor_reports_tesseract_with_its_version():
    version, langs = ocr.tesseract_info(ocr.tesseract_path())
    c = checks.check_ocr()
    assert c.status == "ok" and c.summary.startswith(f"Tesseract {version} (eng)") and "eng" in langs
    assert c.details["path"] == ocr.tesseract_path()


def test_doctor_reports_a_missing_tesseract_as_information_with_the_install_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _hide_tesseract(monkeypatch, tmp_path)
    c = checks.check_ocr()
    assert c.status == "info" and "not installed" in c.summary
    assert c.fix == ocr.install_command()


_STAND_IN_DOCTOR = ('case "$1" in --version) echo "tesseract 5.3.0";; --list-langs) '
                    'printf "List of available languages (2):\\neng\\nosd\\n";; esac\n')


@posix_only
@pytest.mark.parametrize(("langs", "summary", "fix"), [
    ("eng+xxx", "lacks the language(s) xxx (HEARTH_OCR_LANG=eng+xxx): scanned PDFs are read with eng only",
     "`sudo apt install tesseract-ocr-xxx`"),        # Tesseract skips xxx and reads with eng: it does read
    ("xxx", "scanned PDFs are not read", "`sudo apt install tesseract-ocr-xxx`"),
    ("ENG", "scanned PDFs are not read", "case-sensitive: write eng in HEARTH_OCR_LANG, not ENG"),
    ("chi_sim+Osd", "lacks the language(s) chi_sim, Osd", "write osd in HEARTH_OCR_LANG, not Osd; install their "
     "traineddata (Debian: `sudo apt install tesseract-ocr-chi-sim`)"),
])
def test_doctor_says_what_a_missing_language_does_and_names_the_package_in_lower_case(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, langs: str, summary: str, fix: str):
    _hide_tesseract(monkeypatch, tmp_path, _STAND_IN_DOCTOR)
    monkeypatch.setenv(ocr.LANG_ENV, langs)
    c = checks.check_ocr()
    assert c.status == "warn" and summary in c.summary and fix in c.fix
    assert "tesseract-ocr-ENG" not in c.fix and "tesseract-ocr-Osd" not in c.fix


@pytest.mark.parametrize(("platform", "release", "command"), [
    ("linux", 'ID=debian\n', "sudo apt install tesseract-ocr"),
    ("linux", 'ID=linuxmint\nID_LIKE="ubuntu debian"\n', "sudo apt install tesseract-ocr"),
    ("linux", 'ID=fedora\n', "sudo dnf install tesseract"),
    ("linux", 'ID="rocky"\nID_LIKE="rhel centos fedora"\n', "sudo dnf install tesseract"),
    ("darwin", "", "brew install tesseract"),
    ("win32", "", "winget install UB-Mannheim.TesseractOCR"),
])
def test_the_install_command_fits_the_platform(tmp_path: Path, platform: str, release: str, command: str):
    (tmp_path / "os-release").write_text(release)
    assert ocr.install_command(platform, tmp_path / "os-release") == command


def test_an_unknown_linux_gets_both_common_commands(tmp_path: Path):
    assert ocr.install_command("linux", tmp_path / "absent") == (
        "sudo apt install tesseract-ocr (Debian, Ubuntu) or sudo dnf install tesseract (Fedora)")
