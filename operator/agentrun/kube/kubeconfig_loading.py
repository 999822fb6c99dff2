"""Where the Kubernetes API is and who we are to it, resolved the way kubectl does, for every client of ours.

kubectl reads a kubeconfig's relative file paths against that kubeconfig's folder, accepts embedded
``*-data``, tokens, token files and exec plugins, merges every file KUBECONFIG lists (the first file to
name an entry wins) and uses the current context. Kopf's ``login_with_kubeconfig`` reads relative paths
against the working directory and knows neither token files nor exec plugins, so a kubeconfig that
kubectl accepts could stop the operator. Hence one resolution, here, for Kopf's login
(controller/kopf_registry.py), the operator's own client (kube/calling.py), the demo,
`agentrun run` and the kubectl plugin. kubernetes_asyncio's loader does the credential work (exec
plugins, embedded data written to private temporary files); this module merges the files, makes paths
absolute against their own file, and words every problem as one line (kube/failures.py).

Order: ``--kubeconfig``, else ``KUBECONFIG``, else the pod's service account, else ``~/.kube/config``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.kube_config import KubeConfigLoader
from yarl import URL

from agentrun.kube.failures import KubeconfigError

__all__ = ["SERVICE_ACCOUNT", "ClusterAccess", "KubeconfigError", "environment_proxy", "load"]

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")
#: Token files (a pod's service account, a kubeconfig's tokenFile) are rotated by whoever writes them.
ROTATION_SECONDS = 60.0
#: An expiring token (exec plugins) is renewed this long before it expires, at most a tenth of its life.
RENEW_EARLY_SECONDS = 60.0

# kubernetes_asyncio logs a failing exec plugin before raising; the raised error is what we report, once.
_loader_log = logging.getLogger("kubernetes_asyncio.config.kube_config")
_loader_log.addHandler(logging.NullHandler())
_loader_log.propagate = False

#: Per kubeconfig section: the key of the entry's body, and its keys that name files.
_SECTIONS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "clusters": ("cluster", ("certificate-authority",)),
    "users": ("user", ("client-certificate", "client-key", "tokenFile")),
    "contexts": ("context", ()),
}


@dataclass(frozen=True)
class ClusterAccess:
    """What a client needs: server, TLS files, the Authorization header, the context's namespace.

    File paths are absolute (embedded data lives in private temporary files), so any client can use
    them from any working directory.
    """

    server: str
    #: For messages: "kubeconfig /path (context NAME)" or "the in-cluster service account".
    source: str
    ca_path: str | None = None
    insecure: bool = False
    certificate_path: str | None = None
    private_key_path: str | None = None
    #: The whole header value: "Bearer <token>" or "Basic <base64>".
    authorization: str | None = None
    proxy: str | None = None
    tls_server_name: str | None = None
    #: The context's namespace and user name (the plugin's defaults for --namespace and --by).
    namespace: str | None = None
    user: str | None = None
    context: str | None = None
    #: When the credentials stop working (an exec plugin's expirationTimestamp): load them again before.
    expiration: datetime.datetime | None = None
    #: The token is read from a file that gets rewritten (service account, tokenFile): re-read it.
    rotating: bool = False
    kubeconfig: tuple[str, ...] = ()
    service_account: str | None = None

    def configuration(self) -> client.Configuration:
        """A kubernetes_asyncio configuration that renews expiring or rotating tokens before a request."""
        configuration = client.Configuration(host=self.server)
        configuration.ssl_ca_cert = self.ca_path
        configuration.verify_ssl = not self.insecure
        configuration.cert_file = self.certificate_path
        configuration.key_file = self.private_key_path
        configuration.proxy = self.proxy
        configuration.tls_server_name = self.tls_server_name
        if self.authorization:
            configuration.api_key["BearerToken"] = self.authorization
        if self.expiration is not None or self.rotating:
            configuration.refresh_api_key_hook = _Renewal(self)
        return configuration

    def api_client(self) -> client.ApiClient:
        """A client whose HTTP session does not consult the environment on every request.

        kubernetes_asyncio's session trusts the environment, so aiohttp looks up the proxy variables
        and ``~/.netrc`` in a worker thread for every API request (two thread hand-offs per write,
        ~3% of the operator's CPU at 1000 runs). The proxy is resolved here once instead, as aiohttp
        would: the kubeconfig's proxy-url, else HTTPS_PROXY/HTTP_PROXY for the server unless NO_PROXY
        exempts it (credentials from the variable or ``~/.netrc`` stay in the proxy's URL, whence
        aiohttp sends them).
        """
        configuration = self.configuration()
        if configuration.proxy is None:
            configuration.proxy = environment_proxy(self.server)
        api = client.ApiClient(configuration)
        rest = api.rest_client
        trusting: aiohttp.ClientSession = rest.pool_manager
        connector = trusting.connector
        trusting.detach()  # its connector goes on in the new session; the old one is closed, unused
        rest.pool_manager = aiohttp.ClientSession(
            connector=connector,
            trust_env=False,
            # As kubernetes_asyncio's session: a watch event of a large object (etcd allows 1.5 MiB).
            read_bufsize=2**21,
        )
        return api

    async def renewed(self) -> ClusterAccess:
        """The same source resolved again: a new exec plugin token, a re-read token file."""
        if self.service_account is not None:
            return dataclasses.replace(self, authorization=_service_account_token(Path(self.service_account)))
        return await _from_kubeconfig(tuple(Path(p) for p in self.kubeconfig), self.context)


def environment_proxy(server: str) -> str | None:
    """The proxy the environment names for ``server``, with its credentials (None when there is none
    or NO_PROXY exempts the server): what aiohttp would look up for every request."""
    try:
        proxy, auth = get_env_proxy_for_url(URL(server))
    except LookupError:
        return None
    if auth is not None:
        proxy = proxy.with_user(auth.login).with_password(auth.password)
    return str(proxy)


async def load(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    service_account: Path = SERVICE_ACCOUNT,
) -> ClusterAccess:
    """The cluster to use: ``kubeconfig``, else KUBECONFIG, else the service account, else ~/.kube/config."""
    env = os.environ if environ is None else environ
    paths = _kubeconfig_files(kubeconfig, context, env, service_account)
    if not paths:
        return _from_service_account(service_account, env)
    return await _from_kubeconfig(paths, context)


def _kubeconfig_files(
    kubeconfig: str | None, context: str | None, environ: Mapping[str, str], service_account: Path
) -> tuple[Path, ...]:
    """The kubeconfig files to merge; none for the service account."""
    if kubeconfig:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            raise KubeconfigError(f"kubeconfig {kubeconfig} does not exist")
        return (path,)
    listed = environ.get("KUBECONFIG", "")
    if listed:
        found = tuple(p for p in (Path(x).expanduser() for x in listed.split(os.pathsep) if x) if p.is_file())
        if not found:
            raise KubeconfigError(
                f"KUBECONFIG names {listed}, and no such file exists; point it at a kubeconfig file"
            )
        return found
    if context is None and (service_account / "token").is_file():
        return ()
    default = DEFAULT_KUBECONFIG.expanduser()
    if default.is_file():
        return (default,)
    raise KubeconfigError("no Kubernetes cluster is configured (set KUBECONFIG to a kubeconfig file)")


def _from_service_account(directory: Path, environ: Mapping[str, str]) -> ClusterAccess:
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT") or "443"
    if host:
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    else:
        server = "https://kubernetes.default.svc"
    ca = directory / "ca.crt"
    namespace = directory / "namespace"
    return ClusterAccess(
        server=server,
        source="the in-cluster service account",
        ca_path=str(ca) if ca.is_file() else None,
        authorization=_service_account_token(directory),
        namespace=(namespace.read_text().strip() or None) if namespace.is_file() else None,
        rotating=True,
        service_account=str(directory),
    )


def _service_account_token(directory: Path) -> str:
    token = (directory / "token").read_text().strip()
    if not token:
        raise KubeconfigError(f"the service account token {directory / 'token'} is empty")
    return f"Bearer {token}"


@dataclass(frozen=True)
class _Chosen:
    """The merged kubeconfig and the entries of the context in use."""

    where: str
    merged: dict[str, Any]
    name: str
    context: Mapping[str, Any]
    user: Mapping[str, Any]


async def _from_kubeconfig(paths: tuple[Path, ...], context: str | None) -> ClusterAccess:
    chosen = _choose(paths, context)
    where, name, user = chosen.where, chosen.name, chosen.user
    loader = KubeConfigLoader(config_dict=chosen.merged, active_context=name, config_base_path="")
    configuration = client.Configuration()
    try:
        await loader.load_and_set(configuration)
    except (ConfigException, OSError, ValueError, ImportError) as exc:
        exec_config = user.get("exec")
        what = f"exec plugin {exec_config.get('command')!r}" if isinstance(exec_config, dict) else where
        raise KubeconfigError(f"cannot use {what} (context {name!r}): {' '.join(str(exc).split())}") from exc
    authorization = str(configuration.api_key.get("BearerToken") or "").strip()
    return ClusterAccess(
        server=str(configuration.host),
        source=f"{where} (context {name})",
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        authorization=authorization or None,
        proxy=configuration.proxy,
        tls_server_name=configuration.tls_server_name,
        namespace=chosen.context.get("namespace") or None,
        user=chosen.context.get("user") or None,
        context=name,
        expiration=getattr(loader, "exec_plugin_expiry", None),
        rotating=bool(user.get("tokenFile")) and not user.get("token") and "exec" not in user,
        kubeconfig=tuple(str(p) for p in paths),
    )


def _choose(paths: tuple[Path, ...], context: str | None) -> _Chosen:
    where = "kubeconfig " + os.pathsep.join(str(p) for p in paths)
    merged = _merged(paths, where)
    name = context or merged["current-context"]
    if not name:
        raise KubeconfigError(
            f"{where} has no current context; choose one with `kubectl config use-context NAME`"
        )
    contexts = {entry["name"]: entry["context"] for entry in merged["contexts"]}
    if name not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        raise KubeconfigError(f"context {name!r} is not in {where} (its contexts: {known})")
    chosen = contexts[name]
    cluster_name = chosen.get("cluster")
    cluster = next((e["cluster"] for e in merged["clusters"] if e["name"] == cluster_name), None)
    if cluster is None:
        raise KubeconfigError(
            f"context {name!r} of {where} names cluster {cluster_name!r}, which is not there"
        )
    server = cluster.get("server")
    if not server:
        raise KubeconfigError(f"cluster {cluster_name!r} of {where} has no server address")
    user: Mapping[str, Any] = next(
        (e["user"] for e in merged["users"] if e["name"] == chosen.get("user")), {}
    )
    _check_files(where, str(server), cluster, user)
    return _Chosen(where=where, merged=merged, name=name, context=chosen, user=user)


def _merged(paths: Sequence[Path], where: str) -> dict[str, Any]:
    """kubectl's merge: the first file to name an entry (or to set current-context) wins."""
    merged: dict[str, Any] = {"clusters": [], "users": [], "contexts": [], "current-context": None}
    for path in paths:
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise KubeconfigError(f"cannot read kubeconfig {path}: {first}") from exc
        if document is None:
            continue
        if not isinstance(document, dict):
            raise KubeconfigError(f"kubeconfig {path} is not a kubeconfig (a YAML mapping)")
        for section, (body_key, file_keys) in _SECTIONS.items():
            entries = document.get(section) or []
            if not isinstance(entries, list):
                raise KubeconfigError(f"kubeconfig {path}: {section} must be a list")
            for index, entry in enumerate(entries):
                if not isinstance(entry, dict) or not entry.get("name"):
                    raise KubeconfigError(f"kubeconfig {path}: {section}[{index}] has no name")
                if any(e["name"] == entry["name"] for e in merged[section]):
                    continue
                body = entry.get(body_key) or {}
                if not isinstance(body, dict):
                    raise KubeconfigError(f"kubeconfig {path}: {section}[{index}].{body_key} is no mapping")
                body = _absolute(body, file_keys, path.parent)
                merged[section].append({"name": entry["name"], body_key: body})
        if merged["current-context"] is None and document.get("current-context"):
            merged["current-context"] = document["current-context"]
    if not merged["contexts"] and merged["current-context"] is None:
        raise KubeconfigError(f"{where} defines no context")
    return merged


def _absolute(body: dict[str, Any], file_keys: Sequence[str], folder: Path) -> dict[str, Any]:
    """Relative file paths against the kubeconfig's own folder, as kubectl reads them."""
    result = dict(body)
    for key in file_keys:
        value = result.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            result[key] = str(folder / value)
    command = (result.get("exec") or {}).get("command") if isinstance(result.get("exec"), dict) else None
    if isinstance(command, str) and os.sep in command and not os.path.isabs(command):
        result["exec"] = {**result["exec"], "command": str(folder / command)}
    return result


def _check_files(where: str, server: str, cluster: Mapping[str, Any], user: Mapping[str, Any]) -> None:
    """A named file that is missing, said as such (the loader would say "File does not exists")."""
    named = [("tokenFile", user)]
    if server.startswith("https"):  # kubernetes_asyncio reads TLS files only for https, as kubectl
        named += [("certificate-authority", cluster), ("client-certificate", user), ("client-key", user)]
    data_key = {"tokenFile": "token"}
    for key, section in named:
        path = section.get(key)
        if path and not section.get(data_key.get(key, f"{key}-data")) and not Path(path).is_file():
            raise KubeconfigError(
                f"{where}: {key} {path} does not exist (relative paths are read from the kubeconfig's folder)"
            )


class _Renewal:
    """kubernetes_asyncio's refresh hook: loads the credentials again when they are about to stop working."""

    def __init__(self, access: ClusterAccess) -> None:
        self._access = access
        self._due = _renewal_due(access)
        self._lock = asyncio.Lock()

    async def __call__(self, configuration: client.Configuration) -> None:
        if time.time() < self._due:
            return
        async with self._lock:
            if time.time() < self._due:
                return
            self._access = await self._access.renewed()
            self._due = _renewal_due(self._access)
            if self._access.authorization:
                configuration.api_key["BearerToken"] = self._access.authorization


def _renewal_due(access: ClusterAccess) -> float:
    now = time.time()
    if access.expiration is not None:
        expires = access.expiration
        if expires.tzinfo is None:
            expires = expires.replace(tzinfo=datetime.UTC)
        left = expires.timestamp() - now
        return now + max(0.0, left - min(RENEW_EARLY_SECONDS, left / 10))
    if access.rotating:
        return now + ROTATION_SECONDS
    return math.inf
