"""From an HTTP request to the layer that answers it: parsing, the request log, faults, kmock's DSL."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping

import aiohttp.web
import attrs
import kmock

from agentrun_sandbox.kube import tables
from agentrun_sandbox.kube.authz import identify
from agentrun_sandbox.kube.basics import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    Reply,
    header_value,
    include_object,
)
from agentrun_sandbox.kube.discovery import EmulatorDiscovery
from agentrun_sandbox.kube.http import (
    ApiError,
    RequestRecord,
    decode_body,
    parse_path,
    rbac_verb,
    status_body,
)
from agentrun_sandbox.kube.registry import ResourceType
from agentrun_sandbox.kube.selectors import SelectorError
from agentrun_sandbox.kube.watch import WatchPlan

MAX_REQUEST_BYTES = 3 * 1024 * 1024
_SELF_SUBJECT_REVIEWS = ("authentication.k8s.io", "selfsubjectreviews")
_SELF_SUBJECT_ACCESS_REVIEWS = ("authorization.k8s.io", "selfsubjectaccessreviews")
_ACTIONS = {
    "get": kmock.action.FETCH,
    "list": kmock.action.LIST,
    "watch": kmock.action.WATCH,
    "create": kmock.action.CREATE,
    "patch": kmock.action.UPDATE,
    "delete": kmock.action.DELETE,
}

logger = logging.getLogger("agentrun_sandbox.kube.emulator")


@attrs.define(kw_only=True)
class EmulatorRouting(EmulatorDiscovery):
    """The aiohttp handler: every Kubernetes request is routed and answered here."""

    #: Requests kept in kmock's own list for its DSL assertions; each holds the raw request (~8 KiB).
    kmock_request_limit: int | None = 2_000
    _served: int = attrs.field(default=0, init=False)

    # ----------------------------------------------------------------------------------------------------
    # HTTP entry

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Parse requests ourselves: kmock's URL parser fails on some valid paths (``/api/v1/namespaces``).

        Unexpected exceptions (emulator bugs) are answered with a 500 and, inside ``async with``, kept in
        ``errors`` (re-raised on exit when ``strict``), as kmock does.
        """
        try:
            self._served += 1
            if self.limit is not None and self._served > self.limit:
                raise RuntimeError("Too many requests have been served so far.")
            # The real API server reads bodies up to 3 MiB and answers 413 beyond; aiohttp stops at 1 MiB.
            raw_request = raw_request.clone(client_max_size=MAX_REQUEST_BYTES)
            try:
                request = await self._parse_request(raw_request)
            except aiohttp.web.HTTPRequestEntityTooLarge:
                message = f"Request entity too large: limit is {MAX_REQUEST_BYTES}"
                return aiohttp.web.json_response(
                    status_body(413, "RequestEntityTooLarge", message), status=413
                )
            self._requests.append(request)
            return await self._handle(request)
        except Exception as exc:
            if not self._errors:
                raise
            self._errors[-1].append(exc)
            logger.exception("kube emulator: internal error on %s %s", raw_request.method, raw_request.path)
            return await self._render_error(exc)

    async def _parse_request(self, raw: aiohttp.web.BaseRequest) -> kmock.Request:
        body = await raw.read()
        text = body.decode("utf-8", errors="replace")
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        route = parse_path(raw.path)
        query = dict(raw.query)
        resource = None
        if route.kind == "resource":
            key = (route.group or "", route.version or "", route.plural or "")
            resource = self._kmock_resources.get(key) or self._kmock_resources.setdefault(
                key, kmock.resource(*key)
            )
        verb = rbac_verb(raw.method, route, query)
        action = _ACTIONS.get(verb) if route.kind == "resource" else None
        return kmock.Request(
            id=self._served - 1,
            raw_request=raw,
            method=raw.method,
            url=raw.url,
            params=query,
            headers=dict(raw.headers),
            cookies=dict(raw.cookies),
            body=body,
            text=text,
            data=data,
            action=action,
            resource=resource,
            namespace=route.namespace,
            name=route.name,
            subresource=route.subresource,
        )

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        record = self._record(request)
        if self.authorizers and (denied := self._authorize(record, request.data)) is not None:
            return self._respond(record, Reply(denied.code, denied.body()))
        impersonated = self.authorize_impersonated_users and record.impersonate_user
        if impersonated and (denied := self._authorize_as_target(record, request.data)) is not None:
            return self._respond(record, Reply(denied.code, denied.body()))
        fault = self.faults.take_fault(record)
        if fault is not None:
            if fault.delay:
                await asyncio.sleep(fault.delay)
            if fault.status is not None:
                headers = {"Retry-After": str(max(1, int(fault.retry_after)))} if fault.retry_after else {}
                return self._respond(record, Reply(fault.status, fault.status_body(), headers=headers))
        if self._payloads:  # user-defined kmock reactions first (they are slow: kmock scans all requests)
            try:
                response = await super(kmock.KubernetesScaffold, self)._handle(request)
            except NotImplementedError:
                pass
            else:
                record.status = response.status
                return response
        try:
            body = request.body
            result = self._serve(record, body, request.headers)
        except ApiError as exc:
            result = Reply(exc.code, exc.body(), headers=exc.headers)
        except SelectorError as exc:
            result = Reply(400, status_body(400, "BadRequest", str(exc)))
        if isinstance(result, WatchPlan):
            return await self._stream(request, record, result)
        return self._respond(record, result)

    def _record(self, request: kmock.Request) -> RequestRecord:
        raw = request._raw_request
        headers: Mapping[str, str] = raw.headers if raw is not None else request.headers
        path = request.url.path
        query = dict(request.params)
        route = parse_path(path)
        groups: list[str] = list(raw.headers.getall("Impersonate-Group", [])) if raw is not None else []
        record = RequestRecord(
            method=request.method.value.upper(),
            path=path,
            query=query,
            verb=rbac_verb(request.method.value, route, query),
            group=route.group if route.kind == "resource" else None,
            version=route.version if route.kind == "resource" else None,
            resource=route.plural,
            subresource=route.subresource,
            namespace=route.namespace,
            name=route.name,
            content_type=header_value(headers, "Content-Type"),
            impersonate_user=header_value(headers, "Impersonate-User"),
            impersonate_groups=tuple(groups),
            authorization=header_value(headers, "Authorization"),
            user_agent=header_value(headers, "User-Agent"),
            route=route,
        )
        self.request_log.append(record)
        # Trim in chunks: deleting from the head of a list is linear in its length.
        if self.request_log_limit is not None and len(self.request_log) > self.request_log_limit * 1.1 + 10:
            del self.request_log[: len(self.request_log) - self.request_log_limit]
        if self.kmock_request_limit is not None and len(self._requests) > self.kmock_request_limit * 1.1 + 10:
            del self._requests[: len(self._requests) - self.kmock_request_limit]
        return record

    def _respond(self, record: RequestRecord, reply: Reply) -> aiohttp.web.Response:
        record.status = reply.status
        if reply.text is not None:
            response = aiohttp.web.Response(status=reply.status, text=reply.text, content_type="text/plain")
        else:
            body = json.dumps(reply.body, separators=(",", ":")).encode()
            response = aiohttp.web.Response(status=reply.status, body=body, content_type="application/json")
        for name, value in reply.headers.items():
            response.headers[name] = value
        for warning in reply.warnings:
            response.headers.add("Warning", f"299 - {json.dumps(warning)}")
        if reply.status >= 400:
            logger.debug(
                "kube emulator: %s %s -> %s %s", record.method, record.path, reply.status, reply.body
            )
        return response

    def _serve(self, record: RequestRecord, body: bytes, headers: Mapping[str, str]) -> Reply | WatchPlan:
        route = record.route
        if route.kind == "other":
            return self._serve_other(route, record)
        if route.kind == "discovery":
            return self._serve_discovery(route)
        rtype = self._types.get((route.group or "", route.version or "", route.plural or ""))
        if rtype is None or not rtype.served:
            raise ApiError.no_route()
        if route.namespace is not None and not rtype.namespaced:
            raise ApiError.no_route()
        if rtype.namespaced and route.namespace is None and record.verb not in ("list", "watch"):
            raise ApiError.no_route()
        sub = route.subresource
        if sub is not None and sub not in rtype.subresources:
            raise ApiError.no_route()
        verb = record.verb
        query = record.query
        accept = header_value(headers, "Accept")
        content_type = header_value(headers, "Content-Type")
        allowed = {
            "status": {"get", "update", "patch"},
            "log": {"get"},
            "finalize": {"update"},
            "exec": {"get", "create"},  # a websocket upgrade (GET) or SPDY (POST)
        }
        if (sub is not None and verb not in allowed.get(sub, set())) or verb not in rtype.verbs:
            raise ApiError.method_not_allowed()
        namespace, name = route.namespace, route.name
        user = identify(record, self.identities, self.authorizers)
        if rtype.key == _SELF_SUBJECT_REVIEWS:
            return self._self_subject_review(rtype, user)  # any body: nothing in it matters
        if rtype.key == _SELF_SUBJECT_ACCESS_REVIEWS:
            return self._self_subject_access_review(rtype, record, decode_body(body, content_type))
        match verb:
            case "get" | "create" if sub == "exec":
                return self._serve_exec(namespace or "", name or "", query)
            case "get" if sub == "log":
                return self._serve_log(namespace or "", name or "", query)
            case "get":
                obj = self._get(rtype, namespace, name or "")
                if tables.wants_table(accept):
                    return Reply(
                        200,
                        tables.as_table(rtype, [obj], str(self._rv), include_object=include_object(query)),
                    )
                if tables.wants_metadata(accept):
                    return Reply(200, tables.as_metadata(obj))
                return Reply(200, obj)
            case "list":
                return self._op_list(rtype, namespace, query, table=tables.wants_table(accept))
            case "watch":
                return self._plan_watch(rtype, namespace, name, query, table=tables.wants_table(accept))
            case "create":
                if name is not None:
                    raise ApiError.method_not_allowed()
                return self._op_create(rtype, namespace, decode_body(body, content_type), query, user)
            case "update":
                return self._op_update(
                    rtype, namespace, name or "", decode_body(body, content_type), sub, query, user
                )
            case "patch":
                patch_type = (content_type or "").split(";")[0].strip().lower()
                accepted = (
                    (MERGE_PATCH, JSON_PATCH, STRATEGIC_MERGE_PATCH)
                    if rtype.strategic_merge
                    else (MERGE_PATCH, JSON_PATCH)
                )
                if patch_type not in accepted:  # server-side apply included
                    raise _unsupported_media(rtype, patch_type)
                return self._op_patch(
                    rtype, namespace, name or "", decode_body(body, None), patch_type, sub, query, user
                )
            case "delete":
                options = decode_body(body, content_type) or {}
                return self._op_delete(
                    rtype, namespace, name or "", options if isinstance(options, dict) else {}, query
                )
            case "deletecollection":
                options = decode_body(body, content_type) or {}
                return self._op_delete_collection(
                    rtype, namespace, options if isinstance(options, dict) else {}, query
                )
        raise ApiError.method_not_allowed()


def _unsupported_media(rtype: ResourceType, patch_type: str) -> ApiError:
    accepted = [JSON_PATCH, MERGE_PATCH] + ([STRATEGIC_MERGE_PATCH] if rtype.strategic_merge else [])
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
    )
