"""Kubeconfigs in the forms kubectl accepts, and an exec credential plugin, written for tests."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

EXEC_API_VERSION = "client.authentication.k8s.io/v1"

_PLUGIN = """#!{python}
# An exec credential plugin: {token!r}, else a new token per call ({prefix}1, {prefix}2, ...), valid for
# {lifetime} s.
import datetime, json, os, pathlib, sys
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
assert info["kind"] == "ExecCredential", info
counter = pathlib.Path(__file__).with_name(pathlib.Path(__file__).name + ".calls")
calls = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(calls))
expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds={lifetime})
status = {{"token": {token!r} or "{prefix}" + str(calls)}}
if {lifetime} > 0:
    status["expirationTimestamp"] = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({{"apiVersion": "{api}", "kind": "ExecCredential", "status": status}}))
"""


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    cluster: Mapping[str, Any] | None = None,
    user: Mapping[str, Any] | None = None,
    namespace: str | None = None,
    name: str = "test",
) -> Path:
    """One cluster, user and context named ``name``, the current context."""
    context: dict[str, Any] = {"cluster": name, "user": name}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": name, "user": dict(user or {})}],
        "contexts": [{"name": name, "context": context}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def exec_plugin(
    path: Path, *, prefix: str = "exec-token-", lifetime: int = 3600, token: str | None = None
) -> Path:
    """An executable that prints an ExecCredential (``token``, else a new one per call); how often it
    ran is in ``<path>.calls``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = _PLUGIN.format(
        python=sys.executable, prefix=prefix, lifetime=lifetime, api=EXEC_API_VERSION, token=token or ""
    )
    path.write_text(text)
    path.chmod(0o755)
    return path


def exec_calls(path: Path) -> int:
    counter = path.with_name(path.name + ".calls")
    return int(counter.read_text()) if counter.exists() else 0


def exec_user(command: str, *args: str) -> dict[str, Any]:
    """kubectl wants interactiveMode with the v1 API; kubernetes_asyncio ignores it."""
    return {
        "exec": {
            "apiVersion": EXEC_API_VERSION,
            "command": command,
            "args": list(args),
            "interactiveMode": "Never",
        }
    }
