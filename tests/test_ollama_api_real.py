"""Ollama's native API on the real bundled model (Gemma 3 270M base) and the bundled embedder, through the
official ``ollama`` client against a server on 127.0.0.1 and a free port: a streamed chat that matches the
whole answer, a generate whose ``format`` schema is obeyed, embeddings. Answers are kept short."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import ollama
import pytest

from app.engine.local.engine import Engine
from app.protocol.types import LoadSettings
from app.retrieval.embedder import Embedder
from app.server import ServerThread, create_app
from app.settings import ServerSettings

pytestmark = pytest.mark.model
MODEL = "gemma-3-270m-q4_k_m"
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def real(bundled_model, embedding_model):
    eng = Engine(bundled_model, LoadSettings(n_ctx=2048), max_queue=4)
    eng.load()
    try:
        with Embedder(embedding_model) as embedder, \
                ServerThread(create_app(eng, ServerSettings(), embedder=embedder)) as srv:
            yield srv, embedder
    finally:
        eng.close()


def client(srv) -> ollama.Client:
    return ollama.Client(host=srv.url, timeout=120)


def test_real_chat_streamed_matches_whole(real):
    srv, _ = real
    c = client(srv)
    opts = {"temperature": 0, "num_predict": 12}
    whole = c.chat(model=MODEL, messages=ASK, options=opts, stream=False)
    parts = list(c.chat(model=f"{MODEL}:latest", messages=ASK, options=opts, stream=True))
    assert "Paris" in whole.message.content
    assert "".join(p.message.content for p in parts) == whole.message.content
    last = parts[-1]
    assert last.done and not any(p.done for p in parts[:-1]) and last.done_reason in ("stop", "length")
    assert last.eval_count == whole.eval_count and 0 < last.eval_count <= 12
    assert last.prompt_eval_count == whole.prompt_eval_count > 0
    assert last.total_duration >= last.prompt_eval_duration > 0 and last.eval_duration > 0
    assert MODEL in [m.model for m in c.ps().models]  # with the embedding model, also loaded


def test_real_generate_with_a_format_schema(real):
    srv, _ = real
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "country": {"type": "string", "enum": ["France", "Italy"]}},
              "required": ["city", "country"], "additionalProperties": False}
    r = client(srv).generate(model=MODEL, prompt="Paris is a city in France. As JSON:", format=schema,
                             options={"temperature": 0, "num_predict": 60}, stream=False)
    assert r.done and r.done_reason == "stop"
    jsonschema.validate(json.loads(r.response), schema)


def test_real_embed(real):
    srv, embedder = real
    c = client(srv)
    r = c.embed(model=embedder.model_id, input=["The cat sat on the mat.", "A cat is sitting on a mat.",
                                                 "Quarterly tax filing deadlines"])
    v = np.array(r.embeddings, dtype=np.float32)
    assert v.shape == (3, embedder.dim) and r.prompt_eval_count > 0
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    assert v[0] @ v[1] > v[0] @ v[2]
    legacy = c.embeddings(model=embedder.model_id, prompt="The cat sat on the mat.").embedding
    assert np.allclose(legacy, r.embeddings[0], atol=1e-5)


def test_real_raw_generate_streamed_matches_whole(real):
    srv, _ = real
    c = client(srv)
    opts = {"temperature": 0, "num_predict": 8, "seed": 3}
    whole = c.generate(model=MODEL, prompt="The capital of France is", raw=True, options=opts, stream=False)
    parts = list(c.generate(model=MODEL, prompt="The capital of France is", raw=True, options=opts, stream=True))
    assert whole.response and "".join(p.response for p in parts) == whole.response
    assert parts[-1].done and parts[-1].eval_count == whole.eval_count <= 8
