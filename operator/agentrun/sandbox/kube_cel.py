"""A small, safe subset of CEL for ``x-kubernetes-validations`` rules.

CRDs put immutability and transition checks into CEL (``self == oldSelf``,
``!has(oldSelf.startedAt) || self.task == oldSelf.task``). Running those rules in the emulator catches
an operator that writes what a real server would refuse. Nothing here evaluates Python: rules are parsed
into a small tree and interpreted.

Supported: literals (int, float, string, bool, null, lists), ``self`` / ``oldSelf``, field selection,
indexing, ``has()``, ``size()``, the string methods ``startsWith``, ``endsWith``, ``contains``,
``matches``, the operators ``! - * / % + == != < <= > >= in && || ?:`` and parentheses.
Anything else (macros such as ``all``/``exists``, map literals, other functions, ``messageExpression``)
raises :class:`CelUnsupported` at compile time; the caller ignores such rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_MISSING: Any = object()


class CelUnsupported(ValueError):
    """The rule uses CEL outside the supported subset."""


class CelEvalError(ValueError):
    """Evaluation failed (missing key, type mismatch); CEL reports this as a failed rule."""


_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<float>\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)
      | (?P<int>\d+)u?
      | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op>==|!=|<=|>=|&&|\|\||[<>!+\-*/%?:.,()\[\]])
    )""",
    re.VERBOSE,
)

_FUNCTIONS = {"has", "size"}
_METHODS = {"size", "startsWith", "endsWith", "contains", "matches"}
_KEYWORDS = {"true": True, "false": False, "null": None}

Node = tuple[Any, ...]


def _tokenize(source: str) -> list[tuple[str, Any]]:
    tokens: list[tuple[str, Any]] = []
    pos = 0
    source = source.rstrip()
    while pos < len(source):
        match = _TOKEN_RE.match(source, pos)
        if match is None or match.end() == pos:
            raise CelUnsupported(f"unexpected character at {pos}: {source[pos : pos + 10]!r}")
        pos = match.end()
        kind = match.lastgroup
        text = match.group(kind) if kind else ""
        if kind == "float":
            tokens.append(("lit", float(text)))
        elif kind == "int":
            tokens.append(("lit", int(text)))
        elif kind == "string":
            body = text[1:-1]
            tokens.append(("lit", re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m[1], m[1]), body)))
        elif kind == "ident":
            tokens.append(("lit", _KEYWORDS[text]) if text in _KEYWORDS else ("ident", text))
        else:
            tokens.append(("op", text))
    tokens.append(("end", None))
    return tokens


class _Parser:
    def __init__(self, source: str) -> None:
        self.tokens = _tokenize(source)
        self.pos = 0

    def peek(self, value: str | None = None) -> bool:
        kind, text = self.tokens[self.pos]
        return kind == "op" and (value is None or text == value)

    def take(self, value: str) -> None:
        if not self.peek(value):
            raise CelUnsupported(f"expected {value!r} at token {self.pos}")
        self.pos += 1

    def parse(self) -> Node:
        node = self.ternary()
        if self.tokens[self.pos][0] != "end":
            raise CelUnsupported(f"unexpected token {self.tokens[self.pos][1]!r}")
        return node

    def ternary(self) -> Node:
        cond = self.binary(0)
        if self.peek("?"):
            self.take("?")
            then = self.ternary()
            self.take(":")
            return ("cond", cond, then, self.ternary())
        return cond

    _LEVELS: tuple[tuple[str, ...], ...] = (
        ("||",),
        ("&&",),
        ("==", "!=", "<", "<=", ">", ">=", "in"),
        ("+", "-"),
        ("*", "/", "%"),
    )

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        node = self.binary(level + 1)
        while True:
            kind, text = self.tokens[self.pos]
            is_in = kind == "ident" and text == "in" and "in" in self._LEVELS[level]
            if not is_in and not (kind == "op" and text in self._LEVELS[level]):
                return node
            self.pos += 1
            node = ("binop", text, node, self.binary(level + 1))

    def unary(self) -> Node:
        if self.peek("!") or self.peek("-"):
            op = self.tokens[self.pos][1]
            self.pos += 1
            return ("unop", op, self.unary())
        return self.postfix()

    def arguments(self) -> list[Node]:
        self.take("(")
        args: list[Node] = []
        while not self.peek(")"):
            args.append(self.ternary())
            if not self.peek(")"):
                self.take(",")
        self.take(")")
        return args

    def postfix(self) -> Node:
        node = self.primary()
        while True:
            if self.peek("."):
                self.take(".")
                kind, name = self.tokens[self.pos]
                if kind != "ident":
                    raise CelUnsupported("expected a field name after '.'")
                self.pos += 1
                if self.peek("("):
                    if name not in _METHODS:
                        raise CelUnsupported(f"unsupported method: {name}")
                    node = ("method", node, name, self.arguments())
                else:
                    node = ("select", node, name)
            elif self.peek("["):
                self.take("[")
                index = self.ternary()
                self.take("]")
                node = ("index", node, index)
            else:
                return node

    def primary(self) -> Node:
        kind, value = self.tokens[self.pos]
        if kind == "lit":
            self.pos += 1
            return ("lit", value)
        if kind == "ident":
            self.pos += 1
            if self.peek("("):
                if value not in _FUNCTIONS:
                    raise CelUnsupported(f"unsupported function: {value}")
                args = self.arguments()
                if value == "has" and (len(args) != 1 or args[0][0] != "select"):
                    raise CelUnsupported("has() needs a field selection")
                return ("call", value, args)
            if value not in ("self", "oldSelf"):
                raise CelUnsupported(f"unsupported identifier: {value}")
            return ("ident", value)
        if self.peek("("):
            self.take("(")
            node = self.ternary()
            self.take(")")
            return node
        if self.peek("["):
            self.take("[")
            items: list[Node] = []
            while not self.peek("]"):
                items.append(self.ternary())
                if not self.peek("]"):
                    self.take(",")
            self.take("]")
            return ("list", items)
        raise CelUnsupported(f"unexpected token {value!r}")


def _uses(node: Any, name: str) -> bool:
    if isinstance(node, tuple):
        if node[:2] == ("ident", name):
            return True
        return any(_uses(child, name) for child in node[1:])
    if isinstance(node, list):
        return any(_uses(child, name) for child in node)
    return False


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    if isinstance(a, str) != isinstance(b, str):
        return False
    return bool(a == b)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class CelRule:
    """A compiled rule; ``uses_old_self`` marks transition rules, checked only on updates."""

    source: str
    uses_old_self: bool
    _tree: Node

    def evaluate(self, value: Any, old_value: Any = _MISSING) -> bool:
        result = self._eval(self._tree, {"self": value, "oldSelf": old_value})
        if not isinstance(result, bool):
            raise CelEvalError(f"rule did not evaluate to a bool: {result!r}")
        return result

    def _eval(self, node: Node, env: dict[str, Any]) -> Any:
        kind = node[0]
        if kind == "lit":
            return node[1]
        if kind == "list":
            return [self._eval(item, env) for item in node[1]]
        if kind == "ident":
            value = env[node[1]]
            if value is _MISSING:
                raise CelEvalError(f"no such attribute: {node[1]}")
            return value
        if kind == "select":
            target = self._eval(node[1], env)
            if not isinstance(target, dict):
                raise CelEvalError(f"no such key: {node[2]}")
            if node[2] not in target:
                raise CelEvalError(f"no such key: {node[2]}")
            return target[node[2]]
        if kind == "index":
            target = self._eval(node[1], env)
            key = self._eval(node[2], env)
            if isinstance(target, list) and _number(key) and int(key) == key and 0 <= int(key) < len(target):
                return target[int(key)]
            if isinstance(target, dict) and isinstance(key, str) and key in target:
                return target[key]
            raise CelEvalError(f"no such key: {key!r}")
        if kind == "call":
            name, args = node[1], node[2]
            if name == "has":
                target = self._eval(args[0][1], env)
                return isinstance(target, dict) and args[0][2] in target
            return self._size(self._eval(args[0], env))
        if kind == "method":
            target = self._eval(node[1], env)
            args = [self._eval(arg, env) for arg in node[3]]
            return self._method(target, node[2], args)
        if kind == "unop":
            operand = self._eval(node[2], env)
            if node[1] == "!":
                if not isinstance(operand, bool):
                    raise CelEvalError("no such overload: !_")
                return not operand
            if not _number(operand):
                raise CelEvalError("no such overload: -_")
            return -operand
        if kind == "cond":
            cond = self._eval(node[1], env)
            if not isinstance(cond, bool):
                raise CelEvalError("no such overload: _?_:_")
            return self._eval(node[2] if cond else node[3], env)
        if kind == "binop":
            return self._binop(node[1], node[2], node[3], env)
        raise AssertionError(kind)  # pragma: no cover

    def _logical(self, op: str, left: Node, right: Node, env: dict[str, Any]) -> bool:
        # CEL's && and || are commutative about errors: a decisive side wins even if the other errs.
        decisive = op == "||"
        values: list[bool] = []
        error: CelEvalError | None = None
        for side in (left, right):
            try:
                value = self._eval(side, env)
            except CelEvalError as exc:
                error = exc
                continue
            if not isinstance(value, bool):
                error = CelEvalError(f"no such overload: _{op}_")
                continue
            if value is decisive:
                return decisive
            values.append(value)
        if error is not None:
            raise error
        return not decisive

    def _binop(self, op: str, left: Node, right: Node, env: dict[str, Any]) -> Any:
        if op in ("&&", "||"):
            return self._logical(op, left, right, env)
        a = self._eval(left, env)
        b = self._eval(right, env)
        if op == "==":
            return _equal(a, b)
        if op == "!=":
            return not _equal(a, b)
        if op == "in":
            if isinstance(b, list):
                return any(_equal(a, item) for item in b)
            if isinstance(b, dict):
                return a in b
            raise CelEvalError("no such overload: _in_")
        comparable = (_number(a) and _number(b)) or (isinstance(a, str) and isinstance(b, str))
        if op in ("<", "<=", ">", ">="):
            if not comparable:
                raise CelEvalError(f"no such overload: _{op}_")
            return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
        if op == "+" and (comparable or (isinstance(a, list) and isinstance(b, list))):
            return a + b
        if _number(a) and _number(b):
            if op == "-":
                return a - b
            if op == "*":
                return a * b
            if b == 0 and op in ("/", "%"):
                raise CelEvalError("division by zero")
            if op == "/":
                return a // b if isinstance(a, int) and isinstance(b, int) else a / b
            if op == "%":
                return a % b
        raise CelEvalError(f"no such overload: _{op}_")

    @staticmethod
    def _size(value: Any) -> int:
        if isinstance(value, str | list | dict):
            return len(value)
        raise CelEvalError("no such overload: size")

    def _method(self, target: Any, name: str, args: list[Any]) -> Any:
        if name == "size" and not args:
            return self._size(target)
        if isinstance(target, str) and len(args) == 1 and isinstance(args[0], str):
            if name == "startsWith":
                return target.startswith(args[0])
            if name == "endsWith":
                return target.endswith(args[0])
            if name == "contains":
                return args[0] in target
            if name == "matches":
                return re.search(args[0], target) is not None
        raise CelEvalError(f"no such overload: {name}")


def compile_rule(source: str) -> CelRule:
    """Parse ``source``; raises :class:`CelUnsupported` for anything outside the subset."""
    tree = _Parser(source).parse()
    return CelRule(source=source, uses_old_self=_uses(tree, "oldSelf"), _tree=tree)
