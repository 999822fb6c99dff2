"""`agentrun operator` picks its event loop: uvloop's where installed, asyncio's otherwise."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from agentrun.cli.main import _loop_factory


def test_the_operator_runs_on_uvloop_when_it_is_installed() -> None:
    factory = _loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_without_uvloop_the_operator_runs_on_asyncios_own_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what an environment without uvloop imports
    assert _loop_factory() is None
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        assert not isinstance(runner.get_loop(), uvloop.Loop)
