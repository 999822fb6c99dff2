"""People with different rights for the web console's tests, and the console itself in the test's process.

`person()` makes a ServiceAccount with a Role of the rules given and returns its user name and a bearer
token: a real server mints the token (`kubectl create token`); the emulator, which authenticates nobody,
is told whose token it is and authorizes it with the Roles stored in it, as a real server's RBAC does.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from agentrun.console.serving import Console, ConsoleConfig, serving
from agentrun.kube import kubeconfig_loading
from agentrun_sandbox.kube.authz import SERVICE_ACCOUNT_PREFIX, UserInfo, service_account_groups
from tests.support.clusters import TestCluster
from tests.support.rbac import StoredRbac, grant_service_account

RUNS_API = "/apis/agentrun.dev/v1alpha1"
READ_RUNS = {"apiGroups": ["agentrun.dev"], "resources": ["agentruns"], "verbs": ["get", "list", "watch"]}
DECIDE = {"apiGroups": ["agentrun.dev"], "resources": ["agentruns"], "verbs": ["patch"]}
READ_TRANSCRIPTS = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}


@dataclass(frozen=True)
class Person:
    username: str
    token: str


async def person(cluster: TestCluster, account: str, rules: Sequence[Mapping[str, Any]] = ()) -> Person:
    if rules:
        username = await grant_service_account(
            cluster, account, rules, probe=f"{RUNS_API}/namespaces/{cluster.namespace}/agentruns"
        )
    else:
        username = f"{SERVICE_ACCOUNT_PREFIX}{cluster.namespace}:{account}"
        manifest = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}}
        await cluster.request("POST", cluster.path("serviceaccounts"), json=manifest)
    if cluster.emulator is not None:
        token = f"{account}-{cluster.namespace}-token"
        cluster.emulator.identities[token] = UserInfo(
            username, (*service_account_groups(username), "system:authenticated")
        )
        groups = (*service_account_groups(username), "system:authenticated")
        cluster.emulator.authorizers[token] = StoredRbac(cluster.emulator, username, groups)
        return Person(username, token)
    code, token = await cluster.kubectl("create", "token", account, "-n", cluster.namespace, "--duration=1h")
    assert code == 0, token
    return Person(username, token.strip())


@contextlib.asynccontextmanager
async def running_console(cluster: TestCluster, **config: Any) -> AsyncIterator[str]:
    """The console served from this process on a free 127.0.0.1 port, against the cluster's
    kubeconfig (its credentials are the console's own: used in proxy and kubeconfig modes only)."""
    access = await kubeconfig_loading.load(str(cluster.kubeconfig))
    settings = ConsoleConfig(**{"namespace": cluster.namespace, **config})
    async with serving(Console.of(access, settings), "127.0.0.1", 0) as port:
        yield f"http://127.0.0.1:{port}"


CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(page: str) -> str:
    found = CSRF.search(page)
    assert found is not None, page
    return found.group(1)


@contextlib.asynccontextmanager
async def browser_session(url: str) -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client that keeps cookies like a browser (also the Secure ones over http://127.0.0.1)."""
    async with aiohttp.ClientSession(
        url, cookie_jar=aiohttp.CookieJar(unsafe=True, treat_as_secure_origin=[url])
    ) as http:
        yield http


async def sign_in(http: aiohttp.ClientSession, token: str) -> aiohttp.ClientResponse:
    return await http.post("/login", data={"token": token}, allow_redirects=False)
