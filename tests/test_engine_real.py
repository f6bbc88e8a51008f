"""The engine on the real bundled model (Gemma 3 270M Q4_K_M, a base model): determinism, streaming,
stop strings, UTF-8, cancellation, context overflow, crashes and bad files."""

from __future__ import annotations

import threading
import time

import pytest
from crashes import kill

from app.engine.local.engine import Engine
from app.errors import Cancelled, ContextLengthExceeded, EngineCrashed, ModelLoadError
from app.protocol.types import ChatMessage, DecodingParams, Delta, GenerateRequest, LoadSettings

pytestmark = pytest.mark.model

GREEDY = dict(temperature=0.0)
CONTROL = ("<end_of_turn>", "<start_of_turn>", "<eos>", "<bos>", "<|im_end|>", "<|eot_id|>", "</s>")


@pytest.fixture(scope="module")
def engine(bundled_model):
    eng = Engine(bundled_model, LoadSettings(n_ctx=2048, n_batch=256, n_ubatch=256))
    eng.load()
    yield eng
    eng.close()


def raw(prompt, **kw):
    return GenerateRequest(prompt=prompt, decoding=DecodingParams.make(**{**GREEDY, **kw}))


def chat(text, **kw):
    return GenerateRequest(messages=(ChatMessage("user", text),), decoding=DecodingParams.make(**{**GREEDY, **kw}))


def run_stream(engine, req):
    deltas, done = [], None
    for ev in engine.generate(req):
        if isinstance(ev, Delta):
            deltas.append(ev.text)
        else:
            done = ev
    return "".join(deltas), done


def test_capital_of_france_through_transcript_template(engine):
    done = engine.complete(chat("What is the capital of France?", max_tokens=16))
    assert "Paris" in done.text
    assert done.info["template"] == "transcript"
    assert done.finish_reason == "stop"
    assert not any(c in done.text for c in CONTROL)


def test_greedy_is_deterministic_and_stream_equals_non_stream(engine):
    req = raw("The three primary colors are", max_tokens=40)
    a = engine.complete(req)
    text, done = run_stream(engine, req)
    assert a.text == done.text == text
    assert a.metrics.completion_tokens == 40 and a.finish_reason == "length"


def test_same_seed_same_text(engine):
    req = raw("Once upon a time", temperature=0.9, seed=1234, max_tokens=30)
    assert engine.complete(req).text == engine.complete(req).text
    other = engine.complete(raw("Once upon a time", temperature=0.9, seed=99, max_tokens=30))
    assert isinstance(other.text, str)


def test_stop_string_across_tokens(engine):
    free = engine.complete(raw("Here is the English alphabet: ABC", max_tokens=30))
    assert free.text.startswith("DEFGH\n\nThe English")  # what this model writes, greedy
    # A stop string that spans several tokens of that answer: nothing of it may be emitted, not even "G".
    req = raw("Here is the English alphabet: ABC", max_tokens=30, stop=["GH\n\nThe English"])
    text, done = run_stream(engine, req)
    assert (text, done.text, done.finish_reason) == ("DEF", "DEF", "stop")
    # The stop string of the API tests, which this model never completes: held back while it could still
    # match, released when it cannot; streamed == non-streamed.
    req = raw("Here is the English alphabet: ABC", max_tokens=30, stop=["DEFGHIJ"])
    deltas = [ev.text for ev in engine.generate(req) if isinstance(ev, Delta)]
    assert "".join(deltas) == free.text
    assert all(not d.endswith(("D", "DE", "DEF", "DEFG")) or "\n" in d for d in deltas if d)


def test_emoji_and_cjk_stream_byte_exact(engine):
    req = chat("Reply with exactly: 👍🏽 🇯🇵 👨‍👩‍👧 歪 ß", max_tokens=40)
    text, done = run_stream(engine, req)
    assert text.encode("utf-8") == done.text.encode("utf-8")
    assert "\ufffd" not in text
    assert engine.complete(req).text == text


def test_metrics_are_complete_and_sane(engine):
    done = engine.complete(raw("Count: 1, 2, 3,", max_tokens=20))
    m = done.metrics
    assert m.prompt_tokens > 3 and m.completion_tokens == 20
    assert 0 < m.ttft_s < m.total_s
    assert m.decode_tps > 0 and m.tpot_s > 0 and m.itl_p50_s <= m.itl_p95_s <= m.itl_max_s
    assert m.peak_rss_bytes > 100 * 1024 * 1024
    for key in ("prompt_tokens", "cached_tokens", "completion_tokens", "ttft_s", "tpot_s", "itl_p50_s",
                "itl_p95_s", "itl_max_s", "prefill_tps", "decode_tps", "total_s", "peak_rss_bytes"):
        assert key in m.to_dict()


def test_live_prefix_is_reused(engine):
    long = "Notes on rivers. " * 150
    first = engine.complete(raw(long + "The Nile", max_tokens=2))
    # Same length, only the last token differs: everything before it was laid out for this length.
    same_len = engine.complete(raw(long + "The Amazon", max_tokens=2))
    assert same_len.metrics.prompt_tokens == first.metrics.prompt_tokens
    assert same_len.metrics.cached_tokens == same_len.metrics.prompt_tokens - 1
    assert same_len.metrics.cache_source == "memory"
    # Longer prompt: whole prefill chunks (n_batch = 256 here), then into the next chunk as far as leaves its
    # rest one batch of 64+ tokens, 4-aligned (layout.usable_within; docs/prefix-cache.md).
    deadline = time.monotonic() + 30  # the idle engine measures once whether it may (Runtime._probe_split)
    while not engine.cache_stats()["split_probed"] and time.monotonic() < deadline:
        time.sleep(0.05)
    longer = engine.complete(raw(long + "The Amazon river basin is", max_tokens=2))
    whole = (first.metrics.prompt_tokens - 1) // 256 * 256
    assert whole == 512 and engine.cache_stats()["split_rows"] == 64
    assert whole < longer.metrics.cached_tokens <= longer.metrics.prompt_tokens - 1 - 64
    assert (longer.metrics.cached_tokens - whole) % 4 == 0 and "inside a chunk" in longer.metrics.cache_reuse_reason


def test_an_idle_engine_lays_the_answer_out_again_so_the_next_turn_reuses_it(engine):
    """After a chat answer the idle engine prefills the answer's turn again in the canonical layout
    (``Runtime.idle_step``): the next turn reuses the previous prompt *and* the answer, up to the cut that
    opens the new user turn, and answers exactly as a cold prefill does."""
    d = DecodingParams.make(temperature=0.0, max_tokens=24)
    history = (ChatMessage("user", "Tell me about the rivers of Europe and the towns along them. " * 8),)
    before = engine.cache_stats()["settled_answers"]
    first = engine.complete(GenerateRequest(messages=history, decoding=d))
    deadline = time.monotonic() + 30
    while engine.cache_stats()["settled_answers"] == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.cache_stats()["settled_answers"] == before + 1
    nxt = history + (ChatMessage("assistant", first.text), ChatMessage("user", "Which one is the longest?"))
    warm = engine.complete(GenerateRequest(messages=nxt, decoding=d))
    cold = engine.complete(GenerateRequest(messages=nxt, decoding=d, prefix_cache=False))
    assert cold.metrics.cached_tokens == 0 and warm.metrics.cache_reuse == "exact"
    assert warm.text == cold.text
    m1, m2 = first.metrics, warm.metrics
    # the old rule stopped at the answer's turn break (prompt − 2: "Assistant" ":"); now the answer is reused
    assert m2.cached_tokens >= m1.prompt_tokens + m1.completion_tokens - 3, (m1, m2)
    assert m2.cached_tokens <= m2.prompt_tokens - len(engine.tokenize("Which one is the longest?"))


def test_cancel_mid_decode(engine):
    gen = engine.generate(raw("List of numbers: 1, 2, 3,", max_tokens=1500))
    n = 0
    with pytest.raises(Cancelled):
        for ev in gen:
            n += 1
            if n == 5:
                gen.cancel()
    assert n < 10, "at most a step or two after cancel"
    assert engine.complete(raw("Hello", max_tokens=3)).metrics.completion_tokens == 3


def test_cancel_mid_prefill(engine):
    prompt = "A long story about a lighthouse keeper. " * 180  # ~1600 tokens, 7 chunks of 256
    cold = engine.complete(raw(prompt + "Once", max_tokens=1))
    full_prefill = cold.metrics.prefill_s
    gen = engine.generate(raw("Different start. " + prompt, max_tokens=5))
    timer = threading.Timer(full_prefill * 0.25, gen.cancel)
    timer.start()
    with pytest.raises(Cancelled, match="prefill"):  # stopped before the prefill finished
        gen.result()
    done = engine.complete(raw("Hello there", max_tokens=3))
    assert done.metrics.completion_tokens == 3


def test_close_stream_early_frees_engine(engine):
    gen = engine.generate(raw("Tell me a story:", max_tokens=500))
    for i, _ in enumerate(gen):
        if i == 3:
            break
    gen.close()
    assert engine.complete(raw("Hi", max_tokens=2)).metrics.completion_tokens == 2


def test_context_overflow_then_normal_request(engine):
    with pytest.raises(ContextLengthExceeded) as ei:
        engine.complete(raw("word " * 3000, max_tokens=10))
    assert ei.value.prompt_tokens > 2048 and ei.value.n_ctx == 2048
    assert "2048" in str(ei.value)
    assert engine.complete(raw("Hi", max_tokens=2)).finish_reason == "length"


def test_crash_is_reported_and_engine_restarts(engine):
    it = iter(engine.generate(raw("Tell me a story:", max_tokens=500)))
    next(it)  # the engine process is generating
    kill(engine.pid)  # as llama.cpp's GGML_ABORT ends the process mid-request
    with pytest.raises(EngineCrashed, match="killed by signal SIGKILL"):
        for _event in it:
            pass
    done = engine.complete(chat("What is the capital of France?", max_tokens=8))
    assert "Paris" in done.text
    assert engine.stats.crashes >= 1


def test_logit_bias_bans_a_token(engine):
    base = engine.complete(raw("The capital of France is", max_tokens=3))
    first = engine.tokenize(base.text)[0]
    banned = engine.complete(raw("The capital of France is", max_tokens=3, logit_bias={first: -100}))
    assert engine.tokenize(banned.text)[:1] != [first]


def test_bad_files_give_specific_errors_while_engine_serves(engine, bundled_model, tmp_path):
    trunc = tmp_path / "half.gguf"
    with open(bundled_model, "rb") as f:
        trunc.write_bytes(f.read(bundled_model.stat().st_size // 2))
    rnd = tmp_path / "random.gguf"
    rnd.write_bytes(bytes(range(256)) * 400)
    txt = tmp_path / "notes.gguf"
    txt.write_text("just some text, renamed\n" * 100)
    for path, words in ((trunc, "truncated"), (rnd, "not a GGUF"), (txt, "not a GGUF")):
        with pytest.raises(ModelLoadError, match=words):
            Engine(path).load()
    assert "Paris" in engine.complete(chat("What is the capital of France?", max_tokens=8)).text


def test_vocabulary_lane_answers_during_a_generation_without_changing_it(engine):
    req = raw("List of numbers: 1, 2, 3,", max_tokens=40)
    alone = engine.complete(req).text
    ids = engine.tokenize("Grüße, 世界")
    gen = engine.generate(req)
    deltas, waits = [], []
    for ev in gen:
        if isinstance(ev, Delta):
            deltas.append(ev.text)
            t0 = time.perf_counter()
            assert engine.detokenize(ids) == "Grüße, 世界"
            assert b"".join(engine.token_piece_bytes(t) for t in ids) == "Grüße, 世界".encode()
            assert engine.count_tokens("Grüße, 世界") == len(ids)
            assert "User: hi" in engine.render(chat("hi")).text
            waits.append(time.perf_counter() - t0)
    assert "".join(deltas) == alone  # the same greedy text as without the lookups in between
    assert max(waits) < 0.5  # not the rest of the generation
    assert engine.token_piece_bytes(engine.tokenize("<start_of_turn>", special=True)[0]) == b""  # control token
