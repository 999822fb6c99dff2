"""What every part of the AgentRun spec shares: strict camelCase models and Secret references.

The parts live beside this module by topic (model_spec, tool_specs, output_spec, context_spec);
spec.py assembles them into AgentRunSpec, from which the CRD is generated.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

ToolName = Annotated[str, Field(pattern=TOOL_NAME_PATTERN, min_length=1, max_length=64)]


class SpecModel(BaseModel):
    """Strict camelCase models: unknown fields are errors, not silently ignored.

    Field names are camel-cased for the API by the alias generator; an explicit alias is only
    for an initialism the generator would not spell as the API does (baseURL, costBudgetUSD).
    """

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class SecretKeyRef(SpecModel):
    """A key of a Secret in the run's own namespace (cross-namespace references are not allowed)."""

    name: str = Field(
        description="Name of the Secret, in the same namespace as the AgentRun.",
        min_length=1,
        max_length=253,
    )
    key: str = Field(
        default="api-key",
        description="Key inside the Secret's data whose value is used.",
        min_length=1,
        max_length=253,
    )
