"""The web console in a real browser: headless Chromium from Debian's packages, driven through its
chromedriver (tests/support/browsers.py), against `agentrun console` started as users start it, with the
operator running a run that waits for an approval. On the emulator and on the real API server.

Screenshots of the pages land in the test's folder, and in AGENTRUN_CONSOLE_SCREENSHOTS when set (the
docs' images are made that way: docs/console.md).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.browsers import Browser, chromium, console_process
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.console import DECIDE, READ_RUNS, READ_TRANSCRIPTS, person

API_KEY = "sk-ant-console-0123456789"
SCENARIO = "[scenario:console-calc]"


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    script = Script(
        SCENARIO,
        [
            Reply(
                [
                    text_block("Let me compute that."),
                    tool_use_block("calculator", {"expression": "6*7"}, id="toolu_b1"),
                ]
            ),
            Reply([text_block("42.")]),
        ],
    )
    async with FakeMessagesAPI(scripts=[script], require_api_key=API_KEY).running() as server:
        yield server


def screenshot(browser: Browser, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    browser.driver.save_screenshot(str(path))
    if target := os.environ.get("AGENTRUN_CONSOLE_SCREENSHOTS"):
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)


async def sign_in(browser: Browser, token: str) -> None:
    await browser.open("/login")
    await browser.press(browser.find(By.ID, "token"), token, Keys.ENTER)  # the keyboard alone signs in
    await browser.until_live()


@pytest.mark.timeout(240)
async def test_in_chromium_a_reader_is_refused_and_an_approver_approves_a_live_run(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    alice = await person(cluster, "alice", [READ_RUNS, DECIDE, READ_TRANSCRIPTS])
    bob = await person(cluster, "bob", [READ_RUNS])
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url}
    tools = [{"builtin": {"name": "calculator"}, "requiresApproval": True}]
    run_page = f"/runs/{cluster.namespace}/guarded"
    async with (
        cluster.operator(tmp_path / "operator.log", env),
        console_process(cluster, tmp_path / "console.log") as url,
        chromium(url) as browser,
    ):
        await sign_in(browser, bob.token)
        assert bob.username in browser.text("header")
        # Created after the page opened: the row comes from the live stream, then its phase changes.
        await cluster.apply(
            agentrun("guarded", f"{SCENARIO} what is 6*7?", namespace=cluster.namespace, tools=tools)
        )
        await browser.until_text("#runs", "AwaitingApproval")
        screenshot(browser, tmp_path, "console-runs")
        await browser.press(browser.find(By.LINK_TEXT, "guarded"), Keys.ENTER)
        await browser.until_live()
        assert "Waiting for approval" in browser.text("#approvals")
        assert "may not read this run's transcript" in browser.text("#transcript")
        await browser.press(browser.find(By.NAME, "reason"), "looks right", Keys.ENTER)
        await browser.until_text("main", "Not allowed")
        assert "forbidden" in browser.text("main").lower()

        await browser.press(browser.find(By.CSS_SELECTOR, "form[action='/logout'] button"), Keys.ENTER)
        await browser.until_text("main", "Paste a bearer token")
        await sign_in(browser, alice.token)
        await browser.open(run_page)
        await browser.until_live()
        assert "Let me compute that." in browser.text("#transcript")
        screenshot(browser, tmp_path, "console-run")
        await browser.press(browser.find(By.NAME, "reason"), "looks right", Keys.ENTER)
        await browser.until_live()
        await browser.until_text("#summary", "Succeeded")
        await browser.until_text("#transcript", "42.")
        screenshot(browser, tmp_path, "console-run-finished")

        assert browser.foreign_requests() == []
        browser.driver.set_window_size(360, 740)
        await browser.open(run_page)
        assert browser.horizontal_overflow() <= 0, "the page scrolls sideways at 360 px"

    run: dict[str, Any] = await cluster.request("GET", f"{cluster.runs_path}/guarded")
    assert run["spec"]["approvals"] == [
        {"toolUseId": "toolu_b1", "decision": "approve", "by": alice.username, "reason": "looks right"}
    ]
    assert run["status"]["result"] == "42."
