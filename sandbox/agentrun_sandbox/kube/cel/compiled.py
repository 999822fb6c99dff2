"""Compiled expressions: what callers hold on to, so a rule is parsed once and evaluated per request."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun_sandbox.kube.cel.errors import MISSING, CelEvalError
from agentrun_sandbox.kube.cel.evaluation import evaluate
from agentrun_sandbox.kube.cel.parsing import Node, parse, uses

#: The root identifiers of ``x-kubernetes-validations`` rules.
RULE_ROOTS = frozenset({"self", "oldSelf"})


@dataclass(frozen=True)
class CelExpression:
    """A compiled expression over the caller's root identifiers (an admission policy's, for example)."""

    source: str
    _tree: Node

    def uses(self, name: str) -> bool:
        """Whether the expression reads the root identifier ``name``."""
        return uses(self._tree, name)

    def evaluate(self, activation: Mapping[str, Any]) -> Any:
        """The value for ``activation`` (root identifier -> value; Mapping values may compute lazily)."""
        return evaluate(self._tree, activation)


@dataclass(frozen=True)
class CelRule:
    """A compiled ``x-kubernetes-validations`` rule; ``uses_old_self`` marks transition rules."""

    source: str
    uses_old_self: bool
    _expression: CelExpression

    def evaluate(self, value: Any, old_value: Any = MISSING) -> bool:
        result = self._expression.evaluate({"self": value, "oldSelf": old_value})
        if not isinstance(result, bool):
            raise CelEvalError(f"rule did not evaluate to a bool: {result!r}")
        return result


def compile_expression(source: str, roots: Iterable[str]) -> CelExpression:
    """Parse ``source`` over the root identifiers ``roots``; :class:`CelUnsupported` outside the subset."""
    return CelExpression(source=source, _tree=parse(source, frozenset(roots)))


def compile_rule(source: str) -> CelRule:
    """Parse a CRD rule (``self``, ``oldSelf``); raises :class:`CelUnsupported` outside the subset."""
    expression = compile_expression(source, RULE_ROOTS)
    return CelRule(source=source, uses_old_self=expression.uses("oldSelf"), _expression=expression)
