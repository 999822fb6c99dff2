"""The emulator's CEL subset: what the approvals rule and the approval policy need, with CEL's error rules."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun_sandbox.kube.cel import CelEvalError, CelUnsupported, compile_expression, compile_rule

APPEND_ONLY = "size(self) >= size(oldSelf) && oldSelf.all(i, recorded, self[i] == recorded)"
A = {"toolUseId": "a", "decision": "approve", "by": "alice"}
B = {"toolUseId": "b", "decision": "deny", "by": "bob"}


@pytest.mark.parametrize(
    ("new", "old", "allowed"),
    [
        ([A, B], [A], True),  # appended
        ([A], [A], True),  # unchanged
        ([A, B], [], True),
        ([{**A, "decision": "deny"}], [A], False),  # a recorded decision rewritten
        ([{**A, "reason": "later"}], [A], False),  # a field added to a recorded entry
        ([B, A], [A, B], False),  # reordered
        ([B], [A], False),  # replaced by another list of the same size
        ([], [A], False),  # emptied
        ([B, A], [A], False),  # inserted before the recorded ones
    ],
)
def test_the_append_only_rule_keeps_recorded_entries_where_and_as_they_are(
    new: list[Any], old: list[Any], allowed: bool
) -> None:
    assert compile_rule(APPEND_ONLY).evaluate(new, old) is allowed


def test_a_shorter_list_fails_the_rule_without_an_index_error() -> None:
    # `&&` is commutative about errors in CEL: the false size check wins over the out-of-range index.
    assert compile_rule(APPEND_ONLY).evaluate([A], [A, B]) is False


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("[1, 2].slice(1, 3)", "cannot slice(1, 3), list is length 2"),
        ("[1, 2].slice(2, 1)", "cannot slice(2, 1), start index must be less than or equal to end index"),
        ("[1, 2].slice(-1, 1)", "cannot slice(-1, 1), negative indexes not supported"),
        ("[1, 2][2]", "index out of bounds: 2"),
    ],
)
def test_slice_and_index_errors_carry_cel_gos_messages(source: str, message: str) -> None:
    with pytest.raises(CelEvalError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compile_expression(source, ()).evaluate({})


def test_slice_returns_the_half_open_range() -> None:
    assert compile_expression("[1, 2, 3, 4].slice(1, 3)", ()).evaluate({}) == [2, 3]
    assert compile_expression("[1, 2].slice(2, 2)", ()).evaluate({}) == []


def test_macros_bind_their_variable_over_list_elements() -> None:
    items = [A, B]
    env = {"items": items, "who": "alice"}

    def run(source: str) -> Any:
        return compile_expression(source, ("items", "who")).evaluate(env)

    assert run("items.filter(a, a.by != who)") == [B]
    assert run("items.map(a, a.toolUseId)") == ["a", "b"]
    assert run("items.all(a, a.decision in ['approve', 'deny'])") is True
    assert run("items.exists(a, a.by == who)") is True
    assert run("items.exists_one(a, a.decision == 'deny')") is True
    assert run("items.filter(a, a.by == 'nobody').all(a, false)") is True  # vacuous truth


def test_all_and_exists_let_a_decisive_element_win_over_errors_of_others() -> None:
    items = [{"n": 1}, {}]  # the second has no `n`: selecting it is an error
    run = compile_expression
    assert run("items.exists(x, x.n == 1)", ("items",)).evaluate({"items": items}) is True
    assert run("items.all(x, x.n == 2)", ("items",)).evaluate({"items": items}) is False
    with pytest.raises(CelEvalError, match="no such key: n"):
        run("items.all(x, x.n == 1)", ("items",)).evaluate({"items": items})


def test_string_concatenation_builds_messages() -> None:
    source = "'decision on ' + d.toolUseId + ' by ' + d.by + ' (' + string(size(d.by)) + ')'"
    assert compile_expression(source, ("d",)).evaluate({"d": A}) == "decision on a by alice (5)"


def test_has_and_ternaries_guard_optional_fields() -> None:
    source = "has(object.spec.approvals) ? size(object.spec.approvals) : 0"
    expression = compile_expression(source, ("object",))
    assert expression.evaluate({"object": {"spec": {"approvals": [A, B]}}}) == 2
    assert expression.evaluate({"object": {"spec": {}}}) == 0


def test_two_variable_comprehensions_bind_the_index_and_the_element() -> None:
    run = compile_expression
    assert run("[5, 6].all(i, v, v == i + 5)", ()).evaluate({}) is True
    assert run("[5, 6].exists(i, v, i == 1 && v == 5)", ()).evaluate({}) is False
    assert run("m.all(k, v, k.startsWith('a') && v > 0)", ("m",)).evaluate({"m": {"ab": 1, "ac": 2}}) is True


def test_a_macro_variable_is_only_bound_inside_its_body() -> None:
    with pytest.raises(CelUnsupported, match="unsupported identifier: a"):
        compile_expression("items.all(a, true) && a", ("items",))
    assert not compile_expression("items.all(oldSelf, oldSelf)", ("items",)).uses("oldSelf")


@pytest.mark.parametrize(
    "source",
    [
        "request.userInfo.username",  # a root the caller did not declare (CRD rules know self/oldSelf)
        "self.items.existsOne(i, v, v > 0)",  # two-variable forms other than all and exists
        "self.items.filter(i, v, v > 0)",
        "self.items.sortBy(x, x)",
        "self.name.lowerAscii() == self.name",
    ],
)
def test_crd_rules_outside_the_subset_are_refused_at_compile_time(source: str) -> None:
    with pytest.raises(CelUnsupported):
        compile_rule(source)
