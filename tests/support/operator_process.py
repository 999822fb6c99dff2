"""The operator process of the tests: the shared one (:mod:`agentrun_sandbox.operator_process`) that also
leaves evidence for the session's secret-leak scan (tests/test_secrets_never_leak.py) when it stops."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from agentrun_sandbox import operator_process
from tests.support import leaks


@dataclass
class OperatorProcess(operator_process.OperatorProcess):
    async def stop(self, *, kill: bool = False, timeout: float = 20.0) -> int:
        if not self.running:
            return await super().stop(kill=kill, timeout=timeout)
        evidence = await self._gather_evidence()
        try:
            return await super().stop(kill=kill, timeout=timeout)
        finally:
            evidence.texts["operator log"] = self.logs()
            leaks.record(evidence)

    async def _gather_evidence(self) -> leaks.Evidence:
        """What the scan needs that is only there while the operator and its cluster run."""
        evidence = leaks.Evidence(source=str(self.log_path))
        key = self.env.get("ANTHROPIC_API_KEY")
        if key:
            evidence.secrets.add(key)
        with contextlib.suppress(aiohttp.ClientError, OSError):
            evidence.texts["metrics scrape"] = await self.scrape()
        with contextlib.suppress(aiohttp.ClientError, OSError, KeyError, IndexError):
            texts, secrets = await leaks.snapshot_cluster(self.kubeconfig)
            evidence.texts.update(texts)
            evidence.secrets.update(secrets)
        return evidence


def running_operator(
    kubeconfig: Path, log_path: Path, env: Mapping[str, str], args: tuple[str, ...] = ()
) -> contextlib.AbstractAsyncContextManager[OperatorProcess]:
    """The sandbox's running_operator, with this module's evidence-keeping process."""
    return operator_process.running_operator(kubeconfig, log_path, env, args, process_type=OperatorProcess)
