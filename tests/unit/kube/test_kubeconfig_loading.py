"""Every kubeconfig form kubectl accepts resolves to the same credentials for Kopf and for our own client."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from agentrun.controller.kopf_registry import connection_info
from agentrun.kube import kubeconfig_loading
from agentrun.kube.kubeconfig_loading import ClusterAccess, KubeconfigError, load
from tests.support.kubeconfigs import exec_calls, exec_plugin, exec_user, write_kubeconfig
from tests.support.tls import Pki, make_pki

SERVER = "https://127.0.0.1:6443"


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with none of the kubeconfig's files in it."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def _files(folder: Path, pki: Pki) -> None:
    (folder / "keys").mkdir(parents=True, exist_ok=True)
    (folder / "ca.crt").write_bytes(pki.ca)
    (folder / "client.crt").write_bytes(pki.client_cert)
    (folder / "keys" / "client.key").write_bytes(pki.client_key)


async def _load(kubeconfig: Path | str, tmp_path: Path, **kwargs: str) -> ClusterAccess:
    """From KUBECONFIG, as every command reads it by default; no service account on this machine."""
    return await load(environ={"KUBECONFIG": str(kubeconfig)}, service_account=tmp_path / "no-sa", **kwargs)


def _bytes(path: str | None) -> bytes:
    assert path is not None
    return Path(path).read_bytes()


def _kubectl(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    return subprocess.run(
        ["kubectl", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True, timeout=30
    ).stdout


def _kubectl_flattened(kubeconfig: Path, cwd: Path) -> dict[str, object]:
    """kubectl's own reading of the kubeconfig, with every file it resolved embedded."""
    out = _kubectl(
        "config", "view", "--raw", "--flatten", "--minify", "--kubeconfig", str(kubeconfig), cwd=cwd
    )
    flattened: dict[str, object] = yaml.safe_load(out)
    return flattened


async def test_relative_certificate_paths_resolve_against_the_kubeconfigs_folder_as_kubectl_does(
    tmp_path: Path, elsewhere: Path, pki: Pki
) -> None:
    folder = tmp_path / "config"
    _files(folder, pki)
    kubeconfig = write_kubeconfig(
        folder / "kubeconfig",
        server=SERVER,
        cluster={"certificate-authority": "ca.crt"},
        user={"client-certificate": "client.crt", "client-key": "keys/client.key"},
    )
    access = await _load(kubeconfig, tmp_path)
    assert (access.ca_path, access.certificate_path, access.private_key_path) == (
        str(folder / "ca.crt"),
        str(folder / "client.crt"),
        str(folder / "keys" / "client.key"),
    )
    # kubectl, run from the same working directory, reads the very same files.
    flat = _kubectl_flattened(kubeconfig, elsewhere)
    cluster = flat["clusters"][0]["cluster"]  # type: ignore[index]
    user = flat["users"][0]["user"]  # type: ignore[index]
    assert base64.b64decode(cluster["certificate-authority-data"]) == _bytes(access.ca_path)
    assert base64.b64decode(user["client-key-data"]) == _bytes(access.private_key_path)
    # Kopf builds its TLS context from them here, where the relative names mean nothing.
    info = connection_info(access)
    assert info.server == SERVER and not info.insecure
    info.as_ssl_context()
    assert not (elsewhere / "ca.crt").exists()


async def test_embedded_certificate_data_becomes_private_files(
    tmp_path: Path, elsewhere: Path, pki: Pki
) -> None:
    kubeconfig = write_kubeconfig(
        tmp_path / "config" / "kubeconfig",
        server=SERVER,
        cluster={"certificate-authority-data": base64.b64encode(pki.ca).decode()},
        user={
            "client-certificate-data": base64.b64encode(pki.client_cert).decode(),
            "client-key-data": base64.b64encode(pki.client_key).decode(),
        },
    )
    access = await _load(kubeconfig, tmp_path)
    assert access.ca_path and access.certificate_path and access.private_key_path
    assert _bytes(access.ca_path) == pki.ca
    assert _bytes(access.private_key_path) == pki.client_key
    assert os.stat(access.private_key_path).st_mode & 0o077 == 0
    connection_info(access).as_ssl_context()
    assert access.configuration().cert_file == access.certificate_path


async def test_a_bearer_token_is_sent_by_kopf_and_by_the_client_unchanged(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig",
        server="http://127.0.0.1:8080",
        user={"token": "static-token"},
        namespace="ops",
    )
    access = await _load(kubeconfig, tmp_path)
    assert connection_info(access).as_http_headers() == {"Authorization": "Bearer static-token"}
    configuration = access.configuration()
    assert await configuration.get_api_key_with_prefix("BearerToken") == "Bearer static-token"
    assert configuration.refresh_api_key_hook is None  # nothing to renew
    assert (access.namespace, access.user, access.context) == ("ops", "test", "test")


async def test_a_token_file_is_read_relative_to_the_kubeconfig_and_read_again_when_it_rotates(
    tmp_path: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "config" / "secrets" / "token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text("first-token\n")
    kubeconfig = write_kubeconfig(
        tmp_path / "config" / "kubeconfig",
        server="http://127.0.0.1:8080",
        user={"tokenFile": "secrets/token"},
    )
    access = await _load(kubeconfig, tmp_path)
    assert access.authorization == "Bearer first-token" and access.rotating
    assert connection_info(access).as_http_headers() == {"Authorization": "Bearer first-token"}
    monkeypatch.setattr(kubeconfig_loading, "ROTATION_SECONDS", 0.0)
    configuration = access.configuration()
    token_file.write_text("second-token")
    assert await configuration.get_api_key_with_prefix("BearerToken") == "Bearer second-token"


async def test_an_exec_plugin_token_carries_its_expiry_to_kopf_and_is_renewed_by_the_client(
    tmp_path: Path, elsewhere: Path
) -> None:
    plugin = exec_plugin(tmp_path / "config" / "bin" / "credentials", prefix="exec-", lifetime=2)
    kubeconfig = write_kubeconfig(
        tmp_path / "config" / "kubeconfig",
        server="http://127.0.0.1:8080",
        user=exec_user("./bin/credentials"),
    )
    access = await _load(kubeconfig, tmp_path)
    assert access.authorization == "Bearer exec-1"
    assert access.expiration is not None
    info = connection_info(access)
    assert info.expiration == access.expiration  # Kopf logs in again when it passes
    assert info.as_http_headers() == {"Authorization": "Bearer exec-1"}
    configuration = access.configuration()
    assert await configuration.get_api_key_with_prefix("BearerToken") == "Bearer exec-1"
    await asyncio.sleep(2.1)
    assert await configuration.get_api_key_with_prefix("BearerToken") == "Bearer exec-2"
    assert exec_calls(plugin) == 2


async def test_several_kubeconfig_files_merge_with_the_first_one_winning_each_name(
    tmp_path: Path, elsewhere: Path, pki: Pki
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    _files(first, pki)
    _files(second, pki)
    (first / "ca.crt").write_bytes(pki.ca + b"\n")  # which folder's CA is used shows in its content
    a = write_kubeconfig(
        first / "config", server=SERVER, cluster={"certificate-authority": "ca.crt"}, name="a"
    )
    config_a = yaml.safe_load(a.read_text())
    config_a["contexts"][0]["context"]["user"] = "b"
    config_a["users"] = []
    a.write_text(yaml.safe_dump(config_a))
    b = write_kubeconfig(
        second / "config",
        server="https://10.9.9.9",
        cluster={"certificate-authority": "ca.crt"},
        user={"client-certificate": "client.crt", "client-key": "keys/client.key"},
        name="b",
    )
    listed = f"{a}:{b}"
    access = await load(environ={"KUBECONFIG": listed}, service_account=tmp_path / "no-sa")
    assert (access.context, access.server) == ("a", SERVER)
    assert access.ca_path == str(first / "ca.crt")
    assert access.certificate_path == str(second / "client.crt")
    current = _kubectl("config", "current-context", env={**os.environ, "KUBECONFIG": listed})
    assert current.strip() == access.context
    other = await load(environ={"KUBECONFIG": listed}, context="b", service_account=tmp_path / "no-sa")
    assert (other.server, other.ca_path) == ("https://10.9.9.9", str(second / "ca.crt"))


async def test_the_in_cluster_service_account_comes_before_the_home_kubeconfig_but_after_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("sa-token\n")
    (account / "ca.crt").write_text("ca")
    (account / "namespace").write_text("agents")
    home = tmp_path / "home"
    write_kubeconfig(home / ".kube" / "config", server="http://home:1", user={"token": "home"})
    monkeypatch.setenv("HOME", str(home))
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    access = await load(environ=environ, service_account=account)
    assert (access.server, access.authorization, access.namespace) == (
        "https://10.96.0.1:443",
        "Bearer sa-token",
        "agents",
    )
    assert access.ca_path == str(account / "ca.crt") and access.rotating
    explicit = write_kubeconfig(tmp_path / "explicit", server="http://explicit:1", user={"token": "mine"})
    chosen = await load(environ={**environ, "KUBECONFIG": str(explicit)}, service_account=account)
    assert chosen.server == "http://explicit:1"
    without_account = await load(environ=environ, service_account=tmp_path / "none")
    assert without_account.server == "http://home:1"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing file", "kubeconfig {tmp}/absent.yaml does not exist"),
        ("no file in KUBECONFIG", "KUBECONFIG names {tmp}/a.yaml:{tmp}/b.yaml, and no such file exists"),
        ("unknown context", "context 'staging' is not in kubeconfig {tmp}/kubeconfig (its contexts: test)"),
        ("no current context", "kubeconfig {tmp}/kubeconfig has no current context; choose one with"),
        (
            "missing relative CA",
            "kubeconfig {tmp}/kubeconfig: certificate-authority {tmp}/ca.crt does not exist",
        ),
        (
            "failing exec plugin",
            "cannot use exec plugin '{tmp}/login' (context 'test'): exec: process returned 3.",
        ),
        ("not YAML", "cannot read kubeconfig {tmp}/kubeconfig: "),
        ("nothing configured", "no Kubernetes cluster is configured (set KUBECONFIG to a kubeconfig file)"),
    ],
)
async def test_an_unusable_kubeconfig_is_one_line_saying_what_is_wrong(
    case: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, server=SERVER, user={"token": "t"})
    environ = {"KUBECONFIG": str(kubeconfig)}
    context = None
    explicit = None
    if case == "missing file":
        explicit = str(tmp_path / "absent.yaml")
    elif case == "no file in KUBECONFIG":
        environ = {"KUBECONFIG": f"{tmp_path}/a.yaml:{tmp_path}/b.yaml"}
    elif case == "unknown context":
        context = "staging"
    elif case == "no current context":
        config = yaml.safe_load(kubeconfig.read_text())
        del config["current-context"]
        kubeconfig.write_text(yaml.safe_dump(config))
    elif case == "missing relative CA":
        write_kubeconfig(kubeconfig, server=SERVER, cluster={"certificate-authority": "ca.crt"})
    elif case == "failing exec plugin":
        login = tmp_path / "login"
        login.write_text("#!/bin/sh\necho 'session expired: run sso login' >&2\nexit 3\n")
        login.chmod(0o755)
        write_kubeconfig(kubeconfig, server=SERVER, user=exec_user("./login"))
    elif case == "not YAML":
        kubeconfig.write_text("clusters: [unclosed\n")
    elif case == "nothing configured":
        environ = {}
        monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    with pytest.raises(KubeconfigError) as raised:
        await load(explicit, context, environ=environ, service_account=tmp_path / "no-sa")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(expected.format(tmp=tmp_path)), message
    if case == "failing exec plugin":
        assert message.endswith("session expired: run sso login")
