"""An operator the tests start and that never gets healthy is not left running behind them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentrun_sandbox.operator_process import OperatorProcess


class NeverHealthy(OperatorProcess):
    def command(self) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(120)"]


async def test_an_operator_never_healthy_is_killed_when_the_wait_for_it_gives_up(tmp_path: Path) -> None:
    operator = NeverHealthy(kubeconfig=tmp_path / "kubeconfig", log_path=tmp_path / "operator.log")
    with pytest.raises(TimeoutError, match=r"not healthy within 0\.5s"):
        await operator.start(ready_timeout=0.5)
    assert operator.process is not None
    assert operator.process.returncode is not None  # reaped: no ResourceWarning in a later test
    assert not operator.running
