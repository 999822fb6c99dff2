"""A bad setting is refused in one line naming the environment variable, not a pydantic dump."""

from __future__ import annotations

import subprocess
import sys

import pydantic
import pytest

from agentrun.settings import Settings, describe_settings_error


def test_every_bad_setting_is_named_by_its_environment_variable_on_one_line() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        Settings.from_env({"AGENTRUN_CONTEXT_WINDOWS": "x=1", "AGENTRUN_KUBE_RETRY_ATTEMPTS": "-1"})
    said = describe_settings_error(caught.value)
    assert "\n" not in said and "errors.pydantic.dev" not in said
    assert "AGENTRUN_KUBE_RETRY_ATTEMPTS: Input should be greater than or equal to 0" in said
    assert (
        "AGENTRUN_CONTEXT_WINDOWS: context window entry 'x=1': "
        "expected <model or prefix*>=<tokens, at least 1024>"
    ) in said


def test_the_operator_exits_2_with_that_line_before_touching_any_cluster() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentrun.cli.main", "operator"],
        env={"AGENTRUN_KUBE_RETRY_MAX_SECONDS": "soon", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: invalid settings: AGENTRUN_KUBE_RETRY_MAX_SECONDS: "
        "Input should be a valid number, unable to parse string as a number"
    ]


def test_the_postgres_store_without_a_database_url_is_refused_naming_both_variables() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        Settings.from_env({"AGENTRUN_TRANSCRIPT_STORAGE": "postgres"})
    assert describe_settings_error(caught.value) == (
        "AGENTRUN_TRANSCRIPT_STORAGE=postgres needs AGENTRUN_DATABASE_URL (a PostgreSQL DSN)"
    )
    secret = "postgresql://agentrun:hunter2@db:5432/agentrun"
    settings = Settings.from_env({"AGENTRUN_TRANSCRIPT_STORAGE": "postgres", "AGENTRUN_DATABASE_URL": secret})
    assert settings.database_url is not None and settings.database_url.get_secret_value() == secret
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings.model_dump())


def test_quota_ledgers_in_postgres_without_a_database_url_or_in_an_unknown_place_are_refused() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        Settings.from_env({"AGENTRUN_QUOTA_LEDGER": "postgres"})
    assert describe_settings_error(caught.value) == (
        "AGENTRUN_QUOTA_LEDGER=postgres needs AGENTRUN_DATABASE_URL (a PostgreSQL DSN)"
    )
    with pytest.raises(pydantic.ValidationError) as caught:
        Settings.from_env({"AGENTRUN_QUOTA_LEDGER": "etcd"})
    assert describe_settings_error(caught.value) == (
        "AGENTRUN_QUOTA_LEDGER: Input should be 'status' or 'postgres'"
    )
    settings = Settings.from_env(
        {"AGENTRUN_QUOTA_LEDGER": "postgres", "AGENTRUN_DATABASE_URL": "postgresql://db/x"}
    )
    assert settings.quota_ledger == "postgres" and settings.transcript_storage == "secret"
