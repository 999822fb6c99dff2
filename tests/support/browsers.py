"""A real browser for the console's tests: Debian's headless Chromium through its own chromedriver
(scripts/install-tools.sh installs both; Selenium is told where they are, so nothing is downloaded), and
`agentrun console` started as a user starts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selenium import webdriver

from tests.support.clusters import TestCluster
from tests.support.ports import free_port
from tests.support.waiting import until


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: scripts/install-tools.sh installs it (make tools)")
    return found


@dataclass
class Browser:
    driver: webdriver.Chrome
    url: str

    async def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(function, *args)

    async def open(self, path: str) -> None:
        await self._call(self.driver.get, self.url + path)

    async def press(self, element: Any, *keys: str) -> None:
        """Keys typed into ``element``; the page is marked first, so `until_live` waits for the page the
        keys lead to rather than seeing this one's open stream."""
        await self._call(self.driver.execute_script, "document.body.dataset.live = 'left'")
        await self._call(element.send_keys, *keys)

    def find(self, by: str, value: str) -> Any:
        return self.driver.find_element(by, value)

    def text(self, selector: str) -> str:
        """The text shown in every element ``selector`` matches, read in one step: a live section can
        be swapped between finding an element and reading it."""
        script = (
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText).join('\\n')"
        )
        return str(self.driver.execute_script(script, selector))

    async def until_text(self, selector: str, text: str, timeout: float = 60) -> None:
        await until(
            lambda: asyncio.to_thread(lambda: text in self.text(selector)), f"{text!r} in {selector}", timeout
        )

    async def until_live(self, timeout: float = 30) -> None:
        """The page's live stream is open (console.js marks the body when its EventSource opens)."""

        def live() -> bool:
            return self.driver.execute_script("return document.body && document.body.dataset.live") == "open"

        await until(lambda: asyncio.to_thread(live), "the page's live stream to open", timeout)

    def foreign_requests(self) -> list[str]:
        """Every resource the pages loaded from anywhere but the console."""
        names = self.driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        return [name for name in names if not str(name).startswith(self.url)]

    def horizontal_overflow(self) -> int:
        return int(
            self.driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        )


@contextlib.asynccontextmanager
async def chromium(url: str) -> AsyncIterator[Browser]:
    options = webdriver.ChromeOptions()
    options.binary_location = _tool("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(argument)
    service = webdriver.ChromeService(executable_path=_tool("chromedriver"))
    driver = await asyncio.to_thread(webdriver.Chrome, options=options, service=service)
    try:
        yield Browser(driver, url)
    finally:
        await asyncio.to_thread(driver.quit)


@contextlib.asynccontextmanager
async def console_process(cluster: TestCluster, log_path: Path, *args: str) -> AsyncIterator[str]:
    """`agentrun console --auth token` on a free port, as a separate process; yields its URL once it
    serves. Plain HTTP on 127.0.0.1, so its cookie is not marked Secure (--no-secure-cookies)."""
    port = free_port()
    command = [
        sys.executable, "-m", "agentrun.cli.main", "console",
        "--kubeconfig", str(cluster.kubeconfig), "--auth", "token", "--port", str(port),
        "--namespace", cluster.namespace, "--no-secure-cookies", *args,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *command, stdout=log, stderr=asyncio.subprocess.STDOUT, env={**os.environ, "SE_OFFLINE": "true"}
        )
        url = f"http://127.0.0.1:{port}"
        try:
            await until(lambda: _serving(url), "the console to serve", 30, done=bool)
            yield url
        finally:
            process.terminate()
            await process.wait()


async def _serving(url: str) -> bool:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as http, http.get(url + "/healthz") as answer:
            return answer.status == 200
    except aiohttp.ClientError:
        return False
