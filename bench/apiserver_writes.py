"""`python -m bench.apiserver_writes`: small writes per second the API server of KUBECONFIG takes.

The replica estimate (docs/benchmarks.md) divides the operator's writes per iteration into the API
server's write rate; this measures that rate on a real server instead of assuming it. C concurrent
clients merge-patch their own ConfigMap (~200 bytes each, like a status patch) for D seconds in a
throwaway namespace (deleted afterwards); it prints writes per second and the p50/p99 latency.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import ssl
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.figures import percentile


def _session_parts(kubeconfig: Path, tmp: Path) -> tuple[str, ssl.SSLContext | None, dict[str, str]]:
    """Server URL, TLS context and headers of the kubeconfig's current context (client cert or token)."""
    config = yaml.safe_load(kubeconfig.read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    server = str(cluster["server"])
    if not server.startswith("https"):
        return server, None, {"Authorization": f"Bearer {user.get('token', '')}"}
    tls = ssl.create_default_context()
    if "certificate-authority-data" in cluster:
        tls.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    headers: dict[str, str] = {}
    if "client-certificate-data" in user:
        cert, key = tmp / "client.crt", tmp / "client.key"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        tls.load_cert_chain(cert, key)
    elif "token" in user:
        headers["Authorization"] = f"Bearer {user['token']}"
    return server, tls, headers


async def measure(kubeconfig: Path, *, clients: int, seconds: float) -> dict[str, float]:
    namespace = f"agentrun-bench-writes-{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        server, tls, headers = _session_parts(kubeconfig, Path(tmp))
        connector = aiohttp.TCPConnector(ssl=tls if tls is not None else False, limit=clients)
        async with aiohttp.ClientSession(server, headers=headers, connector=connector) as session:

            async def call(method: str, path: str, body: dict[str, Any], content: str) -> None:
                async with session.request(
                    method, path, data=json.dumps(body), headers={"Content-Type": content}
                ) as response:
                    if response.status >= 300:
                        raise RuntimeError(f"{method} {path}: {response.status} {await response.text()}")

            await call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}}, "application/json")
            try:
                base = f"/api/v1/namespaces/{namespace}/configmaps"
                for i in range(clients):
                    await call("POST", base, {"metadata": {"name": f"w{i}"}, "data": {}}, "application/json")
                latencies: list[float] = []
                end = time.monotonic() + seconds

                async def writer(i: int) -> None:
                    n = 0
                    while time.monotonic() < end:
                        n += 1
                        body = {"data": {"iteration": str(n), "note": "x" * 160}}
                        started = time.monotonic()
                        await call("PATCH", f"{base}/w{i}", body, "application/merge-patch+json")
                        latencies.append(time.monotonic() - started)

                started = time.monotonic()
                await asyncio.gather(*(writer(i) for i in range(clients)))
                elapsed = time.monotonic() - started
            finally:
                async with session.delete(f"/api/v1/namespaces/{namespace}"):
                    pass
    return {
        "writes per second": len(latencies) / elapsed,
        "latency p50 ms": percentile(latencies, 50) * 1000,
        "latency p99 ms": percentile(latencies, 99) * 1000,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.apiserver_writes", description=__doc__)
    parser.add_argument("--clients", type=int, default=64, help="concurrent writers (default 64)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to write (default 10)")
    args = parser.parse_args(argv)
    path = os.environ.get("KUBECONFIG")
    if not path or not Path(path).is_file():
        print("error: set KUBECONFIG to the kubeconfig of the API server to measure", file=sys.stderr)
        return 2
    figures = asyncio.run(measure(Path(path), clients=args.clients, seconds=args.seconds))
    for name, value in figures.items():
        print(f"{name}: {value:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
