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

The package reads in the order a rule travels: :mod:`.parsing` (text to tree, refusing the unsupported),
:mod:`.evaluation` (the tree walk, with CEL's error commutativity), :mod:`.library` (value semantics and
functions, as cel-go answers them), :mod:`.compiled` (what callers keep).
"""

from agentrun_sandbox.kube.cel.compiled import (
    RULE_ROOTS,
    CelExpression,
    CelRule,
    compile_expression,
    compile_rule,
)
from agentrun_sandbox.kube.cel.errors import MISSING, CelEvalError, CelUnsupported

__all__ = [
    "MISSING",
    "RULE_ROOTS",
    "CelEvalError",
    "CelExpression",
    "CelRule",
    "CelUnsupported",
    "compile_expression",
    "compile_rule",
]
