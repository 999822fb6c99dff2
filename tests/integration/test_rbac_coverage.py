"""The chart's RBAC is exactly what the operator uses: nothing it does is forbidden, nothing granted is idle.

Self-contained, so it does not depend on which other tests ran: the emulator enforces the rules that
`helm template` renders for the operator's ServiceAccount (tests/support/rbac.py) on the operator's
token, the real operator process runs a workload that touches every feature needing the Kubernetes API,
and then:

1. no request of the operator was refused (the emulator answers 403 as a real server would, so a
   missing rule also shows up as a failing scenario);
2. every permission the chart grants answered at least one of the operator's requests, except those
   listed in PENDING, whose feature has not landed yet. A PENDING permission that is used now fails
   the test too, so the list only ever shrinks.

To cover a new feature: add a scenario to SCENARIOS (an async function of a Workload) and remove
the permissions it uses from PENDING.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentrun.sandbox.kube_api import KubeAPI
from agentrun.sandbox.messages_api import FakeMessagesAPI
from agentrun.sandbox.messages_script import (
    HttpError,
    Reply,
    Script,
    ScriptUsage,
    text_block,
    tool_use_block,
)
from tests.support.builders import agentrun
from tests.support.kube_client import KubeClient
from tests.support.operator_process import OperatorProcess
from tests.support.rbac import OPERATOR_USER, Permission, Policy, chart_policy

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "agentruns.agentrun.dev.yaml"
OPERATOR_TOKEN = "agentrun-operator-sa-token"
API_KEY = "sk-ant-rbac-coverage-0123456789"
RUN_KEY = "sk-ant-rbac-run-key-0123456789"
WATCHED = ("default", "team-a")
FINISHED = ("Succeeded", "Failed", "Cancelled")
MODEL = {"name": "claude-haiku-4-5"}

#: Chart permissions no scenario can exercise yet, with the feature that will use them.
#: (apiGroup, resource, verb) -> feature.
PENDING: dict[tuple[str, str, str], str] = {}


def _runs(namespace: str) -> str:
    return f"/apis/agentrun.dev/v1alpha1/namespaces/{namespace}/agentruns"


@dataclass
class Workload:
    """What a scenario may use: the admin client, the fake model's scripts, the watched namespaces."""

    admin: KubeClient
    namespaces: tuple[str, ...]
    restart: Callable[[], Awaitable[None]]
    names: list[tuple[str, str]] = field(default_factory=list)

    async def apply(self, namespace: str, name: str, task: str, **spec: Any) -> None:
        spec.setdefault("model", MODEL)
        answer = await self.admin.post(_runs(namespace), agentrun(name, task, namespace=namespace, **spec))
        assert answer.status == 201, answer.body
        self.names.append((namespace, name))

    async def status(self, namespace: str, name: str) -> dict[str, Any] | None:
        answer = await self.admin.get(f"{_runs(namespace)}/{name}")
        if answer.status == 404:
            return None
        assert answer.status == 200, answer.body
        return dict(answer.body.get("status") or {})

    async def wait_for(
        self,
        namespace: str,
        name: str,
        check: Callable[[dict[str, Any]], bool],
        what: str,
        timeout: float = 30,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        status: dict[str, Any] | None = {}
        while time.monotonic() < deadline:
            status = await self.status(namespace, name)
            if status is not None and check(status):
                return status
            await asyncio.sleep(0.1)
        raise AssertionError(f"{namespace}/{name}: {what} not reached within {timeout}s: {status}")

    async def finished(self, namespace: str, name: str) -> dict[str, Any]:
        return await self.wait_for(namespace, name, lambda s: s.get("phase") in FINISHED, "a finished phase")


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
        "[rbac:kubernetes]",
        [
            Reply([tool_use_block("kubernetes_list", {"resource": "configmaps"})]),
            Reply([text_block("listed")]),
        ],
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
    assert (await work.admin.post(f"/api/v1/namespaces/{namespace}/secrets", secret)).status == 201
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
    answer = await work.admin.patch(f"{_runs(namespace)}/cancel-me", {"spec": {"cancel": True}})
    assert answer.status == 200, answer.body
    assert (await work.finished(namespace, "cancel-me"))["phase"] == "Cancelled"


async def is_deleted_after_its_ttl(work: Workload) -> None:
    namespace = work.namespaces[0]
    # completionTime has whole seconds: a TTL of 1 s can run out a few ms after the run finishes.
    await work.apply(namespace, "short-lived", "[rbac:answer] ttl", ttlSecondsAfterFinished=2)
    await work.finished(namespace, "short-lived")
    deadline = time.monotonic() + 20
    while await work.status(namespace, "short-lived") is not None:
        assert time.monotonic() < deadline, "the finished run was not deleted after its TTL"
        await asyncio.sleep(0.2)


async def reads_the_cluster_as_its_service_account(work: Workload) -> None:
    """Kubernetes tools impersonate spec.serviceAccountName (the call may fail; the run finishes)."""
    namespace = work.namespaces[0]
    await work.apply(
        namespace,
        "kube-reader",
        "[rbac:kubernetes] list",
        serviceAccountName="agent",
        tools=[{"builtin": {"name": "kubernetes_list"}}],
    )
    await work.finished(namespace, "kube-reader")


async def resumes_after_a_restart(work: Workload) -> None:
    """A restarted operator finds the run's transcript chunks (a list by label) and resumes."""
    namespace = work.namespaces[0]
    await work.apply(namespace, "resumed", "[rbac:resume] 1+1", tools=[{"builtin": {"name": "calculator"}}])
    chunk = f"/api/v1/namespaces/{namespace}/secrets/resumed-transcript-0"
    deadline = time.monotonic() + 30
    while (await work.admin.get(chunk)).status != 200:
        assert time.monotonic() < deadline, "the tool_use answer was not stored"
        await asyncio.sleep(0.1)
    await work.restart()
    status = await work.finished(namespace, "resumed")
    assert (status["phase"], status["result"], status["iterations"]) == ("Succeeded", "resumed", 2)


async def takes_off_an_earlier_builds_finalizer(work: Workload) -> None:
    """Runs made by builds that used a Kopf daemon carry its finalizer; the operator removes it."""
    namespace = work.namespaces[-1]
    manifest = agentrun("inherited", "[rbac:answer] old", namespace=namespace, model=MODEL)
    manifest["metadata"]["finalizers"] = ["agentrun.dev/finalizer"]
    answer = await work.admin.post(_runs(namespace), manifest)
    assert answer.status == 201, answer.body
    work.names.append((namespace, "inherited"))
    await work.finished(namespace, "inherited")
    deadline = time.monotonic() + 20
    while (await work.admin.get(f"{_runs(namespace)}/inherited")).body["metadata"].get("finalizers"):
        assert time.monotonic() < deadline, "the earlier build's finalizer was not removed"
        await asyncio.sleep(0.1)


SCENARIOS: list[Callable[[Workload], Awaitable[None]]] = [
    succeeds_with_tools,
    waits_for_its_secret,
    retries_the_model,
    is_cancelled,
    is_deleted_after_its_ttl,
    reads_the_cluster_as_its_service_account,
    resumes_after_a_restart,
    takes_off_an_earlier_builds_finalizer,
]


@contextlib.asynccontextmanager
async def guarded_cluster(policy: Policy) -> AsyncIterator[KubeAPI]:
    async with KubeAPI.running(crd_paths=[CRD], rbac={OPERATOR_TOKEN: policy}) as kube:
        async with KubeClient(kube.url) as admin:
            for namespace in WATCHED:
                if namespace != "default":
                    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
                    assert (await admin.post("/api/v1/namespaces", body)).status == 201
        yield kube


async def run_workload(kube: KubeAPI, args: tuple[str, ...], log: Path) -> None:
    model = FakeMessagesAPI(scripts=SCRIPTS)
    async with model.running() as served:

        async def start(index: int) -> OperatorProcess:
            operator = OperatorProcess(
                kubeconfig=kube.kubeconfig_for(OPERATOR_TOKEN),
                log_path=log.with_name(f"{log.stem}-{index}{log.suffix}"),
                env={
                    "ANTHROPIC_API_KEY": API_KEY,
                    "ANTHROPIC_BASE_URL": served.url,
                    "AGENTRUN_SECRET_RETRY_SECONDS": "0.5",
                },
                args=args,
            )
            await operator.start()
            # The harness' own evidence snapshot at stop() is not the operator's: let it read as admin.
            operator.kubeconfig = kube.kubeconfig_path
            return operator

        operators = [await start(0)]

        async def restart() -> None:
            await operators[-1].stop(kill=True)
            operators.append(await start(len(operators)))

        try:
            async with KubeClient(kube.url) as admin:
                work = Workload(admin, WATCHED, restart)
                for scenario in SCENARIOS:
                    await scenario(work)
        finally:
            await operators[-1].stop()


def _key(permission: Permission) -> tuple[str, str, str]:
    return (permission.api_group, permission.resource, permission.verb)


@pytest.mark.parametrize(
    ("scope", "args"),
    [
        ("cluster", ("--all-namespaces",)),
        ("namespaces", tuple(arg for ns in WATCHED for arg in ("--namespace", ns))),
    ],
)
async def test_the_operator_needs_every_permission_the_chart_grants_and_no_other(
    scope: str, args: tuple[str, ...], tmp_path: Path
) -> None:
    policy = chart_policy(scope, WATCHED)
    async with guarded_cluster(policy) as kube:
        await run_workload(kube, args, tmp_path / "operator.log")
        decisions = list(kube.emulator.decisions)

    assert decisions, "the operator made no request with its own token"
    refused = [
        f"{d.record.method} {d.record.path}: "
        + "; ".join(c.describe() for c in d.checks if not policy.would_allow(c))
        for d in decisions
        if not d.allowed
    ]
    assert not refused, "the chart forbids requests the operator makes:\n" + "\n".join(refused)
    assert {c.user for d in decisions for c in d.checks} == {OPERATOR_USER}

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
