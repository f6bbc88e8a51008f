"""``benchmarks.peer`` (llama.cpp's own llama-server as the load bench's peer): the command line it builds at
its defaults and matched to Hearth, the binary lookup and its error, ``hearth bench load --peer llama-server``
end to end over a stand-in binary (Hearth's server over ``FakeEngine``, so no model), and, when ``make
bench-peer`` has built the real one, one request to it over the bundled model."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from fakes import FakeEngine

from app.protocol.types import LoadSettings
from benchmarks import load_bench, peer

REPO = Path(__file__).resolve().parents[1]


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_command_line_at_llama_servers_defaults_is_model_context_slots_threads_only(tmp_path):
    """``defaults``: exactly -m, -c (slots × context per slot), -np, -t and host/port, whatever else the
    settings hold (no -b/-ub/-fa/--swa-full/-ctk...); the environment is left as it is."""
    cfg = peer.PeerConfig(tmp_path / "m.gguf", n_parallel=4, n_ctx_per_slot=2048, n_threads=2, n_batch=128,
                          n_ubatch=64, type_k="q8_0", type_v="q8_0", flash_attn=True, swa_full=True,
                          mode="defaults")
    argv = peer.command("/opt/llama-server", cfg, 4321)
    assert argv == ["/opt/llama-server", "-m", str(tmp_path / "m.gguf"), "--host", "127.0.0.1", "--port", "4321",
                    "-c", "8192", "-np", "4", "-t", "2"]
    assert peer.PeerConfig(Path("m")).mode == "matched"  # the dataclass's own default; the CLIs default to defaults
    s = cfg.load_settings()
    assert s["peer_settings"] == "defaults" and (s["n_ctx"], s["n_ctx_total"], s["n_threads"]) == (2048, 8192, 2)
    assert s["n_batch"] == "llama-server default (2048)" and s["swa_full"] == "llama-server default (False)"
    env = {"PATH": "/bin"}
    assert peer.peer_env(env, mode="defaults") == env and peer.peer_env(env)["GOMP_SPINCOUNT"] == "1000"
    with pytest.raises(ValueError, match="defaults, matched"):
        peer.PeerConfig(Path("m"), mode="tuned")


def test_command_line_matched_mirrors_the_load_settings(tmp_path):
    cfg = peer.PeerConfig(tmp_path / "m.gguf", n_parallel=4, n_ctx_per_slot=2048, n_threads=2, n_batch=128,
                          n_ubatch=64, type_k="q8_0", type_v="q8_0", mode="matched")
    argv = peer.command("/opt/llama-server", cfg, 4321)
    assert argv[0] == "/opt/llama-server" and _arg(argv, "-m") == str(tmp_path / "m.gguf")
    assert (_arg(argv, "--host"), _arg(argv, "--port")) == ("127.0.0.1", "4321")
    assert (_arg(argv, "-np"), _arg(argv, "-c")) == ("4", "8192")  # -c is per slot x slots
    assert (_arg(argv, "-t"), _arg(argv, "-tb"), _arg(argv, "-b"), _arg(argv, "-ub")) == ("2", "2", "128", "64")
    assert (_arg(argv, "-fa"), _arg(argv, "-ctk"), _arg(argv, "-ctv"), _arg(argv, "--fit")) == \
        ("on", "q8_0", "q8_0", "off")
    assert {"--no-kv-unified", "--swa-full", "--no-webui"} <= set(argv) and "--no-mmap" not in argv
    off = peer.command("x", peer.PeerConfig(Path("m"), flash_attn=False, swa_full=False, use_mmap=False,
                                            alias="gemma", extra=("--metrics",)), 1)
    assert _arg(off, "-fa") == "off" and "--swa-full" not in off and "--no-mmap" in off
    assert _arg(off, "--alias") == "gemma" and off[-1] == "--metrics"


def test_from_load_settings_takes_the_engines_slots_and_default_threads(tmp_path):
    from app.childhost import default_threads

    s = LoadSettings(n_ctx=1024, n_batch=512, n_ubatch=128, n_parallel=None, flash_attn=False)
    cfg = peer.PeerConfig.from_load_settings(tmp_path / "m.gguf", s, n_parallel=3)
    assert (cfg.n_parallel, cfg.n_ctx_per_slot, cfg.n_batch, cfg.n_ubatch, cfg.flash_attn) == (3, 1024, 512, 128,
                                                                                               False)
    d = peer.PeerConfig.from_load_settings(tmp_path / "m.gguf", s, n_parallel=3, mode="defaults")
    argv = peer.command("ls", d, 1)
    assert (_arg(argv, "-c"), _arg(argv, "-np"), _arg(argv, "-t")) == ("3072", "3", str(default_threads()))
    assert not {"-b", "-ub", "-fa", "-ctk", "-ctv", "--swa-full", "--no-kv-unified", "-ngl", "--fit"} & set(argv)
    assert cfg.threads() == default_threads() and cfg.load_settings()["n_threads"] == default_threads()
    from dataclasses import asdict

    as_dict = peer.PeerConfig.from_load_settings("m.gguf", asdict(LoadSettings(n_threads=3, n_parallel=2)))
    assert (as_dict.n_parallel, as_dict.threads(), as_dict.n_ctx_per_slot) == (2, 3, LoadSettings().n_ctx)


def test_find_binary_env_then_newest_build_then_a_one_line_error(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(peer.PeerError) as e:
        peer.find_binary({peer.CACHE_ENV: str(cache)})
    assert "make bench-peer" in str(e.value) and peer.BINARY_ENV in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(peer.PeerError, match="HEARTH_LLAMA_SERVER=.*not an executable file"):
        peer.find_binary({peer.BINARY_ENV: str(tmp_path / "nope")})
    builds = []
    for i, key in enumerate(("aaaaaaaaaaaa", "bbbbbbbbbbbb")):
        b = cache / f"llama-server-{key}" / "llama-server"
        b.parent.mkdir(parents=True)
        b.write_text("#!/bin/sh\n")
        b.chmod(0o755)
        os.utime(b, (1_000_000 + i, 1_000_000 + i))
        builds.append(b)
    assert peer.find_binary({peer.CACHE_ENV: str(cache)}) == builds[1]  # the newest
    assert peer.find_binary({peer.CACHE_ENV: str(cache), peer.BINARY_ENV: str(builds[0])}) == builds[0]


def test_peer_and_compare_are_refused_together(capsys):
    assert load_bench.main(["--peer", "llama-server", "--compare", "http://127.0.0.1:9"]) == 2
    assert "--compare and --peer" in capsys.readouterr().err


def test_a_peer_that_exits_is_one_line_with_its_log(tmp_path, monkeypatch):
    bad = tmp_path / "llama-server"
    bad.write_text("#!/bin/sh\necho 'error: unknown argument' >&2\nexit 3\n")
    bad.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    with pytest.raises(peer.PeerError, match="exited with status 3.*unknown argument"):
        with peer.llama_server(peer.PeerConfig(model, n_threads=1), binary=bad, log_path=tmp_path / "log"):
            pass


FAKE_SERVER = """\
#!{python}
# A stand-in llama-server: Hearth's server over FakeEngine on the --port it is given.
import json, os, sys, time
sys.path[:0] = [{repo!r}, {tests!r}]
args = sys.argv[1:]
with open(os.environ["FAKE_PEER_RECORD"], "w") as f:
    json.dump({{"argv": args, "pid": os.getpid(), "pgid": os.getpgid(0),
               "gomp": os.environ.get("GOMP_SPINCOUNT")}}, f)
from fakes import FakeEngine
from app.server import ServerThread, create_app
from app.settings import ServerSettings
eng = FakeEngine(args[args.index("-m") + 1], n_ctx=2048, reply=lambda r: "It was a key to the old lighthouse.")
with ServerThread(create_app(eng, ServerSettings()), port=int(args[args.index("--port") + 1])):
    while True:
        time.sleep(1)
"""


@pytest.mark.parametrize("settings", ["defaults", "matched"])
def test_load_bench_peer_end_to_end_over_a_stand_in(tmp_path, monkeypatch, settings):
    """``--peer llama-server``: started over Hearth's model file and settings (at its defaults unless
    ``--peer-settings matched``), run A/B as ``llama-server``, recorded in the contract with its command line
    and memory, and its process gone afterwards."""
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text(FAKE_SERVER.format(python=sys.executable, repo=str(REPO), tests=str(REPO / "tests")))
    fake.chmod(0o755)
    record = tmp_path / "record.json"
    monkeypatch.setenv(peer.BINARY_ENV, str(fake))
    monkeypatch.setenv("FAKE_PEER_RECORD", str(record))
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    model = tmp_path / "fake-model.gguf"
    model.write_bytes(b"not really a GGUF")
    eng = FakeEngine(model, n_ctx=2048, reply=lambda r: "It was a key to the old lighthouse.")
    out = tmp_path / "out"
    try:
        rc = load_bench.main(["--peer", "llama-server", "--workloads", "single,closed", "--repeats", "1",
                              "--clients", "2", "--requests-per-client", "1", "--max-tokens", "4", "--n-threads",
                              "1", "--single-max-tokens", "4", "--out", str(out)]
                             + (["--peer-settings", "matched"] if settings == "matched" else []), engine=eng)
    finally:
        eng.close()
    assert rc == 0
    seen = json.loads(record.read_text())
    argv = seen["argv"]
    assert _arg(argv, "-m") == str(model) and _arg(argv, "-np") == str(eng.n_parallel)
    from app.childhost import default_threads

    assert _arg(argv, "-c") == str(2048 * eng.n_parallel) and _arg(argv, "-t") == str(default_threads())  # the
    # engine's settings (n_threads unset: Hearth's default), not the flag, when the engine is passed in
    assert seen["pgid"] == seen["pid"]  # its own process group
    if settings == "matched":
        assert _arg(argv, "-fa") == "on" and "--swa-full" in argv and seen["gomp"] == "1000"  # Hearth's OpenMP policy
    else:
        assert len(argv) == 12 and "-fa" not in argv and seen["gomp"] is None  # -m -c -np -t --host --port
    with pytest.raises(ProcessLookupError):
        os.kill(seen["pid"], 0)
    report = json.loads((out / "load.json").read_text())
    assert [(r["cell"], r["target"]) for r in report["results"]] == [
        ("single", "hearth"), ("single", "llama-server"), ("closed", "hearth"), ("closed", "llama-server")]
    assert report["ratios"]["of"] == "llama-server/hearth" and report["counts"]["failed"] == 0
    t = report["contract"]["targets"][1]
    assert t["kind"] == "llama-server" and t["argv"] == [str(fake)] + argv and t["binary"] == str(fake)
    assert t["model_sha256"] == report["contract"]["targets"][0]["model_sha256"] is not None
    assert t["load_settings"]["n_ctx"] == 2048 and t["load_settings"]["peer_settings"] == settings
    assert report["contract"]["peer_settings"] == settings and t["peer_settings"] == settings
    mem = t["memory_after_load"]
    assert mem["root_pid"] == seen["pid"] and mem["rss_mib"] > 1 and mem["processes"][0]["pid"] == seen["pid"]
    assert "benchmark" in report["contract"]["targets"][0]["memory_after_load"]["note"]  # in-process Hearth
    md = (out / "load.md").read_text()
    assert f"peer settings **{settings}**" in md and " ".join([str(fake)] + argv) in md
    rows = {r["metric"]: r for r in report["headline"]["rows"]}
    assert report["headline"]["ratio_of"] == "hearth/llama-server" and len(rows) == 10
    assert rows["Single-stream decode tokens/s (4 tokens)"]["values"]["hearth"] > 0
    assert rows["TTFT, ~2,500-token prompt (P50)"]["values"] == {"hearth": None, "llama-server": None}
    assert "| figure | hearth | llama-server | ratio hearth/llama-server |" in md


def _real_binary() -> Path:
    try:
        return peer.find_binary()
    except peer.PeerError:
        pytest.skip("llama-server not built (make bench-peer)")


@pytest.mark.model
def test_real_llama_server_answers_over_the_bundled_model(bundled_model):
    binary = _real_binary()
    cfg = peer.PeerConfig(bundled_model, n_parallel=1, n_ctx_per_slot=512)
    with peer.llama_server(cfg, binary=binary) as p:
        r = peer.check(p.url, "Once upon a time", 8)
    assert r["content"].strip() and r["timings"]["predicted_n"] >= 1
    assert p.proc.poll() is not None  # stopped on exit


def test_the_cli_prints_its_command_line(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    monkeypatch.setenv(peer.BINARY_ENV, str(fake))
    assert peer.main(["--model", str(model), "--parallel", "2", "--n-ctx", "1024", "--print-command"]) == 0
    line = capsys.readouterr().out.split()
    assert line[0] == str(fake) and _arg(line, "-c") == "2048" and _arg(line, "-np") == "2" and "-b" not in line
    assert peer.main(["--model", str(model), "--peer-settings", "matched", "--print-command"]) == 0
    assert _arg(capsys.readouterr().out.split(), "-b") == "256"
