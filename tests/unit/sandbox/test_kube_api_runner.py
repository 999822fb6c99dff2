"""Both ways to run the emulator: in-process and as a child process."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
import yaml

import agentrun
from agentrun_sandbox.kube import EmulatedCluster, KubeEmulator
from tests.support.kube_client import KubeClient
from tests.support.kube_testing import WIDGETS, WIDGETS_CRD, widget


async def test_the_in_process_runner_serves_on_a_free_port_and_writes_a_kubeconfig() -> None:
    async with EmulatedCluster.running(crd_paths=[WIDGETS_CRD]) as kube:
        assert kube.url.startswith("http://127.0.0.1:")
        config = yaml.safe_load(kube.kubeconfig_path.read_text())
        assert config["current-context"] == "kube-emulator"
        assert config["clusters"][0]["cluster"] == {"server": kube.url, "insecure-skip-tls-verify": True}
        assert config["users"][0]["user"]["token"] == kube.token
        async with KubeClient(kube.url) as client:
            assert (await client.post(WIDGETS, widget("w1"))).status == 201
        assert kube.emulator.get_object("widgets", "default", "w1") is not None
    assert not kube.kubeconfig_path.exists()  # the temporary kubeconfig is cleaned up


async def test_objects_can_be_seeded_and_inspected_without_http() -> None:
    emulator = KubeEmulator()
    emulator.load_crd(WIDGETS_CRD)
    emulator.load_crd(WIDGETS_CRD)  # loading again replaces the CRD instead of failing
    created = emulator.create_object("widgets", widget("w1"), namespace="default")
    assert created["metadata"]["uid"]
    emulator.patch_object("widgets", "default", "w1", {"status": {"phase": "Done"}}, subresource="status")
    assert [w["status"]["phase"] for w in emulator.list_objects("widgets")] == ["Done"]
    emulator.delete_object("widgets", "default", "w1")
    assert emulator.get_object("widgets", "default", "w1") is None
    async with EmulatedCluster.running(emulator=emulator) as kube, KubeClient(kube.url) as client:
        assert (await client.get("/apis/test.agentrun.dev/v1")).status == 200


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "agentrun_sandbox.kube.server"],
        [str(Path(sys.executable).parent / "agentrun-sandbox"), "kube"],
    ],
    ids=["python -m", "agentrun-sandbox kube"],
)
async def test_the_command_line_prints_ready_serves_and_stops_on_sigterm(
    command: list[str], tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kube.yaml"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(agentrun.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    process = await asyncio.create_subprocess_exec(
        *command,
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
        "--crd",
        str(WIDGETS_CRD),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 20)).decode().strip()
        assert line.startswith("READY http://127.0.0.1:")
        url = line.split()[1]
        assert yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"] == url
        async with KubeClient(url) as client:
            assert (await client.post(WIDGETS, widget("w1"))).status == 201
            assert (await client.get(f"{WIDGETS}/w1")).body["spec"]["size"] == 3
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 10) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_reactions_added_with_the_kmock_dsl_take_precedence_over_the_emulator() -> None:
    async with EmulatedCluster.running() as kube, KubeClient(kube.url) as client:
        kube.emulator["get /version"] << {"gitVersion": "v9.9.9"}
        assert (await client.get("/version")).body == {"gitVersion": "v9.9.9"}
        assert (await client.get("/api/v1/namespaces/default")).status == 200
        assert kube.emulator.request_log[0].status == 200
