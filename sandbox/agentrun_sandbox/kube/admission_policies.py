"""ValidatingAdmissionPolicy in the Kubernetes API emulator: matching, CEL evaluation and the denial.

kube-apiserver runs ValidatingAdmissionPolicies (``admissionregistration.k8s.io/v1``, GA since 1.30)
after schema validation and before storing a create or update. Clients that write what a policy
refuses must see the same answer from the emulator as from a real server, so this module follows
the server's ``validating`` admission plugin:

* a policy applies through each of its bindings: the policy's ``matchConstraints`` and the binding's
  ``matchResources`` must both match (``resourceRules`` with operations, groups, versions,
  ``resource/subresource`` and ``*`` forms, scope and resourceNames; ``excludeResourceRules``;
  ``namespaceSelector`` on the namespace's labels; ``objectSelector`` on the new or old object's
  labels), then every ``matchConditions`` expression must be true;
* ``variables`` are evaluated lazily, once, and ``validations`` see ``object``, ``oldObject`` (null on
  CREATE), ``request`` (``operation``, ``userInfo``, ``name``, ``namespace``, ``kind``, ``resource``,
  ``subResource``, ``dryRun``), ``namespaceObject``, ``params`` and ``variables``;
* a policy with ``paramKind`` runs once per parameter its binding's ``paramRef`` finds (by ``name``
  or by label ``selector``; a namespaced kind in ``paramRef.namespace``, else in the request's own
  namespace), in name order, with ``params`` bound to it; none found skips the binding under
  ``parameterNotFoundAction: Allow`` and is a configuration error under ``Deny``; a binding without
  ``paramRef`` runs the policy once with ``params`` null; a ``paramKind`` the server does not serve is
  a configuration error of the policy (once any binding names it);
* a false validation denies with its ``messageExpression``, else its ``message``, else ``failed
  expression: ...``; an evaluation error denies under ``failurePolicy: Fail`` and is ignored under
  ``Ignore``; the binding's ``validationActions`` decide between denying (``Deny``), a ``Warning``
  header (``Warn``) and nothing visible (``Audit``);
* the denial is the server's: ``<resource>.<group> "<name>" is forbidden: ValidatingAdmissionPolicy
  '<policy>' with binding '<binding>' denied request: <message>``, with the validation's ``reason``
  (default ``Invalid``) and its status code (403 Forbidden, 401, 413, else 422).

Expressions run in the emulator's CEL subset (:mod:`agentrun_sandbox.kube.cel`); one outside it is
treated like a policy that fails to compile: a configuration error, which denies under
``failurePolicy: Fail``; those of parameters read as the server's (``failed to configure binding:
...``). Not emulated: ``auditAnnotations``, the ``authorizer`` variable, ``matchPolicy: Equivalent``
across versions (one version per resource is served here), the type checking reported in the
policy's status, and the cost limits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun_sandbox.kube import cel as kube_cel
from agentrun_sandbox.kube.authz import UserInfo
from agentrun_sandbox.kube.http import ApiError
from agentrun_sandbox.kube.schema import FieldError
from agentrun_sandbox.kube.selectors import Requirement

logger = logging.getLogger(__name__)

POLICIES = ("admissionregistration.k8s.io", "validatingadmissionpolicies")
BINDINGS = ("admissionregistration.k8s.io", "validatingadmissionpolicybindings")
#: What a policy's expressions may name.
ROOTS = frozenset({"object", "oldObject", "request", "namespaceObject", "variables", "params"})
_CODES = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413, "Invalid": 422}
_OPERATORS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}


@dataclass(frozen=True)
class AdmissionRequest:
    """One create or update as admission sees it (after defaulting and schema validation)."""

    operation: str  # CREATE or UPDATE
    group: str
    version: str
    resource: str
    subresource: str
    kind: str
    namespaced: bool
    namespace: str | None
    name: str
    obj: Mapping[str, Any]
    old: Mapping[str, Any] | None
    user: UserInfo
    namespace_object: Mapping[str, Any] | None = None
    dry_run: bool = False

    @property
    def qualified_resource(self) -> str:
        """``GroupResource.String()``: how the denial names the resource (no subresource)."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def cel_request(self) -> dict[str, Any]:
        """The ``request`` variable (admission.k8s.io AdmissionRequest fields)."""
        kind = {"group": self.group, "version": self.version, "kind": self.kind}
        resource = {"group": self.group, "version": self.version, "resource": self.resource}
        return {
            "kind": kind,
            "resource": resource,
            "subResource": self.subresource,
            "requestKind": kind,
            "requestResource": resource,
            "requestSubResource": self.subresource,
            "name": self.name,
            "namespace": self.namespace or "",
            "operation": self.operation,
            "userInfo": self.user.as_dict(),
            "dryRun": self.dry_run,
            "options": {},
        }


@dataclass(frozen=True)
class Verdict:
    """What the policies decided: the denial to answer (if any) and ``Warning`` header texts."""

    denial: ApiError | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParamSource:
    """The objects of a policy's ``paramKind``, as the server's informer for it holds them."""

    namespaced: bool
    objects: Sequence[Mapping[str, Any]]


#: (apiVersion, kind) of a ``paramKind`` -> its objects, or None when the server does not serve it.
ParamLookup = Callable[[str, str], ParamSource | None]


def _no_params(api_version: str, kind: str) -> ParamSource | None:
    return None


class _ConfigurationError(Exception):
    """A policy the emulator cannot apply (unsupported CEL, a bad selector); denies under Fail."""


class _BindingError(Exception):
    """The server's ``failed to configure binding``: its parameters cannot be collected."""


# --------------------------------------------------------------------------------------------------------
# Defaults and validation of the policy objects themselves


def default_policy(obj: dict[str, Any]) -> None:
    """The defaults kube-apiserver fills in, so clients read back what a real server stores."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("failurePolicy", "Fail")
    constraints = spec.get("matchConstraints")
    if isinstance(constraints, dict):
        _default_match_resources(constraints)


def default_binding(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("matchResources"), dict):
        _default_match_resources(spec["matchResources"])


def _default_match_resources(match: dict[str, Any]) -> None:
    match.setdefault("namespaceSelector", {})
    match.setdefault("objectSelector", {})
    match.setdefault("matchPolicy", "Equivalent")
    for key in ("resourceRules", "excludeResourceRules"):
        for rule in match.get(key) or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def policy_problems(obj: Mapping[str, Any]) -> list[FieldError]:
    """The required fields the server checks (a useful subset of its validation), same wording."""
    spec = _spec(obj)
    errors: list[FieldError] = []
    constraints = spec.get("matchConstraints")
    if not isinstance(constraints, Mapping):
        errors.append(FieldError("FieldValueRequired", "spec.matchConstraints"))
    elif not constraints.get("resourceRules"):
        errors.append(FieldError("FieldValueRequired", "spec.matchConstraints.resourceRules"))
    if not spec.get("validations") and not spec.get("auditAnnotations"):
        detail = "validations or auditAnnotations must contain at least one item"
        errors.append(FieldError("FieldValueRequired", "spec.validations", detail=detail))
        errors.append(FieldError("FieldValueRequired", "spec.auditAnnotations", detail=detail))
    return errors


def binding_problems(obj: Mapping[str, Any]) -> list[FieldError]:
    spec = _spec(obj)
    errors: list[FieldError] = []
    if not spec.get("policyName"):
        errors.append(FieldError("FieldValueRequired", "spec.policyName"))
    if not spec.get("validationActions"):
        detail = "at least one validation action is required"
        errors.append(FieldError("FieldValueRequired", "spec.validationActions", detail=detail))
    ref = spec.get("paramRef")
    if isinstance(ref, Mapping):
        errors += _param_ref_problems(ref)
    return errors


def _param_ref_problems(ref: Mapping[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    if ref.get("name") and ref.get("selector") is not None:
        exclusive = "name and selector are mutually exclusive"
        errors.append(FieldError("FieldValueForbidden", "spec.paramRef.name", detail=exclusive))
        errors.append(FieldError("FieldValueForbidden", "spec.paramRef.selector", detail=exclusive))
    elif not ref.get("name") and ref.get("selector") is None:
        detail = "one of name or selector must be specified"
        errors.append(FieldError("FieldValueRequired", "spec.paramRef", detail=detail))
    action = ref.get("parameterNotFoundAction")
    if action is None:
        errors.append(FieldError("FieldValueRequired", "spec.paramRef.parameterNotFoundAction"))
    elif action not in ("Deny", "Allow"):
        detail = 'supported values: "Deny", "Allow"'
        errors.append(
            FieldError("FieldValueNotSupported", "spec.paramRef.parameterNotFoundAction", action, detail)
        )
    return errors


# --------------------------------------------------------------------------------------------------------
# Matching


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    meta = obj.get("metadata") if obj else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def _selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector object (matchLabels, matchExpressions); empty matches everything."""
    if not isinstance(selector, Mapping):
        return True
    requirements = [Requirement(k, "=", (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()]
    for expression in selector.get("matchExpressions") or []:
        operator = _OPERATORS.get(str(expression.get("operator")))
        if operator is None:
            raise _ConfigurationError(f"unknown label selector operator {expression.get('operator')!r}")
        values = tuple(str(v) for v in expression.get("values") or ())
        requirements.append(Requirement(str(expression.get("key", "")), operator, values))
    return all(requirement.matches(labels) for requirement in requirements)


def _listed(values: Any, value: str) -> bool:
    return isinstance(values, list) and ("*" in values or value in values)


def _rule_matches(rule: Mapping[str, Any], request: AdmissionRequest) -> bool:
    if not (
        _listed(rule.get("operations"), request.operation)
        and _listed(rule.get("apiGroups"), request.group)
        and _listed(rule.get("apiVersions"), request.version)
    ):
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Cluster" and request.namespaced) or (scope == "Namespaced" and not request.namespaced):
        return False
    names = rule.get("resourceNames") or []
    if names and request.name not in names:
        return False
    for entry in rule.get("resources") or []:
        resource, _, subresource = str(entry).partition("/")
        if resource not in ("*", request.resource):
            continue
        if subresource in ("*", request.subresource) if subresource else not request.subresource:
            return True
    return False


def _resources_match(match: Mapping[str, Any], request: AdmissionRequest, *, rules_required: bool) -> bool:
    """matchConstraints (policy) or matchResources (binding; no resourceRules there: no constraint)."""
    rules = match.get("resourceRules") or []
    if (rules or rules_required) and not any(_rule_matches(r, request) for r in rules):
        return False
    if any(_rule_matches(r, request) for r in match.get("excludeResourceRules") or []):
        return False
    if request.kind == "Namespace" and request.group == "" and not request.namespaced:
        namespace_labels: Mapping[str, str] | None = _labels(request.obj)
    elif request.namespaced:
        namespace_labels = _labels(request.namespace_object)
    else:
        namespace_labels = None  # other cluster-scoped objects are never skipped for their namespace
    if namespace_labels is not None and not _selector_matches(
        match.get("namespaceSelector"), namespace_labels
    ):
        return False
    selector = match.get("objectSelector")
    return _selector_matches(selector, _labels(request.obj)) or (
        request.old is not None and _selector_matches(selector, _labels(request.old))
    )


# --------------------------------------------------------------------------------------------------------
# Parameters


def _gvk(param_kind: Mapping[str, Any]) -> str:
    """``schema.GroupVersionKind.String()``: ``group/version, Kind=kind`` (``/v1, ...`` for core)."""
    api_version = str(param_kind.get("apiVersion", ""))
    group, _, version = api_version.rpartition("/")
    return f"{group}/{version}, Kind={param_kind.get('kind', '')}"


def _meta(obj: Mapping[str, Any], key: str) -> str:
    meta = obj.get("metadata")
    return str(meta.get(key) or "") if isinstance(meta, Mapping) else ""


def _binding_params(
    source: ParamSource | None, ref: Any, request: AdmissionRequest
) -> list[Mapping[str, Any] | None]:
    """What the policy runs with through one binding: ``[None]`` without parameters, else those found."""
    if source is None or not isinstance(ref, Mapping):
        return [None]
    candidates = list(source.objects)
    if source.namespaced:
        # A Namespace's own admission attributes carry its name as their namespace.
        own = request.name if (request.group, request.kind) == ("", "Namespace") else None
        namespace = ref.get("namespace") or request.namespace or own
        if not namespace:
            raise _BindingError(
                "cannot use namespaced paramRef in policy binding that matches cluster-scoped resources"
            )
        candidates = [o for o in candidates if _meta(o, "namespace") == namespace]
    if ref.get("name"):
        found = [o for o in candidates if _meta(o, "name") == ref["name"]]
    else:
        found = [o for o in candidates if _selector_matches(ref.get("selector") or {}, _labels(o))]
    if not found and ref.get("parameterNotFoundAction") == "Deny":
        raise _BindingError("no params found for policy binding with `Deny` parameterNotFoundAction")
    found.sort(key=lambda o: (_meta(o, "namespace"), _meta(o, "name")))
    return list(found)


# --------------------------------------------------------------------------------------------------------
# Evaluation


_COMPILED: dict[str, kube_cel.CelExpression | str] = {}


def _compile(source: str) -> kube_cel.CelExpression:
    """Compiled once per source text; an expression outside the subset is a configuration error."""
    if source not in _COMPILED:
        try:
            _COMPILED[source] = kube_cel.compile_expression(source, ROOTS)
        except kube_cel.CelUnsupported as exc:
            _COMPILED[source] = f"the kube emulator cannot evaluate {source!r}: {exc}"
            logger.warning("kube emulator: %s", _COMPILED[source])
    compiled = _COMPILED[source]
    if isinstance(compiled, str):
        raise _ConfigurationError(compiled)
    return compiled


class _Variables(Mapping[str, Any]):
    """``variables``: each evaluated on first use, once; an error is raised again on every use."""

    def __init__(self, declared: Iterable[Mapping[str, Any]], activation: dict[str, Any]) -> None:
        self._sources = {str(v.get("name")): str(v.get("expression", "")) for v in declared}
        self._activation = activation
        self._values: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._sources:
            raise KeyError(name)
        if name not in self._values:
            source = self._sources[name]
            try:
                self._values[name] = _compile(source).evaluate(self._activation)
            except kube_cel.CelEvalError as exc:
                self._values[name] = kube_cel.CelEvalError(f"variable {name!r}: {exc}")
        value = self._values[name]
        if isinstance(value, kube_cel.CelEvalError):
            raise value
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)


def _evaluate(source: str, activation: Mapping[str, Any]) -> Any:
    try:
        return _compile(source).evaluate(activation)
    except kube_cel.CelEvalError as exc:
        raise kube_cel.CelEvalError(f"expression '{source}' resulted in error: {exc}") from None


@dataclass(frozen=True)
class _Decision:
    """A failed validation (or a configuration error) of one policy through one binding."""

    message: str
    reason: str = "Invalid"
    policy: str = ""
    binding: str = ""


def _policy_decisions(
    policy: Mapping[str, Any], request: AdmissionRequest, params: Mapping[str, Any] | None
) -> list[tuple[str, str]]:
    """(message, reason) of every failed validation; raises _ConfigurationError or CelEvalError."""
    spec = policy.get("spec") or {}
    activation: dict[str, Any] = {
        "object": request.obj,
        "oldObject": request.old,
        "request": request.cel_request(),
        "namespaceObject": request.namespace_object,
        "params": params,
    }
    activation["variables"] = _Variables(spec.get("variables") or [], activation)
    for condition in spec.get("matchConditions") or []:
        matched = _evaluate(str(condition.get("expression", "")), activation)
        if matched is False:
            return []
        if matched is not True:
            raise kube_cel.CelEvalError(f"matchCondition {condition.get('name')!r} did not return a bool")
    failed: list[tuple[str, str]] = []
    for validation in spec.get("validations") or []:
        expression = str(validation.get("expression", ""))
        try:
            result = _evaluate(expression, activation)
        except kube_cel.CelEvalError as exc:
            if spec.get("failurePolicy", "Fail") != "Ignore":
                failed.append((str(exc), "Invalid"))  # an error carries no reason of the validation's
            continue
        if result is True:
            continue
        failed.append((_message(validation, activation), str(validation.get("reason") or "Invalid")))
    return failed


def _message(validation: Mapping[str, Any], activation: Mapping[str, Any]) -> str:
    """messageExpression, else message, else the expression (as the server falls back)."""
    if source := validation.get("messageExpression"):
        try:
            text = _compile(str(source)).evaluate(activation)
        except (kube_cel.CelEvalError, _ConfigurationError):
            text = None
        if isinstance(text, str) and text.strip() and "\n" not in text.strip():
            return text.strip()
    if message := str(validation.get("message") or "").strip():
        return message
    return f"failed expression: {str(validation.get('expression', '')).strip()}"


def evaluate(
    policies: Iterable[Mapping[str, Any]],
    bindings: Iterable[Mapping[str, Any]],
    request: AdmissionRequest,
    params: ParamLookup = _no_params,
) -> Verdict:
    """Run every policy that matches ``request`` through each of its matching bindings (and, for a
    policy with ``paramKind``, once per parameter the binding finds through ``params``)."""
    by_policy: dict[str, list[Mapping[str, Any]]] = {}
    for binding in bindings:
        name = str((binding.get("spec") or {}).get("policyName", ""))
        by_policy.setdefault(name, []).append(binding)
    denials: list[_Decision] = []
    warnings: list[str] = []
    for policy in sorted(policies, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        policy_name = str((policy.get("metadata") or {}).get("name", ""))
        spec = policy.get("spec") or {}
        fail_closed = spec.get("failurePolicy", "Fail") != "Ignore"
        try:
            if not _resources_match(spec.get("matchConstraints") or {}, request, rules_required=True):
                continue
        except _ConfigurationError as exc:
            if fail_closed:
                denials.append(_Decision(str(exc), policy=policy_name))
            continue
        bound = sorted(by_policy.get(policy_name, []), key=lambda b: str(b["metadata"]["name"]))
        param_kind = spec.get("paramKind")
        source = None
        if bound and isinstance(param_kind, Mapping):
            source = params(str(param_kind.get("apiVersion", "")), str(param_kind.get("kind", "")))
            if source is None:
                if fail_closed:
                    problem = f"failed to find resource referenced by paramKind: '{_gvk(param_kind)}'"
                    denials.append(_Decision(f"failed to configure policy: {problem}", policy=policy_name))
                continue
        for binding in bound:
            binding_spec = binding.get("spec") or {}
            binding_name = str(binding["metadata"]["name"])
            actions = tuple(str(a) for a in binding_spec.get("validationActions") or ())
            failed: list[tuple[str, str]] = []
            try:
                if not _resources_match(
                    binding_spec.get("matchResources") or {}, request, rules_required=False
                ):
                    continue
                found = _binding_params(source, binding_spec.get("paramRef"), request)
            except _BindingError as exc:
                found = []
                failed = [(f"failed to configure binding: {exc}", "Invalid")] if fail_closed else []
            except _ConfigurationError as exc:
                found = []
                failed = [(str(exc), "Invalid")] if fail_closed else []
            for param in found:
                try:
                    failed += _policy_decisions(policy, request, param)
                except (_ConfigurationError, kube_cel.CelEvalError) as exc:
                    failed += [(str(exc), "Invalid")] if fail_closed else []
            for message, reason in failed:
                if "Deny" in actions:
                    denials.append(_Decision(message, reason, policy_name, binding_name))
                if "Warn" in actions:
                    warnings.append(
                        f"Validation failed for ValidatingAdmissionPolicy '{policy_name}' "
                        f"with binding '{binding_name}': {message}"
                    )
    if not denials:
        return Verdict(warnings=tuple(warnings))
    return Verdict(_denial(denials[0], request), tuple(warnings))


def _denial(decision: _Decision, request: AdmissionRequest) -> ApiError:
    """``admission.NewForbidden`` with the policy's reason and code, as the validating dispatcher does."""
    if decision.binding:
        message = (
            f"ValidatingAdmissionPolicy '{decision.policy}' with binding '{decision.binding}' "
            f"denied request: {decision.message}"
        )
    else:
        message = f"ValidatingAdmissionPolicy '{decision.policy}' denied request: {decision.message}"
    name = request.name
    subject = f'{request.qualified_resource} "{name}"' if name else request.qualified_resource
    details = {
        "name": name,
        "group": request.group,
        "kind": request.resource,
        "causes": [{"message": message}],
    }
    code = _CODES.get(decision.reason, 422)
    return ApiError(code, decision.reason, f"{subject} is forbidden: {message}", details)
