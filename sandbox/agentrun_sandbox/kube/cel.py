"""A small, safe subset of CEL for ``x-kubernetes-validations`` rules and admission policies.

CRDs put immutability and transition checks into CEL (``self == oldSelf``,
``!has(oldSelf.startedAt) || self.task == oldSelf.task``), and ValidatingAdmissionPolicies judge
requests with it (``object``, ``oldObject``, ``request``, ``variables``). Running those expressions in
the emulator catches an operator or a client that writes what a real server would refuse. Nothing
here evaluates Python: expressions are parsed into a small tree and interpreted.

Supported: literals (int, float, string, bool, null, lists), the caller's root identifiers
(``self`` / ``oldSelf`` for CRD rules), field selection, indexing, ``has()``, ``size()``, ``string()``,
the string methods ``startsWith``, ``endsWith``, ``contains``, ``matches``, the list method
``slice(start, end)`` (the Kubernetes lists extension, served since 1.34), the macros ``all``,
``exists``, ``exists_one``, ``filter`` and ``map`` (two-argument forms), the two-variable
comprehensions ``all(i, v, ...)`` and ``exists(i, v, ...)`` (Kubernetes 1.32+), the operators
``! - * / % + == != < <= > >= in && || ?:`` and parentheses. Errors follow CEL: ``&&``/``||`` and
``all``/``exists`` are commutative about them (a decisive operand wins over an error elsewhere).
Anything else (map literals, other functions, other two-variable comprehensions) raises
:class:`CelUnsupported` at compile time; callers decide what an unsupported expression means.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_MISSING: Any = object()


class CelUnsupported(ValueError):
    """The expression uses CEL outside the supported subset."""


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

_FUNCTIONS = {"has", "size", "string"}
_METHODS = {"size", "startsWith", "endsWith", "contains", "matches", "slice"}
_MACROS = {"all", "exists", "exists_one", "filter", "map"}
_KEYWORDS = {"true": True, "false": False, "null": None}
#: The root identifiers of ``x-kubernetes-validations`` rules.
RULE_ROOTS = frozenset({"self", "oldSelf"})

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
    def __init__(self, source: str, roots: frozenset[str]) -> None:
        self.tokens = _tokenize(source)
        self.pos = 0
        self.roots = roots
        self.bound: list[str] = []  # variables of the macros being parsed, innermost last

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

    def variable(self, name: str) -> str:
        kind, var = self.tokens[self.pos]
        if kind != "ident":
            raise CelUnsupported(f"{name}() needs variable names before its expression")
        self.pos += 1
        self.take(",")
        return str(var)

    def macro(self, target: Node, name: str) -> Node:
        """``target.name(var, body)``, or ``target.name(index, value, body)`` for ``all``/``exists``
        (two-variable comprehensions, Kubernetes 1.32+); the variables are bound only in the body."""
        self.take("(")
        names = [self.variable(name)]
        kind, _ = self.tokens[self.pos]
        if kind == "ident" and self.tokens[self.pos + 1] == ("op", ","):
            if name not in ("all", "exists"):
                raise CelUnsupported(f"only the two-argument form of {name}() is supported")
            names.append(self.variable(name))
        self.bound.extend(names)
        try:
            body = self.ternary()
        finally:
            del self.bound[-len(names) :]
        if not self.peek(")"):
            raise CelUnsupported(f"{name}() takes its variables and one expression")
        self.take(")")
        return ("macro", target, name, tuple(names), body)

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
                    if name in _MACROS:
                        node = self.macro(node, name)
                    elif name in _METHODS:
                        node = ("method", node, name, self.arguments())
                    else:
                        raise CelUnsupported(f"unsupported method: {name}")
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
                if len(args) != 1:
                    raise CelUnsupported(f"{value}() takes one argument")
                if value == "has" and args[0][0] != "select":
                    raise CelUnsupported("has() needs a field selection")
                return ("call", value, args)
            if value not in self.roots and value not in self.bound:
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
        if node[0] == "macro" and name in node[3]:
            return _uses(node[1], name)  # inside the body, `name` is the macro's own variable
        return any(_uses(child, name) for child in node[1:])
    if isinstance(node, list):
        return any(_uses(child, name) for child in node)
    return False


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping | list) or isinstance(b, Mapping | list):
        return False
    if isinstance(a, str) != isinstance(b, str):
        return False
    return bool(a == b)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class CelExpression:
    """A compiled expression over the caller's root identifiers (an admission policy's, for example)."""

    source: str
    _tree: Node

    def uses(self, name: str) -> bool:
        """Whether the expression reads the root identifier ``name``."""
        return _uses(self._tree, name)

    def evaluate(self, activation: Mapping[str, Any]) -> Any:
        """The value for ``activation`` (root identifier -> value; Mapping values may compute lazily)."""
        return _eval(self._tree, activation)


@dataclass(frozen=True)
class CelRule:
    """A compiled ``x-kubernetes-validations`` rule; ``uses_old_self`` marks transition rules."""

    source: str
    uses_old_self: bool
    _expression: CelExpression

    def evaluate(self, value: Any, old_value: Any = _MISSING) -> bool:
        result = self._expression.evaluate({"self": value, "oldSelf": old_value})
        if not isinstance(result, bool):
            raise CelEvalError(f"rule did not evaluate to a bool: {result!r}")
        return result


def _eval(node: Node, env: Mapping[str, Any]) -> Any:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "list":
        return [_eval(item, env) for item in node[1]]
    if kind == "ident":
        value = env.get(node[1], _MISSING)
        if value is _MISSING:
            raise CelEvalError(f"no such attribute: {node[1]}")
        return value
    if kind == "select":
        target = _eval(node[1], env)
        if not isinstance(target, Mapping) or node[2] not in target:
            raise CelEvalError(f"no such key: {node[2]}")
        return target[node[2]]
    if kind == "index":
        return _index(_eval(node[1], env), _eval(node[2], env))
    if kind == "call":
        return _call(node[1], node[2], env)
    if kind == "method":
        target = _eval(node[1], env)
        return _method(target, node[2], [_eval(arg, env) for arg in node[3]])
    if kind == "macro":
        return _macro(node, env)
    if kind == "unop":
        operand = _eval(node[2], env)
        if node[1] == "!":
            if not isinstance(operand, bool):
                raise CelEvalError("no such overload: !_")
            return not operand
        if not _number(operand):
            raise CelEvalError("no such overload: -_")
        return -operand
    if kind == "cond":
        cond = _eval(node[1], env)
        if not isinstance(cond, bool):
            raise CelEvalError("no such overload: _?_:_")
        return _eval(node[2] if cond else node[3], env)
    if kind == "binop":
        return _binop(node[1], node[2], node[3], env)
    raise AssertionError(kind)  # pragma: no cover


def _index(target: Any, key: Any) -> Any:
    if isinstance(target, list) and _number(key) and int(key) == key:
        if 0 <= int(key) < len(target):
            return target[int(key)]
        raise CelEvalError(f"index out of bounds: {key}")
    if isinstance(target, Mapping) and isinstance(key, str) and key in target:
        return target[key]
    raise CelEvalError(f"no such key: {key!r}")


def _call(name: str, args: list[Node], env: Mapping[str, Any]) -> Any:
    if name == "has":
        target = _eval(args[0][1], env)
        return isinstance(target, Mapping) and args[0][2] in target
    value = _eval(args[0], env)
    if name == "size":
        return _size(value)
    # string(): the conversions a message needs, rendered as CEL renders them.
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if _number(value):
        return repr(value) if isinstance(value, float) else str(value)
    raise CelEvalError("no such overload: string")


def _logical(op: str, left: Node, right: Node, env: Mapping[str, Any]) -> bool:
    # CEL's && and || are commutative about errors: a decisive side wins even if the other errs.
    decisive = op == "||"
    error: CelEvalError | None = None
    for side in (left, right):
        try:
            value = _eval(side, env)
        except CelEvalError as exc:
            error = exc
            continue
        if not isinstance(value, bool):
            error = CelEvalError(f"no such overload: _{op}_")
            continue
        if value is decisive:
            return decisive
    if error is not None:
        raise error
    return not decisive


def _macro(node: Node, env: Mapping[str, Any]) -> Any:
    _, target_node, name, names, body = node
    target = _eval(target_node, env)
    # One variable: list elements, or a map's keys. Two: (index, element), or (key, value).
    if isinstance(target, list):
        items: list[Any] = list(enumerate(target)) if len(names) == 2 else list(target)
    elif isinstance(target, Mapping):
        items = list(target.items()) if len(names) == 2 else list(target.keys())
    else:
        raise CelEvalError(f"no such overload: {name}")

    def run(item: Any) -> Any:
        bound = dict(zip(names, item, strict=True)) if len(names) == 2 else {names[0]: item}
        return _eval(body, {**env, **bound})

    def predicate(item: Any) -> bool:
        value = run(item)
        if not isinstance(value, bool):
            raise CelEvalError(f"no such overload: {name}")
        return value

    if name in ("all", "exists"):
        # Like && and ||: one decisive element wins over errors of the others.
        decisive = name == "exists"
        error: CelEvalError | None = None
        for item in items:
            try:
                if predicate(item) is decisive:
                    return decisive
            except CelEvalError as exc:
                error = exc
        if error is not None:
            raise error
        return not decisive
    if name == "exists_one":
        return sum(1 for item in items if predicate(item)) == 1
    if name == "filter":
        return [item for item in items if predicate(item)]
    return [run(item) for item in items]  # map


def _binop(op: str, left: Node, right: Node, env: Mapping[str, Any]) -> Any:
    if op in ("&&", "||"):
        return _logical(op, left, right, env)
    a = _eval(left, env)
    b = _eval(right, env)
    if op == "==":
        return _equal(a, b)
    if op == "!=":
        return not _equal(a, b)
    if op == "in":
        if isinstance(b, list):
            return any(_equal(a, item) for item in b)
        if isinstance(b, Mapping):
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


def _size(value: Any) -> int:
    if isinstance(value, str | list | Mapping):
        return len(value)
    raise CelEvalError("no such overload: size")


def _method(target: Any, name: str, args: list[Any]) -> Any:
    if name == "size" and not args:
        return _size(target)
    if name == "slice" and isinstance(target, list) and len(args) == 2 and all(map(_integer, args)):
        start, end = args  # the checks and messages of cel-go's lists extension
        if start < 0 or end < 0:
            raise CelEvalError(f"cannot slice({start}, {end}), negative indexes not supported")
        if start > end:
            raise CelEvalError(
                f"cannot slice({start}, {end}), start index must be less than or equal to end index"
            )
        if len(target) < end:
            raise CelEvalError(f"cannot slice({start}, {end}), list is length {len(target)}")
        return target[start:end]
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


def compile_expression(source: str, roots: Iterable[str]) -> CelExpression:
    """Parse ``source`` over the root identifiers ``roots``; :class:`CelUnsupported` outside the subset."""
    return CelExpression(source=source, _tree=_Parser(source, frozenset(roots)).parse())


def compile_rule(source: str) -> CelRule:
    """Parse a CRD rule (``self``, ``oldSelf``); raises :class:`CelUnsupported` outside the subset."""
    expression = compile_expression(source, RULE_ROOTS)
    return CelRule(source=source, uses_old_self=expression.uses("oldSelf"), _expression=expression)
