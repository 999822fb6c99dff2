"""A run's sandbox pod on a real node: the model's `bash` and text editor doing real work, and the limits.

What only a kubelet shows: commands really running in the pod the run's ServiceAccount created (git,
python3, ps from the project's sandbox image, images/sandbox/Dockerfile), the workspace outliving an
operator SIGKILL, the time limit killing a command's children, the memory limit's OOM kill inside the
pod, no ServiceAccount token and no access to the API server from inside, an image the node cannot run
refused at once. The operator runs as a local process against the real API server (as tests/integration
do), the model is the fake Messages API on 127.0.0.1; no chart is installed, so the file runs alone:

    KUBECONFIG=$HOME/.real-apiserver/admin.kubeconfig pytest --real-node tests/node/test_sandbox.py

The sandbox image is built and imported into the node once per session when the node lacks it
(scripts/sandbox-image.sh with the real-node recipe's image.sh; `make e2e-node` builds it anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, SlowResponse, text_block, tool_use_block
from tests.support.builders import agent, agentrun
from tests.support.clusters import ROOT, TestCluster, kubectl_sync
from tests.support.kube_requests import phase_in, wait_finished, wait_status
from tests.support.operator_process import OperatorProcess
from tests.support.rbac import grant_service_account
from tests.support.waiting import until

API_KEY = "sk-ant-sandbox-node-0123456789"
#: The project's sandbox image on the node (`make e2e-node` builds it: scripts/sandbox-image.sh).
SANDBOX_IMAGE = os.environ.get("AGENTRUN_E2E_SANDBOX_IMAGE", "localhost/agentrun-sandbox:dev")
REAL_NODE_TOOLS = Path(os.environ.get("AGENTRUN_E2E_REAL_NODE_TOOLS", ROOT.parent / "shared/tools/real-node"))
#: What a run's ServiceAccount needs for a sandbox (docs/sandbox.md): both verbs on pods/exec.
SANDBOX_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete"]},
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]},
]
RUNNER = "sandbox-runner"
#: With an Agent's warm pool the ServiceAccount also lists the pool and claims a pod (a patch).
POOL_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete", "list", "patch"]},
    SANDBOX_RULES[1],
]
EDITOR = "str_replace_based_edit_tool"
HOLD = 120.0  # the model "answers" only after the operator was killed
WAIT = 180.0  # a run on a loaded node: a pod start, a few commands


def bash(command: str, id: str) -> dict[str, Any]:
    return tool_use_block("bash", {"command": command}, id=id)


def edit(id: str, **given: Any) -> dict[str, Any]:
    return tool_use_block(EDITOR, given, id=id)


CALC = "def add(a, b):\n    return a - b\n"
TEST_CALC = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class AddTest(unittest.TestCase):\n"
    "    def test_adds(self):\n        self.assertEqual(add(2, 3), 5)\n\n\n"
    'if __name__ == "__main__":\n    unittest.main()\n'
)

FIX_A_TEST = "[sandbox:fix-a-test]"
CRASH = "[sandbox:crash]"
TIMEOUT = "[sandbox:timeout]"
LIMITS = "[sandbox:limits]"
ESCAPE = "[sandbox:escape]"
REFUSED = "[sandbox:refused]"
FIRST_COLD = "[sandbox:first-cold]"
FIRST_WARM = "[sandbox:first-warm]"
MOUNTS = "[sandbox:mounts]"
IDLE = "[sandbox:idle]"
BOMB = 2000  # background sleeps: with no pids limit on the node, bounded so the machine stays safe

SCRIPTS = [
    Script(
        FIX_A_TEST,
        [
            # Two calls at once: both wait for the one pod the first command starts.
            Reply(
                [
                    edit("toolu_e1", command="create", path="origin/calc.py", file_text=CALC),
                    edit("toolu_e2", command="create", path="origin/test_calc.py", file_text=TEST_CALC),
                ]
            ),
            Reply(
                [
                    bash(
                        "cd origin && git init -q && git add . && git commit -qm 'add, with a bug'",
                        "toolu_b1",
                    )
                ]
            ),
            Reply([bash("git clone -q origin work && cd work && python3 -m unittest -v", "toolu_b2")]),
            Reply(
                [
                    edit(
                        "toolu_e3",
                        command="str_replace",
                        path="work/calc.py",
                        old_str="return a - b",
                        new_str="return a + b",
                    )
                ]
            ),
            Reply([bash("cd work && python3 -m unittest -v && git diff --stat", "toolu_b3")]),
            Reply(
                [
                    bash(
                        "id -u; id -g; ls /var/run/secrets/kubernetes.io 2>&1; head -c 2 /proc/1/cmdline",
                        "toolu_b4",
                    )
                ]
            ),
            Reply([text_block("Fixed: add() subtracted; the test passes now.")]),
        ],
    ),
    Script(
        CRASH,
        [
            Reply([bash("echo 'written before the crash' >> note.txt; wc -l < note.txt", "toolu_c1")]),
            Reply([bash("cat note.txt", "toolu_c2")], faults=(SlowResponse(seconds=HOLD),)),
            Reply([text_block("The note survived.")]),
        ],
    ),
    Script(
        TIMEOUT,
        [
            Reply([bash("(sleep 60; touch late) & sleep 60", "toolu_t1")]),
            Reply([bash("ps -eo args; ls -a", "toolu_t2")]),
            Reply([text_block("It was killed.")]),
        ],
    ),
    Script(
        LIMITS,
        [
            Reply([bash("python3 -c 'x = []\nwhile True: x.append(b\"x\" * (16 << 20))'", "toolu_m1")]),
            Reply([bash("echo still serving", "toolu_m2")]),
            Reply(
                [
                    bash(
                        f"i=0; while [ $i -lt {BOMB} ]; do sleep 600 & i=$((i + 1)); done; echo $i; wait",
                        "toolu_m3",
                    )
                ]
            ),
            Reply(
                [
                    bash(
                        "echo still serving; ps -e --no-headers | wc -l; "
                        "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max",
                        "toolu_m4",
                    )
                ]
            ),
            Reply([text_block("The sandbox held.")]),
        ],
    ),
    *(
        Script(tag, [Reply([bash("echo ready", "toolu_f1")]), Reply([text_block("Ready.")])])
        for tag in (FIRST_COLD, FIRST_WARM)
    ),
    Script(
        IDLE,
        [
            Reply([edit("toolu_i1", command="create", path="notes.txt", file_text="kept?\n")]),
            Reply([bash("cat notes.txt", "toolu_i2")]),  # approved only once the idle pod is gone
            Reply([edit("toolu_i3", command="view", path="notes.txt")]),
            Reply([text_block("The workspace was new.")]),
        ],
    ),
    Script(
        REFUSED,
        [
            Reply([bash("make test", "toolu_r1")]),
            Reply([text_block("The sandbox did not start.")]),
        ],
    ),
]


# ------------------------------------------------------------------------------------------ the image


def _node_images(kubeconfig: Path) -> set[str]:
    nodes = json.loads(kubectl_sync(kubeconfig, "get", "nodes", "-o", "json"))["items"]
    return {
        name
        for node in nodes
        for image in node["status"].get("images", [])
        for name in image.get("names") or []
    }


@pytest.fixture(scope="module", autouse=True)
def sandbox_image(real_kubeconfig: Path | None) -> str:
    """The sandbox image on the node: built from images/sandbox/Dockerfile and imported when missing."""
    assert real_kubeconfig is not None
    if SANDBOX_IMAGE in _node_images(real_kubeconfig):
        return SANDBOX_IMAGE
    script = ROOT / "scripts" / "sandbox-image.sh"
    if not (REAL_NODE_TOOLS / "image.sh").is_file():
        raise pytest.UsageError(
            f"the node has no {SANDBOX_IMAGE} and there is no {REAL_NODE_TOOLS}/image.sh to build it with: "
            f"set AGENTRUN_E2E_REAL_NODE_TOOLS, or put the image on the node (`{script} TOOLS IMAGE`)"
        )
    built = subprocess.run(
        ["bash", str(script), str(REAL_NODE_TOOLS), SANDBOX_IMAGE],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert built.returncode == 0, (
        f"building {SANDBOX_IMAGE} failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
    )
    return SANDBOX_IMAGE


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(scripts=SCRIPTS, require_api_key=API_KEY)
    async with api.running() as server:
        yield server


OperatorFactory = Callable[[], Awaitable[OperatorProcess]]


@pytest.fixture
async def start_operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorFactory]:
    """Starts the operator as a local process serving the test's namespace; all of them stop at the end."""
    started: list[OperatorProcess] = []

    async def start() -> OperatorProcess:
        # Tests only: a run that sets idleTimeoutSeconds idles after 1 s (the others are unaffected).
        env = {
            "ANTHROPIC_API_KEY": API_KEY,
            "ANTHROPIC_BASE_URL": model.url,
            "AGENTRUN_FAULT_SANDBOX_IDLE_SECONDS": "1",
        }
        process = cluster.operator_process(tmp_path / f"operator-{len(started)}.log", env)
        await process.start()
        started.append(process)
        return process

    yield start
    for process in started:
        await process.stop()


@pytest.fixture
async def runner(cluster: TestCluster) -> str:
    """The runs' ServiceAccount, allowed what a sandbox needs in the test's namespace; its user name."""
    return await grant_service_account(
        cluster, RUNNER, SANDBOX_RULES, probe=cluster.path("pods", "none"), probe_answers=(404,)
    )


def sandbox_run(cluster: TestCluster, name: str, tag: str, **sandbox: Any) -> dict[str, Any]:
    return agentrun(
        name,
        f"{tag} do the work in the sandbox",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        serviceAccountName=RUNNER,
        limits={"maxIterations": 10, "timeoutSeconds": 600},
        sandbox={
            "image": SANDBOX_IMAGE,
            "imagePullPolicy": "Never",
            "resources": {
                "requests": {"cpu": "100m", "memory": "64Mi"},
                "limits": {"cpu": "500m", "memory": "128Mi"},
            },
            **sandbox,
        },
    )


def tool_results(model: FakeMessagesAPI, tag: str) -> dict[str, str]:
    """What the model was told of each tool call (tool_use id: the result's text), from its last request."""
    requests = [r for r in model.requests_for(tag) if isinstance(r.body, dict)]
    assert requests, f"no model request for {tag}"
    results: dict[str, str] = {}
    for message in requests[-1].body["messages"]:
        if message["role"] != "user" or isinstance(message["content"], str):
            continue
        for block in message["content"]:
            if block.get("type") != "tool_result":
                continue
            content = block.get("content", "")
            text = content if isinstance(content, str) else "".join(c.get("text", "") for c in content)
            results[block["tool_use_id"]] = ("[is_error] " if block.get("is_error") else "") + text
    return results


async def sandbox_pods(cluster: TestCluster, run_uid: str) -> list[dict[str, Any]]:
    found = await cluster.request(
        "GET", cluster.path("pods"), params={"labelSelector": f"agentrun.dev/run-uid={run_uid}"}
    )
    items: list[dict[str, Any]] = found["items"]
    return items


async def network_policies(cluster: TestCluster) -> list[str]:
    found = await cluster.request("GET", cluster.path("networkpolicies", api="/apis/networking.k8s.io/v1"))
    return [p["metadata"]["name"] for p in found["items"]]


@contextlib.asynccontextmanager
async def pods_seen(cluster: TestCluster, run_uid: str) -> AsyncIterator[dict[str, dict[str, Any]]]:
    """Every sandbox pod of the run seen while the block runs, by uid: its first state Running (or the
    last state seen, for one never Running)."""
    seen: dict[str, dict[str, Any]] = {}

    async def watch() -> None:
        while True:
            for pod in await sandbox_pods(cluster, run_uid):
                known = seen.get(pod["metadata"]["uid"])
                if known is None or known["status"].get("phase") != "Running":
                    seen[pod["metadata"]["uid"]] = pod
            await asyncio.sleep(0.2)

    task = asyncio.create_task(watch())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def assert_sandbox_gone(cluster: TestCluster, run_uid: str) -> None:
    """The run ended: its pod and its NetworkPolicy go."""

    async def gone() -> bool:
        return not await sandbox_pods(cluster, run_uid) and not await network_policies(cluster)

    await until(gone, "the sandbox pod and its NetworkPolicy deleted with the end of the run", timeout=90)


async def create_run(cluster: TestCluster, manifest: dict[str, Any]) -> str:
    created = await cluster.request("POST", cluster.runs_path, json=manifest)
    uid: str = created["metadata"]["uid"]
    return uid


def arrival(model: FakeMessagesAPI, tag: str, step: int) -> float:
    return next(r.arrived_at for r in model.requests_for(tag) if r.step == step)


# ------------------------------------------------------------------------------------------ scenarios


async def test_a_run_clones_a_repository_fixes_its_failing_test_and_leaves_no_pod_behind(
    cluster: TestCluster, model: FakeMessagesAPI, start_operator: OperatorFactory, runner: str
) -> None:
    operator = await start_operator()
    uid = await create_run(cluster, sandbox_run(cluster, "fix", FIX_A_TEST))
    async with pods_seen(cluster, uid) as pods:
        run = await wait_finished(cluster, "fix", timeout=WAIT)
    status = run["status"]
    assert (status["phase"], status["stopReason"]) == ("Succeeded", "EndTurn"), status.get("message")
    assert status["result"] == "Fixed: add() subtracted; the test passes now."

    told = tool_results(model, FIX_A_TEST)
    assert told["toolu_e1"] == "Created /workspace/origin/calc.py (32 bytes)."
    assert told["toolu_e2"].startswith("Created /workspace/origin/test_calc.py")
    assert told["toolu_b1"] == "(no output)"
    assert "FAIL: test_adds" in told["toolu_b2"] and "AssertionError: -1 != 5" in told["toolu_b2"]
    assert told["toolu_b2"].endswith("[exit code 1]")
    assert told["toolu_e3"] == "Replaced one occurrence in /workspace/work/calc.py at line 2."
    assert "test_adds (test_calc.AddTest" in told["toolu_b3"] and "\nOK\n" in told["toolu_b3"]
    assert " calc.py | 2 +-" in told["toolu_b3"] and "[exit code" not in told["toolu_b3"]
    # Inside: the sandbox user, no ServiceAccount token; PID 1 is the operator's shell, not the image's.
    assert told["toolu_b4"].startswith(
        "65532\n65532\nls: cannot access '/var/run/secrets/kubernetes.io': No such file or directory\nsh"
    )

    [pod] = pods.values()
    assert (
        pod["spec"]["serviceAccountName"] == RUNNER and pod["spec"]["automountServiceAccountToken"] is False
    )
    assert pod["spec"]["nodeName"] and pod["status"]["phase"] == "Running"
    assert all("serviceaccount" not in m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"])
    await assert_sandbox_gone(cluster, uid)

    # The first tool turn waited for the pod to start; the next one found it running.
    first_turn = arrival(model, FIX_A_TEST, 1) - arrival(model, FIX_A_TEST, 0)
    warm_turn = arrival(model, FIX_A_TEST, 2) - arrival(model, FIX_A_TEST, 1)
    started = next(
        line
        for line in (await operator.scrape()).splitlines()
        if line.startswith("agentrun_sandbox_start_seconds_sum")
    )
    print(
        f"\nsandbox first-command latency: {first_turn:.2f} s for the first tool turn (pod start and two "
        f"editor calls), {warm_turn:.2f} s for the next (a git commit in the running pod); {started}"
    )


async def test_the_workspace_and_the_pod_survive_an_operator_sigkill(
    cluster: TestCluster, model: FakeMessagesAPI, start_operator: OperatorFactory, runner: str
) -> None:
    operator = await start_operator()
    uid = await create_run(cluster, sandbox_run(cluster, "crash", CRASH))
    async with pods_seen(cluster, uid) as pods:
        # The first command ran and the model's next answer is pending: the operator dies there.
        await until(
            lambda: any(r.step == 1 for r in model.requests_for(CRASH)), "the second model request", WAIT
        )
        before = set(pods)
        await operator.stop(kill=True)
        await start_operator()
        run = await wait_finished(cluster, "crash", timeout=WAIT)
    status = run["status"]
    assert (status["phase"], status["stopReason"]) == ("Succeeded", "EndTurn"), status.get("message")
    told = tool_results(model, CRASH)
    assert told["toolu_c1"].startswith("1\n")  # once, even if the resumed run asked for it again
    assert told["toolu_c2"] == "written before the crash\n"
    assert len(before) == 1 and set(pods) == before, "the resumed run used another pod"
    await assert_sandbox_gone(cluster, uid)


async def test_a_command_past_its_time_limit_is_killed_with_its_children(
    cluster: TestCluster, model: FakeMessagesAPI, start_operator: OperatorFactory, runner: str
) -> None:
    await start_operator()
    await create_run(cluster, sandbox_run(cluster, "slow", TIMEOUT, commandTimeoutSeconds=3))
    run = await wait_finished(cluster, "slow", timeout=WAIT)
    assert run["status"]["phase"] == "Succeeded", run["status"].get("message")
    told = tool_results(model, TIMEOUT)
    assert told["toolu_t1"].startswith("[is_error] ")
    assert "[killed after 3 s, the command's time limit, with every process it started]" in told["toolu_t1"]
    assert arrival(model, TIMEOUT, 1) - arrival(model, TIMEOUT, 0) < 30, "the command ran to its end"
    processes = told["toolu_t2"].splitlines()
    assert [p for p in processes if p.startswith("sleep 60") or "touch late" in p] == [], processes
    assert "late" not in processes


async def test_a_memory_hog_and_a_fork_bomb_stay_inside_the_pods_limits(
    cluster: TestCluster, model: FakeMessagesAPI, start_operator: OperatorFactory, runner: str
) -> None:
    await start_operator()
    uid = await create_run(cluster, sandbox_run(cluster, "limits", LIMITS, commandTimeoutSeconds=20))
    async with pods_seen(cluster, uid) as pods:
        run = await wait_finished(cluster, "limits", timeout=WAIT)
    assert run["status"]["phase"] == "Succeeded", run["status"].get("message")
    told = tool_results(model, LIMITS)
    # The kernel's own count of OOM kills in the container says it was the memory limit, not a guess.
    assert re.search(
        r"\[exit code 137: the kernel's OOM killer killed [1-9][0-9]* process\(es\) of the sandbox while "
        r"this command ran: the sandbox's memory limit is 128Mi\]$",
        told["toolu_m1"],
    ), told["toolu_m1"]
    assert told["toolu_m2"] == "still serving\n"
    # Killed by the kernel when the bomb outgrew the memory limit, or at the time limit while spawning.
    bomb = told["toolu_m3"]
    assert "OOM killer killed" in bomb or "[killed after 20 s" in bomb, bomb
    print(f"\nthe memory hog: {told['toolu_m1']!r}\nthe fork bomb: {told['toolu_m3']!r}")
    print(f"after them: {told['toolu_m4']!r}")
    serving, count, pids_max = told["toolu_m4"].splitlines()
    print(f"the pod's pids limit (pids.max): {pids_max}")
    # What the bomb started went with it: PID 1, its sleep, this command's shells and ps remain.
    assert serving == "still serving" and int(count) < 20, told["toolu_m4"]
    [pod] = pods.values()  # one pod for the whole run: never lost, never replaced
    node = await cluster.request("GET", f"/api/v1/nodes/{pod['spec']['nodeName']}")
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True", node["status"]["conditions"]


async def test_the_sandbox_cannot_read_a_secret_or_act_on_the_api_server(
    cluster: TestCluster, model: FakeMessagesAPI, start_operator: OperatorFactory, runner: str
) -> None:
    secret_value = "the-database-password-0123456789"
    await cluster.request(
        "POST",
        cluster.path("secrets"),
        json={"metadata": {"name": "db"}, "stringData": {"password": secret_value}},
    )
    # The API server as the node's pods reach it: the kubernetes Service's address (10.0.0.1:443, in
    # the pod's environment) and the host's bridge.
    ns = cluster.namespace
    probe = (
        "import os, ssl, urllib.request, urllib.error\n"
        "context = ssl._create_unverified_context()\n"
        "host = os.environ.get('KUBERNETES_SERVICE_HOST', '10.0.0.1')\n"
        "port = os.environ.get('KUBERNETES_SERVICE_PORT', '443')\n"
        f"for base in (f'https://{{host}}:{{port}}', 'https://10.88.0.1:6443'):\n"
        f"    for path in ('/api/v1/namespaces/{ns}/secrets/db', '/api/v1/namespaces/{ns}/pods'):\n"
        "        try:\n"
        "            with urllib.request.urlopen(base + path, context=context, timeout=5) as r:\n"
        "                print(base, path, r.status, r.read()[:300])\n"
        "        except urllib.error.HTTPError as e:\n"
        "            print(base, path, e.code, e.read()[:300])\n"
        "        except OSError as e:\n"
        "            print(base, path, 'unreachable', e)\n"
    )
    model.add_script(
        Script(
            ESCAPE,
            [
                Reply([bash("ls -la /var/run/secrets/kubernetes.io 2>&1; env | sort", "toolu_x1")]),
                Reply([bash(f"python3 -c {shlex.quote(probe)}", "toolu_x2")]),
                Reply([text_block("Nothing to read.")]),
            ],
        )
    )

    await start_operator()
    await create_run(cluster, sandbox_run(cluster, "escape", ESCAPE))
    run = await wait_finished(cluster, "escape", timeout=WAIT)
    assert run["status"]["phase"] == "Succeeded", run["status"].get("message")
    told = tool_results(model, ESCAPE)
    assert "ls: cannot access '/var/run/secrets/kubernetes.io': No such file or directory" in told["toolu_x1"]
    variables = [line.partition("=")[0] for line in told["toolu_x1"].splitlines() if "=" in line]
    assert "HOME" in variables and [v for v in variables if "TOKEN" in v.upper()] == [], variables
    answers = told["toolu_x2"].splitlines()
    print("\nfrom inside the sandbox:\n" + "\n".join(answers))
    assert secret_value not in told["toolu_x2"]
    # The kubernetes Service answers, as to anyone: system:anonymous may read nothing. (The API server
    # listens on the host's loopback only, so the bridge's 10.88.0.1:6443 refuses the connection.)
    service = [line for line in answers if line.startswith("https://10.0.0.1:443")]
    assert len(service) == 2 and all(line.split()[2] == "403" for line in service), answers
    assert all("system:anonymous" in line for line in service), answers
    assert not [line for line in answers if line.split()[2] == "200"], answers


async def test_a_config_map_and_a_secret_the_sandbox_mounts_are_readable_by_its_user_and_read_only(
    cluster: TestCluster, model: FakeMessagesAPI, start_operator: OperatorFactory, runner: str
) -> None:
    token = "ghp-the-kubelet-mounts-it-0123456789"
    await cluster.request(
        "POST",
        cluster.path("configmaps"),
        json={"metadata": {"name": "lint"}, "data": {"rules.toml": "width = 110\n"}},
    )
    await cluster.request(
        "POST", cluster.path("secrets"), json={"metadata": {"name": "git"}, "stringData": {"token": token}}
    )
    model.add_script(
        Script(
            MOUNTS,
            [
                Reply(
                    [
                        bash(
                            "id -u; cat /etc/lint/rules.toml /var/run/git/token; echo; "
                            "stat -L -c '%a %u %g %n' /etc/lint/rules.toml /var/run/git/token",
                            "toolu_v1",
                        )
                    ]
                ),
                Reply([bash("echo 'width = 80' > /etc/lint/rules.toml", "toolu_v2")]),
                Reply([text_block("Read both; the rules are read-only.")]),
            ],
        )
    )
    volumes = [
        {"name": "lint", "mountPath": "/etc/lint", "configMap": {"name": "lint"}},
        {"name": "git", "mountPath": "/var/run/git", "secret": {"secretName": "git"}},
    ]
    await start_operator()
    uid = await create_run(cluster, sandbox_run(cluster, "mounts", MOUNTS, volumes=volumes))
    run = await wait_finished(cluster, "mounts", timeout=WAIT)
    assert run["status"]["phase"] == "Succeeded", run["status"].get("message")
    told = tool_results(model, MOUNTS)
    # Root owns the files and the pod's fsGroup (the sandbox user's group) is their group: the Secret
    # is readable by the sandbox user only (0440), the ConfigMap by all (0444).
    assert told["toolu_v1"] == (
        f"65532\nwidth = 110\n{token}\n444 0 65532 /etc/lint/rules.toml\n440 0 65532 /var/run/git/token\n"
    ), told["toolu_v1"]
    assert told["toolu_v2"].startswith("[is_error] ") or "[exit code" in told["toolu_v2"], told["toolu_v2"]
    assert "Read-only file system" in told["toolu_v2"], told["toolu_v2"]
    await assert_sandbox_gone(cluster, uid)


async def test_a_run_whose_account_may_not_create_pods_or_whose_image_cannot_run_fails_at_once(
    cluster: TestCluster, model: FakeMessagesAPI, start_operator: OperatorFactory, runner: str
) -> None:
    no_create = await grant_service_account(
        cluster,
        "no-create",
        [SANDBOX_RULES[1], {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"]}],
        probe=cluster.path("pods", "none"),
        probe_answers=(404,),
    )
    await start_operator()
    refused = sandbox_run(cluster, "refused", REFUSED)
    refused["spec"]["serviceAccountName"] = "no-create"
    missing = sandbox_run(cluster, "missing", REFUSED, image="localhost/agentrun-sandbox:no-such-tag")
    began = time.monotonic()
    await create_run(cluster, refused)
    missing_uid = await create_run(cluster, missing)

    run = await wait_finished(cluster, "refused", timeout=WAIT)
    status = run["status"]
    assert (status["phase"], status["stopReason"]) == ("Failed", "FatalToolError"), status.get("message")
    assert f"{no_create} may not create the sandbox pod" in status["message"]
    assert "needs create, get and delete on pods; get and create on pods/exec" in status["message"]

    run = await wait_finished(cluster, "missing", timeout=WAIT)
    took = time.monotonic() - began
    status = run["status"]
    assert (status["phase"], status["stopReason"]) == ("Failed", "FatalToolError"), status.get("message")
    assert "cannot start: ErrImageNeverPull" in status["message"], status["message"]
    assert took < 120, f"ended after {took:.0f} s: the start timeout (300 s), not the kubelet's refusal"
    print(f"\nan image the node cannot run: the run failed {took:.1f} s after it was created")
    await assert_sandbox_gone(cluster, missing_uid)


async def test_a_run_of_an_agent_with_a_warm_pool_claims_a_running_pod_and_starts_sooner(
    cluster: TestCluster, model: FakeMessagesAPI, start_operator: OperatorFactory
) -> None:
    """First-command latency with and without the pool, on the real node (docs/sandbox.md, Fast start)."""
    await grant_service_account(
        cluster, "pool-runner", POOL_RULES, probe=cluster.path("pods", "none"), probe_answers=(404,)
    )
    sandbox = sandbox_run(cluster, "unused", FIRST_COLD)["spec"]["sandbox"]
    agents = cluster.path("agents", api="/apis/agentrun.dev/v1alpha1")
    defined: dict[str, Any] = {
        "model": {"name": "claude-haiku-4-5"},
        "serviceAccountName": "pool-runner",
        "limits": {"maxIterations": 10, "timeoutSeconds": 600},
    }
    await start_operator()
    for name, size in (("cold", 0), ("warm", 1)):
        manifest = agent(name, namespace=cluster.namespace, **defined, sandbox={**sandbox, "warmPool": size})
        created = await cluster.request("POST", agents, json=manifest)
        if size:
            warm_agent_uid = created["metadata"]["uid"]

    async def pool() -> list[dict[str, Any]]:
        found = await cluster.request(
            "GET",
            cluster.path("pods"),
            params={"labelSelector": f"agentrun.dev/sandbox-pool-agent={warm_agent_uid}"},
        )
        return [
            pod
            for pod in found["items"]
            if pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")
        ]

    [ready] = await until(pool, "a warm pod running", WAIT)
    assert ready["spec"]["serviceAccountName"] == "pool-runner"

    async def pool_status() -> dict[str, Any]:
        return dict((await cluster.request("GET", f"{agents}/warm")).get("status", {}).get("warmPool") or {})

    # The Agent says its pool is ready (the next refill after the pod runs writes it).
    assert await until(pool_status, "status.warmPool ready", WAIT, done=lambda s: s.get("ready") == 1) == {
        "size": 1,
        "ready": 1,
    }
    assert [o["kind"] for o in ready["metadata"]["ownerReferences"]] == ["Agent"]

    latency: dict[str, float] = {}
    claimed: dict[str, dict[str, Any]] = {}
    for name, tag in (("cold", FIRST_COLD), ("warm", FIRST_WARM)):
        run = agentrun(
            f"{name}-run", f"{tag} do the work", namespace=cluster.namespace, agentRef={"name": name}
        )
        uid = await create_run(cluster, run)
        async with pods_seen(cluster, uid) as pods:
            finished = await wait_finished(cluster, f"{name}-run", timeout=WAIT)
        assert finished["status"]["phase"] == "Succeeded", finished["status"].get("message")
        assert tool_results(model, tag)["toolu_f1"] == "ready\n"
        latency[name] = arrival(model, tag, 1) - arrival(model, tag, 0)
        [claimed[name]] = pods.values()
        await until(partial(sandbox_pods, cluster, uid), "the run's pod deleted", 90, done=_empty)
    print(
        f"\nsandbox first-command latency (the first tool turn, one `echo`): {latency['cold']:.2f} s "
        f"starting a pod, {latency['warm']:.2f} s with a warm pool pod"
    )
    # The warm run used the pod the pool had running; the cold one started its own.
    assert claimed["warm"]["metadata"]["uid"] == ready["metadata"]["uid"]
    assert claimed["cold"]["metadata"]["name"].startswith("cold-run-sandbox-")
    assert latency["warm"] < latency["cold"], latency

    # The pool is refilled with a new pod, which goes with the Agent.
    def refilled(pods: list[dict[str, Any]]) -> bool:
        return len(pods) == 1 and pods[0]["metadata"]["uid"] != ready["metadata"]["uid"]

    [refill] = await until(pool, "the pool refilled", WAIT, done=refilled)
    assert refill["metadata"]["uid"] != ready["metadata"]["uid"]
    await cluster.request("DELETE", f"{agents}/warm")
    await until(pool, "the pool's pods deleted with the Agent", 90, done=_empty)


def _empty(pods: list[dict[str, Any]]) -> bool:
    return pods == []


async def test_an_idle_sandbox_pod_is_deleted_and_the_next_call_gets_a_new_one_on_the_node(
    cluster: TestCluster, model: FakeMessagesAPI, start_operator: OperatorFactory, runner: str
) -> None:
    await start_operator()
    run = sandbox_run(cluster, "idle", IDLE, idleTimeoutSeconds=30, requiresApproval=["bash"])
    uid = await create_run(cluster, run)
    async with pods_seen(cluster, uid) as pods:
        await wait_status(cluster, "idle", phase_in("AwaitingApproval"), timeout=WAIT)
        await until(partial(sandbox_pods, cluster, uid), "the idle pod deleted", WAIT, done=_empty)
        decision = {"toolUseId": "toolu_i2", "decision": "approve", "by": await cluster.whoami()}
        await cluster.request(
            "PATCH",
            f"{cluster.runs_path}/idle",
            data=json.dumps({"spec": {"approvals": [decision]}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        finished = await wait_finished(cluster, "idle", timeout=WAIT)
    assert finished["status"]["phase"] == "Succeeded", finished["status"].get("message")
    told = tool_results(model, IDLE)
    assert "deleted after 1 s without a sandbox call" in told["toolu_i2"], told["toolu_i2"]
    assert "This command was not run." in told["toolu_i2"], told["toolu_i2"]
    # The editor then ran in the new pod, on the node: the file of the first one is not there.
    assert told["toolu_i3"].startswith("[is_error] "), told["toolu_i3"]
    assert "notes.txt" in told["toolu_i3"], told["toolu_i3"]
    # Two pods ran on the node, one after the other, under the run's one pod name.
    assert len(pods) == 2, pods
    assert len({pod["metadata"]["name"] for pod in pods.values()}) == 1
    await until(partial(sandbox_pods, cluster, uid), "the run's pod deleted", 90, done=_empty)
