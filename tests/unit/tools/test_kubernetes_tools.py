"""Kubernetes read tools against the API emulator: impersonation, namespaces, RBAC answers, compact output."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from agentrun.api.spec import AgentRunSpec
from agentrun.controller.agentruns.tool_environment import kube_connection
from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import Tool, ToolCall
from agentrun.tools.errors import InvalidToolSpec
from agentrun.tools.registry import check_tools, open_tools
from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator
from tests.unit.tools.environment import StaticEnvironment

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "crds" / "agentruns.agentrun.dev.yaml"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _pod(name: str, namespace: str = "default", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {LAST_APPLIED: '{"huge": "' + "x" * 2000 + '"}', "team": "web"},
            "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"containers": [{"name": "app", "image": "nginx"}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ],
            "containerStatuses": [
                {
                    "name": "app",
                    "ready": False,
                    "restartCount": 7,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m"}},
                }
            ],
        },
    }


@pytest.fixture
async def cluster() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator.running(crd_paths=[CRD]) as kube:
        kube.emulator.create_object("pods", _pod("web-1", app="web"))
        kube.emulator.create_object("pods", _pod("web-2", app="web"))
        kube.emulator.create_object("pods", _pod("db-1", app="db"))
        kube.emulator.create_object("pods", _pod("dns-1", "kube-system", app="dns"))
        kube.emulator.set_pod_log("default", "web-1", "".join(f"line {i}\n" for i in range(1, 301)))
        kube.emulator.create_object(
            "events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "web-1.a", "namespace": "default"},
                "involvedObject": {"kind": "Pod", "name": "web-1", "namespace": "default"},
                "reason": "BackOff",
                "message": "Back-off restarting failed container",
                "type": "Warning",
                "count": 12,
                "lastTimestamp": "2026-01-01T00:10:00Z",
            },
        )
        kube.emulator.create_object(
            "events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "db-1.a", "namespace": "default"},
                "involvedObject": {"kind": "Pod", "name": "db-1", "namespace": "default"},
                "reason": "Scheduled",
                "message": "Successfully assigned",
                "type": "Normal",
                "lastTimestamp": "2026-01-01T00:01:00Z",
            },
        )
        yield kube


async def _environment(kube: KubeEmulator, service_account: str | None = "reader") -> StaticEnvironment:
    """The connection as the operator builds it: from the kubeconfig, through kubernetes_asyncio."""
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kube.kubeconfig_path), client_configuration=configuration)
    return StaticEnvironment(service_account_name=service_account, connection=kube_connection(configuration))


def _spec(*tools: tuple[str, dict[str, Any]]) -> AgentRunSpec:
    entries = [{"builtin": {"name": name, "config": cfg}} for name, cfg in tools]
    return AgentRunSpec.model_validate({"task": "t", "tools": entries, "serviceAccountName": "reader"})


async def _call(tool: Tool, tool_input: dict[str, Any]) -> Any:
    output = await tool.call(ToolCall("toolu_1", tool.definition.name, tool_input, "k", 1))
    try:
        return json.loads(output.content)
    except ValueError:
        return output.content


async def test_every_request_impersonates_the_runs_service_account(cluster: KubeEmulator) -> None:
    env = await _environment(cluster)
    spec = _spec(("kubernetes_get", {}), ("kubernetes_list", {}), ("pod_logs", {}), ("kubernetes_events", {}))
    before = len(cluster.emulator.request_log)
    async with open_tools(spec, env) as tools:
        await _call(tools["kubernetes_get"], {"resource": "pods", "name": "web-1"})
        await _call(tools["kubernetes_list"], {"resource": "pod"})
        await _call(tools["pod_logs"], {"name": "web-1"})
        await _call(tools["kubernetes_events"], {})
    records = cluster.emulator.request_log[before:]
    assert records, "the tools made no requests"
    assert {r.impersonate_user for r in records} == {"system:serviceaccount:default:reader"}
    assert {r.authorization for r in records} == {f"Bearer {cluster.token}"}
    assert all(r.method == "GET" for r in records)
    assert ("get", "pods", "default") in {(r.verb, r.resource, r.namespace) for r in records}
    assert ("get", "pods/log", "default") in {(r.verb, r.rbac_resource, r.namespace) for r in records}


async def test_an_unset_service_account_means_the_namespaces_default_account(cluster: KubeEmulator) -> None:
    env = await _environment(cluster, service_account=None)
    before = len(cluster.emulator.request_log)
    async with open_tools(_spec(("kubernetes_get", {})), env) as tools:
        await _call(tools["kubernetes_get"], {"resource": "pods", "name": "web-1"})
    users = {r.impersonate_user for r in cluster.emulator.request_log[before:]}
    assert users == {"system:serviceaccount:default:default"}


async def test_get_strips_managed_fields_and_the_last_applied_annotation(cluster: KubeEmulator) -> None:
    async with open_tools(_spec(("kubernetes_get", {})), await _environment(cluster)) as tools:
        pod = await _call(tools["kubernetes_get"], {"resource": "Pod", "name": "web-1"})
    stored = cluster.emulator.get_object("pods", "default", "web-1")
    assert stored is not None and stored["metadata"]["managedFields"]  # the server does send them
    assert LAST_APPLIED in stored["metadata"]["annotations"]
    assert pod["metadata"]["name"] == "web-1"
    assert "managedFields" not in pod["metadata"]
    assert pod["metadata"]["annotations"] == {"team": "web"}
    assert pod["spec"]["containers"][0]["image"] == "nginx"


async def test_list_summarises_each_object_and_passes_selectors_and_limit(cluster: KubeEmulator) -> None:
    async with open_tools(_spec(("kubernetes_list", {})), await _environment(cluster)) as tools:
        listed = await _call(tools["kubernetes_list"], {"resource": "pods", "labelSelector": "app=web"})
        first = await _call(tools["kubernetes_list"], {"resource": "po", "limit": 2})
        rest = await _call(tools["kubernetes_list"], {"resource": "pods", "continue": first["continue"]})
    assert [i["name"] for i in listed["items"]] == ["web-1", "web-2"]
    item = listed["items"][0]
    assert item["status"] == {
        "phase": "Running",
        "conditions": {"Ready": "False"},
        "containers": [
            {"name": "app", "ready": False, "restarts": 7, "state": "waiting", "reason": "CrashLoopBackOff"}
        ],
    }
    assert "annotations" not in item and "spec" not in item
    assert first["count"] == 2 and first["continue"]
    assert [i["name"] for i in first["items"] + rest["items"]] == ["db-1", "web-1", "web-2"]
    selector_queries = [r.query for r in cluster.emulator.request_log if r.query.get("labelSelector")]
    assert selector_queries[-1]["labelSelector"] == "app=web"


async def test_pod_logs_reads_the_tail_with_container_and_previous(cluster: KubeEmulator) -> None:
    async with open_tools(_spec(("pod_logs", {})), await _environment(cluster)) as tools:
        text = await _call(
            tools["pod_logs"], {"name": "web-1", "tailLines": 3, "container": "app", "previous": True}
        )
    assert text == "line 298\nline 299\nline 300\n"
    query = [r.query for r in cluster.emulator.request_log if r.subresource == "log"][-1]
    assert (query["container"], query["previous"], query["tailLines"]) == ("app", "true", "3")


async def test_events_are_newest_first_and_can_be_narrowed_to_one_object(cluster: KubeEmulator) -> None:
    async with open_tools(_spec(("kubernetes_events", {})), await _environment(cluster)) as tools:
        everything = await _call(tools["kubernetes_events"], {})
        one = await _call(tools["kubernetes_events"], {"objectName": "web-1", "type": "Warning"})
    assert [e["reason"] for e in everything["events"]] == ["BackOff", "Scheduled"]
    assert one["events"] == [
        {
            "type": "Warning",
            "reason": "BackOff",
            "object": "Pod/web-1",
            "message": "Back-off restarting failed container",
            "count": 12,
            "last": "2026-01-01T00:10:00Z",
        }
    ]


async def test_other_namespaces_need_explicit_listing_in_the_config(cluster: KubeEmulator) -> None:
    env = await _environment(cluster)
    async with open_tools(_spec(("kubernetes_list", {})), env) as tools:
        with pytest.raises(ToolError) as caught:
            await _call(tools["kubernetes_list"], {"resource": "pods", "namespace": "kube-system"})
    assert caught.value.code == "namespace_not_allowed" and caught.value.recoverable
    assert caught.value.hint == "namespaces this tool may read: default"
    async with open_tools(_spec(("kubernetes_list", {"namespaces": ["kube-system"]})), env) as tools:
        listed = await _call(tools["kubernetes_list"], {"resource": "pods", "namespace": "kube-system"})
    assert [i["name"] for i in listed["items"]] == ["dns-1"]
    record = [r for r in cluster.emulator.request_log if r.namespace == "kube-system"][-1]
    assert record.impersonate_user == "system:serviceaccount:default:reader"


async def test_forbidden_is_a_recoverable_error_telling_the_model_it_is_not_allowed(
    cluster: KubeEmulator,
) -> None:
    cluster.emulator.faults.add(
        verb="get",
        resource="pods",
        subresource="log",
        status=403,
        message='pods "web-1" is forbidden: User "system:serviceaccount:default:reader" cannot get resource',
    )
    async with open_tools(_spec(("pod_logs", {})), await _environment(cluster)) as tools:
        with pytest.raises(ToolError) as caught:
            await _call(tools["pod_logs"], {"name": "web-1"})
    error = caught.value
    assert (error.code, error.recoverable) == ("forbidden", True)
    assert error.message.startswith(
        "not allowed: system:serviceaccount:default:reader may not read logs of pod web-1"
    )
    assert "RBAC" in error.hint


async def test_an_operator_without_impersonate_rights_is_a_fatal_error(cluster: KubeEmulator) -> None:
    cluster.emulator.faults.add(
        verb="get",
        resource="pods",
        status=403,
        message='users "system:serviceaccount:default:reader" is forbidden: User "op" cannot impersonate '
        'resource "serviceaccounts"',
    )
    async with open_tools(_spec(("kubernetes_get", {})), await _environment(cluster)) as tools:
        with pytest.raises(ToolError) as caught:
            await _call(tools["kubernetes_get"], {"resource": "pods", "name": "web-1"})
    assert (caught.value.code, caught.value.recoverable) == ("impersonation_denied", False)


async def test_missing_objects_and_unknown_resources_are_tool_errors(cluster: KubeEmulator) -> None:
    async with open_tools(_spec(("kubernetes_get", {})), await _environment(cluster)) as tools:
        with pytest.raises(ToolError) as missing:
            await _call(tools["kubernetes_get"], {"resource": "pods", "name": "nope"})
        with pytest.raises(ToolError) as unknown:
            await _call(tools["kubernetes_get"], {"resource": "gizmos", "name": "x"})
    assert missing.value.code == "not_found" and unknown.value.code == "unknown_resource"


async def test_custom_resources_resolve_by_group_and_short_name(cluster: KubeEmulator) -> None:
    async with open_tools(_spec(("kubernetes_list", {})), await _environment(cluster)) as tools:
        by_group = await _call(tools["kubernetes_list"], {"resource": "agentruns.agentrun.dev"})
        by_short = await _call(tools["kubernetes_list"], {"resource": "ar"})
    assert by_group["resource"] == by_short["resource"] == "agentruns.agentrun.dev"


async def test_cluster_scoped_resources_need_the_cluster_scoped_flag(cluster: KubeEmulator) -> None:
    env = await _environment(cluster)
    async with open_tools(_spec(("kubernetes_list", {})), env) as tools:
        with pytest.raises(ToolError) as caught:
            await _call(tools["kubernetes_list"], {"resource": "namespaces"})
    assert caught.value.code == "cluster_scoped_not_allowed"
    async with open_tools(_spec(("kubernetes_list", {"clusterScoped": True})), env) as tools:
        listed = await _call(tools["kubernetes_list"], {"resource": "namespaces"})
    assert "default" in [i["name"] for i in listed["items"]]


async def test_kubernetes_tools_without_a_cluster_are_an_invalid_spec_naming_the_tool() -> None:
    with pytest.raises(InvalidToolSpec, match=r"spec\.tools\[0\]\.builtin: Kubernetes tools need a cluster"):
        async with open_tools(_spec(("pod_logs", {})), StaticEnvironment()):
            pass


def test_a_wildcard_namespace_list_is_rejected() -> None:
    with pytest.raises(
        InvalidToolSpec, match=r"spec\.tools\[0\]\.builtin\.config: kubernetes_list: namespaces"
    ):
        check_tools(_spec(("kubernetes_list", {"namespaces": ["*"]})))
