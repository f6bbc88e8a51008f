"""The layering of STYLE.md, enforced by import-linter contracts in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    r = subprocess.run([exe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def _layers_contract() -> list[str]:
    import tomllib

    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    top = next(c for c in conf if c["type"] == "layers" and "containers" not in c)
    return [name.strip() for layer in top["layers"] for name in layer.replace(":", "|").split("|")]


def test_the_layers_contract_names_every_package_and_module_of_app():
    named = set(_layers_contract())
    present = {f"app.{p.stem if p.is_file() else p.name}" for p in (REPO / "app").iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
    assert present - named == set(), "packages the layers contract leaves out"
    assert named - present == set(), "names in the layers contract that are no package"


def test_modules_and_functions_stay_small():
    """STYLE.md: no function over 60 lines; no module over ~600 lines (650 here, the slack of 'about')."""
    import ast

    big_modules, big_functions = [], []
    for path in sorted((REPO / "app").rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(REPO).as_posix()
        if text.count("\n") > 650:
            big_modules.append((rel, text.count("\n")))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 60:
                    big_functions.append((rel, node.name, n))
    assert big_modules == [] and big_functions == []


def test_no_test_hooks_in_the_product():
    """Test doubles and crash switches live in tests/ (STYLE.md, 'One of each')."""
    hits = [(p.relative_to(REPO).as_posix(), word) for p in (REPO / "app").rglob("*.py")
            for word in ("crash_for_test", '"_abort"', "_scripted_service", "for_test") if word in p.read_text()]
    assert hits == []


def test_the_engine_face_lists_what_it_hands_on():
    """``app.engine.__all__`` (spelled out for linters) and the lazy table behind it name the same things, and
    each resolves."""
    import app.engine as engine

    assert sorted(engine.__all__) == sorted(engine._FACE)
    assert all(getattr(engine, name) is not None for name in engine.__all__)
