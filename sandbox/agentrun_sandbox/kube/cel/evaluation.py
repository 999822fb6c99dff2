"""Walking a parsed tree against an activation, with CEL's rules about where errors may hide.

CEL's ``&&``, ``||``, ``all`` and ``exists`` are commutative about errors: a decisive operand or element
wins over an error elsewhere. That is why this walk, not :mod:`~agentrun_sandbox.kube.cel.library`,
owns the logical operators and the comprehensions: they must see their operands unevaluated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrun_sandbox.kube.cel import library
from agentrun_sandbox.kube.cel.errors import MISSING, CelEvalError
from agentrun_sandbox.kube.cel.parsing import Node


def evaluate(node: Node, env: Mapping[str, Any]) -> Any:
    """The value of ``node`` where ``env`` binds the root identifiers (Mapping values may compute lazily)."""
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "list":
        return [evaluate(item, env) for item in node[1]]
    if kind == "ident":
        value = env.get(node[1], MISSING)
        if value is MISSING:
            raise CelEvalError(f"no such attribute: {node[1]}")
        return value
    if kind == "select":
        target = evaluate(node[1], env)
        if not isinstance(target, Mapping) or node[2] not in target:
            raise CelEvalError(f"no such key: {node[2]}")
        return target[node[2]]
    if kind == "index":
        return library.index(evaluate(node[1], env), evaluate(node[2], env))
    if kind == "call":
        return _call(node[1], node[2], env)
    if kind == "method":
        target = evaluate(node[1], env)
        return library.call_method(target, node[2], [evaluate(arg, env) for arg in node[3]])
    if kind == "macro":
        return _macro(node, env)
    if kind == "unop":
        operand = evaluate(node[2], env)
        if node[1] == "!":
            if not isinstance(operand, bool):
                raise CelEvalError("no such overload: !_")
            return not operand
        if not library.is_number(operand):
            raise CelEvalError("no such overload: -_")
        return -operand
    if kind == "cond":
        cond = evaluate(node[1], env)
        if not isinstance(cond, bool):
            raise CelEvalError("no such overload: _?_:_")
        return evaluate(node[2] if cond else node[3], env)
    if kind == "binop":
        op, left, right = node[1], node[2], node[3]
        if op in ("&&", "||"):
            return _logical(op, left, right, env)
        return library.apply_operator(op, evaluate(left, env), evaluate(right, env))
    raise AssertionError(kind)  # pragma: no cover


def _call(name: str, args: list[Node], env: Mapping[str, Any]) -> Any:
    if name == "has":  # a macro in CEL: it tests the selection instead of evaluating it
        target = evaluate(args[0][1], env)
        return isinstance(target, Mapping) and args[0][2] in target
    value = evaluate(args[0], env)
    if name == "size":
        return library.size(value)
    return library.to_string(value)


def _logical(op: str, left: Node, right: Node, env: Mapping[str, Any]) -> bool:
    # CEL's && and || are commutative about errors: a decisive side wins even if the other errs.
    decisive = op == "||"
    error: CelEvalError | None = None
    for side in (left, right):
        try:
            value = evaluate(side, env)
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
    target = evaluate(target_node, env)
    # One variable: list elements, or a map's keys. Two: (index, element), or (key, value).
    if isinstance(target, list):
        items: list[Any] = list(enumerate(target)) if len(names) == 2 else list(target)
    elif isinstance(target, Mapping):
        items = list(target.items()) if len(names) == 2 else list(target.keys())
    else:
        raise CelEvalError(f"no such overload: {name}")

    def run(item: Any) -> Any:
        bound = dict(zip(names, item, strict=True)) if len(names) == 2 else {names[0]: item}
        return evaluate(body, {**env, **bound})

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
