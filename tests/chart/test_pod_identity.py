"""Who the operator runs as: the chart's UID by default, or the platform's choice (OpenShift).

The image runs under any UID (tests/integration/test_container_identity.py starts it as one with no
passwd entry and GID 0); these check that the chart can leave the choice to the platform.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.tooling import Renderer, one


def pod_and_container(renderer: Renderer, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = one(renderer.render(values), "Deployment")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    return pod["securityContext"], container["securityContext"]


def test_the_operator_runs_as_65532_by_default_set_once_for_the_pod(renderer: Renderer) -> None:
    pod, container = pod_and_container(renderer, {})
    assert (pod["runAsUser"], pod["runAsGroup"]) == (65532, 65532)
    assert "runAsUser" not in container and "runAsGroup" not in container, "one place decides"


def test_null_uid_and_gid_leave_the_choice_to_the_platform_and_stay_non_root(renderer: Renderer) -> None:
    platform_chooses = {"podSecurityContext": {"runAsUser": None, "runAsGroup": None}}
    pod, container = pod_and_container(renderer, platform_chooses)
    assert "runAsUser" not in pod and "runAsGroup" not in pod
    assert pod["runAsNonRoot"] is True and container["runAsNonRoot"] is True


def test_an_arbitrary_uid_with_gid_0_is_rendered_as_given(renderer: Renderer) -> None:
    pod, _ = pod_and_container(renderer, {"podSecurityContext": {"runAsUser": 1000650000, "runAsGroup": 0}})
    assert (pod["runAsUser"], pod["runAsGroup"]) == (1000650000, 0)


@pytest.mark.parametrize("bad", [{"runAsUser": 0}, {"runAsUser": "x"}, {"runAsGroup": -1}, {"fsGroup": 1}])
def test_a_root_or_non_numeric_uid_or_an_unknown_key_is_refused(renderer: Renderer, bad: Any) -> None:
    proc = renderer.template({"podSecurityContext": bad}, check=False)
    assert proc.returncode != 0
    assert "podSecurityContext" in proc.stderr
