"""The Helm chart's RBAC as an authorizer: render it with the real helm, evaluate rules as Kubernetes does.

`chart_policy()` runs `helm template` on the chart, keeps the ClusterRoles and Roles bound to the
operator's ServiceAccount (by ClusterRoleBindings and RoleBindings) and returns a `Policy`. A
`Policy` answers the questions of `agentrun_sandbox.kube.authz.Attributes` with the semantics of
kube-apiserver's RBAC authorizer (`pkg/registry/rbac/validation` and `plugin/pkg/auth/authorizer/rbac`,
the rule matching shared with the emulator in `agentrun_sandbox.kube.rbac`):

* a rule matches when its verbs, apiGroups, resources and resourceNames all match; `*` matches any
  verb, group or resource, `*/sub` any resource's subresource `sub`; a rule with resourceNames
  never matches a request without a name (list, watch, create, deletecollection);
* nonResourceURLs match exact paths or, ending in `*`, prefixes; they only count in ClusterRoles
  bound by a ClusterRoleBinding;
* a ClusterRoleBinding grants its rules in every namespace and at the cluster scope; a RoleBinding
  (to a Role or a ClusterRole) only inside its own namespace;
* subjects match by ServiceAccount, User or Group; a service account is in the groups
  `system:serviceaccounts`, `system:serviceaccounts:NS` and `system:authenticated`.

The bootstrap policy every cluster has for authenticated users (discovery, /version, self reviews) is
part of every Policy, marked as not the chart's, so it never counts as a chart rule (used or not).
The policy also records which chart permission answered each question, for the coverage test.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentrun_sandbox.kube import EmulatedCluster
from agentrun_sandbox.kube.authz import SERVICE_ACCOUNT_PREFIX, Attributes, attributes_of
from agentrun_sandbox.kube.emulator import KubeEmulator
from agentrun_sandbox.kube.http import RequestRecord
from agentrun_sandbox.kube.rbac import BOOTSTRAP_RULES as CLUSTER_BOOTSTRAP_RULES
from agentrun_sandbox.kube.rbac import PolicyRule, RbacObjects, groups_of, subject_matches
from tests.chart.tooling import CHART, find_tool
from tests.support.clusters import TestCluster
from tests.support.waiting import until

RELEASE = "agentrun-operator"
RELEASE_NAMESPACE = "agentrun-system"
OPERATOR_USER = f"{SERVICE_ACCOUNT_PREFIX}{RELEASE_NAMESPACE}:{RELEASE}"
BOOTSTRAP = "bootstrap"  # source name of the cluster's default roles


@dataclass(frozen=True)
class Rule(PolicyRule):
    """One PolicyRule of a (Cluster)Role; ``source`` says where it came from (for messages)."""

    source: str = ""

    @classmethod
    def parse(cls, rule: Mapping[str, Any], source: str) -> Rule:
        return cls(**PolicyRule.fields_of(rule), source=source)

    def permissions(self) -> list[Permission]:
        """The rule spelled out one (group, resource, verb) or (url, verb) at a time."""
        if self.non_resource_urls:
            return [
                Permission(self.source, "", url, verb, self.resource_names, non_resource=True)
                for url in self.non_resource_urls
                for verb in self.verbs
            ]
        return [
            Permission(self.source, group, resource, verb, self.resource_names)
            for group in self.api_groups
            for resource in self.resources
            for verb in self.verbs
        ]


@dataclass(frozen=True)
class Permission:
    """The smallest unit a rule grants; what "no rule is unused" is counted in."""

    source: str
    api_group: str
    resource: str
    verb: str
    resource_names: tuple[str, ...] = ()
    non_resource: bool = False

    def rule(self) -> Rule:
        if self.non_resource:
            return Rule((self.verb,), non_resource_urls=(self.resource,), source=self.source)
        return Rule(
            (self.verb,), (self.api_group,), (self.resource,), self.resource_names, source=self.source
        )

    def __str__(self) -> str:
        if self.non_resource:
            return f"{self.source}: {self.verb} {self.resource}"
        names = f" (names {', '.join(self.resource_names)})" if self.resource_names else ""
        return f"{self.source}: {self.verb} {self.resource} in API group {self.api_group!r}{names}"


@dataclass(frozen=True)
class Grant:
    """A rule in effect: everywhere (ClusterRoleBinding) or only inside ``namespace`` (RoleBinding)."""

    rule: Rule
    namespace: str | None = None

    def applies(self, attributes: Attributes) -> bool:
        if self.namespace is None:
            return self.rule.matches(attributes)
        if not attributes.resource_request or attributes.namespace != self.namespace:
            return False
        return self.rule.matches(attributes)


#: What every authenticated identity may do in a default cluster (system:discovery,
#: system:public-info-viewer and system:basic-user, bound to system:authenticated).
BOOTSTRAP_RULES = tuple(
    Rule(**dataclasses.asdict(rule), source=BOOTSTRAP) for rule in CLUSTER_BOOTSTRAP_RULES
)


@dataclass
class Policy:
    """The rules in effect for one user; an `agentrun_sandbox.kube.authz.Authorizer`."""

    user: str
    grants: tuple[Grant, ...]
    #: Every question answered so far, and the chart grants that allowed it (for coverage).
    answers: list[tuple[Attributes, bool]] = field(default_factory=list)

    def allows(self, attributes: Attributes) -> bool:
        allowed = attributes.user == self.user and any(grant.applies(attributes) for grant in self.grants)
        self.answers.append((attributes, allowed))
        return allowed

    def would_allow(self, attributes: Attributes) -> bool:
        """`allows` without recording the question."""
        return attributes.user == self.user and any(grant.applies(attributes) for grant in self.grants)

    @property
    def chart_grants(self) -> list[Grant]:
        return [grant for grant in self.grants if grant.rule.source != BOOTSTRAP]

    def permissions(self) -> list[Permission]:
        """Every chart permission once (Roles repeated per namespace count once)."""
        seen: dict[Permission, None] = {}
        for grant in self.chart_grants:
            for permission in grant.rule.permissions():
                seen.setdefault(permission)
        return list(seen)

    def unused(self, questions: Iterable[Attributes]) -> list[Permission]:
        """Chart permissions that answered none of ``questions`` with yes."""
        questions = list(questions)
        unused = []
        for permission in self.permissions():
            single = permission.rule()
            grants = [Grant(single, g.namespace) for g in self.chart_grants if g.rule.source == single.source]
            if not any(grant.applies(question) for grant in grants for question in questions):
                unused.append(permission)
        return unused


def _subject_matches(subject: Mapping[str, Any], user: str) -> bool:
    return subject_matches(subject, user, groups_of(user))


def policy_from_manifests(manifests: Iterable[Mapping[str, Any]], user: str) -> Policy:
    """The effective rules for ``user``: roles reached through bindings whose subjects include it."""
    manifests = [m for m in manifests if m]
    cluster_roles = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "ClusterRole"}
    roles = {
        (m["metadata"].get("namespace"), m["metadata"]["name"]): m for m in manifests if m["kind"] == "Role"
    }
    grants = [Grant(rule) for rule in BOOTSTRAP_RULES]
    for binding in manifests:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(_subject_matches(s, user) for s in binding.get("subjects") or ()):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        if ref["kind"] == "ClusterRole":
            role = cluster_roles.get(ref["name"])
        else:
            role = roles.get((namespace, ref["name"]))
        if role is None:
            raise AssertionError(f"{binding['kind']} {binding['metadata']['name']} refers to a missing role")
        source = f"{role['kind']}/{role['metadata']['name']}"
        for raw in role.get("rules") or ():
            rule = Rule.parse(raw, source)
            if namespace is not None and rule.non_resource_urls:
                continue  # nonResourceURLs mean nothing in a namespace
            grants.append(Grant(rule, namespace))
    return Policy(user, tuple(grants))


RBAC_API = "/apis/rbac.authorization.k8s.io/v1"


@dataclass(frozen=True)
class StoredRbac:
    """The emulator's authorizer for one token: the Roles and bindings stored on it, read on every
    request, as a real server authorizes every token (by default the emulator lets any token do anything)."""

    emulator: KubeEmulator
    user: str
    groups: tuple[str, ...]

    def allows(self, attributes: Attributes) -> bool:
        rbac = RbacObjects(
            roles=self.emulator.list_objects("roles.rbac.authorization.k8s.io"),
            cluster_roles=self.emulator.list_objects("clusterroles.rbac.authorization.k8s.io"),
            role_bindings=self.emulator.list_objects("rolebindings.rbac.authorization.k8s.io"),
            cluster_role_bindings=self.emulator.list_objects("clusterrolebindings.rbac.authorization.k8s.io"),
        )
        return rbac.allows(attributes, self.groups)


async def grant_service_account(
    cluster: TestCluster,
    name: str,
    rules: Sequence[Mapping[str, Any]],
    *,
    probe: str,
    namespace: str | None = None,
    probe_answers: Collection[int] = (200,),
) -> str:
    """A ServiceAccount allowed ``rules`` in its namespace (a Role and a RoleBinding); its user name.

    Returns once the server authorizes with the new binding: ``probe``, a path the rules allow,
    answers 200 (or one of ``probe_answers``: 404 for an object ``get`` may read that does not exist)
    to a request impersonating the account (a real server's RBAC cache lags writes).
    """
    namespace = namespace or cluster.namespace
    user = f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"
    metadata = {"name": name, "namespace": namespace}
    subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    manifests = [
        ("/api/v1", "serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata}),
        (
            RBAC_API,
            "roles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": metadata,
                "rules": list(rules),
            },
        ),
        (
            RBAC_API,
            "rolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": metadata,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [subject],
            },
        ),
    ]
    for api, resource, manifest in manifests:
        await cluster.request("POST", f"{api}/namespaces/{namespace}/{resource}", json=manifest)
    await until(
        lambda: cluster.status_of("GET", probe, headers={"Impersonate-User": user}),
        f"{user} to be allowed to GET {probe}",
        30,
        done=lambda answer: answer[0] in probe_answers,
        every=0.2,
    )
    return user


def _helm() -> Path:
    helm = find_tool("helm")
    if helm is None:
        raise AssertionError("helm not found on PATH or in .tools/bin: run `make tools`")
    return helm


def _helm_env(home: str) -> dict[str, str]:
    """helm's own state (cache, config, release data) kept out of $HOME."""
    return {**os.environ, **{f"HELM_{k}_HOME": f"{home}/{k.lower()}" for k in ("CACHE", "CONFIG", "DATA")}}


def render_chart(
    values: Mapping[str, Any], *, release: str = RELEASE, namespace: str = RELEASE_NAMESPACE
) -> list[Any]:
    """`helm template` with the real helm."""
    with tempfile.TemporaryDirectory(prefix="rbac-helm-") as tmp:
        values_file = Path(tmp) / "values.yaml"
        values_file.write_text(yaml.safe_dump(dict(values)))
        proc = subprocess.run(
            [
                str(_helm()),
                "template",
                release,
                str(CHART),
                "--namespace",
                namespace,
                "--values",
                str(values_file),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=_helm_env(tmp),
            check=False,
        )
    if proc.returncode != 0:
        raise AssertionError(f"helm template failed:\n{proc.stderr}")
    return list(yaml.safe_load_all(proc.stdout))


def chart_values(
    scope: str = "cluster", namespaces: Sequence[str] = (), values: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The chart's values for RBAC ``scope`` "cluster" or "namespaces" (watching ``namespaces``)."""
    all_values: dict[str, Any] = {"rbac": {"scope": scope}, **(values or {})}
    if scope == "namespaces":
        all_values["watchNamespaces"] = list(namespaces)
    return all_values


def chart_policy(
    scope: str = "cluster",
    namespaces: Sequence[str] = (),
    values: Mapping[str, Any] | None = None,
    *,
    release: str = RELEASE,
    release_namespace: str = RELEASE_NAMESPACE,
) -> Policy:
    """The effective rules of the operator's ServiceAccount (the one the chart renders) in ``scope``."""
    manifests = render_chart(
        chart_values(scope, namespaces, values), release=release, namespace=release_namespace
    )
    [account] = [m["metadata"]["name"] for m in manifests if m and m["kind"] == "ServiceAccount"]
    return policy_from_manifests(manifests, f"{SERVICE_ACCOUNT_PREFIX}{release_namespace}:{account}")


async def _helm_run(kubeconfig: Path, home: str, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(_helm()),
        *args,
        "--kubeconfig",
        str(kubeconfig),
        env=_helm_env(home),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    if proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{out.decode()}")
    return out.decode()


@contextlib.asynccontextmanager
async def installed_chart(
    kubeconfig: Path, release: str, namespace: str, values: Mapping[str, Any]
) -> AsyncIterator[None]:
    """`helm install` of the chart (CRDs left alone: the session applied them) until the block exits,
    then `helm uninstall`, which also deletes its cluster-scoped ClusterRoles and bindings."""
    with tempfile.TemporaryDirectory(prefix="rbac-helm-") as home:
        values_file = Path(home) / "values.yaml"
        values_file.write_text(yaml.safe_dump(dict(values)))
        chart = ("install", release, str(CHART), "--namespace", namespace, "--skip-crds")
        await _helm_run(kubeconfig, home, *chart, "--values", str(values_file))
        try:
            yield
        finally:
            await _helm_run(kubeconfig, home, "uninstall", release, "--namespace", namespace, "--wait")


# --- the session-wide record ------------------------------------------------------------------------

#: User agents of the operator's own clients: Kopf, and the operator's Kubernetes client.
OPERATOR_AGENTS = ("kopf/", "agentrun-operator/")
#: The web console (agentrun/console): its requests are people's, impersonated or with their own tokens.
CONSOLE_AGENT = "agentrun-console/"


def is_operator_request(record: RequestRecord) -> bool:
    """Operator traffic in tests where operator and test clients share a token: Kopf, the
    operator's Kubernetes client, and the Kubernetes tools (the only ones impersonating)."""
    agent = record.user_agent or ""
    if agent.startswith(CONSOLE_AGENT):
        return False
    return record.impersonate_user is not None or agent.startswith(OPERATOR_AGENTS)


#: Chart values that turn on what some integration tests run the operator with and the chart grants only
#: when asked (the quota ledgers in PostgreSQL patch the quotas' status). The self-contained coverage
#: test (test_rbac_coverage.py) holds the default values to exactly what they need.
OPTIONAL_FEATURES: Mapping[str, Any] = {
    "operator": {"quotaLedger": "postgres"},
    "database": {"existingSecret": "agentrun-database"},
}


@dataclass
class SessionRecord:
    """The operator's authorization questions over every emulator of a test session, deduplicated.

    Install with `EmulatedCluster.stopped_hooks.append(record.collect)`; it keeps only small frozen
    Attributes, never the emulators. Request bodies are not logged, so the owner-reference admission
    check is left to the self-contained coverage test.

    Each emulator's operator ran in one mode: cluster-wide when it watched AgentRuns across all
    namespaces, else for a list of namespaces. Namespaced questions must be allowed by the chart in
    both scopes (with every namespace the tests used listed); cluster-scoped ones (CRDs, the
    namespace watch of a namespaced operator) by the scope the operator ran in.
    """

    #: (question, scope the operator ran in) -> one example "METHOD path"
    questions: dict[tuple[Attributes, str], str] = field(default_factory=dict)

    def collect(self, kube: EmulatedCluster) -> None:
        records = [r for r in kube.emulator.request_log if is_operator_request(r)]
        cluster_wide = any(
            r.resource == "agentruns" and r.namespace is None and r.verb in ("list", "watch") for r in records
        )
        scope = "cluster" if cluster_wide else "namespaces"
        for record in records:
            for question in attributes_of(record, OPERATOR_USER):
                self.questions.setdefault((question, scope), f"{record.method} {record.path}")

    def refusals(self) -> list[str]:
        """Every question the chart answers with no, with the scope that refused it."""
        if not self.questions:
            return []
        namespaces = sorted({q.namespace for q, _ in self.questions if q.namespace}) or ["default"]
        policies = {
            "cluster": chart_policy("cluster", values=OPTIONAL_FEATURES),
            "namespaces": chart_policy("namespaces", namespaces, values=OPTIONAL_FEATURES),
        }
        refused = set()
        for (question, ran_in), example in self.questions.items():
            if question.resource == "leases" and question.namespace:
                # The replicas' Leases live in the chart's release namespace; a test's lease namespace
                # (AGENTRUN_LEASE_NAMESPACE) stands for it.
                question = dataclasses.replace(question, namespace=RELEASE_NAMESPACE)
            scopes = policies if question.namespace else {ran_in: policies[ran_in]}
            for scope, policy in scopes.items():
                if not policy.would_allow(question):
                    refused.add(f"[{scope}] {example}: {question.describe()}")
        return sorted(refused)
