"""Who is asking and what they may do: authorizers per token, impersonation, stored RBAC, whoami."""

from __future__ import annotations

from typing import Any

import attrs

from agentrun_sandbox.kube.authz import (
    Attributes,
    Authorizer,
    Decision,
    UserInfo,
    attributes_of,
    constrained_impersonation,
    forbidden,
    identify,
    own_attributes,
)
from agentrun_sandbox.kube.basics import Reply, now
from agentrun_sandbox.kube.http import ApiError, RequestRecord
from agentrun_sandbox.kube.rbac import RbacObjects
from agentrun_sandbox.kube.registry import ResourceType
from agentrun_sandbox.kube.watch import EmulatorWatch


@attrs.define(kw_only=True)
class EmulatorAccess(EmulatorWatch):
    """Authorization of requests, and the record of who asked for what."""

    #: Records kept in :attr:`request_log` (None: unbounded; a record is small).
    request_log_limit: int | None = None
    request_log: list[RequestRecord] = attrs.field(factory=list)
    #: Optional authorization (see :mod:`agentrun_sandbox.kube.authz`): requests whose bearer token is a
    #: key here are checked by its authorizer and refused with 403; every other request is allowed.
    authorizers: dict[str, Authorizer] = attrs.field(factory=dict)
    #: One entry per request checked by an authorizer, allowed or not (bounded like request_log).
    decisions: list[Decision] = attrs.field(factory=list)
    #: Who a bearer token authenticates as (``request.userInfo`` of admission policies, SelfSubjectReview).
    #: Tokens not listed here act as their authorizer's user, else as ``kube-emulator`` (the admin).
    identities: dict[str, UserInfo] = attrs.field(factory=dict)
    #: Authorize impersonated requests as their target, with the Roles, ClusterRoles and bindings stored
    #: here (:mod:`agentrun_sandbox.kube.rbac`), as a real server does. Off by default: tests of the
    #: Kubernetes tools impersonate service accounts they grant nothing.
    authorize_impersonated_users: bool = False
    #: The impersonation mode that last worked, by impersonator: the server tries it first next time.
    _impersonation_modes: dict[str, str] = attrs.field(factory=dict, init=False)

    def rbac_usage(self) -> set[tuple[str, str, str]]:
        """Every ``(apiGroup, resource[/subresource], verb)`` requested so far."""
        return {key for record in self.request_log if (key := record.rbac_key) is not None}

    def _authorize(self, record: RequestRecord, body: Any) -> ApiError | None:
        """The 403 for a request its token's authorizer refuses; None when allowed or unrestricted."""
        token = (record.authorization or "").removeprefix("Bearer ").strip()
        authorizer = self.authorizers.get(token)
        if authorizer is None:
            return None
        checks = attributes_of(record, authorizer.user, body, self._resolve_kind)
        if record.impersonate_user:
            return self._authorize_impersonation(record, authorizer, checks)
        refused = next((check for check in checks if not authorizer.allows(check)), None)
        self._decided(Decision(record, tuple(checks), refused is None))
        return forbidden(refused) if refused is not None else None

    def _authorize_impersonation(
        self, record: RequestRecord, authorizer: Authorizer, legacy: list[Attributes]
    ) -> ApiError | None:
        """Legacy or constrained impersonation, in the order kube-apiserver v1.36 tries them."""
        modes = {**constrained_impersonation(record, authorizer.user), "legacy": legacy}
        remembered = self._impersonation_modes.get(authorizer.user)
        order = sorted(modes, key=lambda mode: mode != remembered)  # stable: constrained before legacy
        asked: list[Attributes] = []
        first_refusal: Attributes | None = None
        for mode in order:
            refused = None
            for check in modes[mode]:
                asked.append(check)
                if not authorizer.allows(check):
                    refused = check
                    break
            if refused is None:
                self._impersonation_modes[authorizer.user] = mode
                self._decided(Decision(record, tuple(asked), True))
                return None
            first_refusal = first_refusal or refused
        self._decided(Decision(record, tuple(asked), False))
        assert first_refusal is not None
        return forbidden(first_refusal)

    def _decided(self, decision: Decision) -> None:
        self.decisions.append(decision)
        if self.request_log_limit is not None and len(self.decisions) > self.request_log_limit * 1.1 + 10:
            del self.decisions[: len(self.decisions) - self.request_log_limit]

    def _authorize_as_target(self, record: RequestRecord, body: Any) -> ApiError | None:
        """The 403 for an impersonated request its target's stored RBAC does not allow."""
        target = identify(record, self.identities, self.authorizers)
        rbac = self._stored_rbac()
        for check in own_attributes(record, target.username, body, self._resolve_kind):
            if not rbac.allows(check, target.groups):
                return forbidden(check)
        return None

    def _resolve_kind(self, api_version: str, kind: str) -> tuple[str, str] | None:
        group = api_version.rpartition("/")[0]
        for rtype in self._types.values():
            if rtype.group == group and rtype.kind == kind:
                return rtype.group, rtype.plural
        return None

    def _stored_rbac(self) -> RbacObjects:
        return RbacObjects(
            roles=self.list_objects("roles.rbac.authorization.k8s.io"),
            cluster_roles=self.list_objects("clusterroles.rbac.authorization.k8s.io"),
            role_bindings=self.list_objects("rolebindings.rbac.authorization.k8s.io"),
            cluster_role_bindings=self.list_objects("clusterrolebindings.rbac.authorization.k8s.io"),
        )

    def _self_subject_access_review(self, rtype: ResourceType, record: RequestRecord, body: Any) -> Reply:
        """``kubectl auth can-i``: whether the request's own token may do what the spec asks.

        Answered by the token's authorizer, as every other request of that token is; a token without
        one is unrestricted (the emulator's admin), so the answer is yes. Nothing is stored.
        """
        spec = body.get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict) or not (
            spec.get("resourceAttributes") or spec.get("nonResourceAttributes")
        ):
            raise ApiError(
                422,
                "Invalid",
                f'{rtype.kind}.authorization.k8s.io "" is invalid: spec.resourceAttributes: Invalid value: '
                '"null": exactly one of nonResourceAttributes or resourceAttributes must be specified',
            )
        authorizer = self.authorizers.get((record.authorization or "").removeprefix("Bearer ").strip())
        allowed = True
        if record.impersonate_user and self.authorize_impersonated_users:
            # Asked while impersonating: answered for the impersonated identity, as a real server does.
            target = identify(record, self.identities, self.authorizers)
            check = _asked(target.username, spec.get("resourceAttributes") or {})
            allowed = self._stored_rbac().allows(check, target.groups)
        elif authorizer is not None:
            resource = spec.get("resourceAttributes")
            if isinstance(resource, dict):
                check = _asked(authorizer.user, resource)
            else:
                path = spec["nonResourceAttributes"]
                check = Attributes(
                    user=authorizer.user,
                    verb=str(path.get("verb") or ""),
                    resource_request=False,
                    path=str(path.get("path") or ""),
                )
            allowed = authorizer.allows(check)
        status: dict[str, Any] = {"allowed": allowed}  # RBAC gives no reason when no rule matched
        review = {
            "kind": rtype.kind,
            "apiVersion": rtype.api_version,
            "metadata": {},
            "spec": spec,
            "status": status,
        }
        return Reply(201, review)

    def _self_subject_review(self, rtype: ResourceType, user: UserInfo) -> Reply:
        """``kubectl auth whoami``: who the request authenticated as; nothing is stored."""
        review = {
            "kind": rtype.kind,
            "apiVersion": rtype.api_version,
            "metadata": {"creationTimestamp": now()},
            "status": {"userInfo": user.as_dict()},
        }
        return Reply(201, review)


def _asked(user: str, resource: dict[str, Any]) -> Attributes:
    """What a SelfSubjectAccessReview's resourceAttributes ask, for ``user``."""
    return Attributes(
        user=user,
        verb=str(resource.get("verb") or ""),
        resource_request=True,
        api_group=str(resource.get("group") or ""),
        resource=str(resource.get("resource") or ""),
        subresource=str(resource.get("subresource") or ""),
        namespace=str(resource.get("namespace") or ""),
        name=str(resource.get("name") or ""),
    )
