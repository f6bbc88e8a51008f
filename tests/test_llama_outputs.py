"""The engine's context reserves logit rows for what one ``llama_decode`` of the runtime asks for, not for
n_batch rows (``app.engine.local.llama.outputs_per_decode``, ``n_outputs_max``): the bound covers a decode step
where every slot verifies its most speculative guesses, and llama.cpp's compute buffer shrinks with it."""

from __future__ import annotations

import logging
import re

import pytest

from app.engine.local.llama import outputs_per_decode
from app.engine.local.speculative import DRAFT_MODEL_DRAFT, LOOKUP_DRAFT


@pytest.mark.parametrize("n_seq", [1, 2, 4, 16, 64])
def test_bound_covers_every_slot_verifying_its_most_guesses(n_seq, monkeypatch):
    monkeypatch.delenv("HEARTH_SPEC_MAX_DRAFT", raising=False)
    n = outputs_per_decode(n_seq)
    assert n >= n_seq * (1 + max(LOOKUP_DRAFT, DRAFT_MODEL_DRAFT))  # decode_step with `every` slot speculating
    assert n >= 8  # speculation._probe_exact_rows: 8 rows of one sequence


def test_measurement_override_of_guesses_raises_the_bound(monkeypatch):
    monkeypatch.setenv("HEARTH_SPEC_MAX_DRAFT", "40")
    assert outputs_per_decode(4) >= 4 * 41
    monkeypatch.setenv("HEARTH_SPEC_MAX_DRAFT", "not a number")
    assert outputs_per_decode(4) == 4 * (1 + max(LOOKUP_DRAFT, DRAFT_MODEL_DRAFT))


@pytest.mark.model
def test_real_context_serves_the_bound_with_a_small_compute_buffer(bundled_model, caplog, monkeypatch):
    monkeypatch.delenv("HEARTH_SPEC_MAX_DRAFT", raising=False)
    from app.engine.local.runtime import Runtime
    from app.protocol.types import LoadSettings

    caplog.set_level(logging.DEBUG, logger="llama.cpp")
    rt = Runtime(str(bundled_model), LoadSettings(n_ctx=512, n_parallel=4))
    log = "\n".join(r.getMessage() for r in caplog.records if r.name == "llama.cpp")
    rows = outputs_per_decode(4)
    assert re.search(rf"n_outputs_max\s+=\s+{rows}\b", log)
    mib = float(re.findall(r"CPU compute buffer size =\s+([\d.]+) MiB", log)[-1])
    # llama.cpp's default (n_batch = 256 rows of 262,144 floats) reserved 257 MiB here; 44 rows: about 46
    assert mib < 4 * rows * rt.n_vocab / (1 << 20) + 16
    per_seq = rows // 4
    items = [(s, 0, [rt.llm.token_bos()] + [236764 + i for i in range(per_seq - 1)]) for s in range(4)]
    lasts = rt._decode(items, every=frozenset(range(4)))  # every row with logits, as a speculative step
    assert lasts == [per_seq * (s + 1) - 1 for s in range(4)]
    import numpy as np

    first, last = rt._row(0), rt._row(lasts[-1])
    assert np.isfinite(first).all() and np.isfinite(last).all()


def test_the_memory_estimate_counts_the_rows_the_engine_reserves(monkeypatch):
    """``memory_estimate.logit_rows`` (catalog, below the engine) keeps its own default guesses: it must stay the
    engine's, or the estimate drifts from the buffer llama.cpp reserves."""
    from app.catalog.memory_estimate import SPEC_GUESSES, logit_rows

    monkeypatch.delenv("HEARTH_SPEC_MAX_DRAFT", raising=False)
    assert SPEC_GUESSES == max(LOOKUP_DRAFT, DRAFT_MODEL_DRAFT)
    assert [logit_rows(n) for n in (1, 4, 16)] == [outputs_per_decode(n) for n in (1, 4, 16)]
