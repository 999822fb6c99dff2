"""The chart's PostgreSQL database: operator.transcriptStorage and operator.quotaLedger postgres, its DSN
from a Secret."""

from __future__ import annotations

from tests.chart.test_chart import env_of
from tests.chart.tooling import Renderer

POSTGRES = {"operator": {"transcriptStorage": "postgres"}, "database": {"existingSecret": "agentrun-db"}}


def test_the_postgres_store_gets_its_dsn_from_the_named_secret_and_never_as_a_value(
    renderer: Renderer,
) -> None:
    env = env_of(renderer.render(POSTGRES))
    assert env["AGENTRUN_TRANSCRIPT_STORAGE"]["value"] == "postgres"
    assert env["AGENTRUN_DATABASE_URL"] == {
        "name": "AGENTRUN_DATABASE_URL",
        "valueFrom": {"secretKeyRef": {"name": "agentrun-db", "key": "url"}},
    }
    keyed = env_of(renderer.render({**POSTGRES, "database": {"existingSecret": "db", "urlKey": "dsn"}}))
    assert keyed["AGENTRUN_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "db", "key": "dsn"}


def test_other_stores_get_no_database_url(renderer: Renderer) -> None:
    assert "AGENTRUN_DATABASE_URL" not in env_of(
        renderer.render({"database": {"existingSecret": "agentrun-db"}})
    )


def test_the_postgres_store_without_a_secret_is_refused_saying_which_value_to_set(renderer: Renderer) -> None:
    proc = renderer.template({"operator": {"transcriptStorage": "postgres"}}, check=False)
    assert proc.returncode != 0
    assert (
        "operator.transcriptStorage or operator.quotaLedger postgres needs database.existingSecret"
        in proc.stderr
    )


def test_a_store_the_operator_does_not_know_is_refused_by_the_values_schema(renderer: Renderer) -> None:
    proc = renderer.template({"operator": {"transcriptStorage": "mysql"}}, check=False)
    assert proc.returncode != 0
    assert "transcriptStorage" in proc.stderr


def test_quota_ledgers_in_postgres_get_the_dsn_and_stay_in_the_status_by_default(renderer: Renderer) -> None:
    env = env_of(
        renderer.render({"operator": {"quotaLedger": "postgres"}, "database": {"existingSecret": "db"}})
    )
    assert env["AGENTRUN_QUOTA_LEDGER"]["value"] == "postgres"
    assert env["AGENTRUN_TRANSCRIPT_STORAGE"]["value"] == "secret"
    assert env["AGENTRUN_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "db", "key": "url"}
    default = env_of(renderer.render({}))
    assert default["AGENTRUN_QUOTA_LEDGER"]["value"] == "status" and "AGENTRUN_DATABASE_URL" not in default


def test_quota_ledgers_in_postgres_without_a_secret_or_in_an_unknown_place_are_refused(
    renderer: Renderer,
) -> None:
    proc = renderer.template({"operator": {"quotaLedger": "postgres"}}, check=False)
    assert (
        proc.returncode != 0 and "operator.quotaLedger postgres needs database.existingSecret" in proc.stderr
    )
    proc = renderer.template({"operator": {"quotaLedger": "etcd"}}, check=False)
    assert proc.returncode != 0 and "quotaLedger" in proc.stderr
