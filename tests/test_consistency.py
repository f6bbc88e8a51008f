"""Self-consistency and verification (app.engine.policies: consistency, extract, checks, vote, ...) and the
arithmetic set (benchmarks.reasoning_items): pure and fast, no model."""

from __future__ import annotations

import os
import pickle
import re
import sys
import time

import pytest

from app.engine.policies import checks, extract, safe_eval
from app.engine.policies.checks import Verdict
from app.engine.policies.consistency import parse_self_consistency, parse_verifier, sample_seeds, verify_safely
from app.engine.policies.extract import canonical_number, parse_extractor
from app.engine.policies.regex_gate import MAX_SCAN_CHARS, REGEX_STEP_BUDGET, regex_gate
from app.engine.policies.vote import BudgetPoint, Candidate, cost_per_accepted, judge, marginal_gains, vote
from app.errors import InvalidRequest
from benchmarks import reasoning_items as ri

P = "hearth.self_consistency"


def ext(raw):
    return parse_extractor(raw)


def ver(raw, **kw):
    return parse_verifier(raw, allow_command=kw.pop("allow_command", False))


# --- numbers and last_number -----------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("3 boxes of 4 apples is 12. 12 - 2 = 10. The answer is 10.", "10"),
    ("The total is 1,234 dollars.", "1234"),
    ("It costs $1,234.50 in all", "1234.5"),
    ("x = -3.50", "-3.5"),
    ("x = \u22127", "-7"),
    ("so +4.000 it is", "4"),
    ("three quarters: 3/4", "0.75"),
    ("6/8 of the cake", "0.75"),
    ("2/6 are left", "1/3"),
    ("4/2 = two", "2"),
    ("we divide 5/0 here", "5/0"),
    ("answer: 007", "7"),
    ("-0", "0"),
    ("10 - 3 = 7, not 5-3", "3"),
    ("version v1.2 of H2O", None),
    ("no digits here.", None),
    ("", None),
    ("It weighs 5kg", "5"),
])
def test_last_number_reads_realistic_answers(text, expected):
    assert ext("last_number").extract(text) == expected


def test_last_number_takes_the_last_of_several_and_keeps_long_numbers_as_written():
    assert ext("last_number").extract("Step 1: 3 * 4 = 12\nStep 2: 12 - 2 = 10\nSo 10 apples.\n") == "10"
    assert canonical_number("", "1" * 70) == "1" * 70
    assert extract.numbers_in("3 boxes of 1,200.50 and 7") == ["3", "1200.5", "7"]
    assert canonical_number("-", "0", "125") == "-0.125"


def test_final_line_is_the_last_non_empty_line_stripped():
    e = ext("final_line")
    assert e.extract("Thinking...\n  Paris  \n\n  \n") == "Paris"
    assert e.extract("\n \n") is None
    assert e.extract("one line") == "one line"


# --- regex extractor and the regex gate --------------------------------------------------------------------

def test_regex_extractor_takes_the_group_of_the_last_match():
    e = ext({"regex": r"The answer is (-?\d+)", "group": 1})
    assert e.extract("The answer is 3. Wait, no. The answer is 5.") == "5"
    assert e.extract("I do not know.") is None
    named = ext({"regex": r"ANSWER:\s*(?P<a>\w+)", "group": "a"})
    assert named.extract("ANSWER: yes\nANSWER:  no ") == "no"
    assert ext({"regex": r"\d+"}).extract("1 and 22") == "22"  # no group: the whole match
    optional = ext({"regex": r"x(\d)?"})
    assert optional.extract("x") is None  # the group did not take part


@pytest.mark.parametrize("pattern, why", [
    ("(a+)+$", "backtrack"),
    (r"(\d{1,3},?)*x", "backtrack"),
    ("(ab|a)*c", "alternation"),
    (".*.*.*x", "unbounded"),
    ("a" * 201, "200"),
    ("(unclosed", "not a valid"),
    ("", "non-empty"),
])
def test_regex_gate_refuses_patterns_that_can_run_away(pattern, why):
    with pytest.raises(InvalidRequest) as err:
        parse_extractor({"regex": pattern})
    assert err.value.param == f"{P}.extract"
    assert why in str(err.value)


def test_regex_gate_allows_ordinary_patterns_and_budgets_the_window():
    _, one = regex_gate(r"The answer is (-?\d+)", "p")
    _, two = regex_gate(r".*.*x", "p")
    _, exact = regex_gate(r"(?:,\d{3})*", "p")  # an exact repeat inside a repeat is deterministic
    assert one.long == 1 and two.long == 2 and exact.long == 1
    assert one.choices == 2 and one.search_window > 3000 and 200 < two.search_window < 400
    assert regex_gate(r"(?:a|b)+x", "p")[1].long == 1  # single characters become one set, not alternation
    assert regex_gate(r"\d{1,3}(yes|no)", "p")[1].choices == 3 * 2
    assert regex_gate(r"\d{3}", "p")[1].long == 0
    assert regex_gate(r"a{100}", "p")[1].long == 1 and regex_gate(r"(?:a{16}){16}", "p")[1].long == 1
    with pytest.raises(InvalidRequest):
        regex_gate(r"(?:(?:a{16}){16}){16}.*.*", "p")


def _best_of(runs: int, fn) -> float:
    """The least time ``fn()`` took over ``runs`` runs (the run least disturbed by the rest of the machine)."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def test_worst_allowed_regex_stays_within_its_step_budget():
    """The worst patterns the gate lets through, on the worst text: the cost model's steps c·W^(d+1) stay
    within REGEX_STEP_BUDGET, only the last ``search_window`` characters are read, so the work does not grow
    with the text: 100,000 characters cost what the window alone costs (a ratio in this run, not a clock)."""
    for pattern in (r".*.*x", r"a*a*x", r"\d{1,16}.*x", r"(?:(?:a{16}){16}){16}.*x", r"a{9999}"):
        e = ext({"regex": pattern})
        b = e.budget
        assert b.choices * b.search_window ** (b.long + 1) <= REGEX_STEP_BUDGET, (pattern, b)
        assert b.search_window <= MAX_SCAN_CHARS
        window, whole = "a" * b.search_window, "a" * 100_000
        assert e.extract(whole) is None and e.extract(window) is None
        windowed = _best_of(3, lambda: [e.extract(window) for _ in range(4)])
        hostile = _best_of(3, lambda: [e.extract(whole) for _ in range(4)])  # 4 of a whole vote's 16
        assert hostile < 4 * windowed + 0.05, (pattern, hostile, windowed)


def test_bad_group_names_the_extract_param():
    for raw in ({"regex": r"(\d)", "group": 2}, {"regex": r"(\d)", "group": "nope"},
                {"regex": r"(\d)", "group": True}, {"regex": r"\d", "flags": "i"}):
        with pytest.raises(InvalidRequest) as err:
            parse_extractor(raw)
        assert err.value.param == f"{P}.extract"


# --- json_field ----------------------------------------------------------------------------------------

def test_json_field_reads_the_last_top_level_object():
    e = ext({"json_field": "result.value"})
    text = ('First try: {"result": {"value": 1}}\nBetter:\n```json\n{"result": {"value": 42, "unit": "m"}, '
            '"note": {"result": {"value": 7}}}\n```\nDone.')
    assert e.extract(text) == "42"
    assert ext({"json_field": "items.1"}).extract('{"items": ["a", "b"]}') == "b"
    assert ext({"json_field": "ok"}).extract('{"ok": true}') == "true"
    assert ext({"json_field": "x"}).extract('{"x": 4.0}') == "4"
    assert ext({"json_field": "x"}).extract('{"x": {"b": 1, "a": [2]}}') == '{"a":[2],"b":1}'
    assert ext({"json_field": "x"}).extract('[{"x": 1}, {"x": 2}]') == "2"  # objects inside a list count


@pytest.mark.parametrize("text", ['{"x": null}', '{"y": 1}', "no json", '{"x": ', "{" * 5000, '{"a": ' * 3000])
def test_json_field_without_a_value_is_no_answer(text):
    assert ext({"json_field": "x"}).extract(text) is None


def test_json_field_path_is_validated():
    for raw in ({"json_field": ""}, {"json_field": "a..b"}, {"json_field": 3}, {"json_field": ".".join("a" * 17)}):
        with pytest.raises(InvalidRequest) as err:
            parse_extractor(raw)
        assert err.value.param == f"{P}.extract"


# --- verifiers -------------------------------------------------------------------------------------------

def test_regex_verifier_full_matches_the_answer_or_the_text():
    v = ver({"regex": r"\d+"})
    assert v.verify("42", "The answer is 42.").accepted
    assert not v.verify("42a", "").accepted
    assert v.verify(None, "text") == checks.NO_ANSWER
    on_text = ver({"regex": r"(?s).*The answer is \d+\.", "on": "text"})
    assert on_text.verify(None, "blah\nThe answer is 4.").accepted
    assert not on_text.verify(None, "The answer is 4. Or 5").accepted
    long_text = ver({"regex": r".*.*x", "on": "text"}).verify(None, "a" * 10_000)
    assert not long_text.accepted and "longer than" in long_text.reason


def test_json_schema_verifier_validates_the_answer_or_the_texts_object():
    schema = {"type": "integer", "minimum": 0}
    v = ver({"json_schema": schema})
    assert v.verify("12", "").accepted
    bad = v.verify("-1", "")
    assert not bad.accepted and "minimum" in bad.reason
    assert not v.verify("twelve", "").accepted  # not JSON: checked as the string "twelve"
    obj = ver({"json_schema": {"type": "object", "required": ["a"]}, "on": "text"})
    assert obj.verify(None, 'ok {"a": 1} done').accepted
    assert "no JSON object" in obj.verify(None, "none").reason
    with pytest.raises(InvalidRequest) as err:
        parse_verifier({"json_schema": {"type": "nope"}})
    assert err.value.param == f"{P}.verifier"
    with pytest.raises(InvalidRequest):
        parse_verifier({"json_schema": {"$ref": "https://example.com/s.json"}})
    with pytest.raises(InvalidRequest, match="backtrack"):
        parse_verifier({"json_schema": {"type": "string", "pattern": "^(a+)+$"}})


@pytest.mark.parametrize("expr, answer, accepted", [
    ("int(answer) % 2 == 0", "12", True),
    ("int(answer) % 2 == 0", "13", False),
    ("answer.isdigit() and len(answer) < 4", "123", True),
    ("answer.strip().lower() in ('yes', 'no')", " Yes ", True),
    ("abs(float(answer) - 3.14) < 0.01", "3.1416", True),
    ("text.endswith('.') and 'answer' in text", "7", True),
    ("answer[-1] == '2' and answer[:1] == '1'", "12", True),
    ("round(float(answer)) == 4 if answer else False", "3.6", True),
    ("len(text.split()) > 100", "1", False),
    ("2 ** 100 > 10 ** 30", "1", True),
    ("max(int(answer), 5) == 5", "3", True),
])
def test_python_verifier_evaluates_whitelisted_expressions(expr, answer, accepted):
    text = "So the answer is 7."
    assert verify_safely(ver({"python": expr}), answer, text).accepted is accepted


@pytest.mark.parametrize("expr", [
    "__import__('os').system('true')",
    "answer.__class__.__mro__[1].__subclasses__()",
    "().__class__",
    "getattr(answer, 'upper')()",
    "open('/etc/passwd')",
    "eval('1')",
    "[x for x in text]",
    "(lambda: 1)()",
    "answer.format(1)",
    "answer.isdigit",
    "answer.split()[0].upper().__len__() == 5",
    "len",
    "int(answer, base=2)",
    "f'{answer}'",
    "(y := 1)",
    "x + 1",
    "1 " * 300,
    "a" * 501,
    "",
])
def test_python_sandbox_refuses_escapes_at_parse_time(expr):
    with pytest.raises(InvalidRequest) as err:
        parse_verifier({"python": expr})
    assert err.value.param == f"{P}.verifier"


@pytest.mark.parametrize("expr,why", [
    ("9**9**9 > 0", "would have more than 4096 bits"),
    ("2 ** 10000 > 1", "would have more than 4096 bits"),
    ("int(answer) ** int(answer) > 0", "would have more than 4096 bits"),
    ("len('a' * 10**9) > 0", "a repeated string must stay under"),
    ("len(text * 1000000) > 0", "a repeated string must stay under"),
    ("(2 ** 4000) * (2 ** 4000) > 0", "2 ** 4000 would have more than 4096 bits"),
    ("(-8) ** 0.5 == 0", "a complex result"),
    ("2.0 ** 100000 > 0", "OverflowError"),
    ("int('x') == 1", "ValueError"),
    ("1 / 0 == 1", "ZeroDivisionError"),
    ("'a' < 1", "TypeError"),
    ("'%s' % answer == 'x'", "arithmetic needs numbers"),
    ("[1] * 5 == [1]", "arithmetic needs numbers"),
    ("round(10 ** 100, -10 ** 9) == 0", "round()'s digits must be an integer"),
])
def test_python_sandbox_bounds_evaluation_and_rejects_errors(expr, why, monkeypatch):
    """Each is refused by the check that guards it, before the large value would exist: every value the
    evaluator produced stays under the sandbox's limits (counted, not timed)."""
    made: list = []  # what every operation and call returned, before the evaluator's own size check

    def recording(method):
        def op(self, node):
            value = method(self, node)
            made.append(value)
            return value
        return op

    for name in ("_BinOp", "_Call", "_UnaryOp"):
        monkeypatch.setattr(safe_eval._Eval, name, recording(getattr(safe_eval._Eval, name)))
    verdict = verify_safely(ver({"python": expr}), "99999", "some text")
    assert verdict.accepted is False and why in verdict.reason, verdict.reason
    assert all(v.bit_length() <= safe_eval.MAX_INT_BITS for v in made if isinstance(v, int))
    assert all(len(v) <= safe_eval.MAX_STR_CHARS for v in made if isinstance(v, (str, list, tuple)))


def test_python_verifier_without_answer():
    assert ver({"python": "answer == '1'"}).verify(None, "t") == checks.NO_ANSWER
    assert ver({"python": "'42' in text"}).verify(None, "it is 42").accepted


@pytest.mark.skipif(os.name != "posix", reason="process groups are POSIX")
def test_command_verifier_exit_code_stdin_and_cwd(tmp_path):
    code = ("import sys, os; s = sys.stdin.read(); print('got', s); "
            "sys.exit(0 if s == 'print(1)' and os.path.basename(os.getcwd()).startswith('hearth-verify-') else 3)")
    v = ver({"command": [sys.executable, "-c", code]}, allow_command=True)
    ok = v.verify("print(1)", "")
    assert ok.accepted and "got print(1)" in ok.reason
    bad = v.verify("print(2)", "")
    assert not bad.accepted and "exited 3" in bad.reason
    missing = ver({"command": ["/nonexistent/hearth-check"]}, allow_command=True).verify("x", "")
    assert not missing.accepted and "cannot run" in missing.reason


@pytest.mark.skipif(os.name != "posix", reason="process groups are POSIX")
def test_command_verifier_timeout_kills_the_process_group(tmp_path):
    marker = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; "
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    v = ver({"command": [sys.executable, "-c", code], "timeout_s": 1.0}, allow_command=True)
    verdict = v.verify("x", "")  # both processes sleep 60 s: it returns because the timeout fired and killed them
    assert not verdict.accepted and "timed out after 1 s (killed)" in verdict.reason, verdict.reason
    child = int(marker.read_text())
    for _ in range(50):  # the grandchild was killed with its group (give init a moment to reap it)
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if _is_zombie(child):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {child} outlived the timeout")


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_command_verifier_keeps_only_the_tail_of_a_flood():
    code = "import sys; sys.stdout.write('x' * 5_000_000 + 'END'); sys.exit(1)"
    verdict = ver({"command": [sys.executable, "-c", code]}, allow_command=True).verify("a", "")
    assert not verdict.accepted and verdict.reason.endswith("END") and len(verdict.reason) < 400


def test_command_verifier_is_refused_unless_allowed_and_validated():
    with pytest.raises(InvalidRequest, match="turned off") as err:
        parse_verifier({"command": ["true"]})
    assert err.value.param == f"{P}.verifier"
    for raw in ({"command": []}, {"command": "true"}, {"command": ["true"], "timeout_s": 0},
                {"command": ["true"], "timeout_s": 61}, {"command": [""]}, {"command": ["true"], "on": "x"}):
        with pytest.raises(InvalidRequest):
            parse_verifier(raw, allow_command=True)


def test_a_verifier_that_errors_is_a_rejection_not_an_exception():
    class Broken:
        def verify(self, answer, text):
            raise RuntimeError("boom")

    verdict = verify_safely(Broken(), "1", "")
    assert verdict == Verdict(False, "the verifier failed: RuntimeError: boom")


# --- the vote --------------------------------------------------------------------------------------------

def C(answer, accepted=None, tokens=10, seconds=1.0):
    verdict = None if accepted is None else Verdict(accepted, "ok" if accepted else "no")
    return Candidate(f"... {answer}", answer, verdict, tokens, seconds)


def test_vote_majority_and_agreement():
    v = vote([C("7"), C("8"), C("7"), C(None), C("7")])
    assert (v.answer, v.pool, v.tie, v.no_answer, v.chosen_index) == ("7", "all", False, False, 0)
    assert v.counts == {"7": 3, "8": 1} and v.agreement == pytest.approx(3 / 4)
    assert (v.n, v.extractable, v.accepted) == (5, 4, 0)


def test_vote_tie_is_reported_and_broken_by_the_earliest_candidate():
    v = vote([C(None), C("8"), C("7"), C("7"), C("8")])
    assert v.tie and v.tied == ("8", "7") and v.answer == "8" and v.chosen_index == 1
    assert v.agreement == pytest.approx(0.5)


def test_vote_prefers_accepted_candidates():
    v = vote([C("7", False), C("7", False), C("7", False), C("9", True), C("8", False)])
    assert (v.answer, v.pool, v.chosen_index) == ("9", "accepted", 3)
    assert v.pool_counts == {"9": 1} and v.agreement == pytest.approx(1 / 5) and v.accepted == 1


def test_vote_with_none_accepted_falls_back_to_all_and_says_so():
    v = vote([C("7", False), C("8", False), C("8", False)])
    assert (v.answer, v.pool, v.chosen_index) == ("8", "unverified", 1)


def test_vote_no_extractable_answer():
    v = vote([C(None), C(None, True), C(None)])
    assert v.no_answer and v.answer is None and v.pool == "none" and v.chosen_index == 1
    assert vote([C(None)]).chosen_index == 0
    empty = vote([])
    assert empty.no_answer and empty.chosen_index is None
    assert set(v.to_api()) >= {"answer", "agreement", "counts", "tie", "no_answer", "chosen_index", "pool"}


def test_judge_extracts_and_verifies_each_sample():
    spec = parse_self_consistency({"n": 3, "extract": "last_number", "verifier": {"python": "int(answer) < 50"}})
    cands = [judge(spec, t, tokens=5, seconds=0.5) for t in ("It is 12.", "It is 80.", "No idea", "12 again")]
    assert [c.answer for c in cands] == ["12", "80", None, "12"]
    assert [c.accepted for c in cands] == [True, False, False, True]
    assert vote(cands).answer == "12"


# --- the spec --------------------------------------------------------------------------------------------

def test_spec_parses_and_round_trips():
    raw = {"n": 5, "extract": {"regex": r"answer is (\d+)", "group": 1},
           "verifier": {"regex": r"\d+", "on": "answer"}}
    spec = parse_self_consistency(raw)
    assert spec.n == 5 and spec.to_api() == raw
    assert parse_self_consistency(spec.to_api()) == spec
    assert pickle.loads(pickle.dumps(spec)) == spec
    default = parse_self_consistency({"n": 1})
    assert default.extract == extract.LastNumber() and default.verifier is None


@pytest.mark.parametrize("raw, param", [
    ([], P),
    ({"n": 3, "samples": 2}, f"{P}.samples"),
    ({}, f"{P}.n"),
    ({"n": 0}, f"{P}.n"),
    ({"n": 17}, f"{P}.n"),
    ({"n": True}, f"{P}.n"),
    ({"n": 2.0}, f"{P}.n"),
    ({"n": 3, "extract": "first_number"}, f"{P}.extract"),
    ({"n": 3, "extract": {"regex": "(a+)+"}}, f"{P}.extract"),
    ({"n": 3, "extract": {"regex": "a", "json_field": "b"}}, f"{P}.extract"),
    ({"n": 3, "verifier": "regex"}, f"{P}.verifier"),
    ({"n": 3, "verifier": {"regex": "a", "python": "True"}}, f"{P}.verifier"),
    ({"n": 3, "verifier": {"python": "True", "on": "text"}}, f"{P}.verifier"),
    ({"n": 3, "verifier": {"python": "__import__('os')"}}, f"{P}.verifier"),
])
def test_spec_errors_name_the_param(raw, param):
    with pytest.raises(InvalidRequest) as err:
        parse_self_consistency(raw)
    assert err.value.param == param
    assert pickle.loads(pickle.dumps(err.value)).param == param


def test_sample_seeds():
    assert sample_seeds(3, 2**32 - 1) == [2**32 - 1, 0, 1]
    assert sample_seeds(2, None) == [None, None]


# --- cost accounting -------------------------------------------------------------------------------------

def test_cost_per_accepted_counts_every_attempt():
    by_item = {"a": [C("1", True, 10, 1.0), C("2", False, 20, 2.0)],
               "b": [C("3", False, 30, 3.0)],
               "c": [C(None, False, 40, 4.0), C("4", True, 50, 5.0)]}
    cost = cost_per_accepted(by_item)
    assert (cost.items, cost.attempts, cost.tokens, cost.accepted) == (3, 5, 150, 2)
    assert cost.tokens_per_accepted == 75 and cost.seconds_per_accepted == pytest.approx(7.5)
    correct = cost_per_accepted(by_item, {"a": True, "b": False, "c": False})
    assert correct.accepted == 1 and correct.tokens_per_accepted == 150
    none = cost_per_accepted({"a": [C("1", False)]})
    assert none.accepted == 0 and none.tokens_per_accepted is None
    assert cost_per_accepted({"a": [C("1")]}).accepted == 1  # no verifier: an answer counts


def test_marginal_gains_per_budget_step():
    steps = marginal_gains([BudgetPoint(5, 0.5, 500, 5.0), BudgetPoint(1, 0.3, 100, 1.0),
                            BudgetPoint(3, 0.45, 300, 3.0), BudgetPoint(7, 0.5, 500, 5.0)])
    assert [(s.from_budget, s.to_budget) for s in steps] == [(1, 3), (3, 5), (5, 7)]
    assert steps[0].accuracy_gain == pytest.approx(0.15) and steps[0].gain_per_1k_tokens == pytest.approx(0.75)
    assert steps[0].gain_per_second == pytest.approx(0.075)
    assert steps[2].gain_per_1k_tokens is None
    with pytest.raises(ValueError):
        marginal_gains([BudgetPoint(1, 0, 0, 0), BudgetPoint(1, 1, 1, 1)])


# --- the arithmetic set ----------------------------------------------------------------------------------

RECOMPUTE = {
    "boxes_eat": lambda a, b, c: a * b - c, "buy_bags": lambda a, b, c: a + b * c,
    "give_friends": lambda a, b, c: a - b * c, "pages": lambda a, b, c: a * b + c,
    "share": lambda a, b, c: a // b + c, "wages": lambda a, b, c: a * b - c, "bag": lambda a, b, c: a + b - c,
    "change": lambda a, b, c: c - a * b, "seats": lambda a, b, c: a * b - c,
    "legs": lambda a, b, two, four: a * two + b * four,
}


def test_items_are_deterministic_distinct_and_cover_every_template():
    items = ri.generate_items(60, 14)
    assert items == ri.generate_items(60, 14) and list(ri.default_items()) == items
    assert items != ri.generate_items(60, 15)
    assert len({i.question for i in items}) == 60 and len({i.id for i in items}) == 60
    assert {i.kind for i in items} == set(ri.KINDS) == set(RECOMPUTE)
    assert items[0].question == "Tom has 6 boxes of 5 plums and eats 5. How many plums are left?"  # pinned
    assert len(ri.generate_items(200, 3)) == 200


def test_item_answers_are_right():
    for item in ri.generate_items(200, 7):
        numbers = tuple(int(x) for x in re.findall(r"\d+", item.question))
        assert numbers == item.operands, item
        kind = item.kind
        if kind == "share":
            assert numbers[0] % numbers[1] == 0, item
        assert RECOMPUTE[kind](*numbers) == item.answer, item
        assert 0 < item.answer < 100


def test_prompt_is_few_shot_and_the_worked_examples_agree_with_the_extractor():
    item = ri.default_items()[0]
    prompt = item.prompt()
    assert prompt.startswith(ri.FEW_SHOT) and prompt.endswith(f"Q: {item.question}\nA:")
    shots = re.findall(r"Q: (.*)\nA: (.*)\n", ri.FEW_SHOT)
    assert len(shots) == 3
    spec = parse_self_consistency({"n": 5, "extract": ri.EXTRACT, "verifier": ri.VERIFIER})
    assert [judge(spec, a).answer for _, a in shots] == ["7", "24", "8"]
    assert all(judge(spec, a).accepted for _, a in shots)
    assert not any(s in a for _, a in shots for s in ri.STOP)


def test_backreferences_are_refused_by_the_regex_gate():
    # (a*)(a*)\1\2b passed the repeat count and took 8 s on 4,400 characters (about W^3 steps, the GIL held).
    for pattern in (r"(a*)(a*)\1\2b", r"(\w)\1", r"(?P<x>a)(?P=x)"):
        with pytest.raises(InvalidRequest, match="backreference"):
            regex_gate(pattern, "hearth.self_consistency.verifier")


def test_a_json_field_segment_in_non_ascii_digits_is_a_key_not_an_index():
    got = extract.parse_extractor({"json_field": "a.²"}, "hearth.self_consistency.extract")
    assert got.extract('result {"a": [1, 2, 3]}') is None  # was a ValueError (int('²')) and a 500
    assert extract.parse_extractor({"json_field": "a.١"}, "x").extract('{"a": [1, 2]}') is None
