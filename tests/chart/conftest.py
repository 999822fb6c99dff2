"""Session fixtures of the chart tests (see tooling.py)."""

from __future__ import annotations

import pytest

from tests.chart.tooling import Renderer, Tool, find_tool


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Tool:
    # Keep helm's cache/config/data out of $HOME: the tests are hermetic and need no repositories.
    home = tmp_path_factory.mktemp("helm-home")
    env = {f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}
    return Tool("helm", find_tool("helm"), env)


@pytest.fixture(scope="session")
def promtool() -> Tool:
    return Tool("promtool", find_tool("promtool"))


@pytest.fixture(scope="session")
def renderer(helm: Tool, tmp_path_factory: pytest.TempPathFactory) -> Renderer:
    return Renderer(helm, tmp_path_factory.mktemp("chart-values"))
