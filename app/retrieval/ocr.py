"""Text for PDF pages without a text layer, read from their images by Tesseract when it is installed.

OCR is optional: Tesseract is an outside program (``tesseract`` on PATH), never a Python dependency. Each
image goes to ``tesseract stdin stdout`` as a grayscale PNG, one thread (``OMP_THREAD_LIMIT=1``: OpenMP's
threads made a page 5x slower on a busy 2-core machine), bounded in size and time; the first failure
(a timeout, a missing language, a crash) stops OCR for the rest of that document and is reported, never
raised. The reasoning: docs/retrieval.md, 'app/retrieval/extract.py' (OCR).
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

LANG_ENV = "HEARTH_OCR_LANG"  # Tesseract languages, e.g. "eng" (the default) or "eng+deu"
DEFAULT_LANG = "eng"
OCR_TIMEOUT_S = 60.0      # per image; a dense A4 page at 300 dpi took 4 s on the busy 2-core test machine
MAX_OCR_PIXELS = 40_000_000  # larger images are scaled down first (A4 at 600 dpi is 35 MP)
MIN_OCR_SIDE = 16         # images narrower or shorter than this (px) hold no readable text: not sent
_LANG_RE = re.compile(r"[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*")

INSTALL_COMMANDS = {
    "debian": "sudo apt install tesseract-ocr",
    "fedora": "sudo dnf install tesseract",
    "arch": "sudo pacman -S tesseract tesseract-data-eng",
    "darwin": "brew install tesseract",
    "win32": "winget install UB-Mannheim.TesseractOCR",
}
_LIKE = {"debian": "debian", "ubuntu": "debian", "fedora": "fedora", "rhel": "fedora", "centos": "fedora",
         "arch": "arch"}


class OcrFailed(Exception):
    """Tesseract could not read an image; ``str()`` is the reason for a person."""


@dataclass(frozen=True)
class OcrOutcome:
    """What OCR made of a document's pages without text. ``texts``: page index (0-based) → text read.
    ``problem``: why some were not read (Tesseract missing, a failure), else None."""

    texts: dict[int, str] = field(default_factory=dict)
    problem: str | None = None


def tesseract_path() -> str | None:
    """The ``tesseract`` executable found on PATH, or None."""
    return shutil.which("tesseract")


def install_command(platform: str | None = None, os_release: Path = Path("/etc/os-release")) -> str:
    """The command that installs Tesseract here (``platform``: ``sys.platform`` by default; on Linux the
    distribution is read from ``os_release``'s ``ID`` and ``ID_LIKE``)."""
    platform = sys.platform if platform is None else platform
    if platform in ("darwin", "win32"):
        return INSTALL_COMMANDS[platform]
    try:
        fields = dict(ln.split("=", 1) for ln in os_release.read_text().splitlines() if "=" in ln)
    except OSError:
        fields = {}
    ids = (fields.get("ID", "") + " " + fields.get("ID_LIKE", "")).replace('"', "").split()
    for distro in ids:
        if distro in _LIKE:
            return INSTALL_COMMANDS[_LIKE[distro]]
    return f"{INSTALL_COMMANDS['debian']} (Debian, Ubuntu) or {INSTALL_COMMANDS['fedora']} (Fedora)"


def missing_hint() -> str:
    """The note for pages left unread because Tesseract is not installed."""
    return f"OCR needs Tesseract: {install_command()}"


def setup_key() -> tuple[str | None, str]:
    """What OCR's outcome depends on besides the page: (the ``tesseract`` on PATH or None, the raw
    ``HEARTH_OCR_LANG``). A change means a failure that ``depends_on_setup`` may now go otherwise."""
    return tesseract_path(), os.environ.get(LANG_ENV, "").strip()


def depends_on_setup(reason: str | None) -> bool:
    """Whether a failure ``reason`` (``IngestError.reason``) came from this machine's OCR setup (Tesseract
    missing or failing, Pillow missing, a bad ``HEARTH_OCR_LANG``) rather than from the file alone: installing
    or configuring OCR may change it."""
    return bool(reason) and ("OCR needs " in reason or "OCR failed" in reason)


def languages() -> str:
    """The Tesseract language list from ``HEARTH_OCR_LANG`` (default ``eng``). Raises ``OcrFailed`` naming
    the variable when it is not a list like ``eng`` or ``eng+deu``."""
    value = os.environ.get(LANG_ENV, "").strip() or DEFAULT_LANG
    if not _LANG_RE.fullmatch(value):
        raise OcrFailed(f"{LANG_ENV}={value!r} is not a Tesseract language list (e.g. eng or eng+deu)")
    return value


def tesseract_info(exe: str, timeout: float = 10.0) -> tuple[str | None, list[str]]:
    """(version, installed languages) of the Tesseract at ``exe``; (None, []) when it does not answer."""
    try:
        ver = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=timeout, check=False)
        langs = subprocess.run([exe, "--list-langs"], capture_output=True, text=True, timeout=timeout,
                               check=False)
    except (OSError, subprocess.SubprocessError):
        return None, []
    first = (ver.stdout or ver.stderr).strip().splitlines()  # Tesseract 3 printed its version on stderr
    version = first[0].split()[-1] if first and first[0].lower().startswith("tesseract") else None
    listed = [ln.strip() for ln in langs.stdout.splitlines()[1:] if ln.strip()]  # after "List of ... (n):"
    return version, listed


def ocr_image(image, exe: str, langs: str, timeout: float | None = None) -> str:
    """The text Tesseract reads in ``image`` (a PIL image; scaled down to ``MAX_OCR_PIXELS`` first), form
    feeds and surrounding blank lines removed. ``timeout``: seconds, ``OCR_TIMEOUT_S`` by default. Raises
    ``OcrFailed`` on a timeout, a non-zero exit or an executable that cannot start."""
    timeout = OCR_TIMEOUT_S if timeout is None else timeout
    image = image.convert("L")
    if image.width * image.height > MAX_OCR_PIXELS:
        scale = (MAX_OCR_PIXELS / (image.width * image.height)) ** 0.5
        image = image.resize((max(1, int(image.width * scale)), max(1, int(image.height * scale))))
    buf = io.BytesIO()
    image.save(buf, "PNG")
    try:
        r = subprocess.run([exe, "stdin", "stdout", "-l", langs], input=buf.getvalue(), capture_output=True,
                           timeout=timeout, check=False, env={"OMP_THREAD_LIMIT": "1", **os.environ})
    except subprocess.TimeoutExpired as exc:
        raise OcrFailed(f"tesseract timed out after {timeout:g} s") from exc
    except OSError as exc:
        raise OcrFailed(f"tesseract could not start ({exc.strerror or exc})") from exc
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        why = next((ln for ln in lines if ln.startswith("Failed loading language")), lines[-1] if lines else "")
        raise OcrFailed(f"tesseract exited with status {r.returncode}" + (f": {why.strip()}" if why else ""))
    text = r.stdout.decode("utf-8", "replace").replace("\x0c", "").replace("\r\n", "\n").replace("\r", "\n")
    return text.strip("\n")


def page_images(page) -> list:
    """The PIL images of a pypdf page worth reading (each side at least ``MIN_OCR_SIDE`` px), in the page's
    resource order. Raises ``OcrFailed`` when Pillow is missing or an image cannot be decoded."""
    out = []
    try:
        n = len(page.images)
        for i in range(n):
            image = page.images[i].image
            if image is not None and min(image.width, image.height) >= MIN_OCR_SIDE:
                out.append(image)
    except ImportError as exc:  # pypdf decodes images with Pillow
        raise OcrFailed(f"OCR needs Pillow ({exc})") from exc
    except Exception as exc:  # noqa: BLE001  (pypdf and Pillow raise many kinds on a bad image)
        raise OcrFailed(f"an image could not be decoded ({type(exc).__name__}: {exc})") from exc
    return out


def read_pages(pages: Sequence, indices: Sequence[int]) -> OcrOutcome:
    """OCR of ``pages[i]`` (pypdf pages) for each ``i`` in ``indices``, the pages without a text layer. Pages
    with no image worth reading are left alone. Without Tesseract no image is read and ``problem`` says how to
    install it; the first failure stops OCR for the rest and becomes ``problem``."""
    exe = tesseract_path()
    texts: dict[int, str] = {}
    try:
        langs = languages() if exe else DEFAULT_LANG
    except OcrFailed as exc:
        return OcrOutcome(problem=f"OCR failed: {exc}")
    for i in indices:
        try:
            images = page_images(pages[i])
            if not images:
                continue
            if exe is None:  # one page with an image is enough to say what would read it
                return OcrOutcome(problem=missing_hint())
            text = "\n\n".join(t for t in (ocr_image(img, exe, langs) for img in images) if t.strip())
        except OcrFailed as exc:
            log.warning("OCR stopped at page %d: %s", i + 1, exc)
            return OcrOutcome(texts, f"OCR failed on page {i + 1}: {exc}")
        if text.strip():
            texts[i] = text
    return OcrOutcome(texts)
