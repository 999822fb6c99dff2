"""The API server a scenario runs against: the emulator (`make test`) or a real one (`make e2e`).

Integration scenarios are written once against :class:`TestCluster` and run against either backend:

* ``emulator`` (the default): a fresh Kubernetes API emulator per test, namespace ``default``. The
  emulator itself is at ``cluster.emulator`` for scenarios that need to inject faults or read its
  request log; those are marked ``@pytest.mark.emulator_only("why")`` and not collected against a
  real server.
* ``real`` (``pytest --real-cluster``, KUBECONFIG pointing at a real kube-apiserver): the CRD is
  applied once per session, each test gets a namespace of its own that is deleted afterwards, and
  the operator serves only that namespace (an unfinished run of an earlier test, in a namespace being
  torn down, must not be picked up by the next test's operator).

Both backends answer the same questions the same way: the admin kubeconfig, the test namespace, an
authenticated aiohttp session, kubectl, and the operator as a child process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import ssl
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from agentrun_sandbox.kube import EmulatedCluster, KubeEmulator
from tests.support.operator_process import OperatorProcess, running_operator

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "agentruns.agentrun.dev.yaml"
#: Served with the AgentRun CRD on both backends: the operator watches Agents (spec.agentRef).
AGENT_CRD = ROOT / "crds" / "agents.agentrun.dev.yaml"
RUNS_API = "/apis/agentrun.dev/v1alpha1"


@dataclass
class Credentials:
    """What an HTTP client needs from a kubeconfig's current context: server, TLS and identity."""

    server: str
    ssl_context: ssl.SSLContext | bool
    headers: dict[str, str]

    @classmethod
    def from_kubeconfig(cls, path: Path, workdir: Path) -> Credentials:
        """Embedded data is written to ``workdir``; relative paths resolve against the kubeconfig's folder."""
        config = yaml.safe_load(path.read_text())
        context = _named(config.get("contexts"), config.get("current-context"))["context"]
        cluster = _named(config.get("clusters"), context["cluster"])["cluster"]
        user = _named(config.get("users"), context["user"])["user"]

        def file_of(key: str, where: Mapping[str, Any]) -> str | None:
            if where.get(f"{key}-data"):
                target = workdir / f"{key}.pem"
                target.write_bytes(base64.b64decode(where[f"{key}-data"]))
                return str(target)
            if where.get(key):
                return str((path.parent / where[key]).resolve())
            return None

        headers = {"Authorization": f"Bearer {user['token']}"} if user.get("token") else {}
        if not cluster["server"].startswith("https"):
            return cls(cluster["server"], False, headers)
        if cluster.get("insecure-skip-tls-verify"):
            context_ssl = ssl.create_default_context()
            context_ssl.check_hostname = False
            context_ssl.verify_mode = ssl.CERT_NONE
        else:
            context_ssl = ssl.create_default_context(cafile=file_of("certificate-authority", cluster))
        cert, key = file_of("client-certificate", user), file_of("client-key", user)
        if cert and key:
            context_ssl.load_cert_chain(cert, key)
        return cls(cluster["server"], context_ssl, headers)


def _named(items: list[dict[str, Any]] | None, name: str | None) -> dict[str, Any]:
    for item in items or []:
        if item.get("name") == name:
            return item
    raise AssertionError(f"kubeconfig has no entry named {name!r}")


@dataclass
class TestCluster:
    """One scenario's API server and namespace, whichever the backend."""

    __test__ = False  # not a test class, despite its name

    kubeconfig: Path
    namespace: str
    credentials: Credentials
    workdir: Path
    #: The emulator; None against a real server (scenarios that need it are marked emulator_only).
    emulator: KubeEmulator | None = None
    #: The emulator's runner (kubeconfig_for, token); None against a real server.
    kube: EmulatedCluster | None = None
    _sessions: list[aiohttp.ClientSession] = field(default_factory=list)

    @property
    def real(self) -> bool:
        return self.emulator is None

    @property
    def url(self) -> str:
        return self.credentials.server

    @property
    def runs_path(self) -> str:
        """The AgentRun collection of the test namespace, for raw requests."""
        return f"{RUNS_API}/namespaces/{self.namespace}/agentruns"

    def path(self, resource: str, name: str = "", *, api: str = "/api/v1") -> str:
        """A namespaced collection (or object) path of the test namespace."""
        base = f"{api}/namespaces/{self.namespace}/{resource}"
        return f"{base}/{name}" if name else base

    def session(self) -> aiohttp.ClientSession:
        """An authenticated session on the server's URL (closed with the cluster)."""
        connector = aiohttp.TCPConnector(ssl=self.credentials.ssl_context)
        session = aiohttp.ClientSession(self.url, headers=self.credentials.headers, connector=connector)
        self._sessions.append(session)
        return session

    async def request(self, method: str, path: str, *, ok: bool = True, **kwargs: Any) -> Any:
        """The decoded answer; with ``ok`` anything but a success fails the test with the server's Status."""
        async with self.session() as session, session.request(method, path, **kwargs) as response:
            text = await response.text()
            body = json.loads(text) if text else None
            if ok:
                assert response.status < 300, f"{method} {path}: {response.status} {body}"
            return body

    async def status_of(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        """Status code and decoded body, whatever the outcome."""
        async with self.session() as session, session.request(method, path, **kwargs) as response:
            text = await response.text()
            try:
                body: Any = json.loads(text) if text else None
            except ValueError:
                body = text
            return response.status, body

    async def whoami(self) -> str:
        """The user name the server authenticates the admin credentials as (a SelfSubjectReview, as
        `kubectl auth whoami` asks): what an approval policy compares `by` with, so never hard-coded."""
        review = await self.request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        username = review.get("status", {}).get("userInfo", {}).get("username")
        assert isinstance(username, str) and username, review
        return username

    async def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120) -> tuple[int, str]:
        """kubectl in the test namespace (stdout and stderr together), without blocking the event loop."""
        proc = await asyncio.create_subprocess_exec(
            "kubectl",
            "--kubeconfig",
            str(self.kubeconfig),
            # kubectl caches discovery per host:port for hours; emulators reuse ports with other CRDs.
            "--cache-dir",
            str(self.workdir / "kubectl-cache"),
            "--namespace",
            self.namespace,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), timeout)
        return proc.returncode or 0, out.decode()

    async def apply(self, manifest: Mapping[str, Any]) -> str:
        code, out = await self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        assert code == 0, out
        return out.strip()

    async def get_run(self, name: str) -> dict[str, Any] | None:
        status, body = await self.status_of("GET", f"{self.runs_path}/{name}")
        if status == 404:
            return None
        assert status == 200, body
        result: dict[str, Any] = body
        return result

    def operator_args(self, args: tuple[str, ...] = ()) -> tuple[str, ...]:
        """A real server serves every test's namespace: the operator watches only this one."""
        if self.real and not any(a in ("--namespace", "-n", "--all-namespaces", "-A") for a in args):
            return ("--namespace", self.namespace, *args)
        return args

    def operator_process(
        self, log_path: Path, env: Mapping[str, str], args: tuple[str, ...] = (), **kwargs: Any
    ) -> OperatorProcess:
        """An unstarted operator against this cluster (for scenarios that start, kill and restart it)."""
        return OperatorProcess(
            kubeconfig=self.kubeconfig, log_path=log_path, env=env, args=self.operator_args(args), **kwargs
        )

    def operator(
        self, log_path: Path, env: Mapping[str, str], args: tuple[str, ...] = ()
    ) -> contextlib.AbstractAsyncContextManager[OperatorProcess]:
        """The operator running against this cluster for the block."""
        return running_operator(self.kubeconfig, log_path, env, self.operator_args(args))

    def operator_process_as(
        self,
        kubeconfig: Path,
        log_path: Path,
        env: Mapping[str, str],
        args: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> OperatorProcess:
        """An unstarted operator that logs in with ``kubeconfig`` (another identity, e.g. a token's)."""
        return OperatorProcess(
            kubeconfig=kubeconfig, log_path=log_path, env=env, args=self.operator_args(args), **kwargs
        )

    def kubeconfig_with_token(self, token: str) -> Path:
        """A kubeconfig for this cluster that authenticates with a bearer ``token`` instead of the admin's."""
        if self.kube is not None:
            return Path(self.kube.kubeconfig_for(token))
        config = yaml.safe_load(self.kubeconfig.read_text())
        context = _named(config.get("contexts"), config.get("current-context"))["context"]
        server = dict(_named(config.get("clusters"), context["cluster"])["cluster"])
        if server.get("certificate-authority"):  # relative to the admin kubeconfig, not to the new file
            server["certificate-authority"] = str(
                (self.kubeconfig.parent / server["certificate-authority"]).resolve()
            )
        path = self.workdir / f"token-{secrets.token_hex(4)}.kubeconfig"
        path.touch(mode=0o600)
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "cluster", "cluster": server}],
                    "users": [{"name": "token", "user": {"token": token}}],
                    "contexts": [{"name": "token", "context": {"cluster": "cluster", "user": "token"}}],
                    "current-context": "token",
                }
            )
        )
        return path

    def kubeconfig_in_namespace(self) -> Path:
        """The admin kubeconfig with the test namespace as its context's: tools run without ``-n`` act
        there, as after `kubectl config set-context --current --namespace=...`."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        context = _named(config.get("contexts"), config.get("current-context"))["context"]
        context["namespace"] = self.namespace
        entries = [c["cluster"] for c in config.get("clusters") or []] + [
            u["user"] for u in config.get("users") or []
        ]
        for entry in entries:  # relative to the admin kubeconfig, not to the copy
            for key in ("certificate-authority", "client-certificate", "client-key", "tokenFile"):
                if entry.get(key):
                    entry[key] = str((self.kubeconfig.parent / entry[key]).resolve())
        path = self.workdir / f"in-{self.namespace}-{secrets.token_hex(4)}.kubeconfig"
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(config))
        return path

    async def close(self) -> None:
        for session in self._sessions:
            await session.close()


def kubectl_sync(kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def reachable(kubeconfig: Path) -> str:
    """ "" when a server answers at ``kubeconfig``, else why not."""
    if not kubeconfig.is_file():
        return f"{kubeconfig} does not exist"
    proc = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), "--request-timeout=5s", "version", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if proc.returncode != 0 or '"serverVersion"' not in proc.stdout:
        return (proc.stderr.strip().splitlines() or ["no server version"])[-1]
    return ""


@contextlib.contextmanager
def real_server_session(kubeconfig: Path) -> Iterator[Path]:
    """Once per session against a real server: the CRD from crds/, applied and established."""
    for path in (CRD, AGENT_CRD):
        kubectl_sync(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(path))
    kubectl_sync(
        kubeconfig,
        "wait",
        "--for=condition=Established",
        "crd/agentruns.agentrun.dev",
        "crd/agents.agentrun.dev",
        "--timeout=60s",
    )
    yield kubeconfig


@contextlib.asynccontextmanager
async def emulated_cluster() -> AsyncIterator[TestCluster]:
    """A fresh emulated API server with the AgentRun CRD; the test namespace is ``default``."""
    async with EmulatedCluster.running(crd_paths=[CRD, AGENT_CRD]) as kube:
        # As a real server: an impersonated request may do what the roles stored for its target allow.
        kube.emulator.authorize_impersonated_users = True
        workdir = Path(kube.kubeconfig_path).parent
        cluster = TestCluster(
            kubeconfig=Path(kube.kubeconfig_path),
            namespace="default",
            credentials=Credentials(kube.url, False, {"Authorization": f"Bearer {kube.token}"}),
            workdir=workdir,
            emulator=kube.emulator,
            kube=kube,
        )
        try:
            yield cluster
        finally:
            await cluster.close()


@contextlib.asynccontextmanager
async def real_cluster(kubeconfig: Path) -> AsyncIterator[TestCluster]:
    """A namespace of the test's own on a real server, deleted (not waited for) afterwards."""
    namespace = f"agentrun-it-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="agentrun-real-") as tmp:
        workdir = Path(tmp)
        cluster = TestCluster(
            kubeconfig=kubeconfig,
            namespace=namespace,
            credentials=Credentials.from_kubeconfig(kubeconfig, workdir),
            workdir=workdir,
        )
        await cluster.request(
            "POST",
            "/api/v1/namespaces",
            json={"metadata": {"name": namespace, "labels": {"agentrun-e2e": "1"}}},
        )
        try:
            yield cluster
        finally:
            await cluster.status_of("DELETE", f"/api/v1/namespaces/{namespace}")
            await cluster.close()


def cluster_for(real_kubeconfig: Path | None) -> contextlib.AbstractAsyncContextManager[TestCluster]:
    """What the ``cluster`` fixture yields, for fixtures of a wider scope (one operator, many tests)."""
    return emulated_cluster() if real_kubeconfig is None else real_cluster(real_kubeconfig)
