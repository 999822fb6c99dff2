"""`agentrun-sandbox`: the offline demo, and the stand-ins on their own for trying things by hand."""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrun-sandbox",
        description="Stand-ins for agentrun-operator: an emulated Kubernetes API, a scripted Messages API.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="offline demo: emulated cluster + scripted model + the real operator")
    demo.add_argument("--kubeconfig", help="use this real cluster instead of the emulator")
    demo.add_argument("--examples", default=None, help="directory of AgentRun manifests (default: examples/)")
    demo.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the runs to finish")
    demo.add_argument(
        "--keep-console",
        action="store_true",
        help="after the runs, keep serving the web console (and the cluster) until Ctrl-C",
    )
    # Their options are their servers' own (`agentrun-sandbox kube --help`): passed through untouched.
    sub.add_parser("kube", help="serve the Kubernetes API emulator until interrupted", add_help=False)
    sub.add_parser("messages", help="serve the fake Messages API until interrupted", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["kube"]:
        from agentrun_sandbox.kube.server import main as kube_main

        return kube_main(argv[1:])
    if argv[:1] == ["messages"]:
        from agentrun_sandbox.messages.server import main as messages_main

        return messages_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from agentrun_sandbox.demo import main as demo_main

        return demo_main(
            kubeconfig=args.kubeconfig,
            examples=args.examples,
            timeout=args.timeout,
            keep_console=args.keep_console,
        )
    raise AssertionError(args.command)  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
