"""The embedding model and engine, and hybrid search, with the real all-MiniLM-L6-v2 converted to GGUF.

The GGUF file is converted once per checkout into ``.cache/models/embeddings`` (~2 s); one embedding engine
process serves the whole module."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from crashes import gone, kill, wait_dead

from app.errors import EngineCrashed, ModelLoadError
from app.retrieval.chunking import SPECIAL_TOKENS, chunk_text
from app.retrieval.embed_model import (
    ensure_embedding_model,
    find_embedding_model,
    packaged_model_zip,
    read_safetensors,
)
from app.retrieval.ingest import Ingester
from app.retrieval.search import Retriever

pytest.importorskip("llama_cpp")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_path(embedding_model: Path) -> Path:
    """The converted embedding model (``embedding_model`` in tests/conftest.py)."""
    return embedding_model


@pytest.fixture(scope="module")
def embedder(model_path: Path):
    from app.retrieval.embedder import Embedder

    e = Embedder(model_path)
    yield e
    e.close()


# ------------------------------------------------------------------------------------------ the GGUF model

@pytest.mark.model
def test_ensure_embedding_model_writes_a_bert_gguf_once(model_path: Path, hearth_home: Path):
    from gguf import GGMLQuantizationType, GGUFReader

    reader = GGUFReader(model_path)
    arch = reader.get_field("general.architecture")
    assert bytes(arch.parts[-1]).decode() == "bert"
    assert int(reader.get_field("bert.pooling_type").parts[-1][0]) == 1  # mean
    assert bytes(reader.get_field("tokenizer.ggml.model").parts[-1]).decode() == "bert"
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["token_types.weight"] == GGMLQuantizationType.F32  # f16 here aborts llama.cpp
    assert types["blk.0.attn_q.weight"] == GGMLQuantizationType.F16
    assert "embeddings.position_ids" not in types and len(types) == 5 + 6 * 16
    # default location (under HEARTH_HOME); a current file is kept, not rewritten
    default = hearth_home / "models" / "embeddings" / "all-MiniLM-L6-v2-f16.gguf"
    default.parent.mkdir(parents=True)
    shutil.copyfile(model_path, default)
    mtime = default.stat().st_mtime_ns
    assert ensure_embedding_model() == default and default.stat().st_mtime_ns == mtime
    assert find_embedding_model() == default


def _reference_embedding(ids: list[int], t: dict[str, np.ndarray]) -> np.ndarray:
    """all-MiniLM-L6-v2 in numpy from the original safetensors (BERT encoder + mean pooling + L2 norm)."""
    def ln(x, name):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + 1e-12) * t[name + ".weight"] + t[name + ".bias"]

    def lin(x, name):
        return x @ t[name + ".weight"].T + t[name + ".bias"]

    erf = np.vectorize(math.erf)
    n = len(ids)
    x = (t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:n]
         + t["embeddings.token_type_embeddings.weight"][0])
    x = ln(x, "embeddings.LayerNorm")
    for layer in range(6):
        p = f"encoder.layer.{layer}."
        q, k, v = (lin(x, p + f"attention.self.{w}").reshape(n, 12, -1).transpose(1, 0, 2)
                   for w in ("query", "key", "value"))
        a = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = ln(x + lin((a @ v).transpose(1, 0, 2).reshape(n, -1), p + "attention.output.dense"),
               p + "attention.output.LayerNorm")
        h = lin(x, p + "intermediate.dense")
        x = ln(x + lin(0.5 * h * (1 + erf(h / math.sqrt(2))), p + "output.dense"), p + "output.LayerNorm")
    e = x.mean(0)
    return e / np.linalg.norm(e)


@pytest.mark.model
def test_gguf_embeddings_match_a_numpy_reference_of_the_original_weights(embedder):
    from llama_cpp import Llama

    with zipfile.ZipFile(packaged_model_zip()) as zf:
        weights = {k: v.astype(np.float64) for k, v in read_safetensors(zf.read("model.safetensors")).items()}
    vocab = Llama(str(embedder.model_path), vocab_only=True, verbose=False)
    for sentence in ("A man is playing a guitar.", "Grüße aus München"):
        ids = vocab.tokenize(sentence.encode(), add_bos=True)
        got = embedder.embed([sentence])[0]
        assert float(got @ _reference_embedding(ids, weights)) > 0.999
    # the WordPiece tokenizer agrees with BERT's ([CLS] a man is playing a guitar . [SEP])
    assert vocab.tokenize(b"A man is playing a guitar.") == [101, 1037, 2158, 2003, 2652, 1037, 2858, 1012, 102]


@pytest.mark.model
def test_paraphrases_rank_above_unrelated_sentences(embedder):
    triples = [
        ("A man is playing a guitar.", "Someone strums a guitar.", "The stock market fell sharply today."),
        ("How do I bake bread at home?", "A recipe for homemade bread.", "The train leaves at nine."),
        ("The cat sleeps on the sofa.", "A kitten is napping on the couch.", "Quarterly tax filing deadlines."),
        ("Reset your password from the login page.", "You can change a forgotten password when signing in.",
         "Penguins live in the southern hemisphere."),
    ]
    for anchor, para, other in triples:
        a, p, o = embedder.embed([anchor, para, other])
        assert float(a @ p) > float(a @ o) + 0.2, (anchor, float(a @ p), float(a @ o))
        assert abs(float(np.linalg.norm(a)) - 1.0) < 1e-4


# -------------------------------------------------------------------------------------------- the engine

@pytest.mark.model
def test_tokens_are_counted_without_special_tokens(embedder):
    assert embedder.count_tokens(["A man is playing a guitar.", ""]) == [7, 0]


@pytest.mark.model
def test_an_engine_crash_is_an_error_then_the_engine_restarts(embedder):
    embedder.embed(["warm"])
    texts = [f"passage {i}: " + "words of a long passage " * 40 for i in range(64)]  # several decodes
    killed: list[int] = []

    def crash_on_first_progress(_texts: int, _tokens: int) -> None:
        if not killed:  # the child is mid-request: killed as llama.cpp's abort ends it
            killed.append(embedder.pid)
            kill(killed[0])

    with pytest.raises(EngineCrashed) as ei:
        embedder.embed(texts, progress=crash_on_first_progress)
    assert "died" in str(ei.value) and "SIGKILL" in str(ei.value)
    assert embedder.embed(["restarted"]).shape == (1, 384)
    pid = embedder.pid
    kill(pid)  # died while idle: restarted on the next request
    assert wait_dead(embedder.host)
    assert embedder.embed(["restarted again"]).shape == (1, 384)
    assert embedder.pid != pid


_PARENT = """
import sys, threading
from app.retrieval.embedder import Embedder

e = Embedder(sys.argv[1])
e.embed(["warm"])
print(e.pid, flush=True)
texts = ["The heron colony was counted again this spring, nest by nest, along the river. " * 8] * 64
while True:  # requests in flight when the parent is killed: the child's reply then meets a closed pipe
    e.embed(texts)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
@pytest.mark.model
def test_child_of_a_killed_parent_exits_quietly(model_path: Path, tmp_path: Path):
    """The parent is SIGKILLed while a request runs: the child exits within seconds, printing nothing (it
    printed BrokenPipe tracebacks before the process host)."""
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as f:
        parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(model_path)], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=f)
    child = None
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), err.read_text()
        child = int(line)
        time.sleep(1.0)  # a few batches in
        parent.kill()
        parent.wait(10)
        assert gone(child, 10), "the embedding child outlived its parent"
        time.sleep(0.5)  # anything it printed on its way out is in the file now
        text = err.read_text()
        assert "Traceback" not in text and "BrokenPipe" not in text, text
    finally:
        parent.kill()
        parent.wait(10)
        if child is not None and not gone(child, 0):
            kill(child)


def test_a_bad_model_file_is_a_model_load_error(tmp_path: Path):
    from app.retrieval.embedder import Embedder

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with Embedder(bad, start_timeout_s=60) as e, pytest.raises(ModelLoadError, match="could not load"):
        e.embed(["x"])


# ------------------------------------------------------------------------------- chunking, hybrid search

@pytest.mark.model
def test_a_20000_character_paragraph_fits_the_model_tokenizer(embedder):
    text = " ".join(f"Observation{i} of the heron colony recorded variable{i * 7}" for i in range(400))[:20000]
    assert "\n" not in text
    chunks = chunk_text(text, embedder, max_tokens=256, overlap_tokens=32)
    counts = embedder.count_tokens([c.text for c in chunks])
    assert len(chunks) > 10 and max(counts) + SPECIAL_TOKENS <= 256
    assert [c.token_count for c in chunks] == counts


@pytest.mark.model
def test_hybrid_search_pelican_edit_rename_delete(tmp_path: Path, doc_store, embedder):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "birds.txt").write_text("Swallows migrate to Africa every autumn.\n")
    f = folder / "code.txt"
    f.write_text("The code word is PELICAN.\n")
    ing, r = Ingester(doc_store, embedder), Retriever(doc_store, embedder)
    ing.ingest([folder])
    assert doc_store.stats()["embeddings"] == 2
    res = r.search("what is the secret password?", k=1)  # no shared keyword: the vector ranking finds it
    assert res.mode == "hybrid" and res.notice is None and res[0].text == "The code word is PELICAN."
    assert res.query_embed_s > 0

    f.write_text("The code word is OSPREY.\n")
    ing.ingest([folder])
    texts = [e.text for e in r.search("code word PELICAN", k=5)]
    assert "The code word is OSPREY." in texts and not any("PELICAN" in t for t in texts)

    g = folder / "moved.txt"
    f.rename(g)
    assert {s.status for s in ing.ingest([folder]).files} == {"unchanged", "renamed"}
    hit = r.search("code word", k=1)[0]
    assert hit.path == str(g) and hit.text == "The code word is OSPREY."
    assert doc_store.stats()["embeddings"] == 2  # the vectors moved with the document

    g.unlink()
    ing.ingest([folder])
    assert [e.text for e in r.search("code word", k=5)] == ["Swallows migrate to Africa every autumn."]
    assert doc_store.stats()["embeddings"] == 1


@pytest.mark.model
def test_vectors_are_added_later_for_chunks_indexed_without_a_model(tmp_path: Path, doc_store, embedder):
    (tmp_path / "a.txt").write_text("Otters hold hands while sleeping.")
    Ingester(doc_store).ingest([tmp_path / "a.txt"])
    assert Retriever(doc_store, embedder).search("otters", k=1).mode == "bm25"
    assert Ingester(doc_store, embedder).embed_missing() == 1
    res = Retriever(doc_store, embedder).search("sea mammals resting", k=1)
    assert res.mode == "hybrid" and res[0].text.startswith("Otters")
