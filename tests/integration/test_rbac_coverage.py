"""The chart's RBAC is exactly what the operator uses: nothing it does is forbidden, nothing granted is idle.

Self-contained, so it does not depend on which other tests ran. The real operator process runs as the
chart's ServiceAccount, with a token of its own and nothing but the chart's rules, through a workload
that touches every feature needing the Kubernetes API:

* against the emulator, the rules `helm template` renders (tests/support/rbac.py) are enforced on
  the operator's token, and the emulator records every authorization question and its answer;
* against a real API server, the chart is `helm install`ed (its Deployment stays Pending: no
  kubelet), the operator runs locally with a token of the chart's ServiceAccount, and the server's own
  RBAC answers.

Then:

1. no request of the operator was refused (a missing rule also shows up as a failing scenario, as a
   refusal in the operator's log, and on the emulator in its authorization record);
2. (emulator) every permission the chart grants answered at least one of the operator's requests,
   except those listed in PENDING, whose feature has not landed yet. A PENDING permission that is
   used now fails the test too, so the list only ever shrinks.

To cover a new feature: add a scenario to SCENARIOS (an async function of a Workload) and remove
the permissions it uses from PENDING.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.kube import KubeEmulator
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import (
    HttpError,
    Reply,
    Script,
    ScriptUsage,
    text_block,
    tool_use_block,
)
from tests.support.builders import agentrun
from tests.support.clusters import RUNS_API, TestCluster
from tests.support.commands import run_command
from tests.support.operator_process import OperatorProcess
from tests.support.ports import free_port
from tests.support.quotas import install_quota_crd
from tests.support.rbac import (
    Permission,
    Policy,
    chart_policy,
    chart_values,
    grant_service_account,
    installed_chart,
)
from tests.support.sandbox_templates import create_template, install_template_crd
from tests.support.schedules import install_schedule_crd
from tests.support.waiting import until

API_KEY = "sk-ant-rbac-coverage-0123456789"
RUN_KEY = "sk-ant-rbac-run-key-0123456789"
OPERATOR_TOKEN = "agentrun-operator-sa-token"
FINISHED = ("Succeeded", "Failed", "Cancelled")
MODEL = {"name": "claude-haiku-4-5"}
#: How the operator's log reports a request the API server refused (Kopf's, the Kubernetes client's
#: and the operator's words; a bare 403 would match the milliseconds of a timestamp).
REFUSAL = re.compile(r"forbidden|not enough permissions|\(403\)|HTTP 403", re.IGNORECASE)

#: Chart permissions no scenario can exercise yet, with the feature that will use them.
#: (apiGroup, resource, verb) -> feature.
PENDING: dict[tuple[str, str, str], str] = {
    ("agentrun.dev", "agentrunquotas", "get"): "re-reading a quota after a 409, when another operator "
    "process wrote its ledger first (one process here: tests/unit/controller/quotas/test_writing.py)",
}


def _runs(namespace: str) -> str:
    return f"{RUNS_API}/namespaces/{namespace}/agentruns"


@dataclass
class Workload:
    """What a scenario may use: the cluster (as admin), the fake model, the watched namespaces."""

    cluster: TestCluster
    model: FakeMessagesAPI
    namespaces: tuple[str, ...]
    restart: Callable[[], Awaitable[None]]
    names: list[tuple[str, str]] = field(default_factory=list)

    async def apply(self, namespace: str, name: str, task: str, **spec: Any) -> None:
        spec.setdefault("model", MODEL)
        manifest = agentrun(name, task, namespace=namespace, **spec)
        code, body = await self.cluster.status_of("POST", _runs(namespace), json=manifest)
        assert code == 201, body
        self.names.append((namespace, name))

    async def status(self, namespace: str, name: str) -> dict[str, Any] | None:
        code, body = await self.cluster.status_of("GET", f"{_runs(namespace)}/{name}")
        if code == 404:
            return None
        assert code == 200, body
        return dict(body.get("status") or {})

    async def wait_for(
        self,
        namespace: str,
        name: str,
        check: Callable[[dict[str, Any]], bool],
        what: str,
        timeout: float = 60,
    ) -> dict[str, Any]:
        found: dict[str, Any] = await until(
            lambda: self.status(namespace, name),
            f"{namespace}/{name}: {what}",
            timeout,
            done=lambda status: status is not None and check(status),
            every=0.1,
        )
        return found

    async def finished(self, namespace: str, name: str) -> dict[str, Any]:
        return await self.wait_for(namespace, name, lambda s: s.get("phase") in FINISHED, "a finished phase")

    def tool_results(self, tag: str) -> list[dict[str, Any]]:
        """The tool_result blocks sent back to the model in the conversation tagged ``tag``."""
        return [
            block
            for request in self.model.requests
            if tag in json.dumps(request.body)
            for message in request.body["messages"][-1:]
            if isinstance(message["content"], list)
            for block in message["content"]
            if block.get("type") == "tool_result"
        ]


SCRIPTS = [
    Script(
        "[rbac:tools]",
        [
            Reply([tool_use_block("calculator", {"expression": "6*7"})], usage=ScriptUsage(50, 10, 0, 0)),
            Reply([text_block("42")], usage=ScriptUsage(60, 5, 0, 0)),
        ],
    ),
    Script("[rbac:answer]", [Reply([text_block("done")], usage=ScriptUsage(20, 5, 0, 0))]),
    Script(
        "[rbac:resume]",
        [
            Reply([tool_use_block("calculator", {"expression": "1+1"})], usage=ScriptUsage(30, 5, 0, 0)),
            Reply([text_block("resumed")], usage=ScriptUsage(40, 5, 0, 0), delay_seconds=2),
        ],
    ),
    Script(
        "[rbac:retry]",
        [Reply([text_block("after retries")], faults=[HttpError.rate_limit(retry_after=0.1, times=2)])],
    ),
    Script("[rbac:slow]", [Reply([text_block("too late")], delay_seconds=60)]),
    Script(
        "[rbac:fan-out]",
        [
            Reply([tool_use_block("ask", {"task": "[rbac:answer] child"}, id="toolu_child")]),
            Reply([text_block("the child answered")]),
        ],
    ),
    Script(
        "[rbac:kubernetes]",
        [
            Reply([tool_use_block("kubernetes_list", {"resource": "configmaps"})]),
            Reply([text_block("listed")]),
        ],
    ),
    Script(
        "[rbac:sandbox]", [Reply([tool_use_block("bash", {"command": "true"})]), Reply([text_block("ran")])]
    ),
]


async def succeeds_with_tools(work: Workload) -> None:
    """Every watched namespace: watch, status patches, Events, transcript."""
    for namespace in work.namespaces:
        await work.apply(namespace, "tools", "[rbac:tools] 6*7?", tools=[{"builtin": {"name": "calculator"}}])
    for namespace in work.namespaces:
        status = await work.finished(namespace, "tools")
        assert (status["phase"], status["result"]) == ("Succeeded", "42")


async def waits_for_its_secret(work: Workload) -> None:
    """Reads the run's API key Secret; it appears only after the run is Pending on it."""
    namespace = work.namespaces[-1]
    ref = {"name": "late-key", "key": "api-key"}
    await work.apply(namespace, "late-key", "[rbac:answer] key", model={**MODEL, "apiKeySecretRef": ref})
    await work.wait_for(
        namespace, "late-key", lambda s: s.get("phase") == "Pending" and "late-key" in str(s), "Pending"
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "late-key"},
        "data": {"api-key": base64.b64encode(RUN_KEY.encode()).decode()},
    }
    await work.cluster.request("POST", f"/api/v1/namespaces/{namespace}/secrets", json=secret)
    assert (await work.finished(namespace, "late-key"))["phase"] == "Succeeded"


async def retries_the_model(work: Workload) -> None:
    """Two 429s in a row: the second ModelRetry Event bumps the first one's count (a patch)."""
    namespace = work.namespaces[0]
    await work.apply(namespace, "retried", "[rbac:retry] again")
    assert (await work.finished(namespace, "retried"))["phase"] == "Succeeded"


async def is_cancelled(work: Workload) -> None:
    namespace = work.namespaces[0]
    await work.apply(namespace, "cancel-me", "[rbac:slow] forever")
    await work.wait_for(namespace, "cancel-me", lambda s: s.get("phase") == "Running", "Running")
    patch = {"spec": {"cancel": True}}
    headers = {"Content-Type": "application/merge-patch+json"}
    await work.cluster.request(
        "PATCH", f"{_runs(namespace)}/cancel-me", data=json.dumps(patch), headers=headers
    )
    assert (await work.finished(namespace, "cancel-me"))["phase"] == "Cancelled"


async def is_deleted_after_its_ttl(work: Workload) -> None:
    namespace = work.namespaces[0]
    # completionTime has whole seconds: a TTL of 1 s can run out a few ms after the run finishes.
    await work.apply(namespace, "short-lived", "[rbac:answer] ttl", ttlSecondsAfterFinished=2)
    await work.finished(namespace, "short-lived")
    await until(
        lambda: work.status(namespace, "short-lived"),
        "the finished run to be deleted after its TTL",
        30,
        done=lambda status: status is None,
        every=0.2,
    )


async def reads_the_cluster_as_its_service_account(work: Workload) -> None:
    """Kubernetes tools impersonate spec.serviceAccountName, which the chart must let the operator do."""
    namespace = work.namespaces[0]
    await grant_service_account(
        work.cluster,
        "agent",
        [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
        probe=f"/api/v1/namespaces/{namespace}/configmaps",
        namespace=namespace,
    )
    await work.apply(
        namespace,
        "kube-reader",
        "[rbac:kubernetes] list",
        serviceAccountName="agent",
        tools=[{"builtin": {"name": "kubernetes_list"}}],
    )
    status = await work.finished(namespace, "kube-reader")
    assert (status["phase"], status["result"]) == ("Succeeded", "listed")
    [listed] = work.tool_results("[rbac:kubernetes]")
    assert not listed.get("is_error"), listed


async def resumes_after_a_restart(work: Workload) -> None:
    """A restarted operator finds the run's transcript chunks (a list by label) and resumes."""
    namespace = work.namespaces[0]
    await work.apply(namespace, "resumed", "[rbac:resume] 1+1", tools=[{"builtin": {"name": "calculator"}}])
    chunk = f"/api/v1/namespaces/{namespace}/secrets/resumed-transcript-0"
    await until(
        lambda: work.cluster.status_of("GET", chunk),
        "the tool_use answer to be stored",
        60,
        done=lambda answer: answer[0] == 200,
        every=0.1,
    )
    await work.restart()
    status = await work.finished(namespace, "resumed")
    assert (status["phase"], status["result"], status["iterations"]) == ("Succeeded", "resumed", 2)


async def takes_off_an_earlier_builds_finalizer(work: Workload) -> None:
    """Runs made by builds that used a Kopf daemon carry its finalizer; the operator removes it."""
    namespace = work.namespaces[-1]
    manifest = agentrun("inherited", "[rbac:answer] old", namespace=namespace, model=MODEL)
    manifest["metadata"]["finalizers"] = ["agentrun.dev/finalizer"]
    await work.cluster.request("POST", _runs(namespace), json=manifest)
    work.names.append((namespace, "inherited"))
    await work.finished(namespace, "inherited")
    await until(
        lambda: work.cluster.request("GET", f"{_runs(namespace)}/inherited"),
        "the earlier build's finalizer to be removed",
        30,
        done=lambda run: not run["metadata"].get("finalizers"),
        every=0.1,
    )


async def is_admitted_by_a_quota(work: Workload) -> None:
    """An AgentRunQuota in the namespace: Kopf watches it, and the run's admission and its request's
    reservation are written to the quota's status (a replace with the resourceVersion read)."""
    namespace = work.namespaces[0]
    quotas = f"{RUNS_API}/namespaces/{namespace}/agentrunquotas"
    quota = {"metadata": {"name": "team"}, "spec": {"hard": {"concurrentRuns": 5, "tokens": 10_000_000}}}
    await work.cluster.request(
        "POST", quotas, json={"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRunQuota", **quota}
    )
    await work.apply(namespace, "within-quota", "[rbac:answer] quota")
    assert (await work.finished(namespace, "within-quota"))["phase"] == "Succeeded"
    ledger = (await work.cluster.request("GET", f"{quotas}/team"))["status"]
    assert ledger["used"]["runs"] == 1 and ledger["used"]["tokens"] > 0, ledger


async def runs_from_an_agent(work: Workload) -> None:
    """A run with spec.agentRef: Kopf watches Agents, and the run reads its Agent once."""
    namespace = work.namespaces[0]
    agent = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "answerer"},
        "spec": {"systemPrompt": "Answer briefly.", "model": MODEL},
    }
    await work.cluster.request("POST", f"{RUNS_API}/namespaces/{namespace}/agents", json=agent)
    await work.apply(namespace, "from-agent", "[rbac:answer] agent", agentRef={"name": "answerer"})
    assert (await work.finished(namespace, "from-agent"))["phase"] == "Succeeded"
    # The Agent's validation verdict goes to its status subresource.
    await until(
        lambda: work.cluster.request("GET", f"{RUNS_API}/namespaces/{namespace}/agents/answerer"),
        "the Agent's status to be written",
        30,
        done=lambda agent: "conditions" in agent.get("status", {}),
        every=0.2,
    )


async def runs_on_a_schedule(work: Workload) -> None:
    """An AgentSchedule (of the Agent above) owing a run: Kopf watches schedules and their runs, the
    operator creates the run, writes the schedule's status, posts its Event and deletes the finished run
    beyond the history limit."""
    namespace = work.namespaces[0]
    schedules = f"{RUNS_API}/namespaces/{namespace}/agentschedules"
    schedule = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentSchedule",
        "metadata": {"name": "nightly"},
        "spec": {
            "schedule": "* * * * *",
            "agentRef": {"name": "answerer"},
            "task": "[rbac:answer] {{scheduleName}}",
            "successfulRunsHistoryLimit": 0,
        },
    }
    await work.cluster.request("POST", schedules, json=schedule)
    past = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 300))
    await work.cluster.request(
        "PATCH",
        f"{schedules}/nightly/status",
        json={"status": {"lastScheduleTime": past}},
        headers={"Content-Type": "application/merge-patch+json"},
    )

    async def schedule_and_runs() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        status = (await work.cluster.request("GET", f"{schedules}/nightly")).get("status") or {}
        listing = await work.cluster.request(
            "GET", _runs(namespace), params={"labelSelector": "agentrun.dev/schedule=nightly"}
        )
        return status, listing["items"]

    # lastScheduleTime moves in the pass that created the run; a finished run is deleted (limit 0).
    await until(
        schedule_and_runs,
        "the scheduled run to be created, run and pruned",
        60,
        done=lambda seen: seen[0].get("lastSuccessfulTime") and not seen[1],
        every=0.2,
    )


async def fans_out_to_a_child(work: Workload) -> None:
    """An agent tool (of the Agent above): the operator creates a child run, reads it while it waits
    and writes the parent's status.children."""
    namespace = work.namespaces[0]
    tool = {"agent": {"name": "ask", "agentRef": {"name": "answerer"}, "description": "Asks a sub-agent."}}
    await work.apply(namespace, "parent", "[rbac:fan-out] delegate", tools=[tool])
    status = await work.finished(namespace, "parent")
    assert (status["phase"], status["children"]["succeeded"]) == ("Succeeded", 1), status


async def works_in_a_sandbox(work: Workload) -> None:
    """A run with spec.sandbox: its pod is the run's ServiceAccount's to make, its NetworkPolicy the
    operator's, made with the pod and removed when the run ends (the image is one no node has, so the
    run ends FatalToolError once the pod cannot start, with or without a node). It mounts a ConfigMap
    and a Secret: the operator waits for each to exist (Pending until the ConfigMap is made)."""
    namespace = work.namespaces[0]
    await grant_service_account(
        work.cluster,
        "sandboxer",
        [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete", "list"]},
            {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]},
        ],
        probe=f"/api/v1/namespaces/{namespace}/pods",
        namespace=namespace,
    )
    sandbox = {
        "image": "localhost/agentrun-sandbox-absent:none",
        "imagePullPolicy": "Never",
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "100m", "memory": "64Mi"},
        },
        "startTimeoutSeconds": 10,
        "volumes": [
            {"name": "files", "mountPath": "/etc/files", "configMap": {"name": "sandbox-files"}},
            {"name": "token", "mountPath": "/etc/token", "secret": {"secretName": "sandbox-token"}},
        ],
    }
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sandbox-token"}, "data": {}}
    await work.cluster.request("POST", f"/api/v1/namespaces/{namespace}/secrets", json=secret)
    await work.apply(
        namespace, "sandboxed", "[rbac:sandbox] run", serviceAccountName="sandboxer", sandbox=sandbox
    )
    await work.wait_for(
        namespace,
        "sandboxed",
        lambda s: s.get("phase") == "Pending" and "ConfigMapNotFound" in str(s.get("conditions")),
        "Pending until its ConfigMap exists",
    )
    files = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sandbox-files"}, "data": {}}
    await work.cluster.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", json=files)
    status = await work.finished(namespace, "sandboxed")
    assert (status["phase"], status["stopReason"]) == ("Failed", "FatalToolError"), status
    policies = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
    await until(
        lambda: work.cluster.request("GET", policies),
        "the sandbox's NetworkPolicy to be removed with the end of the run",
        30,
        done=lambda listing: not listing["items"],
        every=0.2,
    )


async def takes_its_sandbox_from_a_template(work: Workload) -> None:
    """A run with spec.sandbox.templateRef: Kopf watches SandboxTemplates, and the run reads its
    template once (the model calls no sandbox tool, so no pod is made)."""
    namespace = work.namespaces[0]
    resources = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}
    await create_template(
        work.cluster,
        "absent-image",
        namespace,
        image="localhost/agentrun-sandbox-absent:none",
        resources=resources,
    )
    await work.apply(
        namespace, "templated", "[rbac:answer] template", sandbox={"templateRef": {"name": "absent-image"}}
    )
    status = await work.finished(namespace, "templated")
    assert (status["phase"], status["sandboxTemplate"]["name"]) == ("Succeeded", "absent-image"), status


SCENARIOS: list[Callable[[Workload], Awaitable[None]]] = [
    succeeds_with_tools,
    waits_for_its_secret,
    retries_the_model,
    is_cancelled,
    is_deleted_after_its_ttl,
    reads_the_cluster_as_its_service_account,
    resumes_after_a_restart,
    takes_off_an_earlier_builds_finalizer,
    is_admitted_by_a_quota,
    works_in_a_sandbox,
    takes_its_sandbox_from_a_template,
    runs_from_an_agent,
    fans_out_to_a_child,
    runs_on_a_schedule,
]


@dataclass
class OperatorIdentity:
    """The chart's ServiceAccount as the operator logs in with it: exactly the chart's RBAC."""

    kubeconfig: Path
    #: The rules `helm template` renders for the account (on the emulator, the ones enforced).
    policy: Policy
    #: The emulator enforcing ``policy`` on the account's token; None on a real server.
    emulator: KubeEmulator | None = None

    def refusals(self, operator_log: str) -> list[str]:
        """Refused requests: what the log says, and on the emulator what its authorizer answered no to."""
        found = [f"operator log: {line}" for line in operator_log.splitlines() if REFUSAL.search(line)]
        for decision in self.emulator.decisions if self.emulator is not None else ():
            if not decision.allowed:
                denied = "; ".join(c.describe() for c in decision.checks if not self.policy.would_allow(c))
                found.append(f"{decision.record.method} {decision.record.path}: {denied}")
        return found


@dataclass(frozen=True)
class Layout:
    """The test's namespaces: the watched ones and the chart's own (not watched)."""

    watched: tuple[str, ...]
    release_namespace: str


@contextlib.asynccontextmanager
async def namespaces_of_the_test(cluster: TestCluster) -> AsyncIterator[Layout]:
    """The cluster's namespace and one more are watched; the chart goes into a third one."""
    layout = Layout((cluster.namespace, f"{cluster.namespace}-b"), f"{cluster.namespace}-sys")
    extra = [*layout.watched[1:], layout.release_namespace]
    for namespace in extra:
        await cluster.request("POST", "/api/v1/namespaces", json={"metadata": {"name": namespace}})
    try:
        yield layout
    finally:
        for namespace in layout.watched:  # a leftover finalizer would hold its namespace forever
            for run in (await cluster.request("GET", _runs(namespace)))["items"]:
                if run["metadata"].get("finalizers"):
                    patch = json.dumps({"metadata": {"finalizers": None}})
                    path = f"{_runs(namespace)}/{run['metadata']['name']}"
                    headers = {"Content-Type": "application/merge-patch+json"}
                    await cluster.status_of("PATCH", path, data=patch, headers=headers)
        for namespace in extra:
            await cluster.status_of("DELETE", f"/api/v1/namespaces/{namespace}")


@contextlib.asynccontextmanager
async def chart_identity(cluster: TestCluster, scope: str, layout: Layout) -> AsyncIterator[OperatorIdentity]:
    """The chart's ServiceAccount with the chart's RBAC in ``scope``, and a kubeconfig with its token."""
    # Unique per test: the chart's ClusterRole and ClusterRoleBinding are named after the release.
    release = f"rbaccov-{secrets.token_hex(3)}"
    namespace = layout.release_namespace
    policy = chart_policy(scope, layout.watched, release=release, release_namespace=namespace)
    if cluster.emulator is not None:
        cluster.emulator.authorizers[OPERATOR_TOKEN] = policy
        yield OperatorIdentity(cluster.kubeconfig_with_token(OPERATOR_TOKEN), policy, cluster.emulator)
        return
    async with installed_chart(cluster.kubeconfig, release, namespace, chart_values(scope, layout.watched)):
        account = policy.user.rpartition(":")[2]
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
        token = (await cluster.request("POST", path, json=request))["status"]["token"]
        yield OperatorIdentity(cluster.kubeconfig_with_token(token), policy)


async def run_workload(
    cluster: TestCluster,
    identity: OperatorIdentity,
    layout: Layout,
    args: tuple[str, ...],
    log: Path,
) -> str:
    """Every scenario, with the operator logged in as ``identity``; its log (all its processes').

    As the chart runs it: a replica with its Lease in the release namespace, under one name throughout,
    so the restarted process takes over the Lease the killed one left (a create refused, a get, an update).
    """
    namespaces = layout.watched
    model = FakeMessagesAPI(scripts=SCRIPTS)
    async with model.running() as served:

        async def start(index: int) -> OperatorProcess:
            operator = cluster.operator_process_as(
                identity.kubeconfig,
                log.with_name(f"{log.stem}-{index}{log.suffix}"),
                {
                    "ANTHROPIC_API_KEY": API_KEY,
                    "ANTHROPIC_BASE_URL": served.url,
                    "AGENTRUN_SECRET_RETRY_SECONDS": "0.5",
                    "AGENTRUN_LEASE_NAMESPACE": layout.release_namespace,
                    "AGENTRUN_REPLICA_NAME": "rbac-coverage",
                },
                args,
            )
            await operator.start(ready_timeout=60)
            # The harness' own evidence snapshot at stop() is not the operator's: let it read as admin.
            operator.kubeconfig = cluster.kubeconfig
            return operator

        await install_quota_crd(cluster)  # before the operator: Kopf resolves what it watches at start
        await install_schedule_crd(cluster)
        await install_template_crd(cluster)
        operators = [await start(0)]

        async def restart() -> None:
            await operators[-1].stop(kill=True)
            operators.append(await start(len(operators)))

        try:
            work = Workload(cluster, served, namespaces, restart)
            for scenario in SCENARIOS:
                await scenario(work)
        finally:
            await operators[-1].stop()
    return "\n".join(operator.logs() for operator in operators)


def _watching(namespaces: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(arg for namespace in namespaces for arg in ("--namespace", namespace))


def _key(permission: Permission) -> tuple[str, str, str]:
    return (permission.api_group, permission.resource, permission.verb)


async def test_the_chart_allows_every_request_the_operator_makes(
    cluster: TestCluster, tmp_path: Path
) -> None:
    async with (
        namespaces_of_the_test(cluster) as layout,
        chart_identity(cluster, "namespaces", layout) as identity,
    ):
        log = await run_workload(cluster, identity, layout, _watching(layout.watched), tmp_path / "op.log")
    refused = identity.refusals(log)
    assert not refused, "the chart forbids requests the operator makes:\n" + "\n".join(refused)


@pytest.mark.emulator_only(
    "counts which chart rule answered each of the operator's requests, which needs the emulator's "
    "record of every authorization decision (the real server's audit log is off)"
)
@pytest.mark.parametrize("scope", ["cluster", "namespaces"])
async def test_the_operator_needs_every_permission_the_chart_grants_and_no_other(
    scope: str, cluster: TestCluster, tmp_path: Path
) -> None:
    async with (
        namespaces_of_the_test(cluster) as layout,
        chart_identity(cluster, scope, layout) as identity,
    ):
        args = ("--all-namespaces",) if scope == "cluster" else _watching(layout.watched)
        log = await run_workload(cluster, identity, layout, args, tmp_path / "operator.log")
    assert identity.emulator is not None
    decisions = list(identity.emulator.decisions)
    policy = identity.policy

    assert decisions, "the operator made no request with its own token"
    refused = identity.refusals(log)
    assert not refused, "the chart forbids requests the operator makes:\n" + "\n".join(refused)
    assert {c.user for d in decisions for c in d.checks} == {policy.user}

    questions = [check for decision in decisions for check in decision.checks]
    unused = policy.unused(questions)
    unexplained = [str(p) for p in unused if _key(p) not in PENDING]
    assert not unexplained, "the chart grants permissions the operator never uses:\n" + "\n".join(unexplained)
    used_now = sorted(
        f"{key} ({feature})"
        for key, feature in PENDING.items()
        if key not in {_key(p) for p in unused} and key in {_key(p) for p in policy.permissions()}
    )
    assert not used_now, "these PENDING permissions are used now, remove them from PENDING:\n" + "\n".join(
        used_now
    )


async def test_the_charts_cluster_role_serving_named_namespaces_does_not_make_kopf_list_namespaces(
    cluster: TestCluster, tmp_path: Path
) -> None:
    """The chart's default RBAC (rbac.scope: cluster) grants no Namespaces: `--namespace` names them
    exactly, so Kopf is told not to scan instead of retrying a 403 for a minute before the first run."""
    async with (
        namespaces_of_the_test(cluster) as layout,
        chart_identity(cluster, "cluster", layout) as identity,
        FakeMessagesAPI(scripts=SCRIPTS).running() as served,
    ):
        env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": served.url}
        log = tmp_path / "operator.log"
        operator = cluster.operator_process_as(identity.kubeconfig, log, env, _watching(layout.watched))
        await operator.start(ready_timeout=60)
        operator.kubeconfig = cluster.kubeconfig
        try:

            async def unused_restart() -> None:
                raise AssertionError("not restarted here")

            await succeeds_with_tools(Workload(cluster, served, layout.watched, unused_restart))
        finally:
            await operator.stop()
    logs = operator.logs()
    refused = identity.refusals(logs)
    assert not refused, "the operator made requests its RBAC refuses:\n" + "\n".join(refused)
    assert (
        "this identity may not list and watch namespaces (cluster-wide): the operator serves "
        f"{', '.join(layout.watched)} as named without scanning the cluster; a CRD installed from now on is "
        "served after a restart"
    ) in logs


async def test_a_namespace_pattern_without_the_right_to_list_namespaces_stops_the_operator_in_one_line(
    cluster: TestCluster,
) -> None:
    async with (
        namespaces_of_the_test(cluster) as layout,
        chart_identity(cluster, "cluster", layout) as identity,
    ):
        pattern = f"{cluster.namespace}*"
        code, out, err = await run_command(
            *_operator_command("--namespace", pattern),
            env={"KUBECONFIG": str(identity.kubeconfig)},
            timeout=60,
        )
    assert (code, out) == (1, ""), err
    assert err.splitlines() == [
        f"error: cannot serve namespaces matching {pattern}: this identity may not list and watch namespaces "
        "(cluster-wide), which matching namespace patterns needs; grant it (the chart's rbac.scope: "
        "namespaces does) or name the namespaces exactly"
    ]


def _operator_command(*args: str) -> list[str]:
    ports = ("--metrics-port", str(free_port()), "--health-port", str(free_port()))
    return [
        str(Path(sys.executable).parent / "agentrun"),
        "operator",
        "--bind-address",
        "127.0.0.1",
        *ports,
        *args,
    ]
