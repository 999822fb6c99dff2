"""The bad-input corpus: every manifest in tests/data/invalid is refused clearly, never crashes.

Each manifest says what must happen in two annotations: ``test.agentrun.dev/expect`` is
``Rejected`` (the API server refuses it at admission: CRD schema, CEL, strict field validation as
kubectl sends it), ``InvalidSpec`` (admitted, then the run ends Failed/InvalidSpec) or
``Pending/<Reason>`` (admitted and waiting, e.g. for a Secret). ``test.agentrun.dev/field`` is the
field the error message must name. A manifest of another kind (a SandboxTemplate) can only be
``Rejected``. One operator serves the whole corpus, and a valid run applied
afterwards must still succeed: bad input never takes the operator down.

Against a real API server (``--real-cluster``) the server itself judges admission; the emulator's
answers to the same manifests must match it (tests/unit/sandbox/test_kube_api_schema.py).
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster, cluster_for
from tests.support.kube_requests import wait_status
from tests.support.operator_process import OperatorProcess
from tests.support.sandbox_templates import install_template_crd, templates_path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = sorted((ROOT / "tests" / "data" / "invalid").glob("*.yaml"))
API_KEY = "sk-ant-corpus-secret-0123456789"
EXPECT = "test.agentrun.dev/expect"
FIELD = "test.agentrun.dev/field"


def _load(path: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(path.read_text())
    task = manifest["spec"].get("task")
    if isinstance(task, str) and task.startswith("@bytes:"):
        # Generated, not committed: a multi-megabyte task would bloat the repository.
        manifest["spec"]["task"] = "x" * int(task.removeprefix("@bytes:"))
    return manifest


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[Script("[scenario:still-serving]", [Reply([text_block("Still serving.")])])],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(real_kubeconfig: Path | None) -> AsyncIterator[TestCluster]:
    """One API server (and namespace) for the whole corpus: the operator serving it is started once."""
    async with cluster_for(real_kubeconfig) as chosen:
        await install_template_crd(chosen)  # the corpus has SandboxTemplates too
        yield chosen


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[OperatorProcess]:
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url}
    log = tmp_path_factory.mktemp("corpus") / "operator.log"
    async with cluster.operator(log, env) as process:
        yield process


async def _create(cluster: TestCluster, manifest: dict[str, Any]) -> tuple[int, Any]:
    # kubectl create/apply ask for strict field validation: unknown fields are errors, not pruned.
    # A streamed body: multi-megabyte manifests are part of the corpus.
    body = io.BytesIO(json.dumps(manifest).encode())
    headers = {"Content-Type": "application/json"}
    kinds = {"AgentRun": cluster.runs_path, "SandboxTemplate": templates_path(cluster.namespace)}
    path = f"{kinds[manifest['kind']]}?fieldValidation=Strict"
    return await cluster.status_of("POST", path, data=body, headers=headers)


def _said(*phases: str) -> Callable[[dict[str, Any]], bool]:
    """For wait_status: one of ``phases``, with the message that says why."""
    return lambda status: status.get("phase") in phases and bool(status.get("message"))


def test_the_corpus_covers_every_kind_of_bad_input() -> None:
    expectations = [_load(p)["metadata"]["annotations"][EXPECT] for p in CORPUS]
    assert len(CORPUS) >= 40
    assert {"Rejected", "InvalidSpec"} <= set(expectations)
    assert any(e.startswith("Pending/") for e in expectations)


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
async def test_bad_manifest_is_refused_naming_the_field(
    path: Path, cluster: TestCluster, operator: OperatorProcess
) -> None:
    manifest = _load(path)
    expect = manifest["metadata"]["annotations"][EXPECT]
    field = manifest["metadata"]["annotations"][FIELD]
    code, body = await _create(cluster, manifest)
    if expect == "Rejected":
        assert code in (400, 422), f"admitted although invalid: {body}"
        assert body["kind"] == "Status" and body["status"] == "Failure"
        assert field in body["message"], body["message"]
        return
    assert code == 201, f"refused at admission although the operator should judge it: {body}"
    name = manifest["metadata"]["name"]
    if expect == "InvalidSpec":
        status = await wait_status(cluster, name, _said("Failed"))
        assert status["stopReason"] == "InvalidSpec"
        succeeded = {c["type"]: c for c in status["conditions"]}["Succeeded"]
        assert (succeeded["status"], succeeded["reason"]) == ("False", "InvalidSpec")
    else:
        reason = expect.removeprefix("Pending/")
        status = await wait_status(cluster, name, _said("Pending"))
        ready = {c["type"]: c for c in status["conditions"]}["Ready"]
        assert ready["reason"] == reason, status
        assert status["iterations"] == 0
    assert field in status["message"], status["message"]
    assert operator.process is not None and operator.process.returncode is None


@pytest.mark.asyncio(loop_scope="module")
async def test_an_unknown_builtin_tool_is_refused_by_the_api_server_listing_the_builtins(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    manifest = _load(ROOT / "tests" / "data" / "invalid" / "unknown-builtin-tool.yaml")
    manifest["metadata"]["name"] = "unknown-builtin-again"
    code, body = await _create(cluster, manifest)
    assert code == 422, body
    assert (
        'spec.tools[0].builtin.name: Unsupported value: "shell": supported values: "calculator", '
        '"current_time", "http_fetch", "kubernetes_events", "kubernetes_get", "kubernetes_list", "pod_logs"'
    ) in body["message"]


@pytest.mark.asyncio(loop_scope="module")
async def test_operator_still_serves_valid_runs_after_the_corpus(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    code, body = await _create(
        cluster,
        agentrun(
            "after-the-corpus",
            "[scenario:still-serving] hello",
            namespace=cluster.namespace,
            model={"name": "claude-haiku-4-5"},
        ),
    )
    assert code == 201, body
    status = await wait_status(cluster, "after-the-corpus", _said("Succeeded", "Failed"))
    assert (status["phase"], status["result"]) == ("Succeeded", "Still serving.")
    assert "Traceback" not in operator.logs()
    assert API_KEY not in operator.logs()
