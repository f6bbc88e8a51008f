"""Offline document sets for the retrieval benchmarks, each with its questions (``QUESTION_SETS``).

- ``stdlib``: the docstrings of Python's standard library (below);
- ``everyday``: 15 documents written for the benchmark (``benchmarks/data/everyday_docs/*.md``) and 124
  questions (``benchmarks/data/everyday_questions.py``), each with a phrase of the passage that answers it.
- ``legal``: 7 policy and legal documents (licence, terms, privacy notice, lease, contracts) and 42 questions;
- ``notes``: 7 logs of dated entries (lab notebook, minutes, travel, budget, boat, garden, on-call), 42 questions;
- ``inference``: 8 essays on running language models locally (technical prose), 43 questions;
- ``stories``: 7 short stories (narrative: people, places, events, reasons), 44 questions.

``QuestionSet(name, questions, build)``: ``build(folder)`` writes the corpus and returns facts about it;
each ``Question`` has ``question`` and ``is_relevant(chunk_text)``.

**stdlib**

``build_corpus(folder)`` writes one Markdown file per module (``<module>.md``): the module docstring, then one
section per public function or class, each a paragraph that starts with its header line
``<module>.<name><signature>`` followed by its docstring (as ``pydoc`` shows them). The text comes from the
running interpreter, so it is the same on every machine with the same Python version (3.11 here).

``QUESTIONS``: 50 questions written as a person would ask them — mostly paraphrases, not the docstring's words —
each with the sections that answer it. A retrieved chunk is relevant when it contains the header line of one of
those sections or of a section that documents the *same object* under another module's name (``aliases``: a
module that imports a function shows it again, e.g. ``enum.reduce`` is ``functools.reduce`` and
``inspect.namedtuple`` is ``collections.namedtuple``, with the same docstring; found by identity: 5 of the 50
questions have a gold name with such copies). ``is_relevant`` tests one chunk.
"""

from __future__ import annotations

import importlib
import inspect
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"

MODULES = [
    "math", "os", "os.path", "shutil", "textwrap", "random", "statistics", "heapq", "bisect", "itertools",
    "functools", "collections", "json", "re", "difflib", "zlib", "base64", "urllib.parse", "uuid", "fnmatch",
    "glob", "tempfile", "secrets", "copy", "calendar", "time", "datetime", "hashlib", "shlex", "html",
    "ipaddress", "unicodedata", "struct", "csv", "subprocess", "operator", "string", "pprint", "gzip",
    "zipfile", "pathlib", "logging", "argparse", "socket", "threading", "queue", "sqlite3", "email.utils",
    "http.client", "inspect", "typing", "dataclasses", "contextlib", "io", "sys", "codecs", "locale",
    "tarfile", "fractions", "decimal", "enum", "weakref", "traceback", "warnings", "getpass", "platform",
]

# (question, relevant section names)
QUESTIONS: list[tuple[str, tuple[str, ...]]] = [
    ("How do I get the greatest common divisor of some integers?", ("math.gcd",)),
    ("Check whether two floating point values are approximately equal within a tolerance",
     ("math.isclose",)),
    ("number of ways to pick k things out of n when order does not matter", ("math.comb",)),
    ("distance of a point from the origin in several dimensions", ("math.hypot", "math.dist")),
    ("longest shared sub-path of several path names", ("os.path.commonpath",)),
    ("turn ~ into the user's home directory in a path", ("os.path.expanduser",)),
    ("separate the extension from a file name", ("os.path.splitext",)),
    ("delete a folder together with everything inside it", ("shutil.rmtree",)),
    ("locate an executable program on the PATH", ("shutil.which",)),
    ("strip the common indentation from every line of a triple-quoted string", ("textwrap.dedent",)),
    ("cut text down to a given width and add a placeholder at the end", ("textwrap.shorten",)),
    ("put the items of a list in random order in place", ("random.shuffle",)),
    ("choose k distinct random elements from a population without replacement", ("random.sample",)),
    ("middle value of numeric data", ("statistics.median",)),
    ("most common value in a data set", ("statistics.mode", "statistics.multimode")),
    ("get the n biggest items of a collection", ("heapq.nlargest",)),
    ("combine several already sorted inputs into one sorted output lazily", ("heapq.merge",)),
    ("insert an item into a sorted list so that it stays sorted",
     ("bisect.insort_left", "bisect.insort_right", "bisect.insort")),
    ("running totals of a sequence of numbers", ("itertools.accumulate",)),
    ("all combinations of items from several iterables, like nested for loops", ("itertools.product",)),
    ("cache the results of a function, evicting the least recently used entries", ("functools.lru_cache",
                                                                                   "functools.cache")),
    ("apply a two-argument function cumulatively to fold a sequence into a single value",
     ("functools.reduce",)),
    ("count how many times each hashable item occurs (a bag or multiset)", ("collections.Counter",)),
    ("tuple subclass whose fields can be accessed by name", ("collections.namedtuple",)),
    ("list-like container with fast appends and pops at both ends", ("collections.deque",)),
    ("convert a Python object into a JSON formatted string", ("json.dumps",)),
    ("replace every match of a regular expression in a string", ("re.sub", "re.subn")),
    ("escape characters that have a special meaning in regular expressions", ("re.escape",)),
    ("suggest words similar to a misspelled word", ("difflib.get_close_matches",)),
    ("show the differences between two lists of lines with a few lines of context", ("difflib.unified_diff",
                                                                                     "difflib.context_diff")),
    ("compute a CRC-32 checksum of some bytes", ("zlib.crc32", "binascii.crc32")),
    ("base64 encoding that is safe to use in URLs and file names", ("base64.urlsafe_b64encode",)),
    ("resolve a relative link against a base URL to get an absolute address", ("urllib.parse.urljoin",)),
    ("create a random UUID", ("uuid.uuid4",)),
    ("test a file name against a shell wildcard pattern like *.txt", ("fnmatch.fnmatch", "fnmatch.fnmatchcase")),
    ("create a unique temporary directory and return its path", ("tempfile.mkdtemp",)),
    ("random hexadecimal text suitable for security tokens", ("secrets.token_hex",)),
    ("compare two secrets in a way that prevents timing attacks", ("secrets.compare_digest",)),
    ("does a given year have 366 days?", ("calendar.isleap",)),
    ("a clock that can never go backwards", ("time.monotonic",)),
    ("pause the program for a number of seconds", ("time.sleep",)),
    ("derive a key from a password with a salt and many iterations", ("hashlib.pbkdf2_hmac",)),
    ("make a string safe to paste into a shell command line", ("shlex.quote",)),
    ("convert & < > characters into HTML-safe sequences", ("html.escape",)),
    ("convert a unicode string to a normal form such as NFC or NFKD", ("unicodedata.normalize",)),
    ("pack several values into bytes according to a format string", ("struct.pack",)),
    ("run a command and return its output, raising an error on a non-zero exit status",
     ("subprocess.check_output",)),
    ("generate the file names in a directory tree, top-down or bottom-up", ("os.walk", "os.fwalk")),
    ("create a directory including all missing parent directories", ("os.makedirs",)),
    ("rename a file, replacing the destination if it exists", ("os.replace",)),
]


def _sections(module_name: str) -> list[tuple[str, str]]:
    """``(qualified name, text)`` for each public function/class of a module with a docstring."""
    mod = importlib.import_module(module_name)
    out = []
    for name, obj in sorted(vars(mod).items()):
        if name.startswith("_") or not (inspect.isroutine(obj) or inspect.isclass(obj)):
            continue
        owner = getattr(obj, "__module__", None) or ""
        if inspect.isclass(obj) and owner and owner.split(".")[0] != module_name.split(".")[0] \
                and owner not in ("builtins", "posix", "posixpath", "_collections", "_functools"):
            continue  # re-exported class from another package
        doc = inspect.getdoc(obj)
        if not doc:
            continue
        try:
            sig = str(inspect.signature(obj))
        except (TypeError, ValueError):
            sig = "(...)"
        out.append((f"{module_name}.{name}", f"{module_name}.{name}{sig}\n{doc.strip()}"))
    return out


def build_corpus(folder: Path) -> dict[str, int]:
    """Write the corpus into ``folder``; returns ``{module: sections}``."""
    folder.mkdir(parents=True, exist_ok=True)
    counts = {}
    for module_name in MODULES:
        try:
            mod = importlib.import_module(module_name)
        except ImportError:
            continue
        sections = _sections(module_name)
        head = f"# {module_name}\n\n{inspect.getdoc(mod) or ''}".strip()
        body = "\n\n".join(text for _, text in sections)
        (folder / f"{module_name}.md").write_text(head + "\n\n" + body + "\n", encoding="utf-8")
        counts[module_name] = len(sections)
    return counts


def aliases(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` and every other corpus section whose object is the same one (``obj is obj``), in order: the
    answer is the object's documentation wherever the corpus repeats it."""
    by_id: dict[int, list[str]] = {}
    for module_name in MODULES:
        try:
            mod = importlib.import_module(module_name)
        except ImportError:
            continue
        for qual, _ in _sections(module_name):
            by_id.setdefault(id(vars(mod)[qual.rsplit(".", 1)[1]]), []).append(qual)
    out = list(names)
    for group in by_id.values():
        if set(group) & set(names):
            out += [n for n in group if n not in out]
    return tuple(out)


def header_pattern(names: tuple[str, ...]) -> re.Pattern:
    """A chunk is about one of ``names`` when it holds the section's header line ``<name>(``."""
    return re.compile(r"(?:^|\n)(?:" + "|".join(re.escape(n) for n in names) + r")\(")


def is_relevant(chunk_text: str, pattern: re.Pattern) -> bool:
    return pattern.search(chunk_text) is not None


def _fold(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Question:
    """One benchmark question. ``question``: as a person would type it; ``judge``: chunk text -> relevant?;
    ``source``: what answers it (section names, or ``file: phrase``)."""

    question: str
    judge: Callable[[str], bool]
    source: str

    def is_relevant(self, chunk_text: str) -> bool:
        return self.judge(chunk_text)


def _phrase_judge(phrase: str) -> Callable[[str], bool]:
    want = _fold(phrase)
    return lambda text: want in _fold(text)


def phrase_questions(name: str) -> list[Question]:
    """The questions of the phrase-judged set ``name`` (``benchmarks/data/<name>_questions.py``, entries
    ``(question, document file, answer phrase)``): a chunk is relevant when it contains the answer phrase
    (whitespace folded); each phrase occurs once in the corpus (checked by ``check_phrases``)."""
    mod = importlib.import_module(f"benchmarks.data.{name}_questions")
    return [Question(q, _phrase_judge(a), f"{doc}: {a}") for q, doc, a in mod.QUESTIONS]


def check_phrases(name: str) -> list[str]:
    """Problems with the phrase-judged set ``name``: an answer phrase absent from its document or found more
    than once in the corpus. [] when sound."""
    mod = importlib.import_module(f"benchmarks.data.{name}_questions")
    texts = {p.name: _fold(p.read_text(encoding="utf-8")) for p in (DATA / f"{name}_docs").glob("*.md")}
    out = []
    for q, doc, a in mod.QUESTIONS:
        n = sum(t.count(_fold(a)) for t in texts.values())
        if doc not in texts or texts[doc].count(_fold(a)) != 1 or n != 1:
            out.append(f"{q!r}: {a!r} found {n} times (must be once, in {doc})")
    return out


def phrase_builder(name: str) -> Callable[[Path], dict]:
    """``build(folder)`` of the phrase-judged set ``name``: copies ``benchmarks/data/<name>_docs/*.md`` into
    ``folder`` and returns ``{"documents": n}``."""
    def build(folder: Path) -> dict[str, int]:
        folder.mkdir(parents=True, exist_ok=True)
        docs = sorted((DATA / f"{name}_docs").glob("*.md"))
        for p in docs:
            shutil.copyfile(p, folder / p.name)
        return {"documents": len(docs)}
    return build


def _build_stdlib(folder: Path) -> dict[str, int]:
    counts = build_corpus(folder)
    return {"documents": len(counts), "sections": sum(counts.values())}


@dataclass(frozen=True)
class QuestionSet:
    name: str
    questions: list[Question]
    build: Callable[[Path], dict]


def stdlib_questions() -> list[Question]:
    """The ``stdlib`` questions; each judge accepts a chunk holding a header line of a gold section or of an
    alias of one (``aliases``)."""
    out = []
    for q, names in QUESTIONS:
        pattern = header_pattern(aliases(names))
        out.append(Question(q, (lambda p: lambda t: is_relevant(t, p))(pattern), ", ".join(names)))
    return out


STDLIB_QUESTIONS = stdlib_questions()
QUESTION_SETS = {
    "stdlib": QuestionSet("stdlib", STDLIB_QUESTIONS, _build_stdlib),
}
# Phrase-judged sets, each ``benchmarks/data/<name>_docs/*.md`` with ``benchmarks/data/<name>_questions.py``.
PHRASE_SETS = ("everyday", "legal", "notes", "inference", "stories")
QUESTION_SETS.update({n: QuestionSet(n, phrase_questions(n), phrase_builder(n)) for n in PHRASE_SETS})
