"""Status subresource writes are validated against the status schema alone, as kube-apiserver v1.36 does.

The server builds a separate schema validator rooted at ``status`` for the status subresource: the
error's field is the full path, but the validator's own text names the path below ``status`` (measured:
``status.iterations: Invalid value: "string": iterations in body must be of type integer: "string"``).
"""

from __future__ import annotations

from typing import Any

from tests.support.kube_client import Answer, KubeClient
from tests.support.kube_testing import WIDGETS, widget


def first_cause(answer: Answer) -> dict[str, Any]:
    assert answer.status == 422, answer.body
    cause: dict[str, Any] = answer.body["details"]["causes"][0]
    return cause


async def test_a_status_write_names_the_path_below_status_in_the_validators_text(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    answer = await client.patch(f"{WIDGETS}/w1/status", {"status": {"iterations": "three"}})
    assert first_cause(answer) == {
        "reason": "FieldValueTypeInvalid",
        "message": 'Invalid value: "string": iterations in body must be of type integer: "string"',
        "field": "status.iterations",
    }
    nested = await client.patch(
        f"{WIDGETS}/w1/status", {"status": {"conditions": [{"type": 1, "status": "x"}]}}
    )
    assert first_cause(nested)["message"] == (
        'Invalid value: "integer": conditions[0].type in body must be of type string: "integer"'
    )


async def test_a_status_that_is_not_an_object_is_named_by_an_empty_path(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    answer = await client.patch(f"{WIDGETS}/w1/status", {"status": "done"})
    assert first_cause(answer) == {
        "reason": "FieldValueTypeInvalid",
        "message": 'Invalid value: "string":  in body must be of type object: "string"',
        "field": "status",
    }


async def test_a_write_to_the_object_itself_keeps_the_full_path_in_the_validators_text(
    client: KubeClient,
) -> None:
    answer = await client.post(WIDGETS, widget("w1", size="big"))
    assert (
        first_cause(answer)["message"]
        == 'Invalid value: "string": spec.size in body must be of type integer: "string"'
    )
