"""`agentrun a2a`: exposed Agents over the A2A protocol (agentrun/a2a/), every task run as its caller."""

from __future__ import annotations

import argparse
import asyncio

from agentrun.a2a.serving import A2AConfig, A2AServer, serving
from agentrun.cli.service_running import run_service, start_logging, url_host
from agentrun.kube import kubeconfig_loading


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a2a = sub.add_parser(
        "a2a",
        help="serve the Agents with spec.a2a.expose over the A2A protocol, each task run as its caller",
    )
    a2a.add_argument(
        "--kubeconfig", help="kubeconfig to use (default: KUBECONFIG, in-cluster, ~/.kube/config)"
    )
    a2a.add_argument("--context", help="kubeconfig context")
    a2a.add_argument("--bind-address", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    a2a.add_argument("--port", type=int, default=8091, help="port to listen on (default 8091)")
    a2a.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="serve the Agents of this namespace only (repeatable; default: every namespace)",
    )
    a2a.add_argument(
        "--public-url",
        help="the URL callers reach this server at, for the Agent Cards (default: each request's own host)",
    )
    a2a.add_argument(
        "--wait-seconds",
        type=float,
        default=600.0,
        help="how long a SendMessage waits for its run to end before answering with the task as it is "
        "(default 600)",
    )
    a2a.add_argument(
        "--poll-seconds",
        type=float,
        default=1.0,
        help="how often a waiting request reads its run again (default 1)",
    )


def config_of(args: argparse.Namespace) -> A2AConfig:
    if args.wait_seconds <= 0 or args.poll_seconds <= 0:
        raise SystemExit("error: --wait-seconds and --poll-seconds must be positive")
    if args.public_url is not None and not args.public_url.startswith(("http://", "https://")):
        raise SystemExit(f"error: --public-url {args.public_url!r} is not an http:// or https:// URL")
    return A2AConfig(
        namespaces=tuple(args.namespace),
        public_url=args.public_url,
        wait_seconds=args.wait_seconds,
        poll_seconds=args.poll_seconds,
    )


async def serve(args: argparse.Namespace, config: A2AConfig) -> None:
    access = await kubeconfig_loading.load(args.kubeconfig, args.context)
    async with serving(A2AServer.of(access, config), args.bind_address, args.port) as port:
        host = url_host(args.bind_address)
        print(
            f"agentrun a2a: http://{host}:{port}/agents/NAMESPACE/AGENT (API server {access.server})",
            flush=True,
        )
        await asyncio.Event().wait()


def main(args: argparse.Namespace) -> int:
    start_logging()
    config = config_of(args)
    return run_service(serve(args, config))
