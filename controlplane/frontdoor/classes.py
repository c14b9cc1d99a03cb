"""CheckpointClass resources as checkpoint classes, and back.

A ``CheckpointClass`` (cluster-scoped; ``metadata.name`` is the class name) has the
classes file's keys in camelCase, as the API conventions ask: ``tagScheme``,
``onFailure``, ``restoreAttempts``, ``historyKeepDays``, ``retention.keepLast``,
``retention.maxAgeSeconds``, ``retention.deleteAfterMigration``; the ``saver`` and
``loader`` overrides are the classes file's objects as they are (the CRD keeps them
schemaless: ``env_from_secret``, ``volume_mounts``). :func:`class_from_resource` turns one
into the
definition :func:`~controlplane.machines.config.classes.parse_class` takes (the classes
file's form, so the front door resolves a class from either source the same way) and
validates it there; an error names the field as the user wrote it
(``CheckpointClass fast: spec.tagScheme ...``). :func:`resource_from_class` is the
reverse (for the docs, and the test that every class of
``deploy/base/controlplane/classes.yaml`` round-trips).

Called by the front door when it resolves a class. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.machines.config.classes import DEFAULT_CLASS_NAME, parse_class

GROUP_VERSION = "checkpoint.controlplane.dev/v1alpha1"
KIND = "CheckpointClass"

#: camelCase (resource) -> snake_case (classes file), per object; a key not listed in its
#: object is unknown.
SPEC = {"repository": "repository", "tagScheme": "tag_scheme", "timeouts": "timeouts",
        "retention": "retention", "saver": "saver", "loader": "loader",
        "onFailure": "on_failure", "restoreAttempts": "restore_attempts", "owners": "owners",
        "historyKeepDays": "history_keep_days", "runtimes": "runtimes",
        "encryption": "encryption", "migrationMode": "migration_mode",
        "transfer": "transfer"}
RETENTION = {"keepLast": "keep_last", "maxAgeSeconds": "max_age_seconds",
             "deleteAfterMigration": "delete_after_migration"}
_CAMEL = {snake: camel for table in (SPEC, RETENTION) for camel, snake in table.items()
          if camel != snake}
_SNAKE_WORD = re.compile(r"\b(" + "|".join(sorted(_CAMEL, key=len, reverse=True)) + r")\b")
_QUOTED = re.compile(r"('[^']*'|\"[^\"]*\")")
_CLASS_NAME = re.compile(r"(?<![\w.\]])spec\.name\b")


def class_from_resource(obj: Mapping[str, Any]) -> JsonObject:
    """The classes-file definition of CheckpointClass ``obj`` (its keys as written, no
    defaults filled in), validated by ``parse_class``; :class:`InvalidSpec` names the
    resource and its field otherwise."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise InvalidSpec(f"{KIND}: metadata.name is required (it is the class name)")
    where = f"{KIND} {name}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidSpec(f"{where}: spec must be an object with at least repository")
    if "repository" not in spec:
        raise InvalidSpec(f"{where}: spec.repository is required, e.g. "
                          "registry.example.com/checkpoints")
    definition: JsonObject = {"name": name}
    definition.update(_snake(spec, SPEC, where=where, field="spec"))
    try:
        parse_class(definition, field="spec")
    except InvalidSpec as exc:
        raise InvalidSpec(f"{where}: {_camel_message(str(exc))}") from None
    return definition


def resource_from_class(definition: Mapping[str, Any]) -> dict[str, Any]:
    """The CheckpointClass resource of a classes-file definition (validated first; keys
    whose value is ``null``, at any depth, are left out: ``parse_class`` reads them as
    absent, so :func:`~controlplane.machines.config.classes.class_to_json`'s form fits
    too)."""
    parse_class(dict(definition))
    name = definition.get("name", DEFAULT_CLASS_NAME)
    spec: dict[str, Any] = {}
    for key, value in _no_nulls(definition).items():
        if key == "retention" and isinstance(value, Mapping):
            value = {_CAMEL.get(k, k): v for k, v in value.items()}
        if key != "name":
            spec[_CAMEL.get(key, key)] = value
    return {"apiVersion": GROUP_VERSION, "kind": KIND, "metadata": {"name": name},
            "spec": spec}


def _snake(obj: Mapping[str, Any], table: Mapping[str, str], *, where: str,
           field: str) -> JsonObject:
    """``obj`` with its keys renamed by ``table`` (and the retention's); an unknown key is
    an error naming it, with the known ones in the resource's spelling."""
    unknown = sorted(set(obj) - set(table))
    if unknown:
        raise InvalidSpec(f"{where}: {field} has unknown field(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(table))}")
    out: JsonObject = {}
    for camel, value in obj.items():
        sub = f"{field}.{camel}"
        if camel == "retention" and isinstance(value, Mapping):
            value = _snake(value, RETENTION, where=where, field=sub)
        out[table[camel]] = _json(value)
    return out


def _json(value: Any) -> JsonValue:
    """A plain JSON copy (a watched object's values may be other mappings and sequences)."""
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    result: JsonValue = value
    return result


def _no_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    return value


def _camel_message(message: str) -> str:
    """``parse_class``'s message with the fields spelt as the resource spells them: the
    spec's and retention's snake_case keys camelCase (the overrides' keep theirs), the
    class's ``spec.name`` its ``metadata.name``; quoted values are left as they are."""
    parts = _QUOTED.split(message)
    for i in range(0, len(parts), 2):  # the even parts are outside quotes
        renamed = _SNAKE_WORD.sub(lambda m: _CAMEL[m.group(1)], parts[i])
        parts[i] = _CLASS_NAME.sub("metadata.name", renamed)
    return "".join(parts)
