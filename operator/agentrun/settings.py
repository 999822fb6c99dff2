"""The operator's one settings object: read from the environment, overridden by CLI flags."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def default_replica_name() -> str:
    """hostname-pid, made DNS-safe (a hostname may carry capitals or underscores)."""
    host = re.sub(r"[^a-z0-9.-]+", "-", socket.gethostname().lower()).strip("-.") or "replica"
    return f"{host[:200]}-{os.getpid()}"


class FaultInjection(BaseModel):
    """Faults the operator injects into itself, for tests only: each is off unless its variable is set.

    Why in the settings and not read where it acts: a fault hook is a knob like any other, validated
    and refused in one line at startup, documented in one table, and visibly off in production.
    Environment names are AGENTRUN_FAULT_<FIELD>.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    stall_loop_seconds: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Set: SIGUSR1 blocks the operator's event loop this long, as a stuck loop would "
        "(controller/replicas/faults.py). Tests only.",
    )
    sandbox_idle_seconds: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Set: a sandbox whose spec.sandbox.idleTimeoutSeconds is set is deleted after this "
        "many seconds without a call instead (tools/sandbox/idling.py), so a scenario need not wait "
        "30 s. Tests only.",
    )


class Settings(BaseModel):
    """Every knob, documented in docs/operating.md ('Operator settings'). Environment names are AGENTRUN_*."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespaces: tuple[str, ...] = Field(default=(), description="Namespaces to serve; empty = all.")
    metrics_port: int = Field(default=8080, ge=0, le=65535, description="Port of GET /metrics.")
    health_port: int = Field(default=8081, ge=0, le=65535, description="Port of GET /healthz.")
    bind_address: str = Field(default="0.0.0.0", description="Address the HTTP endpoints bind to.")
    log_format: Literal["json", "text"] = Field(default="json", description="Log line format.")
    log_level: str = Field(default="INFO", description="Python log level.")
    max_concurrent_runs: int = Field(default=50, ge=1, description="Runs executing at once; others queue.")
    anthropic_api_key: SecretStr | None = Field(default=None, description="Fallback API key.")
    anthropic_base_url: str | None = Field(default=None, description="Fallback Messages API base URL.")
    model_timeout_seconds: float = Field(default=600.0, gt=0, description="Timeout of one model request.")
    model_client: Literal["direct", "sdk"] = Field(
        default="direct",
        description="How unstreamed requests are sent: direct (the SDK wire form over aiohttp) or sdk.",
    )
    price_file: Path | None = Field(default=None, description="YAML file of price overrides.")
    default_ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="TTL for finished runs that set none."
    )
    transcript_storage: Literal["secret", "configmap", "postgres"] = Field(
        default="secret", description="Where transcripts are kept: Secrets, ConfigMaps or PostgreSQL."
    )
    quota_ledger: Literal["status", "postgres"] = Field(
        default="status",
        description="Where AgentRunQuota ledgers are kept: in each quota's status, or in PostgreSQL "
        "(AGENTRUN_DATABASE_URL; the status then holds a copy of the totals).",
    )
    database_url: SecretStr | None = Field(
        default=None,
        description="PostgreSQL DSN (postgresql://user:password@host:port/db) of the transcript store and "
        "the quota ledgers; required when either is postgres.",
    )
    transcript_flush_seconds: float = Field(
        default=3.0,
        ge=0,
        description="Tool phases at least this long are persisted on their own (else with the next write).",
    )
    status_interval_seconds: float = Field(
        default=10.0,
        ge=0,
        description="Least time between two progress writes to status; phase changes and the end are "
        "written at once. 0: after every iteration.",
    )
    secret_retry_seconds: float = Field(
        default=10.0, gt=0, description="Recheck interval for missing Secrets."
    )
    max_agent_depth: int = Field(
        default=3,
        ge=0,
        description="Deepest child run an agent tool may start (a run nobody started is at depth 0); "
        "a call that would go deeper gets the tool error depth_limit.",
    )
    child_poll_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How often an agent tool reads its child run while waiting, besides the watch "
        "events that normally tell it first.",
    )
    kube_retry_attempts: int = Field(
        default=8,
        ge=0,
        description="Retries of a status write or transcript chunk write the API server refused "
        "transiently (409 Conflict, 429, 5xx, no answer) before the write fails.",
    )
    kube_retry_first_seconds: float = Field(
        default=0.2, ge=0, description="Wait before the first such retry; it doubles with each retry."
    )
    kube_retry_max_seconds: float = Field(
        default=5.0, ge=0, description="Longest wait between two such retries (a 429's Retry-After wins)."
    )
    approval_timeout_seconds: float = Field(
        default=600.0,
        gt=0,
        description="How long a call of a requiresApproval tool waits for spec.approvals, unless "
        "the run sets limits.approvalTimeoutSeconds; then it is denied ('approval timed out').",
    )
    heartbeat_seconds: float = Field(
        default=15.0, gt=0, description="Interval of agentrun_operator_heartbeat_timestamp_seconds."
    )
    otel_enabled: bool = Field(default=False, description="Export OpenTelemetry traces (OTLP/HTTP).")
    context_windows: tuple[tuple[str, int], ...] = Field(
        default=(),
        description="Context windows in tokens per model, beating the built-in table: "
        "'claude-foo*=500000,my-model=32000' (a trailing * matches a prefix).",
    )

    lease_namespace: str | None = Field(
        default=None,
        description="Namespace of the replicas' Leases; set, the replicas of a group share the runs "
        "(the chart sets the release namespace); unset, this replica runs every run.",
    )
    replica_name: str = Field(
        default_factory=lambda: default_replica_name(),
        description="This replica's name in its group (default: POD_NAME, else hostname-pid).",
    )
    replica_group: str = Field(
        default="agentrun",
        description="Replicas sharing the runs: the replicas of one deployment share the group.",
    )
    lease_duration_seconds: int = Field(
        default=30,
        ge=1,
        le=3600,
        description="A replica whose Lease is not renewed for this long is gone; its runs move.",
    )
    lease_renew_seconds: float = Field(
        default=5.0, gt=0, description="Interval of Lease renewals; at most a third of the duration."
    )
    handoff_grace_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description=(
            "A run handed to another replica first goes on to its next checkpoint, for at most this "
            "long, so the next owner asks nothing again; then it is stopped where it is. 0: at once."
        ),
    )

    loop_stall_seconds: float = Field(
        default=30.0,
        le=3600,
        description=(
            "A replica whose event loop has not run for this long stops renewing its Lease, so the "
            "other replicas take its runs; far above the lag of a loaded loop (a few seconds)."
        ),
    )

    gc_young_threshold: int = Field(
        default=50_000,
        ge=100,
        le=10_000_000,
        description=(
            "Python's garbage collector examines its youngest generation after this many new objects "
            "(Python's own default: 700). Higher costs less CPU per iteration at the price of garbage "
            "cycles living a little longer."
        ),
    )

    fault: FaultInjection = Field(
        default_factory=FaultInjection,
        description="Fault injection for tests (AGENTRUN_FAULT_*); every fault off unless set.",
    )

    @field_validator("loop_stall_seconds")
    @classmethod
    def _above_the_beat(cls, value: float) -> float:
        # The event loop beats every second (controller/replicas/detached.py): a healthy loop's last
        # beat is up to a second old, so a shorter limit would stop every renewal.
        if not value > 1:
            raise ValueError(f"must be more than 1 second (the event loop beats every second), not {value:g}")
        return value

    @field_validator("lease_namespace", "replica_group")
    @classmethod
    def _dns_label(cls, value: str | None) -> str | None:
        if value is not None and not DNS_LABEL.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a DNS label (at most 63 lowercase letters, digits and '-', "
                "starting and ending with a letter or digit)"
            )
        return value

    @field_validator("replica_name")
    @classmethod
    def _dns_subdomain(cls, value: str) -> str:
        if len(value) > 253 or not DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a DNS subdomain (at most 253 lowercase letters, digits, '-' and '.', "
                "starting and ending with a letter or digit)"
            )
        return value

    @model_validator(mode="after")
    def _database_given(self) -> Settings:
        if self.database_url is not None and self.database_url.get_secret_value().strip():
            return self
        for variable, value in (
            ("AGENTRUN_TRANSCRIPT_STORAGE", self.transcript_storage),
            ("AGENTRUN_QUOTA_LEDGER", self.quota_ledger),
        ):
            if value == "postgres":
                raise ValueError(f"{variable}=postgres needs AGENTRUN_DATABASE_URL (a PostgreSQL DSN)")
        return self

    @model_validator(mode="after")
    def _renewals_fit(self) -> Settings:
        # Why a third: a replica fences itself when its last renewal is older than duration - renew - 1 s,
        # so it needs room for at least one more renewal (and its retries) before that.
        if self.lease_renew_seconds * 3 > self.lease_duration_seconds:
            raise ValueError(
                f"AGENTRUN_LEASE_RENEW_SECONDS ({self.lease_renew_seconds:g}) must be at most a third of "
                f"AGENTRUN_LEASE_DURATION_SECONDS ({self.lease_duration_seconds})"
            )
        return self

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        return value

    @field_validator("context_windows", mode="before")
    @classmethod
    def _windows(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        entries = []
        for item in (v.strip() for v in value.split(",")):
            if not item:
                continue
            pattern, _, tokens = item.partition("=")
            if not pattern.strip() or not tokens.strip().isdigit() or int(tokens) < 1024:
                raise ValueError(
                    f"context window entry {item!r}: expected <model or prefix*>=<tokens, at least 1024>"
                )
            entries.append((pattern.strip(), int(tokens)))
        return tuple(entries)

    @classmethod
    def environment_variables(cls) -> dict[str, tuple[str, ...]]:
        """Every AGENTRUN_* variable read, with the field it sets: AGENTRUN_<FIELD>, and for a sub-model
        (``fault``) AGENTRUN_<SUB-MODEL>_<FIELD>."""
        variables: dict[str, tuple[str, ...]] = {}
        for name, info in cls.model_fields.items():
            sub = info.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                variables.update(
                    {f"AGENTRUN_{name}_{inner}".upper(): (name, inner) for inner in sub.model_fields}
                )
            else:
                variables[f"AGENTRUN_{name.upper()}"] = (name,)
        return variables

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for key, path in cls.environment_variables().items():
            if key in env:
                target = values
                for part in path[:-1]:
                    target = target.setdefault(part, {})
                target[path[-1]] = env[key]
        if env.get("ANTHROPIC_API_KEY"):
            values["anthropic_api_key"] = env["ANTHROPIC_API_KEY"]
        if "replica_name" not in values and env.get("POD_NAME"):
            values["replica_name"] = env["POD_NAME"]
        if env.get("ANTHROPIC_BASE_URL"):
            values["anthropic_base_url"] = env["ANTHROPIC_BASE_URL"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)


def describe_settings_error(exc: ValidationError) -> str:
    """One line per problem, each naming the environment variable (or flag) as the user set it."""
    problems = []
    for error in exc.errors():
        # ("fault", "stall_loop_seconds") is AGENTRUN_FAULT_STALL_LOOP_SECONDS; an item's index is no part
        field = "_".join(part for part in error["loc"] if isinstance(part, str))
        message = str(error["msg"]).removeprefix("Value error, ")
        problems.append(f"AGENTRUN_{field.upper()}: {message}" if field else message)
    return "; ".join(problems)
