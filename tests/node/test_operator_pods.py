"""The operator as users run it: the image from the Dockerfile, installed by the chart, in pods on a node.

Each scenario installs the chart into a namespace of its own that enforces the restricted Pod Security
Standard, with the built image and the fake Messages API on this host, and drives it with kubectl and
the API as a user would: install, runs, pod deletion, rolling restarts, upgrades, evictions, probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI, RecordedRequest
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.console import READ_RUNS, browser_session, person, sign_in
from tests.support.kube_requests import FINISHED, until
from tests.support.node import (
    HOST_ADDRESS,
    Helm,
    PodExits,
    Release,
    create_api_key_secret,
    is_ready,
    release_values,
    restarts,
)
from tests.support.postgres import running_postgres
from tests.support.quotas import create_quota, ledger_row, quota_status

API_KEY = "sk-ant-node-secret-0123456789"
#: The chart's default terminationGracePeriodSeconds: old pods must be gone well inside it.
GRACE_SECONDS = 60


def answer_script(tag: str) -> Script:
    return Script(
        tag,
        [
            Reply(
                [tool_use_block("calculator", {"expression": "17*23+4"})], usage=ScriptUsage(120, 30, 0, 0)
            ),
            Reply([text_block("395")], usage=ScriptUsage(160, 12, 0, 0)),
        ],
    )


def steps_script(tag: str, steps: int, delay: float) -> Script:
    """``steps`` calculator turns, each answer ``delay`` seconds in coming: a run to catch mid-way."""
    turns = [
        Reply([tool_use_block("calculator", {"expression": f"{i}+1"})], delay_seconds=delay)
        for i in range(steps)
    ]
    return Script(tag, [*turns, Reply([text_block("done")], delay_seconds=delay)])


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            answer_script("[node:answer]"),
            steps_script("[node:steps]", steps=8, delay=1.0),
            steps_script("[node:long]", steps=24, delay=1.5),
        ],
        require_api_key=API_KEY,
    )
    async with api.running(host=HOST_ADDRESS) as server:
        yield server


@pytest.fixture
async def release(cluster: TestCluster, helm: Helm, model: FakeMessagesAPI) -> AsyncIterator[Release]:
    """An uninstalled release of the chart for this namespace; uninstalled afterwards if installed."""
    await create_api_key_secret(cluster, API_KEY)
    chosen = Release(
        cluster, helm, release_values(cluster, model.url), name=f"agentrun-operator-{secrets.token_hex(3)}"
    )
    try:
        yield chosen
    finally:
        _, listed = await helm.run("list", "--namespace", cluster.namespace, "-q", check=False)
        if chosen.name in listed.split():
            with contextlib.suppress(AssertionError):
                await chosen.uninstall()


async def create_runs(cluster: TestCluster, prefix: str, tag: str, count: int) -> list[str]:
    names = [f"{prefix}-{i:02d}" for i in range(count)]
    for name in names:
        manifest = agentrun(
            name,
            f"{tag} {name}",
            namespace=cluster.namespace,
            model={"name": "claude-haiku-4-5"},
            tools=[{"builtin": {"name": "calculator"}}],
        )
        manifest["spec"]["limits"] = {"maxIterations": 40}
        await cluster.request("POST", cluster.runs_path, json=manifest)
    return names


async def wait_all_finished(cluster: TestCluster, names: list[str], timeout: float) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def finished() -> bool:
        listed = await cluster.request("GET", cluster.runs_path)
        found.clear()
        found.update({r["metadata"]["name"]: r for r in listed["items"] if r["metadata"]["name"] in names})
        return len(found) == len(names) and all(
            r.get("status", {}).get("phase") in FINISHED for r in found.values()
        )

    await until(finished, f"{len(names)} runs to finish", timeout)
    return found


async def uid_and_gid(cluster: TestCluster, pod: str) -> str:
    code, out = await cluster.kubectl(
        "exec",
        "-n",
        cluster.namespace,
        pod,
        "--",
        "python",
        "-c",
        "import os; print(os.getuid(), os.getgid())",
    )
    assert code == 0, out
    return out.strip()


def steps_by_run(requests: list[RecordedRequest]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = defaultdict(list)
    for request in sorted(requests, key=lambda r: r.arrived_at):
        if request.step is not None:
            found[request.body["metadata"]["user_id"]].append(request.step)
    return found


def repeated_steps(requests: list[RecordedRequest]) -> dict[str, list[int]]:
    """Per run uid, the steps the model was asked for more than once."""
    repeats = {}
    for uid, steps in steps_by_run(requests).items():
        twice = sorted(step for step, count in Counter(steps).items() if count > 1)
        if twice:
            repeats[uid] = twice
    return repeats


async def wait_mid_run(model: FakeMessagesAPI, tag: str, step: int = 2, timeout: float = 120) -> None:
    await until(
        lambda: any((r.step or 0) >= step for r in model.requests_for(tag)),
        f"a run of {tag} at step {step}",
        timeout,
    )


@pytest.mark.timeout(420)
async def test_the_chart_installs_into_a_restricted_namespace_and_runs_succeed_as_65532_or_any_uid(
    cluster: TestCluster, release: Release, model: FakeMessagesAPI
) -> None:
    out = await release.install()
    assert "STATUS: deployed" in out, out
    deployment = await cluster.request(
        "GET", cluster.path("deployments", release.deployment, api="/apis/apps/v1")
    )
    conditions = {c["type"]: c["status"] for c in deployment["status"]["conditions"]}
    assert conditions["Available"] == "True", deployment["status"]
    [pod] = await release.wait_ready(1)
    assert await uid_and_gid(cluster, pod["metadata"]["name"]) == "65532 65532"
    names = await create_runs(cluster, "first", "[node:answer]", 3)
    for name, run in (await wait_all_finished(cluster, names, 120)).items():
        assert (run["status"]["phase"], run["status"]["result"]) == ("Succeeded", "395"), (
            name,
            run["status"],
        )

    await release.uninstall()
    await until(lambda: _none(release), "the operator's pods to be gone after helm uninstall", 120)

    # Reinstalled as OpenShift's restricted SCC would run it: a UID no passwd entry names, GID 0.
    release.values["podSecurityContext"] = {"runAsUser": 1000650000, "runAsGroup": 0}
    await release.install()
    [pod] = await release.wait_ready(1)
    assert await uid_and_gid(cluster, pod["metadata"]["name"]) == "1000650000 0"
    assert restarts(pod) == 0, await release.logs()
    names = await create_runs(cluster, "second", "[node:answer]", 3)
    for name, run in (await wait_all_finished(cluster, names, 120)).items():
        assert run["status"]["phase"] == "Succeeded", (name, run["status"])


@pytest.mark.timeout(420)
async def test_the_charts_console_serves_each_person_as_themself_from_a_restricted_pod(
    cluster: TestCluster, release: Release, model: FakeMessagesAPI
) -> None:
    """console.enabled: its own pod from the same image, reached at its pod address over plain HTTP here
    (so no Secure cookie); a person signs in with their token and sees what their RBAC allows."""
    release.values["console"] = {"enabled": True, "secureCookies": False}
    await release.install()
    await release.wait_ready(1)
    names = await create_runs(cluster, "shown", "[node:answer]", 2)
    await wait_all_finished(cluster, names, 120)
    reader = await person(cluster, "reader", [READ_RUNS])
    nobody = await person(cluster, "nobody")
    selector = f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component=console"

    async def ready_console() -> dict[str, Any] | None:
        pods = (await cluster.request("GET", cluster.path("pods") + f"?labelSelector={selector}"))["items"]
        return next((p for p in pods if is_ready(p)), None)

    pod = await until(ready_console, "the console pod to be Ready", 180)
    assert pod is not None
    assert await uid_and_gid(cluster, pod["metadata"]["name"]) == "65532 65532"
    url = f"http://{pod['status']['podIP']}:8090"
    async with browser_session(url) as http:
        assert (await sign_in(http, reader.token)).status == 303
        everywhere = await http.get("/")  # the console's namespace is not set: all namespaces
        assert everywhere.status == 403 and "choose a namespace you may read" in await everywhere.text()
        page = await (await http.get("/", params={"namespace": cluster.namespace})).text()
        assert reader.username in page and all(f">{name}</a>" in page for name in names), page
        assert (await http.get("/static/console.js")).status == 200
    async with browser_session(url) as http:
        await sign_in(http, nobody.token)
        assert (await http.get("/", params={"namespace": cluster.namespace})).status == 403


async def _none(release: Release) -> bool:
    return not await release.pods()


@pytest.mark.timeout(420)
@pytest.mark.parametrize("how", ["graceful", "forced"])
async def test_a_pod_deleted_mid_run_is_replaced_and_its_runs_resume_without_asking_a_finished_step_again(
    cluster: TestCluster, release: Release, model: FakeMessagesAPI, how: str
) -> None:
    await release.install()
    [old] = await release.wait_ready(1)
    names = await create_runs(cluster, "mid", "[node:steps]", 5)
    await wait_mid_run(model, "[node:steps]")
    asked_before = len(model.requests_for("[node:steps]"))
    args = ["--force", "--grace-period=0"] if how == "forced" else []
    started = time.monotonic()
    code, out = await cluster.kubectl(
        "delete", "pod", "-n", cluster.namespace, old["metadata"]["name"], *args
    )
    assert code == 0, out
    deleted_after = time.monotonic() - started

    found = await wait_all_finished(cluster, names, 240)
    for name, run in found.items():
        assert (run["status"]["phase"], run["status"]["result"]) == ("Succeeded", "done"), (
            name,
            run["status"],
        )
        assert run["status"]["iterations"] == 9, (name, run["status"])
    [new] = await release.wait_ready(1)
    assert new["metadata"]["name"] != old["metadata"]["name"]
    requests = model.requests_for("[node:steps]")
    assert len(requests) > asked_before, "the new pod asked for the rest"
    repeats = repeated_steps(requests)
    if how == "graceful":
        # SIGTERM: each run goes on to its next checkpoint, then the new pod resumes from there.
        assert not repeats, f"steps asked again after a graceful delete: {repeats}"
        assert deleted_after < GRACE_SECONDS, f"kubectl delete waited {deleted_after:.1f}s for the old pod"
    else:
        # No grace: at most the step each run had in flight is asked again, once.
        assert all(len(steps) == 1 for steps in repeats.values()), repeats
        assert all(count <= 2 for count in _counts(requests).values()), _counts(requests)


def _counts(requests: list[RecordedRequest]) -> Counter[tuple[str, int]]:
    return Counter((r.body["metadata"]["user_id"], r.step or 0) for r in requests)


def most_runs_at_once(requests: list[RecordedRequest]) -> int:
    """How many runs were between their first and last model request at the same moment."""
    spans: dict[str, list[float]] = {}
    for r in requests:
        span = spans.setdefault(r.body["metadata"]["user_id"], [r.arrived_at, r.arrived_at])
        span[0], span[1] = min(span[0], r.arrived_at), max(span[1], r.arrived_at)
    edges = sorted([(a, 1) for a, _ in spans.values()] + [(b, -1) for _, b in spans.values()])
    at_once = most = 0
    for _, step in edges:
        at_once += step
        most = max(most, at_once)
    return most


@pytest.mark.timeout(480)
async def test_a_pod_killed_with_both_stores_in_postgresql_resumes_from_the_rows_and_the_quota_holds(
    cluster: TestCluster, release: Release, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    """The chart's database option as users run it: the DSN in a Secret, a PostgreSQL server the pod
    reaches over the network with a password, both stores kept there (operator.transcriptStorage and
    operator.quotaLedger: postgres), and a pod killed without grace mid-run."""
    password = secrets.token_hex(8)
    async with running_postgres(tmp_path, remote_address=HOST_ADDRESS, password=password) as postgres:
        await cluster.request(
            "POST",
            cluster.path("secrets"),
            json={"metadata": {"name": "agentrun-database"}, "stringData": {"url": postgres.remote_dsn}},
        )
        release.values["operator"].update({"transcriptStorage": "postgres", "quotaLedger": "postgres"})
        release.values["database"] = {"existingSecret": "agentrun-database"}
        await create_quota(cluster, "two-at-once", hard={"concurrentRuns": 2})
        await release.install()
        [old] = await release.wait_ready(1)
        names = await create_runs(cluster, "db", "[node:steps]", 4)
        await wait_mid_run(model, "[node:steps]")
        code, out = await cluster.kubectl(
            "delete", "pod", "-n", cluster.namespace, old["metadata"]["name"], "--force", "--grace-period=0"
        )
        assert code == 0, out

        found = await wait_all_finished(cluster, names, 300)
        for name, run in found.items():
            assert (run["status"]["phase"], run["status"]["iterations"]) == ("Succeeded", 9), (
                name,
                run["status"],
            )
            assert run["status"]["transcript"]["kind"] == "postgres", (name, run["status"])
        requests = model.requests_for("[node:steps]")
        repeats = repeated_steps(requests)
        assert all(len(steps) == 1 for steps in repeats.values()), repeats
        assert most_runs_at_once(requests) <= 2, "the quota of two runs at once was passed"
        uids = {run["metadata"]["uid"] for run in found.values()}
        rows = await postgres.query("SELECT DISTINCT run_uid FROM agentrun_transcript_chunks")
        assert {r["run_uid"] for r in rows} == uids
        listed = await cluster.request("GET", cluster.path("secrets"))
        assert not [s for s in listed["items"] if s["metadata"]["name"].startswith(tuple(names))], listed

        async def released() -> bool:
            row, status = await ledger_row(postgres), await quota_status(cluster, "two-at-once")
            return bool(row) and row["admitted"] == [] and status.get("ledger", {}).get("store") == "postgres"

        await until(released, "the quota's ledger row to hold no admitted run, mirrored in its status", 60)
        assert restarts((await release.wait_ready(1))[0]) == 0, await release.logs()


@pytest.mark.timeout(1200)
async def test_three_replicas_roll_restart_and_upgrade_with_50_runs_in_flight_and_lose_or_repeat_nothing(
    cluster: TestCluster, release: Release, model: FakeMessagesAPI
) -> None:
    release.values["replicas"] = 3
    await release.install(timeout="6m")
    first = {p["metadata"]["name"] for p in await release.wait_ready(3)}
    names = await create_runs(cluster, "roll", "[node:long]", 50)
    await wait_mid_run(model, "[node:long]", step=1)

    exits = PodExits()
    stop = asyncio.Event()
    watcher = asyncio.create_task(exits.watch(release, stop))
    try:
        code, out = await cluster.kubectl(
            "rollout", "restart", f"deployment/{release.deployment}", "-n", cluster.namespace
        )
        assert code == 0, out
        code, out = await cluster.kubectl(
            "rollout", "status", f"deployment/{release.deployment}", "-n", cluster.namespace, timeout=420
        )
        assert code == 0, out
        restarted = {p["metadata"]["name"] for p in await release.wait_ready(3, timeout=300)}
        assert not restarted & first
        in_flight = await _unfinished(cluster, names)
        assert in_flight, "every run finished before the upgrade: the scenario needs longer runs"
        # An upgrade that changes the pod template rolls the pods again.
        await release.upgrade({"podAnnotations": {"agentrun.dev/e2e-upgrade": "1"}})
        upgraded = {p["metadata"]["name"] for p in await release.wait_ready(3, timeout=300)}
        assert not upgraded & restarted
    finally:
        stop.set()
        await watcher

    found = await wait_all_finished(cluster, names, 600)
    failed = {n: r["status"] for n, r in found.items() if r["status"].get("phase") != "Succeeded"}
    assert not failed, failed
    assert all(r["status"]["iterations"] == 25 for r in found.values())
    repeats = repeated_steps(model.requests_for("[node:long]"))
    assert not repeats, f"steps asked again across two rolling updates: {repeats}"
    durations = exits.durations()
    assert len(durations) == 6, durations
    assert max(durations.values()) < GRACE_SECONDS, durations
    print(f"old pods gone after SIGTERM (s): {sorted(round(d, 1) for d in durations.values())}")


async def _unfinished(cluster: TestCluster, names: list[str]) -> list[str]:
    listed = await cluster.request("GET", cluster.runs_path)
    return [
        r["metadata"]["name"]
        for r in listed["items"]
        if r["metadata"]["name"] in names and r.get("status", {}).get("phase") not in FINISHED
    ]


@pytest.mark.timeout(480)
async def test_the_disruption_budget_lets_one_replica_of_three_be_evicted_at_a_time(
    cluster: TestCluster, release: Release
) -> None:
    release.values["replicas"] = 3
    await release.install(timeout="6m")
    pods = await release.wait_ready(3)
    budget = release.deployment
    path = f"/apis/policy/v1/namespaces/{cluster.namespace}/poddisruptionbudgets/{budget}"

    async def evaluated() -> bool:
        status = (await cluster.request("GET", path)).get("status", {})
        return bool(status.get("disruptionsAllowed") == 1 and status.get("currentHealthy") == 3)

    await until(evaluated, "the disruption budget to allow one disruption (a disruption controller runs)", 60)
    answers = []
    for pod in pods[:2]:
        name = pod["metadata"]["name"]
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
        code, body = await cluster.status_of("POST", cluster.path("pods", name) + "/eviction", json=eviction)
        answers.append((code, body.get("message", "") if isinstance(body, dict) else body))
    assert answers[0][0] == 201, answers
    assert answers[1][0] == 429 and "disruption budget" in answers[1][1], answers
    await release.wait_ready(3, timeout=240)


@pytest.mark.timeout(480)
async def test_the_kubelet_restarts_an_operator_whose_event_loop_is_stuck(
    cluster: TestCluster, release: Release
) -> None:
    # The test-only fault hook (controller/replicas/faults.py): SIGUSR1 blocks the event loop this long,
    # longer than the liveness probe's period x failureThreshold (10 s x 6).
    release.values["operator"]["extraEnv"] = [{"name": "AGENTRUN_FAULT_STALL_LOOP_SECONDS", "value": "600"}]
    await release.install()
    [pod] = await release.wait_ready(1)
    name = pod["metadata"]["name"]
    code, out = await cluster.kubectl(
        "exec",
        "-n",
        cluster.namespace,
        name,
        "--",
        "python",
        "-c",
        "import os, signal; os.kill(1, signal.SIGUSR1)",
    )
    assert code == 0, out

    async def restarted() -> bool:
        current = await cluster.request("GET", cluster.path("pods", name))
        return bool(restarts(current) >= 1)

    await until(restarted, "the kubelet to restart the stuck operator container", 240)
    [again] = await release.wait_ready(1, timeout=120)
    assert again["metadata"]["name"] == name, "the same pod, its container restarted"
    events = await cluster.request(
        "GET", cluster.path("events") + f"?fieldSelector=involvedObject.name={name}"
    )
    said = json.dumps([e.get("message", "") for e in events["items"]])
    assert "Liveness probe failed" in said, said
