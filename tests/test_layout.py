"""The canonical prefill layout (app/engine/local/layout.py): where chunks end, what a KV of a shared prefix gives
back, which control token opens a turn and which token closes an answer."""

from __future__ import annotations

import pytest

from app.engine.local.layout import answer_end_token, layout_bounds, next_bound, turn_break_token, usable

B = 9  # the turn break in these token lists


def test_chunks_of_n_batch_without_breaks_cut_at_l_minus_1():
    assert layout_bounds(list(range(10)), 4, tail_split=1) == [4, 8, 9]
    assert layout_bounds(list(range(9)), 4, tail_split=1) == [4, 8]
    assert layout_bounds([1], 4) == [] and layout_bounds([], 4) == []
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        layout_bounds([1, 2], 0)


def test_a_break_starts_a_chunk_and_the_count_restarts_there():
    toks = [0, B, 1, 2, 3, 4, 5, B, 6, 7, 8]
    assert layout_bounds(toks, 4, {B}, tail_split=1) == [1, 5, 7, 10]
    assert [next_bound([1, 5, 7, 10], p) for p in (0, 1, 5, 7)] == [1, 5, 7, 10]
    with pytest.raises(ValueError, match="no chunk"):
        next_bound([1, 5, 7, 10], 10)


def test_the_next_turn_reuses_the_previous_prompt_up_to_the_turn_that_now_holds_the_answer():
    # turn 1: [bos] B user… B model \n | turn 2 adds the answer, its end, and a new user turn
    t1 = [0, B, 11, 12, 13, 14, 15, 16, B, 21, 22]
    t2 = t1 + [31, 32, 33, 40, B, 17, 18, B, 21, 22]
    b1, b2 = layout_bounds(t1, 4, {B}), layout_bounds(t2, 4, {B})
    have = set(b1)  # the slot after turn 1's prefill
    common = len(t1)  # the answer's tokens follow in both (decoded, not laid out)
    assert usable(b2, common, have) == 8  # up to the break that opens the model turn
    # without breaks only whole chunks of 4 would be kept
    assert usable(layout_bounds(t2, 4), common, set(layout_bounds(t1, 4))) == 8
    assert usable(layout_bounds(t2, 8), common, set(layout_bounds(t1, 8))) == 8
    assert usable(layout_bounds(t2, 16, {B}), common, set(layout_bounds(t1, 16, {B}))) == 8
    assert usable(layout_bounds(t2, 16), common, set(layout_bounds(t1, 16))) == 0


def test_a_bound_at_the_shared_length_counts_only_when_the_kv_ends_a_chunk_there():
    toks = list(range(10, 20)) + [B] + list(range(10, 20))
    b = layout_bounds(toks, 4, {B}, tail_split=1)
    assert b == [4, 8, 10, 14, 18, 20]
    assert usable(b, 10, {4, 8, 10}) == 10
    assert usable(b, 10, {4, 8}) == 8  # the KV's chunk did not end at 10 (another token there, no break)
    assert usable(b, 10) == 10  # a disk entry of exactly 10 tokens ends there
    assert usable(b, 9) == 8 and usable(b, 3, {4}) == 0


def test_a_short_tail_goes_in_with_the_last_token_and_a_long_one_ends_at_l_minus_1():
    assert layout_bounds(list(range(40)), 256) == [40]  # one llama_decode for a short prompt
    assert layout_bounds(list(range(100)), 256) == [99]  # a long tail: the last token alone
    assert layout_bounds(list(range(300)), 256) == [256, 300]  # 43 tokens after the last cut
    assert layout_bounds(list(range(10)), 4, tail_split=3) == [4, 8, 10]
    assert layout_bounds(list(range(9)), 4, tail_split=3) == [4, 8]  # the last cut is at L−1 already
    toks = [0, 1, 2, B]
    assert layout_bounds(toks, 256, {B}) == [3]  # a break at L−1 stays a cut
    for L in range(2, 40):  # no chunk is longer than ``chunk``
        b = [0] + layout_bounds(list(range(L)), 4, tail_split=3)
        assert max(y - x for x, y in zip(b, b[1:])) <= 4


def test_reuse_needs_the_same_cuts_below_the_bound():
    b = [4, 8, 12]
    assert usable(b, 12, {4, 8, 12}) == 12
    assert usable(b, 12, {4, 6, 8, 12}) == 4, "the KV cut at 6 where this layout does not: chunk [4, 8) differs"
    assert usable(b, 12, {8, 12}) == 0


def test_turn_break_token_from_the_common_tail_of_two_renders():
    control = {2, 105, 106, 128006, 128007, 128009}.__contains__
    blank = {10, 11}.__contains__  # "\n", "\n\n"
    # gemma: <bos> <start_of_turn> user \n MSG <end_of_turn> \n <start_of_turn> model \n
    gemma_a, gemma_b = [2, 105, 50, 10, 7, 106, 10, 105, 51, 10], [2, 105, 50, 10, 8, 9, 106, 10, 105, 51, 10]
    assert turn_break_token(gemma_a, gemma_b, control, blank) == 105
    # llama 3: <|start_header_id|> user <|end_header_id|> MSG <|eot_id|> <|start_header_id|> assistant <|e_h|>
    l3_a = [128006, 60, 128007, 7, 128009, 128006, 61, 128007, 10]
    l3_b = [128006, 60, 128007, 8, 9, 128009, 128006, 61, 128007, 10]
    assert turn_break_token(l3_a, l3_b, control, blank) == 128006
    # a transcript: preamble User : MSG \n Assistant :
    tr_a, tr_b = [2, 40, 41, 70, 71, 7, 10, 80, 71], [2, 40, 41, 70, 71, 8, 9, 10, 80, 71]
    assert turn_break_token(tr_a, tr_b, control, blank) == 80
    assert turn_break_token([2, 7], [2, 8], control, blank) is None  # nothing after the message
    assert turn_break_token([], [], control, blank) is None


def test_answer_end_token_is_the_user_turn_opener_only_where_the_break_does_not_open_it():
    control = {2, 105, 106, 128006, 128009, 3}.__contains__
    blank = {10, 11}.__contains__
    # a transcript: ... Assistant : ANSWER \n\n User : MSG \n Assistant :   (answer ends at 4, MSG at 8)
    tr = [2, 80, 71, 7, 11, 70, 71, 12, 9, 10, 80, 71]
    assert answer_end_token(tr, 4, 8, {80}, control, blank) == 70
    # gemma: ... ANSWER <end_of_turn> \n <start_of_turn> user \n MSG ...: <start_of_turn> opens every turn
    gemma = [2, 105, 51, 10, 7, 106, 10, 105, 50, 10, 9]
    assert answer_end_token(gemma, 5, 10, {105}, control, blank) is None
    # a template whose user turn opens with a control token that is not the break (</s> [INST])
    mistral = [2, 40, 7, 3, 41, 9]
    assert answer_end_token(mistral, 3, 5, {40}, control, blank) == 3
    assert answer_end_token(tr, 4, 4, {80}, control, blank) is None  # nothing between: no closer
    assert answer_end_token([7, 10, 11, 9], 1, 3, {80}, control, blank) is None  # blank only


def test_a_cut_after_the_answer_lets_the_next_turn_reuse_the_answer_laid_out_again():
    # turn 1 prompt: U(70) q q A(80) :   -> answer x x, then the next turn U q A :
    brk = {80, 70}
    p1 = [2, 70, 5, 6, 80, 71]
    settled = [2, 70, 5, 6, 80, 71, 8, 8, 11]  # ... Assistant: answer \n\n  (the next user turn opens after)
    p2 = settled + [70, 5, 80, 71]
    b1, b2 = layout_bounds(p1, 4, brk), layout_bounds(p2, 4, brk)
    assert 4 in b1 and 4 in b2  # the answer's turn opens at a cut in both
    kv = {b for b in layout_bounds(settled + [70], 4, brk) if b <= len(settled)}  # the idle re-prefill's cuts
    assert len(settled) in b2 and usable(b2, len(settled), kv) == len(settled)


def test_reuse_goes_into_a_chunk_only_when_both_batches_are_big():
    """``usable_within``: past the last shared cut c, the KV's chunk [c, e) and the prompt's [c, b) both hold at
    least ``rows`` tokens: reuse up to the largest c + 4k <= min(n, the KV batch's 4-row part, b - rows), so the
    rest of the prompt's chunk is one big batch with a cold prefill's tail of (size mod 4) tokens; else c."""
    from app.engine.local.layout import usable_within

    prompt = [256, 512, 768, 899]  # the new prompt's layout (its last chunk ends at L - 1 = 899)
    have = {256, 512, 700}  # the KV: the previous prompt ended a chunk at 700 (its L - 1)
    assert usable_within(prompt, 700, have, 0) == 512  # no probe: chunk ends only
    assert usable_within(prompt, 700, have, 64) == 700  # [512, 700) and [512, 768): both big, 188 = 47 * 4
    assert usable_within(prompt, 701, {256, 512, 701}, 64) == 700  # the KV batch's last token went apart
    assert usable_within(prompt, 703, {256, 512, 710}, 64) == 700  # m - c stays a multiple of 4
    assert usable_within(prompt, 740, {256, 512, 760}, 64) == 768 - 64  # the prompt's batch keeps 64 tokens
    assert usable_within(prompt, 700, {256, 512, 560}, 64) == 512  # the KV's chunk [512, 560) is small
    assert usable_within([256, 512, 540], 700, have, 64) == 512  # the prompt's chunk [512, 540) is small
    assert usable_within(prompt, 600, have, 64) == 600  # the common prefix ends first
    assert usable_within(prompt, 700, {256, 300, 512}, 64) == 256  # cuts differ below: the base rule's answer
    assert usable_within([100, 400], 390, {300}, 64) == 36  # from token 0: [36, 100) is still 64 tokens


def test_short_prompts_prefilled_together_fit_one_batch():
    from types import SimpleNamespace

    from app.engine.local.runtime import short_groups

    def seqs(*lengths):  # prompts of these lengths; all but the last token go in together
        return [SimpleNamespace(tokens=[0] * n) for n in lengths]

    # 3 × 180 tokens would overflow a 256-token batch (the soak's NULL pointer): each goes alone (no group).
    assert short_groups(seqs(181, 181, 181), 256) == []
    a = seqs(101, 101, 101, 41, 11)
    assert short_groups(a, 256) == [a[:2], a[2:]]  # 200 | 100 + 40 + 10
    assert all(sum(len(s.tokens) - 1 for s in g) <= 256 for g in short_groups(seqs(*[60] * 9), 256))
    assert short_groups(seqs(11), 256) == []


def test_merged_end_joins_whole_chunks_that_each_keep_their_own_bits():
    """``merged_end``: consecutive chunks of 64+ tokens, 4-aligned but for the last, within one ubatch."""
    from app.engine.local.layout import merged_end

    bounds = layout_bounds(list(range(1300)), 256)  # cuts every 256, then L-1 = 1299 (a 20-token tail: L)
    assert bounds == [256, 512, 768, 1024, 1280, 1300]
    assert merged_end(bounds, 0, 1299, 64, 512) == 512  # two chunks: one 512-token ubatch
    assert merged_end(bounds, 0, 1299, 64, 1024) == 1024
    assert merged_end(bounds, 1024, 1299, 64, 1024) == 1280  # the chunk ending at L (20 tokens) stays alone
    assert merged_end(bounds, 1280, 1299, 64, 1024) == 1300
    assert merged_end(bounds, 0, 1299, 0, 1024) == 256  # not measured: one chunk per decode
    assert merged_end(bounds, 0, 1299, 64, 256) == 256  # one chunk fills the ubatch


def test_merged_end_stops_at_a_short_chunk_an_unaligned_one_or_the_last_token():
    from app.engine.local.layout import merged_end

    # a turn break cut at 100 (a 100-token chunk, 100 % 4 == 0), at 130 (30 tokens: too short to merge)
    assert merged_end([100, 356, 400], 0, 399, 64, 512) == 356
    assert merged_end([100, 130, 386], 0, 385, 64, 512) == 100
    assert merged_end([99, 355], 0, 354, 64, 512) == 99  # 99 tokens: its last 3 went through another kernel
    assert merged_end([99, 355], 0, 355, 64, 512) == 99
    assert merged_end([256, 400], 0, 399, 64, 512) == 256  # 400 = L: the chunk with the last token goes alone
    assert merged_end([256, 399], 0, 399, 64, 512) == 399  # 399 = L-1: the last token then goes alone
    assert merged_end([256, 512], 130, 600, 64, 512) == 256  # inside a chunk: 126 tokens, not 4-aligned
    assert merged_end([256, 512], 132, 600, 64, 512) == 512
