"""The emulator's OpenAPI v3 publication, compared with what kube-apiserver v1.36 publishes for a CRD."""

from __future__ import annotations

from typing import Any

from agentrun_sandbox.kube import openapi as kube_openapi
from agentrun_sandbox.kube.registry import ResourceType
from tests.support.kube_client import KubeClient

OWN_WORDS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string", "description": "API version of the object."},
        "kind": {"type": "string", "description": "Kind of the object."},
        "metadata": {"type": "object"},
        "spec": {"type": "object", "description": "The desired gadget."},
    },
}


def _published(schema: dict[str, Any]) -> dict[str, Any]:
    gadgets = ResourceType(
        group="test.agentrun.dev",
        version="v1",
        plural="gadgets",
        kind="Gadget",
        namespaced=True,
        custom=True,
        schema=schema,
    )
    document = kube_openapi.document([gadgets])
    published: dict[str, Any] = document["components"]["schemas"]["dev.agentrun.test.v1.Gadget"]
    return published


def test_a_crds_own_words_on_api_version_kind_and_metadata_give_way_to_the_servers_as_on_kube_apiserver() -> (
    None
):
    properties = _published(OWN_WORDS)["properties"]
    assert properties["apiVersion"]["description"].startswith("APIVersion defines the versioned schema")
    assert properties["kind"]["description"].startswith(
        "Kind is a string value representing the REST resource"
    )
    assert properties["metadata"] == {
        "description": "Standard object's metadata. More info: "
        "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata",
        "allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}],
    }
    assert properties["spec"] == OWN_WORDS["properties"]["spec"]


def test_a_crd_that_says_nothing_about_api_version_and_kind_gets_them_described() -> None:
    properties = _published({"type": "object", "properties": {"spec": {"type": "object"}}})["properties"]
    assert set(properties) == {"apiVersion", "kind", "metadata", "spec"}
    assert all(properties[name]["description"] for name in ("apiVersion", "kind", "metadata"))


async def test_the_served_document_describes_a_crds_type_meta_the_servers_way(client: KubeClient) -> None:
    index = (await client.get("/openapi/v3")).body["paths"]
    document = (await client.get(index["apis/test.agentrun.dev/v1"]["serverRelativeURL"])).body
    widget = document["components"]["schemas"]["dev.agentrun.test.v1.Widget"]
    assert widget["properties"]["apiVersion"]["description"].startswith("APIVersion defines")
    assert widget["properties"]["metadata"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    ]
