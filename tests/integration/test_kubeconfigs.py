"""The operator, the kubectl plugin and the demo accept the kubeconfigs kubectl accepts.

Relative certificate paths (read against the kubeconfig's folder, not the working directory), embedded
certificate data, token files and exec plugins, each proven over TLS: against the emulator served with
a throwaway CA that requires the client certificate, or against a real API server (`--real-cluster`),
whose admin certificates are written out as files and whose service account tokens are real.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_sandbox.kube import EmulatedCluster
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import CRD, Credentials, TestCluster, real_cluster
from tests.support.commands import run_command
from tests.support.kube_requests import wait_finished
from tests.support.kubeconfigs import exec_calls, exec_plugin, exec_user, write_kubeconfig
from tests.support.operator_process import OperatorProcess
from tests.support.tls import make_pki

API_KEY = "sk-ant-kubeconfigs-0123456789"
SCENARIO = "[scenario:kubeconfig-calc]"
PLUGIN = Path(sys.executable).parent / "kubectl-agentrun"
AGENTRUN = Path(sys.executable).parent / "agentrun"
SANDBOX = Path(sys.executable).parent / "agentrun-sandbox"
EMULATOR_TOKEN = "kubeconfig-test-token"
OPERATOR_AGENTS = ("kopf/", "agentrun-operator/")


@dataclass
class Endpoint:
    """A TLS API server and identities it accepts: a client certificate pair and a bearer token."""

    cluster: TestCluster
    ca: bytes
    client_cert: bytes
    client_key: bytes
    token: str


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                SCENARIO,
                [
                    Reply(
                        [tool_use_block("calculator", {"expression": "17*23+4"}, id="toolu_kc1")],
                        usage=ScriptUsage(120, 30, 0, 0),
                    ),
                    Reply([text_block("There are 395 pods.")], usage=ScriptUsage(160, 12, 0, 0)),
                ],
            )
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


Serving = Callable[[bool], contextlib.AbstractAsyncContextManager[Endpoint]]


@pytest.fixture
def serving(real_kubeconfig: Path | None, tmp_path: Path) -> Serving:
    """A TLS endpoint: the emulator (requiring the client certificate if asked) or the real server."""

    @contextlib.asynccontextmanager
    async def serve(require_client_certificate: bool) -> AsyncIterator[Endpoint]:
        if real_kubeconfig is not None:
            async with real_cluster(real_kubeconfig) as cluster, _service_account_token(cluster) as token:
                ca, cert, key = _admin_tls(real_kubeconfig)
                yield Endpoint(cluster, ca, cert, key, token)
            return
        pki = make_pki()
        server_tls = pki.server_context(
            tmp_path / "server", require_client_certificate=require_client_certificate
        )
        async with EmulatedCluster.running(crd_paths=[CRD], ssl_context=server_tls) as kube:
            admin = write_kubeconfig(
                tmp_path / "admin" / "kubeconfig",
                server=kube.url,
                cluster={"certificate-authority-data": _b64(pki.ca)},
                user={
                    "client-certificate-data": _b64(pki.client_cert),
                    "client-key-data": _b64(pki.client_key),
                    "token": kube.token,
                },
            )
            cluster = TestCluster(
                kubeconfig=admin,
                namespace="default",
                credentials=Credentials.from_kubeconfig(admin, tmp_path / "admin"),
                workdir=tmp_path / "admin",
                emulator=kube.emulator,
                kube=kube,
            )
            try:
                yield Endpoint(cluster, pki.ca, pki.client_cert, pki.client_key, EMULATOR_TOKEN)
            finally:
                await cluster.close()

    return serve


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _admin_tls(kubeconfig: Path) -> tuple[bytes, bytes, bytes]:
    """The real server's CA and admin pair, embedded in its kubeconfig or named by it."""
    config = yaml.safe_load(kubeconfig.read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])

    def read(section: dict[str, Any], key: str) -> bytes:
        if section.get(f"{key}-data"):
            return base64.b64decode(section[f"{key}-data"])
        return (kubeconfig.parent / section[key]).read_bytes()

    return read(cluster, "certificate-authority"), read(user, "client-certificate"), read(user, "client-key")


RBAC = "/apis/rbac.authorization.k8s.io/v1"


@contextlib.asynccontextmanager
async def _service_account_token(cluster: TestCluster) -> AsyncIterator[str]:
    """A real bearer token of a service account allowed everything in the test namespace, plus what Kopf
    lists cluster-wide even when it serves one namespace (CRDs, namespaces), as the chart grants."""
    name = "kubeconfig-test"
    subject = {"kind": "ServiceAccount", "name": name, "namespace": cluster.namespace}
    await cluster.request("POST", cluster.path("serviceaccounts"), json={"metadata": {"name": name}})
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [subject],
    }
    await cluster.request("POST", cluster.path("rolebindings", api=RBAC), json=binding)
    namespace = await cluster.request("GET", f"/api/v1/namespaces/{cluster.namespace}")
    owned = {
        "name": f"agentrun-{cluster.namespace}",  # deleted with the namespace should teardown not run
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "name": cluster.namespace,
                "uid": namespace["metadata"]["uid"],
            }
        ],
    }
    rules = [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    ]
    await cluster.request("POST", f"{RBAC}/clusterroles", json={"metadata": owned, "rules": rules})
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": owned["name"]}
    await cluster.request(
        "POST",
        f"{RBAC}/clusterrolebindings",
        json={"metadata": owned, "roleRef": role_ref, "subjects": [subject]},
    )
    try:
        review = await cluster.request(
            "POST", cluster.path(f"serviceaccounts/{name}/token"), json={"spec": {"expirationSeconds": 3600}}
        )
        yield review["status"]["token"]
    finally:
        await cluster.status_of("DELETE", f"{RBAC}/clusterrolebindings/{owned['name']}")
        await cluster.status_of("DELETE", f"{RBAC}/clusterroles/{owned['name']}")


def _kubeconfig(endpoint: Endpoint, form: str, folder: Path) -> Path:
    """The endpoint in one kubeconfig form; every file named relative to the kubeconfig's folder."""
    (folder / "certs").mkdir(parents=True, exist_ok=True)
    (folder / "certs" / "ca.crt").write_bytes(endpoint.ca)
    cluster: dict[str, Any] = {"certificate-authority": "certs/ca.crt"}
    if form == "embedded certificates":
        cluster = {"certificate-authority-data": _b64(endpoint.ca)}
        user: dict[str, Any] = {
            "client-certificate-data": _b64(endpoint.client_cert),
            "client-key-data": _b64(endpoint.client_key),
        }
    elif form == "relative certificate files":
        (folder / "certs" / "client.crt").write_bytes(endpoint.client_cert)
        (folder / "certs" / "client.key").write_bytes(endpoint.client_key)
        user = {"client-certificate": "certs/client.crt", "client-key": "certs/client.key"}
    elif form == "token file":
        (folder / "tokens").mkdir()
        (folder / "tokens" / "operator").write_text(endpoint.token + "\n")
        user = {"tokenFile": "tokens/operator"}
    else:
        assert form == "exec plugin"
        token = endpoint.token if endpoint.cluster.real else None  # the emulator takes any token
        exec_plugin(folder / "bin" / "credentials", prefix="exec-", token=token)
        user = exec_user("./bin/credentials")
    return write_kubeconfig(
        folder / "kubeconfig",
        server=endpoint.cluster.url,
        cluster=cluster,
        user=user,
        namespace=endpoint.cluster.namespace,
    )


def _operator_authorizations(endpoint: Endpoint) -> set[str | None]:
    assert endpoint.cluster.emulator is not None
    return {
        r.authorization
        for r in endpoint.cluster.emulator.request_log
        if (r.user_agent or "").startswith(OPERATOR_AGENTS)
    }


FORMS = ["relative certificate files", "embedded certificates", "token file", "exec plugin"]


@pytest.mark.parametrize("form", FORMS)
async def test_operator_and_plugin_work_with_the_kubeconfig_form(
    form: str, serving: Serving, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    certificates = form.endswith("certificates") or form.endswith("files")
    async with serving(certificates) as endpoint:
        folder = tmp_path / "kubeconfig-folder"
        kubeconfig = _kubeconfig(endpoint, form, folder)
        assert (
            Path.cwd() != folder and not (Path.cwd() / "certs").exists()
        )  # relative names mean nothing here
        cluster = endpoint.cluster
        operator = OperatorProcess(
            kubeconfig=kubeconfig,
            log_path=tmp_path / "operator.log",
            env={"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url},
            args=cluster.operator_args(),
        )
        await operator.start()
        try:
            manifest = agentrun(
                "calc",
                f"{SCENARIO} how many pods?",
                namespace=cluster.namespace,
                model={"name": "claude-haiku-4-5"},
                tools=[{"builtin": {"name": "calculator"}}],
            )
            await cluster.request("POST", cluster.runs_path, json=manifest)
            status = (await wait_finished(cluster, "calc"))["status"]
            assert (status["phase"], status["result"]) == ("Succeeded", "There are 395 pods."), status
        finally:
            await operator.stop()
        code, out, err = await run_command(PLUGIN, "trace", "calc", "--kubeconfig", kubeconfig)
        assert code == 0, err
        assert "calculator ok" in out and "end_turn" in out
        # `agentrun run` reads a tool's header Secret through the same kubeconfig: the 404 is an answer.
        local = tmp_path / "local-run.yaml"
        local.write_text(
            "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: local}\nspec:\n"
            "  task: t\n  model: {name: claude-haiku-4-5}\n  tools:\n  - http: {name: n, description: d, "
            "url: 'http://127.0.0.1:9/', headersFrom: {name: hook-headers}}\n"
        )
        local_env = {"KUBECONFIG": str(kubeconfig), "ANTHROPIC_API_KEY": "k"}
        code, _, err = await run_command(AGENTRUN, "run", local, "-n", cluster.namespace, env=local_env)
        assert code == 2 and f"Secret {cluster.namespace}/hook-headers" in err and "in the cluster" in err, (
            err
        )
        if cluster.emulator is not None and form == "token file":
            assert _operator_authorizations(endpoint) == {f"Bearer {EMULATOR_TOKEN}"}
        if cluster.emulator is not None and form == "exec plugin":
            seen = _operator_authorizations(endpoint)
            assert seen and all((a or "").startswith("Bearer exec-") for a in seen), seen
            assert exec_calls(folder / "bin" / "credentials") >= 3  # operator client, Kopf, plugin


@pytest.mark.emulator_only("reads which token each request carried from the emulator's request log")
async def test_operator_logs_in_again_before_its_exec_plugin_token_expires(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    assert cluster.emulator is not None
    plugin = exec_plugin(tmp_path / "config" / "credentials", prefix="short-", lifetime=3)
    kubeconfig = write_kubeconfig(
        tmp_path / "config" / "kubeconfig", server=cluster.url, user=exec_user("./credentials")
    )
    # After the token expired, the watch of AgentRuns is cut: the new watch needs a new token.
    cluster.emulator.faults.drop_watch(resource="agentruns", after_seconds=4)
    operator = OperatorProcess(
        kubeconfig=kubeconfig,
        log_path=tmp_path / "operator.log",
        env={"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url},
    )
    await operator.start()
    try:
        await asyncio.sleep(5)
        manifest = agentrun(
            "late",
            f"{SCENARIO} how many pods?",
            model={"name": "claude-haiku-4-5"},
            tools=[{"builtin": {"name": "calculator"}}],
        )
        await cluster.request("POST", cluster.runs_path, json=manifest)
        assert (await wait_finished(cluster, "late"))["status"]["phase"] == "Succeeded"
    finally:
        await operator.stop()
    watches = [
        r.authorization
        for r in cluster.emulator.request_log
        if r.resource == "agentruns"
        and r.verb == "watch"
        and (r.user_agent or "").startswith(OPERATOR_AGENTS)
    ]
    assert len(watches) >= 2 and watches[-1] != watches[0], watches
    writes = [
        r.authorization
        for r in cluster.emulator.request_log
        if (r.user_agent or "").startswith("agentrun-operator/")
    ]
    assert len(set(writes)) >= 2, writes  # the operator's own client renewed its token too
    assert exec_calls(plugin) >= 4


@pytest.mark.emulator_only("the demo creates its runs in namespace default, shared on a real server")
async def test_demo_runs_against_a_kubeconfig_with_relative_certificate_paths(
    serving: Serving, tmp_path: Path
) -> None:
    async with serving(True) as endpoint:
        kubeconfig = _kubeconfig(endpoint, "relative certificate files", tmp_path / "kubeconfig-folder")
        code, out, err = await run_command(SANDBOX, "demo", "--kubeconfig", kubeconfig, "--timeout", "90")
    assert code == 0, err
    assert "demo finished: all runs Succeeded" in out
    assert "Traceback" not in err


async def test_the_emulators_tls_refuses_a_client_without_the_certificate(tmp_path: Path) -> None:
    """The emulator really checks client certificates, so the forms above prove the files were read."""
    pki = make_pki()
    server_tls = pki.server_context(tmp_path / "server", require_client_certificate=True)
    async with EmulatedCluster.running(crd_paths=[CRD], ssl_context=server_tls) as kube:
        (tmp_path / "ca.crt").write_bytes(pki.ca)
        kubeconfig = write_kubeconfig(
            tmp_path / "kubeconfig", server=kube.url, cluster={"certificate-authority": "ca.crt"}
        )
        code, _, err = await run_command(PLUGIN, "trace", "x", "--kubeconfig", kubeconfig)
        assert kube.emulator.request_log == []
    assert code == 1
    assert err.startswith("error: cannot read the trace of agentrun default/x: "), err
    assert err.count("\n") == 1
