"""Fusion that reads each query's rankings (per-query weights from how sharply each ranker separates its top
hit; each ranker's first hits kept near the top) and the leave-one-corpus-out rule of the quality benchmark,
on made-up rankings and metrics (no model)."""

from __future__ import annotations

import pytest

from app.errors import InvalidRequest
from app.retrieval.fusion import (
    DEFAULT_FUSION,
    OLD_FUSION,
    FusionConfig,
    fuse,
    keep_tops,
    query_weights,
    relevance,
    score_fusion,
    separation,
)
from benchmarks.retrieval_quality import below_single, candidates, choose, leave_one_out

SHARP = [(1, 12.0), (2, 3.1), (3, 3.0), (4, 2.9), (5, 2.8), (6, 2.7)]  # one hit far above the rest
FLAT = [(6, 0.52), (5, 0.51), (4, 0.51), (3, 0.50), (2, 0.50), (1, 0.20)]  # no clear winner


def test_separation_is_the_top_scores_z():
    assert separation(SHARP) > 2.0 > separation(FLAT[:-1]) > 0
    assert separation([(1, 1.0)]) == 0.0 and separation([(1, 2.0), (2, 2.0)]) == 0.0 and separation([]) == 0.0


def test_a_sharp_bm25_top_and_a_flat_vector_side_follow_bm25():
    cfg = FusionConfig("score", 0.3, 0.7, sharpness=1.0)
    wb, wv = query_weights(SHARP, FLAT, cfg)
    assert wb / wv > 0.3 / 0.7  # BM25 counts more than its fixed share
    assert fuse(SHARP, FLAT, cfg)[0][0] == 1
    assert fuse(SHARP, FLAT, FusionConfig("score", 0.3, 0.7))[0][0] == 6  # fixed weights follow the vector side


def test_a_sharp_vector_top_and_a_flat_bm25_side_follow_the_vectors():
    lexical = [(i, s) for i, (_, s) in zip((6, 5, 4, 3, 2, 1), FLAT)]  # BM25 flat, favours 6 slightly
    vector = [(1, 0.9), (2, 0.31), (3, 0.30), (4, 0.30), (5, 0.29), (6, 0.28)]
    cfg = FusionConfig("score", 0.7, 0.3, sharpness=1.0)
    wb, wv = query_weights(lexical, vector, cfg)
    assert wv / wb > 0.3 / 0.7
    assert fuse(lexical, vector, cfg)[0][0] == 1
    assert fuse(lexical, vector, FusionConfig("score", 0.7, 0.3))[0][0] == 6


def test_sharpness_zero_keeps_the_configured_weights():
    assert query_weights(SHARP, FLAT, FusionConfig("score", 0.3, 0.7)) == (0.3, 0.7)
    assert query_weights([], [], FusionConfig("score", 0.3, 0.7, sharpness=1.0)) == (0.3, 0.7)  # nothing to read


def test_keep_tops_holds_each_rankers_first_hits_within_two_keep_plus_one():
    fused = [(i, 10.0 - i) for i in range(1, 10)]
    out = [i for i, _ in keep_tops(fused, [[(9, 1.0), (8, 1.0)], [(1, 1.0), (7, 1.0)]], 2)]
    assert out[0] == 1 and {9, 8, 7} <= set(out[:5])
    assert sorted(out) == list(range(1, 10))  # nothing lost or doubled
    assert out[5:] == [3, 4, 5, 6]  # the displaced ones follow in their order
    assert keep_tops(fused, [[(9, 1.0)]], 0) == fused
    assert keep_tops(fused[:2], [[(2, 1.0)], [(1, 1.0)]], 2) == fused[:2]


def test_keep_tops_scores_never_increase_down_the_list_and_its_order_is_unchanged():
    fused = [(i, 10.0 - i) for i in range(1, 10)]
    out = keep_tops(fused, [[(9, 1.0), (8, 1.0)], [(1, 1.0), (7, 1.0)]], 2)
    assert [i for i, _ in out] == [1, 2, 9, 8, 7, 3, 4, 5, 6]  # the order test above, whole
    scores = [s for _, s in out]
    assert scores == sorted(scores, reverse=True)  # was 9.0, 8.0, 1.0, 2.0, 3.0, 7.0, ...
    assert out[:2] == fused[:2] and out[5:] == fused[2:6]  # only the moved-up ones take a score
    assert [s for _, s in out[2:5]] == [7.0, 7.0, 7.0]  # the highest score below them: 3's


def test_keep_brings_a_bm25_only_hit_into_the_top_five():
    vector = [(i, 0.9 - 0.01 * i) for i in range(10, 30)]  # the vector side never returns chunk 1
    lexical = [(2, 9.0), (1, 8.9)] + [(i, 8.0 - 0.1 * i) for i in range(10, 20)]
    plain = [i for i, _ in fuse(lexical, vector, FusionConfig("score", 0.3, 0.7))]
    kept = [i for i, _ in fuse(lexical, vector, FusionConfig("score", 0.3, 0.7, keep=2))]
    assert 1 not in plain[:5] and 1 in kept[:5]


@pytest.mark.parametrize("cfg,param", [
    (FusionConfig("score", sharpness=-1.0), "fusion.sharpness"),
    (FusionConfig("score", sharpness=11), "fusion.sharpness"),
    (FusionConfig("score", sharpness=True), "fusion.sharpness"),
    (FusionConfig("score", keep=-1), "fusion.keep"),
    (FusionConfig("score", keep=1.5), "fusion.keep"),
])
def test_the_new_fields_are_validated(cfg, param):
    with pytest.raises(InvalidRequest) as e:
        cfg.validate()
    assert e.value.param == param


def test_defaults_are_valid_and_the_relevance_floor_still_reads_margins():
    assert DEFAULT_FUSION.validate() is DEFAULT_FUSION and OLD_FUSION.validate() is OLD_FUSION
    assert "keep 2" in DEFAULT_FUSION.describe()
    rel = relevance(SHARP, FLAT, DEFAULT_FUSION)  # normalised score fusion at the default's weights
    assert rel == dict(score_fusion([SHARP, FLAT], (DEFAULT_FUSION.bm25_weight, DEFAULT_FUSION.vector_weight)))
    assert all(c.validate() is c for c in candidates())


def _m(r, m):
    return {"recall@5": r, "mrr@10": m}


SINGLES = {"a": {"bm25": _m(0.9, 0.8), "vector": _m(0.8, 0.7)},
           "b": {"bm25": _m(0.7, 0.6), "vector": _m(1.0, 0.9)},
           "c": {"bm25": _m(0.9, 0.9), "vector": _m(0.5, 0.4)}}


def test_below_single_compares_with_the_better_ranker_on_each_metric():
    assert not below_single(_m(0.9, 0.8), SINGLES["a"])
    assert below_single(_m(0.9, 0.79), SINGLES["a"]) and below_single(_m(0.89, 0.9), SINGLES["a"])


def test_choose_prefers_settings_never_below_a_single_ranker_then_the_best_mean():
    results = {
        "greedy": {"a": _m(1.0, 1.0), "b": _m(0.9, 0.9), "c": _m(1.0, 1.0)},  # best mean, below on b
        "safe": {"a": _m(0.9, 0.8), "b": _m(1.0, 0.9), "c": _m(0.9, 0.9)},
        "safer": {"a": _m(0.9, 0.8), "b": _m(1.0, 0.9), "c": _m(0.9, 0.95)},
    }
    assert choose(results, SINGLES, ["a", "b", "c"]) == "safer"
    assert choose(results, SINGLES, ["a", "c"]) == "greedy"  # b unseen: its loss cannot be known


def test_leave_one_out_chooses_each_corpus_setting_without_it():
    results = {  # "x" wins only by being good on c; "y" is safe everywhere else
        "x": {"a": _m(0.9, 0.8), "b": _m(1.0, 0.9), "c": _m(1.0, 1.0)},
        "y": {"a": _m(0.9, 0.85), "b": _m(1.0, 0.95), "c": _m(0.9, 0.9)},
    }
    held = leave_one_out(results, SINGLES)
    assert held == {"a": "x", "b": "x", "c": "y"}  # on c the setting chosen without c is judged


def test_the_benchmark_help_names_the_command_every_option_and_the_sets(capsys):
    from app.cli import main
    from benchmarks.retrieval_corpus import QUESTION_SETS

    with pytest.raises(SystemExit):
        main(["bench", "retrieval-quality", "--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: hearth bench retrieval-quality ")
    flat = " ".join(text.split())
    for option in ("--rerank-depth N with --rerank:", "--rerank-blend SHARE with --rerank:", "--workdir DIR keep"):
        assert option in flat
    assert f"of: {', '.join(QUESTION_SETS)}" in flat
