"""The recommended embedding models (sizes, fit, installed or not) and ``hearth ingest --embedding-model(s)``
without a model: the list, and the clear error for each bad choice."""

from __future__ import annotations

import pytest

from app.catalog.embedding_models import PROCESS_OVERHEAD_BYTES, fit, for_machine, load_catalog, locate
from app.cli import main


def test_the_catalog_states_repo_file_size_vector_size_and_languages():
    models = load_catalog()
    assert models[0].bundled and models[0].dim == 384
    for m in models[1:]:
        assert m.repo and m.file.endswith(".gguf") and m.size_bytes and m.dim and m.languages


def test_fit_and_locate(tmp_path):
    m = load_catalog()[-1]
    judged = fit(m, ram_bytes=8 << 30, workers=2)
    assert judged.verdict == "fits" and judged.need_bytes == m.size_bytes + 2 * PROCESS_OVERHEAD_BYTES
    assert fit(m, ram_bytes=m.size_bytes).verdict == "won't fit" and fit(m, None).verdict == "unknown"
    (tmp_path / m.file).write_bytes(b"x")
    assert locate(m, [tmp_path / "nope", tmp_path]).path == str(tmp_path / m.file)
    assert "installed" in locate(m, [tmp_path]).label() and "not downloaded" in locate(m, []).label()
    assert [x.id for x in for_machine(1 << 40, [tmp_path])][-1] == m.id


def test_embedding_models_lists_what_search_uses_and_the_recommended(capsys):
    assert main(["ingest", "--embedding-models"]) == 0
    out = capsys.readouterr().out
    assert "search uses:" in out and "qwen3-embedding-0.6b-q8_0" in out and "--pooling mean" in out


@pytest.mark.parametrize("argv, message", [
    (["--embedding-model", "no-such-model"], "neither a file nor a recommended embedding model"),
    (["--embedding-model", "bge-small-en-v1.5-f16"], "not installed: download bge-small-en-v1.5-f16.gguf"),
    (["--embedding-model", "/nowhere/x.gguf"], "no such file"),
    (["--embedding-model", "/nowhere/x.gguf", "--pooling", "mean"], "no such file"),
    (["--pooling", "mean", "some/path"], "--pooling goes with --embedding-model"),
])
def test_a_bad_choice_is_refused_with_the_reason(argv, message, capsys):
    assert main(["ingest", *argv]) == 1
    assert message in capsys.readouterr().err


def test_a_file_that_is_not_a_gguf_is_refused_and_the_setting_unchanged(tmp_path, capsys):
    from app.settings import load_user_settings

    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 20)
    assert main(["ingest", "--embedding-model", str(bad)]) == 1
    assert "model.gguf" in capsys.readouterr().err
    assert load_user_settings().embedding_model is None


def test_hearth_ingest_with_no_path_finishes_a_paused_reembed_and_shows_progress_off_a_terminal(
        tmp_path, monkeypatch, capsys):
    from app.retrieval import embed_switch as sw
    from app.retrieval.ingest import Ingester
    from app.retrieval.store import DocumentStore
    from tests.fakes import FakeEmbedder
    from tests.test_embed_switch import _library

    old, new = FakeEmbedder("old@000000000001"), FakeEmbedder("new@000000000002")
    old_ref, new_ref = sw.ModelRef(old.model_id, "/m/old.gguf"), sw.ModelRef(new.model_id, "/m/new.gguf")
    with DocumentStore() as store:
        Ingester(store, old, background=False).ingest([_library(tmp_path)])
        sw.reconcile(store, old_ref)
        assert sw.reconcile(store, new_ref)[0] == sw.START  # as a Ctrl+C'd `--embedding-model` leaves it
        chunks = store.stats()["chunks"]
    monkeypatch.setattr(sw, "desired_ref", lambda settings: new_ref)
    monkeypatch.setattr(sw, "default_ref", lambda: old_ref)
    monkeypatch.setattr(sw, "embedder_for", lambda ref, **kw: new)
    assert main(["ingest"]) == 0
    out = capsys.readouterr()
    assert "Search now uses new.gguf." in out.out
    assert f"Re-embedding for new.gguf: 0 / {chunks} chunks" in out.err  # stderr is not a terminal here
    assert "passage leads" in out.err
    with DocumentStore() as store:
        assert sw.read_state(store).active == new_ref and sw.read_state(store).pending is None
    assert main(["ingest"]) == 1  # nothing left to resume: the usual error
    assert "give at least one PATH, or --rescan" in capsys.readouterr().err


def test_the_help_says_ingest_with_no_path_resumes(capsys):
    with pytest.raises(SystemExit):
        main(["ingest", "--help"])
    assert "with none (and no --rescan), finish a paused re-embed" in " ".join(capsys.readouterr().out.split())
