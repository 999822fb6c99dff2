"""Benchmark 7: the web console on big runs and long lists (issue #33).

A run of N turns (each a tool call whose result is ~R KB of varied text, so gzip cannot shrink it to
nothing) is stored as the operator stores it: one gzip record per turn, each a transcript Secret of the
run's own, the run's status naming them. `agentrun console` (in this process, as the emulator's admin)
then serves that run's page M times: the time from the request to the last byte of the page, the page's
size, and the time of a turn's own page (all of one large result). A namespace of L runs is then listed:
the runs page asks the API server for one page (limit/continue) and never for all of them, so its time
must not grow with L.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time
from pathlib import Path

import aiohttp

from agentrun.api.traces import TokenUsage, ToolTrace, TraceRow
from agentrun.api.transcripts import chunk_object, compress, name_prefix, record, split
from agentrun.console.serving import Console, ConsoleConfig, serving
from agentrun.kube import kubeconfig_loading
from agentrun_sandbox.kube import EmulatedCluster
from bench.figures import Figure, Section, Target, median, percentile, progress

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "agentruns.agentrun.dev.yaml"
RUNS = "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns"
WORDS = [
    "agent",
    "tool",
    "result",
    "kubernetes",
    "cluster",
    "token",
    "budget",
    "model",
    "request",
    "answer",
    "quota",
    "trace",
    "run",
]


def turn_messages(turn: int, result_bytes: int, rng: random.Random) -> list[dict[str, object]]:
    text = " ".join(rng.choice(WORDS) + str(rng.randrange(1000)) for _ in range(result_bytes // 9))
    call = f"toolu_{turn:04d}"
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"Step {turn}: fetching the next page."},
                {"type": "tool_use", "id": call, "name": "fetch", "input": {"page": turn}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": text}]},
    ]


async def store_big_run(http: aiohttp.ClientSession, base: str, turns: int, result_bytes: int) -> int:
    """Creates the run and its transcript Secrets; returns the stored (compressed) bytes."""
    run = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "big"}}
    run["spec"] = {"task": "read every page"}
    async with http.post(base + RUNS, json=run) as answer:
        created = await answer.json()
    uid, rng, stored, first = created["metadata"]["uid"], random.Random(7), 0, 0
    messages: list[dict[str, object]] = [{"role": "user", "content": "read every page"}]
    for turn in range(1, turns + 1):
        new = (
            turn_messages(turn, result_bytes, rng)
            if turn > 1
            else [messages[0], *turn_messages(1, result_bytes, rng)]
        )
        usage = TokenUsage(input_tokens=1000 * turn, output_tokens=40)
        row = TraceRow(
            turn,
            "tool_use",
            (ToolTrace(f"toolu_{turn:04d}", "fetch", "h", 0.05, True),),
            usage,
            "claude-haiku-4-5",
        )
        doc = record(
            first=first, messages=new, trace=[row], progress={}, state={}, tools_pending=False, outcome=None
        )
        first += len(new)
        data = compress(doc)
        stored += len(data)
        parts = split(data)
        for part, payload in enumerate(parts):
            body = chunk_object(
                "secret",
                namespace="default",
                run_name="big",
                run_uid=uid,
                index=turn - 1,
                part=part,
                parts=len(parts),
                payload=payload,
            )
            async with http.post(base + "/api/v1/namespaces/default/secrets", json=body) as answer:
                assert answer.status == 201, await answer.text()
    status = {
        "status": {
            "phase": "Succeeded",
            "iterations": turns,
            "transcript": {
                "kind": "Secret",
                "namePrefix": name_prefix("big"),
                "chunks": turns,
                "bytes": stored,
            },
        }
    }
    headers = {"Content-Type": "application/merge-patch+json"}
    async with http.patch(base + RUNS + "/big/status", json=status, headers=headers) as answer:
        assert answer.status == 200, await answer.text()
    return stored


async def timed_get(http: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    started = time.perf_counter()
    async with http.get(url) as answer:
        body = await answer.read()
        assert answer.status == 200, body[:300]
    return time.perf_counter() - started, len(body)


def browser_seconds(url: str, repeats: int) -> list[float]:
    """Navigation start → load event in Debian's headless Chromium (empty without chromium and its
    driver): what a person waits for, parsing and layout included."""
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        return []
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    try:
        times = []
        for _ in range(repeats):
            driver.get(url)
            script = (
                "const t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd - t.startTime"
            )
            times.append(float(driver.execute_script(script)) / 1000)
        return times
    finally:
        driver.quit()


async def measure(section: Section, *, turns: int, result_bytes: int, repeats: int, list_runs: int) -> None:
    async with EmulatedCluster.running(crd_paths=[CRD]) as kube:
        headers = {"Authorization": f"Bearer {kube.token}"}
        async with aiohttp.ClientSession(headers=headers) as admin:
            progress(f"console: storing a run of {turns} turns with {result_bytes // 1000} KB results")
            stored = await store_big_run(admin, kube.url, turns, result_bytes)
            progress(f"console: creating {list_runs} runs")
            for i in range(list_runs):
                run = {
                    "apiVersion": "agentrun.dev/v1alpha1",
                    "kind": "AgentRun",
                    "metadata": {"name": f"r{i:05d}"},
                    "spec": {"task": "t"},
                }
                async with admin.post(kube.url + RUNS, json=run) as answer:
                    assert answer.status == 201
        access = await kubeconfig_loading.load(str(kube.kubeconfig_path))
        config = ConsoleConfig(auth="kubeconfig", secure_cookies=False, namespace="default")
        async with serving(Console.of(access, config), "127.0.0.1", 0) as port:
            url = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession() as person:
                await timed_get(person, url + "/")  # the session, and the identity, once
                pages = [await timed_get(person, url + "/runs/default/big") for _ in range(repeats)]
                whole = [
                    await timed_get(person, url + f"/runs/default/big/turns/{turns}") for _ in range(repeats)
                ]
                lists = [await timed_get(person, url + "/") for _ in range(repeats)]
            in_browser = await asyncio.to_thread(browser_seconds, url + "/runs/default/big", repeats)
    seconds = [p[0] for p in pages]
    section.add(
        Figure(
            f"a run of {turns} turns opens (request → last byte)",
            median(seconds),
            "s",
            repeats,
            Target(1.0),
            note=f"max {max(seconds):.3f} s; {stored / 2**20:.1f} MiB stored in {turns} Secrets",
        )
    )
    section.add(
        Figure(
            f"a run of {turns} turns: page size",
            pages[0][1] / 1024,
            "KiB",
            repeats,
            note="long results cut short, the whole on the turn's page",
        )
    )
    if in_browser:
        section.add(
            Figure(
                f"a run of {turns} turns opens in Chromium (navigation → load event)",
                median(in_browser),
                "s",
                repeats,
                Target(1.0),
                note=f"max {max(in_browser):.3f} s",
            )
        )
    section.add(Figure("one turn's page (its whole result)", median([w[0] for w in whole]), "s", repeats))
    section.add(
        Figure(
            f"the runs page with {list_runs + 1} runs in the namespace (one page of 50)",
            median([x[0] for x in lists]),
            "s",
            repeats,
            Target(1.0),
            note=f"p100 {percentile([x[0] for x in lists], 100):.3f} s",
        )
    )
