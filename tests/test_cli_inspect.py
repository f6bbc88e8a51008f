"""``hearth inspect`` / ``hearth models`` in-process, and model resolution (``app.catalog.registry``)."""

from __future__ import annotations

import json
from pathlib import Path, PureWindowsPath

import pytest
from gguf_writer import write_gguf

from app import paths
from app.catalog.registry import BUNDLED_MODEL_ID, list_models, model_id, resolve_model
from app.cli import main
from app.errors import ModelNotFound


def tiny_gguf(path: Path, arch: str = "llama", template: str | None = None) -> Path:
    """A 1-layer GGUF (32-dim embeddings, 2 heads, 1 KV head: head_dim 16) from the tests' one GGUF writer."""
    return write_gguf(path, arch, n_layer=1, context_length=128, embedding_length=32, feed_forward_length=64,
                      head_count=2, head_count_kv=1, n_vocab=10, template=template)


@pytest.fixture
def linked_bundled(bundled_model: Path) -> Path:
    """The real bundled model linked into this test's models folder (no 253 MB copy)."""
    link = paths.bundled_model_path()
    link.symlink_to(bundled_model)
    return link


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


# -------------------------------------------------------------------------------------------- inspect


def test_inspect_json_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tiny_gguf(tmp_path / "tiny-chat.gguf", template="{{ x }}")
    out = _json(capsys, ["inspect", str(path), "--json", "--n-ctx", "512", "--type-k", "q8_0", "--parallel", "1"])
    assert set(out) == {"model", "memory", "template"}
    assert out["model"]["architecture"] == "llama" and out["model"]["id"] == "tiny-chat"
    assert out["template"] == "gguf"
    assert out["memory"]["n_ctx"] == 512 and out["memory"]["kv_k_bytes"] == 512 * 1 * 16 * 34 // 32
    assert out["memory"]["verdict"] in ("fits", "tight", "won't fit", "unknown")


def test_inspect_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tiny_gguf(tmp_path / "tiny.gguf")
    assert main(["inspect", str(path), "--n-ctx", "300"]) == 0
    out = capsys.readouterr().out
    assert "architecture   llama" in out and "memory estimate (n_ctx 300" in out and "verdict" in out
    assert "512 cells" in out  # n_ctx padded to 256


def test_inspect_bad_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_text("not a model")
    assert main(["inspect", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hearth: error:") and "not a GGUF file" in err and err.count("\n") == 1


def test_inspect_projector_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tiny_gguf(tmp_path / "mmproj.gguf", "clip"))]) == 1
    assert "multimodal projector" in capsys.readouterr().err


def test_inspect_unknown_id(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "no-such-model"]) == 1
    err = capsys.readouterr().err
    assert "'no-such-model' not found" in err and BUNDLED_MODEL_ID in err


def test_inspect_invalid_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tiny_gguf(tmp_path / "t.gguf")), "--n-ctx", "1"]) == 1
    assert "n_ctx" in capsys.readouterr().err


@pytest.mark.model
def test_inspect_bundled_json(linked_bundled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, ["inspect", "--json"])  # no MODEL: the bundled one
    assert out["model"]["id"] == BUNDLED_MODEL_ID and out["model"]["quantization"] == "Q4_K_M"
    # n_ctx 4096, f16, full SWA cache: 72 MiB per sequence, n_parallel of them (auto: as many as fit, up to 4)
    assert out["memory"]["kv_bytes"] == out["memory"]["n_parallel"] * (72 << 20)
    from app.catalog.gguf import inspect_model
    from app.engine.chat.templates import choose_template_name

    assert out["template"] == choose_template_name(inspect_model(linked_bundled))


@pytest.mark.model
def test_inspect_bundled_text_by_id(linked_bundled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", BUNDLED_MODEL_ID, "--no-swa-full", "--type-k", "q4_0", "--type-v", "q4_0",
                 "--n-ubatch", "512"]) == 0
    out = capsys.readouterr().out
    assert "gemma3" in out and "Q4_K_M" in out and "15/18 layers" in out and "5,184 bytes/token" in out
    assert "SWA layers 1024 cells" in out


# --------------------------------------------------------------------------------------------- models


def test_models_lists_files_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    tiny_gguf(paths.models_dir() / "tiny.gguf")
    (paths.models_dir() / "broken.gguf").write_bytes(b"\x00" * 64)
    (paths.models_dir() / "readme.txt").write_text("ignored")
    out = _json(capsys, ["models", "--json"])
    by_id = {m["id"]: m for m in out}
    assert [m["id"] for m in out] == [BUNDLED_MODEL_ID, "broken", "tiny"]
    bundled = by_id[BUNDLED_MODEL_ID]
    assert bundled["bundled"] is True and bundled["installed"] is False and "hearth setup" in bundled["error"]
    assert not Path(bundled["path"]).exists() and bundled["size_bytes"] == 0
    assert all(m["installed"] is True for m in out[1:])
    assert "not a GGUF file" in by_id["broken"]["error"]
    tiny = by_id["tiny"]
    assert tiny["architecture"] == "llama" and tiny["quantization"] == "F16" and "error" not in tiny
    assert tiny["size_bytes"] == (paths.models_dir() / "tiny.gguf").stat().st_size and tiny["bundled"] is False


def test_models_text(capsys: pytest.CaptureFixture[str]) -> None:
    tiny_gguf(paths.models_dir() / "tiny.gguf")
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "llama" in out
    # a fresh data folder: the bundled model is not there yet, and that is not an error of a file
    bundled_line = next(line for line in out.splitlines() if BUNDLED_MODEL_ID in line)
    assert "not installed" in bundled_line and "hearth setup" in bundled_line and "ERROR" not in bundled_line


@pytest.mark.model
def test_models_bundled(linked_bundled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (paths.models_dir() / "other.gguf").symlink_to(tiny_gguf(tmp_path / "elsewhere.gguf"))
    out = _json(capsys, ["models", "--json"])
    assert [m["id"] for m in out] == [BUNDLED_MODEL_ID, "other"]
    b = out[0]
    assert b["bundled"] is True and b["base_model"] is True and b["architecture"] == "gemma3"
    assert b["quantization"] == "Q4_K_M" and b["path"] == str(linked_bundled) and "error" not in b
    assert b["installed"] is True
    assert out[1]["architecture"] == "llama"


# -------------------------------------------------------------------------------------------- resolve


def test_model_id_is_the_file_name_without_gguf() -> None:
    assert model_id(paths.bundled_model_path()) == BUNDLED_MODEL_ID == "gemma-3-270m-q4_k_m"
    assert model_id("models/My-Model.Q4.gguf") == "My-Model.Q4"
    assert model_id(PureWindowsPath(r"C:\Users\a\models\Qwen3-4B-Q4_K_M.gguf")) == "Qwen3-4B-Q4_K_M"


def test_resolve_by_id_name_path_and_case(tmp_path: Path) -> None:
    p = tiny_gguf(paths.models_dir() / "My-Model.Q4.gguf")
    assert resolve_model("My-Model.Q4") == p
    assert resolve_model("My-Model.Q4.gguf") == p
    assert resolve_model("my-model.q4") == p
    outside = tiny_gguf(tmp_path / "outside.gguf")
    assert resolve_model(str(outside)) == outside.resolve()
    assert [e.id for e in list_models()] == [BUNDLED_MODEL_ID, "My-Model.Q4"]


def test_resolve_unknown() -> None:
    tiny_gguf(paths.models_dir() / "a.gguf")
    with pytest.raises(ModelNotFound) as exc_info:
        resolve_model("zzz")
    assert exc_info.value.available == [BUNDLED_MODEL_ID, "a"]


def test_a_link_whose_file_is_gone_is_not_offered_as_available(tmp_path: Path) -> None:
    """A model dropped in from elsewhere is a link in the models folder; once its file is deleted, asking for
    it says it is not found without naming it among the available models."""
    target = tiny_gguf(tmp_path / "mygood.gguf")
    (paths.models_dir() / "mygood.gguf").symlink_to(target)
    target.unlink()
    with pytest.raises(ModelNotFound) as exc_info:
        resolve_model("mygood")
    assert "mygood" not in exc_info.value.available


@pytest.mark.model
def test_resolve_default_is_bundled(linked_bundled: Path) -> None:
    assert resolve_model(None) == linked_bundled
    assert resolve_model(BUNDLED_MODEL_ID) == linked_bundled
