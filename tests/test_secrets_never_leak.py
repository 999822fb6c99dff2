"""After the whole suite: no API key or Secret value appears in status, events, logs, transcripts or
metrics of any operator the tests ran.

Every `OperatorProcess.stop()` leaves its evidence in the session's folder (tests/support/leaks.py).
In a serial run tests/conftest.py moves this test to the end of the session; in a parallel one
(pytest-xdist) no worker runs it: `make test` runs it after the parallel run, over the folder every
worker wrote to (`pytest --leak-evidence=DIR`). Run on its own, or after a run that started no
operator, the test first produces evidence with a workload of its own, so it never passes on an
empty scan.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import aiohttp

from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support import leaks
from tests.support.builders import agentrun
from tests.support.operator_process import OperatorProcess
from tests.support.waiting import until

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "agentruns.agentrun.dev.yaml"
RUN_KEY = "sk-ant-leakscan-run-key-3f9a1c77"
OPERATOR_KEY = "sk-ant-leakscan-operator-key-8d2e44"


async def _own_workload(tmp_path: Path) -> None:
    """A run whose key comes from a Secret, with a tool call, and an operator with its own key."""
    script = Script(
        "[scenario:leak-scan]",
        [
            Reply([tool_use_block("calculator", {"expression": "6*7"}, id="toolu_leak1")]),
            Reply([text_block("42")]),
        ],
    )
    api = FakeMessagesAPI(scripts=[script], require_api_key=RUN_KEY)
    async with api.running() as model, KubeEmulator.running(crd_paths=[CRD]) as cluster:
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "anthropic"},
            "data": {"api-key": base64.b64encode(RUN_KEY.encode()).decode()},
        }
        run = agentrun(
            "leak-scan",
            "[scenario:leak-scan] what is 6*7?",
            model={"name": "claude-haiku-4-5", "apiKeySecretRef": {"name": "anthropic"}},
            tools=[{"builtin": {"name": "calculator"}}],
        )
        operator = OperatorProcess(
            kubeconfig=Path(cluster.kubeconfig_path),
            log_path=tmp_path / "operator.log",
            env={"ANTHROPIC_API_KEY": OPERATOR_KEY, "ANTHROPIC_BASE_URL": model.url},
        )
        async with aiohttp.ClientSession() as session:
            for path, body in (("/api/v1/namespaces/default/secrets", secret), (None, run)):
                url = path or "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns"
                async with session.post(f"{cluster.url}{url}", json=body) as response:
                    assert response.status == 201, await response.text()
            await operator.start()
            try:

                async def phase() -> str | None:
                    async with session.get(
                        f"{cluster.url}/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns/leak-scan"
                    ) as response:
                        return (await response.json()).get("status", {}).get("phase")  # type: ignore[no-any-return]

                finished = await until(
                    phase, "the run to finish", 30, done=lambda p: p in ("Succeeded", "Failed")
                )
                assert finished == "Succeeded"
            finally:
                await operator.stop()


async def test_no_secret_appears_in_anything_the_operators_left_behind(tmp_path: Path) -> None:
    if not leaks.recorded():
        await _own_workload(tmp_path)
    evidence = leaks.recorded()
    scanned_secrets = set().union(*(e.secrets for e in evidence))
    assert scanned_secrets, "the scan had no secrets to look for"
    assert any("operator log" in e.texts for e in evidence)
    assert leaks.find_leaks(evidence) == []


def test_the_scanner_finds_a_key_in_a_decompressed_transcript_chunk() -> None:
    """The scan itself must be able to fail: a planted key in a gzip chunk is found."""
    import gzip

    chunk = base64.b64encode(gzip.compress(json.dumps({"text": f"key={RUN_KEY}"}).encode())).decode()
    owner = {"kind": "AgentRun", "name": "r", "uid": "u", "apiVersion": "agentrun.dev/v1alpha1"}
    obj = {"metadata": {"name": "r-transcript-0", "ownerReferences": [owner]}, "data": {"c": chunk}}
    assert leaks._is_operator_output(obj)
    texts = {"chunk": json.dumps({k: leaks._decode(v) for k, v in obj["data"].items()})}
    evidence = leaks.Evidence(source="planted", texts=texts, secrets={RUN_KEY})
    assert leaks.find_leaks([evidence]) == ["planted: a secret (sk-a…) appears in chunk"]


def test_a_leak_recorded_by_another_process_is_found(tmp_path: Path) -> None:
    """The scan reads what every worker of a parallel run wrote, not only what its own process saw."""
    planted = f"log line: key={RUN_KEY}"
    script = (
        "import sys; from pathlib import Path; from tests.support import leaks; "
        "leaks.keep_in(Path(sys.argv[1])); "
        "leaks.record(leaks.Evidence('worker', {'operator log': sys.argv[2]}, {sys.argv[3]}))"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path), planted, RUN_KEY], check=True, cwd=ROOT)
    found = leaks.find_leaks(leaks.recorded_in(tmp_path))
    assert found == ["worker: a secret (sk-a…) appears in operator log"]
