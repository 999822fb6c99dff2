"""The emulator served over HTTP(S): in-process for tests, benchmarks and the demo, or as a child process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import pathlib
import re
import signal
import ssl
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import aiohttp.web
import yaml

from agentrun_sandbox.kube.authz import Authorizer, UserInfo
from agentrun_sandbox.kube.emulator import KubeEmulator

__all__ = ["EmulatedCluster", "main", "write_kubeconfig"]

logger = logging.getLogger("agentrun_sandbox.kube.emulator")


def write_kubeconfig(path: pathlib.Path, url: str, *, token: str, namespace: str = "default") -> pathlib.Path:
    """A kubeconfig whose current context points at ``url`` with a static bearer token."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kube-emulator", "cluster": {"server": url, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "kube-emulator", "user": {"token": token}}],
        "contexts": [
            {
                "name": "kube-emulator",
                "context": {"cluster": "kube-emulator", "user": "kube-emulator", "namespace": namespace},
            }
        ],
        "current-context": "kube-emulator",
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@dataclass
class EmulatedCluster:
    """A running emulator: its URL, a kubeconfig pointing at it and the emulator itself."""

    url: str
    kubeconfig_path: pathlib.Path
    emulator: KubeEmulator
    token: str

    #: Called with every emulator :meth:`running` served, when its block exits (session-wide checks of
    #: test suites, e.g. over ``emulator.request_log``).
    stopped_hooks: ClassVar[list[Callable[[EmulatedCluster], None]]] = []

    def kubeconfig_for(self, token: str) -> pathlib.Path:
        """A second kubeconfig next to the first, with another bearer token (another identity)."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", token)
        path = self.kubeconfig_path.with_name(f"kubeconfig-{safe}.yaml")
        return write_kubeconfig(path, self.url, token=token)

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls,
        *,
        crd_paths: Iterable[str | pathlib.Path] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        kubeconfig_path: str | pathlib.Path | None = None,
        token: str = "kube-emulator-token",
        emulator: KubeEmulator | None = None,
        strict: bool = True,
        rbac: Mapping[str, Authorizer] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        identities: Mapping[str, UserInfo] | None = None,
    ) -> AsyncIterator[EmulatedCluster]:
        """Serve on ``host:port`` (0: any free port) until the block exits; over TLS with ``ssl_context``.

        With ``strict`` (the default), an unexpected exception inside the emulator (a bug, not an API
        error answer) is re-raised when the block exits, so tests cannot pass over it.

        ``rbac`` maps bearer tokens to authorizers: requests with such a token are authorized and
        refused with 403 as a real server would (:mod:`agentrun_sandbox.kube.authz`); give that
        identity a kubeconfig with :meth:`kubeconfig_for`. The default token stays unrestricted.

        ``identities`` maps bearer tokens to the users they authenticate as (``request.userInfo`` of
        admission policies, SelfSubjectReview); every other token acts as ``kube-emulator``, the admin.
        """
        emulator = emulator if emulator is not None else KubeEmulator(strict=strict)
        emulator.authorizers.update(rbac or {})
        emulator.identities.update(identities or {})
        for crd_path in crd_paths:
            emulator.load_crd(crd_path)
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(emulator)
            server = aiohttp.web.Server(emulator, handler_cancellation=True)
            runner = aiohttp.web.ServerRunner(server, shutdown_timeout=1.0)
            await runner.setup()
            stack.push_async_callback(runner.cleanup)
            stack.callback(emulator.close)
            site = aiohttp.web.TCPSite(runner, host, port, ssl_context=ssl_context)
            await site.start()
            bound_host, bound_port = runner.addresses[0][:2]
            url = f"{'https' if ssl_context else 'http'}://{bound_host}:{bound_port}"
            emulator.server_address = f"{bound_host}:{bound_port}"
            if kubeconfig_path is None:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="kube-emulator-"))
                kubeconfig_path = pathlib.Path(tmp) / "kubeconfig.yaml"
            config = write_kubeconfig(pathlib.Path(kubeconfig_path), url, token=token)
            logger.info("kube emulator: serving on %s", url)
            kube = cls(url=url, kubeconfig_path=config, emulator=emulator, token=token)
            try:
                yield kube
            finally:
                for hook in cls.stopped_hooks:
                    hook(kube)


async def _serve_until_signalled(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    emulator = KubeEmulator(strict=False, require_namespaces=not args.auto_namespaces)
    kubeconfig = args.kubeconfig or pathlib.Path(tempfile.gettempdir()) / "kube-emulator.yaml"
    async with EmulatedCluster.running(
        crd_paths=args.crd,
        host=args.host,
        port=args.port,
        kubeconfig_path=kubeconfig,
        token=args.token,
        emulator=emulator,
    ) as kube:
        print(f"READY {kube.url}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentrun_sandbox.kube.server",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--kubeconfig", type=pathlib.Path, help="where to write a kubeconfig for the emulator"
    )
    parser.add_argument("--crd", action="append", default=[], help="a CRD YAML file to load (repeatable)")
    parser.add_argument("--token", default="kube-emulator-token", help="bearer token put into the kubeconfig")
    parser.add_argument("--auto-namespaces", action="store_true", help="do not require namespaces to exist")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(_serve_until_signalled(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
