"""The Python check, interpreted, never ``eval``'d: ``check_expression`` parses it with ``ast`` against a
whitelist of nodes, names and string methods, and ``_Eval`` walks it, size-checking numbers and strings
*before* each operation, so ``9**9**9`` or ``'a'*10**9`` is refused rather than computed."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from app.engine.policies.checks import NO_ANSWER, Verdict
from app.engine.policies.extract import PARAM
from app.errors import InvalidRequest

MAX_EXPR_CHARS = 500
MAX_INT_BITS = 4096
MAX_STR_CHARS = 100_000


# The Python check: nodes, names, functions and string methods it may use.
_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
          ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.Compare, ast.Eq, ast.NotEq,
          ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.IfExp, ast.Constant, ast.Name, ast.Load,
          ast.Call, ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple, ast.List)
_FUNCS: dict[str, Any] = {"int": int, "float": float, "str": str, "len": len, "abs": abs, "round": round,
                          "min": min, "max": max, "bool": bool}
_METHODS = frozenset({"startswith", "endswith", "isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum",
                      "isspace", "islower", "isupper", "strip", "lstrip", "rstrip", "lower", "upper", "casefold",
                      "count", "find", "rfind", "split", "rsplit", "splitlines"})
_VARIABLES = ("answer", "text")
_VALUES = (int, float, str, bool, list, tuple, type(None))


class _Unsafe(ValueError):
    pass


def check_expression(source: Any, param: str) -> ast.Expression:
    """Parse a Python check or raise ``InvalidRequest(param=param)``: at most ``MAX_EXPR_CHARS`` characters,
    one expression, only whitelisted nodes; names only ``answer``, ``text`` and the functions
    ``int float str len abs round min max bool`` (called, never passed); attributes only the string methods
    in ``_METHODS``, called; no keyword arguments, no ``*args``."""
    if not isinstance(source, str) or not source.strip():
        raise InvalidRequest(f"verifier.python must be a non-empty expression, got {source!r}", param=param)
    if len(source) > MAX_EXPR_CHARS:
        raise InvalidRequest(f"verifier.python is {len(source)} characters; at most {MAX_EXPR_CHARS}", param=param)
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise InvalidRequest(f"verifier.python is not a Python expression: {exc}", param=param) from None
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        problem = _node_problem(node, id(node) in called)
        if problem:
            raise InvalidRequest(f"verifier.python: {problem}", param=param)
    return tree


def _node_problem(node: ast.AST, called: bool) -> str | None:
    if not isinstance(node, _NODES):
        return f"{type(node).__name__} is not allowed"
    if isinstance(node, ast.Name) and node.id not in _VARIABLES and not (called and node.id in _FUNCS):
        return (f"the name {node.id!r} is not allowed here (use answer, text, and call {', '.join(_FUNCS)})")
    if isinstance(node, ast.Attribute) and (node.attr not in _METHODS or not called):
        return (f"the attribute {node.attr!r} is not allowed (call a string method: "
                f"{', '.join(sorted(_METHODS))})")
    if isinstance(node, ast.Call):
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            return "keyword and * arguments are not allowed"
        if not (isinstance(node.func, ast.Name) and node.func.id in _FUNCS or isinstance(node.func, ast.Attribute)):
            return "only the allowed functions and string methods may be called"
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool, type(None))):
        return f"the constant {node.value!r} is not allowed"
    return None


@dataclass(frozen=True)
class PythonCheck:
    """``{"python": "int(answer) % 2 == 0"}``: accepted iff the expression is true for ``answer`` (str) and
    ``text`` (str). Evaluated by ``_Eval``, never ``eval`` (module docstring). A candidate without an answer
    is rejected when the expression uses ``answer``; any error (``int('x')``, a too-large number) rejects."""

    source: str

    def verify(self, answer: str | None, text: str) -> Verdict:
        tree = check_expression(self.source, PARAM + ".verifier")
        uses_answer = any(isinstance(n, ast.Name) and n.id == "answer" for n in ast.walk(tree))
        if answer is None and uses_answer:
            return NO_ANSWER
        value = _Eval({"answer": answer, "text": text}).run(tree.body)
        return Verdict(True, "the python check is true") if value else Verdict(False, "the python check is false")

    def to_api(self) -> dict:
        return {"python": self.source}


class _Eval:
    """A tiny evaluator for checked expressions. Every value is a plain int, float, str, bool, None, list or
    tuple; ints stay under ``MAX_INT_BITS`` bits and strings under ``MAX_STR_CHARS`` characters, checked before
    the operation that would make them (so nothing large is ever computed)."""

    def __init__(self, names: dict[str, Any]) -> None:
        self.names = names

    def run(self, node: ast.AST) -> Any:
        value = getattr(self, "_" + type(node).__name__)(node)
        if not isinstance(value, _VALUES):
            raise _Unsafe(f"a value of type {type(value).__name__} is not allowed")
        if isinstance(value, str) and len(value) > MAX_STR_CHARS:
            raise _Unsafe(f"a string over {MAX_STR_CHARS} characters")
        return value

    def _Constant(self, node: ast.Constant) -> Any:
        return node.value

    def _Name(self, node: ast.Name) -> Any:
        if node.id not in self.names:
            raise _Unsafe(f"{node.id} can only be called")
        return self.names[node.id]

    def _Tuple(self, node: ast.Tuple) -> Any:
        return tuple(self.run(e) for e in node.elts)

    def _List(self, node: ast.List) -> Any:
        return [self.run(e) for e in node.elts]

    def _BoolOp(self, node: ast.BoolOp) -> Any:
        value: Any = None
        for operand in node.values:
            value = self.run(operand)
            if isinstance(node.op, ast.And) != bool(value):  # short-circuit as Python does
                return value
        return value

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.run(node.operand)
        if isinstance(node.op, ast.Not):
            return not value
        _need_number(value)
        return -value if isinstance(node.op, ast.USub) else +value

    def _IfExp(self, node: ast.IfExp) -> Any:
        return self.run(node.body) if self.run(node.test) else self.run(node.orelse)

    def _Compare(self, node: ast.Compare) -> Any:
        left = self.run(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = self.run(right_node)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _BinOp(self, node: ast.BinOp) -> Any:
        return _binop(node.op, self.run(node.left), self.run(node.right))

    def _Subscript(self, node: ast.Subscript) -> Any:
        target = self.run(node.value)
        if not isinstance(target, (str, list, tuple)):
            raise _Unsafe("only strings and lists can be indexed")
        index = self._Slice(node.slice) if isinstance(node.slice, ast.Slice) else self.run(node.slice)
        return target[index]

    def _Slice(self, node: ast.Slice) -> Any:
        parts = [self.run(p) if p is not None else None for p in (node.lower, node.upper, node.step)]
        if any(p is not None and (not isinstance(p, int) or isinstance(p, bool)) for p in parts):
            raise _Unsafe("slice bounds must be integers")
        return slice(*parts)

    def _Call(self, node: ast.Call) -> Any:
        args = [self.run(a) for a in node.args]
        if len(args) > 3:
            raise _Unsafe("at most 3 arguments")
        if isinstance(node.func, ast.Attribute):
            target = self.run(node.func.value)
            if type(target) is not str or node.func.attr not in _METHODS:
                raise _Unsafe(f".{node.func.attr}() is only allowed on strings")
            return getattr(target, node.func.attr)(*args)
        name = node.func.id  # check_expression allowed only _FUNCS here
        if name == "round" and len(args) > 1 and not (isinstance(args[1], int) and abs(args[1]) <= 64):
            raise _Unsafe("round()'s digits must be an integer from -64 to 64")  # round(n, -10**9): 10**10**9
        return _FUNCS[name](*args)


def _need_number(*values: Any) -> None:
    for v in values:
        if not isinstance(v, (int, float)):
            raise _Unsafe(f"arithmetic needs numbers, got {type(v).__name__}")


def _binop(op: ast.operator, a: Any, b: Any) -> Any:
    if isinstance(op, ast.Add) and isinstance(a, str) and isinstance(b, str):
        return a + b
    if isinstance(op, ast.Mult) and (isinstance(a, str) or isinstance(b, str)):
        text, times = (a, b) if isinstance(a, str) else (b, a)
        if not isinstance(times, int) or isinstance(times, bool) or len(text) * max(times, 0) > MAX_STR_CHARS:
            raise _Unsafe(f"a repeated string must stay under {MAX_STR_CHARS} characters")
        return text * times
    _need_number(a, b)
    if isinstance(a, int) and isinstance(b, int):
        _check_int_growth(op, a, b)
    result = _ARITH[type(op)](a, b)
    if isinstance(result, complex):
        raise _Unsafe("a complex result")
    return result


def _check_int_growth(op: ast.operator, a: int, b: int) -> None:
    bits = abs(a).bit_length()
    if isinstance(op, ast.Pow) and b > 0 and bits > 1 and b * bits > MAX_INT_BITS:
        raise _Unsafe(f"{a} ** {b} would have more than {MAX_INT_BITS} bits")
    if isinstance(op, ast.Mult) and bits + abs(b).bit_length() > MAX_INT_BITS:
        raise _Unsafe(f"a product over {MAX_INT_BITS} bits")


_ARITH: dict[type, Any] = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
                           ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
                           ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
                           ast.Pow: lambda a, b: a ** b}
_COMPARE: dict[type, Any] = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
                             ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
                             ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
                             ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
