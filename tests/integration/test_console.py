"""The web console (`agentrun console`) over HTTP, on the emulator and on a real API server: every
person sees and may do what their own RBAC allows, never what the console could.

alice may read runs, decide on approvals and read transcripts in the namespace; bob may only read runs;
carol may do nothing. A run waiting for approval is written directly (no operator needed here; the
browser scenario in test_console_browser.py runs one through the operator).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentrun.api import LABEL_AGENT, LABEL_PARENT_UID
from agentrun.api.transcripts import POSTGRES_KIND, StoredChunk, compress, record
from agentrun.stores.postgres import TranscriptDatabase
from tests.support.approval_policy import approval_policy_in_force
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.console import (
    DECIDE,
    READ_RUNS,
    READ_TRANSCRIPTS,
    Person,
    browser_session,
    csrf_of,
    person,
    running_console,
    sign_in,
)
from tests.support.postgres import PostgresServer
from tests.support.quotas import create_quota, install_quota_crd
from tests.support.schedules import create_agent, create_schedule, install_schedule_crd

PENDING = {"toolUseId": "toolu_c1", "toolName": "calculator", "input": {"expression": "6*7"}}


async def waiting_run(cluster: TestCluster, name: str) -> dict[str, Any]:
    """A run with one call waiting for approval, as the operator would have written it."""
    created = await cluster.request(
        "POST", cluster.runs_path, json=agentrun(name, "what is 6*7?", namespace=cluster.namespace)
    )
    status = {
        "phase": "AwaitingApproval",
        "message": "1 tool call waiting for approval",
        "iterations": 1,
        "pendingApprovals": [{**PENDING, "since": "2026-11-28T12:00:00Z"}],
    }
    await cluster.request(
        "PATCH",
        f"{cluster.runs_path}/{name}/status",
        json={"status": status},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    return created


@pytest.fixture
async def people(cluster: TestCluster) -> dict[str, Person]:
    return {
        "alice": await person(cluster, "alice", [READ_RUNS, DECIDE, READ_TRANSCRIPTS]),
        "bob": await person(cluster, "bob", [READ_RUNS]),
        "carol": await person(cluster, "carol"),
    }


async def approvals_of(cluster: TestCluster, name: str) -> list[dict[str, Any]]:
    run = await cluster.request("GET", f"{cluster.runs_path}/{name}")
    return list(run["spec"].get("approvals") or [])


@pytest.fixture
async def approval_policy(cluster: TestCluster) -> AsyncIterator[str]:
    async with approval_policy_in_force(cluster) as name:
        yield name


@pytest.mark.usefixtures("approval_policy")
async def test_each_person_sees_and_may_do_only_what_their_own_rbac_allows(
    cluster: TestCluster, people: dict[str, Person]
) -> None:
    """With the chart's approval policy in force: a decision made in the console is recorded under the
    person's own name, which is what the policy admits."""
    await waiting_run(cluster, "guarded")
    run_page = f"/runs/{cluster.namespace}/guarded"
    async with running_console(cluster, auth="token") as url:
        async with browser_session(url) as carol:
            assert (await sign_in(carol, people["carol"].token)).status == 303
            listing = await carol.get("/")
            assert listing.status == 403
            assert "You may not list agentruns in namespace" in await listing.text()
            assert (await carol.get(run_page)).status == 403

        async with browser_session(url) as bob:
            await sign_in(bob, people["bob"].token)
            listing = await bob.get("/")
            text = await listing.text()
            assert listing.status == 200 and "guarded" in text and people["bob"].username in text
            page = await (await bob.get(run_page)).text()
            assert "Waiting for approval" in page and "toolu_c1" in page
            assert "You may not read this run&#x27;s transcript" in page
            answer = await bob.post(
                f"{run_page}/decisions",
                data={"csrf": csrf_of(page), "toolUseId": "toolu_c1", "decision": "approve"},
                allow_redirects=False,
            )
            assert answer.status == 403, await answer.text()
            assert await approvals_of(cluster, "guarded") == []

        async with browser_session(url) as alice:
            await sign_in(alice, people["alice"].token)
            page = await (await alice.get(run_page)).text()
            assert "No turn stored yet" in page  # she may read transcripts: there is none yet
            answer = await alice.post(
                f"{run_page}/decisions",
                data={
                    "csrf": csrf_of(page),
                    "toolUseId": "toolu_c1",
                    "decision": "deny",
                    "reason": "not now",
                },
                allow_redirects=False,
            )
            assert answer.status == 303, await answer.text()
            assert answer.headers["Location"] == run_page
    assert await approvals_of(cluster, "guarded") == [
        {"toolUseId": "toolu_c1", "decision": "deny", "by": people["alice"].username, "reason": "not now"}
    ]


@pytest.mark.real_only("the emulator authenticates nobody: an unknown token acts as its admin")
async def test_a_token_the_api_server_refuses_does_not_sign_in(cluster: TestCluster) -> None:
    async with running_console(cluster, auth="token") as url, browser_session(url) as http:
        answer = await sign_in(http, "not-a-token")
        assert answer.status == 401 and "does not accept this token" in await answer.text()
        assert (await http.get("/", allow_redirects=False)).headers["Location"] == "/login"


async def test_forms_need_the_sessions_own_token_and_the_cookie_is_locked_down(
    cluster: TestCluster, people: dict[str, Person], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await waiting_run(cluster, "guarded")
    decisions = f"/runs/{cluster.namespace}/guarded/decisions"
    async with (
        running_console(cluster, auth="token") as url,
        browser_session(url) as bob,
        browser_session(url) as alice,
    ):
        await sign_in(bob, people["bob"].token)
        signed_in = await sign_in(alice, people["alice"].token)
        cookie = signed_in.headers["Set-Cookie"]
        assert all(flag in cookie for flag in ("HttpOnly", "Secure", "SameSite=Strict")), cookie
        page = await (await alice.get(f"/runs/{cluster.namespace}/guarded")).text()
        others = csrf_of(await (await bob.get("/")).text())
        form = {"toolUseId": "toolu_c1", "decision": "approve"}
        for sent in ({}, {"csrf": others}, {"csrf": "forged"}):
            answer = await alice.post(decisions, data={**form, **sent}, allow_redirects=False)
            assert answer.status == 403, sent
        cross_site = await alice.post(
            decisions,
            data={**form, "csrf": csrf_of(page)},
            headers={"Origin": "https://elsewhere.example"},
            allow_redirects=False,
        )
        assert cross_site.status == 403
        assert await approvals_of(cluster, "guarded") == []
        headers = (await alice.get("/")).headers
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
        assert "default-src 'self'" in headers["Content-Security-Policy"]
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert people["alice"].token not in logged and people["bob"].token not in logged
    assert f"signed in: {people['alice'].username}" in logged


async def test_behind_an_authenticating_proxy_the_console_acts_as_the_person_it_names(
    cluster: TestCluster, people: dict[str, Person]
) -> None:
    await waiting_run(cluster, "guarded")
    async with running_console(cluster, auth="proxy") as url:
        async with aiohttp.ClientSession(url) as http:
            assert (await http.get("/")).status == 401  # not through the proxy: no one to act as
            as_carol = {"X-Forwarded-User": people["carol"].username}
            assert (await http.get("/", headers=as_carol)).status == 403
        async with browser_session(url) as bob:
            as_bob = {"X-Forwarded-User": people["bob"].username}
            page = await bob.get(f"/runs/{cluster.namespace}/guarded", headers=as_bob)
            assert page.status == 200
            answer = await bob.post(
                f"/runs/{cluster.namespace}/guarded/decisions",
                data={"csrf": csrf_of(await page.text()), "toolUseId": "toolu_c1", "decision": "approve"},
                headers=as_bob,
                allow_redirects=False,
            )
            assert answer.status == 403
        async with browser_session(url) as alice:
            as_alice = {"X-Forwarded-User": people["alice"].username}
            page = await alice.get(f"/runs/{cluster.namespace}/guarded", headers=as_alice)
            answer = await alice.post(
                f"/runs/{cluster.namespace}/guarded/decisions",
                data={"csrf": csrf_of(await page.text()), "toolUseId": "toolu_c1", "decision": "approve"},
                headers=as_alice,
                allow_redirects=False,
            )
            assert answer.status == 303, await answer.text()
    [decision] = await approvals_of(cluster, "guarded")
    assert (decision["decision"], decision["by"]) == ("approve", people["alice"].username)


async def test_the_runs_list_pages_from_the_api_server_and_follows_new_runs_live(
    cluster: TestCluster, people: dict[str, Person]
) -> None:
    for i in range(5):
        await cluster.request(
            "POST", cluster.runs_path, json=agentrun(f"paged-{i}", "t", namespace=cluster.namespace)
        )
    async with running_console(cluster, auth="token", page_size=2) as url, browser_session(url) as bob:
        await sign_in(bob, people["bob"].token)
        seen: list[str] = []
        path: str | None = "/"
        while path is not None:
            page = await (await bob.get(path)).text()
            rows = [n for n in (f"paged-{i}" for i in range(5)) if f">{n}</a>" in page]
            assert 1 <= len(rows) <= 2, page
            seen += rows
            marker = 'class="next" href="'
            path = page.split(marker, 1)[1].split('"', 1)[0].replace("&amp;", "&") if marker in page else None
        assert sorted(seen) == [f"paged-{i}" for i in range(5)]

        first = await (await bob.get("/")).text()
        version = first.split('data-resource-version="', 1)[1].split('"', 1)[0]
        live = await bob.get(
            "/live/runs",
            params={"namespace": cluster.namespace, "resourceVersion": version},
            timeout=aiohttp.ClientTimeout(total=30),
        )
        assert live.headers["Content-Type"].startswith("text/event-stream")
        await cluster.request(
            "POST", cluster.runs_path, json=agentrun("fresh", "t", namespace=cluster.namespace)
        )

        async def fresh_row() -> dict[str, Any]:
            event = ""
            async for line in live.content:
                text = line.decode().strip()
                if text.startswith("event: "):
                    event = text.removeprefix("event: ")
                elif text.startswith("data: ") and event == "row":
                    data: dict[str, Any] = json.loads(text.removeprefix("data: "))
                    if ">fresh</a>" in data["html"]:
                        return data
            raise AssertionError("the stream ended")

        row = await asyncio.wait_for(fresh_row(), 20)
        assert row["id"].startswith("run-") and "Pending" in row["html"]
        live.close()


@pytest.mark.emulator_only("the offline demo brings its own emulator")
@pytest.mark.timeout(180)
async def test_the_demo_serves_the_console_on_its_runs_and_says_where() -> None:
    """`make demo` prints the console's URL; with --keep-console it serves it until Ctrl-C."""
    demo = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "agentrun-sandbox"),
        "demo",
        "--keep-console",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert demo.stderr is not None
    try:
        url = ""
        while not url:
            line = (await asyncio.wait_for(demo.stderr.readline(), 150)).decode()
            assert line, "the demo ended without serving the console"
            if line.startswith("web console still at "):
                url = line.split()[4]
        async with aiohttp.ClientSession() as http, http.get(url) as page:
            text = await page.text()
        assert page.status == 200 and "calculator" in text, text
    finally:
        demo.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(demo.wait(), 30) == 0


async def labelled_run(
    cluster: TestCluster, name: str, labels: dict[str, str], **spec: Any
) -> dict[str, Any]:
    body = agentrun(name, "t", namespace=cluster.namespace, **spec)
    body["metadata"]["labels"] = labels
    created: dict[str, Any] = await cluster.request("POST", cluster.runs_path, json=body)
    return created


async def set_status(cluster: TestCluster, name: str, status: dict[str, Any]) -> None:
    await cluster.request(
        "PATCH",
        f"{cluster.runs_path}/{name}/status",
        json={"status": status},
        headers={"Content-Type": "application/merge-patch+json"},
    )


async def test_agents_schedules_quotas_and_children_are_shown_as_the_person_may_read_them(
    cluster: TestCluster,
) -> None:
    await install_quota_crd(cluster)
    await install_schedule_crd(cluster)
    await create_agent(cluster, "writer", model={"name": "claude-haiku-4-5"})
    await create_schedule(cluster, "nightly", schedule="0 3 * * *", agentRef={"name": "writer"}, task="t")
    await create_quota(cluster, "team", hard={"concurrentRuns": 1})
    for name in ("w1", "w2"):
        await labelled_run(cluster, name, {LABEL_AGENT: "writer"})
    # Two runs waiting for the quota: the more urgent one is first in its line whatever its age.
    for name, priority in (("late-low", 0), ("later-high", 5)):
        await labelled_run(cluster, name, {}, priority=priority)
        await set_status(
            cluster, name, {"phase": "Pending", "quotaWait": {"quota": "team", "limit": "concurrentRuns"}}
        )
    parent = await labelled_run(cluster, "parent", {})
    await set_status(cluster, "parent", {"phase": "Running", "children": {"total": 1, "active": 1}})
    await labelled_run(
        cluster, "parent-child", {LABEL_PARENT_UID: parent["metadata"]["uid"]}, limits={"costBudgetUSD": 0.5}
    )
    rules = [
        {
            "apiGroups": ["agentrun.dev"],
            "resources": ["agentruns", "agents", "agentschedules", "agentrunquotas"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    reader, nobody = await person(cluster, "reader", rules), await person(cluster, "nobody")
    async with running_console(cluster, auth="token") as url, browser_session(url) as http:
        await sign_in(http, reader.token)
        agents = await (await http.get("/agents")).text()
        assert ">writer</td>" in agents and "2 runs" in agents
        schedules = await (await http.get("/schedules")).text()
        assert ">nightly</td>" in schedules and "0 3 * * *" in schedules
        quotas = await (await http.get("/quotas")).text()
        assert "Runs at once" in quotas
        assert quotas.index(">later-high</a>") < quotas.index(">late-low</a>")
        page = await (await http.get(f"/runs/{cluster.namespace}/parent")).text()
        assert ">parent-child</a>" in page and "of $0.5" in page
        by_agent = await (await http.get("/", params={"agent": "writer"})).text()
        assert ">w1</a>" in by_agent and ">w2</a>" in by_agent and ">parent</a>" not in by_agent
    async with running_console(cluster, auth="token") as url, browser_session(url) as http:
        await sign_in(http, nobody.token)
        for page in ("/agents", "/schedules", "/quotas"):
            assert (await http.get(page)).status == 403, page


async def test_a_transcript_kept_in_postgresql_is_shown_to_whoever_may_list_the_namespaces_secrets(
    cluster: TestCluster, people: dict[str, Person], postgres: PostgresServer
) -> None:
    """The right that reads a transcript kept in Secrets reads one kept in the database: asked of the API
    server as the person (a SelfSubjectAccessReview) before the console reads the rows."""
    created = await labelled_run(cluster, "stored", {})
    uid = created["metadata"]["uid"]
    messages = [{"role": "user", "content": "the task"}, {"role": "assistant", "content": "kept in postgres"}]
    doc = record(
        first=0, messages=messages, trace=[], progress={}, state={}, tools_pending=False, outcome=None
    )
    database = await TranscriptDatabase.connect(postgres.dsn)
    try:
        await database.ensure_schema()
        chunk = StoredChunk(0, 0, 1, compress(doc))
        assert (
            await database.insert_chunk(
                run_uid=uid, namespace=cluster.namespace, run_name="stored", chunk=chunk
            )
            is None
        )
    finally:
        await database.close()
    ref = {"kind": POSTGRES_KIND, "namePrefix": "stored-transcript", "chunks": 1, "bytes": 100}
    await set_status(cluster, "stored", {"phase": "Succeeded", "transcript": ref})
    page = f"/runs/{cluster.namespace}/stored"
    async with running_console(cluster, auth="token", database_url=postgres.dsn) as url:
        async with browser_session(url) as alice:
            await sign_in(alice, people["alice"].token)
            assert "kept in postgres" in await (await alice.get(page)).text()
        async with browser_session(url) as bob:
            await sign_in(bob, people["bob"].token)
            text = await (await bob.get(page)).text()
            assert "kept in postgres" not in text and "it takes `list` on secrets" in text
    async with running_console(cluster, auth="token") as url, browser_session(url) as alice:
        await sign_in(alice, people["alice"].token)
        assert "no database configured" in await (await alice.get(page)).text()
