"""The replica settings: refused in one line naming the variable, defaults that need no configuration."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from agentrun.settings import Settings, describe_settings_error


def refusal(**env: str) -> str:
    with pytest.raises(ValidationError) as caught:
        Settings.from_env(env)
    return describe_settings_error(caught.value)


def test_membership_is_off_unless_a_lease_namespace_is_set() -> None:
    settings = Settings.from_env({})
    assert settings.lease_namespace is None
    assert (settings.replica_group, settings.lease_duration_seconds, settings.lease_renew_seconds) == (
        "agentrun",
        30,
        5.0,
    )


def test_the_replica_name_defaults_to_the_pod_name_else_host_and_pid() -> None:
    assert (
        Settings.from_env({"POD_NAME": "agentrun-operator-7d9f-x2"}).replica_name
        == "agentrun-operator-7d9f-x2"
    )
    assert Settings.from_env({"POD_NAME": "p", "AGENTRUN_REPLICA_NAME": "mine"}).replica_name == "mine"
    assert Settings.from_env({}).replica_name.endswith(f"-{os.getpid()}")


def test_renewals_less_often_than_three_per_duration_are_refused() -> None:
    message = refusal(AGENTRUN_LEASE_DURATION_SECONDS="15", AGENTRUN_LEASE_RENEW_SECONDS="6")
    assert message == (
        "AGENTRUN_LEASE_RENEW_SECONDS (6) must be at most a third of AGENTRUN_LEASE_DURATION_SECONDS (15)"
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AGENTRUN_REPLICA_GROUP", "Team_A"),
        ("AGENTRUN_REPLICA_GROUP", "g" * 64),
        ("AGENTRUN_LEASE_NAMESPACE", "ops.system"),
        ("AGENTRUN_REPLICA_NAME", "op 1"),
    ],
)
def test_names_that_are_not_dns_safe_are_refused_naming_the_variable(variable: str, value: str) -> None:
    message = refusal(**{variable: value})
    assert message.startswith(f"{variable}: {value!r} is not a DNS") and "\n" not in message


def test_a_lease_duration_must_be_positive() -> None:
    assert refusal(AGENTRUN_LEASE_DURATION_SECONDS="0").startswith("AGENTRUN_LEASE_DURATION_SECONDS:")


def test_the_loop_stall_limit_defaults_to_thirty_seconds_and_must_be_positive() -> None:
    assert Settings.from_env({}).loop_stall_seconds == 30.0
    assert Settings.from_env({"AGENTRUN_LOOP_STALL_SECONDS": "4.5"}).loop_stall_seconds == 4.5
    for value in ("1", "0.5", "0", "-1"):
        assert refusal(AGENTRUN_LOOP_STALL_SECONDS=value) == (
            "AGENTRUN_LOOP_STALL_SECONDS: must be more than 1 second (the event loop beats every second), "
            f"not {float(value):g}"
        )
    assert refusal(AGENTRUN_LOOP_STALL_SECONDS="soon").startswith(
        "AGENTRUN_LOOP_STALL_SECONDS: Input should be a valid number"
    )
