"""What llama.cpp build this machine has, asked of a child Python: only engine child processes map llama.cpp's
library (docs/architecture.md), so ``hearth doctor`` never imports ``llama_cpp`` itself. The child prints one
JSON line; the check that reads it is ``app.doctor.checks.check_backend``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

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
    """``python -c PROBE_CODE``, or in a frozen bundle the bundle itself (``hearth doctor --backend-probe``)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "doctor", "--backend-probe"]
    return [sys.executable, "-c", PROBE_CODE]


def probe(timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Run the child: ``{"outcome": "ok", "libs", "info", "offload"}``, or ``{"outcome": "missing" |
    "unloadable", "error"}``. A child that crashes, hangs or prints no answer is ``unloadable`` (the library
    took the process down while loading), with its last stderr line as the error."""
    try:
        r = subprocess.run(probe_command(), capture_output=True, text=True, timeout=timeout, check=False,
                           stdin=subprocess.DEVNULL)
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
