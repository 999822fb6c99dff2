"""`agentrun run FILE`: the documented exit codes and the final status on stdout."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from agentrun.sandbox.messages_api import FakeMessagesAPI
from agentrun.sandbox.messages_script import HttpError, Script

ROOT = Path(__file__).resolve().parents[2]


async def _agentrun_run(manifest: Path, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrun.cli.main",
        "run",
        str(manifest),
        "-o",
        "json",
        env={**{k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_example_run_succeeds_with_exit_0_and_prints_status() -> None:
    async with FakeMessagesAPI().running() as api:
        code, out, err = await _agentrun_run(
            ROOT / "examples" / "what-time.yaml", {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": api.url}
        )
    assert code == 0, err
    status = json.loads(out)
    assert (status["phase"], status["stopReason"], status["iterations"]) == ("Succeeded", "EndTurn", 2)
    assert "tool current_time: ok" in err


async def test_failed_run_exits_1(tmp_path: Path) -> None:
    manifest = tmp_path / "run.yaml"
    manifest.write_text(
        "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: denied}\n"
        "spec: {task: '[scenario:denied] hi', model: {name: claude-haiku-4-5}}\n"
    )
    api = FakeMessagesAPI(scripts=[Script("[scenario:denied]", [HttpError(error_type="permission_error")])])
    async with api.running() as server:
        code, out, _ = await _agentrun_run(
            manifest, {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": server.url}
        )
    assert code == 1
    status = json.loads(out)
    assert status["stopReason"] == "ModelError"
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Succeeded"] == "AuthenticationFailed"


async def test_invalid_manifest_exits_2_naming_the_field(tmp_path: Path) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(
        "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: bad}\n"
        "spec: {task: hi, limits: {maxIterations: 0}}\n"
    )
    code, out, err = await _agentrun_run(manifest, {"ANTHROPIC_API_KEY": "k"})
    assert code == 2
    assert "spec.limits.maxIterations" in err and out == ""
