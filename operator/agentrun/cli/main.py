"""`agentrun`: operator, run, crd, console, a2a."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable

from agentrun import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrun", description="Run LLM agent loops as Kubernetes resources."
    )
    parser.add_argument("--version", action="version", version=f"agentrun {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    op = sub.add_parser("operator", help="run the controller (Kopf) against the current cluster")
    op.add_argument(
        "--namespace", "-n", action="append", default=[], help="serve this namespace (repeatable)"
    )
    op.add_argument("--all-namespaces", "-A", action="store_true", help="serve all namespaces (the default)")
    op.add_argument("--metrics-port", type=int, help="port of GET /metrics (default 8080)")
    op.add_argument("--health-port", type=int, help="port of GET /healthz (default 8081)")
    op.add_argument("--bind-address", help="address the HTTP endpoints bind to (default 0.0.0.0)")
    op.add_argument("--log-format", choices=["json", "text"], help="log format (default json)")
    op.add_argument("--max-concurrent-runs", type=int, help="runs executing at once (default 50)")

    run = sub.add_parser("run", help="run one AgentRun manifest locally, without a cluster")
    run.add_argument("file", help="AgentRun manifest (YAML)")
    run.add_argument(
        "-o", "--output", choices=["yaml", "json"], default="yaml", help="format of the final status"
    )
    run.add_argument(
        "--namespace",
        "-n",
        help="namespace of header Secrets and Kubernetes tools (default: the manifest's, else default)",
    )

    crd = sub.add_parser("crd", help="print the CustomResourceDefinition generated from the API models")
    crd.add_argument(
        "--kind",
        choices=["AgentRun", "AgentRunQuota", "Agent", "AgentSchedule", "SandboxTemplate"],
        default="AgentRun",
        help="the kind whose CRD (or reference) to print (default: AgentRun)",
    )
    crd.add_argument(
        "--reference", action="store_true", help="print the field reference of the docs (Markdown) instead"
    )
    crd.add_argument(
        "--all",
        action="store_true",
        help="print all five CRDs as one multi-document stream: `agentrun crd --all | kubectl apply -f -`",
    )

    from agentrun.cli.console_command import add_parser as add_console_parser

    add_console_parser(sub)

    from agentrun.cli.a2a_command import add_parser as add_a2a_parser

    add_a2a_parser(sub)

    # The offline demo needs the emulators, which are not part of the operator (sandbox/ in the repository).
    sub.add_parser("demo", help="moved: `make demo` in a clone of the repository")
    return parser


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed: it costs the operator less CPU per iteration
    (bench/RESULTS.md, operator at scale); asyncio's own loop otherwise, with the same behaviour."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:  # whatever its options: they belong to `agentrun-sandbox demo` now
        print(
            "error: the offline demo is not part of the operator: run `make demo` in a clone of the "
            "repository (or `agentrun-sandbox demo` where agentrun-sandbox is installed)",
            file=sys.stderr,
        )
        return 2
    args = _parser().parse_args(argv)
    if args.command == "crd":
        from agentrun.api import crd as crds
        from agentrun.api.reference import reference_markdown

        kinds = {
            "AgentRun": (crds.crd, crds.crd_yaml),
            "AgentRunQuota": (crds.quota_crd, crds.quota_crd_yaml),
            "Agent": (crds.agent_crd, crds.agent_crd_yaml),
            "AgentSchedule": (crds.schedule_crd, crds.schedule_crd_yaml),
            "SandboxTemplate": (crds.template_crd, crds.template_crd_yaml),
        }
        if args.all:
            if args.reference:
                print("error: --all prints CRDs; ask for one --kind's --reference", file=sys.stderr)
                return 2
            sys.stdout.write(crds.all_crds_yaml())
            return 0
        definition, as_yaml = kinds[args.kind]
        sys.stdout.write(reference_markdown(definition()) if args.reference else as_yaml())
        return 0
    if args.command == "run":
        from agentrun.cli.local import main as run_main

        return run_main(args.file, args.output, args.namespace)
    if args.command == "operator":
        return _operator(args)
    if args.command == "console":
        from agentrun.cli.console_command import main as console_main

        return console_main(args)
    if args.command == "a2a":
        from agentrun.cli.a2a_command import main as a2a_main

        return a2a_main(args)
    raise AssertionError(args.command)  # pragma: no cover


def _operator(args: argparse.Namespace) -> int:
    import pydantic

    from agentrun import logs
    from agentrun.controller.operating import operate
    from agentrun.kube.failures import explain
    from agentrun.settings import Settings, describe_settings_error

    if args.all_namespaces and args.namespace:
        print("error: --all-namespaces and --namespace exclude each other", file=sys.stderr)
        return 2
    try:
        settings = Settings.from_env(
            namespaces=tuple(args.namespace) or None,
            metrics_port=args.metrics_port,
            health_port=args.health_port,
            bind_address=args.bind_address,
            log_format=args.log_format,
            max_concurrent_runs=args.max_concurrent_runs,
        )
    except pydantic.ValidationError as exc:
        print(f"error: invalid settings: {describe_settings_error(exc)}", file=sys.stderr)
        return 2
    logs.configure(settings.log_format, settings.log_level)
    logs.lean_records()
    try:
        with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(operate(settings))
    except Exception as exc:
        # Startup checks word their failures (KubeFailure); a cluster failure out of Kopf later too.
        message = explain(exc, "watch", "agentruns")
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
