"""`agentrun run FILE`: one AgentRun manifest, run here, no cluster.

It goes through the operator's own phases (controller/agentruns/phases.py): the Agent (an Agent
document in the same file, for a run with spec.agentRef), validate, open tools, loop,
and the finish phase's status, printed instead of written. Resume and the queue have no meaning
here; Secrets are looked for once, in the cluster KUBECONFIG points at, and a missing one is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pydantic
import yaml

from agentrun.agents import AgentSpecConflict, resolve
from agentrun.api import AGENT_KIND, API_VERSION, KIND, status_patches
from agentrun.api.agent import AgentSpec
from agentrun.api.sandbox_spec import resolve_sandbox
from agentrun.api.spec import AgentRunSpec, ResolvedRunSpec
from agentrun.api.status import AgentRunStatus
from agentrun.api.status_patches import StatusPatch
from agentrun.api.stops import Outcome, StopReason
from agentrun.api.times import now_rfc3339
from agentrun.controller.agentruns import phases
from agentrun.controller.agentruns.observers import Fanout
from agentrun.controller.agentruns.phases import Ending
from agentrun.controller.agentruns.tool_environment import RunToolEnvironment
from agentrun.kube import kubeconfig_loading
from agentrun.kube.calling import KubeClient, connect
from agentrun.kube.failures import KubeFailure, explained
from agentrun.kube.kubeconfig_loading import ClusterAccess
from agentrun.loop.clocks import SystemClock
from agentrun.loop.events import (
    ContextCompacted,
    Event,
    ModelRequestFinished,
    ModelRetryScheduled,
    RunFinished,
    ToolCallFinished,
)
from agentrun.loop.protocols import Tool
from agentrun.model.access import ModelAccess, project_of, region_of
from agentrun.model.anthropic_calling import ClientPool
from agentrun.model.pricing import PriceTable
from agentrun.settings import Settings, describe_settings_error
from agentrun.tools.builtin.kubernetes import KUBERNETES_TOOLS
from agentrun.tools.registry import secret_uses

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


class ManifestError(Exception):
    pass


def load_manifest(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The AgentRun document, and the file's Agents by name (for a run with spec.agentRef)."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    except (OSError, yaml.YAMLError) as exc:
        raise ManifestError(f"{path}: {exc}") from exc
    runs = [d for d in documents if isinstance(d, dict) and d.get("kind") == KIND]
    if len(runs) != 1:
        raise ManifestError(f"{path}: expected exactly one {KIND} document, found {len(runs)}")
    manifest = runs[0]
    agents: dict[str, Any] = {}
    for document in (
        manifest,
        *(d for d in documents if isinstance(d, dict) and d.get("kind") == AGENT_KIND),
    ):
        if document.get("apiVersion") != API_VERSION:
            raise ManifestError(
                f"{path}: apiVersion must be {API_VERSION}, got {document.get('apiVersion')!r}"
            )
        if document is not manifest:
            agents[str((document.get("metadata") or {}).get("name", ""))] = document
    return manifest, agents


def local_spec(manifest: Mapping[str, Any], agents: Mapping[str, Any]) -> ResolvedRunSpec:
    """The spec to run, parsed and validated as the operator does it: with spec.agentRef, the Agent
    of the same file overridden by the run."""
    spec = phases.parse_spec(manifest.get("spec") or {})
    if isinstance(spec, Ending):
        raise ManifestError(spec.outcome.message)
    if spec.agent_ref is not None:
        name = spec.agent_ref.name
        agent = agents.get(name)
        if agent is None:
            raise ManifestError(
                f"spec.agentRef: Agent {name} is not in the file; put its Agent document in the same file"
            )
        try:
            spec = resolve(AgentSpec.model_validate(agent.get("spec") or {}), spec, name)
        except AgentSpecConflict as exc:
            raise ManifestError(str(exc)) from exc
        except pydantic.ValidationError as exc:
            raise ManifestError(phases.describe_validation_error(exc)) from exc
    refused = phases.validate(spec)
    if refused is not None:
        raise ManifestError(refused.outcome.message)
    if spec.sandbox is None:
        return ResolvedRunSpec.of(spec, None)
    if spec.sandbox.template_ref is not None:
        raise ManifestError(
            "spec.sandbox.templateRef: a sandbox is a pod the operator starts in the run's namespace, "
            "from a SandboxTemplate there, which `agentrun run` cannot do"
        )
    try:
        return ResolvedRunSpec.of(spec, resolve_sandbox(spec.sandbox, None))
    except pydantic.ValidationError as exc:
        raise ManifestError(phases.describe_validation_error(exc, "spec.sandbox")) from exc


class ProgressPrinter:
    def __init__(self, out: TextIO) -> None:
        self._out = out

    async def notify(self, event: Event) -> None:
        match event:
            case ModelRequestFinished(iteration=i, outcome="ok", duration_seconds=s, usage=u):
                line = (
                    f"iteration {i}: model answered in {s:.2f}s (in={u.input_tokens} out={u.output_tokens})"
                )
            case ModelRequestFinished(iteration=i, outcome=outcome):
                line = f"iteration {i}: model request failed ({outcome})"
            case ModelRetryScheduled(retry_class=rc, attempt=a, delay_seconds=d):
                line = f"  retry {a} after {d:.1f}s ({rc})"
            case ToolCallFinished(trace=t):
                result = "ok" if t.ok else f"error {t.error_code}"
                line = f"  tool {t.name}: {result} in {t.duration_seconds:.2f}s"
            case ContextCompacted(tokens_before=b, tokens_after=a, turns=n):
                line = f"  context compacted: {n} turns summarized, next request ~{b} -> ~{a} input tokens"
            case RunFinished(outcome=o):
                line = f"finished: {o.stop_reason.value}: {o.message}"
            case _:
                return
        print(line, file=self._out, flush=True)


class FinishedKeeper:
    """What the printed status is made of besides the outcome: status.context of the latest
    compaction, which the operator's status writer patches in when it happens (and the finish
    phase's patch does not repeat), and the final event."""

    def __init__(self) -> None:
        self.event: RunFinished | None = None
        self.context: StatusPatch | None = None

    async def notify(self, event: Event) -> None:
        match event:
            case RunFinished():
                self.event = event
            case ContextCompacted() as done:
                self.context = status_patches.compacted(
                    compactions=done.compactions,
                    iteration=done.iteration,
                    tokens_before=done.tokens_before,
                    tokens_after=done.tokens_after,
                    tokens_removed=done.tokens_removed,
                )
            case _:
                pass


def cluster_needs(spec: AgentRunSpec) -> list[str]:
    """The fields that make this run need a cluster locally: header Secrets and Kubernetes tools."""
    needs = [use.field for use in secret_uses(spec)]
    for index, entry in enumerate(spec.tools):
        if entry.builtin is not None and entry.builtin.name in KUBERNETES_TOOLS:
            needs.append(f"spec.tools[{index}].builtin ({entry.builtin.name})")
    return needs


async def local_tool_environment(
    spec: AgentRunSpec, namespace: str, run_id: str, stack: contextlib.AsyncExitStack
) -> RunToolEnvironment:
    """Secrets and Kubernetes tools use the cluster KUBECONFIG points at; others need none."""
    needs = cluster_needs(spec)
    kube: KubeClient | None = None
    access: ClusterAccess | None = None
    if needs:
        try:
            access = await kubeconfig_loading.load()
        except KubeFailure as exc:
            raise ManifestError(f"{', '.join(needs)} need a Kubernetes cluster: {exc}") from exc
        kube = await connect(access)
        stack.push_async_callback(kube.close)
    env = RunToolEnvironment(kube, namespace, run_id, spec.service_account_name)
    uses = secret_uses(spec)
    with explained("read", f"the Secrets of {', '.join(u.field for u in uses)}", access=access):
        missing = await env.first_missing(uses)
    if missing is not None:
        raise ManifestError(str(missing).replace("yet; the run starts once it does", "in the cluster"))
    return env


class Refused(Exception):
    """The command stops before or instead of the run: the line it says (after "error: "), its exit code."""

    def __init__(self, message: str, code: int = EXIT_INVALID) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Admitted:
    """The file's run, admitted, and what it runs with."""

    manifest: dict[str, Any]
    spec: ResolvedRunSpec
    settings: Settings
    prices: PriceTable
    access: ModelAccess


def admitted(path: Path) -> Admitted:
    """The file's run, admitted as the operator admits it, with the operator's settings (Settings.from_env:
    ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL, AGENTRUN_PRICE_FILE and AGENTRUN_CONTEXT_WINDOWS are the ones a
    local run uses) and the price table."""
    try:
        manifest, agents = load_manifest(path)
    except ManifestError as exc:
        raise Refused(str(exc)) from exc
    try:
        spec = local_spec(manifest, agents)
    except ManifestError as exc:
        raise Refused(f"{path}: {exc}") from exc
    try:
        settings = Settings.from_env()
    except pydantic.ValidationError as exc:
        raise Refused(describe_settings_error(exc)) from exc
    prices = PriceTable.load(settings.price_file)
    if (unknown := phases.check_model(spec, prices)) is not None:
        raise Refused(f"{path}: {unknown.outcome.message}")
    return Admitted(manifest, spec, settings, prices, local_access(spec, settings))


def credentials_ref(spec: ResolvedRunSpec) -> object | None:
    model = spec.model
    settings = (
        model.bedrock if model.provider == "bedrock" else model.vertex if model.provider == "vertex" else None
    )
    return settings.credentials_secret_ref if settings is not None else None


def local_access(spec: ResolvedRunSpec, settings: Settings) -> ModelAccess:
    """Secrets are not read locally: Anthropic's API with ANTHROPIC_API_KEY; Bedrock and Vertex AI with
    this machine's own cloud sign-in (an AWS profile, `gcloud auth application-default login`)."""
    model = spec.model
    if model.provider != "anthropic":
        return ModelAccess(
            model.provider,
            base_url=model.base_url,
            region=region_of(model, os.environ),
            project_id=project_of(model, os.environ),
        )
    if settings.anthropic_api_key is None:
        raise Refused("set ANTHROPIC_API_KEY (Secrets are not read when running locally)")
    key = settings.anthropic_api_key.get_secret_value()
    return ModelAccess(base_url=model.base_url or settings.anthropic_base_url, api_key=key)


async def opened_tools(
    path: Path, spec: ResolvedRunSpec, namespace: str, run_id: str, stack: contextlib.AsyncExitStack
) -> Mapping[str, Tool]:
    """The run's tools, open until ``stack`` closes."""
    try:
        env = await local_tool_environment(spec, namespace, run_id, stack)
        tools = await phases.open_run_tools(spec, env, stack)
    except ManifestError as exc:
        raise Refused(f"{path}: {exc}") from exc
    except KubeFailure as exc:
        raise Refused(f"{path}: {exc}", EXIT_FAILED) from exc
    if isinstance(tools, Ending):
        code = EXIT_INVALID if tools.outcome.stop_reason is StopReason.INVALID_SPEC else EXIT_FAILED
        raise Refused(f"{path}: {tools.outcome.message}", code)
    return tools


async def run_manifest(
    path: Path, *, output: str, stdout: TextIO, stderr: TextIO, namespace: str | None = None
) -> int:
    try:
        run = admitted(path)
    except Refused as exc:
        print(f"error: {exc}", file=stderr)
        return exc.code
    manifest, spec, settings = run.manifest, run.spec, run.settings
    if spec.model.api_key_secret_ref is not None:
        print("note: spec.model.apiKeySecretRef is ignored locally; using ANTHROPIC_API_KEY", file=stderr)
    if credentials_ref(spec) is not None:
        print(
            f"note: spec.model.{spec.model.provider}.credentialsSecretRef is ignored locally; using "
            "this machine's own cloud credentials",
            file=stderr,
        )
    name = str((manifest.get("metadata") or {}).get("name", path.stem))
    namespace = namespace or str((manifest.get("metadata") or {}).get("namespace") or "default")
    run_id = f"local-{name}"
    tools_open = contextlib.AsyncExitStack()
    try:
        tools = await opened_tools(path, spec, namespace, run_id, tools_open)
    except Refused as exc:
        await tools_open.aclose()
        print(f"error: {exc}", file=stderr)
        return exc.code
    clients = ClientPool()
    model = clients.model(run.access)
    cancel = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, cancel.set)
    started = now_rfc3339()
    final = FinishedKeeper()
    try:
        print(f"running {name} with model {spec.model.name}", file=stderr, flush=True)
        outcome = await phases.run_agent_loop(
            spec,
            run_id=run_id,
            model=model,
            tools=tools,
            observer=Fanout(ProgressPrinter(stderr), final),
            clock=SystemClock(),
            pricer=run.prices,
            cancel=cancel,
            context_windows=settings.context_windows,
        )
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await clients.close()
        await tools_open.aclose()
    return print_status(outcome, final, started, output, stdout)


def print_status(outcome: Outcome, final: FinishedKeeper, started: str, output: str, stdout: TextIO) -> int:
    """The status the operator would have written at the end, printed; the exit code it means."""
    assert final.event is not None  # run_loop always ends with RunFinished
    finished = status_patches.finished(outcome, final.event.progress, now=now_rfc3339(), generation=None)
    begun = StatusPatch(AgentRunStatus(start_time=started))
    if final.context is not None:
        begun = begun.merged(final.context)
    status = {k: v for k, v in begun.merged(finished).body().items() if v is not None}
    if output == "json":
        print(json.dumps(status, indent=2), file=stdout)
    else:
        print(yaml.safe_dump(status, sort_keys=False), file=stdout, end="")
    return EXIT_OK if status["phase"] == "Succeeded" else EXIT_FAILED


def main(path: str, output: str, namespace: str | None = None) -> int:
    return asyncio.run(
        run_manifest(Path(path), output=output, stdout=sys.stdout, stderr=sys.stderr, namespace=namespace)
    )
