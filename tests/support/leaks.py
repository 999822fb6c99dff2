"""Evidence for the secret-leak scan: what every operator process left behind, kept for the session.

Each `OperatorProcess.stop()` hands its logs, a last metrics scrape and a snapshot of the cluster it
talked to (AgentRuns, Events, ConfigMaps, Secrets, read over the API like any client) to
`record()`. `find_leaks()` then looks for every secret value in everything that is not a user's own
Secret: the API key the operator was started with, and the decoded values of Secrets the tests
created (API keys, tool header Secrets). Transcript chunks are Secrets too, but they are the
operator's output: they are decompressed and scanned rather than treated as secret sources.

Evidence is written to one folder (`keep_in()`, set by tests/conftest.py: `--leak-evidence=DIR` or a
temporary folder), one file per operator, not kept in memory: the tests run in parallel processes
(pytest-xdist), and the scan runs after all of them, in a process of its own (`make test`), over
what every one of them left.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import os
import uuid
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

#: Secrets shorter than this are too generic to scan for ("true", "1", "default").
MIN_SECRET_CHARS = 8
SCANNED_LISTS = (
    "/apis/agentrun.dev/v1alpha1/agentruns",
    "/api/v1/events",
    "/apis/events.k8s.io/v1/events",
    "/api/v1/configmaps",
    "/api/v1/secrets",
)


@dataclass
class Evidence:
    """One operator's leftovers: where each text came from, and the secrets that must not be in it."""

    source: str
    texts: dict[str, str] = field(default_factory=dict)
    secrets: set[str] = field(default_factory=set)


_folder: Path | None = None


def keep_in(folder: Path) -> None:
    """Where this process writes its evidence and the scan reads everyone's."""
    global _folder
    folder.mkdir(parents=True, exist_ok=True)
    _folder = folder


def folder() -> Path:
    if _folder is None:
        raise RuntimeError("no folder for the leak scan's evidence: tests/conftest.py sets one (keep_in)")
    return _folder


def record(evidence: Evidence) -> None:
    """One file per operator, written whole before it gets its name: the scan never reads half of one."""
    data = {"source": evidence.source, "texts": evidence.texts, "secrets": sorted(evidence.secrets)}
    name = f"{os.getpid()}-{uuid.uuid4().hex}"
    partial = folder() / f"{name}.partial"
    partial.write_text(json.dumps(data))
    partial.rename(folder() / f"{name}.json")


def recorded() -> list[Evidence]:
    """Everything every process of the session recorded so far."""
    return recorded_in(folder())


def recorded_in(where: Path) -> list[Evidence]:
    found = []
    for path in sorted(where.glob("*.json")):
        data = json.loads(path.read_text())
        found.append(Evidence(data["source"], dict(data["texts"]), set(data["secrets"])))
    return found


def _is_operator_output(obj: Mapping[str, Any]) -> bool:
    """Transcript chunks are owned by an AgentRun; user Secrets are not."""
    owners = obj.get("metadata", {}).get("ownerReferences") or []
    return any(o.get("kind") == "AgentRun" for o in owners)


def _decode(value: str) -> str:
    """Secret data is base64; transcript chunks are compressed inside it."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value
    for unpack in (gzip.decompress, zlib.decompress):
        try:
            raw = unpack(raw)
            break
        except (OSError, zlib.error, EOFError):
            continue
    try:
        inner = raw.decode()
    except UnicodeDecodeError:
        return value
    # Chunks may be base64 of gzip again (a ConfigMap-style string payload): one more round.
    return _decode(inner) if inner != value and _looks_base64(inner) else inner


def _looks_base64(text: str) -> bool:
    stripped = text.strip()
    if len(stripped) < 16 or len(stripped) % 4:
        return False
    try:
        base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _secret_values(value: str) -> Iterable[str]:
    """A Secret value, and the values inside it when it holds a JSON object of headers."""
    yield value
    try:
        parsed = json.loads(value)
    except ValueError:
        return
    if isinstance(parsed, dict):
        for inner in parsed.values():
            if isinstance(inner, str):
                yield inner
                # "Bearer abc…": the credential part alone must not appear either.
                yield inner.rsplit(" ", 1)[-1]


def _read_kubeconfig(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


async def snapshot_cluster(kubeconfig: Path) -> tuple[dict[str, str], set[str]]:
    """Every scanned object as text, and the secret values found in users' Secrets."""
    config = _read_kubeconfig(kubeconfig)
    server = config["clusters"][0]["cluster"]["server"]
    token = config["users"][0]["user"].get("token")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    texts: dict[str, str] = {}
    secrets: set[str] = set()
    async with aiohttp.ClientSession(headers=headers) as session:
        for path in SCANNED_LISTS:
            async with session.get(f"{server}{path}") as response:
                if response.status != 200:
                    continue
                items = (await response.json()).get("items") or []
            for obj in items:
                meta = obj.get("metadata", {})
                where = f"{path}/{meta.get('namespace')}/{meta.get('name')}"
                if path.endswith("/secrets"):
                    data = {k: _decode(v) for k, v in (obj.get("data") or {}).items()}
                    if _is_operator_output(obj):
                        texts[where] = json.dumps(data)
                    else:
                        for value in data.values():
                            secrets.update(v for v in _secret_values(value) if len(v) >= MIN_SECRET_CHARS)
                    continue
                texts[where] = json.dumps(obj)
    return texts, secrets


def find_leaks(evidence: Iterable[Evidence]) -> list[str]:
    found = []
    for item in evidence:
        for secret in sorted(item.secrets):
            for where, text in item.texts.items():
                if secret in text:
                    found.append(f"{item.source}: a secret ({secret[:4]}…) appears in {where}")
    return found
