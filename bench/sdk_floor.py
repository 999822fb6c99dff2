"""The same model traffic as the scale benchmark with no operator: N concurrent conversations of 5
sequential requests through one ``ClientPool`` client (our adapter, the real SDK), against the
fake Messages API in a child process. Its time ÷ ideal is the floor any single-process operator built on
this SDK path reaches on this machine; the gap between it and the operator is the operator's own cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from agentrun.loop.protocols import ModelRequest
from agentrun.model.access import ModelAccess
from agentrun.model.anthropic_calling import ClientPool
from agentrun_sandbox.messages.script import Script
from agentrun_sandbox.messages.script_files import scripts_to_data
from bench.conversation import API_KEY, MODEL


@dataclass(frozen=True)
class Floor:
    makespan: float
    cpu_ms_per_request: float


@contextlib.asynccontextmanager
async def messages_api_process(script: Script, latency: float) -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory(prefix="bench-sdk-") as tmp:
        path = Path(tmp) / "script.yaml"
        path.write_text(yaml.safe_dump(scripts_to_data([script])))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agentrun_sandbox.messages.server",
            "--latency",
            str(latency),
            "--script",
            str(path),
            "--no-demo-brain",
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode().split()
        try:
            if not line or line[0] != "READY":
                raise RuntimeError(f"fake Messages API did not start: {line}")
            yield line[1]
        finally:
            process.terminate()
            await process.wait()


async def measure(script: Script, marker: str, *, runs: int, requests: int, latency: float) -> Floor:
    """Each conversation resends its growing history, like the loop, so the server walks the script."""
    async with messages_api_process(script, latency) as url:
        pool = ClientPool()
        model = pool.model(ModelAccess(api_key=API_KEY, base_url=url))

        async def conversation(index: int) -> None:
            messages: list[dict[str, object]] = [
                {"role": "user", "content": f"{marker} run-{index:05d}: sdk"}
            ]
            for _ in range(requests):
                response = await model.complete(ModelRequest(model=MODEL, max_tokens=512, messages=messages))
                messages.append({"role": "assistant", "content": response.content})
                results = [
                    {"type": "tool_result", "tool_use_id": block["id"], "content": "8"}
                    for block in response.content
                    if block.get("type") == "tool_use"
                ]
                if not results:
                    break
                messages.append({"role": "user", "content": results})

        cpu, started = time.process_time(), time.monotonic()
        await asyncio.gather(*(conversation(i) for i in range(runs)))
        makespan, cpu = time.monotonic() - started, time.process_time() - cpu
        await pool.close()
    return Floor(makespan=makespan, cpu_ms_per_request=cpu / (runs * requests) * 1000)
