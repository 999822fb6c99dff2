"""Optional authorization in the Kubernetes API emulator: what a request asks the authorizer, and the 403.

By default the emulator allows everything. Given an :class:`Authorizer` for a bearer token, requests that
carry that token are checked the way kube-apiserver checks them, and refused with the server's own
``403 Forbidden`` Status body; requests with any other token (the tests' admin clients) stay
unrestricted. The decision itself (RBAC rule matching) lives with the caller, for example the test
helper that evaluates the Helm chart's Roles; this module only computes the *attributes* each request
is authorized on, which is where most of the Kubernetes-specific subtlety sits:

* the verb (``get``/``list``/``watch``/``create``/``update``/``patch``/``delete``/``deletecollection``)
  and ``resource/subresource``, from :mod:`agentrun_sandbox.kube.http`;
* a request on ``/api/v1/namespaces/NAME`` is authorized *in* namespace NAME (RequestInfo does this);
* non-resource paths (``/api``, ``/apis/...`` discovery, ``/version``) are checked as paths;
* impersonation: ``Impersonate-User``/``Impersonate-Group`` headers are checked first, as the
  ``impersonate`` verb on ``serviceaccounts`` (namespaced, named) for ``system:serviceaccount:NS:NAME``
  users, on ``users`` and ``groups`` otherwise (:func:`attributes_of`). kube-apiserver v1.36 also
  accepts *constrained* impersonation (:func:`constrained_impersonation`): ``impersonate-on:MODE:VERB``
  on the request's own resource, then ``impersonate:MODE`` on the identity in
  ``authentication.k8s.io``. It tries the mode that last worked for the impersonator first, the
  constrained one otherwise, and a refusal names the first mode it tried. The impersonated request
  itself is then made as that identity, authorized by the roles stored in the emulator when
  ``KubeEmulator.authorize_impersonated_users`` is set (:mod:`agentrun_sandbox.kube.rbac`);
* the OwnerReferencesPermissionEnforcement admission plugin: creating or updating an object whose
  ``ownerReferences`` set ``blockOwnerDeletion: true`` also needs ``update`` on the owner's
  ``finalizers`` subresource.

Identities (:func:`identify`) are what admission policies (``request.userInfo``) and
SelfSubjectReviews see: a token registered as an identity, else the user of the token's authorizer,
else the emulator's admin (the emulator authenticates nobody, so unknown tokens act as it); an
``Impersonate-User`` header then replaces it, with the groups kube-apiserver gives impersonated users.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agentrun_sandbox.kube.http import ApiError, RequestRecord

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
AUTHENTICATION = "authentication.k8s.io"
AUTHENTICATED = "system:authenticated"
#: Resolves an ownerReference's (apiVersion, kind) to the owner's (group, plural), if known.
KindResolver = Callable[[str, str], tuple[str, str] | None]


@dataclass(frozen=True)
class Decision:
    """What the authorizer was asked for one request, and whether every answer was yes."""

    record: RequestRecord
    checks: tuple[Attributes, ...]
    allowed: bool


@dataclass(frozen=True)
class Attributes:
    """One authorization question, as authorizer.Attributes in kube-apiserver."""

    user: str
    verb: str
    resource_request: bool
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""
    #: Asked by the handler rather than the authorization filter: a refusal carries no reason (RBAC
    #: gives none when no rule matches; only the filter words one), as ``pods "x" is forbidden: ``.
    by_handler: bool = False

    @property
    def rbac_resource(self) -> str:
        """``resource`` or ``resource/subresource``, as written in a rule."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def describe(self) -> str:
        """The authorizer's wording (``forbiddenMessage`` in apiserver's responsewriters)."""
        if not self.resource_request:
            return f'User "{self.user}" cannot {self.verb} path "{self.path}"'
        where = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        return (
            f'User "{self.user}" cannot {self.verb} resource "{self.rbac_resource}" '
            f'in API group "{self.api_group}" {where}'
        )


@dataclass(frozen=True)
class UserInfo:
    """Who makes a request, as authentication (and impersonation) determine it."""

    username: str
    groups: tuple[str, ...] = (AUTHENTICATED,)

    def as_dict(self) -> dict[str, Any]:
        """The ``userInfo`` of SelfSubjectReview status and of admission requests."""
        return {"username": self.username, "groups": list(self.groups)}


#: The identity of requests whose token the emulator does not know (it authenticates nobody).
EMULATOR_ADMIN = UserInfo("kube-emulator", ("system:masters", AUTHENTICATED))


def service_account_groups(username: str) -> tuple[str, ...]:
    """The groups kube-apiserver puts a service account in (empty for other users)."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX) or username.count(":") != 3:
        return ()
    namespace = username.removeprefix(SERVICE_ACCOUNT_PREFIX).split(":")[0]
    return ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")


def bearer_token(record: RequestRecord) -> str:
    return (record.authorization or "").removeprefix("Bearer ").strip()


def identify(
    record: RequestRecord,
    identities: Mapping[str, UserInfo],
    authorizers: Mapping[str, Authorizer],
    default: UserInfo = EMULATOR_ADMIN,
) -> UserInfo:
    """The user a request acts as, after impersonation (``request.userInfo`` of admission)."""
    token = bearer_token(record)
    user = identities.get(token)
    if user is None and token in authorizers:
        name = authorizers[token].user
        user = UserInfo(name, (*service_account_groups(name), AUTHENTICATED))
    user = user or default
    target = record.impersonate_user
    if not target:
        return user
    # As the impersonation filter: the groups asked for, else a service account's own groups; plus
    # system:authenticated unless it is there already.
    groups = list(record.impersonate_groups) or list(service_account_groups(target))
    if target != "system:anonymous" and AUTHENTICATED not in groups:
        groups.append(AUTHENTICATED)
    return UserInfo(target, tuple(groups))


class Authorizer(Protocol):
    """Decides for one identity; ``user`` is the name put into 403 messages."""

    @property
    def user(self) -> str: ...

    def allows(self, attributes: Attributes) -> bool: ...


def forbidden(attributes: Attributes) -> ApiError:
    """The 403 kube-apiserver answers (``NewForbidden`` with the authorizer's message)."""
    reason = "" if attributes.by_handler else attributes.describe()
    if not attributes.resource_request:
        return ApiError(403, "Forbidden", f"forbidden: {reason}")
    qualified = (
        f"{attributes.resource}.{attributes.api_group}" if attributes.api_group else attributes.resource
    )
    subject = f'{qualified} "{attributes.name}"' if attributes.name else qualified
    details = {"name": attributes.name, "group": attributes.api_group, "kind": attributes.resource}
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {reason}", details)


def _impersonation(record: RequestRecord, user: str) -> list[Attributes]:
    checks: list[Attributes] = []
    target = record.impersonate_user
    if target:
        if target.startswith(SERVICE_ACCOUNT_PREFIX) and target.count(":") == 3:
            namespace, name = target.removeprefix(SERVICE_ACCOUNT_PREFIX).split(":")
            checks.append(Attributes(user, "impersonate", True, "", "serviceaccounts", "", namespace, name))
        else:
            checks.append(Attributes(user, "impersonate", True, "", "users", name=target))
    for group in record.impersonate_groups:
        checks.append(Attributes(user, "impersonate", True, "", "groups", name=group))
    return checks


def _owner_checks(
    record: RequestRecord, user: str, body: Any, resolve_kind: KindResolver
) -> list[Attributes]:
    if record.verb not in ("create", "update", "patch") or not isinstance(body, Mapping):
        return []
    metadata = body.get("metadata")
    owners = metadata.get("ownerReferences") if isinstance(metadata, Mapping) else None
    checks = []
    for owner in owners if isinstance(owners, list) else []:
        if not isinstance(owner, Mapping) or owner.get("blockOwnerDeletion") is not True:
            continue
        resolved = resolve_kind(str(owner.get("apiVersion", "")), str(owner.get("kind", "")))
        if resolved is None:
            continue
        group, plural = resolved
        checks.append(
            Attributes(
                user,
                "update",
                True,
                group,
                plural,
                "finalizers",
                record.namespace or "",
                str(owner.get("name", "")),
            )
        )
    return checks


def constrained_impersonation(record: RequestRecord, user: str) -> dict[str, list[Attributes]]:
    """The questions of constrained impersonation, by mode, for the modes that apply to ``record``.

    A service account without extra groups is the ``serviceaccount`` mode, any other user (with its
    groups) the ``user-info`` mode; a service account with extra groups can only be impersonated the
    legacy way. The first question is always ``impersonate-on:MODE:VERB`` on what the request touches.
    """
    target = record.impersonate_user
    if not target:
        return {}
    own = own_attributes(record, user)[0]
    if target.startswith(SERVICE_ACCOUNT_PREFIX):
        if record.impersonate_groups or target.count(":") != 3:
            return {}
        namespace, name = target.removeprefix(SERVICE_ACCOUNT_PREFIX).split(":")
        identity = [
            Attributes(
                user,
                "impersonate:serviceaccount",
                True,
                AUTHENTICATION,
                "serviceaccounts",
                "",
                namespace,
                name,
            )
        ]
        mode = "serviceaccount"
    else:
        mode = "user-info"
        identity = [Attributes(user, "impersonate:user-info", True, AUTHENTICATION, "users", name=target)]
        identity += [
            Attributes(user, "impersonate:user-info", True, AUTHENTICATION, "groups", name=group)
            for group in record.impersonate_groups
        ]
    on = dataclasses.replace(own, verb=f"impersonate-on:{mode}:{own.verb}")
    return {mode: [on, *identity]}


def own_attributes(
    record: RequestRecord, user: str, body: Any = None, resolve_kind: KindResolver | None = None
) -> list[Attributes]:
    """The questions about the request itself, asked as ``user`` (whoever it impersonates)."""
    if not record.is_resource_request:
        return [Attributes(user, record.verb, False, path=record.path)]
    namespace = record.namespace or ""
    if record.group == "" and record.resource == "namespaces" and record.name and not namespace:
        namespace = record.name
    main = Attributes(
        user,
        record.verb,
        True,
        record.group or "",
        record.resource or "",
        record.subresource or "",
        namespace,
        record.name or "",
    )
    extra = _owner_checks(record, user, body, resolve_kind) if resolve_kind is not None else []
    if (
        record.verb == "get"
        and record.resource == "pods"
        and record.subresource == "exec"
        and not main.api_group
    ):
        # kube-apiserver v1.36 (AuthorizePodWebsocketUpgradeCreatePermission): exec's GET, the websocket
        # upgrade, also needs create, which the handler asks after the filter allowed get.
        extra.append(dataclasses.replace(main, verb="create", by_handler=True))
    return [main, *extra]


def attributes_of(
    record: RequestRecord, user: str, body: Any = None, resolve_kind: KindResolver | None = None
) -> list[Attributes]:
    """Every question the server asks the authorizer before serving ``record`` for ``user``, in order.

    ``body`` is the decoded request body (for the owner-reference admission check). An impersonating
    request is asked about impersonation only (the legacy way; see :func:`constrained_impersonation`).
    """
    return _impersonation(record, user) or own_attributes(record, user, body, resolve_kind)
