"""`agentrun-sandbox demo` (`make demo`): the whole product offline, in one command.

A Kubernetes API emulator and a scripted Messages API run in this process; the real operator runs
as a child process against them, exactly as it would against a cluster. With ANTHROPIC_API_KEY set
the real API is used; with --kubeconfig a real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun.api import AGENT_KIND, AGENT_PLURAL, GROUP, KIND, PLURAL, QUOTA_KIND, QUOTA_PLURAL, VERSION
from agentrun.api.crd import agent_crd, crd, quota_crd
from agentrun.api.status import FINISHED_PHASES
from agentrun.cli.plugin_rendering import render_tree, run_tree
from agentrun.console.serving import Console, ConsoleConfig, serving
from agentrun.kube import kubeconfig_loading
from agentrun.kube.failures import KubeFailure, explained
from agentrun.kube.kubeconfig_loading import ClusterAccess
from agentrun_sandbox.kube import EmulatedCluster
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from agentrun_sandbox.operator_process import OperatorProcess

NAMESPACE = "default"
#: Where the demo serves the web console (a free port when this one is taken).
CONSOLE_PORT = 8090
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
#: The namespace's share of the operator: four runs at a time (a fan-out parent and its three children
#: fit; the other examples wait, Pending with reason QuotaExceeded, and start by themselves), and at
#: most a dollar and 200,000 tokens a month.
DEMO_QUOTA: dict[str, Any] = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": QUOTA_KIND,
    "metadata": {"name": "demo"},
    "spec": {"window": "Month", "hard": {"concurrentRuns": 4, "tokens": 200000, "costUSD": 1}},
}
EMBEDDED_EXAMPLES: tuple[dict[str, Any], ...] = (
    {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": "calculator"},
        "spec": {
            "task": "A cluster has 17 nodes with 23 pods each, plus 4 system pods. How many pods run in "
            "total? Use the calculator tool, then answer in one sentence.",
            "model": {"name": "claude-haiku-4-5", "maxTokens": 1024},
            "tools": [{"builtin": {"name": "calculator"}}],
            "requiredTools": ["calculator"],
            "limits": {
                "maxIterations": 5,
                "tokenBudget": 20000,
                "costBudgetUSD": 0.05,
                "timeoutSeconds": 120,
            },
        },
    },
    {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": "what-time"},
        "spec": {
            "task": "What is the current date in UTC? Use the current_time tool; answer with the date only.",
            "model": {"name": "claude-haiku-4-5", "maxTokens": 512},
            "tools": [{"builtin": {"name": "current_time"}}],
            "limits": {"maxIterations": 3, "tokenBudget": 10000},
        },
    },
)


def load_examples(directory: str | None) -> list[dict[str, Any]]:
    path = Path(directory) if directory else Path("examples")
    if not path.is_dir():
        if directory:
            raise SystemExit(f"error: {directory} is not a directory")
        return [dict(e) for e in EMBEDDED_EXAMPLES]
    found: list[dict[str, Any]] = []
    for file in sorted(path.glob("*.yaml")):
        for doc in yaml.safe_load_all(file.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in (AGENT_KIND, KIND):
                found.append(doc)
    # Agents first: their runs (spec.agentRef) would wait Pending until they exist.
    found.sort(key=lambda doc: doc["kind"] != AGENT_KIND)
    return found if any(d["kind"] == KIND for d in found) else [dict(e) for e in EMBEDDED_EXAMPLES]


def _crds() -> tuple[dict[str, Any], ...]:
    """The kinds the demo uses, the same on the emulator and on a real cluster."""
    return (crd(), quota_crd(), agent_crd())


@contextlib.asynccontextmanager
async def _cluster(kubeconfig: str | None) -> AsyncIterator[str]:
    if kubeconfig:
        yield kubeconfig
        return
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for manifest in _crds():
            paths.append(Path(tmp) / f"{manifest['metadata']['name']}.yaml")
            paths[-1].write_text(yaml.safe_dump(manifest))
        async with EmulatedCluster.running(crd_paths=paths) as kube:
            print(f"Kubernetes API emulator on {kube.url}", file=sys.stderr)
            yield str(kube.kubeconfig_path)


@contextlib.asynccontextmanager
async def _model() -> AsyncIterator[tuple[str, str | None]]:
    key = os.environ.get("ANTHROPIC_API_KEY")
    if key:
        print("using the real Anthropic API (ANTHROPIC_API_KEY is set)", file=sys.stderr)
        yield key, os.environ.get("ANTHROPIC_BASE_URL")
        return
    # The calculator example gets a scripted conversation; any other manifest meets the demo brain,
    # which calls the offered tools with inputs made up from their schemas, then summarises.
    calculator = Script(
        "How many pods run in total?",
        [
            Reply(
                [text_block("Let me compute that."), tool_use_block("calculator", {"expression": "17*23+4"})]
            ),
            Reply([text_block("17 nodes × 23 pods + 4 system pods = 395 pods run in total.")]),
        ],
        name="demo-calculator",
    )
    async with FakeMessagesAPI(scripts=[calculator]).running() as api:
        print(f"scripted Messages API on {api.url} (set ANTHROPIC_API_KEY for the real one)", file=sys.stderr)
        yield "demo-key", api.url


async def _install_crd(api: client.ApiClient, access: ClusterAccess) -> None:
    """Before the operator starts: it checks at startup that it can list AgentRuns, and serves
    AgentRunQuotas only if their CRD is there when it starts."""
    ext = client.ApiextensionsV1Api(api)
    for manifest in _crds():
        with explained(
            "create",
            f"CustomResourceDefinition {manifest['metadata']['name']}",
            access=access,
            invalid="agentrun needs Kubernetes 1.33 or later (see `kubectl version`), or an admission "
            "policy refuses the CRD",
        ):
            try:
                await ext.create_custom_resource_definition(manifest)  # type: ignore[arg-type]
            except ApiException as exc:
                if exc.status != 409:
                    raise
        print(f"customresourcedefinition {manifest['metadata']['name']} installed", file=sys.stderr)
    await asyncio.sleep(2)  # a real API server publishes a new schema after a moment


def _row(obj: dict[str, Any]) -> tuple[str, ...]:
    status = obj.get("status") or {}
    usage = status.get("usage") or {}
    return (
        obj["metadata"]["name"],
        str(status.get("phase") or "-"),
        str(status.get("stopReason") or "-"),
        str(status.get("iterations", 0)),
        str(usage.get("totalTokens", 0)),
        str(usage.get("costUSD") or "-"),
    )


def _table(rows: list[tuple[str, ...]]) -> str:
    header = ("NAME", "PHASE", "STOP REASON", "ITERATIONS", "TOKENS", "COST")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows])


async def _demo(kubeconfig: str | None, examples: str | None, timeout: float, keep_console: bool) -> int:
    manifests = load_examples(examples)
    async with _cluster(kubeconfig) as kubeconfig_path:
        access = await kubeconfig_loading.load(kubeconfig_path)
        async with access.api_client() as api, _console(access) as url:
            if kubeconfig is not None:
                await _install_crd(api, access)
            print(
                f"web console: {url} (as the demo's kubeconfig; open it while the runs go)", file=sys.stderr
            )
            code = await _operate(api, access, kubeconfig_path, manifests, timeout)
            if keep_console:
                print(f"web console still at {url} (Ctrl-C ends the demo)", file=sys.stderr)
                await asyncio.Event().wait()
            return code


@contextlib.asynccontextmanager
async def _console(access: ClusterAccess) -> AsyncIterator[str]:
    """`agentrun console` on the demo's cluster, as the kubeconfig's identity, on 127.0.0.1:8090 (or
    a free port when that one is taken)."""
    config = ConsoleConfig(auth="kubeconfig", secure_cookies=False, allowed_hosts=LOCAL_HOSTS)
    async with serving(Console.of(access, config), "127.0.0.1", CONSOLE_PORT, any_port_if_taken=True) as port:
        yield f"http://127.0.0.1:{port}/?namespace={NAMESPACE}"


async def _operate(
    api: client.ApiClient,
    access: ClusterAccess,
    kubeconfig_path: str,
    manifests: list[dict[str, Any]],
    timeout: float,
) -> int:
    async with _model() as (api_key, base_url):
        env = {"ANTHROPIC_API_KEY": api_key, **({"ANTHROPIC_BASE_URL": base_url} if base_url else {})}
        log_file = Path(tempfile.mkdtemp(prefix="agentrun-demo-")) / "operator.log"
        operator = OperatorProcess(
            kubeconfig=Path(kubeconfig_path), log_path=log_file, env=env, keep_environment=True
        )
        await operator.start(ready_timeout=None)  # an early exit is reported by _drive, in one line
        assert operator.process is not None
        print(f"operator started (pid {operator.process.pid}, log: {log_file})", file=sys.stderr)
        try:
            return await _drive(
                api, access, manifests, operator.metrics_port, timeout, operator.process, log_file
            )
        finally:
            await operator.stop()


async def _drive(
    api: client.ApiClient,
    access: ClusterAccess,
    manifests: list[dict[str, Any]],
    metrics_port: int,
    timeout: float,
    proc: asyncio.subprocess.Process,
    log_file: Path,
) -> int:
    custom = client.CustomObjectsApi(api)
    quota = {**DEMO_QUOTA, "metadata": {**DEMO_QUOTA["metadata"], "namespace": NAMESPACE}}
    with explained("create", f"agentrunquota {NAMESPACE}/demo", access=access):
        try:
            await custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, QUOTA_PLURAL, quota)
        except ApiException as exc:
            if exc.status != 409:
                raise
    print(f"agentrunquota.{GROUP}/demo created (four runs at a time, $1 a month)", file=sys.stderr)
    names = []
    for manifest in manifests:
        body = {**manifest, "metadata": {**manifest["metadata"], "namespace": NAMESPACE}}
        name = body["metadata"]["name"]
        kind = str(body["kind"]).lower()
        plural = AGENT_PLURAL if body["kind"] == AGENT_KIND else PLURAL
        with explained("create", f"{kind} {NAMESPACE}/{name}", access=access):
            try:
                await custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, plural, body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
        if body["kind"] == KIND:
            names.append(name)
        print(f"{kind}.{GROUP}/{name} created", file=sys.stderr)
    deadline = time.monotonic() + timeout
    last = ""
    objects: list[dict[str, Any]] = []
    everything: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise KubeFailure(_operator_exit(proc.returncode, log_file))
        with explained("list", f"agentruns in namespace {NAMESPACE}", access=access):
            listing = await custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
        everything = list(listing["items"])
        objects = [o for o in everything if o["metadata"]["name"] in names]
        table = _table([_row(o) for o in objects])
        if table != last:
            print(table + "\n", flush=True)
            last = table
        if len(objects) == len(names) and all(
            (o.get("status") or {}).get("phase") in FINISHED_PHASES for o in objects
        ):
            break
        await asyncio.sleep(0.5)
    else:
        print(f"error: runs did not finish within {timeout:g}s", file=sys.stderr)
        return 1
    for obj in objects:
        status = {k: v for k, v in (obj.get("status") or {}).items() if k not in ("kopf", "conditions")}
        print(f"--- {obj['metadata']['name']} status")
        print(yaml.safe_dump(status, sort_keys=False).rstrip())
    # A run whose agent tool started children: the tree `kubectl agentrun tree` prints.
    for obj in objects:
        tree = run_tree(obj, everything)
        if tree.children:
            print(f"--- kubectl agentrun tree {obj['metadata']['name']}")
            print(render_tree(tree))
    with explained("get", f"agentrunquota {NAMESPACE}/demo", access=access):
        quota = await custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, QUOTA_PLURAL, "demo")
    print(f"--- agentrunquota {NAMESPACE}/demo: used/hard")
    print(yaml.safe_dump((quota.get("status") or {}).get("summary") or {}, sort_keys=False).rstrip())
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{metrics_port}/metrics") as r,
    ):
        scrape = await r.text()
    print("--- metrics (excerpt)")
    for line in scrape.splitlines():
        if line.startswith(
            (
                "agentrun_runs_finished_total",
                "agentrun_tokens_total",
                "agentrun_tool_calls_total",
                "agentrun_quota_used",
            )
        ):
            print(line)
    ok = all((o.get("status") or {}).get("phase") == "Succeeded" for o in objects)
    print("demo finished: all runs Succeeded" if ok else "demo finished: some runs did not succeed")
    return 0 if ok else 1


def _operator_exit(code: int, log_file: Path) -> str:
    """The operator's own last line says why (it ends with one line on error)."""
    lines = [line for line in log_file.read_text(errors="replace").splitlines() if line.strip()]
    why = lines[-1].removeprefix("error: ") if lines else "no output"
    return f"the operator exited with code {code}: {why} (log: {log_file})"


def main(*, kubeconfig: str | None, examples: str | None, timeout: float, keep_console: bool = False) -> int:
    if kubeconfig:
        kubeconfig = str(Path(kubeconfig).expanduser().absolute())  # the operator gets this path too
    try:
        return asyncio.run(_demo(kubeconfig, examples, timeout, keep_console))
    except KeyboardInterrupt:  # Ctrl-C, e.g. to end --keep-console
        return 0
    except KubeFailure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
