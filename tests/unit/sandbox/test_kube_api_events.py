"""core/v1 Events as kube-apiserver v1.36 validates them: an Event is about an object of its namespace."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.kube_client import KubeClient

EVENTS = "/api/v1/namespaces/{namespace}/events"


def event(involved_namespace: str | None) -> dict[str, Any]:
    involved = {"kind": "ConfigMap", "apiVersion": "v1", "name": "c1"}
    if involved_namespace is not None:
        involved["namespace"] = involved_namespace
    return {
        "metadata": {"generateName": "c1."},
        "involvedObject": involved,
        "reason": "Seen",
        "message": "m",
        "type": "Normal",
    }


async def test_an_event_about_an_object_of_its_own_namespace_is_stored(client: KubeClient) -> None:
    answer = await client.post(EVENTS.format(namespace="default"), event("default"))
    assert answer.status == 201, answer.body


@pytest.mark.parametrize(("namespace", "involved"), [("kube-public", None), ("default", "kube-public")])
async def test_an_event_about_an_object_elsewhere_is_refused_as_on_the_server(
    client: KubeClient, namespace: str, involved: str | None
) -> None:
    answer = await client.post(EVENTS.format(namespace=namespace), event(involved))
    assert answer.status == 422, answer.body
    assert answer.body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": f'Invalid value: "{involved or ""}": does not match event.namespace',
            "field": "involvedObject.namespace",
        }
    ]


async def test_an_event_in_default_may_leave_the_involved_objects_namespace_out(client: KubeClient) -> None:
    # kube-apiserver keeps accepting what old clients sent.
    answer = await client.post(EVENTS.format(namespace="default"), event(None))
    assert answer.status == 201, answer.body
