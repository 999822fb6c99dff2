"""Source text to a small expression tree, refusing at compile time whatever the subset does not cover.

Refusing early is the point: a rule the emulator cannot evaluate is skipped with one log line
(:mod:`agentrun_sandbox.kube.validation`), never half-evaluated. The tree is plain tuples so that
:mod:`~agentrun_sandbox.kube.cel.evaluation` can walk it without a class per node.
"""

from __future__ import annotations

import re
from typing import Any

from agentrun_sandbox.kube.cel.errors import CelUnsupported

#: ``("lit", value)``, ``("ident", name)``, ``("select", target, field)``, ``("index", target, key)``,
#: ``("call", name, args)``, ``("method", target, name, args)``, ``("macro", target, name, vars, body)``,
#: ``("unop", op, operand)``, ``("binop", op, left, right)``, ``("cond", test, then, else)``,
#: ``("list", items)``.
Node = tuple[Any, ...]

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

FUNCTIONS = frozenset({"has", "size", "string"})
METHODS = frozenset({"size", "startsWith", "endsWith", "contains", "matches", "slice"})
MACROS = frozenset({"all", "exists", "exists_one", "filter", "map"})
_KEYWORDS = {"true": True, "false": False, "null": None}


def tokenize(source: str) -> list[tuple[str, Any]]:
    """``(kind, value)`` pairs (``lit``, ``ident``, ``op``), ending with ``("end", None)``."""
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


def parse(source: str, roots: frozenset[str]) -> Node:
    """The tree of ``source``, whose free identifiers must be among ``roots``."""
    return _Parser(source, roots).parse()


def uses(node: Any, name: str) -> bool:
    """Whether the tree reads the identifier ``name`` (not counting a macro variable that shadows it)."""
    if isinstance(node, tuple):
        if node[:2] == ("ident", name):
            return True
        if node[0] == "macro" and name in node[3]:
            return uses(node[1], name)  # inside the body, `name` is the macro's own variable
        return any(uses(child, name) for child in node[1:])
    if isinstance(node, list):
        return any(uses(child, name) for child in node)
    return False


class _Parser:
    def __init__(self, source: str, roots: frozenset[str]) -> None:
        self.tokens = tokenize(source)
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
                    if name in MACROS:
                        node = self.macro(node, name)
                    elif name in METHODS:
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
                if value not in FUNCTIONS:
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
