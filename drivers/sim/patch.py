"""The three PATCH bodies the simulated API server applies: JSON merge, JSON patch, strategic.

Pure functions over JSON values; a malformed or inapplicable patch raises
:class:`PatchError`, which the store turns into a Kubernetes ``Status`` (400 for a
malformed body, 422 for an operation that does not apply, like a failed ``test``).

- :func:`merge_patch`: RFC 7386 (``application/merge-patch+json``): maps merge, ``null``
  deletes, lists are replaced.
- :func:`json_patch`: RFC 6902 (``application/json-patch+json``): ``add``, ``remove``,
  ``replace``, ``move``, ``copy``, ``test``, all or nothing.
- :func:`strategic_merge_patch` (``application/strategic-merge-patch+json``): the core
  kinds' subset: maps merge like a merge patch, lists of objects with a known merge key
  (``containers`` by ``name``, ``conditions`` by ``type``...) merge element-wise,
  ``finalizers`` merge as a set, other lists are replaced; ``$patch: replace|delete`` and
  ``$deleteFromPrimitiveList/<field>`` are honoured, ``$setElementOrder``/``$retainKeys``
  are accepted and ignored.

Called by :mod:`drivers.sim.store`.
"""

from __future__ import annotations

import copy
from typing import Any

#: list field name -> the key its elements are merged by (strategic merge patch).
MERGE_KEYS: dict[str, str] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "volumes": "name", "env": "name", "volumeMounts": "mountPath", "ports": "containerPort",
    "conditions": "type", "containerStatuses": "name", "initContainerStatuses": "name",
    "ownerReferences": "uid", "taints": "key", "imagePullSecrets": "name",
    "addresses": "type", "hostAliases": "ip", "readinessGates": "conditionType",
}
#: primitive lists merged as sets (patchStrategy=merge on a list of strings).
SET_LISTS = frozenset({"finalizers"})


class PatchError(ValueError):
    """The patch cannot apply. ``code`` is the HTTP status to answer (400 or 422)."""

    def __init__(self, message: str, *, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new value."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --- RFC 6902 ---------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'", code=400)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, *, for_add: bool) -> int:
    if token == "-" and for_add:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not for_add):
        raise PatchError(f"array index {index} out of range")
    return index


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"missing path: /{'/'.join(tokens)}")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, for_add=False)]
        else:
            raise PatchError(f"missing path: /{'/'.join(tokens)}")
    return node


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"missing path: {path}")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, for_add=False)]
    raise PatchError(f"missing path: {path}")


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, for_add=True), value)
    else:
        raise PatchError(f"missing path: {path}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"unable to remove nonexistent key: {path}")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, for_add=False)]
    else:
        raise PatchError(f"missing path: {path}")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """Apply an RFC 6902 patch (all operations or none); returns a new value."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations", code=400)
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed JSON patch operation: {op!r}", code=400)
        kind, path = op["op"], str(op["path"])
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"JSON patch operation {kind} needs a value", code=400)
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _add(_remove(doc, path), path, copy.deepcopy(op["value"])) if path else \
                copy.deepcopy(op["value"])
        elif kind in ("move", "copy"):
            source = str(op.get("from", ""))
            value = copy.deepcopy(_get(doc, source))
            if kind == "move":
                doc = _remove(doc, source)
            doc = _add(doc, path, value)
        elif kind == "test":
            try:
                seen = _get(doc, path)
            except PatchError:
                seen = _MISSING
            if seen != op["value"]:
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}", code=400)
    return doc


_MISSING = object()


# --- strategic merge ---------------------------------------------------------------------


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """The core kinds' strategic merge patch; returns a new value."""
    if not isinstance(patch, dict):
        raise PatchError("a strategic merge patch must be a JSON object", code=400)
    return _merge_map(target if isinstance(target, dict) else {}, patch)


def _merge_map(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    out = dict(target)
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            drop = value if isinstance(value, list) else []
            out[field] = [v for v in out.get(field) or [] if v not in drop]
            continue
        if key.startswith("$"):
            continue  # $setElementOrder, $retainKeys: ordering/retention hints only
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            current = out.get(key)
            merged = _merge_map(current if isinstance(current, dict) else {}, value)
            if value.get("$patch") == "delete":
                out.pop(key, None)
            else:
                out[key] = merged
        elif isinstance(value, list):
            out[key] = _merge_list(key, out.get(key), value)
        else:
            out[key] = value
    return out


def _merge_list(field: str, target: Any, patch: list[Any]) -> list[Any]:
    current = list(target) if isinstance(target, list) else []
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    if field in SET_LISTS:
        return current + [v for v in patch if v not in current]
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(p, dict) for p in patch):
        return copy.deepcopy(patch)
    for item in patch:
        if key not in item:
            raise PatchError(f"an element of {field} lacks its merge key {key!r}")
        at = next((i for i, c in enumerate(current)
                   if isinstance(c, dict) and c.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del current[at]
        elif at is None:
            current.append(_merge_map({}, item))
        else:
            current[at] = _merge_map(current[at], item)
    return current
