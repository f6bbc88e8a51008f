"""The rest of Anthropic's API on the real bundled model through the official ``anthropic`` client: structured
outputs (``messages.parse``: the grammar makes even a base model answer the schema), ``count_tokens`` against
the prompt ``messages.create`` reports, a stop sequence, ``models.list`` in Anthropic's shape; and the
``openai`` client's token-id embeddings on the real embedding model."""

from __future__ import annotations

from typing import Literal

import anthropic
import httpx
import numpy as np
import openai
import pytest
from engine_runs import served
from pydantic import BaseModel

from app.server import ServerThread, create_app
from app.settings import ServerSettings

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m-q4_k_m"
ASK = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


class Capital(BaseModel):
    city: Literal["Paris", "London", "Berlin", "Madrid"]
    country: Literal["France", "England", "Germany", "Spain"]
    sure: bool


@pytest.fixture(scope="module")
def real(bundled_model):
    with served(bundled_model, max_queue=4) as srv:
        yield srv


def client(srv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=120)


def test_parse_gives_a_validated_object_from_the_grammar(real):
    m = client(real).messages.parse(model=MODEL, max_tokens=64, messages=ASK, output_format=Capital,
                                    extra_body={"temperature": 0})
    assert isinstance(m.parsed_output, Capital)  # validated by the SDK against the schema
    assert Capital.model_validate_json(m.content[0].text) == m.parsed_output
    assert m.stop_reason == "end_turn"  # the grammar ended the answer, not max_tokens


def test_count_tokens_is_the_prompt_create_reports(real):
    c = client(real)
    system = "Answer briefly."
    n = c.messages.count_tokens(model=MODEL, system=system, messages=ASK).input_tokens
    m = c.messages.create(model=MODEL, max_tokens=4, system=system, messages=ASK, extra_body={"temperature": 0})
    assert n == m.usage.input_tokens > 5
    with_tools = c.messages.count_tokens(model=MODEL, system=system, messages=ASK, tools=[WEATHER]).input_tokens
    assert with_tools > n + 10  # the tool definitions are part of the prompt


def test_a_stop_sequence_cuts_the_answer(real):
    c = client(real)
    free = c.messages.create(model=MODEL, max_tokens=24, messages=ASK, extra_body={"temperature": 0})
    text = free.content[0].text
    stop = text.strip()[:3]
    assert len(stop) == 3
    m = c.messages.create(model=MODEL, max_tokens=24, messages=ASK, stop_sequences=[stop],
                          extra_body={"temperature": 0})
    assert stop not in m.content[0].text and text.startswith(m.content[0].text)


def test_a_stop_sequence_is_reported_with_its_string(real):
    c = client(real)
    free = c.messages.create(model=MODEL, max_tokens=24, messages=ASK, extra_body={"temperature": 0})
    stop = free.content[0].text.strip()[:3]
    m = c.messages.create(model=MODEL, max_tokens=24, messages=ASK, stop_sequences=["zzzz", stop],
                          extra_body={"temperature": 0})
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)


def test_models_list_in_anthropics_shape(real):
    page = client(real).models.list()
    assert [(m.type, m.id) for m in page.data] == [("model", MODEL)] and page.first_id == MODEL
    assert httpx.get(f"{real.url}/v1/models").json()["data"][0]["object"] == "model"


# -- /v1/embeddings with token ids, the real embedding model -----------------------------------------------
@pytest.fixture(scope="module")
def embeddings(embedding_model):
    from app.retrieval.embedder import Embedder

    emb = Embedder(embedding_model, workers=1)
    try:
        with ServerThread(create_app(None, ServerSettings(), embedder=emb)) as srv:
            yield srv, embedding_model, emb.model_id
    finally:
        emb.close()


def _token_ids(path, text: str) -> list[int]:
    """The embedding model's own token ids of ``text`` (its vocabulary read in this process)."""
    from llama_cpp import Llama

    vocab = Llama(model_path=str(path), vocab_only=True, verbose=False)
    return vocab.tokenize(text.encode("utf-8"), add_bos=False)


def test_embeddings_of_token_ids_are_those_of_their_text(embeddings):
    srv, path, model = embeddings
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    texts = ["The cat sat on the mat.", "Paris is the capital of France."]
    ids = [_token_ids(path, t) for t in texts]
    by_text = c.embeddings.create(model=model, input=texts)
    by_ids = c.embeddings.create(model=model, input=ids)
    one = c.embeddings.create(model=model, input=ids[0])
    a = np.array([d.embedding for d in by_text.data])
    b = np.array([d.embedding for d in by_ids.data])
    assert a.shape == b.shape == (2, 384) and np.allclose(a, b, atol=1e-5)
    assert np.allclose(one.data[0].embedding, a[0], atol=1e-5)
    assert by_ids.usage.prompt_tokens == sum(len(x) for x in ids)
    with pytest.raises(openai.BadRequestError) as e:
        c.embeddings.create(model=model, input=[[ids[0][0], 10**9]])
    assert "outside the embedding model's vocabulary" in str(e.value) and "input[0][1]" in str(e.value)
