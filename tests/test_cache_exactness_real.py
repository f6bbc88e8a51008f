"""Issue 11: every prefix-reuse path gives the cold run's tokens, on the real bundled model.

A sweep of 24 generated prompts (100 … 1200 tokens, five kinds of content) per KV type (f16, q8_0, and q4_0,
all with flash attention): cold vs reused in the same process (the same prompt again, a conversation's next
turn, a prefix of a cached prompt) vs restored in a new process (the whole entry, a shorter entry's whole
chunks). Plus the prompts that differed before the fix (docs/prefix-cache.md). One engine per path batches the
prompts (``benchmarks.cache_exactness.sweep``)."""

from __future__ import annotations

import pytest

from app.engine.local.engine import Engine
from app.protocol.types import LoadSettings
from benchmarks import cache_exactness as cx

pytestmark = pytest.mark.model

N_CTX = 2048


@pytest.fixture(scope="module")
def sweep_prompts(bundled_model) -> list[str]:
    with Engine(str(bundled_model), LoadSettings(n_ctx=N_CTX), prefix_cache=None) as e:
        return cx.make_prompts(e.count_tokens, 24, 100, 1200, seed=11)


def _assert_all_identical(res: dict, must_exercise: tuple[str, ...]) -> None:
    for name, t in res["paths"].items():
        assert t["mismatches"] == [], f"{res['kv']} {name}: differs from cold: {t['mismatches']}"
        assert t["identical"] == t["exercised"]
    for name in must_exercise:
        assert res["paths"][name]["exercised"] > 0, f"{res['kv']}: path {name} never ran"


@pytest.mark.parametrize("kv,every", [("f16", 6), ("q8_0", 6), ("q4_0", 8)])
def test_sweep_every_path_equals_cold(bundled_model, sweep_prompts, kv, every):
    res = cx.sweep(str(bundled_model), sweep_prompts, kv, n_ctx=N_CTX, max_tokens=16, derived_every=every)
    _assert_all_identical(res, cx.PATHS)
    assert res["paths"]["restored"]["exercised"] == len(sweep_prompts)
    assert res["paths"]["live"]["exercised"] == len(sweep_prompts)


def test_issue_table_prompts_equal_cold(bundled_model):
    """The marble prompts of 874 … 2281 tokens whose restored answers differed (697 → 698 marbles)."""
    for res in cx.table_sweep(str(bundled_model)):
        _assert_all_identical(res, ("live", "restored"))
        assert res["paths"]["restored"]["exercised"] == res["prompts"]


def test_make_prompts_rejects_bad_ranges():
    with pytest.raises(ValueError, match="lo <= hi"):
        cx.make_prompts(len, 3, 500, 100)
    with pytest.raises(ValueError, match="n >= 1"):
        cx.make_prompts(len, 0, 100, 500)


def test_bad_sweep_arguments_are_refused_before_any_model_loads(capsys):
    for argv, msg in ((["--prompts", "0"], "number of prompts must be >= 1"),
                      (["--n-ctx", "100"], "leaves no room"), (["--max-tokens", "0"], "--max-tokens must be >= 1")):
        with pytest.raises(SystemExit) as exc:
            cx.main(argv)
        assert exc.value.code == 2 and msg in capsys.readouterr().err
