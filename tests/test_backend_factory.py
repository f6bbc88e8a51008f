"""The one settings → backend factory (app/backends.py): the CLI, the port's model pool and the window build the
same plan (load settings, the model's speculative / draft / thinking options, the prefix cache) for the same
settings; the CLI's flags win over the model's entry; a bad option names its key; a remote name is a
``RemoteEngine``. No model runs: ``build`` is replaced by a recorder."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
from gguf_writer import write_gguf

from app import backends, paths
from app.errors import InvalidRequest
from app.protocol.types import LoadSettings
from app.settings import RemoteSettings, UserSettings, save_user_settings

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
OWN = {"n_ctx": 2048, "n_parallel": 2, "type_k": "q8_0", "speculative": "prompt_lookup",
       "draft_model": "/models/draft.gguf", "thinking_markers": {"start": "<t>", "end": "</t>"}, "ttl_s": 60}
SETTINGS = UserSettings(load=LoadSettings(n_ctx=1024, n_batch=128), per_model={"tiny": OWN}, cache_budget_mb=64)


class Built:
    """What ``build`` was asked for; the backend it hands back loads and closes instantly."""

    def __init__(self) -> None:
        self.plans: list[backends.BackendPlan] = []

    def __call__(self, plan: backends.BackendPlan, **kw):
        self.plans.append(plan)
        return _Stub()


class _Stub:
    def load(self) -> dict:
        return {"n_ctx": 2048}

    def close(self) -> None:
        pass


@pytest.fixture
def built(monkeypatch) -> Built:
    rec = Built()
    monkeypatch.setattr(backends, "build", rec)
    return rec


@pytest.fixture
def tiny():
    save_user_settings(SETTINGS)
    return write_gguf(paths.models_dir() / "tiny.gguf", template=TEMPLATE)


def cli_args(*argv: str) -> argparse.Namespace:
    from app.cli._engine_args import add_load_args

    p = argparse.ArgumentParser()
    add_load_args(p)
    return p.parse_args(list(argv))


def test_the_plan_merges_the_models_entry_over_the_saved_settings(tiny):
    p = backends.plan(SETTINGS, "tiny")
    assert p.model_id == "tiny" and p.path == str(tiny) and p.remote is None
    assert p.load == LoadSettings(n_ctx=2048, n_batch=128, n_parallel=2, type_k="q8_0")
    assert p.engine_options() == {"speculative": "prompt_lookup", "draft_model": "/models/draft.gguf",
                                  "thinking_markers": {"start": "<t>", "end": "</t>"}}
    assert p.prefix_cache == SETTINGS.prefix_cache_options()
    other = backends.plan_file(SETTINGS, tiny, model_id="other", prefix_cache=False)
    assert other.load == SETTINGS.load and other.engine_options() == {} and other.prefix_cache is None


@pytest.mark.gui
def test_the_cli_the_pool_and_the_window_build_the_same_backend(qtbot, tiny, built):
    from app.cli._engine_args import make_engine
    from app.ui.engine_ctl import EngineController, job_for
    from app.ui.workers import WorkerPool

    make_engine(cli_args("--model", "tiny"))
    pool = backends.model_pool(SETTINGS, budget_bytes=None)
    try:
        pool.acquire("tiny").release()
        assert pool.status()["tiny"]["ttl_s"] == 60
    finally:
        pool.close()
    ctl = EngineController(WorkerPool(max_threads=2))
    ctl.load(job_for(SETTINGS, str(tiny), "tiny"))
    qtbot.waitUntil(lambda: ctl.state == "ready", timeout=10_000)
    ctl.shutdown()
    cli, pooled, window = built.plans
    assert cli == pooled == window == backends.plan(SETTINGS, "tiny")


def test_cli_flags_win_over_the_models_entry(tiny, built):
    from app.cli._engine_args import make_engine

    make_engine(cli_args("--model", "tiny", "--n-ctx", "512", "--type-v", "q8_0", "--no-prefix-cache"))
    (p,) = built.plans
    assert p.load == LoadSettings(n_ctx=512, n_batch=128, n_parallel=2, type_k="q8_0", type_v="q8_0",
                                  flash_attn=True)
    assert p.speculative == "prompt_lookup" and p.prefix_cache is None
    with pytest.raises(InvalidRequest) as err:
        backends.load_settings(SETTINGS, "tiny", {"n_ctx": 512, "bogus": 1})
    assert err.value.param == "bogus"


def test_a_bad_option_names_its_key(tiny):
    bad = replace(SETTINGS, per_model={"tiny": {"speculative": 3}})
    with pytest.raises(InvalidRequest) as err:
        backends.plan(bad, "tiny")
    assert err.value.param == "per_model.tiny.speculative"
    with pytest.raises(InvalidRequest, match="n_ctx"):
        backends.plan(replace(SETTINGS, per_model={"tiny": {"n_ctx": 1}}), "tiny")


def test_a_remote_name_builds_a_remote_engine_with_its_settings():
    remote = RemoteSettings(url="http://127.0.0.1:9/v1", n_ctx=8192, n_parallel=3).validate("far")
    p = backends.plan(replace(SETTINGS, remotes={"far": remote}), "far")
    assert p.remote == remote and p.load is None and p.model_id == "far"
    eng = backends.build(p)
    assert type(eng).__name__ == "RemoteEngine" and eng.url == "http://127.0.0.1:9/v1" and eng.n_ctx == 8192
    with pytest.raises(InvalidRequest, match="no remote engine named 'near'"):
        backends.plan_remote(SETTINGS, "near")
