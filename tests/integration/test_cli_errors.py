"""A cluster that cannot be used is one line on stderr and a non-zero exit, never a traceback.

`agentrun operator`, `agentrun-sandbox demo --kubeconfig`, `agentrun run` and `kubectl agentrun` each say what
failed, what the server said and what to do next, for a refused request (401, 403, 422),
an unreachable server and an unusable kubeconfig (missing file, unknown context). A missing CRD is
one warning line: the operator waits for it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import pytest
import yaml

from agentrun_sandbox.kube import EmulatedCluster
from tests.support.builders import agentrun
from tests.support.clusters import CRD, ROOT, TestCluster
from tests.support.commands import run_command
from tests.support.kube_requests import until
from tests.support.kubeconfigs import write_kubeconfig
from tests.support.operator_process import OperatorProcess
from tests.support.ports import free_port

BIN = Path(sys.executable).parent
#: Every kind the repository ships: `agentrun crd --all` must install each one.
SHIPPED_CRDS = sorted((Path(__file__).resolve().parents[2] / "crds").glob("*.agentrun.dev.yaml"))
CRD_NAME = "agentruns.agentrun.dev"


async def _run(
    *command: str | Path, env: dict[str, str] | None = None, timeout: float = 60
) -> tuple[int, str]:
    """Exit code and stderr; stdout must stay empty when a command fails."""
    code, out, err = await run_command(*command, env=env, timeout=timeout)
    assert "Traceback" not in out + err, err
    assert out == "", out
    return code, err


def _one_line(code: int, err: str) -> str:
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0].removeprefix("error: ")


def _operator(*args: str) -> list[str | Path]:
    ports = ("--metrics-port", str(free_port()), "--health-port", str(free_port()))
    return [BIN / "agentrun", "operator", "--bind-address", "127.0.0.1", *ports, *args]


@pytest.fixture
def closed_port_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig whose server refuses connections."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return write_kubeconfig(tmp_path / "kubeconfig", server=f"http://127.0.0.1:{port}", user={"token": "t"})


# --- agentrun-sandbox demo --kubeconfig (the demo ships with the emulators, not with the operator)


async def test_agentrun_demo_says_in_one_line_that_the_demo_moved_out_of_the_operator() -> None:
    code, out, err = await run_command(BIN / "agentrun", "demo", "--kubeconfig", "x", timeout=60)
    assert code == 2, err
    assert out == ""
    assert err.strip().splitlines() == [
        "error: the offline demo is not part of the operator: run `make demo` in a clone of the "
        "repository (or `agentrun-sandbox demo` where agentrun-sandbox is installed)"
    ]


@pytest.mark.emulator_only("makes the API server refuse the CRD with an injected 422")
async def test_demo_says_in_one_line_that_the_server_refused_the_crd(cluster: TestCluster) -> None:
    assert cluster.emulator is not None
    refusal = (
        f'CustomResourceDefinition.apiextensions.k8s.io "{CRD_NAME}" is invalid: spec.versions[0]: Forbidden'
    )
    cluster.emulator.faults.add(
        verb="create", resource="apiextensions.k8s.io/customresourcedefinitions", status=422, message=refusal
    )
    code, err = await _run(
        BIN / "agentrun-sandbox", "demo", "--kubeconfig", cluster.kubeconfig, "--timeout", "20"
    )
    assert _one_line(code, err) == (
        f"cannot create CustomResourceDefinition {CRD_NAME}: the API server refused it "
        f"(HTTP 422: {refusal}); agentrun needs Kubernetes 1.33 or later (see `kubectl version`), "
        "or an admission policy refuses the CRD"
    )


async def test_demo_says_in_one_line_that_the_server_is_unreachable(closed_port_kubeconfig: Path) -> None:
    code, err = await _run(BIN / "agentrun-sandbox", "demo", "--kubeconfig", closed_port_kubeconfig)
    line = _one_line(code, err)
    assert line.startswith(
        f"cannot create CustomResourceDefinition {CRD_NAME}: cannot reach the Kubernetes API at "
    )
    assert "(Connection refused); check that the cluster is running" in line
    assert str(closed_port_kubeconfig) in line


@pytest.mark.parametrize("problem", ["missing kubeconfig", "unknown current context"])
async def test_demo_says_in_one_line_what_is_wrong_with_the_kubeconfig(problem: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    expected = f"kubeconfig {kubeconfig} does not exist"
    if problem == "unknown current context":
        write_kubeconfig(kubeconfig, server="http://127.0.0.1:1", name="prod")
        text = kubeconfig.read_text().replace("current-context: prod", "current-context: staging")
        kubeconfig.write_text(text)
        expected = f"context 'staging' is not in kubeconfig {kubeconfig} (its contexts: prod)"
    code, err = await _run(BIN / "agentrun-sandbox", "demo", "--kubeconfig", kubeconfig)
    assert _one_line(code, err) == expected


# --- agentrun operator


async def test_operator_with_a_missing_kubeconfig_says_so_and_exits(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    code, err = await _run(*_operator(), env={"KUBECONFIG": str(missing)})
    assert _one_line(code, err) == (
        f"KUBECONFIG names {missing}, and no such file exists; point it at a kubeconfig file"
    )


async def test_operator_with_an_unreachable_server_says_so_at_once(closed_port_kubeconfig: Path) -> None:
    code, err = await _run(*_operator(), env={"KUBECONFIG": str(closed_port_kubeconfig)})
    line = _one_line(code, err)
    assert line.startswith(
        "cannot list agentruns in all namespaces: cannot reach the Kubernetes API at http://"
    )
    assert line.endswith(
        f"check that the cluster is running and that kubeconfig {closed_port_kubeconfig} "
        "(context test) points at it"
    )


@pytest.mark.emulator_only("the emulator does not authenticate: the 401 is injected")
async def test_operator_whose_credentials_are_refused_says_to_renew_them(cluster: TestCluster) -> None:
    assert cluster.emulator is not None
    cluster.emulator.faults.add(status=401, message="Unauthorized", times=None)
    code, err = await _run(*_operator(), env={"KUBECONFIG": str(cluster.kubeconfig)})
    assert _one_line(code, err) == (
        f"cannot list agentruns in all namespaces: the API server at {cluster.url} did not accept the "
        f"credentials of kubeconfig {cluster.kubeconfig} (context kube-emulator) (HTTP 401: Unauthorized); "
        "log in again or renew the token, then retry"
    )


@pytest.mark.emulator_only("the 403 is injected for the default (unrestricted) identity")
async def test_operator_without_rbac_for_its_namespace_names_the_missing_permission(
    cluster: TestCluster,
) -> None:
    assert cluster.emulator is not None
    said = (
        'agentruns.agentrun.dev is forbidden: User "bot" cannot list resource "agentruns" in the namespace '
        '"team-a"'
    )
    cluster.emulator.faults.add(verb="list", resource="agentruns", status=403, message=said, times=None)
    code, err = await _run(*_operator("--namespace", "team-a"), env={"KUBECONFIG": str(cluster.kubeconfig)})
    assert _one_line(code, err) == (
        f"cannot list agentruns in namespace team-a: forbidden (HTTP 403: {said}); grant this identity the "
        "RBAC permission the message names, or use another context"
    )


async def test_operator_without_the_crd_says_how_to_install_it_and_serves_runs_once_it_appears(
    tmp_path: Path,
) -> None:
    """No crash loop: the CRD often arrives after the operator (a GitOps sync applying both at once)."""
    async with EmulatedCluster.running() as bare:  # a cluster without the AgentRun CRD
        operator = OperatorProcess(kubeconfig=Path(bare.kubeconfig_path), log_path=tmp_path / "operator.log")
        await operator.start()
        try:
            assert (
                "cannot list agentruns in all namespaces: the AgentRun CRD is not installed; install the "
                "CRDs with `agentrun crd --all | kubectl apply -f -`; waiting for it"
            ) in operator.logs()
            # The advice, followed literally: it must install every CRD, not the AgentRun one alone.
            advice = "agentrun crd --all | kubectl apply -f -"
            env = {"KUBECONFIG": bare.kubeconfig_path, "PATH": f"{BIN}:{os.environ['PATH']}"}
            proc = await asyncio.create_subprocess_shell(
                advice,
                env=env,
                cwd=tmp_path,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, out.decode()
            created = out.decode().count("customresourcedefinition.apiextensions.k8s.io/")
            assert created == len(SHIPPED_CRDS), out.decode()
            bare.emulator.create_object("agentruns", agentrun("after-crd", "hello"))

            async def served() -> bool:
                run = bare.emulator.get_object("agentruns", "default", "after-crd") or {}
                return bool((run.get("status") or {}).get("phase"))

            try:
                await until(served, "the operator to serve a run created after the CRD", timeout=90)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; operator log:\n{operator.logs()}") from None
            assert operator.process is not None and operator.process.returncode is None
        finally:
            await operator.stop()
    assert "Traceback" not in operator.logs()
    # Every CRD came with the advice: neither Kopf nor the operator misses one.
    assert "Unresolved resources cannot be served" not in operator.logs()
    assert operator.logs().count("not installed") == 1, operator.logs()


async def test_operator_with_only_the_agentrun_crd_names_the_missing_ones_and_the_command_for_all(
    tmp_path: Path,
) -> None:
    async with EmulatedCluster.running() as bare:
        bare.emulator.load_crd(CRD)
        operator = OperatorProcess(kubeconfig=Path(bare.kubeconfig_path), log_path=tmp_path / "operator.log")
        await operator.start()
        await operator.stop()
    assert (
        "the AgentRunQuota, Agent, AgentSchedule, SandboxTemplate CRDs are not installed (runs are not "
        "limited by quotas; runs with spec.agentRef wait for their Agent; no schedule creates runs; runs "
        "with spec.sandbox.templateRef wait for their template); install the CRDs with "
        "`agentrun crd --all | kubectl apply -f -`"
    ) in operator.logs()


# --- kubectl agentrun


async def test_plugin_with_an_unreachable_server_says_which_command_failed(
    closed_port_kubeconfig: Path,
) -> None:
    code, err = await _run(BIN / "kubectl-agentrun", "--kubeconfig", closed_port_kubeconfig, "cancel", "web")
    line = _one_line(code, err)
    assert line.startswith("cannot cancel agentrun default/web: cannot reach the Kubernetes API at http://")


async def test_plugin_with_an_unknown_context_lists_the_known_ones(closed_port_kubeconfig: Path) -> None:
    code, err = await _run(
        BIN / "kubectl-agentrun", "--kubeconfig", closed_port_kubeconfig, "--context", "prod", "trace", "web"
    )
    assert (
        _one_line(code, err)
        == f"context 'prod' is not in kubeconfig {closed_port_kubeconfig} (its contexts: test)"
    )


@pytest.mark.parametrize(
    ("command", "action"),
    [
        (("transcript", "web"), "access agentrun default/web"),
        (("cancel", "web"), "access agentrun default/web"),
        (("tree", "web"), "access agentrun default/web"),
    ],
)
async def test_plugin_without_the_agentrun_crd_says_the_crd_is_not_installed_not_that_the_run_is_missing(
    command: tuple[str, ...], action: str
) -> None:
    async with EmulatedCluster.running() as bare:  # a cluster without any agentrun.dev CRD
        code, err = await _run(BIN / "kubectl-agentrun", "--kubeconfig", bare.kubeconfig_path, *command)
    assert _one_line(code, err) == (
        f"cannot {action}: the AgentRun CRD (agentruns.agentrun.dev) is not installed; install the CRDs "
        "with `agentrun crd --all | kubectl apply -f -`"
    )


async def test_crd_all_prints_every_crd_the_operator_serves_as_one_stream() -> None:
    """The stream the missing-CRD advice pipes into `kubectl apply`: every kind, as crds/ holds them."""
    code, out, err = await run_command(BIN / "agentrun", "crd", "--all", timeout=60)
    assert code == 0, err
    documents = [doc for doc in yaml.safe_load_all(out) if doc]
    on_disk = [yaml.safe_load(path.read_text()) for path in sorted((ROOT / "crds").glob("*.yaml"))]
    assert sorted(d["metadata"]["name"] for d in documents) == sorted(d["metadata"]["name"] for d in on_disk)
    assert {d["metadata"]["name"]: d for d in documents} == {d["metadata"]["name"]: d for d in on_disk}


@pytest.mark.emulator_only("the 403 is injected for the default (unrestricted) identity")
async def test_plugin_refused_by_rbac_names_the_missing_permission(cluster: TestCluster) -> None:
    assert cluster.emulator is not None
    said = 'agentruns.agentrun.dev "web" is forbidden: User "dev" cannot get resource "agentruns"'
    cluster.emulator.faults.add(verb="get", resource="agentruns", status=403, message=said, times=None)
    code, err = await _run(BIN / "kubectl-agentrun", "--kubeconfig", cluster.kubeconfig, "trace", "web")
    assert _one_line(code, err) == (
        f"cannot access agentrun default/web: forbidden (HTTP 403: {said}); grant this identity the RBAC "
        "permission the message names, or use another context"
    )


# --- agentrun run


async def test_local_run_needing_an_unreachable_cluster_says_so(
    closed_port_kubeconfig: Path, tmp_path: Path
) -> None:
    manifest = tmp_path / "run.yaml"
    manifest.write_text(
        "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: hooks}\nspec:\n"
        "  task: t\n  model: {name: claude-haiku-4-5}\n  tools:\n"
        "  - http: {name: n, description: d, url: 'http://127.0.0.1:9/', headersFrom: {name: hook-headers}}\n"
    )
    code, err = await _run(
        BIN / "agentrun",
        "run",
        manifest,
        env={"KUBECONFIG": str(closed_port_kubeconfig), "ANTHROPIC_API_KEY": "k"},
    )
    line = _one_line(code, err)
    assert line.startswith(
        f"{manifest}: cannot read the Secrets of spec.tools[0].http.headersFrom: "
        "cannot reach the Kubernetes API"
    ), line
