"""A run's sandbox: a pod of its own where the model's `bash` and text editor tools act.

Why a pod per run, created by the operator as the run's ServiceAccount: the model's commands then run
with none of the operator's rights, inside limits the kubelet enforces, and RBAC decides who may run
sandboxes where. The fields are the part of a pod template a platform team needs to choose; the
isolation (non-root, no privilege escalation, no capabilities, read-only root, no ServiceAccount
token, a writable workspace) is fixed by the operator and not a field (docs/sandbox.md).
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import ConfigDict, Field, JsonValue, field_validator, model_validator

from agentrun.api.spec_base import DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, SecretKeyRef, SpecModel

#: The tools a sandbox gives the model: the Messages API's own client tools, by the names their
#: versioned types require (bash_20250124, text_editor_20250728).
SANDBOX_TOOL_NAMES = ("bash", "str_replace_based_edit_tool")

#: A Kubernetes quantity (resource.Quantity) that is not negative: a number, then a binary suffix
#: (Ki … Ei), a decimal one (n, u, m, k, M … E) or an exponent of at most two digits (e3). The
#: grammar agentrun.quotas.quantities reads exactly when it counts sandboxes against AgentRunQuotas:
#: what passes the CRD can be counted, and "1.2.3" or "5mk" are refused when applied, not met
#: later by a quota or the kubelet.
QUANTITY_PATTERN = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]{1,2})?$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


class ResourceAmounts(SpecModel):
    """CPU and memory, as in a container's resources (both required: an unbounded sandbox is refused)."""

    cpu: str = Field(pattern=QUANTITY_PATTERN, max_length=64, description="CPU, e.g. 500m or 2.")
    memory: str = Field(pattern=QUANTITY_PATTERN, max_length=64, description="Memory, e.g. 512Mi.")


class SandboxResources(SpecModel):
    """Requests and limits of the sandbox container; the kubelet enforces the limits (OOM kill)."""

    requests: ResourceAmounts = Field(description="What the scheduler reserves for the sandbox.")
    limits: ResourceAmounts = Field(description="What the sandbox may use at most.")


class SandboxEnv(SpecModel):
    """An environment variable of the sandbox: a value, or a key of a Secret in the run's namespace."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.value) && has(self.secretKeyRef))",
                    "message": "set value or secretKeyRef, not both",
                }
            ]
        }
    )

    name: str = Field(pattern=ENV_NAME_PATTERN, min_length=1, max_length=253, description="Variable name.")
    value: str | None = Field(default=None, max_length=32768, description="Literal value.")
    secret_key_ref: SecretKeyRef | None = Field(
        default=None, description="A key of a Secret in the run's namespace (read by the kubelet)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> SandboxEnv:
        if self.value is not None and self.secret_key_ref is not None:
            raise ValueError("set value or secretKeyRef, not both")
        return self


class EgressRule(SpecModel):
    """Where the sandbox may connect to; all else is denied (with a CNI that enforces NetworkPolicy)."""

    cidr: str = Field(
        pattern=r"^[0-9a-fA-F:.]+/[0-9]{1,3}$",
        max_length=64,
        description="Destination block, e.g. 10.0.0.0/8.",
    )
    ports: list[int] = Field(
        default_factory=list, max_length=64, description="TCP ports allowed there (all ports when empty)."
    )


#: Where the operator's own volumes are mounted: a sandbox volume may not take their place.
RESERVED_MOUNT_PATHS = ("/tmp", "/agentrun")
RESERVED_VOLUME_NAMES = ("workspace", "tmp", "agentrun")


class ConfigMapVolume(SpecModel):
    """A ConfigMap of the run's namespace, mounted read-only (read by the kubelet)."""

    name: str = Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253, description="ConfigMap name.")


class SecretVolume(SpecModel):
    """A Secret of the run's namespace, mounted read-only (read by the kubelet, never by the operator)."""

    secret_name: str = Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253, description="Secret name.")


class ClaimVolume(SpecModel):
    """A PersistentVolumeClaim of the run's namespace: files that outlive the pod (and the run)."""

    claim_name: str = Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253, description="Claim name.")
    read_only: bool = Field(default=False, description="Mount the claim read-only.")


class EmptyDirVolume(SpecModel):
    """A scratch directory of the pod, gone with it."""

    size_limit: str = Field(
        default="1Gi", pattern=QUANTITY_PATTERN, max_length=64, description="Beyond it the pod is evicted."
    )


_CLEAN_MESSAGE = "must be a clean absolute path: no //, no . or .. segment"
_FREE_MESSAGE = "may not be /, nor /tmp or /agentrun (the operator's) or below them"


def _clean_rule(path: str) -> str:
    """CEL: ``path`` has no empty, . or .. segment, so it cannot name a reserved path another way."""
    return (
        f"!{path}.contains('//') && !{path}.contains('/./') && !{path}.endsWith('/.') && "
        f"!{path}.contains('/../') && !{path}.endsWith('/..')"
    )


def _free_rule(path: str) -> str:
    """CEL: ``path`` is not where the operator mounts its own volumes (RESERVED_MOUNT_PATHS)."""
    return (
        f"!({path} in ['/', '/tmp', '/agentrun', '/tmp/', '/agentrun/']) && "
        f"!{path}.startsWith('/agentrun/') && !{path}.startsWith('/tmp/')"
    )


def _check_path(path: str, field: str) -> None:
    """The pydantic side of _clean_rule and _free_rule, for the same paths."""
    segments = path.split("/")[1:]
    if any(segment in ("", ".", "..") for segment in segments[:-1]) or segments[-1] in (".", ".."):
        raise ValueError(f"{field} {_CLEAN_MESSAGE}")
    trimmed = path.rstrip("/") or "/"
    if trimmed == "/" or any(trimmed == r or trimmed.startswith(r + "/") for r in RESERVED_MOUNT_PATHS):
        raise ValueError(f"{field} {_FREE_MESSAGE}")


class SandboxVolume(SpecModel):
    """One more volume in the sandbox pod, from exactly one source (no hostPath: not a field)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.configMap), has(self.secret), has(self.persistentVolumeClaim), "
                    "has(self.emptyDir)].filter(x, x).size() == 1",
                    "message": "set exactly one of configMap, secret, persistentVolumeClaim, emptyDir",
                },
                {"rule": _clean_rule("self.mountPath"), "message": f"mountPath {_CLEAN_MESSAGE}"},
                {"rule": _free_rule("self.mountPath"), "message": f"mountPath {_FREE_MESSAGE}"},
            ]
        }
    )

    name: str = Field(
        pattern=DNS_LABEL_PATTERN, max_length=63, description="Volume name, unique in the sandbox."
    )
    mount_path: str = Field(
        pattern=r"^/[^\n:]*$",
        max_length=1024,
        description="Where the volume appears in the sandbox; the workspace itself when equal to workingDir.",
    )
    config_map: ConfigMapVolume | None = Field(default=None, description="A ConfigMap, read-only.")
    secret: SecretVolume | None = Field(default=None, description="A Secret, read-only.")
    persistent_volume_claim: ClaimVolume | None = Field(default=None, description="A PersistentVolumeClaim.")
    empty_dir: EmptyDirVolume | None = Field(default=None, description="A scratch directory.")

    @model_validator(mode="after")
    def _one_source_and_a_free_path(self) -> SandboxVolume:
        sources = [self.config_map, self.secret, self.persistent_volume_claim, self.empty_dir]
        if sum(source is not None for source in sources) != 1:
            raise ValueError("set exactly one of configMap, secret, persistentVolumeClaim, emptyDir")
        _check_path(self.mount_path, "mountPath")
        return self


IMAGE_DESCRIPTION = "Container image of the sandbox; it needs sh and the usual coreutils (cat, timeout)."
RESOURCES_DESCRIPTION = "CPU and memory requests and limits (required)."
#: What a sandbox without templateRef must declare itself, and what a SandboxTemplate must hold.
REQUIRED_UNLESS_TEMPLATED = ("image", "resources")


class SandboxFields(SpecModel):
    """What a run's sandbox and a SandboxTemplate share: every field of the pod but the warm pool.

    image and resources are optional here only so that a run's sandbox may take them from its
    template; SandboxTemplateSpec and SandboxSpec (the resolved sandbox) require them.
    """

    image: str | None = Field(default=None, min_length=1, max_length=1024, description=IMAGE_DESCRIPTION)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Image pull policy (the cluster's default when unset)."
    )
    resources: SandboxResources | None = Field(default=None, description=RESOURCES_DESCRIPTION)
    runtime_class_name: str | None = Field(
        default=None,
        pattern=DNS_LABEL_PATTERN,
        max_length=253,
        description="RuntimeClass of the pod, e.g. gvisor or kata, for a stronger isolation boundary.",
    )
    working_dir: str = Field(
        default="/workspace",
        pattern=r"^/[^\n]*$",
        max_length=1024,
        description=(
            "The writable workspace where commands start: an emptyDir, or the volume mounted there "
            "(spec.sandbox.volumes)."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": _clean_rule("self"), "message": f"workingDir {_CLEAN_MESSAGE}"},
                {"rule": _free_rule("self"), "message": f"workingDir {_FREE_MESSAGE}"},
            ]
        },
    )

    @field_validator("working_dir")
    @classmethod
    def _working_dir_free(cls, value: str) -> str:
        _check_path(value, "workingDir")
        return value

    workspace_size_limit: str = Field(
        default="1Gi",
        pattern=QUANTITY_PATTERN,
        max_length=64,
        description=(
            "Size limit of the workspace emptyDir (unused when a volume is mounted at workingDir); beyond "
            "it the kubelet evicts the pod."
        ),
    )
    env: list[SandboxEnv] = Field(default_factory=list, max_length=128, description="Environment variables.")
    egress: list[EgressRule] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Destinations the sandbox may reach; all other egress (the API server included) is denied "
            "by a NetworkPolicy. Only effective with a CNI that enforces NetworkPolicy."
        ),
    )
    command_timeout_seconds: int = Field(
        default=120,
        ge=1,
        le=86400,
        description="One command's limit: past it the command's process group is killed (exit 137).",
    )
    output_limit_bytes: int = Field(
        default=30000,
        ge=1024,
        le=1048576,
        description="stdout and stderr of one command are each cut to this many bytes, marked as cut.",
    )
    requires_approval: list[Literal["bash", "str_replace_based_edit_tool"]] = Field(
        default_factory=list,
        max_length=2,
        description=(
            "These sandbox tools pause the run for a person's approval (spec.approvals) before each call, "
            "e.g. [bash]."
        ),
    )
    on_pod_lost: Literal["Recreate", "Fail"] = Field(
        default="Recreate",
        description=(
            "A sandbox pod deleted or evicted mid-run: Recreate it (the workspace is lost unless a claim is "
            "mounted at workingDir, and the model is told so) or end the run FatalToolError."
        ),
    )
    keep_seconds_after_finished: int = Field(
        default=0,
        ge=0,
        le=604800,
        description="Keep the pod this long after the run finished, for debugging (deleted with the run).",
    )
    start_timeout_seconds: int = Field(
        default=300,
        ge=10,
        le=3600,
        description="How long the pod may take to start (image pull included) before the run fails.",
    )
    volumes: list[SandboxVolume] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(v, self.exists_one(w, w.mountPath == v.mountPath))",
                    "message": "two volumes have the same mountPath",
                },
                {
                    "rule": "self.all(v, !(v.name in ['workspace', 'tmp', 'agentrun']))",
                    "message": "volume names workspace, tmp and agentrun are the operator's",
                },
            ],
        },
        description=(
            "More volumes: ConfigMaps and Secrets (read-only), PersistentVolumeClaims, emptyDirs. A volume "
            "mounted at workingDir is the workspace instead of the default emptyDir."
        ),
    )
    idle_timeout_seconds: int | None = Field(
        default=None,
        ge=30,
        le=604800,
        description=(
            "Delete the sandbox pod after this long without a sandbox call (e.g. while the run waits for "
            "an approval); the next call starts a new pod and the model is told the workspace is new. "
            "Unset: the pod stays for the whole run."
        ),
    )

    @model_validator(mode="after")
    def _volumes_distinct(self) -> Self:
        names = [v.name for v in self.volumes]
        paths = [v.mount_path for v in self.volumes]
        if len(set(names)) != len(names):
            raise ValueError("two volumes have the same name")
        if len(set(paths)) != len(paths):
            raise ValueError("two volumes have the same mountPath")
        if reserved := sorted(set(names) & set(RESERVED_VOLUME_NAMES)):
            raise ValueError(
                f"volume names workspace, tmp and agentrun are the operator's (not {reserved[0]})"
            )
        return self


class SandboxTemplateSpec(SandboxFields):
    """A sandbox kept once for many runs (kind SandboxTemplate): runs name it in spec.sandbox.templateRef."""

    image: str = Field(min_length=1, max_length=1024, description=IMAGE_DESCRIPTION)
    resources: SandboxResources = Field(description=RESOURCES_DESCRIPTION)


class SandboxTemplateRef(SpecModel):
    """A SandboxTemplate in the run's (or the Agent's) own namespace."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the SandboxTemplate.",
    )


def _required_message(name: str) -> str:
    return f"{name} is required unless templateRef names a SandboxTemplate that sets it"


def _required_unless_templated(name: str) -> JsonValue:
    return {
        "rule": f"has(self.templateRef) || has(self.{name})",
        "fieldPath": f".{name}",
        "reason": "FieldValueRequired",
        "message": _required_message(name),
    }


class SandboxDeclaration(SandboxFields):
    """spec.sandbox as a manifest writes it: its own pod, or a SandboxTemplate with fields overridden.

    Declaring one gives the model the `bash` and text editor tools. The operator resolves it once,
    before admission, into a SandboxSpec (controller/agentruns/template_resolving.py).
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [_required_unless_templated(n) for n in REQUIRED_UNLESS_TEMPLATED]
        }
    )

    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description=f"{IMAGE_DESCRIPTION} Required unless templateRef names a template that sets it.",
    )
    resources: SandboxResources | None = Field(
        default=None,
        description="CPU and memory requests and limits; required unless templateRef names a template "
        "that sets them (then they replace the template's as a whole).",
    )
    template_ref: SandboxTemplateRef | None = Field(
        default=None,
        description=(
            "A SandboxTemplate of the same namespace as the base: every other field set here replaces "
            "the template's (docs/sandbox.md, Reusable templates). Read once, when the run starts."
        ),
    )
    warm_pool: int = Field(
        default=0,
        ge=0,
        le=10,
        description=(
            "On an Agent: keep this many sandbox pods started and unclaimed, so a run of the Agent "
            "takes one at its first command instead of waiting for a pod start (docs/sandbox.md, Fast "
            "start). An AgentRun of its own (without agentRef) cannot set it."
        ),
    )

    @model_validator(mode="after")
    def _complete_unless_templated(self) -> Self:
        if self.template_ref is None:
            for name in REQUIRED_UNLESS_TEMPLATED:
                if getattr(self, name) is None:
                    raise ValueError(_required_message(name))
        return self


class SandboxSpec(SandboxDeclaration):
    """The sandbox a run executes with: complete (image and resources), its template merged in.

    Only resolve_sandbox makes one from a declaration, so the code that starts pods and counts quota
    (which takes this type) never sees a sandbox whose template was not read.
    """

    image: str = Field(min_length=1, max_length=1024, description=IMAGE_DESCRIPTION)
    resources: SandboxResources = Field(description=RESOURCES_DESCRIPTION)


def resolve_sandbox(declared: SandboxDeclaration, template: SandboxTemplateSpec | None) -> SandboxSpec:
    """The sandbox a run executes: ``template`` (None: declared.templateRef is unset) as the base,
    every field ``declared`` sets on top, as a whole (resources, env and volumes replace the
    template's, they do not add to them).

    Raises pydantic's ValidationError, locations relative to spec.sandbox, when the two together are
    refused (e.g. a volume mounted where the template mounts another).
    """
    merged = template.model_dump(by_alias=True, exclude_unset=True) if template is not None else {}
    merged.update(declared.model_dump(by_alias=True, exclude_unset=True, exclude={"template_ref"}))
    return SandboxSpec.model_validate(merged)
