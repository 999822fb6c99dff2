"""Where objects live: the served types, one store per resource, versions and indexes.

Every write goes through :meth:`EmulatorStorage._store` (a new dict under a new ``resourceVersion``, with
the indexes, kmock's ``objects`` view and the watch history kept in step); what a deletion sets in motion
belongs to the layer above (:mod:`agentrun_sandbox.kube.lifecycle`).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import kmock

from agentrun_sandbox.kube import patch as kube_patch
from agentrun_sandbox.kube.basics import ObjKey, StoreKey, metadata_of, owner_uids, sort_key, version_priority
from agentrun_sandbox.kube.http import ApiError
from agentrun_sandbox.kube.registry import ResourceType
from agentrun_sandbox.kube.selectors import FieldSelector, LabelSelector
from agentrun_sandbox.kube.watch_events import StoredEvent, Watcher


@attrs.define(kw_only=True)
class EmulatorStorage(kmock.KubernetesEmulator):
    """Served types and stored objects; the layers above serve requests on them."""

    #: Versions kept per object in ``emulator.objects[...].history`` (None: unbounded).
    history_limit: int | None = 100
    #: Watch events kept per resource for ``resourceVersion`` resumption; older ones answer 410.
    watch_history_limit: int = 10_000
    _types: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False)
    _versions: dict[StoreKey, list[ResourceType]] = attrs.field(factory=dict, init=False)
    _live: dict[StoreKey, dict[ObjKey, dict[str, Any]]] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=0, init=False)
    _history: dict[StoreKey, deque[StoredEvent]] = attrs.field(factory=dict, init=False)
    _compacted: dict[StoreKey, int] = attrs.field(factory=dict, init=False)
    _watchers: dict[StoreKey, set[Watcher]] = attrs.field(factory=dict, init=False)
    _uids: dict[str, tuple[StoreKey, ObjKey]] = attrs.field(factory=dict, init=False)
    _dependents: dict[str, set[tuple[StoreKey, ObjKey]]] = attrs.field(factory=dict, init=False)
    _orphaning: set[str] = attrs.field(factory=set, init=False)
    _ns_counts: Counter[str] = attrs.field(factory=Counter, init=False)
    _pending: set[asyncio.Handle] = attrs.field(factory=set, init=False)
    _kmock_resources: dict[tuple[str, str, str], kmock.resource] = attrs.field(factory=dict, init=False)

    @property
    def open_watches(self) -> int:
        """Watches being served now: a client that hangs up must bring this back down (no leaked streams)."""
        return sum(len(watchers) for watchers in self._watchers.values())

    # Registry

    def add_resource(self, rtype: ResourceType) -> None:
        """Serve a resource type (CRDs do this automatically)."""
        self._types[(rtype.group, rtype.version, rtype.plural)] = rtype
        versions = [t for t in self._versions.get(rtype.key, []) if t.version != rtype.version] + [rtype]
        versions.sort(key=lambda t: (not t.storage, t.preferred_order))
        self._versions[rtype.key] = versions
        self._live.setdefault(rtype.key, {})
        self._history.setdefault(rtype.key, deque())
        self.resources[self._kmock_resource(rtype)] = kmock.ResourceInfo(
            namespaced=rtype.namespaced,
            kind=rtype.kind,
            singular=rtype.singular or rtype.kind.lower(),
            verbs=set(rtype.verbs),
            shortnames=set(rtype.short_names),
            categories=set(rtype.categories),
            subresources=set(rtype.subresources),
        )

    def _remove_resource(self, key: StoreKey) -> None:
        for rtype in self._versions.pop(key, []):
            self._types.pop((rtype.group, rtype.version, rtype.plural), None)
            self.resources.pop(self._kmock_resource(rtype), None)
        for watcher in self._watchers.pop(key, set()):
            watcher.close()
        self._live.pop(key, None)

    def _kmock_resource(self, rtype: ResourceType) -> kmock.resource:
        key = (rtype.group, rtype.version, rtype.plural)
        resource = self._kmock_resources.get(key)
        if resource is None:
            resource = self._kmock_resources[key] = kmock.resource(*key)
        return resource

    def _storage_type(self, key: StoreKey) -> ResourceType:
        return self._versions[key][0]

    @property
    def resource_types(self) -> list[ResourceType]:
        return list(self._types.values())

    def resolve(self, resource: str) -> ResourceType:
        """Find a served type by ``plural``, ``plural.group``, ``group/plural``, ``group/version/plural``,
        ``v1/plural``, a short name or a kind; core types win over same-named ones in other groups."""
        group: str | None = None
        version: str | None = None
        name = resource
        if "/" in resource:
            parts = resource.split("/")
            name = parts[-1]
            if len(parts) == 3:
                group, version = parts[0], parts[1]
            elif re.fullmatch(r"v\d+\w*", parts[0]):
                group, version = "", parts[0]
            else:
                group = parts[0]
        elif "." in resource:
            name, group = resource.split(".", 1)
        lowered = name.lower()
        candidates = [
            t
            for t in self._types.values()
            if (group is None or t.group == group)
            and (version is None or t.version == version)
            and lowered in {t.plural, t.singular, t.kind.lower(), *t.short_names}
        ]
        if not candidates:
            raise KeyError(f"unknown resource: {resource}")
        candidates.sort(key=lambda t: (t.group != "", t.group, not t.storage, version_priority(t.version)))
        return candidates[0]

    def get_object(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        rtype = self.resolve(resource)
        obj = self._live.get(rtype.key, {}).get((namespace if rtype.namespaced else None, name))
        return None if obj is None else dict(kube_patch.clone(self._present(rtype, obj)))

    def list_objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        rtype = self.resolve(resource)
        objs = self._live.get(rtype.key, {})
        return [
            dict(kube_patch.clone(self._present(rtype, o)))
            for k, o in sorted(objs.items(), key=sort_key)
            if namespace in (None, k[0])
        ]

    @property
    def resource_version(self) -> int:
        return self._rv

    def close(self) -> None:
        """End all watch streams (on shutdown), so the HTTP server can stop promptly."""
        for watchers in self._watchers.values():
            for watcher in watchers:
                watcher.close()
        for handle in self._pending:
            handle.cancel()
        self._pending.clear()

    # ----------------------------------------------------------------------------------------------------
    # Reads

    def _present(self, rtype: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Show a stored object as the requested version (conversion strategy None: only apiVersion)."""
        if obj.get("apiVersion") == rtype.api_version:
            return dict(obj)
        return {**obj, "apiVersion": rtype.api_version}

    def _get(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self._live.get(rtype.key, {}).get((namespace, name))
        if obj is None:
            raise ApiError.not_found(rtype.group, rtype.plural, name)
        return self._present(rtype, obj)

    def _field_selector(self, rtype: ResourceType, text: str | None) -> FieldSelector:
        if not rtype.custom:
            return FieldSelector.parse(text)
        allowed = {"metadata.name", "metadata.namespace", *rtype.selectable_fields}
        return FieldSelector.parse(text, allowed)

    def _selected(
        self, rtype: ResourceType, namespace: str | None, query: Mapping[str, str]
    ) -> list[tuple[ObjKey, dict[str, Any]]]:
        labels = LabelSelector.parse(query.get("labelSelector"))
        fields = self._field_selector(rtype, query.get("fieldSelector"))
        items = self._live.get(rtype.key, {})
        selected = [
            (key, obj)
            for key, obj in items.items()
            if (namespace is None or key[0] == namespace)
            and labels.matches(metadata_of(obj).get("labels"))
            and fields.matches(obj)
        ]
        selected.sort(key=sort_key)
        return selected

    # ----------------------------------------------------------------------------------------------------
    # Writes: common machinery

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _emit(
        self, key: StoreKey, kind: str, old: Mapping[str, Any] | None, new: Mapping[str, Any], rv: int
    ) -> None:
        event = StoredEvent(rv, kind, old, new)
        history = self._history[key]
        history.append(event)
        while len(history) > self.watch_history_limit:
            self._compacted[key] = history.popleft().rv
        for watcher in list(self._watchers.get(key, ())):
            watcher.offer(event)

    def _mirror(self, rtype: ResourceType, okey: ObjKey, obj: Mapping[str, Any] | None) -> None:
        """Keep kmock's ``objects`` view (with history) in step, for assertions in tests."""
        storage = self._storage_type(rtype.key)
        key = (self._kmock_resource(storage), okey[0], okey[1])
        if key in self.objects:
            history = self.objects[key].history
            history.append(None if obj is None else dict(obj))
            if self.history_limit is not None and len(history) > self.history_limit:
                del history[: len(history) - self.history_limit]
        elif obj is not None:
            self.objects[key] = dict(obj)

    def _index(
        self, key: StoreKey, okey: ObjKey, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        old_owners = owner_uids(old) if old is not None else set()
        new_owners = owner_uids(new) if new is not None else set()
        for uid in old_owners - new_owners:
            dependents = self._dependents.get(uid)
            if dependents is not None:
                dependents.discard((key, okey))
                if not dependents:
                    del self._dependents[uid]
        for uid in new_owners - old_owners:
            self._dependents.setdefault(uid, set()).add((key, okey))
            if uid not in self._uids:
                self._owner_missing(uid)
        if old is None and new is not None:
            self._uids[metadata_of(new)["uid"]] = (key, okey)
            if okey[0] is not None:
                self._ns_counts[okey[0]] += 1
        elif old is not None and new is None:
            self._uids.pop(metadata_of(old).get("uid", ""), None)
            if okey[0] is not None:
                self._ns_counts[okey[0]] -= 1
                if self._ns_counts[okey[0]] <= 0:
                    del self._ns_counts[okey[0]]

    def _store(
        self, rtype: ResourceType, okey: ObjKey, old: dict[str, Any] | None, new: dict[str, Any]
    ) -> dict[str, Any]:
        """Persist a created or changed object under a new resourceVersion and tell the watchers."""
        storage = self._storage_type(rtype.key)
        new["apiVersion"] = storage.api_version
        rv = self._next_rv()
        new["metadata"]["resourceVersion"] = str(rv)
        self._live[rtype.key][okey] = new
        self._index(rtype.key, okey, old, new)
        self._mirror(rtype, okey, new)
        self._emit(rtype.key, "ADDED" if old is None else "MODIFIED", old, new, rv)
        return new

    def _later(self, fn: Callable[..., None], *args: Any) -> None:
        """Run a controller step after the current request, as the real controllers run asynchronously."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            fn(*args)
            return
        handle: asyncio.Handle

        def run() -> None:
            self._pending.discard(handle)
            fn(*args)

        handle = loop.call_soon(run)
        self._pending.add(handle)

    def _owner_missing(self, owner_uid: str) -> None:
        """An object names an owner that does not exist (yet): the lifecycle layer collects it."""
