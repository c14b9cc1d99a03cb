"""Parsing of the fields machine specs share: pod identity, nodes, containers, templates.

Every parser raises :class:`~controlplane.engine.decider.InvalidSpec` with a message that
names the field and says what is expected. Used by each machine's ``validate_spec`` and by
:mod:`controlplane.machines.submission`. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.machines.config.classes import CheckpointClass, class_to_json, parse_class

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")


@dataclass(frozen=True)
class PodRef:
    """A pod by namespace, name and the UID observed at submission."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> JsonObject:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


def only_known(spec: JsonObject, known: Iterable[str], *, field: str = "spec") -> None:
    allowed = set(known)
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise InvalidSpec(f"{field} has unknown field(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(allowed))}")


def require(spec: JsonObject, name: str, *, field: str = "spec") -> JsonValue:
    if spec.get(name) is None:
        raise InvalidSpec(f"{field}.{name} is required")
    return spec[name]


def optional_flag(spec: JsonObject, name: str, *, meaning: str) -> bool | None:
    """``spec.<name>``: true, false or absent (``None``); ``meaning`` says what true does."""
    value = spec.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidSpec(f"spec.{name} {value!r} is not true or false: {meaning}")
    return value


def namespace_name(value: JsonValue, *, field: str) -> str:
    if not isinstance(value, str) or not _DNS_LABEL.match(value):
        raise InvalidSpec(f"{field} must be a namespace name (lowercase DNS label), "
                          f"got {value!r}")
    return value


def object_name(value: JsonValue, *, field: str) -> str:
    if not isinstance(value, str) or not _DNS_SUBDOMAIN.match(value) or len(value) > 253:
        raise InvalidSpec(f"{field} must be a Kubernetes object name (lowercase DNS "
                          f"subdomain), got {value!r}")
    return value


def node_name(value: JsonValue, *, field: str) -> str:
    return object_name(value, field=field)


def pod_ref(value: JsonValue, *, field: str = "spec.pod") -> PodRef:
    if not isinstance(value, dict):
        raise InvalidSpec(f"{field} must be an object {{namespace, name, uid}} (the uid as "
                          "observed at submission)")
    only_known(value, ("namespace", "name", "uid"), field=field)
    uid = value.get("uid")
    if not isinstance(uid, str) or not _UID.match(uid):
        raise InvalidSpec(f"{field}.uid must be the pod's metadata.uid as observed at "
                          f"submission, got {uid!r}")
    return PodRef(namespace_name(value.get("namespace"), field=f"{field}.namespace"),
                  object_name(value.get("name"), field=f"{field}.name"), uid)


def containers(value: JsonValue, *, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidSpec(f"{field} must be a list of container names (empty: all)")
    names = tuple(value)
    for i, name in enumerate(names):
        if not isinstance(name, str) or not _DNS_LABEL.match(name):
            raise InvalidSpec(f"{field}[{i}] must be a container name, got {name!r}")
    if len(set(names)) != len(names):
        raise InvalidSpec(f"{field} lists a container twice")
    return tuple(str(n) for n in names)


def flag(value: JsonValue, *, field: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidSpec(f"{field} must be true or false, got {value!r}")
    return value


def pod_template(value: JsonValue, *, field: str) -> JsonObject:
    """A saved pod: ``{"metadata": {...}, "spec": {"containers": [...], ...}}``."""
    if not isinstance(value, dict):
        raise InvalidSpec(f"{field} must be the saved pod as an object with metadata and spec")
    only_known(value, ("metadata", "spec"), field=field)
    body = value.get("spec")
    if not isinstance(body, dict):
        raise InvalidSpec(f"{field}.spec must be the saved pod spec (an object)")
    listed = body.get("containers")
    if not isinstance(listed, list) or not listed:
        raise InvalidSpec(f"{field}.spec.containers must list at least one container")
    if "nodeName" in body:
        raise InvalidSpec(f"{field}.spec.nodeName must be removed: restores place pods by "
                          "required node affinity so that capacity and cordons apply")
    meta = value.get("metadata", {})
    if not isinstance(meta, dict):
        raise InvalidSpec(f"{field}.metadata must be an object")
    return {"metadata": dict(meta), "spec": dict(body)}


def checkpoint_class(value: JsonValue, *, field: str = "spec.class") -> CheckpointClass:
    return parse_class(value, field=field)


def class_json(value: JsonValue, *, field: str = "spec.class") -> JsonObject:
    return class_to_json(parse_class(value, field=field))
