"""Discovery, the request log, pod logs, and real clients (kubectl, kubernetes_asyncio) on the emulator."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from agentrun_sandbox.kube import EmulatedCluster
from tests.support.kube_client import KubeClient
from tests.support.kube_testing import WIDGETS, widget


def resource(listing: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(r for r in listing["resources"] if r["name"] == name)
    return found


async def test_core_discovery_lists_namespaces_as_cluster_scoped_and_the_rest_as_namespaced(
    client: KubeClient,
) -> None:
    assert (await client.get("/api")).body["versions"] == ["v1"]
    core = (await client.get("/api/v1")).body
    assert core["kind"] == "APIResourceList"
    namespaces = resource(core, "namespaces")
    assert namespaces["namespaced"] is False
    assert namespaces["kind"] == "Namespace"
    assert namespaces["shortNames"] == ["ns"]
    for name in ("configmaps", "secrets", "events", "pods", "serviceaccounts"):
        assert resource(core, name)["namespaced"] is True
    assert resource(core, "pods/log")["verbs"] == ["get"]
    assert (resource(core, "pods/exec")["verbs"], resource(core, "pods/exec")["kind"]) == (
        ["create", "get"],
        "PodExecOptions",
    )
    assert set(resource(core, "configmaps")["verbs"]) == {
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    }


async def test_group_discovery_lists_builtin_groups_and_crd_groups_with_the_preferred_version_first(
    client: KubeClient,
) -> None:
    groups = {g["name"]: g for g in (await client.get("/apis")).body["groups"]}
    assert {"apiextensions.k8s.io", "coordination.k8s.io", "events.k8s.io", "test.agentrun.dev"} <= set(
        groups
    )
    widgets = groups["test.agentrun.dev"]
    assert [v["version"] for v in widgets["versions"]] == ["v1", "v1beta1"]
    assert widgets["preferredVersion"]["version"] == "v1"
    assert (await client.get("/apis/test.agentrun.dev")).body["name"] == "test.agentrun.dev"


async def test_crd_resources_are_discoverable_with_kind_scope_names_categories_and_subresources(
    client: KubeClient,
) -> None:
    listing = (await client.get("/apis/test.agentrun.dev/v1")).body
    widgets = resource(listing, "widgets")
    assert widgets["kind"] == "Widget"
    assert widgets["singularName"] == "widget"
    assert widgets["namespaced"] is True
    assert widgets["shortNames"] == ["wg"]
    assert widgets["categories"] == ["testing"]
    assert resource(listing, "widgets/status")["verbs"] == ["get", "patch", "update"]
    crds = resource((await client.get("/apis/apiextensions.k8s.io/v1")).body, "customresourcedefinitions")
    assert crds["namespaced"] is False
    leases = resource((await client.get("/apis/coordination.k8s.io/v1")).body, "leases")
    assert leases["namespaced"] is True


async def test_unknown_groups_and_paths_answer_404_statuses(client: KubeClient) -> None:
    assert (await client.get("/apis/nothing.example.com/v1")).status == 404
    answer = await client.get("/api/v1/namespaces/default/gizmos")
    assert answer.status == 404
    assert answer.body["reason"] == "NotFound"


async def test_the_request_log_records_verbs_resources_and_identities(
    kube: EmulatedCluster, client: KubeClient
) -> None:
    impersonation = {
        "Impersonate-User": "system:serviceaccount:default:runner",
        "Impersonate-Group": "runners",
    }
    await client.post(WIDGETS, widget("w1"), headers=impersonation)
    await client.patch(f"{WIDGETS}/w1/status", {"status": {"phase": "Running"}})
    await client.get(WIDGETS, params={"labelSelector": "a=b"})
    await client.get(f"{WIDGETS}/w1")
    await client.put(f"{WIDGETS}/w1", widget("w1"))
    await client.delete(f"{WIDGETS}/w1")
    stream = await client.watch("/api/v1/namespaces", {"timeoutSeconds": "1"})
    await stream.take(1)
    await client.get("/version")
    log = kube.emulator.request_log
    assert [(r.verb, r.group, r.resource, r.subresource) for r in log] == [
        ("create", "test.agentrun.dev", "widgets", None),
        ("patch", "test.agentrun.dev", "widgets", "status"),
        ("list", "test.agentrun.dev", "widgets", None),
        ("get", "test.agentrun.dev", "widgets", None),
        ("update", "test.agentrun.dev", "widgets", None),
        ("delete", "test.agentrun.dev", "widgets", None),
        ("watch", "", "namespaces", None),
        ("get", None, None, None),
    ]
    first = log[0]
    assert (first.method, first.namespace, first.name) == ("POST", "default", None)
    assert first.impersonate_user == "system:serviceaccount:default:runner"
    assert first.impersonate_groups == ("runners",)
    assert first.authorization == "Bearer kube-emulator-token"
    assert first.content_type == "application/json"
    assert first.status == 201
    assert log[1].content_type == "application/merge-patch+json"
    assert log[2].query == {"labelSelector": "a=b"}
    assert kube.emulator.rbac_usage() >= {
        ("test.agentrun.dev", "widgets/status", "patch"),
        ("", "namespaces", "watch"),
    }


async def test_pod_logs_serve_the_configured_text(kube: EmulatedCluster, client: KubeClient) -> None:
    await client.post(
        "/api/v1/namespaces/default/pods", {"metadata": {"name": "p1"}, "spec": {"containers": []}}
    )
    kube.emulator.set_pod_log("default", "p1", "line 1\nline 2\nline 3\n")
    answer = await client.get("/api/v1/namespaces/default/pods/p1/log")
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("text/plain")
    assert answer.body == "line 1\nline 2\nline 3\n"
    tail = await client.get("/api/v1/namespaces/default/pods/p1/log", params={"tailLines": "1"})
    assert tail.body == "line 3\n"
    assert (await client.get("/api/v1/namespaces/default/pods/ghost/log")).status == 404


async def test_kubernetes_asyncio_works_through_the_kubeconfig(kube: EmulatedCluster) -> None:
    api_client = await k8s_config.new_client_from_config(config_file=str(kube.kubeconfig_path))
    async with api_client:
        core = k8s_client.CoreV1Api(api_client)
        namespaces = await core.list_namespace()
        assert "default" in [ns.metadata.name for ns in namespaces.items]
        custom = k8s_client.CustomObjectsApi(api_client)
        await custom.create_namespaced_custom_object(
            "test.agentrun.dev", "v1", "default", "widgets", widget("w1")
        )
        # The stubs do not declare _content_type, but the generated client honours it; without it,
        # the client sends a JSON patch, which a dict body cannot be (400).
        patched = await custom.patch_namespaced_custom_object_status(  # type: ignore[call-arg]
            "test.agentrun.dev",
            "v1",
            "default",
            "widgets",
            "w1",
            {"status": {"phase": "Running"}},
            _content_type="application/merge-patch+json",
        )
        assert patched["status"] == {"phase": "Running"}


def kubectl_binary() -> str:
    """kubectl ships with every machine of this project; a missing one is a set-up error, not a skip."""
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not on PATH: install it (e.g. Debian's kubernetes-client) to run these tests")
    return path


async def kubectl(kube: EmulatedCluster, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        kubectl_binary(),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECONFIG": str(kube.kubeconfig_path)},
    )
    out, err = await asyncio.wait_for(process.communicate(stdin.encode() if stdin else None), 20)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_kubectl_gets_namespaces_and_custom_resources_with_printer_columns(
    kube: EmulatedCluster, client: KubeClient
) -> None:
    await client.post(WIDGETS, widget("w1", size=4))
    await client.patch(
        f"{WIDGETS}/w1/status",
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
    )
    code, out, err = await kubectl(kube, "get", "ns")
    assert code == 0, err
    assert "default" in out and "Active" in out
    code, out, err = await kubectl(kube, "get", "widgets")
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["NAME", "PHASE", "SIZE", "READY", "AGE"]
    assert row.split()[:4] == ["w1", "Running", "4", "True"]
    code, out, err = await kubectl(kube, "get", "wg", "w1", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["spec"]["size"] == 4


async def test_kubectl_creates_patches_waits_for_and_deletes_custom_resources(
    kube: EmulatedCluster, client: KubeClient
) -> None:
    code, _, err = await kubectl(kube, "create", "-f", "-", stdin=json.dumps(widget("w1")))
    assert code == 0, err
    code, _, err = await kubectl(kube, "patch", "widget", "w1", "--type=merge", "-p", '{"spec":{"size":6}}')
    assert code == 0, err
    await client.patch(
        f"{WIDGETS}/w1/status", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    code, _, err = await kubectl(kube, "wait", "--for=condition=Ready", "widget/w1", "--timeout=5s")
    assert code == 0, err
    code, _, err = await kubectl(kube, "delete", "widget", "w1", "--timeout=5s")
    assert code == 0, err
    assert (await client.get(f"{WIDGETS}/w1")).status == 404


async def test_kubectl_apply_validates_on_the_server_and_updates_objects(
    kube: EmulatedCluster, client: KubeClient
) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1", "namespace": "team"}}
    manifests = [namespace, config_map | {"data": {"a": "1"}}]
    code, _, err = await kubectl(kube, "apply", "-f", "-", stdin="\n".join(json.dumps(m) for m in manifests))
    assert code == 0, err
    code, _, err = await kubectl(
        kube, "apply", "-f", "-", stdin=json.dumps(config_map | {"data": {"a": "2"}})
    )
    assert code == 0, err
    assert (await client.get("/api/v1/namespaces/team/configmaps/c1")).body["data"] == {"a": "2"}
    code, _, err = await kubectl(kube, "apply", "-f", "-", stdin=json.dumps(widget("w1", colour="red")))
    assert code != 0
    assert 'unknown field "spec.colour"' in err


async def test_kubectl_explain_shows_the_crd_schema(kube: EmulatedCluster) -> None:
    code, out, err = await kubectl(kube, "explain", "widgets.spec.task")
    assert code == 0, err
    assert "FIELD: task <string>" in out


async def test_kubectl_generators_that_send_protobuf_are_refused_with_415(kube: EmulatedCluster) -> None:
    code, _, err = await kubectl(kube, "create", "namespace", "team")
    assert code != 0
    assert "UnsupportedMediaType" in err
