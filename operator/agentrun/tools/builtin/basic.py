"""Small built-ins that need no credentials: useful for smoke tests, demos and simple agents."""

from __future__ import annotations

import ast
import datetime as dt
import json
import operator
from collections.abc import Callable, Mapping
from typing import Any

from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import ToolCall, ToolDefinition, ToolOutput


class CurrentTime:
    """Models do not know the date; agents that schedule or compare timestamps need it."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        if config:
            raise ValueError(f"current_time takes no config, got keys {sorted(config)}")
        self.definition = ToolDefinition(
            name="current_time",
            description="Returns the current date and time in UTC (ISO 8601).",
            input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        return ToolOutput(json.dumps({"utc": now.isoformat()}))


_OPS: dict[type[ast.AST], Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ToolError("too_large", "exponents above 64 are not allowed", hint="use a smaller exponent")
        result: float | int = _OPS[type(node.op)](left, right)
        return result
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        value: float | int = _OPS[type(node.op)](_evaluate(node.operand))
        return value
    raise ToolError(
        "unsupported_expression",
        f"unsupported syntax: {type(node).__name__}",
        hint="use numbers with + - * / // % ** and parentheses only",
    )


class Calculator:
    """Exact arithmetic the model would otherwise approximate; evaluated without eval()."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        if config:
            raise ValueError(f"calculator takes no config, got keys {sorted(config)}")
        self.definition = ToolDefinition(
            name="calculator",
            description="Evaluates an arithmetic expression with + - * / // % ** and parentheses.",
            input_schema={
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. (2 + 3) * 4"}},
                "required": ["expression"],
                "additionalProperties": False,
            },
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        expression = call.input.get("expression")
        if not isinstance(expression, str) or not expression.strip():
            raise ToolError(
                "invalid_input", "expression must be a non-empty string", hint='{"expression": "1+1"}'
            )
        if len(expression) > 1000:
            raise ToolError(
                "too_large", "expression longer than 1000 characters", hint="split the calculation"
            )
        try:
            tree = ast.parse(expression, mode="eval")
        except SyntaxError as exc:
            raise ToolError(
                "syntax_error", f"cannot parse expression: {exc.msg}", hint="check parentheses"
            ) from exc
        try:
            value = _evaluate(tree)
        except ZeroDivisionError as exc:
            raise ToolError("division_by_zero", "division by zero", hint="check the divisor") from exc
        return ToolOutput(json.dumps({"expression": expression, "value": value}))
