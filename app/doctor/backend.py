"""What llama.cpp build this machine has, asked of a child Python: only engine child processes map llama.cpp's
library (docs/architecture.md), so ``hearth doctor`` never imports ``llama_cpp`` itself. The child prints one
JSON line; the check that reads it is ``app.doctor.checks.check_backend``."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from app.doctor import child

PROBE_TIMEOUT_S = 60.0  # importing llama_cpp maps every ggml backend library: seconds on a cold disk
MARK = "hearth-backend="
# What the child runs. Kept as text (the frozen bundle runs it through ``hearth doctor --backend-probe``), as
# ``app.doctor.qt.PROBE_CODE``. Outcome ``missing``: not installed; ``unloadable``: its library cannot load.
PROBE_CODE = """\
import json, sys
from pathlib import Path
try:
    import llama_cpp
except ImportError as exc:
    out = {"outcome": "missing", "error": str(exc)}
except OSError as exc:
    out = {"outcome": "unloadable", "error": str(exc)}
else:
    out = {"outcome": "ok",
           "libs": sorted(p.name for p in Path(llama_cpp.__file__).parent.joinpath("lib").glob("*ggml-*")),
           "info": llama_cpp.llama_print_system_info().decode("utf-8", "replace"),
           "offload": bool(llama_cpp.llama_supports_gpu_offload())}
print("hearth-backend=" + json.dumps(out), flush=True)
"""


def probe_command() -> list[str]:
    """The child that reads the build (``hearth doctor --backend-probe`` in a frozen bundle)."""
    return child.probe_command(PROBE_CODE, "--backend-probe")


def probe(timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Run the child: ``{"outcome": "ok", "libs", "info", "offload"}``, or ``{"outcome": "missing" |
    "unloadable", "error"}``. A child that crashes, hangs or prints no answer is ``unloadable`` (the library
    took the process down while loading), with its last stderr line as the error."""
    try:
        r = child.run_probe(probe_command(), timeout)
    except subprocess.TimeoutExpired:
        return {"outcome": "unloadable", "error": f"loading it did not finish within {timeout:.0f} s"}
    except OSError as exc:
        return {"outcome": "unloadable", "error": f"could not start the probe: {exc}"}
    m = re.search(rf"^{re.escape(MARK)}(.*)$", r.stdout, re.M)
    if m:
        try:
            return json.loads(m.group(1))
        except ValueError:
            pass
    last = [ln for ln in r.stderr.splitlines() if ln.strip()][-1:]
    why = last[0].strip() if last else f"the probe exited with status {r.returncode}"
    return {"outcome": "unloadable", "error": why}
