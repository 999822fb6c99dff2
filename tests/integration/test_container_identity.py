"""The operator as a container runtime starts it: a UID with no passwd entry, GID 0, no USER or LOGNAME.

The chart runs the image as UID 65532, which the image's /etc/passwd does not name, and OpenShift's
restricted SCC picks an arbitrary UID with GID 0. Anything at start-up that asks who the user is
(``getpass.getuser()``, ``pwd.getpwuid``) then fails: the first released chart's pod crashed so. Here the
installed operator is started exactly that way (``setpriv`` as root, as CI runs; ``unshare --user``
otherwise), with the environment the chart's Deployment gives it, and must run a run to the end.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import request, wait_finished
from tests.support.operator_process import OperatorProcess

API_KEY = "sk-ant-identity-secret-0123456789"

#: What OpenShift's restricted SCC picks (from the namespace's range), with GID 0.
ARBITRARY_UID = 1000650000


@dataclass
class ContainerLikeOperator(OperatorProcess):
    """The operator under another UID and GID 0, with no login name anywhere and HOME where the image
    puts it (a writable folder, like the chart's emptyDir on /tmp)."""

    uid: int = ARBITRARY_UID
    home: Path = Path("/nonexistent")

    def environment(self) -> dict[str, str]:
        env = super().environment()
        for name in ("USER", "LOGNAME", "USERNAME", "LNAME", "POD_ID"):
            env.pop(name, None)
        env["HOME"] = env["TMPDIR"] = str(self.home)
        return env

    def command(self) -> list[str]:
        if os.geteuid() == 0:  # CI: the UID itself
            return ["setpriv", f"--reuid={self.uid}", "--regid=0", "--clear-groups", "--", *super().command()]
        # Anyone else: the same UID and GID inside a user namespace of their own (util-linux's unshare).
        return ["unshare", "--user", f"--map-user={self.uid}", "--map-group=0", "--", *super().command()]


@pytest.fixture
def container_home() -> Iterator[Path]:
    """A folder the other UID can write (pytest's own tmp folders are root's alone)."""
    home = Path(tempfile.mkdtemp(prefix="agentrun-uid-"))
    home.chmod(0o1777)
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                "[scenario:uid]",
                [
                    Reply(
                        [tool_use_block("calculator", {"expression": "6*7"})], usage=ScriptUsage(50, 10, 0, 0)
                    ),
                    Reply([text_block("42.")], usage=ScriptUsage(60, 5, 0, 0)),
                ],
            )
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


async def test_operator_under_a_uid_with_no_passwd_entry_and_gid_0_runs_a_run_to_the_end(
    cluster: TestCluster, model: FakeMessagesAPI, container_home: Path, tmp_path: Path
) -> None:
    with pytest.raises(KeyError):  # the premise: nothing on this machine names that UID
        pwd.getpwuid(ARBITRARY_UID)
    kubeconfig = container_home / "kubeconfig"
    shutil.copyfile(cluster.kubeconfig, kubeconfig)
    kubeconfig.chmod(0o644)
    # The environment the chart's Deployment sets (templates/deployment.yaml), a Lease included.
    env = {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "AGENTRUN_LEASE_NAMESPACE": cluster.namespace,
        "AGENTRUN_REPLICA_GROUP": "agentrun-operator",
        "POD_NAME": "agentrun-operator-6d9f7c-x2k4q",
        "AGENTRUN_REPLICA_NAME": "agentrun-operator-6d9f7c-x2k4q",
    }
    operator = ContainerLikeOperator(
        kubeconfig=kubeconfig,
        log_path=tmp_path / "operator.log",
        env=env,
        args=cluster.operator_args(),
        home=container_home,
    )
    await operator.start()
    try:
        manifest = agentrun(
            "uid",
            "[scenario:uid] what is six times seven?",
            namespace=cluster.namespace,
            model={"name": "claude-haiku-4-5"},
            tools=[{"builtin": {"name": "calculator"}}],
        )
        await request(cluster, "POST", cluster.runs_path, json=manifest)
        status = (await wait_finished(cluster, "uid"))["status"]
        assert (status["phase"], status["result"]) == ("Succeeded", "42."), operator.logs()
        assert "Traceback" not in operator.logs()
    finally:
        assert await operator.stop() == 0, operator.logs()
