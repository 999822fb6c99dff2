"""A real cluster for the e2e tier: reachability, the CRD, a namespace of our own, and cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "agentruns.agentrun.dev.yaml"


def reachable_kubeconfig(env_value: str | None) -> tuple[Path | None, str]:
    """The kubeconfig to use and "", or None and why there is no reachable cluster."""
    if env_value:
        path = Path(env_value.split(":")[0]).expanduser()
        where = f"KUBECONFIG={env_value}"
    else:
        path = Path("~/.kube/config").expanduser()
        where = "~/.kube/config (KUBECONFIG is not set)"
    if not path.is_file():
        return None, f"{where} does not exist"
    try:
        proc = subprocess.run(
            ["kubectl", "--kubeconfig", str(path), "--request-timeout=5s", "version", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"kubectl could not run: {exc}"
    if proc.returncode != 0 or '"serverVersion"' not in proc.stdout:
        last = (proc.stderr.strip().splitlines() or ["no server version"])[-1]
        return None, f"the API server in {where} is not reachable: {last}"
    return path, ""


def _kubectl_sync(kubeconfig: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


@dataclass(frozen=True)
class Cluster:
    kubeconfig: Path
    namespace: str
    workdir: Path

    @classmethod
    @contextlib.contextmanager
    def prepared(cls, kubeconfig: Path, workdir: Path) -> Iterator[Cluster]:
        """Installs (or updates) the CRD and makes a namespace that is deleted afterwards."""
        _kubectl_sync(kubeconfig, "apply", "-f", str(CRD))
        _kubectl_sync(
            kubeconfig, "wait", "--for=condition=Established", "crd/agentruns.agentrun.dev", "--timeout=60s"
        )
        namespace = f"agentrun-e2e-{secrets.token_hex(3)}"
        manifest = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        proc = subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig), "create", "-f", "-"],
            input=manifest,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            raise AssertionError(f"creating namespace {namespace} failed: {proc.stderr}")
        try:
            yield cls(kubeconfig, namespace, workdir)
        finally:
            # Runs left unfinished keep their finalizer without an operator: release them first.
            names = _kubectl_sync(
                kubeconfig, "-n", namespace, "get", "agentruns", "-o", "name", check=False
            ).stdout.split()
            for name in names:
                _kubectl_sync(
                    kubeconfig, "-n", namespace, "patch", name, "--type=merge",
                    "-p", '{"metadata":{"finalizers":null}}', check=False,
                )  # fmt: skip
            _kubectl_sync(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)

    async def kubectl(self, *args: str, stdin: str | None = None) -> tuple[int, str]:
        """kubectl in the test namespace, without blocking the event loop (the fake model serves on it)."""
        proc = await asyncio.create_subprocess_exec(
            "kubectl",
            "--kubeconfig",
            str(self.kubeconfig),
            "--namespace",
            self.namespace,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 120)
        return proc.returncode or 0, out.decode()

    async def get(self, name: str) -> dict[str, Any] | None:
        code, out = await self.kubectl("get", "agentrun", name, "-o", "json")
        if code != 0:
            if "NotFound" in out:
                return None
            raise AssertionError(out)
        result: dict[str, Any] = json.loads(out)
        return result

    async def apply(self, manifest: dict[str, Any]) -> str:
        code, out = await self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        assert code == 0, out
        return out.strip()

    async def wait_phase(self, name: str, *phases: str, timeout: float = 60) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        obj: dict[str, Any] | None = None
        while loop.time() < deadline:
            obj = await self.get(name)
            if obj and obj.get("status", {}).get("phase") in phases:
                return obj
            await asyncio.sleep(0.5)
        raise AssertionError(f"{name} did not reach {phases}: {obj and obj.get('status')}")
