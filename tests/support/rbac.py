"""The Helm chart's RBAC as an authorizer: render it with the real helm, evaluate rules as Kubernetes does.

`chart_policy()` runs `helm template` on the chart, keeps the ClusterRoles and Roles bound to the
operator's ServiceAccount (by ClusterRoleBindings and RoleBindings) and returns a `Policy`. A
`Policy` answers the questions of `agentrun.sandbox.kube_authz.Attributes` with the semantics of
kube-apiserver's RBAC authorizer (`pkg/registry/rbac/validation` and `plugin/pkg/auth/authorizer/rbac`):

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

import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentrun.sandbox.kube_api import KubeAPI
from agentrun.sandbox.kube_authz import SERVICE_ACCOUNT_PREFIX, Attributes, attributes_of
from agentrun.sandbox.kube_http import RequestRecord
from tests.chart.tooling import CHART, find_tool

RELEASE = "agentrun-operator"
RELEASE_NAMESPACE = "agentrun-system"
OPERATOR_USER = f"{SERVICE_ACCOUNT_PREFIX}{RELEASE_NAMESPACE}:{RELEASE}"
BOOTSTRAP = "bootstrap"  # source name of the cluster's default roles


@dataclass(frozen=True)
class Rule:
    """One PolicyRule of a (Cluster)Role; ``source`` says where it came from (for messages)."""

    verbs: tuple[str, ...]
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()
    source: str = ""

    @classmethod
    def parse(cls, rule: Mapping[str, Any], source: str) -> Rule:
        return cls(
            verbs=tuple(rule.get("verbs") or ()),
            api_groups=tuple(rule.get("apiGroups") or ()),
            resources=tuple(rule.get("resources") or ()),
            resource_names=tuple(rule.get("resourceNames") or ()),
            non_resource_urls=tuple(rule.get("nonResourceURLs") or ()),
            source=source,
        )

    def matches(self, attributes: Attributes) -> bool:
        if not _verb_matches(self.verbs, attributes.verb):
            return False
        if not attributes.resource_request:
            return any(_url_matches(url, attributes.path) for url in self.non_resource_urls)
        return (
            _group_matches(self.api_groups, attributes.api_group)
            and _resource_matches(self.resources, attributes.rbac_resource, attributes.subresource)
            and (not self.resource_names or attributes.name in self.resource_names)
        )

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


def _verb_matches(verbs: Sequence[str], verb: str) -> bool:
    return "*" in verbs or verb in verbs


def _group_matches(groups: Sequence[str], group: str) -> bool:
    return "*" in groups or group in groups


def _resource_matches(resources: Sequence[str], combined: str, subresource: str) -> bool:
    for resource in resources:
        if resource == "*" or resource == combined:
            return True
        if subresource and resource == f"*/{subresource}":
            return True
    return False


def _url_matches(rule_url: str, path: str) -> bool:
    if rule_url == "*" or rule_url == path:
        return True
    return rule_url.endswith("*") and path.startswith(rule_url[:-1])


#: What every authenticated identity may do in a default cluster (system:discovery,
#: system:public-info-viewer and system:basic-user, bound to system:authenticated).
BOOTSTRAP_RULES = (
    Rule(
        ("get",),
        non_resource_urls=(
            "/api",
            "/api/*",
            "/apis",
            "/apis/*",
            "/healthz",
            "/livez",
            "/readyz",
            "/version",
            "/version/",
            "/openapi",
            "/openapi/*",
        ),
        source=BOOTSTRAP,
    ),
    Rule(
        ("create",),
        ("authorization.k8s.io",),
        ("selfsubjectaccessreviews", "selfsubjectrulesreviews"),
        source=BOOTSTRAP,
    ),
    Rule(("create",), ("authentication.k8s.io",), ("selfsubjectreviews",), source=BOOTSTRAP),
)


@dataclass
class Policy:
    """The rules in effect for one user; an `agentrun.sandbox.kube_authz.Authorizer`."""

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
    kind, name = subject.get("kind"), subject.get("name")
    namespace = subject.get("namespace")
    if kind == "ServiceAccount":
        return user == f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"
    if kind == "User":
        return user == name
    if kind == "Group":
        if name == "system:authenticated":
            return True
        if user.startswith(SERVICE_ACCOUNT_PREFIX):
            sa_namespace = user.removeprefix(SERVICE_ACCOUNT_PREFIX).split(":")[0]
            return name in ("system:serviceaccounts", f"system:serviceaccounts:{sa_namespace}")
    return False


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


def render_chart(
    values: Mapping[str, Any], *, release: str = RELEASE, namespace: str = RELEASE_NAMESPACE
) -> list[Any]:
    """`helm template` with the real helm; helm's own state kept out of $HOME."""
    helm = find_tool("helm")
    if helm is None:
        raise AssertionError("helm not found on PATH or in .tools/bin: run `make tools`")
    with tempfile.TemporaryDirectory(prefix="rbac-helm-") as tmp:
        values_file = Path(tmp) / "values.yaml"
        values_file.write_text(yaml.safe_dump(dict(values)))
        env = {**os.environ, **{f"HELM_{k}_HOME": f"{tmp}/{k.lower()}" for k in ("CACHE", "CONFIG", "DATA")}}
        proc = subprocess.run(
            [
                str(helm),
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
            env=env,
            check=False,
        )
    if proc.returncode != 0:
        raise AssertionError(f"helm template failed:\n{proc.stderr}")
    return list(yaml.safe_load_all(proc.stdout))


def chart_policy(
    scope: str = "cluster", namespaces: Sequence[str] = (), values: Mapping[str, Any] | None = None
) -> Policy:
    """The operator's effective rules from the chart in ``scope`` "cluster" or "namespaces"."""
    all_values: dict[str, Any] = {"rbac": {"scope": scope}, **(values or {})}
    if scope == "namespaces":
        all_values["watchNamespaces"] = list(namespaces)
    return policy_from_manifests(render_chart(all_values), OPERATOR_USER)


# --- the session-wide record ------------------------------------------------------------------------

#: User agents of the operator's own clients: Kopf, and the operator's Kubernetes client.
OPERATOR_AGENTS = ("kopf/", "agentrun-operator/")


def is_operator_request(record: RequestRecord) -> bool:
    """Operator traffic in tests where operator and test clients share a token: Kopf, the
    operator's Kubernetes client, and the Kubernetes tools (the only ones impersonating)."""
    return record.impersonate_user is not None or (record.user_agent or "").startswith(OPERATOR_AGENTS)


@dataclass
class SessionRecord:
    """The operator's authorization questions over every emulator of a test session, deduplicated.

    Install with `KubeAPI.stopped_hooks.append(record.collect)`; it keeps only small frozen
    Attributes, never the emulators. Request bodies are not logged, so the owner-reference admission
    check is left to the self-contained coverage test.

    Each emulator's operator ran in one mode: cluster-wide when it watched AgentRuns across all
    namespaces, else for a list of namespaces. Namespaced questions must be allowed by the chart in
    both scopes (with every namespace the tests used listed); cluster-scoped ones (CRDs, the
    namespace watch of a namespaced operator) by the scope the operator ran in.
    """

    #: (question, scope the operator ran in) -> one example "METHOD path"
    questions: dict[tuple[Attributes, str], str] = field(default_factory=dict)

    def collect(self, kube: KubeAPI) -> None:
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
        policies = {"cluster": chart_policy("cluster"), "namespaces": chart_policy("namespaces", namespaces)}
        refused = set()
        for (question, ran_in), example in self.questions.items():
            scopes = policies if question.namespace else {ran_in: policies[ran_in]}
            for scope, policy in scopes.items():
                if not policy.would_allow(question):
                    refused.add(f"[{scope}] {example}: {question.describe()}")
        return sorted(refused)
