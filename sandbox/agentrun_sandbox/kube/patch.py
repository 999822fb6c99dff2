"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902) as the Kubernetes API server applies them.

Written here rather than borrowed so that the failure classes match the server's answers exactly: an
undecodable JSON patch is a 400, while an operation that cannot be applied (a failed ``test``, a missing
path) is a 422. Kopf relies on the 422: its finalizer patches start with a ``test`` op on
``/metadata/resourceVersion`` and it retries on the next cycle when that op fails. The messages follow
the Go library the server uses (``testing value /metadata/resourceVersion failed: test failed``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


class PatchDecodeError(ValueError):
    """The patch document itself is malformed; the server answers 400 BadRequest."""


class PatchApplyError(ValueError):
    """The patch is well-formed but does not apply to this object; the server answers 422 Invalid."""


def clone(value: Any) -> Any:
    """A deep copy of JSON data; a JSON round trip is faster than :func:`copy.deepcopy` for such trees."""
    return json.loads(json.dumps(value))


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch: objects merge recursively, ``null`` deletes, anything else replaces.

    Neither argument is modified; unchanged subtrees of ``target`` are shared with the result, so callers
    that mutate the result afterwards must pass a private copy of ``target``.
    """
    if not isinstance(patch, Mapping):
        return clone(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _split_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchApplyError(f"JSON pointer must start with '/': {pointer!r}")
    return [_unescape(token) for token in pointer[1:].split("/")]


def _array_index(token: str, length: int, *, for_insert: bool) -> int:
    if token == "-" and for_insert:
        return length
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchApplyError(f"invalid array index: {token!r}")
    index = int(token)
    limit = length if for_insert else length - 1
    if index > limit:
        raise PatchApplyError(f"array index out of bounds: {index}")
    return index


def _parent(doc: Any, tokens: list[str], op: str, path: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchApplyError(f"{op} operation does not apply: doc is missing path: {path!r}")
            node = node[token]
        elif isinstance(node, list):
            try:
                node = node[_array_index(token, len(node), for_insert=False)]
            except PatchApplyError:
                raise PatchApplyError(
                    f"{op} operation does not apply: doc is missing path: {path!r}"
                ) from None
        else:
            raise PatchApplyError(f"{op} operation does not apply: doc is missing path: {path!r}")
    return node


def _get(doc: Any, path: str, op: str) -> Any:
    tokens = _split_pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, op, path)
    key = tokens[-1]
    if isinstance(parent, dict) and key in parent:
        return parent[key]
    if isinstance(parent, list):
        try:
            return parent[_array_index(key, len(parent), for_insert=False)]
        except PatchApplyError:
            pass
    raise PatchApplyError(f"{op} operation does not apply: doc is missing path: {path!r}")


def _add(doc: Any, path: str, value: Any, op: str = "add") -> Any:
    tokens = _split_pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, op, path)
    key = tokens[-1]
    if isinstance(parent, dict):
        parent[key] = value
    elif isinstance(parent, list):
        parent.insert(_array_index(key, len(parent), for_insert=True), value)
    else:
        raise PatchApplyError(f"{op} operation does not apply: doc is missing path: {path!r}")
    return doc


def _remove(doc: Any, path: str, op: str = "remove") -> Any:
    tokens = _split_pointer(path)
    if not tokens:
        raise PatchApplyError(f"{op} operation does not apply: cannot remove the document root")
    parent = _parent(doc, tokens, op, path)
    key = tokens[-1]
    if isinstance(parent, dict) and key in parent:
        del parent[key]
        return doc
    if isinstance(parent, list):
        try:
            del parent[_array_index(key, len(parent), for_insert=False)]
            return doc
        except PatchApplyError:
            pass
    raise PatchApplyError(f"{op} operation does not apply: doc is missing path: {path!r}")


def _json_equal(a: Any, b: Any) -> bool:
    # JSON has no bool/number overlap, unlike Python where True == 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    return bool(a == b)


def decode_json_patch(raw: Any) -> list[dict[str, Any]]:
    """Check the shape of a JSON patch document before anything is applied (400 on failure)."""
    if not isinstance(raw, list):
        raise PatchDecodeError("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    ops: list[dict[str, Any]] = []
    for item in raw:
        if not isinstance(item, dict):
            raise PatchDecodeError(
                "json: cannot unmarshal non-object into Go value of type jsonpatch.Operation"
            )
        ops.append(item)
    return ops


def json_patch(doc: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """Apply RFC 6902 operations in order to ``doc`` (mutated in place; pass a copy) and return the result."""
    for op in ops:
        kind = op.get("op")
        path = op.get("path")
        if not isinstance(path, str):
            raise PatchApplyError(f"{kind} operation does not apply: missing path")
        match kind:
            case "add":
                if "value" not in op:
                    raise PatchApplyError("add operation does not apply: missing value")
                doc = _add(doc, path, clone(op["value"]))
            case "remove":
                doc = _remove(doc, path)
            case "replace":
                if "value" not in op:
                    raise PatchApplyError("replace operation does not apply: missing value")
                _get(doc, path, "replace")
                doc = _remove(doc, path, "replace") if _split_pointer(path) else doc
                doc = _add(doc, path, clone(op["value"]), "replace")
            case "move" | "copy":
                source = op.get("from")
                if not isinstance(source, str):
                    raise PatchApplyError(f"{kind} operation does not apply: missing from")
                if kind == "move" and (path + "/").startswith(source + "/") and path != source:
                    raise PatchApplyError("move operation does not apply: cannot move a value into itself")
                value = clone(_get(doc, source, kind))
                if kind == "move":
                    doc = _remove(doc, source, kind)
                doc = _add(doc, path, value, kind)
            case "test":
                try:
                    actual = _get(doc, path, "test")
                except PatchApplyError:
                    actual = None
                    if op.get("value") is not None:
                        raise PatchApplyError(f"testing value {path} failed: test failed") from None
                if not _json_equal(actual, op.get("value")):
                    raise PatchApplyError(f"testing value {path} failed: test failed")
            case _:
                raise PatchApplyError(f"Unexpected kind: {kind}")
    return doc
