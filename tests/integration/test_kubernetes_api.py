"""The AgentRun API as kubectl and helm users meet it, on the emulator and on a real API server.

Everything here is what the design promises a platform engineer about the resource itself: the CRD
installs, `kubectl explain` describes the fields, `kubectl wait` reads the Succeeded condition, `kubectl
get` prints the columns, the short name and the category resolve, and the status subresource keeps
spec and status writers apart. The chart installs with a real helm on a real server.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import secrets
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import HttpError, Reply, Script, ScriptUsage, text_block, tool_use_block
from tests.chart.tooling import find_tool
from tests.integration.test_gitops import argo_health
from tests.support import kstatus
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.operator_process import OperatorProcess
from tests.support.waiting import until

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
CHART = ROOT / "charts" / "agentrun-operator"
CRD_NAME = "agentruns.agentrun.dev"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
API_KEY = "sk-ant-kubernetes-api-0123456789"
MODEL = {"name": "claude-haiku-4-5"}
CALC = [{"builtin": {"name": "calculator"}}]
SCRIPTS = [
    Script(
        "[kapi:tools]",
        [
            Reply([tool_use_block("calculator", {"expression": "17*23+4"})], usage=ScriptUsage(1200, 40)),
            Reply([text_block("395 pods.")], usage=ScriptUsage(1300, 5)),
        ],
    ),
    Script("[kapi:denied]", [HttpError(error_type="permission_error")]),
]


@pytest.fixture
async def operator(cluster: TestCluster, tmp_path: Path) -> AsyncIterator[OperatorProcess]:
    async with FakeMessagesAPI(scripts=SCRIPTS).running() as served:
        env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": served.url}
        async with cluster.operator(tmp_path / "operator.log", env) as process:
            yield process


def _run(cluster: TestCluster, name: str, task: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("model", MODEL)
    return agentrun(name, task, namespace=cluster.namespace, **spec)


# --- the CRD -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", [CRDS, CHART / "crds"], ids=["crds", "chart-crds"])
async def test_the_crd_files_are_accepted_by_a_server_side_dry_run_and_nothing_is_stored(
    cluster: TestCluster, folder: Path
) -> None:
    before = await cluster.request("GET", f"{CRD_PATH}/{CRD_NAME}")
    code, out = await cluster.kubectl("apply", "--dry-run=server", "-f", str(folder))
    assert code == 0, out
    assert f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}" in out
    assert "(server dry run)" in out
    after = await cluster.request("GET", f"{CRD_PATH}/{CRD_NAME}")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


async def test_the_crd_schema_is_accepted_as_a_new_crd_by_a_server_side_dry_run(cluster: TestCluster) -> None:
    # An update may be judged against the stored CRD; creating one judges the whole file afresh.
    crd = yaml.safe_load((CRDS / f"{CRD_NAME}.yaml").read_text())
    group = f"dryrun{secrets.token_hex(4)}.agentrun.dev"
    crd["spec"]["group"] = group
    crd["metadata"]["name"] = f"{crd['spec']['names']['plural']}.{group}"
    code, out = await cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(crd))
    assert code == 0, out
    assert (
        out.strip()
        == f"customresourcedefinition.apiextensions.k8s.io/{crd['metadata']['name']} created (server dry run)"
    )
    status, _ = await cluster.status_of("GET", f"{CRD_PATH}/{crd['metadata']['name']}")
    assert status == 404
    groups = (await cluster.request("GET", "/apis"))["groups"]
    assert group not in {g["name"] for g in groups}, "a dry run must not serve the group"


def _schema_at(path: str) -> tuple[list[str], Mapping[str, Any]]:
    """The descriptions kubectl explain shows for ``path`` (an array's and its items') and its fields."""
    crd = yaml.safe_load((CRDS / f"{CRD_NAME}.yaml").read_text())
    node: Mapping[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    descriptions: list[str] = []
    for part in path.split(".")[1:]:
        node = node["properties"][part]
        descriptions = [node["description"]]
        if node.get("type") == "array":
            node = node["items"]
            descriptions.append(node["description"])
    return descriptions, node["properties"]


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(
    "field", ["agentrun.spec.limits", "agentrun.spec.model", "agentrun.spec.tools", "agentrun.status.usage"]
)
async def test_kubectl_explain_describes_the_field_and_each_of_its_fields(
    cluster: TestCluster, field: str
) -> None:
    descriptions, properties = _schema_at(field)
    assert all(descriptions) and properties
    described = _words(" ".join(descriptions))

    # A real server publishes a new schema a second or two after the CRD is applied.
    _, out = await until(
        lambda: cluster.kubectl("explain", field),
        f"kubectl explain {field} to describe it",
        60,
        done=lambda answer: answer[0] == 0 and described in _words(answer[1]),
        every=0.5,
    )
    text = _words(out)
    assert f"FIELD: {field.rsplit('.', 1)[1]} <" in out
    for name, child in properties.items():
        assert re.search(rf"^\s+{name}\s+<", out, re.MULTILINE), f"{name} missing from:\n{out}"
        assert child.get("description"), f"{field}.{name} has no description in the CRD"
        assert _words(child["description"]) in text, f"{field}.{name}: description missing from:\n{out}"


# --- kubectl wait and kubectl get ---------------------------------------------------------------------


async def test_kubectl_wait_for_condition_succeeded_returns_when_the_run_succeeds(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    await cluster.apply(_run(cluster, "calc", "[kapi:tools] pods?", tools=CALC))
    code, out = await cluster.kubectl("wait", "--for=condition=Succeeded", "agentrun/calc", "--timeout=90s")
    assert (code, out.strip()) == (0, "agentrun.agentrun.dev/calc condition met")
    obj = await cluster.get_run("calc")
    assert obj is not None
    status = obj["status"]
    assert (status["phase"], status["stopReason"], status["result"]) == ("Succeeded", "EndTurn", "395 pods.")
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert kstatus.compute(obj).status == "Current"
    assert argo_health(obj)[0] == "Healthy"


async def test_kubectl_wait_tells_a_failed_run_from_a_succeeded_one(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    await cluster.apply(_run(cluster, "denied", "[kapi:denied] hi"))
    code, out = await cluster.kubectl(
        "wait", "--for=condition=Succeeded=False", "agentrun/denied", "--timeout=90s"
    )
    assert (code, out.strip()) == (0, "agentrun.agentrun.dev/denied condition met")
    code, out = await cluster.kubectl("wait", "--for=condition=Succeeded", "agentrun/denied", "--timeout=2s")
    assert code != 0 and "timed out waiting for the condition" in out, out
    obj = await cluster.get_run("denied")
    assert obj is not None and obj["status"]["stopReason"] == "ModelError"


async def test_kubectl_get_agentruns_prints_phase_stop_reason_iterations_tokens_cost_and_age(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    await cluster.apply(_run(cluster, "calc", "[kapi:tools] pods?", tools=CALC))
    code, out = await cluster.kubectl("wait", "--for=condition=Succeeded", "agentrun/calc", "--timeout=90s")
    assert code == 0, out
    obj = await cluster.get_run("calc")
    assert obj is not None
    usage = obj["status"]["usage"]
    assert usage["totalTokens"] == 1200 + 40 + 1300 + 5
    code, out = await cluster.kubectl("get", "agentruns")
    assert code == 0, out
    header, row, *rest = out.splitlines()
    assert not rest, out
    assert header.split() == ["NAME", "PHASE", "STOP", "REASON", "ITERATIONS", "TOKENS", "COST", "AGE"]
    assert re.fullmatch(
        rf"calc\s+Succeeded\s+EndTurn\s+2\s+2545\s+{re.escape(str(usage['costUSD']))}\s+\d+s", row
    ), out


# --- the status subresource ---------------------------------------------------------------------------

MERGE = {"Content-Type": "application/merge-patch+json"}


async def test_status_sent_to_the_object_is_ignored_and_spec_sent_to_status_is_ignored(
    cluster: TestCluster,
) -> None:
    # No operator: only this test writes the run.
    created = await cluster.request("POST", cluster.runs_path, json=_run(cluster, "split", "the task"))
    path = f"{cluster.runs_path}/split"
    assert "status" not in created or not created["status"].get("phase")

    patched = await cluster.request("PATCH", path, json={"status": {"phase": "Succeeded"}}, headers=MERGE)
    assert (patched.get("status") or {}).get("phase") is None
    replaced = copy.deepcopy(patched)
    replaced["status"] = {"phase": "Succeeded", "iterations": 7}
    updated = await cluster.request("PUT", path, json=replaced)
    assert not (updated.get("status") or {}).get("phase")
    assert updated["metadata"]["generation"] == 1

    written = await cluster.request(
        "PATCH",
        f"{path}/status",
        json={"spec": {"task": "rewritten", "cancel": True}, "status": {"phase": "Running", "iterations": 3}},
        headers=MERGE,
    )
    assert written["spec"]["task"] == "the task" and "cancel" not in written["spec"]
    assert (written["status"]["phase"], written["status"]["iterations"]) == ("Running", 3)
    replaced = copy.deepcopy(written)
    replaced["spec"]["task"] = "rewritten by PUT"
    replaced["status"]["iterations"] = 4
    put = await cluster.request("PUT", f"{path}/status", json=replaced)
    assert put["spec"]["task"] == "the task" and put["status"]["iterations"] == 4

    stored = await cluster.request("GET", path)
    assert stored["spec"] == created["spec"]
    assert (stored["status"]["phase"], stored["status"]["iterations"]) == ("Running", 4)
    assert stored["metadata"]["generation"] == 1, "status writes never make a new generation"


# --- names ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("resource", ["ar", "agents", "agentrun", "agentruns.agentrun.dev"])
async def test_kubectl_finds_runs_by_short_name_category_and_full_name(
    cluster: TestCluster, resource: str
) -> None:
    for name in ("first", "second"):
        await cluster.request("POST", cluster.runs_path, json=_run(cluster, name, "x"))
    code, out = await cluster.kubectl("get", resource, "-o", "name")
    assert code == 0, out
    runs = sorted(line for line in out.split() if line.startswith("agentrun.agentrun.dev/"))
    # Other kinds may share the category; the runs are exactly ours.
    assert runs == ["agentrun.agentrun.dev/first", "agentrun.agentrun.dev/second"], out


# --- the chart ----------------------------------------------------------------------------------------------


async def _helm(cluster: TestCluster, home: Path, *args: str, timeout: float = 240) -> tuple[int, str]:
    helm = find_tool("helm")
    assert helm is not None, "helm is needed: run `make tools`"
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    proc = await asyncio.create_subprocess_exec(
        str(helm),
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--namespace",
        cluster.namespace,
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode()


async def _served_at(cluster: TestCluster, doc: Mapping[str, Any]) -> tuple[str, bool]:
    """The object's path, from the server's discovery, and whether it is namespaced."""
    api = doc["apiVersion"]
    base = f"/apis/{api}" if "/" in api else f"/api/{api}"
    discovery = await cluster.request("GET", base)
    [resource] = [r for r in discovery["resources"] if r["kind"] == doc["kind"] and "/" not in r["name"]]
    name = doc["metadata"]["name"]
    if resource["namespaced"]:
        return f"{base}/namespaces/{cluster.namespace}/{resource['name']}/{name}", True
    return f"{base}/{resource['name']}/{name}", False


@pytest.mark.real_only(
    "the emulator serves no Deployments or Services and no server-side apply, which helm install needs"
)
async def test_helm_installs_the_chart_and_uninstalls_it_without_leftovers(
    cluster: TestCluster, tmp_path: Path
) -> None:
    release = f"agentrun-it-{secrets.token_hex(3)}"
    cluster_scoped: list[str] = []
    try:
        code, out = await _helm(cluster, tmp_path, "install", release, str(CHART))
        assert code == 0, out
        assert "STATUS: deployed" in out

        # The CRD is shared by everything on the server: helm leaves an existing one alone, so the
        # one served must be the chart's.
        code, out = await cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s"
        )
        assert code == 0, out
        stored = await cluster.request("GET", f"{CRD_PATH}/{CRD_NAME}")
        chart_crd = yaml.safe_load((CHART / "crds" / f"{CRD_NAME}.yaml").read_text())
        assert stored["spec"]["names"] == {**chart_crd["spec"]["names"], "listKind": "AgentRunList"}
        assert stored["spec"]["versions"] == chart_crd["spec"]["versions"]

        code, manifest = await _helm(cluster, tmp_path, "get", "manifest", release)
        assert code == 0, manifest
        objects = [doc for doc in yaml.safe_load_all(manifest) if doc]
        kinds = {doc["kind"] for doc in objects}
        assert {"ServiceAccount", "Deployment", "Service", "ClusterRole", "ClusterRoleBinding"} <= kinds
        paths = []
        for doc in objects:
            path, namespaced = await _served_at(cluster, doc)
            paths.append(path)
            if not namespaced:
                cluster_scoped.append(path)
            served = await cluster.request("GET", path)
            assert served["metadata"]["labels"]["app.kubernetes.io/instance"] == release
            assert served["metadata"].get("namespace") == (cluster.namespace if namespaced else None)

        # helm install does not wait for the Deployment (with no kubelet its pod would never run): it
        # is stored as rendered.
        [deployment] = [doc for doc in objects if doc["kind"] == "Deployment"]
        name = deployment["metadata"]["name"]
        stored_deployment = await cluster.request(
            "GET", cluster.path("deployments", name, api="/apis/apps/v1")
        )
        rendered_pod = deployment["spec"]["template"]["spec"]
        stored_pod = stored_deployment["spec"]["template"]["spec"]
        assert stored_pod["serviceAccountName"] == rendered_pod["serviceAccountName"]
        for rendered_container, stored_container in zip(
            rendered_pod["containers"], stored_pod["containers"], strict=True
        ):
            for key in ("name", "image", "args"):  # fields the server fills no defaults into
                assert stored_container.get(key) == rendered_container.get(key), key

        code, out = await _helm(cluster, tmp_path, "uninstall", release, "--wait", "--timeout", "120s")
        assert code == 0, out
        for path in paths:
            status, body = await cluster.status_of("GET", path)
            assert status == 404, f"left behind after helm uninstall: {path}: {body}"
        # helm never deletes a chart's CRDs: the runs of every other release stay.
        assert (await cluster.status_of("GET", f"{CRD_PATH}/{CRD_NAME}"))[0] == 200
    finally:
        # The namespace goes with the test; what lives outside it must not outlive the test.
        await _helm(cluster, tmp_path, "uninstall", release, "--ignore-not-found")
        for path in cluster_scoped:
            await cluster.status_of("DELETE", path)
        label = f"app.kubernetes.io/instance={release}"
        await cluster.kubectl("delete", "clusterroles,clusterrolebindings", "-l", label, "--ignore-not-found")
