"""The simulator's vocabulary: served resources, ``Status`` errors, timestamps, quantities.

Objects are kept as parsed JSON (``Obj``: a ``dict[str, Any]``), exactly what travels on
the wire; typed views live in the driver, not here. :class:`ApiError` is how every layer
of the simulator refuses a request: the server renders it as a Kubernetes ``Status``
object with the same ``reason`` and ``code`` a real API server would send.

Used by every module of :mod:`drivers.sim`.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeAlias

import orjson

#: A Kubernetes object as parsed JSON (what the wire carries).
Obj: TypeAlias = dict[str, Any]

MARKER = "sim.controlplane.dev/marker"
"""The simulated workload state of a pod: tests set it, a migration must carry it over."""

HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Resource:
    """One served resource: of core/v1 (``group`` empty) or of ``apps/v1``."""

    plural: str
    kind: str
    namespaced: bool
    has_status: bool
    group: str = ""
    version: str = "v1"
    #: A custom resource (defined by a CustomResourceDefinition: :mod:`drivers.sim.custom`).
    custom: bool = False
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    #: A custom resource's ``additionalPrinterColumns``:
    #: (name, type, format, priority, jsonPath, description) each.
    columns: tuple[tuple[str, str, str, int, str, str], ...] = ()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        """``v1``, ``apps/v1``: how a discovery document names where it is served."""
        return self.api_version

    @property
    def qualified_plural(self) -> str:
        """``pods``, ``deployments.apps``: how a real server's messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """``Pod``, ``Deployment.apps``: how a real server's ``Invalid`` names the kind."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def details(self, name: str, kind: str) -> Obj:
        """A ``Status``'s ``details``: the group only when there is one, as on the wire."""
        out: Obj = {"name": name}
        if self.group:
            out["group"] = self.group
        out["kind"] = kind
        return out


APPS = "apps"
APIEXTENSIONS = "apiextensions.k8s.io"
CRDS = "customresourcedefinitions"

RESOURCES: dict[str, Resource] = {
    r.plural: r for r in (
        Resource("pods", "Pod", namespaced=True, has_status=True),
        Resource("nodes", "Node", namespaced=False, has_status=True),
        Resource("namespaces", "Namespace", namespaced=False, has_status=True),
        Resource("events", "Event", namespaced=True, has_status=False),
        Resource("persistentvolumeclaims", "PersistentVolumeClaim", namespaced=True,
                 has_status=True),
        Resource("deployments", "Deployment", namespaced=True, has_status=True, group=APPS),
        Resource("replicasets", "ReplicaSet", namespaced=True, has_status=True, group=APPS),
        Resource("statefulsets", "StatefulSet", namespaced=True, has_status=True, group=APPS),
        Resource(CRDS, "CustomResourceDefinition", namespaced=False, has_status=True,
                 group=APIEXTENSIONS, short_names=("crd", "crds"),
                 categories=("api-extensions",)),
    )
}

REASONS: dict[int, str] = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
    405: "MethodNotAllowed", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType",
    422: "Invalid", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """A refused request, rendered as a ``Status`` object with ``code`` and ``reason``."""

    def __init__(self, code: int, message: str, *, reason: str | None = None,
                 details: Obj | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        # reason="": none, as a real server's Status of an unclassified error has none.
        self.reason = REASONS.get(code, "Unknown") if reason is None else reason
        self.message = message
        self.details = details or {}
        self.retry_after = retry_after

    def status(self) -> Obj:
        details = dict(self.details)
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                     "status": "Failure", "message": self.message, "code": self.code}
        if self.reason:
            body["reason"] = self.reason
        if details:
            body["details"] = details
        return body


def not_found(resource: Resource, name: str) -> ApiError:
    return ApiError(404, f'{resource.qualified_plural} "{name}" not found',
                    details=resource.details(name, resource.plural))


def already_exists(resource: Resource, name: str) -> ApiError:
    return ApiError(409, f'{resource.qualified_plural} "{name}" already exists',
                    reason="AlreadyExists", details=resource.details(name, resource.plural))


def conflict(resource: Resource, name: str, why: str, *, by_kind: bool = False) -> ApiError:
    """``by_kind``: name the object by its kind (``Pod``), as a failed DELETE precondition
    does, rather than by its resource (``pods``), as an update conflict does."""
    what = resource.qualified_kind if by_kind else resource.qualified_plural
    return ApiError(409, f'Operation cannot be fulfilled on {what} "{name}": {why}',
                    details=resource.details(name, resource.kind if by_kind
                                             else resource.plural))


def invalid(resource: Resource, name: str, field: str, why: str) -> ApiError:
    return ApiError(422, f'{resource.qualified_kind} "{name}" is invalid: {field}: {why}',
                    details={**resource.details(name, resource.kind),
                             "causes": [{"reason": "FieldValueInvalid", "message": why,
                                         "field": field}]})


def timestamp(at: datetime | None = None) -> str:
    """RFC 3339 in UTC, second precision, like ``metadata.creationTimestamp``."""
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}


def quantity(value: object) -> float:
    """A resource quantity (``500m``, ``2``, ``1Gi``) as a number of base units."""
    match = _QUANTITY.match(str(value).strip())
    if not match or match[2] not in _SUFFIX:
        raise ValueError(f"invalid quantity {value!r}")
    return float(match[1]) * _SUFFIX[match[2]]


def clone(obj: Obj) -> Obj:
    """A deep copy of a JSON object (what the store hands out and keeps).

    Through orjson: ``copy.deepcopy`` (with its memo and per-type dispatch) was the
    simulator's largest CPU cost at scale; a stored object only ever holds JSON values
    (it arrived as JSON or was built from literals), and anything else falls back to
    ``deepcopy``.
    """
    try:
        copied: Obj = orjson.loads(orjson.dumps(obj))
    except TypeError:
        return copy.deepcopy(obj)
    return copied


def dumps(value: object) -> str:
    """JSON text of a response body or a watch event."""
    return orjson.dumps(value).decode()


def meta(obj: Obj) -> Obj:
    """``obj.metadata``, created empty if missing."""
    m = obj.get("metadata")
    if not isinstance(m, dict):
        m = obj["metadata"] = {}
    return m


def condition(obj: Obj, type_: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == type_:
            return c
    return None


def set_condition(status: Obj, type_: str, value: bool, *, reason: str = "",
                  message: str = "") -> None:
    """Set one condition in ``status.conditions``; transition time moves only on change."""
    conditions = status.setdefault("conditions", [])
    text = "True" if value else "False"
    found = next((c for c in conditions if c.get("type") == type_), None)
    if found is None:
        found = {"type": type_}
        conditions.append(found)
    if found.get("status") != text:
        found["lastTransitionTime"] = timestamp()
    found["status"] = text
    for key, detail in (("reason", reason), ("message", message)):
        if detail:
            found[key] = detail
        else:
            found.pop(key, None)


def is_true(obj: Obj, type_: str) -> bool:
    c = condition(obj, type_)
    return c is not None and c.get("status") == "True"
