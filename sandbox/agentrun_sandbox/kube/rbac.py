"""RBAC rules evaluated the way kube-apiserver's RBAC authorizer does, over Roles and their bindings.

Two users: the emulator authorizes impersonated requests as their target against the Roles,
ClusterRoles and bindings stored in it (``KubeEmulator.authorize_impersonated_users``), and the
tests' chart checker evaluates the rules `helm template` renders. Both need the same semantics
(``pkg/registry/rbac/validation`` and ``plugin/pkg/auth/authorizer/rbac``):

* a rule matches when its verbs, apiGroups, resources and resourceNames all match; ``*`` matches any
  verb, group or resource, ``*/sub`` any resource's subresource ``sub``; a rule with resourceNames
  never matches a request without a name (list, watch, create, deletecollection);
* nonResourceURLs match exact paths or, ending in ``*``, prefixes; they only count in ClusterRoles
  bound by a ClusterRoleBinding;
* a ClusterRoleBinding grants its rules everywhere; a RoleBinding (to a Role of its namespace or to a
  ClusterRole) only inside its own namespace;
* subjects match by ServiceAccount, User or Group; a service account is in the groups
  ``system:serviceaccounts``, ``system:serviceaccounts:NS`` and every identity but anonymous is in
  ``system:authenticated``.

Every cluster binds a few bootstrap ClusterRoles to ``system:authenticated`` (discovery, ``/version``,
self reviews); :data:`BOOTSTRAP_RULES` stands for them. Aggregated ClusterRoles are not expanded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun_sandbox.kube.authz import (
    AUTHENTICATED,
    SERVICE_ACCOUNT_PREFIX,
    Attributes,
    service_account_groups,
)


@dataclass(frozen=True)
class PolicyRule:
    """One rule of a Role or ClusterRole."""

    verbs: tuple[str, ...]
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()

    @staticmethod
    def fields_of(rule: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
        """The constructor's keyword arguments from a rule as written in a manifest."""
        return {
            "verbs": tuple(rule.get("verbs") or ()),
            "api_groups": tuple(rule.get("apiGroups") or ()),
            "resources": tuple(rule.get("resources") or ()),
            "resource_names": tuple(rule.get("resourceNames") or ()),
            "non_resource_urls": tuple(rule.get("nonResourceURLs") or ()),
        }

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


#: What every authenticated identity may do in a fresh cluster (system:discovery,
#: system:public-info-viewer and system:basic-user, bound to system:authenticated).
BOOTSTRAP_RULES = (
    PolicyRule(
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
    ),
    PolicyRule(
        ("create",), ("authorization.k8s.io",), ("selfsubjectaccessreviews", "selfsubjectrulesreviews")
    ),
    PolicyRule(("create",), ("authentication.k8s.io",), ("selfsubjectreviews",)),
)


def groups_of(user: str, groups: Iterable[str] = ()) -> tuple[str, ...]:
    """The groups the server puts ``user`` in, besides ``groups`` it was given."""
    found = [*groups, *service_account_groups(user)]
    if user != "system:anonymous":
        found.append(AUTHENTICATED)
    return tuple(dict.fromkeys(found))


def subject_matches(subject: Mapping[str, Any], user: str, groups: Sequence[str]) -> bool:
    """Whether a binding's subject names ``user`` (a ServiceAccount or User) or one of its ``groups``."""
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return user == f"{SERVICE_ACCOUNT_PREFIX}{subject.get('namespace')}:{name}"
    if kind == "User":
        return user == name
    if kind == "Group":
        return name in groups
    return False


@dataclass(frozen=True)
class RbacObjects:
    """Roles, ClusterRoles and their bindings, as stored (dicts in their API shape)."""

    roles: Sequence[Mapping[str, Any]] = ()
    cluster_roles: Sequence[Mapping[str, Any]] = ()
    role_bindings: Sequence[Mapping[str, Any]] = ()
    cluster_role_bindings: Sequence[Mapping[str, Any]] = ()

    def allows(self, attributes: Attributes, groups: Sequence[str]) -> bool:
        """The RBAC authorizer's answer for ``attributes`` asked by a user in ``groups``."""
        if any(rule.matches(attributes) for rule in BOOTSTRAP_RULES):
            return True
        cluster_roles = {_name(role): role for role in self.cluster_roles}
        for binding in self.cluster_role_bindings:
            if self._binds(binding, attributes.user, groups):
                role = cluster_roles.get(binding.get("roleRef", {}).get("name", ""))
                if role is not None and _any_rule_matches(role, attributes):
                    return True
        if not attributes.resource_request or not attributes.namespace:
            return False
        roles = {_name(role): role for role in self.roles if _namespace(role) == attributes.namespace}
        for binding in self.role_bindings:
            if _namespace(binding) != attributes.namespace or not self._binds(
                binding, attributes.user, groups
            ):
                continue
            ref = binding.get("roleRef", {})
            table = cluster_roles if ref.get("kind") == "ClusterRole" else roles
            role = table.get(ref.get("name", ""))
            if role is not None and _any_rule_matches(role, attributes, namespaced=True):
                return True
        return False

    @staticmethod
    def _binds(binding: Mapping[str, Any], user: str, groups: Sequence[str]) -> bool:
        return any(subject_matches(subject, user, groups) for subject in binding.get("subjects") or ())


def _any_rule_matches(role: Mapping[str, Any], attributes: Attributes, *, namespaced: bool = False) -> bool:
    for raw in role.get("rules") or ():
        rule = PolicyRule(**PolicyRule.fields_of(raw))
        if namespaced and rule.non_resource_urls:
            continue  # nonResourceURLs mean nothing in a namespace
        if rule.matches(attributes):
            return True
    return False


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _namespace(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace", ""))
